"""The worker: a set of handlers by job name, and run() / stop().

    worker = Worker(urls=["http://d1:8080", "http://d2:8080"], token="...", concurrency=10)

    @worker.job("send_report")
    async def send_report(job: Job):
        ...
        return {"sent": True}

    worker.run()        # until SIGTERM / SIGINT; or `minutehand worker module:worker`

How it keeps its invariants (each in its module):
- Never more handlers running than `concurrency`: a slot is reserved before
  a lease is asked for (capacity = the slots reserved) and given back when
  the handler returns, or at once if the dispatcher had fewer jobs (slots.py).
- Each dispatcher only hands out jobs of the shards it owns, so there is one
  long-poll loop per URL; a loop whose dispatcher fails backs off and
  retries, the others carry on (poller.py).
- A claim is a lease: running jobs are renewed by heartbeat from half the
  claim period on, every third of it. A job whose claim could not be renewed in time is
  dropped (its result is not reported): the scheduler may have given it to
  another worker, and the job must not be finished twice (heartbeats.py, runner.py).
- Outcomes go out in batches, to another dispatcher if theirs is away (outbox.py).
- SIGTERM: no new leases; jobs that arrive afterwards are released at once;
  running ones get `grace_s`, then are failed, to be retried (session.py).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import replace

from minutehand.protocol import MAX_WAIT_S
from minutehand.worker.job import Job, NonRetryable
from minutehand.worker.runner import Handler
from minutehand.worker.session import Session
from minutehand.worker.settings import WorkerSettings

MAX_NAMES = 100             # most job names one lease may ask for


def default_worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.:@/-]", "-", socket.gethostname()) or "worker"
    return f"{host}:{os.getpid()}"


class Worker:
    """A set of handlers by job name and the loop that runs them.

    urls, token, concurrency and grace_s left as None are taken from the
    settings when the worker runs (WorkerSettings: MINUTEHAND_WORKER_URLS,
    _TOKEN, _CONCURRENCY, _GRACE_S or the matching flags of `minutehand worker`).
    """

    def __init__(self, urls: list[str] | str | None = None, token: str | None = None,
                 concurrency: int | None = None, *, grace_s: float | None = None,
                 worker_id: str | None = None, wait_s: float = 25.0, flush_s: float = 0.005,
                 teams: list[str] | None = None, metrics_port: int | None = None):
        """teams: run only jobs submitted by these teams (None: any team's).
        Job names are not owned by a team: any team may submit a job named
        like one of these handlers, so a worker whose handlers trust their
        payloads names the teams it trusts (each job also says its team).
        metrics_port: serve Prometheus metrics there (0: no; None: the
        worker_metrics_port setting, if settings are read)."""
        self.urls = _url_list(urls) if urls is not None else None
        self.teams = sorted(set(teams)) if teams is not None else None
        self.token = token
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.metrics_port = metrics_port
        self.metrics_host = "127.0.0.1"
        self.worker_id = worker_id or default_worker_id()
        # Long-poll limit. An idle worker costs each dispatcher one request per
        # wait_s (docs/guides/workers.md); 25 s stays under the 30 s that some
        # load balancers allow a request. A stop asks for its polls' answers
        # at once rather than waiting them out.
        self.wait_s = wait_s
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

    def handles(self, task) -> Callable[[Handler], Handler]:
        """Register the decorated function (sync or async, one Job argument)
        as the handler of a task's jobs (minutehand.client.task): the job's
        payload is converted to the task's type first. A payload that does
        not convert fails the job at once, not retried, with the reason: no
        attempt can succeed on it. The task is used by its name and decode()
        alone, so the worker imports nothing of the client."""
        def register(fn: Handler) -> Handler:
            self.job(task.name)(typed(task, fn))
            return fn
        return register

    # ------------------------------------------------------------ running
    def run(self, settings: WorkerSettings | None = None) -> None:
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

    async def run_async(self, settings: WorkerSettings | None = None) -> None:
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
        session = Session(handlers=dict(self.handlers), urls=self.urls, token=self.token,
                          concurrency=self.concurrency, grace_s=self.grace_s, worker_id=self.worker_id,
                          wait_s=self.wait_s, flush_s=self.flush_s, teams=self.teams,
                          stopping=self._stop, hurry=self._hurry,
                          metrics=(self.metrics_host, self.metrics_port) if self.metrics_port else None)
        try:
            await session.start()
            try:
                await self._stop.wait()
            except BaseException:
                self._hurry.set()               # torn down rather than stopped: no grace period
                raise
            finally:
                await session.stop()
        finally:
            for sig in signals:
                self._loop.remove_signal_handler(sig)
            self._loop = None
            self._stop_requested = False

    def _on_signal(self) -> None:
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()

    def _configure(self, settings: WorkerSettings | None) -> None:
        if settings is None and None in (self.urls, self.token, self.concurrency, self.grace_s):
            settings = WorkerSettings.load()
        if self.urls is None:
            self.urls = _url_list(settings.worker_urls)
        if self.token is None:
            self.token = settings.worker_token
        if self.concurrency is None:
            self.concurrency = settings.worker_concurrency
        if self.grace_s is None:
            self.grace_s = settings.worker_grace_s
        if self.metrics_port is None and settings is not None:
            self.metrics_port = settings.worker_metrics_port
            self.metrics_host = settings.worker_metrics_host
        if not self.urls:
            raise ValueError("no dispatcher URLs: pass urls= or set MINUTEHAND_WORKER_URLS")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port {self.metrics_port} is not from 0 (no metrics server) to 65535")
        if not 0 <= self.wait_s <= MAX_WAIT_S:
            raise ValueError(f"wait_s must be between 0 and {MAX_WAIT_S}")


def typed(task, fn: Handler) -> Handler:
    """fn, called with the job's payload as the task's type."""
    def decoded(job: Job) -> Job:
        try:
            return replace(job, payload=task.decode(job.payload))
        except ValueError as exc:            # the task's PayloadError, msgspec's ValidationError
            raise NonRetryable(str(exc)) from None

    if inspect.iscoroutinefunction(fn):
        async def handle_async(job: Job):
            return await fn(decoded(job))
        return functools.wraps(fn)(handle_async)

    def handle(job: Job):
        return fn(decoded(job))
    return functools.wraps(fn)(handle)


def _url_list(urls: list[str] | str) -> list[str]:
    if isinstance(urls, str):
        urls = urls.split(",")
    return [u.strip() for u in urls if u.strip()]
