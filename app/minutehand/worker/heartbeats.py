"""Keeping the claims of running jobs alive: one timer for all of them, not a
task per job (a worker may hold tens of thousands of 10-second jobs).

A job's first beat goes half its claim period in (most jobs are done by
then: a job that never beats never races its own outcome), then one every
third of the period. Beats go out through the job's outbox, in the batches
of its other outcomes. A job is marked lost, and its result will be
dropped, when a beat is refused (the claim is no longer ours) or when its
deadline passes with no beat accepted in time (the scheduler may have given
the job to another worker). A beat still out at the deadline decides: the
scheduler extends a claim only while it is the job's current one, so an
accepted beat shows the claim held, however late its answer came (on an
overloaded scheduler, or through a second dispatcher after the first timed
out)."""
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
    heap, [when, order, run]: the time of its next beat or, while a beat is
    out, its deadline. An entry replaced by a later one, or whose job is done
    (forget), no longer names its run and is skipped, as asyncio does with
    cancelled timers: a finished job is not kept in memory until its entry's
    time comes."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self._due: list[list] = []
        self._order = itertools.count()             # ties: the heap never compares runs
        self._dead = 0                              # entries that no longer name a run
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def watch(self, run: Running) -> None:
        """Keep a just-started job's claim alive while its handler runs."""
        self._at(run.started + run.job.claim_s / 2, run)

    def forget(self, run: Running) -> None:
        """The job's handler is done: no more beats for it."""
        self._drop(run)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at, self._due, self._dead = None, math.inf, [], 0

    def _at(self, when: float, run: Running) -> None:
        self._drop(run)
        run.beat_entry = entry = [when, next(self._order), run]
        heapq.heappush(self._due, entry)
        if when < self._timer_at:
            self._arm(when)

    def _drop(self, run: Running) -> None:
        if run.beat_entry is not None:
            run.beat_entry[2], run.beat_entry = None, None
            self._dead += 1
            if self._dead > 1000 and self._dead > len(self._due) // 2:
                self._due = [e for e in self._due if e[2] is not None]
                heapq.heapify(self._due)
                self._dead = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), self._tick)

    def _tick(self) -> None:
        # (-inf while the due entries are served: the timer is armed once, after)
        self._timer, self._timer_at = None, -math.inf
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, _, run = heapq.heappop(self._due)
            if run is None:
                self._dead -= 1
                continue
            run.beat_entry = None
            self._beat(run, now)
        self._timer_at = math.inf
        if self._due:
            self._arm(self._due[0][0])

    def _beat(self, run: Running, now: float) -> None:
        if run.handler_done or run.lost is not None:
            return
        job = run.job
        if run.beat is not None:                    # out past the deadline: its answer decides
            if now >= run.deadline + job.claim_s:   # (the outbox answers long before this)
                self.expired(run)
            else:
                self._at(run.deadline + job.claim_s, run)
            return
        if now >= run.deadline:
            self.expired(run)
            return
        run.beat = answer = run.outbox.send("heartbeat", Held(job_id=job.id, lease_token=job.lease_token),
                                            extend_s=max(1.0, job.claim_s))
        answer.add_done_callback(lambda fut, sent=now: self._answered(run, sent, fut))
        self._at(run.deadline, run)

    def _answered(self, run: Running, sent: float, fut: asyncio.Future) -> None:
        run.beat = None
        answer = fut.result() if not fut.cancelled() else None
        job = run.job
        if answer is not None and answer.ok:
            # The claim lasts claim_s from the beat's arrival, which was after `sent`.
            run.deadline = max(run.deadline, sent + job.claim_s - claim_margin(job.claim_s))
        if run.handler_done or run.lost is not None:
            # Done while the beat was out: its outcome may have been written
            # first and the beat refused for it.
            return
        now = time.monotonic()
        if now >= run.deadline:
            self.expired(run)
            return
        period = job.claim_s / 3
        if answer is None:                          # not delivered: try again soon
            next_beat = now + min(period, 2.0)
        elif answer.ok:
            next_beat = sent + period
        else:
            run.lost = f"claim lost: {answer.reason}"
            self._log("claim_lost", run, reason=answer.reason, state=answer.state)
            return
        self._at(min(next_beat, run.deadline), run)

    def expired(self, run: Running) -> None:
        """The claim lapsed with no beat accepted: the job is lost (logged once)."""
        run.lost = "claim expired: no heartbeat got through in time"
        self._log("claim_expired", run, reason=run.lost)

    def _log(self, event: str, run: Running, **extra) -> None:
        job = run.job
        log.warning(event, **fields(self.worker_id, job_id=job.id, name=job.name, attempt=job.attempt, **extra))
