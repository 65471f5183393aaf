"""Keeping the claims of running jobs alive: one timer for all of them, not a
task per job (a worker may hold tens of thousands of 10-second jobs).

A job's first beat goes half its claim period in (most jobs are done by
then: a job that never beats never races its own outcome), then one every
third of the period. Beats go out through the job's outbox, in the batches
of its other outcomes. A job is marked lost, and its result will be
dropped, when a beat is refused (the claim is no longer ours) or when its
deadline passes with no beat answered in time (the scheduler may have given
the job to another worker)."""
from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from typing import TYPE_CHECKING

from minutehand.protocol import Held
from minutehand.worker.logs import fields, log

if TYPE_CHECKING:
    from minutehand.worker.runner import Running


def claim_margin(claim_s: float) -> float:
    """How much sooner than the dispatcher's clock says a claim is taken to end
    here: for what may pass between its clock reading and ours."""
    return min(1.0, claim_s / 10)


class Heartbeats:
    """The beats of one worker run. Each watched job has one live entry in a
    heap: the time of its next beat, or, while a beat is out, its deadline
    (entries left behind by a later one are skipped)."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self._due: list[tuple[float, int, Running]] = []
        self._order = itertools.count()             # ties: the heap never compares runs
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def watch(self, run: Running) -> None:
        """Keep a just-started job's claim alive while its handler runs."""
        self._at(run.started + run.job.claim_s / 2, run)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at, self._due = None, math.inf, []

    def _at(self, when: float, run: Running) -> None:
        run.beat_at = when
        heapq.heappush(self._due, (when, next(self._order), run))
        if when < self._timer_at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), self._tick)

    def _tick(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            when, _, run = heapq.heappop(self._due)
            if when == run.beat_at:
                self._beat(run, now)
        if self._due:
            self._arm(self._due[0][0])

    def _beat(self, run: Running, now: float) -> None:
        if run.handler_done or run.lost is not None:
            return
        if now >= run.deadline:
            self._expired(run)
            return
        if run.beating:                             # its answer will reschedule it
            self._at(run.deadline, run)
            return
        job = run.job
        run.beating = True
        answer = run.outbox.send("heartbeat", Held(job_id=job.id, lease_token=job.lease_token),
                                 extend_s=max(1.0, job.claim_s))
        answer.add_done_callback(lambda fut, sent=now: self._answered(run, sent, fut))
        self._at(run.deadline, run)                 # an answer after the deadline comes too late

    def _answered(self, run: Running, sent: float, fut: asyncio.Future) -> None:
        run.beating = False
        if run.handler_done or run.lost is not None:
            # Done while the beat was out: its outcome may have been written
            # first and the beat refused for it.
            return
        answer = fut.result() if not fut.cancelled() else None
        now, job = time.monotonic(), run.job
        if now >= run.deadline:
            self._expired(run)
            return
        period = job.claim_s / 3
        if answer is None:                          # not delivered: try again soon
            next_beat = now + min(period, 2.0)
        elif answer.ok:
            run.deadline = max(run.deadline, sent + job.claim_s - claim_margin(job.claim_s))
            next_beat = sent + period
        else:
            run.lost = f"claim lost: {answer.reason}"
            self._log("claim_lost", run, reason=answer.reason, state=answer.state)
            return
        self._at(min(next_beat, run.deadline), run)

    def _expired(self, run: Running) -> None:
        run.lost = "claim expired: no heartbeat got through in time"
        self._log("claim_expired", run, reason=run.lost)

    def _log(self, event: str, run: Running, **extra) -> None:
        job = run.job
        log.warning(event, **fields(self.worker_id, job_id=job.id, name=job.name, attempt=job.attempt, **extra))
