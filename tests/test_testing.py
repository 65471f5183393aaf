"""minutehand.testing, used the way a team that writes workers would use it:
handlers run on jobs built in the test (no server), and jobs submitted to a
real database drained through a real dispatcher and the worker's real loop.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest

from minutehand import testing
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from minutehand.worker import Job, NonRetryable, Worker

pytest_plugins = ["minutehand.testing"]

UTC = dt.timezone.utc


# ---------------------------------------------------------------- the worker under test
def make_worker(**kw) -> Worker:
    """A worker as a team would write it: settings from the environment, so
    nothing here points at a server."""
    worker = Worker(**kw)
    calls: list[Job] = []
    worker.calls = calls

    @worker.job("emails.send")
    def send(job: Job):
        calls.append(job)
        if "to" not in job.payload:
            raise NonRetryable("no recipient")
        return {"sent_to": job.payload["to"], "thread": threading.current_thread().name}

    @worker.job("reports.build")
    async def build(job: Job):
        calls.append(job)
        await asyncio.sleep(0.01)
        return {"rows": job.payload["rows"] * 2}

    @worker.job("flaky")
    def flaky(job: Job):
        calls.append(job)
        if job.attempt < job.payload.get("succeed_on", 99):
            raise ConnectionError(f"attempt {job.attempt} failed")
        return "finally"

    @worker.job("export.huge")
    def huge(job: Job):
        calls.append(job)
        return "x" * (300 * 1024)

    @worker.job("slow")
    def slow(job: Job):
        time.sleep(job.payload["sleep_s"])
        return None

    return worker


@pytest.fixture
def worker() -> Worker:
    return make_worker()


# ---------------------------------------------------------------- run_job: one handler, no server
def test_a_sync_handler_runs_in_a_worker_thread_and_its_result_is_returned(worker):
    job = testing.make_job("emails.send", {"to": "a@b"}, team="billing", attempt=2, max_attempts=5)
    outcome = testing.run_job(worker, job)
    assert outcome.succeeded
    assert outcome.result["sent_to"] == "a@b"
    assert outcome.result["thread"].startswith("minutehand-handler")   # off the event loop, as in the loop
    seen = worker.calls[0]
    assert (seen.name, seen.team, seen.attempt, seen.max_attempts) == ("emails.send", "billing", 2, 5)


def test_an_async_handler_is_awaited(worker):
    assert testing.run_job(worker, testing.make_job("reports.build", {"rows": 21})) == testing.Succeeded({"rows": 42})


def test_run_job_async_from_async_code(worker):
    async def main():
        return await testing.run_job_async(worker, testing.make_job("reports.build", {"rows": 1}))
    assert asyncio.run(main()).result == {"rows": 2}


def test_the_payload_arrives_as_decoded_json():
    worker = Worker()
    worker.job("echo")(lambda job: job.payload)
    assert testing.run_job(worker, testing.make_job("echo", {"ids": (1, 2)})).result == {"ids": [1, 2]}
    with pytest.raises(TypeError, match="not JSON-able"):
        testing.make_job("echo", {"when": object()})


def test_non_retryable_fails_without_retry_and_other_exceptions_are_retryable(worker):
    assert testing.run_job(worker, testing.make_job("emails.send", {})) == \
        testing.Failed("NonRetryable: no recipient", retryable=False)
    outcome = testing.run_job(worker, testing.make_job("flaky", {"succeed_on": 3}, attempt=1))
    assert not outcome.succeeded
    assert (outcome.error, outcome.retryable) == ("ConnectionError: attempt 1 failed", True)
    assert testing.run_job(worker, testing.make_job("flaky", {"succeed_on": 3}, attempt=3)).result == "finally"


def test_results_the_scheduler_cannot_store_fail_the_job(worker):
    too_big = testing.run_job(worker, testing.make_job("export.huge"))
    assert not too_big.succeeded and not too_big.retryable and "over the limit" in too_big.error

    deep = Worker()
    nested: list = []
    for _ in range(70):
        nested = [nested]
    deep.job("deep")(lambda job: nested)
    deep.job("odd")(lambda job: {"at": object()})
    outcome = testing.run_job(deep, testing.make_job("deep"))
    assert not outcome.succeeded and not outcome.retryable and "nested" in outcome.error
    outcome = testing.run_job(deep, testing.make_job("odd"))
    assert not outcome.succeeded and "not JSON-able" in outcome.error


def test_a_job_name_without_a_handler_is_a_mistake_in_the_test(worker):
    with pytest.raises(LookupError, match="emails.sned"):
        testing.run_job(worker, testing.make_job("emails.sned", {"to": "a@b"}))


# ---------------------------------------------------------------- drain: a real dispatcher and worker loop
@pytest.fixture
def minutehand_database_url(db_dsn) -> str:
    """What a user's conftest provides: a migrated database for this test."""
    return db_dsn


@pytest.fixture
def live_store(db_dsn):
    """This module's own: a Store on the real clock with teams shop and other."""
    with Store(db_dsn) as s:
        s.create_team("shop")
        s.create_team("other")
        yield s


def submit(store: Store, name: str, payload=None, team: str = "shop", **kw) -> int:
    return store.submit(team, JobSpec(name=name, payload={} if payload is None else payload, **kw)).job_id


def test_drain_runs_every_due_job_through_the_worker_loop(worker, live_store, db_dsn):
    sent = submit(live_store, "emails.send", {"to": "a@b"})
    built = submit(live_store, "reports.build", {"rows": 5})
    no_recipient = submit(live_store, "emails.send", {})
    recovers = submit(live_store, "flaky", {"succeed_on": 2}, backoff_base_s=0.02, backoff_cap_s=0.05)
    gives_up = submit(live_store, "flaky", {}, max_attempts=3, backoff_base_s=0.02, backoff_cap_s=0.05)
    huge = submit(live_store, "export.huge")
    later = submit(live_store, "emails.send", {"to": "later"}, due_at=dt.datetime.now(UTC) + dt.timedelta(hours=1))
    not_ours = submit(live_store, "someone.else", {})

    drained = testing.drain(worker, db_dsn, timeout_s=60)

    assert drained.succeeded == sorted([sent, built, recovers])
    assert drained.dead == sorted([no_recipient, gives_up, huge])
    assert set(drained.jobs) == {sent, built, no_recipient, recovers, gives_up, huge}
    st = live_store.status
    assert st(sent).result["sent_to"] == "a@b" and st(built).result == {"rows": 10}
    assert (st(recovers).attempts, st(recovers).result) == (2, "finally")
    assert (st(gives_up).attempts, st(gives_up).last_error) == (3, "ConnectionError: attempt 3 failed")
    assert (st(no_recipient).attempts, st(no_recipient).last_error) == (1, "NonRetryable: no recipient")
    assert st(huge).attempts == 1 and "over the limit" in st(huge).last_error
    for left_alone in (later, not_ours):
        assert (st(left_alone).state, st(left_alone).attempts) == ("scheduled", 0)
    # the user's worker was copied, not repointed
    assert worker.urls is None and worker.token is None


def test_drain_without_retries_stops_at_a_retry_not_yet_due(worker, live_store, db_dsn):
    failing = submit(live_store, "flaky", {}, backoff_base_s=60)
    drained = testing.drain(worker, db_dsn, retries=False)
    assert drained.retrying == [failing]
    assert (live_store.status(failing).state, live_store.status(failing).attempts) == ("retrying", 1)


def test_a_drain_with_nothing_due_returns_at_once(worker, live_store, db_dsn):
    later = submit(live_store, "emails.send", {"to": "a@b"}, due_at=dt.datetime.now(UTC) + dt.timedelta(minutes=5))
    assert testing.drain(worker, db_dsn) == testing.Drained({})
    assert live_store.status(later).state == "scheduled"


def test_drain_keeps_to_the_teams_a_worker_names(live_store, db_dsn):
    worker = make_worker(teams=["shop"])
    ours = submit(live_store, "emails.send", {"to": "a@b"})
    theirs = submit(live_store, "emails.send", {"to": "c@d"}, team="other")
    assert testing.drain(worker, db_dsn).succeeded == [ours]
    assert live_store.status(theirs).state == "scheduled"


def test_the_fixture_drains_on_the_database_the_user_names(worker, live_store, minutehand_drain):
    first = submit(live_store, "emails.send", {"to": "a@b"})
    assert minutehand_drain(worker).succeeded == [first]
    # a second drain in the same test: the first one's dispatcher gave its shards up
    second = submit(live_store, "reports.build", {"rows": 1})
    assert minutehand_drain(worker).succeeded == [second]
    assert live_store.status(first).attempts == 1


def test_a_drain_that_does_not_settle_in_time_says_which_jobs_are_left(worker, live_store, db_dsn):
    stuck = submit(live_store, "slow", {"sleep_s": 3})
    with pytest.raises(testing.DrainTimeout) as caught:
        testing.drain(worker, db_dsn, timeout_s=1)
    assert caught.value.outstanding == [stuck]
    assert stuck in caught.value.drained.jobs


def test_a_worker_whose_loop_fails_fails_the_drain_at_once(live_store, db_dsn):
    worker = make_worker(concurrency=0)
    submit(live_store, "emails.send", {"to": "a@b"})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="loop failed") as caught:
        testing.drain(worker, db_dsn, timeout_s=30)
    assert "concurrency" in str(caught.value.__cause__)
    assert time.monotonic() - started < 15
