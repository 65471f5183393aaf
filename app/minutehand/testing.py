"""Helpers for testing the handlers of a `minutehand.worker.Worker`.

Run one handler on a job built in the test, with no server and no database:

    from minutehand import testing

    job = testing.make_job("emails.send", {"to": "a@b"}, attempt=2)
    outcome = testing.run_job(worker, job)          # or: await testing.run_job_async(worker, job)
    assert outcome.succeeded and outcome.result == {"sent": True}

The handler runs as the worker loop runs it (a sync one in a worker thread,
an async one awaited; NonRetryable fails without retry, any other
exception fails retryably; a result that is not JSON, too big or too deeply
nested fails the job) and the answer is what the worker would report.

Run every due job of the worker's names through the real thing, against a
migrated database of the test's own:

    summary = testing.drain(worker, database_url)
    assert summary.succeeded == [job_id]

`drain` starts a dispatcher serving the worker protocol on 127.0.0.1 (a free
port) in this process, runs a copy of the worker (its handlers, pointed at
that dispatcher) until no job of its names is due or running, and stops
both. As a pytest plugin (opt in with `pytest_plugins = ["minutehand.testing"]`)
the same is the fixture `minutehand_drain`, on the database the fixture
`minutehand_database_url` names (override it in your conftest).

The database is the test's alone: the drain's dispatcher takes every shard,
and its worker token ("testing-drain") is rotated on each drain.

PYTEST_DONT_REWRITE: this plugin has no asserts to rewrite; the marker keeps
pytest from warning when a test module imported it before loading it.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgspec

from minutehand.protocol import JobId
from minutehand.worker import Job, Worker
from minutehand.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from minutehand.store.jobs import JobStatus

__all__ = ["Drained", "DrainTimeout", "Failed", "Outcome", "Succeeded", "drain", "drain_async",
           "make_job", "run_job", "run_job_async"]

UTC = dt.timezone.utc
WORKER_TOKEN_NAME = "testing-drain"
_job_ids = itertools.count(1)


# ================================================================ one handler, no server
@dataclass(frozen=True)
class Succeeded:
    """The handler returned: `result` as the scheduler would store it (decoded JSON)."""
    result: Any
    succeeded = True


@dataclass(frozen=True)
class Failed:
    """The handler failed: `error` as reported ("ExcType: message"); `retryable`
    False for NonRetryable (and results the scheduler cannot store): the job
    would be dead at once instead of retried."""
    error: str
    retryable: bool
    succeeded = False


Outcome = Succeeded | Failed


def make_job(name: str, payload: Any = None, *, team: str = "test", attempt: int = 1, max_attempts: int = 3,
             idempotency_key: str | None = None, id: int | None = None, due_at: dt.datetime | None = None,
             run_at: dt.datetime | None = None, claim_s: float = 30.0) -> Job:
    """A Job as a worker would receive it; payload None is the submission
    default, {}. The payload must be JSON-able: the handler receives it
    decoded from JSON (a tuple arrives as a list), as from a dispatcher."""
    payload = {} if payload is None else payload
    try:
        msgspec.json.encode(payload)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"the payload is not JSON-able: {exc}") from exc
    now = dt.datetime.now(UTC)
    due_at = due_at or now
    run_at = run_at or due_at
    return Job(id=JobId(next(_job_ids) if id is None else id), team=team, name=name, payload=payload, attempt=attempt,
               max_attempts=max_attempts, idempotency_key=idempotency_key, due_at=due_at, run_at=run_at,
               claim_expires_at=max(now, run_at) + dt.timedelta(seconds=claim_s),
               lease_token=uuid.uuid4(), claim_s=claim_s)


async def run_job_async(worker: Worker, job: Job) -> Outcome:
    """Run the handler `worker` registered for `job.name` on `job`, as the
    worker loop would; what it would report. A name with no handler raises
    LookupError (the loop would fail such a job; in a test it is a typo)."""
    if job.name not in worker.handlers:
        raise LookupError(f"no handler registered for {job.name!r}; registered: {sorted(worker.handlers)}")
    return await _worker_outcome(worker, job)


def run_job(worker: Worker, job: Job) -> Outcome:
    """run_job_async for sync tests (not from inside a running event loop)."""
    return asyncio.run(run_job_async(worker, job))


# ================================================================ every due job, through a real dispatcher
@dataclass(frozen=True)
class Drained:
    """The jobs of the worker's names that the drain saw due or running
    (polled every 50 ms: a job a handler submits may finish unseen), each
    as its status record read after everything stopped (`jobs`, by id)."""
    jobs: dict[int, JobStatus]

    def ids(self, state: str) -> list[int]:
        return sorted(i for i, st in self.jobs.items() if st.state == state)

    @property
    def succeeded(self) -> list[int]:
        return self.ids("succeeded")

    @property
    def retrying(self) -> list[int]:
        """Failed and due again later (left alone: see drain's `retries`)."""
        return self.ids("retrying")

    @property
    def dead(self) -> list[int]:
        return self.ids("dead")


class DrainTimeout(TimeoutError):
    """The jobs did not settle within timeout_s; `drained` is what was seen,
    `outstanding` the ids still due or running."""

    def __init__(self, message: str, drained: Drained, outstanding: list[int]):
        super().__init__(message)
        self.drained = drained
        self.outstanding = outstanding


def drain(worker: Worker, database_url: str, *, timeout_s: float = 30.0, retries: bool = True,
          claim_lease_s: float = 30.0) -> Drained:
    """Run every due job of `worker`'s names (and teams, if it names them)
    through a dispatcher and a copy of `worker` in this process, until none
    is due, claimed or running; then stop both and report.

    database_url: an already-migrated database, for this test alone. Jobs
    due later are left alone. retries: also wait for failed jobs whose
    retry comes due before the drain's deadline (submit them with a small
    `backoff_base_s`), so each ends succeeded or dead; False: a retry not
    yet due ends the drain. Raises DrainTimeout after timeout_s."""
    deadline = time.monotonic() + timeout_s
    retry_horizon = dt.datetime.now(UTC) + dt.timedelta(seconds=timeout_s) if retries else None
    names = sorted(worker.handlers)
    if not names:
        raise ValueError("no handlers registered: decorate functions with @worker.job(name)")
    store = _store(database_url)
    seen: set[int] = set()
    outstanding: list[int] = []
    try:
        if not _outstanding(store, names, worker.teams, retry_horizon):
            return Drained({})                  # nothing to run: no dispatcher to start
        token = store.create_worker_token(WORKER_TOKEN_NAME)
        with (_dispatcher(database_url, claim_lease_s) as url,
              _running(_copy_worker(worker, url, token)) as run):
            while True:
                outstanding = _outstanding(store, names, worker.teams, retry_horizon)
                seen.update(outstanding)
                if not outstanding or time.monotonic() >= deadline or not run.thread.is_alive():
                    break                       # a worker that died raises its error on exit
                time.sleep(0.05)
        drained = Drained({i: st for i in sorted(seen) if (st := store.status(i)) is not None})
    finally:
        store.close()
    if outstanding:
        raise DrainTimeout(f"{len(outstanding)} job(s) still due or running after {timeout_s} s: "
                           f"{outstanding[:20]}", drained, outstanding)
    return drained


async def drain_async(worker: Worker, database_url: str, **kw) -> Drained:
    """drain, from async tests (it runs in a thread; the event loop goes on)."""
    return await asyncio.to_thread(drain, worker, database_url, **kw)


class _running:
    """Run a worker's loop in a thread; on exit stop it (its public stop()) and join."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._main, name="minutehand-testing-worker", daemon=True)

    def _main(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:        # noqa: BLE001 - raised in the test's thread on exit
            self.errors.append(exc)

    def __enter__(self) -> _running:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.thread.join(self.worker.grace_s + self.worker.wait_s + 10)
        if self.thread.is_alive():
            raise RuntimeError("the worker did not stop")
        if self.errors and exc[0] is None:
            raise RuntimeError("the worker's loop failed") from self.errors[0]


class _dispatcher:
    """A dispatcher with the worker protocol, served by uvicorn in a thread on a
    socket bound here (a free port, no race for it); yields its base URL."""

    def __init__(self, database_url: str, claim_lease_s: float):
        self.sock = socket.socket()
        try:
            self.sock.bind(("127.0.0.1", 0))
            self.app, self.close = _dispatcher_app(database_url, self.sock.getsockname()[1], claim_lease_s)
        except BaseException:
            self.sock.close()
            raise
        self.server = None
        self.thread = None

    def __enter__(self) -> str:
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(self.app, lifespan="on", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="minutehand-testing-dispatcher", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError("the dispatcher did not start (see the log above)")
            time.sleep(0.02)
        host, port = self.sock.getsockname()
        return f"http://{host}:{port}"

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.should_exit = True          # lifespan shutdown stops the dispatcher
            self.thread.join(30)
        self.sock.close()
        self.close()


# ================================================================ pytest plugin (opt in)
try:
    import pytest
except ImportError:                                  # the library works without pytest
    pytest = None

if pytest is not None:
    @pytest.fixture
    def minutehand_database_url() -> str:
        """The migrated database minutehand_drain works on: override this
        fixture (e.g. in conftest.py) to return a URL for the test."""
        pytest.fail("minutehand_drain needs a database: define a fixture `minutehand_database_url` "
                    "returning the URL of a migrated database for this test", pytrace=False)

    @pytest.fixture
    def minutehand_drain(minutehand_database_url: str) -> Callable[..., Drained]:
        """drain(worker, **options) on the database minutehand_database_url names."""
        def drain_here(worker: Worker, **kw) -> Drained:
            return drain(worker, minutehand_database_url, **kw)
        return drain_here


# ================================================================ couplings to minutehand's internals
# Each function below is the one place this module reaches past the public
# API; rewire them here when the modules they name move.

async def _worker_outcome(worker: Worker, job: Job) -> Outcome:
    """The worker loop's own handler call (minutehand.worker.runner:
    run_handler), its Completed or Failed as an Outcome."""
    from minutehand.worker.job import NonRetryable, error_text
    from minutehand.worker.runner import run_handler
    from minutehand.worker.threads import HandlerThreads
    # The payload as a handler gets it from a dispatcher: through JSON.
    job = replace(job, payload=msgspec.json.decode(msgspec.json.encode(job.payload)))
    threads = HandlerThreads(1)
    try:
        raw = await run_handler(worker.handlers.get(job.name), job, threads)
    except NonRetryable as exc:
        return Failed(error=error_text(exc), retryable=False)
    except Exception as exc:
        return Failed(error=error_text(exc), retryable=True)
    finally:
        threads.close()
    return Succeeded(result=msgspec.json.decode(bytes(raw)))


def _dispatcher_app(database_url: str, port: int, claim_lease_s: float):
    """The process `minutehand dispatcher` serves (minutehand.serve.build with
    the worker protocol only), less uvicorn.run: (app, close) where close()
    closes its stores."""
    from minutehand.serve import api_store, build, dispatcher_store
    settings = _settings(database_url=database_url, http_host="127.0.0.1", http_port=port,
                         claim_lease_s=claim_lease_s, dispatcher_name=f"testing-{secrets.token_hex(4)}",
                         log_level="WARNING")
    store = api_store(settings)
    dispatch_store = dispatcher_store(settings)

    def close() -> None:
        store.close()
        dispatch_store.close()
    try:
        return build(settings, store, dispatch_store, submit_api=False).app, close
    except BaseException:
        close()
        raise


def _settings(**values):
    """Settings with these values and the defaults for the rest (the
    environment is not read: a test's drain must not depend on it)."""
    from minutehand.settings import Settings
    return Settings(**values)


def _store(database_url: str):
    """A small store on the real clock: the dispatcher reads the real time."""
    from minutehand.store.store import Store
    return Store(database_url, max_size=2)


def _copy_worker(worker: Worker, url: str, token: str) -> Worker:
    """A Worker with `worker`'s handlers and options, pointed at the drain's
    dispatcher (the user's own Worker is left untouched). Its long-poll is
    short, as a stop waits for the poll in flight; unless the worker sets
    one, the grace period is short too (a handler stuck past a drain's
    timeout holds the test only that long)."""
    copy = Worker(urls=[url], token=token,
                  concurrency=(worker.concurrency if worker.concurrency is not None
                               else WorkerSettings().worker_concurrency),
                  grace_s=worker.grace_s if worker.grace_s is not None else 5.0,
                  worker_id=f"testing-{secrets.token_hex(4)}", wait_s=min(worker.wait_s, 0.25),
                  flush_s=worker.flush_s, teams=worker.teams)
    for name, handler in worker.handlers.items():
        copy.job(name)(handler)
    return copy


def _outstanding(store, names: list[str], teams: list[str] | None, retry_horizon: dt.datetime | None) -> list[int]:
    """Ids of the jobs the drain still waits for (Store.outstanding_jobs)."""
    return store.outstanding_jobs(names, teams, retry_horizon)

