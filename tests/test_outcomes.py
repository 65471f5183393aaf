"""Outcomes of claimed jobs against a real PostgreSQL: start, heartbeat,
complete and fail (single SQL forms, batch SQL forms, and the Store), with
the lease token of the current claim; release (only of a job not started);
keyed results recorded whatever the claim, and replayed; cancellation
(requested of a claimed job); the status read.

A refused outcome must change nothing: the whole job row (to_jsonb) and the
row counts of every table are compared before and after.

The tests of this module share one clone of the migrated template, emptied
before each test (see test_submit.py for why)."""
from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.store.claim import ClaimRequest
from minutehand.store.errors import InvalidInput
from minutehand.store.outcomes import Complete, Fail, Heartbeat, Record, Recorded, Release, Start
from minutehand.store.records import Outcome
from minutehand.store.submit import JobSpec
from tests.support import T0, claim as claim_shards, counts, json_text, pin

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

S = dt.timedelta(seconds=1)
H = dt.timedelta(hours=1)
MISMATCH = "lease token does not match"


def row(conn: psycopg.Connection, job_id: int) -> dict | None:
    r = conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()
    return r[0] if r else None


def snapshot(conn: psycopg.Connection, job_id: int) -> tuple:
    return row(conn, job_id), counts(conn)


def ts(v: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(v) if v else None


def due_count(conn: psycopg.Connection, job_id: int) -> int:
    return conn.execute("""SELECT (SELECT count(*) FROM due_minutes WHERE job_id = %(id)s)
                                + (SELECT count(*) FROM due_hours WHERE job_id = %(id)s)
                                + (SELECT count(*) FROM due_far WHERE job_id = %(id)s)""",
                        {"id": job_id}).fetchone()[0]


def claim(store, job_ids=None, lease_s: float = 30, shards=None):
    """Lease the shards (of job_ids, or all) at the store's clock and claim what is due there."""
    shards = sorted({j & 1023 for j in job_ids}) if shards is None else shards
    leases = store.take_leases(shards, "d1", 3600)
    assert set(leases) == set(shards)
    return claim_shards(store, leases, 100, "d1", lease_s).jobs


def claim_job(store, job_id: int, lease_s: float = 30):
    got = [c for c in claim(store, [job_id], lease_s) if c.job_id == job_id]
    assert len(got) == 1, f"job {job_id} was not claimable"
    return got[0]


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def job(pinned_store):
    """A job due 10 s before T0, claimed at T0 with a 30 s lease: (job_id, lease_token)."""
    sub = pinned_store.submit("t", JobSpec("work", due_at=T0 - 10 * S, payload={"n": 1}))
    c = claim_job(pinned_store, sub.job_id)
    return sub.job_id, c.lease_token


# The four outcome calls, by the Store and by the single-job SQL forms; each
# returns an Outcome.
def via_store(store, conn, op: str, job_id: int, token, **kw) -> Outcome:
    if op == "start":
        return store.start([Start(job_id, token)])[0]
    if op == "heartbeat":
        return store.heartbeat([Heartbeat(job_id, token)], kw.get("extend_s", 60))[0]
    if op == "complete":
        return store.complete([Complete(job_id, token, json_text(kw.get("result", {"r": 1})))])[0]
    return store.fail([Fail(job_id, token, kw.get("error", "boom"), kw.get("retryable", True))])[0]


def via_sql(store, conn, op: str, job_id: int, token, **kw) -> Outcome:
    pin(conn, store.clock)
    sql = {"start": "SELECT * FROM start(%s, %s)",
           "heartbeat": "SELECT * FROM heartbeat(%s, %s, %s::real)",
           "complete": "SELECT * FROM complete(%s, %s, %s)",
           "fail": "SELECT * FROM fail(%s, %s, %s, %s)"}[op]
    args = {"start": (), "heartbeat": (kw.get("extend_s", 60),),
            "complete": (Jsonb(kw.get("result", {"r": 1})),),
            "fail": (kw.get("error", "boom"), kw.get("retryable", True))}[op]
    r = conn.execute(sql, (job_id, token, *args)).fetchone()
    return Outcome(*r)


@pytest.fixture(params=["store", "sql"])
def do(request, pinned_store, pinned_conn):
    fn = via_store if request.param == "store" else via_sql
    return lambda op, job_id, token, **kw: fn(pinned_store, pinned_conn, op, job_id, token, **kw)


OPS = ["start", "heartbeat", "complete", "fail"]


# ---------------------------------------------------------------- success
def test_start_then_complete_closes_the_job(pinned_conn, pinned_store, job, do):
    job_id, token = job
    pinned_store.clock = T0 + 5 * S
    assert do("start", job_id, token) == Outcome(job_id, True, "running", None)
    r = row(pinned_conn, job_id)
    assert r["state"] == "running" and ts(r["started_at"]) == T0 + 5 * S
    pinned_store.clock = T0 + 20 * S
    assert do("complete", job_id, token, result={"answer": 42}) == Outcome(job_id, True, "succeeded", None)
    r = row(pinned_conn, job_id)
    assert r["state"] == "succeeded"
    assert r["result"] == {"answer": 42}
    assert r["lease_token"] is None and r["claim_expires_at"] is None
    assert ts(r["finished_at"]) == T0 + 20 * S
    assert ts(r["started_at"]) == T0 + 5 * S
    assert r["lateness"] is not None
    # submitted at T0 past its due time: agreed to run at T0, started 5 s later
    assert pinned_conn.execute("SELECT lateness FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == 5 * S
    assert r["attempts"] == 1
    assert due_count(pinned_conn, job_id) == 0
    st = pinned_store.status(job_id)
    assert (st.state, st.result, st.lateness, st.attempts) == ("succeeded", {"answer": 42}, 5 * S, 1)
    assert st.due_at == T0 - 10 * S and st.agreed_at == T0 and st.lateness_final


def test_complete_without_start_records_lateness_from_the_claim(pinned_conn, pinned_store, job, do):
    job_id, token = job
    pinned_store.clock = T0 + 7 * S
    assert do("complete", job_id, token).ok
    st = pinned_store.status(job_id)
    assert st.state == "succeeded"
    assert st.lateness == 0 * S                  # claimed at T0, the time agreed at submission
    assert st.started_at == T0 and st.finished_at == T0 + 7 * S


def test_batch_forms_answer_per_item_in_order(pinned_conn, pinned_store):
    subs = [pinned_store.submit("t", JobSpec(f"b{i}")) for i in range(4)]
    ids = [s.job_id for s in subs]
    claimed = {c.job_id: c.lease_token for c in claim(pinned_store, ids)}
    assert set(claimed) == set(ids)
    unknown = (ids[0] & ~1023) ^ (1 << 40)            # same shard, no such job
    before_1 = row(pinned_conn, ids[1])

    started = pinned_store.start([Start(ids[0], claimed[ids[0]]), Start(ids[1], uuid.uuid4()), Start(unknown, uuid.uuid4()),
                           Start(ids[2], claimed[ids[2]]), Start(ids[3], claimed[ids[3]])])
    assert [(o.job_id, o.ok, o.state) for o in started] == [
        (ids[0], True, "running"), (ids[1], False, "claimed"), (unknown, False, None),
        (ids[2], True, "running"), (ids[3], True, "running")]
    assert MISMATCH in started[1].reason and started[2].reason == "no such job"
    assert row(pinned_conn, ids[1]) == before_1

    pinned_store.clock = T0 + 10 * S
    beats = pinned_store.heartbeat([Heartbeat(ids[0], claimed[ids[0]]), Heartbeat(ids[1], claimed[ids[1]]), Heartbeat(ids[2], uuid.uuid4())], 120)
    assert [(o.ok, o.state) for o in beats] == [(True, "running"), (True, "claimed"), (False, "running")]
    assert pinned_store.status(ids[0]).claim_expires_at == T0 + 130 * S
    assert pinned_store.status(ids[1]).claim_expires_at == T0 + 130 * S
    assert pinned_store.status(ids[2]).claim_expires_at == T0 + 30 * S

    done = pinned_store.complete([Complete(ids[0], claimed[ids[0]], json_text({"i": 0})), Complete(ids[1], uuid.uuid4(), json_text({"i": 1})),
                           Complete(ids[2], claimed[ids[2]], None)])
    assert [(o.ok, o.state) for o in done] == [(True, "succeeded"), (False, "claimed"), (True, "succeeded")]
    assert pinned_store.status(ids[0]).result == {"i": 0} and pinned_store.status(ids[2]).result is None

    failed = pinned_store.fail([Fail(ids[3], claimed[ids[3]], "e3", False), Fail(ids[0], claimed[ids[0]], "late", True),
                         Fail(ids[1], claimed[ids[1]], "e1", True)])
    assert [(o.ok, o.state) for o in failed] == [(True, "dead"), (False, "succeeded"), (True, "retrying")]
    assert "not claimed" in failed[1].reason
    assert pinned_store.status(ids[0]).state == "succeeded"


def test_batch_sql_forms(pinned_conn, pinned_store):
    ids = [pinned_store.submit("t", JobSpec(f"s{i}")).job_id for i in range(3)]
    tok = {c.job_id: c.lease_token for c in claim(pinned_store, ids)}
    pin(pinned_conn, T0)
    rows = pinned_conn.execute("SELECT * FROM complete_many(%s, %s, %s)",
                        (ids, [tok[i] for i in ids], [Jsonb({"k": i}) for i in range(3)])).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(i, True, "succeeded") for i in ids]
    assert [pinned_store.status(i).result for i in ids] == [{"k": 0}, {"k": 1}, {"k": 2}]


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("op", OPS)
def test_wrong_token_changes_nothing(pinned_conn, pinned_store, job, do, op):
    job_id, _ = job
    before = snapshot(pinned_conn, job_id)
    out = do(op, job_id, uuid.uuid4())
    assert (out.job_id, out.ok, out.state) == (job_id, False, "claimed")
    assert MISMATCH in out.reason
    assert snapshot(pinned_conn, job_id) == before


@pytest.mark.parametrize("op", OPS)
def test_stale_token_after_expiry_and_reclaim_changes_nothing(pinned_conn, pinned_store, job, do, op):
    job_id, old_token = job
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    new = claim_job(pinned_store, job_id)
    assert new.attempt == 2 and new.lease_token != old_token
    before = snapshot(pinned_conn, job_id)
    out = do(op, job_id, old_token)
    assert (out.ok, out.state) == (False, "claimed")
    assert MISMATCH in out.reason
    assert snapshot(pinned_conn, job_id) == before
    # The current holder is unaffected.
    assert do(op, job_id, new.lease_token).ok


@pytest.mark.parametrize("op", OPS)
def test_stale_token_after_expiry_before_reclaim_changes_nothing(pinned_conn, pinned_store, job, do, op):
    job_id, old_token = job
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    before = snapshot(pinned_conn, job_id)
    out = do(op, job_id, old_token)
    assert (out.ok, out.state) == (False, "scheduled")
    assert "not claimed" in out.reason
    assert snapshot(pinned_conn, job_id) == before


@pytest.mark.parametrize("op", OPS)
def test_unknown_job_changes_nothing(pinned_conn, pinned_store, job, do, op):
    job_id, token = job
    before = snapshot(pinned_conn, job_id)
    for unknown in (job_id + (1 << 30), 0, 123456789):
        out = do(op, unknown, token)
        assert out == Outcome(unknown, False, None, "no such job")
    assert snapshot(pinned_conn, job_id) == before


@pytest.mark.parametrize("op", OPS)
def test_outcome_after_completion_changes_nothing(pinned_conn, pinned_store, job, do, op):
    job_id, token = job
    assert do("complete", job_id, token, result={"first": True}).ok
    pinned_store.clock = T0 + 60 * S
    before = snapshot(pinned_conn, job_id)
    out = do(op, job_id, token, result={"second": True})
    assert (out.ok, out.state) == (False, "succeeded")
    assert "not claimed" in out.reason
    assert snapshot(pinned_conn, job_id) == before
    assert pinned_store.status(job_id).result == {"first": True}


def test_duplicate_item_with_wrong_token_in_one_batch_is_refused(pinned_conn, pinned_store, job):
    job_id, token = job
    out = pinned_store.complete([Complete(job_id, token, json_text({"good": 1})), Complete(job_id, uuid.uuid4(), json_text({"bad": 1}))])
    assert out[0].ok is True
    assert out[1].ok is False and MISMATCH in (out[1].reason or "")


# ---------------------------------------------------------------- release
STARTED = "job has started: only a job whose start was not reported can be released"


def test_release_gives_back_a_claimed_job_with_its_attempt_not_counted(pinned_conn, pinned_store, job):
    job_id, token = job
    assert pinned_store.release([Release(job_id, token)]) == [Outcome(job_id, True, "scheduled", None)]
    r = row(pinned_conn, job_id)
    assert (r["state"], r["attempts"], r["lease_token"], r["claimed_at"]) == ("scheduled", 0, None, None)
    assert claim_job(pinned_store, job_id).attempt == 1


def test_release_of_a_started_job_is_refused_with_its_own_reason_and_changes_nothing(pinned_conn, pinned_store):
    ids = [pinned_store.submit("t", JobSpec(f"r{i}")).job_id for i in range(2)]
    tok = {c.job_id: c.lease_token for c in claim(pinned_store, ids)}
    started, waiting = ids
    assert pinned_store.start([Start(started, tok[started])])[0].ok
    before = snapshot(pinned_conn, started)
    out = pinned_store.release([Release(started, tok[started]), Release(waiting, tok[waiting]),
                                Release(started, uuid.uuid4())])
    assert [(o.ok, o.state) for o in out] == [(False, "running"), (True, "scheduled"), (False, "running")]
    assert out[0].reason.startswith(STARTED)
    assert MISMATCH in out[2].reason                   # another token is still a stale token
    assert row(pinned_conn, started) == before[0]
    assert row(pinned_conn, started)["attempts"] == 1


def test_a_worker_that_starts_and_gives_back_a_job_again_and_again_cannot_keep_it_alive(pinned_conn, pinned_store):
    """Lease, start, release: refused, so each attempt counts when its claim
    expires, and the job is dead after its last instead of running forever."""
    job_id = pinned_store.submit("t", JobSpec("loop", max_attempts=2)).job_id
    offered = []
    for _ in range(4):
        got = [c for c in claim(pinned_store, [job_id]) if c.job_id == job_id]
        if not got:
            break
        offered.append(got[0].attempt)
        assert pinned_store.start([Start(job_id, got[0].lease_token)])[0].ok
        assert not pinned_store.release([Release(job_id, got[0].lease_token)])[0].ok
        pinned_store.clock += 31 * S
        pinned_store.expire_claims([job_id & 1023])
    assert offered == [1, 2]
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts) == ("dead", 2)


# ---------------------------------------------------------------- heartbeat
def test_heartbeat_extends_the_claim(pinned_conn, pinned_store, job, do):
    job_id, token = job
    assert pinned_store.status(job_id).claim_expires_at == T0 + 30 * S
    pinned_store.clock = T0 + 20 * S
    assert do("heartbeat", job_id, token, extend_s=60) == Outcome(job_id, True, "claimed", None)
    assert pinned_store.status(job_id).claim_expires_at == T0 + 80 * S
    assert do("start", job_id, token).ok
    assert do("heartbeat", job_id, token, extend_s=90) == Outcome(job_id, True, "running", None)
    assert pinned_store.status(job_id).claim_expires_at == T0 + 110 * S
    # Past the first expiry the extended claim holds; past the extension it expires.
    pinned_store.clock = T0 + 60 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (0, 0)
    assert pinned_store.status(job_id).state == "running"
    pinned_store.clock = T0 + 111 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    assert pinned_store.status(job_id).state == "scheduled"


@pytest.mark.parametrize("extend_s", [0, 0.5, -5, 86401])
def test_heartbeat_extension_out_of_range_is_invalid(pinned_conn, pinned_store, job, extend_s):
    job_id, token = job
    before = snapshot(pinned_conn, job_id)
    with pytest.raises(InvalidInput) as err:
        pinned_store.heartbeat([Heartbeat(job_id, token)], extend_s)
    assert err.value.status == 400 and "extension" in err.value.message
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute("SELECT heartbeat(%s, %s, %s::real)", (job_id, token, extend_s))
    assert err.value.sqlstate == "MH400"
    assert snapshot(pinned_conn, job_id) == before


# ---------------------------------------------------------------- cancel
def test_cancel_a_scheduled_job(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("c")).job_id
    out = pinned_store.cancel(job_id, "t")
    assert out == Outcome(job_id, True, "cancelled", None)
    st = pinned_store.status(job_id)
    assert st.state == "cancelled" and st.finished_at == T0 and st.attempts == 0
    assert due_count(pinned_conn, job_id) == 0        # its row went with it
    assert claim(pinned_store, [job_id]) == []
    pinned_store.clock = T0 + 10 * 60 * S
    assert claim(pinned_store, [job_id]) == []
    assert pinned_store.status(job_id).state == "cancelled"


def test_cancelled_job_does_not_block_others_in_its_bucket(pinned_conn, pinned_store):
    a = pinned_store.submit("t", JobSpec("a", priority=100)).job_id
    assert pinned_store.cancel(a, "t").ok
    # Another job on the same shard, claimed with limit 1.
    for _ in range(2000):
        b = pinned_store.submit("t", JobSpec("b")).job_id
        if b & 1023 == a & 1023:
            break
    else:
        pytest.skip("no second job on the same shard")
    leases = pinned_store.take_leases([a & 1023], "d1", 3600)
    got = []
    for _ in range(3):
        got += claim_shards(pinned_store, leases, 1, "d1", 30).jobs
    assert b in [c.job_id for c in got] and a not in [c.job_id for c in got]


def test_cancelled_jobs_are_not_counted_as_due(pinned_conn, pinned_store):
    """What the dispatcher plans from (due_edges) counts the waiting jobs only."""
    ids = [it.job_id for it in pinned_store.submit_many("t", [JobSpec("c")] * 20)]
    shards = list(range(256))

    def due() -> int:
        return pinned_conn.execute("SELECT coalesce(sum(due), 0) FROM due_edges(%s, %s)",
                                   (shards, [None] * len(shards))).fetchone()[0]
    assert due() == 20
    for job_id in ids[:15]:
        assert pinned_store.cancel(job_id, "t").ok
    assert due() == 5


def test_cancel_a_future_job(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("f", due_at=T0 + 30 * H)).job_id
    assert pinned_store.cancel(job_id, "t").ok
    assert pinned_store.status(job_id).state == "cancelled"
    assert due_count(pinned_conn, job_id) == 0


def running_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT coalesce(sum(running), 0) FROM team_running").fetchone()[0]


def cancelled_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT coalesce(sum(cancelled), 0) FROM team_stats").fetchone()[0]


def test_a_cancel_of_a_claimed_job_is_requested_and_changes_nothing_else(pinned_conn, pinned_store, job):
    """Claimed is not known to be unstarted (the worker reports its start in
    a batch, after the handler began): the cancel is requested, the claim
    stays the worker's. Asking again keeps the first request's time."""
    job_id, token = job
    out = pinned_store.cancel(job_id, "t")
    assert (out.job_id, out.ok, out.state) == (job_id, True, "claimed") and "cancel requested" in out.reason
    st = pinned_store.status(job_id)
    assert (st.state, st.cancel_requested_at, st.finished_at) == ("claimed", T0, None)
    assert row(pinned_conn, job_id)["lease_token"] == str(token) and running_count(pinned_conn) == 1
    assert cancelled_count(pinned_conn) == 0
    pinned_store.clock = T0 + 5 * S
    assert pinned_store.cancel(job_id, "t").ok
    assert pinned_store.status(job_id).cancel_requested_at == T0


@pytest.mark.parametrize("answer", ["start then complete", "complete", "fail", "start then expiry"])
def test_a_job_whose_worker_reports_it_ran_is_never_cancelled(pinned_conn, pinned_store, job, answer):
    """The request came too late: the job runs on and ends as it ends, its
    result or error kept, the request on record."""
    job_id, token = job
    assert pinned_store.cancel(job_id, "t").state == "claimed"
    if answer.startswith("start"):
        assert pinned_store.start([Start(job_id, token)])[0] == Outcome(job_id, True, "running", None)
    if answer.endswith("complete"):
        assert pinned_store.complete([Complete(job_id, token, json_text({"did": "it"}))])[0].state == "succeeded"
    elif answer == "fail":
        assert pinned_store.fail([Fail(job_id, token, "half done", True)])[0].state == "retrying"
    else:
        pinned_store.clock = T0 + 31 * S
        assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)        # due again: it may not have finished
    st = pinned_store.status(job_id)
    want = {"start then complete": "succeeded", "complete": "succeeded", "fail": "retrying",
            "start then expiry": "scheduled"}[answer]
    assert (st.state, st.cancel_requested_at) == (want, T0)
    assert st.started_at == (None if answer == "fail" else T0) and (answer != "fail" or st.last_error == "half done")
    assert st.result == ({"did": "it"} if want == "succeeded" else None)
    assert cancelled_count(pinned_conn) == 0 and running_count(pinned_conn) == 0
    if want != "succeeded":
        # The request was answered by the claim it reached: a later claim given back is due again.
        pinned_store.clock = st.run_at + S
        again = claim_job(pinned_store, job_id)
        assert pinned_store.release([Release(job_id, again.lease_token)])[0].state in ("scheduled", "retrying")


def test_a_requested_cancel_takes_effect_when_the_worker_gives_the_job_back(pinned_conn, pinned_store, job):
    job_id, token = job
    assert pinned_store.cancel(job_id, "t").state == "claimed"
    pinned_store.clock = T0 + 2 * S
    assert pinned_store.release([Release(job_id, token)])[0] == Outcome(job_id, True, "cancelled", None)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.finished_at, st.started_at) == ("cancelled", 0, T0 + 2 * S, None)
    assert due_count(pinned_conn, job_id) == 0 and running_count(pinned_conn) == 0
    assert cancelled_count(pinned_conn) == 1
    for report in (pinned_store.start([Start(job_id, token)]), pinned_store.complete([Complete(job_id, token, None)])):
        assert (report[0].ok, report[0].state) == (False, "cancelled")


def test_a_requested_cancel_takes_effect_when_the_claim_expires_without_a_start(pinned_conn, pinned_store, job):
    """Its worker never said it began (it died, or its reports were lost):
    cancelled, and its error says the worker may have begun it."""
    job_id, token = job
    assert pinned_store.cancel(job_id, "t").state == "claimed"
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (0, 0)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.finished_at) == ("cancelled", 1, T0 + 31 * S)
    assert "cancelled, as requested" in st.last_error and "may have begun" in st.last_error
    assert due_count(pinned_conn, job_id) == 0 and running_count(pinned_conn) == 0
    assert cancelled_count(pinned_conn) == 1
    assert pinned_conn.execute("SELECT outcome::text FROM job_attempts WHERE job_id = %s",
                               (job_id,)).fetchall() == [("cancelled",)]
    assert (pinned_store.complete([Complete(job_id, token, None)])[0].ok, pinned_store.status(job_id).state) == (
        False, "cancelled")


@pytest.mark.parametrize("state", ["running", "succeeded", "dead", "cancelled"])
def test_cancel_refuses_a_job_that_started_or_ended(pinned_conn, pinned_store, job, state):
    job_id, token = job
    if state == "running":
        assert pinned_store.start([Start(job_id, token)])[0].ok
    elif state == "succeeded":
        assert pinned_store.complete([Complete(job_id, token, None)])[0].ok
    elif state == "dead":
        assert pinned_store.fail([Fail(job_id, token, "fatal", False)])[0].state == "dead"
    elif state == "cancelled":
        pinned_store.clock = T0 + 31 * S
        pinned_store.expire_claims([job_id & 1023])
        assert pinned_store.cancel(job_id, "t").ok
    assert pinned_store.status(job_id).state == state
    before = snapshot(pinned_conn, job_id)
    out = pinned_store.cancel(job_id, "t")
    assert (out.job_id, out.ok, out.state) == (job_id, False, state)
    assert state in out.reason
    assert snapshot(pinned_conn, job_id) == before


def test_cancel_another_teams_job_is_no_such_job(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("mine")).job_id
    before = snapshot(pinned_conn, job_id)
    assert pinned_store.cancel(job_id, "u") == Outcome(job_id, False, None, "no such job")
    assert snapshot(pinned_conn, job_id) == before
    # Also once it has started: no state of another team's job leaks.
    c = claim_job(pinned_store, job_id)
    assert pinned_store.cancel(job_id, "u") == Outcome(job_id, False, None, "no such job")
    assert pinned_store.status(job_id).state == "claimed" and c.attempt == 1


def test_cancel_unknown_job(pinned_conn, pinned_store):
    before = counts(pinned_conn)
    assert pinned_store.cancel(987654321, "t") == Outcome(987654321, False, None, "no such job")
    assert counts(pinned_conn) == before


def test_cancel_without_team_acts_for_every_team(pinned_conn, pinned_store):
    job_id = pinned_store.submit("u", JobSpec("theirs")).job_id
    assert pinned_store.cancel(job_id, None).ok
    assert pinned_store.status(job_id).state == "cancelled"


def test_cancel_a_retrying_job(pinned_conn, pinned_store, job):
    job_id, token = job
    assert pinned_store.fail([Fail(job_id, token, "flaky", True)])[0].state == "retrying"
    run_at = pinned_store.status(job_id).run_at
    assert due_count(pinned_conn, job_id) == 1
    out = pinned_store.cancel(job_id, "t")
    assert out == Outcome(job_id, True, "cancelled", None)
    assert due_count(pinned_conn, job_id) == 0
    pinned_store.clock = run_at + S
    assert claim(pinned_store, [job_id]) == []
    st = pinned_store.status(job_id)
    assert st.state == "cancelled" and st.attempts == 1 and st.last_error == "flaky"


# ---------------------------------------------------------------- keyed results recorded, then replayed
def keyed(store, key: str = "k-1", **kw) -> int:
    return store.submit("t", JobSpec("keyed", due_at=T0 - 10 * S, idempotency_key=key, **kw)).job_id


def key_row(conn: psycopg.Connection, key: str) -> dict:
    return conn.execute("SELECT to_jsonb(k) FROM idempotency_keys k WHERE key = %s", (key,)).fetchone()[0]


def test_a_result_recorded_outlives_its_claim_and_is_replayed_by_the_next_claim(pinned_conn, pinned_store):
    """The worker records the result, then its completion is refused (the
    claim expired meanwhile): the key keeps the result, the expiry does not
    count the attempt, and the next claim carries it to complete with."""
    job_id = keyed(pinned_store)
    c = claim_job(pinned_store, job_id)
    assert c.replay is None
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts) == ("scheduled", 1)           # not recorded yet: the attempt counts
    assert pinned_store.record([Record(job_id, json_text({"paid": 1}))]) == [Recorded(job_id, True, '{"paid": 1}', None)]
    assert pinned_store.complete([Complete(job_id, c.lease_token, json_text({"paid": 1}))])[0].ok is False
    k = key_row(pinned_conn, "k-1")
    assert (k["result"], ts(k["completed_at"])) == ({"paid": 1}, T0 + 31 * S)
    # Another run's result comes second: the first stays, and is the answer.
    assert pinned_store.record([Record(job_id, json_text({"paid": 2}))])[0].result == '{"paid": 1}'
    again = claim_job(pinned_store, job_id)
    assert (again.replay, again.attempt) == ({"paid": 1}, 2)
    assert pinned_store.complete([Complete(job_id, again.lease_token, json_text(again.replay))])[0].ok
    st = pinned_store.status(job_id)
    assert (st.state, st.result) == ("succeeded", {"paid": 1})
    assert key_row(pinned_conn, "k-1")["completed_at"] == k["completed_at"]   # the completion left the key alone


@pytest.mark.parametrize("last", [False, True])
def test_a_claim_that_expires_after_its_result_was_recorded_is_due_again_to_be_completed(pinned_conn, pinned_store,
                                                                                           last):
    """The worker died between the record and the completion: its run is
    done, so the attempt is not counted, and the job is not dead even on its
    last attempt; its next delivery replays the result (a null one too)."""
    job_id = keyed(pinned_store, max_attempts=1 if last else 3)
    c = claim_job(pinned_store, job_id)
    assert pinned_store.start([Start(job_id, c.lease_token)])[0].ok
    assert pinned_store.record([Record(job_id, None)])[0] == Recorded(job_id, True, "null", None)
    pinned_store.clock = T0 + 31 * S
    assert pinned_store.expire_claims([job_id & 1023]) == (1, 0)
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts) == ("scheduled", 0) and "its result was recorded" in st.last_error
    (epoch,) = pinned_store.take_leases([job_id & 1023], "d1", 3600).values()
    [[again]], _ = pinned_store.claim([ClaimRequest(job_id & 1023, epoch, 10, "w")], "d1", 30)
    assert (again.job_id, again.replay, again.attempt) == (job_id, "null", 1)      # JSON text, as sent on


def test_a_record_is_refused_where_there_is_nothing_to_record_under(pinned_conn, pinned_store):
    plain = pinned_store.submit("t", JobSpec("plain")).job_id
    moved = keyed(pinned_store, "moved")
    pinned_store.clock = T0 + 25 * H                 # the key expired; a new job takes it
    taken = keyed(pinned_store, "moved")
    assert taken != moved
    before = counts(pinned_conn)
    got = pinned_store.record([Record(987654321, None), Record(plain, None), Record(moved, json_text(1))])
    assert [(r.ok, r.result) for r in got] == [(False, None)] * 3
    assert [r.reason for r in got] == ["no such job", "the job has no idempotency key: nothing to record its result under",
                                      "its idempotency key no longer names it (expired)"]
    assert key_row(pinned_conn, "moved")["completed_at"] is None and counts(pinned_conn) == before


# ---------------------------------------------------------------- status
def test_status_returns_the_record(pinned_conn, pinned_store):
    sub = pinned_store.submit("t", JobSpec("seen", due_at=T0 + H, priority=7, max_attempts=5, flex_s=0,
                                    idempotency_key="st-1", payload={"p": 1}))
    st = pinned_store.status(sub.job_id)
    assert (st.job_id, st.team, st.name, st.state, st.priority) == (sub.job_id, "t", "seen", "scheduled", 7)
    assert (st.due_at, st.run_at, st.strict, st.flex_s) == (T0 + H, T0 + H, False, 0)
    assert (st.attempts, st.max_attempts, st.idempotency_key, st.created_at) == (0, 5, "st-1", T0)
    assert st.claimed_by is None and st.lateness is None and st.result is None and st.finished_at is None
    assert pinned_store.status(sub.job_id, "t") == st


def test_status_of_another_teams_job_is_none(pinned_conn, pinned_store):
    job_id = pinned_store.submit("t", JobSpec("private")).job_id
    assert pinned_store.status(job_id, "u") is None
    assert pinned_store.status(job_id, "nosuchteam") is None
    assert pinned_store.status(job_id + (1 << 30)) is None
    assert pinned_store.status(job_id, "t").job_id == job_id


def test_status_shows_the_claim(pinned_conn, pinned_store, job):
    job_id, _ = job
    st = pinned_store.status(job_id)
    assert (st.state, st.attempts, st.claimed_by, st.claim_expires_at) == ("claimed", 1, "d1", T0 + 30 * S)


# ---------------------------------------------------------------- claim refusals in a batch
def test_claim_with_one_stale_shard_lease_refuses_only_that_shard(pinned_conn, pinned_store):
    a = pinned_store.submit("t", JobSpec("a")).job_id
    shard_a = a & 1023
    shard_b = (shard_a + 1) % 256
    leases = pinned_store.take_leases([shard_a, shard_b], "d1", 3600)
    result = claim_shards(pinned_store, {shard_a: leases[shard_a], shard_b: leases[shard_b] + 1}, 10, "d1", 30)
    assert [c.job_id for c in result.jobs] == [a]
    assert list(result.refused) == [shard_b]
