"""The worker library (app/minutehand/worker) against a real `minutehand serve` process
and a real database: handlers sync and async, the concurrency limit, replayed
results (recorded before the completion, kept through an expired claim and a
SIGKILL), failures retried or dead, heartbeats, dropped results after a lost
claim, exactly-once effects (also across SIGKILL), SIGTERM drain of a real
`minutehand worker` process, a cancel racing a worker, and a named worker
not held up by another team's mass cancel.

Dispatcher failover and crash tests live with the dispatcher's tests.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from minutehand.store.submit import JobSpec
from minutehand.worker import Job, NonRetryable, Worker, effects
from minutehand.worker.client import DispatcherClient, Refused
from tests.processes import ROOT, Server, WorkerProcess, free_port, logs, wait_until
from tests.support import running, submit_store
from tests.worker_apps import RUNS_DDL

pytestmark = pytest.mark.processes


# ---------------------------------------------------------------- a server, a team, a worker token
def start_server(dsn: str, *extra: str) -> Server:
    """`minutehand serve` (API + dispatcher) on the test database, as a child process."""
    return Server(dsn, *extra)


@pytest.fixture
def server(db_dsn, live_store) -> Iterator[Server]:
    s = start_server(db_dsn, "--claim-lease-s", "30")
    yield s
    s.stop()


def submit(store, name: str, payload=None, **kw) -> int:
    return submit_store(store, "t", name, payload=payload, **kw)[0]


def states(store, ids) -> dict[int, str]:
    return {i: store.status(i).state for i in ids}


def all_in(store, ids, wanted: set[str]) -> bool:
    return all(s in wanted for s in states(store, ids).values())


# ---------------------------------------------------------------- handlers
def test_sync_and_async_handlers_get_their_jobs_and_results_are_stored(server, live_store, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=4, grace_s=5)
    seen: list[Job] = []

    @worker.job("add")
    def add(job: Job):
        seen.append(job)
        return {"sum": job.payload["a"] + job.payload["b"], "thread": threading.current_thread().name}

    @worker.job("shout")
    async def shout(job: Job):
        await asyncio.sleep(0.01)
        return job.payload.upper()

    adds = [submit(live_store, "add", {"a": i, "b": 1}) for i in range(5)]
    shouts = [submit(live_store, "shout", f"hi {i}") for i in range(5)]
    with running(worker):
        wait_until(lambda: all_in(live_store, adds + shouts, {"succeeded"}), what="every job to succeed")
    for i, job_id in enumerate(adds):
        st = live_store.status(job_id)
        assert st.result["sum"] == i + 1
        assert st.result["thread"].startswith("minutehand-handler")     # sync: off the event loop
        assert st.attempts == 1
    assert [live_store.status(j).result for j in shouts] == [f"HI {i}" for i in range(5)]
    job = next(j for j in seen if j.id == adds[0])
    assert (job.name, job.attempt, job.max_attempts, job.idempotency_key) == ("add", 1, 3, None)
    assert job.due_at <= job.run_at and job.claim_expires_at > job.run_at


def test_a_worker_asks_only_for_its_names(server, live_store, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)
    worker.job("mine")(lambda job: "ok")
    mine, other = submit(live_store, "mine"), submit(live_store, "someone-else")
    with running(worker):
        wait_until(lambda: all_in(live_store, [mine], {"succeeded"}), what="its job")
        time.sleep(0.5)
    assert live_store.status(other).state == "scheduled" and live_store.status(other).attempts == 0


def test_registering_a_name_twice_is_refused():
    worker = Worker(urls=["http://x"], token="t")
    worker.job("a")(lambda job: None)
    with pytest.raises(ValueError, match="already registered"):
        worker.job("a")(lambda job: None)


# ---------------------------------------------------------------- concurrency
@pytest.mark.parametrize("copies", [1, 2], ids=["one-url", "same-dispatcher-twice"])
def test_never_more_handlers_running_than_the_concurrency(server, live_store, token, copies):
    """Counted inside the handlers, sync and async together; with two URLs the
    two lease loops split the slots and still never exceed the limit."""
    limit = 3
    worker = Worker(urls=[server.url] * copies, token=token, wait_s=1, concurrency=limit, grace_s=5)
    lock = threading.Lock()
    now = {"running": 0, "most": 0}

    def enter():
        with lock:
            now["running"] += 1
            now["most"] = max(now["most"], now["running"])

    def leave():
        with lock:
            now["running"] -= 1

    @worker.job("slow_sync")
    def slow_sync(job):
        enter()
        try:
            time.sleep(0.1)
        finally:
            leave()

    @worker.job("slow_async")
    async def slow_async(job):
        enter()
        try:
            await asyncio.sleep(0.1)
        finally:
            leave()

    ids = [submit(live_store, "slow_sync" if i % 2 else "slow_async") for i in range(30)]
    with running(worker):
        wait_until(lambda: all_in(live_store, ids, {"succeeded"}), 60, "every job to succeed")
    assert now["most"] == limit


def test_a_dead_dispatcher_url_does_not_stop_the_others(server, live_store, token, caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    worker = Worker(urls=[dead, server.url], token=token, wait_s=1, concurrency=2, grace_s=5)
    worker.job("j")(lambda job: job.id)
    ids = [submit(live_store, "j") for _ in range(5)]
    with caplog.at_level("WARNING", logger="minutehand.worker"), running(worker):
        wait_until(lambda: all_in(live_store, ids, {"succeeded"}), what="every job to succeed")
    assert any(r.getMessage() == "dispatcher_unavailable" and r.url == dead for r in caplog.records)


def test_outcomes_go_through_another_dispatcher_when_theirs_is_frozen(db_dsn, live_store, token, db, caplog):
    """The dispatcher that handed out the job is frozen (SIGSTOP) before the
    handler returns: the completion is sent through the other one in time."""
    servers = {name: Server(db_dsn, "--claim-lease-s", "6", name=name) for name in "ab"}
    try:
        wait_until(lambda: {o for (o,) in db.execute("SELECT DISTINCT owner FROM shards")} == {"a", "b"},
                   30, "the two dispatchers to split the shards")
        worker = Worker(urls=[s.url for s in servers.values()], token=token, wait_s=1, concurrency=1, grace_s=5)
        frozen = []

        @worker.job("x")
        def x(job):
            owner = db.execute("SELECT owner FROM shards WHERE shard = mh_shard_of(%s)", (job.id,)).fetchone()[0]
            servers[owner].signal(signal.SIGSTOP)
            frozen.append(owner)
            return "done"

        job_id = submit(live_store, "x")
        with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
            wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 20, f"the job to succeed (frozen {frozen})")
            servers[frozen[0]].signal(signal.SIGCONT)
        assert live_store.status(job_id).attempts == 1
        assert any(r.getMessage() == "dispatcher_unavailable" and r.url == servers[frozen[0]].url
                   and r.reason == "sending outcomes" for r in caplog.records)
    finally:
        for s in servers.values():
            s.stop()


# ---------------------------------------------------------------- replay, failures
def test_a_stored_result_is_replayed_without_running_the_handler(server, live_store, token, db):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)
    ran = []
    worker.job("pay")(lambda job: ran.append(job.id) or {"paid": "again"})
    job_id = submit(live_store, "pay", {"cents": 5}, idempotency_key="order-1")
    # As if an earlier run had finished: its result is stored under the key.
    n = db.execute("""UPDATE idempotency_keys SET result = '{"paid": "once"}', completed_at = now()
                       WHERE key = 'order-1'""").rowcount
    assert n == 1
    with running(worker):
        wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), what="the job to succeed")
    assert ran == []
    assert live_store.status(job_id).result == {"paid": "once"}


def handler_runs(db, job_id: int) -> int:
    return db.execute("SELECT count(*) FROM runs WHERE job_id = %s", (job_id,)).fetchone()[0]


def test_a_result_recorded_before_a_refused_completion_is_replayed_not_run_again(server, live_store, token, db,
                                                                                   db_dsn, caplog):
    """The claim lapses under the running handler (as when no beat gets
    through), and the job is due again. The handler's result is recorded
    under the key all the same; the completion is refused as stale; the
    next delivery carries the result and completes with it, the handler not
    run again (its runs are counted in the database)."""
    db.execute(RUNS_DDL)
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)

    @worker.job("pay")
    def pay(job: Job):
        with psycopg.connect(db_dsn, autocommit=True) as c:
            c.execute("INSERT INTO runs (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempt))
            past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
            c.execute("UPDATE jobs SET claim_expires_at = %s WHERE id = %s", (past, job.id))
            c.execute("UPDATE claim_checks SET check_at = %s WHERE %s = ANY (job_ids)", (past, job.id))
        wait_until(lambda: live_store.status(job.id).state == "scheduled", 20, "the claim to expire")
        return {"paid": job.payload["cents"], "attempt": job.attempt}

    job_id = submit(live_store, "pay", {"cents": 5}, idempotency_key="order-9")
    with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
        wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 30, "the job to succeed")
    st = live_store.status(job_id)
    assert (st.result, st.attempts, handler_runs(db, job_id)) == ({"paid": 5, "attempt": 1}, 2, 1)
    events = [(r.getMessage(), getattr(r, "reason", "")) for r in caplog.records if getattr(r, "job_id", None) == job_id]
    # refused as stale: the job waiting again, or already claimed again (for the replay)
    assert any(e == "outcome_refused" and r.startswith(("complete: job is scheduled", "complete: lease token"))
               for e, r in events), events
    assert "job_replayed" in [e for e, _ in events]


def test_a_worker_killed_between_the_record_and_the_completion_leaves_the_result_to_replay(db_dsn, live_store, token,
                                                                                            db):
    """A real `minutehand worker` (its reports held 2.5 s) is SIGKILLed once
    the keyed job's result is recorded and before its completion goes out.
    The claim expires; another worker gets the job with the recorded result
    and completes it, the handler not run again (attempt 1's result; the
    expiry did not count the attempt)."""
    db.execute(RUNS_DDL)
    server = start_server(db_dsn, "--claim-lease-s", "8")
    env = {"MINUTEHAND_TEST_EFFECTS_DSN": db_dsn}
    first = WorkerProcess("slow_reports", [server.url], token, concurrency=1, env=env, label="killed")
    second = None
    try:
        job_id = submit(live_store, "work", idempotency_key="kill-9")
        recorded = "SELECT completed_at IS NOT NULL FROM idempotency_keys WHERE key = 'kill-9'"
        wait_until(lambda: db.execute(recorded).fetchone()[0], 30, "the result to be recorded", every_s=0.02)
        first.kill()
        assert first.proc.returncode == -signal.SIGKILL
        st = live_store.status(job_id)
        assert st.state in ("claimed", "running") and handler_runs(db, job_id) == 1, (st, logs(first))
        second = WorkerProcess("recorder", [server.url], token, concurrency=1, env=env, label="second")
        wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 40, "the job to succeed")
        st = live_store.status(job_id)
        assert (st.result, st.attempts, handler_runs(db, job_id)) == ({"ran": job_id % 1000, "attempt": 1}, 1, 1)
        # logged once the completion's answer is back, which may be after the test saw the job succeed
        wait_until(lambda: "job_replayed" in second.output(), 20, "the replay to be logged")
    finally:
        for p in (first, second):
            if p is not None:
                p.stop()
        server.stop()


def test_non_retryable_is_dead_at_once(server, live_store, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)

    @worker.job("bad")
    def bad(job):
        raise NonRetryable("no such account")

    job_id = submit(live_store, "bad", max_attempts=5)
    with running(worker):
        wait_until(lambda: all_in(live_store, [job_id], {"dead"}), what="the job to be dead")
    st = live_store.status(job_id)
    assert (st.attempts, st.last_error) == (1, "NonRetryable: no such account")


def test_an_exception_is_retried_later_with_its_error(server, live_store, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)

    @worker.job("flaky")
    async def flaky(job):
        raise ValueError("upstream said 503")

    @worker.job("wordy")
    def wordy(job):
        raise RuntimeError("x" * 20_000)

    # a long backoff: the retry is not due while the test looks
    flaky_id = submit(live_store, "flaky", backoff_base_s=3600)
    wordy_id = submit(live_store, "wordy", backoff_base_s=3600)
    with running(worker):
        wait_until(lambda: all_in(live_store, [flaky_id, wordy_id], {"retrying"}), what="both to be retrying")
    st = live_store.status(flaky_id)
    assert (st.state, st.attempts, st.last_error) == ("retrying", 1, "ValueError: upstream said 503")
    assert st.run_at > st.due_at
    assert live_store.status(wordy_id).last_error == ("RuntimeError: " + "x" * 20_000)[:10_000]


def test_a_result_that_is_not_json_fails_the_run(server, live_store, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)
    worker.job("odd")(lambda job: object())
    job_id = submit(live_store, "odd", backoff_base_s=3600)
    with running(worker):
        wait_until(lambda: all_in(live_store, [job_id], {"retrying"}), what="the job to be retrying")
    assert "not JSON-able" in live_store.status(job_id).last_error


# ---------------------------------------------------------------- claims
def test_heartbeats_keep_a_long_job_claimed(db_dsn, live_store, token):
    """Claims of 3 s, a job of 5 s: renewed by heartbeat, it runs once."""
    server = start_server(db_dsn, "--claim-lease-s", "3")
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)

        @worker.job("long")
        async def long(job):
            await asyncio.sleep(5)
            return job.attempt

        job_id = submit(live_store, "long")
        with running(worker):
            wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 30, "the job to succeed")
        st = live_store.status(job_id)
        assert (st.attempts, st.result) == (1, 1)
    finally:
        server.stop()


def test_jobs_that_end_as_their_heartbeat_goes_out_are_never_taken_for_lost(db_dsn, live_store, token, caplog):
    """Claims of 6 s: the first beat goes 3 s in, then one every 2 s. Jobs
    that end right then race their beat with their outcome (the beat may be
    written after the completion and refused for it): none is logged lost or
    dropped, every one succeeds once. (With claims any shorter, a beat
    answered late on a loaded Citus box lets a claim expire for real.)"""
    server = start_server(db_dsn, "--claim-lease-s", "6")
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=200, grace_s=5)

        @worker.job("racy")
        async def racy(job):
            await asyncio.sleep(job.payload["s"])
            return job.attempt

        ids = [submit(live_store, "racy", {"s": 3 + (i % 3) + (i % 7) * 0.002}) for i in range(150)]
        with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
            wait_until(lambda: all_in(live_store, ids, {"succeeded"}), 60, "every job to succeed")
            time.sleep(1.5)                                 # a beat still out would be answered by now
        events = {r.getMessage() for r in caplog.records}
        assert not events & {"claim_lost", "claim_expired", "job_dropped"}
        assert {live_store.status(i).attempts for i in ids} == {1}
    finally:
        server.stop()


class HeldBeats:
    """An outbox whose beats the test answers: each send is a future it resolves."""
    def __init__(self):
        self.sent: list[asyncio.Future] = []

    def send(self, kind, item, extend_s=None):
        self.sent.append(asyncio.get_running_loop().create_future())
        return self.sent[-1]


def test_a_beat_answered_as_the_handler_returns_is_the_last_one(caplog):
    """The handler returns just as its beat's answer comes in, in one turn of
    the loop: no other beat goes out for the job later (it would be refused,
    the job being finished, and read as a lost claim)."""
    from minutehand.protocol import OutcomeOut
    from minutehand.worker.heartbeats import Heartbeats
    from minutehand.worker.job import Job
    from minutehand.worker.runner import Running

    async def main():
        now = dt.datetime.now(dt.timezone.utc)
        job = Job(id=1, team="t", name="n", payload=None, attempt=1, max_attempts=3, idempotency_key=None,
                  due_at=now, run_at=now, claim_expires_at=now, claim_s=0.3)
        beats = Heartbeats("w")
        run = Running(job, HeldBeats(), deadline=time.monotonic() + 10)
        beats.watch(run)
        while not run.outbox.sent:
            await asyncio.sleep(0.01)
        run.outbox.sent[0].set_result(OutcomeOut(job_id=1, ok=True, state="running"))
        run.handler_done = True
        await asyncio.sleep(0.5)                        # more than a beat's period
        beats.close()
        return run

    with caplog.at_level("INFO", logger="minutehand.worker"):
        run = asyncio.run(main())
    assert len(run.outbox.sent) == 1 and run.lost is None
    assert "claim_lost" not in {r.getMessage() for r in caplog.records}


def test_beats_renew_claims_until_one_is_refused_or_the_deadline_passes(caplog):
    """Three jobs beaten by one timer: one renewed at every beat (its deadline
    moves on), one whose beat is refused (lost: claim_lost, no more beats),
    one whose beat is never answered (lost at its deadline: claim_expired)."""
    from minutehand.protocol import OutcomeOut
    from minutehand.worker.heartbeats import Heartbeats
    from minutehand.worker.job import Job
    from minutehand.worker.runner import Running

    class Beats:
        def __init__(self, answer):
            self.answer, self.sent = answer, 0

        def send(self, kind, item, extend_s=None):
            self.sent += 1
            fut = asyncio.get_running_loop().create_future()
            if self.answer is not None:
                asyncio.get_running_loop().call_soon(fut.set_result, self.answer)
            return fut

    async def main():
        now = dt.datetime.now(dt.timezone.utc)
        beats, runs = Heartbeats("w"), []
        for i, answer in enumerate([OutcomeOut(job_id=1, ok=True, state="running"),
                                    OutcomeOut(job_id=2, ok=False, state="scheduled", reason="stale lease token"),
                                    None]):
            job = Job(id=i + 1, team="t", name="n", payload=None, attempt=1, max_attempts=3,
                      idempotency_key=None, due_at=now, run_at=now, claim_expires_at=now, claim_s=0.3)
            runs.append(Running(job, Beats(answer), deadline=time.monotonic() + 0.27))
            beats.watch(runs[-1])
        await asyncio.sleep(1.0)
        beats.close()
        return runs

    with caplog.at_level("INFO", logger="minutehand.worker"):
        renewed, refused, unanswered = asyncio.run(main())
    assert renewed.lost is None and renewed.outbox.sent >= 5
    assert renewed.deadline > time.monotonic() - 0.2     # renewed a beat ago, not 0.27 s after the start
    assert refused.lost == "claim lost: stale lease token" and refused.outbox.sent == 1
    assert unanswered.lost.startswith("claim expired") and unanswered.outbox.sent == 1
    events = [(r.getMessage(), r.job_id) for r in caplog.records]
    assert sorted(events) == [("claim_expired", 3), ("claim_lost", 2)]


def test_a_beat_out_at_the_deadline_decides_by_its_answer(caplog):
    """Beats whose answers come after the deadline (an overloaded scheduler,
    or a second dispatcher after the first timed out): one accepted keeps the
    job's claim (its deadline counts from when the beat was sent); one that
    was not delivered loses the claim when that answer comes, not before."""
    from minutehand.protocol import OutcomeOut
    from minutehand.worker.heartbeats import Heartbeats
    from minutehand.worker.job import Job
    from minutehand.worker.runner import Running

    async def main():
        now = dt.datetime.now(dt.timezone.utc)
        beats, runs = Heartbeats("w"), []
        for i in range(2):
            job = Job(id=i + 1, team="t", name="n", payload=None, attempt=1, max_attempts=3,
                      idempotency_key=None, due_at=now, run_at=now, claim_expires_at=now, claim_s=0.6)
            runs.append(Running(job, HeldBeats(), deadline=time.monotonic() + 0.54))
            beats.watch(runs[-1])
        await asyncio.sleep(0.7)                        # each beat went out at 0.3 s; deadlines passed
        accepted, undelivered = runs
        assert [len(r.outbox.sent) for r in runs] == [1, 1] and accepted.lost is None and undelivered.lost is None
        accepted.outbox.sent[0].set_result(OutcomeOut(job_id=1, ok=True, state="running"))
        undelivered.outbox.sent[0].set_result(None)
        await asyncio.sleep(0)
        assert accepted.lost is None and accepted.deadline > time.monotonic()
        assert undelivered.lost.startswith("claim expired")
        beats.close()

    with caplog.at_level("INFO", logger="minutehand.worker"):
        asyncio.run(main())
    assert [(r.getMessage(), r.job_id) for r in caplog.records] == [("claim_expired", 2)]


def test_a_beat_answered_late_through_another_dispatcher_keeps_the_job(db_dsn, live_store, token, caplog):
    """Both dispatchers freeze (SIGSTOP) just before a job's beat: its request
    to the first times out, the one to the second waits until both go on,
    after the job's deadline on the worker's side and after its handler
    returned. The beat was accepted in time on the scheduler's side, so the
    result is reported, not dropped, and the job runs once."""
    servers = [Server(db_dsn, "--claim-lease-s", "12", name=name) for name in "ab"]
    try:
        worker = Worker(urls=[s.url for s in servers], token=token, wait_s=1, concurrency=1, grace_s=5)
        started = threading.Event()

        @worker.job("slow")
        def slow(job):
            started.set()
            time.sleep(11.2)        # first beat at 6 s, deadline here 11 s, claim until 12 s
            return "in time"

        job_id = submit(live_store, "slow")
        with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
            assert started.wait(30)
            t0 = time.monotonic()
            time.sleep(5)
            for s in servers:
                s.signal(signal.SIGSTOP)
            try:
                time.sleep(max(0.0, t0 + 11.4 - time.monotonic()))
            finally:
                for s in servers:
                    s.signal(signal.SIGCONT)
            wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 20, "the job to succeed")
        events = [r.getMessage() for r in caplog.records if getattr(r, "job_id", None) == job_id]
        assert "claim_expired" not in events and "job_dropped" not in events, events
        assert live_store.status(job_id).attempts == 1
        assert any(r.getMessage() == "dispatcher_unavailable" and r.reason == "sending outcomes"
                   for r in caplog.records)
    finally:
        for s in servers:
            s.stop()


def test_a_finished_job_is_not_kept_for_its_beat():
    """Jobs done long before their first beat (most are): their runs are let
    go at once, not held by the heartbeats until that beat's time (a worker
    doing thousands of short jobs a second would otherwise keep every payload
    of the last half claim period)."""
    import gc
    import weakref

    from minutehand.worker.heartbeats import Heartbeats
    from minutehand.worker.job import Job
    from minutehand.worker.runner import Running

    async def main():
        now = dt.datetime.now(dt.timezone.utc)
        beats, refs = Heartbeats("w"), []
        for i in range(5000):
            job = Job(id=i, team="t", name="n", payload={"big": "x" * 1000}, attempt=1, max_attempts=3,
                      idempotency_key=None, due_at=now, run_at=now, claim_expires_at=now, claim_s=60.0)
            run = Running(job, None, deadline=time.monotonic() + 60)
            beats.watch(run)
            beats.forget(run)
            refs.append(weakref.ref(run))
        del run
        gc.collect()
        assert not any(r() for r in refs)
        assert len(beats._due) <= 2500               # the spent entries are swept out as they pile up
        beats.close()

    asyncio.run(main())


def test_a_job_whose_claim_was_lost_is_not_reported(db_dsn, live_store, token, db, caplog):
    """The claim is taken from the running job (another token, as after an
    expiry and a new claim elsewhere): its start report or heartbeat is
    refused, the handler's result is dropped, the job is left to its
    current claimer."""
    server = start_server(db_dsn, "--claim-lease-s", "3")
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)
        finished = threading.Event()

        @worker.job("stolen")
        def stolen(job):
            # (a token made here: Citus refuses a volatile function in the SET of a distributed table)
            db.execute("UPDATE jobs SET lease_token = %s WHERE id = %s", (uuid.uuid4(), job.id))
            time.sleep(job.claim_s / 2 + 0.5)             # past the first heartbeat
            finished.set()
            return "should not be stored"

        job_id = submit(live_store, "stolen")
        with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
            assert finished.wait(20)
            wait_until(lambda: any(r.getMessage() == "job_dropped" for r in caplog.records), 5, "job_dropped")
        st = live_store.status(job_id)
        # Claimed, or running if the start report got in before the token changed
        # (it races the handler), or waiting again (scheduled, or retrying if it
        # had started) once the 3 s claim ran out (a Citus cluster on a busy box
        # is that slow); never finished by this worker.
        assert st.state in ("claimed", "running", "scheduled", "retrying") and st.result is None
        records = [r for r in caplog.records if getattr(r, "job_id", None) == job_id]
        assert "job_succeeded" not in [r.getMessage() for r in records]
        # Refused at its start report or at its first beat, whichever went first;
        # a job known lost is not beaten again.
        dropped = next(r for r in records if r.getMessage() == "job_dropped")
        assert dropped.reason.startswith(("start refused: ", "claim lost: ")), dropped.reason
        assert [r.getMessage() for r in records].count("claim_lost") <= 1
    finally:
        server.stop()


def test_a_job_past_its_claim_without_renewal_is_dropped(db_dsn, live_store, token, caplog):
    """The dispatcher is frozen (SIGSTOP) while the handler runs: no heartbeat
    gets through before the claim runs out, so the result is not reported."""
    server = start_server(db_dsn, "--claim-lease-s", "3")
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)
        started = threading.Event()

        @worker.job("frozen")
        def frozen(job):
            started.set()
            time.sleep(4)
            return "too late"

        job_id = submit(live_store, "frozen")
        with caplog.at_level("INFO", logger="minutehand.worker"), running(worker):
            assert started.wait(20)
            server.signal(signal.SIGSTOP)
            try:
                wait_until(lambda: any(r.getMessage() == "job_dropped" for r in caplog.records), 10, "job_dropped")
            finally:
                server.signal(signal.SIGCONT)
        events = [r.getMessage() for r in caplog.records if getattr(r, "job_id", None) == job_id]
        assert "claim_expired" in events and "job_succeeded" not in events
        assert live_store.status(job_id).result is None
    finally:
        server.stop()


# ---------------------------------------------------------------- exactly-once effects
def test_once_runs_fn_for_a_new_key_only(db):
    calls = []

    def effect(conn):
        calls.append(1)
        conn.execute("CREATE TABLE IF NOT EXISTS sent (n int)")
        conn.execute("INSERT INTO sent VALUES (1)")
        return {"message_id": 7}

    assert effects.once(db, "job-1:email", effect) == {"message_id": 7}
    assert effects.once(db, "job-1:email", effect) == {"message_id": 7}      # stored, not re-run
    assert len(calls) == 1
    assert db.execute("SELECT count(*) FROM sent").fetchone()[0] == 1
    effects.once(db, "job-2:email", effect)
    assert len(calls) == 2


def test_once_that_raises_leaves_no_key_and_no_effect(db):
    db.execute("CREATE TABLE sent (n int)")

    def broken(conn):
        conn.execute("INSERT INTO sent VALUES (1)")
        raise RuntimeError("smtp down")

    with pytest.raises(RuntimeError):
        effects.once(db, "k", broken)
    assert db.execute("SELECT count(*) FROM minutehand_effects").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM sent").fetchone()[0] == 0
    assert effects.once(db, "k", lambda c: "now it works") == "now it works"


def test_once_keys_older_than_a_day_count_as_absent(db):
    assert effects.once(db, "k", lambda c: 1) == 1
    db.execute("UPDATE minutehand_effects SET created_at = now() - interval '25 hours'")
    assert effects.once(db, "k", lambda c: 2) == 2
    assert effects.once(db, "k", lambda c: 3) == 2


def test_once_inside_a_transaction_commits_or_rolls_back_with_it(db_dsn):
    with psycopg.connect(db_dsn) as conn:                     # not autocommit: the caller's transaction
        conn.execute("SELECT 1")
        effects.once(conn, "rolled-back", lambda c: 1)
        conn.rollback()
        assert effects.once(conn, "rolled-back", lambda c: 2) == 2        # the key went with the rollback
        conn.commit()
        assert effects.once(conn, "rolled-back", lambda c: 3) == 2


def test_once_async(db_dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            async def fn(c):
                return {"n": 1}
            assert await effects.once_async(conn, "a", fn) == {"n": 1}
            assert await effects.once_async(conn, "a", fn) == {"n": 1}
            return (await (await conn.execute("SELECT count(*) FROM minutehand_effects")).fetchone())[0]
    assert asyncio.run(main()) == 1


KILLED_EFFECT = """
import sys, time, psycopg
from minutehand.worker import effects
def fn(conn):
    conn.execute("INSERT INTO sent VALUES (1)")
    print("inside", flush=True)
    time.sleep(60)
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    effects.once(conn, "job-9:charge", fn)
"""


def test_sigkill_inside_the_effect_leaves_neither_key_nor_effect(db_dsn, db):
    db.execute("CREATE TABLE sent (n int)")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_EFFECT, db_dsn], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "inside"
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in%'")
               .fetchone()[0] == 0, 10, "the killed session to end")
    assert db.execute("SELECT count(*) FROM sent").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM minutehand_effects").fetchone()[0] == 0
    effects.once(db, "job-9:charge", lambda c: c.execute("INSERT INTO sent VALUES (2)").rowcount)
    effects.once(db, "job-9:charge", lambda c: c.execute("INSERT INTO sent VALUES (3)").rowcount)
    assert db.execute("SELECT array_agg(n) FROM sent").fetchone()[0] == [2]


def test_job_once_does_the_effect_once_across_retries(server, live_store, token, db, db_dsn):
    """Attempt 1 does the effect then fails; attempt 2 gets the stored result."""
    db.execute("CREATE TABLE charges (id serial, cents int)")
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=1, grace_s=5)

    @worker.job("charge")
    def charge(job: Job):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            charge_id = job.once(conn, "charge", lambda c: c.execute(
                "INSERT INTO charges (cents) VALUES (%s) RETURNING id", (job.payload["cents"],)).fetchone()[0])
        if job.attempt == 1:
            raise ConnectionError("receipt service down")
        return {"charge": charge_id}

    job_id = submit(live_store, "charge", {"cents": 250}, idempotency_key="order-7", backoff_base_s=0.2)
    with running(worker):
        wait_until(lambda: all_in(live_store, [job_id], {"succeeded"}), 30, "the job to succeed")
    st = live_store.status(job_id)
    assert st.attempts == 2
    assert db.execute("SELECT count(*), min(id) FROM charges").fetchone() == (1, st.result["charge"])
    assert db.execute("SELECT key FROM minutehand_effects").fetchone()[0] == "order-7:charge"


# ---------------------------------------------------------------- `minutehand worker` and SIGTERM
drain_worker = Worker(wait_s=30)          # urls, token, concurrency, grace from flags


@drain_worker.job("sleep")
async def _sleep(job: Job):
    await asyncio.sleep(job.payload["s"])
    return job.payload["s"]


@drain_worker.job("sleep_sync")
def _sleep_sync(job: Job):
    time.sleep(job.payload["s"])
    return job.payload["s"]


def worker_process(server: Server, token: str, concurrency: int, grace_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minutehand.cli.main", "worker", "tests.test_worker:drain_worker",
         "--worker-urls", server.url, "--worker-token", token, "--log-level", "DEBUG",
         "--worker-concurrency", str(concurrency), "--worker-grace-s", str(grace_s)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def parse(line: str) -> dict:
    event = json.loads(line)
    assert {"ts", "level", "event"} <= event.keys(), event
    return event


def read_until(proc: subprocess.Popen, done: Callable[[list[dict]], bool], timeout_s: float = 30) -> list[dict]:
    """The worker's log events (JSON lines on stderr) until done(events) holds."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, events
        line = proc.stderr.readline()
        assert line, f"the worker exited: {events}"
        events.append(parse(line))
    return events


def started(ids) -> Callable[[list[dict]], bool]:
    return lambda events: set(ids) <= {e.get("job_id") for e in events if e["event"] == "job_started"}


def finish(proc: subprocess.Popen, events: list[dict]) -> list[dict]:
    """Wait for the worker to exit; every log event it wrote."""
    out, err = proc.communicate(timeout=30)
    events += [parse(line) for line in err.splitlines() if line.strip()]
    assert proc.returncode == 0, events
    return events


def test_sigterm_drains_a_worker_process(server, live_store, token):
    """Running jobs finish and are reported; jobs that arrive after SIGTERM are
    not run: the worker's waiting poll is answered at once (had the
    dispatcher already claimed jobs for it, they would be given back);
    nothing is left claimed for expiry; exit 0."""
    proc = worker_process(server, token, concurrency=4, grace_s=10)
    try:
        running_ids = [submit(live_store, "sleep", {"s": 2}), submit(live_store, "sleep_sync", {"s": 2})]
        events = read_until(proc, started(running_ids))
        time.sleep(0.3)                        # the worker's next long-poll (2 free slots) is in flight
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late_ids = [submit(live_store, "sleep", {"s": 0}) for _ in range(3)]
        events = finish(proc, events)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert states(live_store, running_ids) == {i: "succeeded" for i in running_ids}
    for i in late_ids:                          # given back (or never taken): due again, attempt not counted
        st = live_store.status(i)
        assert (st.state, st.attempts) == ("scheduled", 0), st
    released = {e["job_id"] for e in events if e["event"] == "job_released"}
    assert released <= set(late_ids)
    done = [e for e in events if e["event"] == "job_succeeded"]
    assert {e["job_id"] for e in done} == set(running_ids)
    for e in done:
        assert e["name"] in ("sleep", "sleep_sync") and e["attempt"] == 1 and e["duration_ms"] >= 2000
        assert e["worker"] and e["level"] == "info"
    assert [e["event"] for e in events][-1] == "worker_stopped"


def test_after_the_grace_period_running_jobs_are_failed_to_be_retried(server, live_store, token):
    """Failed (retryable) rather than left claimed: due again after their
    backoff, not after a whole claim period."""
    proc = worker_process(server, token, concurrency=1, grace_s=1)
    try:
        job_id = submit(live_store, "sleep_sync", {"s": 60})
        events = read_until(proc, started([job_id]))
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        events = finish(proc, events)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - t0 < 5
    assert [e["job_id"] for e in events if e["event"] == "job_abandoned"] == [job_id]
    status = live_store.status(job_id)
    assert status.state in ("retrying", "scheduled") and status.attempts == 1, status
    assert "grace period (1 s) ended" in status.last_error, status


def _poll(server: Server, token: str, worker: str, names: list[str] | None, wait_s: float,
          path: str = "/v1/worker/lease") -> dict:
    body = {"worker": worker} if path.endswith("/end") else \
        {"worker": worker, "capacity": 1, "names": names, "wait_s": wait_s}
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=wait_s + 30) as resp:
        return json.loads(resp.read())


def test_a_stopping_worker_has_its_waiting_polls_answered_at_once(server, live_store, token, caplog):
    """Polls of a minute: an idle worker's stop asks the dispatcher to answer
    its waiting poll now, so it stops within seconds (not its poll's 60 s,
    nor its grace period's 30) and abandons nothing; another worker's poll
    waits on and gets its job."""
    a = Worker(urls=[server.url], token=token, wait_s=60, concurrency=1, grace_s=30, worker_id="stopping-a")
    a.job("x")(lambda job: None)
    other = concurrent.futures.ThreadPoolExecutor(1)
    b_poll = other.submit(_poll, server, token, "waiting-b", ["y"], 60)
    with caplog.at_level("INFO", logger="minutehand.worker"):
        with running(a):
            time.sleep(1.5)                                # its first poll waits at the dispatcher
            stopping = time.monotonic()
        took = time.monotonic() - stopping
    assert took < 10, f"the stop took {took:.1f} s"
    assert not [r for r in caplog.records if r.getMessage() == "lease_abandoned"]
    assert not b_poll.done(), "another worker's poll was answered too"
    assert _poll(server, token, "nobody", None, 5, path="/v1/worker/lease/end") == {"ended": 0}
    job = submit(live_store, "y")
    assert [j["job_id"] for j in b_poll.result(60)["jobs"]] == [str(job)]
    other.shutdown()


def test_one_slot_and_two_dispatchers_serves_both(db_dsn, live_store, token, db):
    """With fewer slots than dispatchers, the slot goes round: jobs on either
    dispatcher's shards all run (one poll loop must not keep the slot)."""
    servers = [Server(db_dsn, name=name) for name in "cd"]
    try:
        wait_until(lambda: {o for (o,) in db.execute("SELECT DISTINCT owner FROM shards")} == {"c", "d"},
                   30, "the two dispatchers to split the shards")
        worker = Worker(urls=[s.url for s in servers], token=token, wait_s=1, concurrency=1, grace_s=5)
        worker.job("x")(lambda job: None)
        ids = [submit(live_store, "x") for _ in range(20)]
        owners = {o for (o,) in db.execute("SELECT DISTINCT owner FROM shards WHERE shard = ANY(%s)",
                                           ([i & 1023 for i in ids],))}
        assert owners == {"c", "d"}                  # jobs on both dispatchers' shards
        with running(worker):
            wait_until(lambda: all_in(live_store, ids, {"succeeded"}), 20, "every job to succeed")
    finally:
        for s in servers:
            s.stop()


# ---------------------------------------------------------------- a mass cancel
MASS_CANCEL = 10_000
# Rows on the wheel whose job does not wait (any more): what a claim by name would step over.
STALE_ROWS = """
    SELECT count(*) FROM (SELECT shard, job_id FROM due_minutes UNION ALL SELECT shard, job_id FROM due_hours
                          UNION ALL SELECT shard, job_id FROM due_far) w
     WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.shard = w.shard AND j.id = w.job_id
                                              AND j.state IN ('scheduled', 'retrying'))"""


def test_a_mass_cancel_does_not_hold_up_another_teams_named_worker(server, live_store, token, db):
    """Team A cancels its many due jobs, one call each, while a worker that
    names its handler (its claims filter by name) waits for team B's: B's
    jobs then start within seconds, and no row of a cancelled job is left on
    the wheel for the dispatcher to plan for or the sweep to carry."""
    for team in ("a", "b"):
        live_store.create_team(team)
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=10, grace_s=5)
    worker.job("b.job")(lambda job: "ok")
    with running(worker):
        cancelled = []
        for _ in range(0, MASS_CANCEL, 5000):
            cancelled += [it.job_id for it in live_store.submit_many("a", [JobSpec("a.job")] * 5000)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert all(pool.map(lambda job_id: live_store.cancel(job_id, "a").ok, cancelled, chunksize=1000))
        assert db.execute(STALE_ROWS).fetchone()[0] == 0
        b = [it.job_id for it in live_store.submit_many("b", [JobSpec("b.job")] * 100)]
        wait_until(lambda: all_in(live_store, b, {"succeeded"}), 20, "team B's jobs to run")
    assert db.execute(STALE_ROWS).fetchone()[0] == 0


# ---------------------------------------------------------------- a cancel racing a worker: the state says whether it ran
def effect_worker(server: Server, token: str, db_dsn: str, **kw) -> tuple[Worker, threading.Event]:
    """A worker whose handler commits a side effect (a `runs` row) at once,
    then waits for the event; its reports are held 3 s (flush_s), so a
    cancel can reach a claimed job before the worker's start report or
    give-back does."""
    worker = Worker(urls=[server.url], token=token, concurrency=1, grace_s=10, flush_s=3.0, **kw)
    gate = threading.Event()

    @worker.job("effect")
    def effect(job: Job):
        with psycopg.connect(db_dsn, autocommit=True) as c:
            c.execute("INSERT INTO runs (job_id, attempt) VALUES (%s, %s)", (job.id, job.attempt))
        gate.wait(20)
        return {"did": "it"}
    return worker, gate


def test_a_cancel_that_reaches_a_started_handler_leaves_the_job_saying_it_ran(server, live_store, token, db, db_dsn):
    """The handler has committed its side effect while its start report is
    still held: the cancel is only requested, the start arrives, and the job
    completes with its result. Succeeded, never cancelled."""
    db.execute(RUNS_DDL)
    worker, gate = effect_worker(server, token, db_dsn, wait_s=1)
    job_id = submit(live_store, "effect")
    with running(worker):
        wait_until(lambda: handler_runs(db, job_id) == 1, 20, "the side effect")
        out = live_store.cancel(job_id, "t")
        assert (out.ok, out.state) == (True, "claimed"), out          # its start not reported yet: requested
        gate.set()
        wait_until(lambda: live_store.status(job_id).state not in ("claimed", "running"), 20, "the job to end")
    st = live_store.status(job_id)
    assert (st.state, st.result, handler_runs(db, job_id)) == ("succeeded", {"did": "it"}, 1)
    assert st.cancel_requested_at is not None and st.started_at is not None


def test_a_cancel_that_reaches_a_job_its_worker_gives_back_unstarted_cancels_it(server, live_store, token, db, db_dsn,
                                                                                 monkeypatch):
    """The worker is stopping when the job reaches it: it gives the job back
    without running it (the give-back held 3 s), and the cancel that came in
    between takes effect. Cancelled, and no side effect."""
    # A stopping worker's waiting poll is answered at once; a job reaches a
    # stopping worker when that cannot be done: here, as from a dispatcher
    # older than the call, whose answer is 404.
    async def older_dispatcher(self, worker, timeout_s=5.0):
        raise Refused(404, "not found")
    monkeypatch.setattr(DispatcherClient, "end_polls", older_dispatcher)
    db.execute(RUNS_DDL)
    worker, gate = effect_worker(server, token, db_dsn, wait_s=10)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run_catching(worker, errors), daemon=True)
    thread.start()
    try:
        time.sleep(2.0)                              # its long-poll is out
        worker.stop()                                # no new leases: what the poll brings is given back
        job_id = submit(live_store, "effect")
        wait_until(lambda: live_store.status(job_id).state == "claimed", 20, "the job to reach the worker")
        out = live_store.cancel(job_id, "t")
        assert (out.ok, out.state) == (True, "claimed"), out
        wait_until(lambda: live_store.status(job_id).state != "claimed", 20, "the give-back")
    finally:
        gate.set()
        thread.join(30)
    assert not thread.is_alive() and not errors, errors
    st = live_store.status(job_id)
    assert (st.state, st.started_at, st.attempts, handler_runs(db, job_id)) == ("cancelled", None, 0, 0)


def _run_catching(worker: Worker, errors: list) -> None:
    try:
        worker.run()
    except BaseException as exc:                    # noqa: BLE001 - checked by the test
        errors.append(exc)
