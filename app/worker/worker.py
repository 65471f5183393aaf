"""The worker: pulls jobs from dispatchers when it has room, runs their
handlers, keeps their claims alive, and reports outcomes in batches.

    worker = Worker(urls=["http://d1:8080", "http://d2:8080"], token="...", concurrency=10)

    @worker.job("send_report")
    async def send_report(job: Job):
        ...
        return {"sent": True}

    worker.run()        # until SIGTERM / SIGINT; or `minutehand worker module:worker`

How it keeps its invariants:
- Never more handlers running than `concurrency`: a slot is reserved before
  a lease is asked for (capacity = the slots reserved) and given back when
  the handler returns, or at once if the dispatcher had fewer jobs.
- Each dispatcher only hands out jobs of the shards it owns, so there is one
  long-poll loop per URL; a loop whose dispatcher fails backs off and
  retries, the others carry on.
- A claim is a lease: running jobs are renewed by heartbeat every third of
  the claim period. A job whose claim could not be renewed in time is
  dropped (its result is not reported): the scheduler may have given it to
  another worker, and the job must not be finished twice.
- SIGTERM: no new leases; jobs that arrive afterwards are released at once;
  running ones get `grace_s`, then are abandoned to claim expiry.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import queue
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from minutehand.protocol import (
    MAX_CAPACITY, MAX_ITEMS, MAX_WAIT_S, Completed, Failed, Held, LeasedJob, LeaseIn, OutcomesIn,
)
from minutehand.protocol.jsontext import MAX_JSON_BYTES, json_text_problem
from minutehand.worker.client import DispatcherClient, Refused, Unavailable
from minutehand.worker.job import Job, NonRetryable
from minutehand.worker.logs import log

Handler = Callable[[Job], Any]

MAX_ERROR = 10_000          # longest error text the protocol takes
MAX_NAMES = 100             # most job names one lease may ask for
MAX_REQUEST_BYTES = 4 << 20   # outcomes per request, roughly: well under the server's body limit


def default_worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:@/-]", "-", socket.gethostname()) or "worker"
    return f"{host}:{os.getpid()}"


def error_text(exc: BaseException) -> str:
    """"ExcType: message", cut to what the protocol takes."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR]


class Worker:
    """A set of handlers by job name and the loop that runs them.

    urls, token, concurrency and grace_s left as None are taken from the
    settings when the worker runs (MINUTEHAND_WORKER_URLS, _TOKEN,
    _CONCURRENCY, _GRACE_S or the matching flags of `minutehand worker`).
    """

    def __init__(self, urls: list[str] | str | None = None, token: str | None = None,
                 concurrency: int | None = None, *, grace_s: float | None = None,
                 worker_id: str | None = None, wait_s: float = 10.0, flush_s: float = 0.005,
                 teams: list[str] | None = None):
        """teams: run only jobs submitted by these teams (None: any team's).
        Job names are not owned by a team: any team may submit a job named
        like one of these handlers, so a worker whose handlers trust their
        payloads names the teams it trusts (each job also says its team)."""
        self.urls = _url_list(urls) if urls is not None else None
        self.teams = sorted(set(teams)) if teams is not None else None
        self.token = token
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.worker_id = worker_id or default_worker_id()
        self.wait_s = wait_s            # long-poll limit: also the longest a stop waits on a poll
        self.flush_s = flush_s          # how long outcomes wait to be sent together
        self.handlers: dict[str, Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._stop_requested = False

    # ------------------------------------------------------------ registration
    def job(self, name: str) -> Callable[[Handler], Handler]:
        """Register the decorated function (sync or async, one Job argument)
        as the handler of jobs named `name`."""
        def register(fn: Handler) -> Handler:
            if name in self.handlers:
                raise ValueError(f"a handler for {name!r} is already registered")
            self.handlers[name] = fn
            return fn
        return register

    # ------------------------------------------------------------ running
    def run(self, settings=None) -> None:
        """Run until SIGTERM or SIGINT (or stop()), then drain; returns when done.

        Signal handlers are installed only when called from the main thread."""
        asyncio.run(self.run_async(settings))

    def stop(self) -> None:
        """Ask a running worker to stop (from any thread); a second call skips
        the rest of the grace period."""
        self._stop_requested = True
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_signal)
            except RuntimeError:
                pass                    # the loop has already finished

    async def run_async(self, settings=None) -> None:
        self._configure(settings)
        if not self.handlers:
            raise ValueError("no handlers registered: decorate functions with @worker.job(name)")
        if len(self.handlers) > MAX_NAMES:
            raise ValueError(f"at most {MAX_NAMES} job names per worker, {len(self.handlers)} registered")
        self._loop = asyncio.get_running_loop()
        self._stop, self._hurry = asyncio.Event(), asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        signals = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal)
                signals.append(sig)
        try:
            await _Run(self).run()
        finally:
            for sig in signals:
                self._loop.remove_signal_handler(sig)
            self._loop = None
            self._stop_requested = False

    def _on_signal(self) -> None:
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    def _configure(self, settings) -> None:
        if settings is None and None in (self.urls, self.token, self.concurrency, self.grace_s):
            from minutehand.settings import Settings
            settings = Settings.load()
        if self.urls is None:
            self.urls = _url_list(settings.worker_urls)
        if self.token is None:
            self.token = settings.worker_token
        if self.concurrency is None:
            self.concurrency = settings.worker_concurrency
        if self.grace_s is None:
            self.grace_s = settings.worker_grace_s
        if not self.urls:
            raise ValueError("no dispatcher URLs: pass urls= or set MINUTEHAND_WORKER_URLS")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= self.wait_s <= MAX_WAIT_S:
            raise ValueError(f"wait_s must be between 0 and {MAX_WAIT_S}")


def _url_list(urls: list[str] | str) -> list[str]:
    if isinstance(urls, str):
        urls = urls.split(",")
    return [u.strip() for u in urls if u.strip()]


# ---------------------------------------------------------------- one run of a worker
@dataclass(eq=False)
class _Running:
    """A job this worker holds: where it came from and until when its claim lasts."""
    job: Job
    outbox: _Outbox
    deadline: float                     # time.monotonic() by which the claim must be renewed
    started: float = field(default_factory=time.monotonic)
    handler_done: bool = False
    lost: str | None = None             # why the claim is no longer ours (then the result is dropped)


class _Run:
    """Everything that lives for one run() call: clients, slots, loops, tasks."""

    def __init__(self, worker: Worker):
        self.w = worker
        self.slots = _Slots(worker.concurrency)
        self.clients = [DispatcherClient(u, worker.token) for u in worker.urls]
        self.outboxes = {c.url: _Outbox(c, [o for o in self.clients if o is not c], worker)
                         for c in self.clients}
        self.threads = _Threads(worker.concurrency)
        self.names = sorted(worker.handlers)
        self.productive = {c.url: False for c in self.clients}
        self.jobs: dict[asyncio.Task, _Running] = {}

    def fields(self, **kw) -> dict:
        """logging kwargs for an event ('name' is LogRecord's own attribute: the
        job's name travels as job_name and is written out as "name")."""
        if "name" in kw:
            kw["job_name"] = kw.pop("name")
        return {"extra": {"worker": self.w.worker_id, **kw}}

    async def run(self) -> None:
        w = self.w
        log.info("worker_started", **self.fields(
            count=w.concurrency, name=",".join(self.names), url=",".join(c.url for c in self.clients)))
        senders = [asyncio.create_task(o.run()) for o in self.outboxes.values()]
        polls = [asyncio.create_task(self.poll(c)) for c in self.clients]
        try:
            await w._stop.wait()
            grace_ends = time.monotonic() + w.grace_s
            log.info("worker_stopping", **self.fields(count=len(self.jobs)))
            self.slots.close()
            # Polls in flight are waited for, not cut: a dispatcher may already have
            # claimed jobs for us, and the answer is how we can give them back.
            await self._wait(polls, grace_ends)
            for t in polls:
                if not t.done():
                    t.cancel()
                    log.warning("lease_abandoned", **self.fields(reason="grace period over during a long-poll"))
            await self._wait(list(self.jobs), grace_ends)
            for task, run in list(self.jobs.items()):
                if not run.handler_done:
                    run.lost = "abandoned at the end of the grace period"
                    log.warning("job_abandoned", **self.fields(
                        job_id=run.job.id, name=run.job.name, attempt=run.job.attempt,
                        duration_ms=_ms(run.started), reason="still running when the grace period ended; "
                                                             "its claim will expire"))
                task.cancel()
            for o in self.outboxes.values():
                await o.drain(timeout_s=5.0)
        finally:
            for t in [*polls, *senders, *self.jobs]:
                t.cancel()
            await asyncio.gather(*polls, *senders, *self.jobs, return_exceptions=True)
            self.threads.close()
            for c in self.clients:
                await c.close()
            log.info("worker_stopped", **self.fields())

    async def _wait(self, tasks: list[asyncio.Task], until: float) -> None:
        """Wait for tasks until the monotonic instant `until`, or a second signal."""
        pending = {t for t in tasks if not t.done()}
        hurry = asyncio.create_task(self.w._hurry.wait())
        try:
            while pending and not hurry.done() and (left := until - time.monotonic()) > 0:
                done, _ = await asyncio.wait(pending | {hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
        finally:
            hurry.cancel()

    # ------------------------------------------------------------ leasing
    def share(self, url: str) -> int:
        """How many slots this URL's loop reserves for one poll. With several
        dispatchers a loop whose last poll was empty asks for one job (an idle
        dispatcher must not sit on slots a busy one could fill); busy loops
        split the concurrency between them."""
        if len(self.clients) == 1:
            return min(self.w.concurrency, MAX_CAPACITY)
        if not self.productive[url]:
            return 1
        busy = sum(self.productive.values())
        return min(max(1, math.ceil(self.w.concurrency / busy)), MAX_CAPACITY)

    async def poll(self, client: DispatcherClient) -> None:
        """One dispatcher's lease loop: reserve slots, long-poll, start what came."""
        w, outbox = self.w, self.outboxes[client.url]
        backoff = 0.2
        while not w._stop.is_set():
            want = self.share(client.url)
            got = await self.slots.take(want)
            if not got:
                return                                  # closed: stopping
            if got < want:                              # a few more may free up in a moment:
                await asyncio.sleep(0.005)              # one bigger lease beats several small ones
                got += self.slots.try_take(want - got)
            if w._stop.is_set():
                self.slots.give(got)
                return
            try:
                out = await client.lease(LeaseIn(worker=w.worker_id, capacity=got, names=self.names,
                                                 wait_s=w.wait_s, teams=w.teams))
            except Exception as exc:                    # Unavailable, Refused, or a bug: the loop goes on
                self.slots.give(got)
                self.productive[client.url] = False
                event = ("dispatcher_unavailable" if isinstance(exc, Unavailable) else
                         "lease_refused" if isinstance(exc, Refused) else "lease_failed")
                log.log(logging.WARNING if isinstance(exc, Unavailable) else logging.ERROR, event,
                        exc_info=event == "lease_failed",
                        **self.fields(url=client.url, reason=f"retry in {backoff:.1f}s",
                                      error=(str(exc) if event != "lease_failed" else error_text(exc))[:2000]))
                await self._sleep_unless_stopped(backoff)
                backoff = min(backoff * 2, 10.0 if isinstance(exc, Unavailable) else 60.0)   # a bad token: slower
                continue
            received = time.monotonic()
            backoff = 0.2
            jobs, extra = out.jobs[:got], out.jobs[got:]
            self.slots.give(got - len(jobs))
            self.productive[client.url] = bool(jobs)
            if not jobs:
                # Let a poll waiting for a slot (another dispatcher's) take the one
                # just given back before this loop takes it again: with fewer
                # slots than dispatchers, one loop could otherwise keep them all.
                await asyncio.sleep(0)
            if jobs:
                outbox.claim_s = jobs[0].claim_s
            for lj in extra:                            # more than asked for: not ours to run
                outbox.release(Held(job_id=lj.job_id, lease_token=lj.lease_token))
            for lj in jobs:
                if w._stop.is_set():
                    self.slots.give(1)
                    outbox.release(Held(job_id=lj.job_id, lease_token=lj.lease_token))
                    log.info("job_released", **self.fields(job_id=int(lj.job_id), name=lj.name,
                                                           attempt=lj.attempt, reason="worker stopping"))
                else:
                    self.start(lj, outbox, received)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.w._stop.wait(), seconds)
        except TimeoutError:
            pass

    # ------------------------------------------------------------ running one job
    def start(self, lj: LeasedJob, outbox: _Outbox, received: float) -> None:
        job = Job(id=int(lj.job_id), team=lj.team, name=lj.name, payload=None, attempt=lj.attempt,
                  max_attempts=lj.max_attempts, idempotency_key=lj.idempotency_key,
                  due_at=lj.due_at, run_at=lj.run_at, claim_expires_at=lj.claim_expires_at,
                  lease_token=lj.lease_token, claim_s=lj.claim_s)
        # The dispatcher claims a job just before it answers, so the claim is taken
        # to run from the answer's arrival, less a margin for the way here.
        run = _Running(job, outbox, deadline=received + lj.claim_s - _margin(lj.claim_s))
        task = asyncio.create_task(self.run_job(run, lj))
        self.jobs[task] = run
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task) -> None:
        self.jobs.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker_bug", exc_info=task.exception(), **self.fields())

    async def run_job(self, run: _Running, lj: LeasedJob) -> None:
        job = run.job
        ids = {"job_id": job.id, "name": job.name, "attempt": job.attempt}
        if lj.replay is not None:
            self.slots.give(1)
            run.handler_done = True
            outcome = Completed(job_id=lj.job_id, lease_token=lj.lease_token,
                                result=msgspec.Raw(msgspec.json.encode(lj.replay.result)))
            await self.report(run, "complete", outcome, "job_replayed", ids)
            return
        # Heartbeats start a third of the claim period in (a timer costs less
        # than a task, and most jobs are done by then).
        keep_alive: list[asyncio.Task] = []
        timer = asyncio.get_running_loop().call_later(
            job.claim_s / 3, lambda: keep_alive.append(asyncio.ensure_future(self.keep_alive(run))))
        if log.isEnabledFor(logging.DEBUG):             # per job: skip building the fields when off
            log.debug("job_started", **self.fields(**ids))
        try:
            outcome, event = await self.call_handler(run, lj)
        finally:
            run.handler_done = True
            self.slots.give(1)
            timer.cancel()
            for task in keep_alive:
                task.cancel()
        kind = "complete" if isinstance(outcome, Completed) else "fail"
        await self.report(run, kind, outcome, event, ids)

    async def call_handler(self, run: _Running, lj: LeasedJob) -> tuple[Completed | Failed, str]:
        handler = self.w.handlers.get(lj.name)
        try:
            if handler is None:
                raise LookupError(f"no handler registered for {lj.name!r} on this worker")
            job = replace(run.job, payload=msgspec.json.decode(lj.payload))
            run.job = job
            if inspect.iscoroutinefunction(handler):
                result = await handler(job)
            else:
                result = await self.threads.run(handler, job)
                if inspect.isawaitable(result):
                    result = await result
            try:
                raw = msgspec.Raw(msgspec.json.encode(result))
            except (TypeError, ValueError, OverflowError) as exc:
                raise TypeError(f"the handler's result is not JSON-able: {exc}") from exc
            # A result the dispatcher would refuse fails the job instead (a refused
            # report would leave it claimed until its claim expired).
            if len(raw) > MAX_JSON_BYTES:
                raise NonRetryable(f"the handler's result is {len(raw):,} bytes as JSON, over the limit of "
                                   f"{MAX_JSON_BYTES:,}: store large results elsewhere and return a reference")
            if reason := json_text_problem("the handler's result", bytes(raw)):
                raise NonRetryable(reason)
            return Completed(job_id=lj.job_id, lease_token=lj.lease_token, result=raw), "job_succeeded"
        except NonRetryable as exc:
            return Failed(job_id=lj.job_id, lease_token=lj.lease_token, error=error_text(exc),
                          retryable=False), "job_failed"
        except Exception as exc:
            return Failed(job_id=lj.job_id, lease_token=lj.lease_token, error=error_text(exc),
                          retryable=True), "job_failed"

    async def report(self, run: _Running, kind: str, outcome, event: str, ids: dict) -> None:
        """Send the outcome, unless the claim may no longer be ours."""
        duration = _ms(run.started)
        error = outcome.error if isinstance(outcome, Failed) else None
        if run.lost is None and time.monotonic() > run.deadline:
            run.lost = "claim expired before the handler returned"
        if run.lost is not None:
            log.warning("job_dropped", **self.fields(**ids, duration_ms=duration, error=error,
                                                     reason=f"{run.lost}: outcome not reported ({kind})"))
            return
        answer = await run.outbox.send(kind, outcome)
        if answer is not None and answer.ok:
            level = logging.WARNING if kind == "fail" else logging.INFO
            if log.isEnabledFor(level):
                log.log(level, event, **self.fields(**ids, duration_ms=duration, error=error, state=answer.state))

    async def keep_alive(self, run: _Running) -> None:
        """Heartbeat every third of the claim period while the handler runs
        (started a third of the way in: the first beat goes at once); a
        claim that lapses or is refused marks the job lost."""
        job = run.job
        period = job.claim_s / 3
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            await asyncio.sleep(max(0.0, min(next_beat, run.deadline) - now))
            if time.monotonic() >= run.deadline:
                run.lost = "claim expired: no heartbeat got through in time"
                log.warning("claim_expired", **self.fields(job_id=job.id, name=job.name, attempt=job.attempt,
                                                          reason=run.lost))
                return
            sent = time.monotonic()
            beat = run.outbox.send("heartbeat", Held(job_id=str(job.id), lease_token=job.lease_token),
                                   extend_s=max(1.0, job.claim_s))
            try:                                        # an answer after the deadline comes too late
                answer = await asyncio.wait_for(asyncio.shield(beat), max(0.0, run.deadline - sent))
            except TimeoutError:
                continue                                # the deadline check above drops the job
            if answer is None:                          # not delivered: try again soon
                next_beat = time.monotonic() + min(period, 2.0)
            elif answer.ok:
                run.deadline = max(run.deadline, sent + job.claim_s - _margin(job.claim_s))
                next_beat = sent + period
            else:
                run.lost = f"claim lost: {answer.reason}"
                log.warning("claim_lost", **self.fields(job_id=job.id, name=job.name, attempt=job.attempt,
                                                       reason=answer.reason, state=answer.state))
                return


def _margin(claim_s: float) -> float:
    """How much sooner than the dispatcher's clock says a claim is taken to end
    here: for what may pass between its clock reading and ours."""
    return min(1.0, claim_s / 10)


def _ms(since: float) -> float:
    return round((time.monotonic() - since) * 1000, 1)


# ---------------------------------------------------------------- slots
class _Slots:
    """Free handler slots. A poll reserves some before it asks and gives back
    what the dispatcher did not fill; a handler gives its slot back on return."""

    def __init__(self, n: int):
        self.free = n
        self.closed = False
        self._waiters: list[asyncio.Future] = []

    async def take(self, want: int) -> int:
        """Wait for at least one free slot; reserve up to `want`. 0: closed."""
        while self.free == 0 and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        return 0 if self.closed else self.try_take(want)

    def try_take(self, want: int) -> int:
        got = min(self.free, want)
        self.free -= got
        return got

    def give(self, n: int) -> None:
        if n:
            self.free += n
            self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)


# ---------------------------------------------------------------- threads for sync handlers
class _Threads:
    """Daemon threads for sync handlers, started as needed up to the
    concurrency. Daemon, so that a handler still stuck after the grace
    period does not keep the process from exiting."""

    def __init__(self, size: int):
        self.size = size
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.busy = 0
        self.lock = threading.Lock()

    def run(self, fn: Callable, arg: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.lock:
            self.busy += 1
            if self.busy > len(self.threads) and len(self.threads) < self.size:
                t = threading.Thread(target=self._serve, name=f"minutehand-handler-{len(self.threads)}",
                                     daemon=True)
                self.threads.append(t)
                t.start()
        self.queue.put((loop, fut, fn, arg))
        return fut

    def _serve(self) -> None:
        while (item := self.queue.get()) is not None:
            loop, fut, fn, arg = item
            try:
                result, error = fn(arg), None
            except Exception as exc:             # handed to the awaiting task: the job fails
                result, error = None, exc
            except BaseException as exc:         # sys.exit() in a handler fails its job, not the worker
                result, error = None, RuntimeError(f"the handler raised {error_text(exc)}")
            with self.lock:
                self.busy -= 1
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:
                pass                              # the loop is gone: the worker has stopped

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


# ---------------------------------------------------------------- outcomes
class _Outbox:
    """Outcomes of the jobs one dispatcher handed out, sent together: whatever
    gathers in `flush_s` (and while the previous request is on its way) goes
    in one POST /v1/worker/outcomes. If that dispatcher cannot be reached
    they go to another (outcomes are per job and lease token, not per
    dispatcher); if none can, completions, failures and releases are kept
    and retried, heartbeats are answered None (the next one will try)."""

    KINDS = ("heartbeat", "complete", "fail", "release")

    def __init__(self, client: DispatcherClient, others: list[DispatcherClient], worker: Worker):
        self.client = client
        self.others = others
        self.worker = worker
        self.claim_s = 30.0               # this dispatcher's claim period, as its last lease said
        self.items: list[tuple[str, Any, float | None, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()

    def send(self, kind: str, item, extend_s: float | None = None) -> asyncio.Future:
        """Queue one outcome; the future gets its OutcomeOut, or None if undelivered."""
        fut = asyncio.get_running_loop().create_future()
        self.items.append((kind, item, extend_s, fut))
        self.idle.clear()
        self.wake.set()
        return fut

    def release(self, held: Held) -> None:
        self.send("release", held)

    async def run(self) -> None:
        backoff = 0.2
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.worker.flush_s)
            self.wake.clear()
            batch, self.items = self.items, []
            left = await self.deliver(batch)
            if left:
                self.items[:0] = left
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self.wake.set()
            else:
                backoff = 0.2
                if not self.items:
                    self.idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait for every queued outcome to be sent (or give up after timeout_s)."""
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("outcomes_unsent", extra={"worker": self.worker.worker_id, "url": self.client.url,
                                                  "count": len(self.items),
                                                  "reason": "no dispatcher reachable; their claims will expire"})

    async def deliver(self, batch: list) -> list:
        """Send a batch in as few requests as the protocol allows; what could not
        be delivered anywhere and is worth retrying."""
        left = []
        for request in _requests(batch):
            body = OutcomesIn(**{k: [i[1] for i in request[k]] for k in self.KINDS},
                              extend_s=request["extend_s"])
            answer, error = None, None
            for client in (self.client, *self.others):
                try:
                    # a third of a claim: time to try another dispatcher before claims run out
                    timeout_s = min(10.0, max(2.0, self.claim_s / 3))
                    answer, error = await client.outcomes(body, timeout_s=timeout_s), None
                    break
                except Refused as exc:                  # the request itself is wrong: not retried
                    error = exc
                    log.error("outcomes_refused", extra={"worker": self.worker.worker_id, "url": client.url,
                                                         "error": str(exc)[:2000], "reason": "not retried"})
                    break
                except Exception as exc:                # Unavailable (or a surprise): elsewhere, or later
                    error = exc
                    log.warning("dispatcher_unavailable", exc_info=not isinstance(exc, Unavailable),
                                extra={"worker": self.worker.worker_id, "url": client.url,
                                       "error": (str(exc) if isinstance(exc, Unavailable) else error_text(exc))[:2000],
                                       "reason": "sending outcomes"})
            for kind in self.KINDS:
                results = getattr(answer, kind) if answer is not None else [None] * len(request[kind])
                for item, result in zip(request[kind], results):
                    fut = item[3]
                    if result is None and kind != "heartbeat" and not isinstance(error, Refused):
                        left.append(item)               # retried: it must get through
                        continue
                    if result is not None and not result.ok and kind != "heartbeat":
                        log.warning("outcome_refused", extra={
                            "worker": self.worker.worker_id, "job_id": int(result.job_id), "state": result.state,
                            "reason": f"{kind}: {result.reason} (not retried)"})
                    if not fut.done():
                        fut.set_result(result)
        return left


def _requests(batch: list) -> list[dict]:
    """Split a batch into request bodies: one extend_s per request (heartbeats
    of different claim periods go separately), at most MAX_ITEMS per list and
    about MAX_REQUEST_BYTES per request (results and errors can be large: a
    request over the server's body limit would be refused whole)."""
    # item: (kind, body, extend_s, future); the other kinds ride with the first heartbeats
    ride = next((i[2] for i in batch if i[0] == "heartbeat"), None)
    groups: dict[float | None, list] = {}
    for item in batch:
        groups.setdefault(item[2] if item[0] == "heartbeat" else ride, []).append(item)
    requests: list[dict] = []
    for extend_s, items in groups.items():
        request, size = None, 0
        for item in items:
            n = _size(item[1])
            if request is None or size + n > MAX_REQUEST_BYTES or len(request[item[0]]) >= MAX_ITEMS:
                request, size = {"extend_s": extend_s, **{k: [] for k in _Outbox.KINDS}}, 0
                requests.append(request)
            request[item[0]].append(item)
            size += n
    return requests


def _size(body) -> int:
    """About how many bytes an outcome adds to a request."""
    if isinstance(body, Completed) and isinstance(body.result, msgspec.Raw):
        return len(body.result) + 100
    if isinstance(body, Failed):
        return len(body.error) * 2 + 100
    return 100
