"""Running the jobs a worker leased: the handler called (async in the loop,
sync in a handler thread), its claim kept alive (heartbeats.py), its outcome
reported, unless the claim may no longer be ours (then it is dropped: the
scheduler may have given the job to another worker, and a job must not be
finished twice). A keyed job's result is recorded under its key first,
claim or not, so that a completion refused or lost is replayed on the job's
next delivery instead of running the handler again."""
from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from minutehand.protocol import Completed, Failed, Held, LeasedJob, Recorded, enc_hook
from minutehand.protocol.jsontext import MAX_JSON_BYTES, json_text_problem
from minutehand.worker import metrics
from minutehand.worker.grace import Grace
from minutehand.worker.heartbeats import Heartbeats, claim_margin
from minutehand.worker.job import Job, NonRetryable, error_text
from minutehand.worker.logs import fields, log
from minutehand.worker.outbox import Outbox
from minutehand.worker.slots import Slots
from minutehand.worker.threads import HandlerThreads
from minutehand.worker.traces import handler_span

Handler = Callable[[Job], Any]


@dataclass(eq=False)
class Running:
    """A job this worker holds: where it came from and until when its claim lasts."""
    job: Job
    outbox: Outbox
    deadline: float                     # time.monotonic() by which the claim must be renewed
    started: float = field(default_factory=time.monotonic)
    handler_done: bool = False
    lost: str | None = None             # why the claim is no longer ours (then the result is dropped)
    beat_entry: list | None = None      # its entry in the heartbeats' heap (heartbeats.py)
    beat: asyncio.Future | None = None  # the answer of a heartbeat that is out


class JobRunner:
    """The running jobs of one worker run; an AsyncService: stop() waits for
    them until the grace period ends, then fails the rest (retryable)."""

    def __init__(self, handlers: dict[str, Handler], worker_id: str, slots: Slots, grace: Grace,
                 concurrency: int):
        self.handlers = handlers
        self.worker_id = worker_id
        self.slots = slots
        self.grace = grace
        self.threads = HandlerThreads(concurrency)
        self.heartbeats = Heartbeats(worker_id)
        self.jobs: dict[asyncio.Task, Running] = {}

    async def start(self) -> None:
        """Nothing to start: jobs come from the pollers, threads as needed."""

    async def stop(self) -> None:
        await self.grace.wait(list(self.jobs))
        for task, run in list(self.jobs.items()):
            if not run.handler_done:
                # Failed (retryable) rather than left to its claim's expiry: the job
                # is due again after its backoff, not after a whole claim period
                # (the attempt counts either way). The outboxes, stopped after the
                # runner, send it.
                if run.lost is None:
                    run.outbox.send("fail", Failed(
                        job_id=run.job.id, lease_token=run.job.lease_token, retryable=True,
                        error=f"the worker stopped: the job was still running when its grace period "
                              f"({self.grace.seconds:g} s) ended"))
                run.lost = "abandoned at the end of the grace period"
                log.warning("job_abandoned", **fields(
                    self.worker_id, job_id=run.job.id, name=run.job.name, attempt=run.job.attempt,
                    duration_ms=_ms(run.started), reason="still running when the grace period ended; "
                                                         "failed, to be retried"))
            task.cancel()
        await asyncio.gather(*self.jobs, return_exceptions=True)
        self.heartbeats.close()
        self.threads.close()

    def start_job(self, lj: LeasedJob, outbox: Outbox, received: float) -> None:
        job = Job(id=lj.job_id, team=lj.team, name=lj.name, payload=None, attempt=lj.attempt,
                  max_attempts=lj.max_attempts, idempotency_key=lj.idempotency_key,
                  due_at=lj.due_at, run_at=lj.run_at, claim_expires_at=lj.claim_expires_at,
                  lease_token=lj.lease_token, claim_s=lj.claim_s)
        # The dispatcher claims a job just before it answers, so the claim is taken
        # to run from the answer's arrival, less a margin for the way here.
        run = Running(job, outbox, deadline=received + lj.claim_s - claim_margin(lj.claim_s))
        task = asyncio.create_task(self.run_job(run, lj))
        self.jobs[task] = run
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task) -> None:
        self.jobs.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker_bug", exc_info=task.exception(), **fields(self.worker_id))

    async def run_job(self, run: Running, lj: LeasedJob) -> None:
        job = run.job
        ids = {"job_id": job.id, "name": job.name, "attempt": job.attempt}
        if lj.replay is not None:
            self.slots.give(1)
            run.handler_done = True
            outcome = Completed(job_id=lj.job_id, lease_token=lj.lease_token,
                                result=msgspec.Raw(msgspec.json.encode(lj.replay.result)))
            await self.report(run, "complete", outcome, "job_replayed", ids)
            return
        self.heartbeats.watch(run)
        # Reported with the next batch of outcomes (or, for a job done by then,
        # covered by its completion): the job is running, no longer cancellable.
        run.outbox.send("start", Held(job_id=lj.job_id, lease_token=lj.lease_token)).add_done_callback(
            lambda answer: self._start_answered(run, answer))
        if log.isEnabledFor(logging.DEBUG):             # per job: skip building the fields when off
            log.debug("job_started", **fields(self.worker_id, **ids))
        try:
            try:
                outcome, event = await self.call_handler(run, lj)
            finally:
                run.handler_done = True
                self.heartbeats.forget(run)
            if isinstance(outcome, Completed) and job.idempotency_key is not None:
                # Recorded before the slot is given back: this worker's next lease
                # must not find the job (its claim may have lapsed) without it.
                outcome = await self.record(run, outcome)
        finally:
            self.slots.give(1)
        kind = "complete" if isinstance(outcome, Completed) else "fail"
        await self.report(run, kind, outcome, event, ids)

    async def record(self, run: Running, outcome: Completed) -> Completed:
        """The result recorded under the job's key, and the completion to send:
        with what the key holds (the first result recorded there, should
        another run of the job have got there first). Sent whatever became of
        the claim: the key row is the job's."""
        answer = await run.outbox.send("record", Recorded(job_id=outcome.job_id, result=outcome.result))
        if answer is None or not answer.ok:
            return outcome                  # nothing to record it under (logged by the outbox)
        return msgspec.structs.replace(outcome, result=answer.result)

    def _start_answered(self, run: Running, answer: asyncio.Future) -> None:
        """A refused start (the job was cancelled, or its claim is gone): its
        outcome will not be reported."""
        result = answer.result() if not answer.cancelled() else None
        if result is not None and not result.ok and run.lost is None:
            run.lost = f"start refused: {result.reason}"

    async def call_handler(self, run: Running, lj: LeasedJob) -> tuple[Completed | Failed, str]:
        try:
            run.job = replace(run.job, payload=msgspec.json.decode(lj.payload))
            with handler_span(lj):
                raw = await run_handler(self.handlers.get(lj.name), run.job, self.threads)
            return Completed(job_id=lj.job_id, lease_token=lj.lease_token, result=raw), "job_succeeded"
        except NonRetryable as exc:
            return Failed(job_id=lj.job_id, lease_token=lj.lease_token, error=error_text(exc),
                          retryable=False), "job_failed"
        except Exception as exc:
            return Failed(job_id=lj.job_id, lease_token=lj.lease_token, error=error_text(exc),
                          retryable=True), "job_failed"

    async def report(self, run: Running, kind: str, outcome, event: str, ids: dict) -> None:
        """Send the outcome, unless the claim may no longer be ours."""
        duration = _ms(run.started)
        error = outcome.error if isinstance(outcome, Failed) else None
        outcome_name = "replayed" if event == "job_replayed" else "succeeded" if kind == "complete" else "failed"
        if run.lost is None and run.beat is not None and time.monotonic() > run.deadline:
            # A beat is out: an answer that accepts it, however late, shows the
            # claim held (heartbeats.py), so it decides.
            await asyncio.wait([run.beat], timeout=run.job.claim_s)
        if run.lost is None and time.monotonic() > run.deadline:
            self.heartbeats.expired(run)
        if run.lost is not None:
            metrics.record(run.job.name, "dropped", duration / 1000)
            log.warning("job_dropped", **fields(self.worker_id, **ids, duration_ms=duration, error=error,
                                                     reason=f"{run.lost}: outcome not reported ({kind})"))
            return
        answer = await run.outbox.send(kind, outcome)
        reported = outcome_name if answer is not None and answer.ok else "refused"
        metrics.record(run.job.name, reported, duration / 1000)
        if answer is not None and answer.ok:
            level = logging.WARNING if kind == "fail" else logging.INFO
            if log.isEnabledFor(level):
                log.log(level, event, **fields(self.worker_id, **ids, duration_ms=duration, error=error, state=answer.state))

async def run_handler(handler: Handler | None, job: Job, threads: HandlerThreads) -> msgspec.Raw:
    """Run a handler on a job as the worker loop does (async in the loop, sync
    in a handler thread): its result as JSON text, checked against what the
    dispatcher accepts. Raises what the handler raised, or NonRetryable for a
    result the dispatcher would refuse (a refused report would leave the job
    claimed until its claim expired)."""
    if handler is None:
        raise LookupError(f"no handler registered for {job.name!r} on this worker")
    if inspect.iscoroutinefunction(handler):
        result = await handler(job)
    else:
        result = await threads.run(handler, job)
        if inspect.isawaitable(result):
            result = await result
    try:
        raw = msgspec.Raw(msgspec.json.encode(result, enc_hook=enc_hook))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"the handler's result is not JSON-able: {exc}") from exc
    if len(raw) > MAX_JSON_BYTES:
        raise NonRetryable(f"the handler's result is {len(raw):,} bytes as JSON, over the limit of "
                           f"{MAX_JSON_BYTES:,}: store large results elsewhere and return a reference")
    if reason := json_text_problem("the handler's result", bytes(raw)):
        raise NonRetryable(reason)
    return raw


def _ms(since: float) -> float:
    return round((time.monotonic() - since) * 1000, 1)
