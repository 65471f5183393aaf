"""Retries against a real PostgreSQL, on a pinned clock (no sleeping):
exponential backoff with jitter and a cap, non-retryable failures, the
attempt limit, and claims that expire (returned, or dead at the last attempt).

The tests of this module share one clone of the migrated template, emptied
before each test (see test_submit.py for why)."""
from __future__ import annotations

import datetime as dt

import pytest

from minutehand.store.outcomes import Complete, Fail, Heartbeat, Start
from minutehand.store.submit import JobSpec
from tests.support import T0, claim as claim_shards, due_rows, json_text, make_store, minute_part, pin

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

S = dt.timedelta(seconds=1)
US = dt.timedelta(microseconds=1)






def claim(store, job_ids, lease_s: float = 30):
    shards = sorted({j & 1023 for j in job_ids})
    leases = store.take_leases(shards, "d1", 3600)
    assert set(leases) == set(shards)
    got = []
    while batch := claim_shards(store, leases, 100, "d1", lease_s).jobs:
        got += batch
    return got


def claim_job(store, job_id: int, lease_s: float = 30):
    got = [c for c in claim(store, [job_id], lease_s) if c.job_id == job_id]
    assert len(got) == 1, f"job {job_id} was not claimable at {store.clock}"
    return got[0]


def assert_backoff(gap: dt.timedelta, d: float) -> None:
    """A retry delay in [d/2, d] seconds."""
    assert dt.timedelta(seconds=d / 2) - US <= gap <= dt.timedelta(seconds=d) + US, (gap, d)


# ---------------------------------------------------------------- backoff
def test_fail_twice_then_succeed(pinned_conn, pinned_store):
    base = 2.0
    job_id = pinned_store.submit("t", JobSpec("flaky", max_attempts=3, backoff_base_s=base)).job_id
    gaps = []
    for attempt in (1, 2):
        c = claim_job(pinned_store, job_id)
        assert c.attempt == attempt
        failed_at = pinned_store.clock + S
        pinned_store.clock = failed_at
        [out] = pinned_store.fail([Fail(job_id, c.lease_token, f"error {attempt}", True)])
        assert (out.ok, out.state) == (True, "retrying")
        st = pinned_store.status(job_id)
        assert st.state == "retrying" and st.attempts == attempt and st.last_error == f"error {attempt}"
        assert st.claimed_by is None and st.claim_expires_at is None
        gap = st.run_at - failed_at
        assert_backoff(gap, base * 2 ** (attempt - 1))
        gaps.append(gap)
        # On the wheel at its retry time, and not claimable a moment before it.
        assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, st.run_at), st.run_at)]
        pinned_store.clock = st.run_at - dt.timedelta(milliseconds=1)
        assert claim(pinned_store, [job_id]) == []
        pinned_store.clock = st.run_at
    assert gaps[1] >= gaps[0]
    c = claim_job(pinned_store, job_id)
    assert c.attempt == 3
    [out] = pinned_store.complete([Complete(job_id, c.lease_token, json_text({"third": "time lucky"}))])
    assert (out.ok, out.state) == (True, "succeeded")
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.result) == ("succeeded", 3, {"third": "time lucky"})
    assert due_rows(pinned_conn, job_id) == []
    # The two attempts that failed are kept, each with its worker, times and
    # error (the job's record holds only the latest).
    ended = pinned_store.job_attempts(job_id)
    assert [(a.attempt, a.outcome, a.error, a.worker) for a in ended] == [
        (2, "retrying", "error 2", "d1"), (1, "retrying", "error 1", "d1")]
    assert all(a.claimed_at is not None and a.claimed_at < a.ended_at for a in ended)


def test_fail_via_sql_schedules_the_retry(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("sqlfail", backoff_base_s=8)).job_id
    c = claim_job(pinned_store, job_id)
    pin(pinned_conn, T0)
    r = pinned_conn.execute("SELECT * FROM fail(%s, %s, 'oops')", (job_id, c.lease_token)).fetchone()
    assert r == (job_id, True, "retrying", None)
    assert_backoff(pinned_store.status(job_id).run_at - T0, 8)


def test_jitter_spreads_retries_of_jobs_failing_together(pinned_conn, pinned_store):
    base = 60.0
    ids = [s.job_id for s in pinned_store.submit_many("t", [JobSpec(f"j{i}", backoff_base_s=base) for i in range(50)])]
    claimed = claim(pinned_store, ids)
    assert sorted(c.job_id for c in claimed) == sorted(ids)
    outs = pinned_store.fail([Fail(c.job_id, c.lease_token, "thundering herd", True) for c in claimed])
    assert all(o.ok and o.state == "retrying" for o in outs)
    run_ats = [pinned_store.status(i).run_at for i in ids]
    assert len(set(run_ats)) == 50
    for r in run_ats:
        assert_backoff(r - T0, base)
    assert max(run_ats) - min(run_ats) > 5 * S


def test_backoff_is_capped(pinned_conn, pinned_store):
    base, cap = 10.0, 15.0
    job_id = pinned_store.submit("t", JobSpec("capped", max_attempts=6, backoff_base_s=base, backoff_cap_s=cap)).job_id
    for attempt in range(1, 6):
        c = claim_job(pinned_store, job_id)
        assert c.attempt == attempt
        [out] = pinned_store.fail([Fail(job_id, c.lease_token, "again", True)])
        assert out.state == "retrying"
        st = pinned_store.status(job_id)
        gap = st.run_at - pinned_store.clock
        assert_backoff(gap, min(cap, base * 2 ** (attempt - 1)))
        assert gap <= dt.timedelta(seconds=cap)
        pinned_store.clock = st.run_at
    assert attempt == 5 and gap >= dt.timedelta(seconds=cap / 2) - US


def test_large_base_is_capped_from_the_first_attempt(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("big", backoff_base_s=7200, backoff_cap_s=7200)).job_id
    c = claim_job(pinned_store, job_id)
    pinned_store.fail([Fail(job_id, c.lease_token, "x", True)])
    st = pinned_store.status(job_id)
    assert_backoff(st.run_at - T0, 7200)
    # Over an hour ahead: waits on the wheel at its own run time.
    assert len(due_rows(pinned_conn, job_id)) == 1 and due_rows(pinned_conn, job_id)[0][1] == st.run_at


# ---------------------------------------------------------------- dead
def test_non_retryable_failure_is_dead_at_once(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("fatal", max_attempts=5)).job_id
    c = claim_job(pinned_store, job_id)
    pinned_store.clock = T0 + 3 * S
    [out] = pinned_store.fail([Fail(job_id, c.lease_token, "bad input", False)])
    assert (out.ok, out.state) == (True, "dead")
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.last_error, st.finished_at) == ("dead", 1, "bad input", T0 + 3 * S)
    assert due_rows(pinned_conn, job_id) == []
    pinned_store.clock = T0 + 3600 * S
    assert claim(pinned_store, [job_id]) == []


def test_last_attempt_failure_is_dead_with_its_error(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("twice", max_attempts=2)).job_id
    c = claim_job(pinned_store, job_id)
    assert pinned_store.fail([Fail(job_id, c.lease_token, "first", True)])[0].state == "retrying"
    pinned_store.clock = pinned_store.status(job_id).run_at
    c = claim_job(pinned_store, job_id)
    assert c.attempt == 2 and c.max_attempts == 2
    [out] = pinned_store.fail([Fail(job_id, c.lease_token, "second", True)])
    assert (out.ok, out.state) == (True, "dead")
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.last_error) == ("dead", 2, "second")
    assert st.finished_at == pinned_store.clock
    assert due_rows(pinned_conn, job_id) == []
    pinned_store.clock = pinned_store.clock + 3600 * S
    assert claim(pinned_store, [job_id]) == []


def test_single_attempt_job_is_dead_after_one_failure(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("once", max_attempts=1)).job_id
    c = claim_job(pinned_store, job_id)
    assert pinned_store.fail([Fail(job_id, c.lease_token, "nope", True)])[0].state == "dead"


# ---------------------------------------------------------------- expired claims
def test_expired_claim_returns_to_the_current_bucket(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("slow", max_attempts=3)).job_id
    shard = job_id & 1023
    c = claim_job(pinned_store, job_id, lease_s=30)
    assert c.claim_expires_at == T0 + 30 * S
    pinned_store.clock = T0 + 29 * S
    assert pinned_store.expire_claims([shard]) == (0, 0)
    assert pinned_store.status(job_id).state == "claimed"
    now = T0 + 95 * S                                       # in the next minute
    pinned_store.clock = now
    assert pinned_store.expire_claims([shard]) == (1, 0)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.claimed_by, st.claim_expires_at) == ("scheduled", 1, None, None)
    assert "expired" in st.last_error
    assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, now), now)]
    assert pinned_store.expire_claims([shard]) == (0, 0)  # once only
    c2 = claim_job(pinned_store, job_id)
    assert c2.attempt == 2 and c2.lease_token != c.lease_token
    assert due_rows(pinned_conn, job_id) == []


def test_expired_running_job_returns_too(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("hung")).job_id
    c = claim_job(pinned_store, job_id, lease_s=10)
    assert pinned_store.start([Start(job_id, c.lease_token)])[0].ok
    pinned_store.clock = T0 + 11 * S
    pin(pinned_conn, pinned_store.clock)
    assert pinned_conn.execute("SELECT returned, dead FROM expire_claims(%s)", (job_id & 1023,)).fetchone() == (1, 0)
    assert pinned_store.status(job_id).state == "scheduled"
    assert claim_job(pinned_store, job_id).attempt == 2


def test_expired_claim_at_the_last_attempt_is_dead(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("killer", max_attempts=2)).job_id
    shard = job_id & 1023
    claim_job(pinned_store, job_id, lease_s=30)
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([shard]) == (1, 0)
    c = claim_job(pinned_store, job_id, lease_s=30)
    assert c.attempt == 2
    pinned_store.clock = T0 + 62 * S
    assert pinned_store.expire_claims([shard]) == (0, 1)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.finished_at) == ("dead", 2, T0 + 62 * S)
    assert "expired" in st.last_error
    ended = pinned_store.job_attempts(job_id)
    assert [(a.attempt, a.outcome, a.ended_at, a.worker) for a in ended] == [
        (2, "dead", T0 + 62 * S, None), (1, "scheduled", T0 + 31 * S, None)]
    assert all("claim expired on attempt" in a.error and a.claimed_at is not None for a in ended)
    assert due_rows(pinned_conn, job_id) == []
    pinned_store.clock = T0 + 3600 * S
    assert claim(pinned_store, [job_id]) == []


def test_completed_claim_is_not_expired(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("quick")).job_id
    c = claim_job(pinned_store, job_id, lease_s=30)
    assert pinned_store.complete([Complete(job_id, c.lease_token, None)])[0].ok
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (0, 0)
    assert pinned_store.status(job_id).state == "succeeded"



def test_claim_shortened_by_a_heartbeat_is_returned_once_it_expires(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("short-beat")).job_id
    c = claim_job(pinned_store, job_id, lease_s=300)
    pinned_store.clock = T0 + 5 * S
    assert pinned_store.heartbeat([Heartbeat(job_id, c.lease_token)], 10)[0].ok
    expires = pinned_store.status(job_id).claim_expires_at
    pinned_store.clock = expires + S                           # the claim, as recorded, has expired
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    assert pinned_store.status(job_id).state == "scheduled"

# ---------------------------------------------------------------- the pinned clock itself
def test_advancing_the_store_clock_moves_every_pooled_session(pinned_conn, pinned_store):
    with pinned_store.connection() as a, pinned_store.connection() as b:  # two sessions of the pool
        assert a.execute("SELECT mh_now() AS t").fetchone()["t"] == T0
        assert b.execute("SELECT mh_now() AS t").fetchone()["t"] == T0
    pinned_store.clock = T0 + 3600 * S
    with pinned_store.connection() as a, pinned_store.connection() as b:
        assert a.execute("SELECT mh_now() AS t").fetchone()["t"] == T0 + 3600 * S
        assert b.execute("SELECT mh_now() AS t").fetchone()["t"] == T0 + 3600 * S


def test_unpinning_the_store_clock_returns_to_the_wall_clock(db_dsn):
    s = make_store(db_dsn, clock=T0, max_size=1)
    try:
        with s.connection() as c:
            assert c.execute("SELECT mh_now() AS t").fetchone()["t"] == T0
        s.clock = None
        with s.connection() as c:
            now = c.execute("SELECT mh_now() AS t, clock_timestamp() AS wall").fetchone()
        assert abs(now["t"] - now["wall"]) < dt.timedelta(minutes=1)
    finally:
        s.close()
