"""Idempotency keys against a real PostgreSQL: the same team + key + request
names one job for 24 hours; another request under the key is a conflict;
concurrent submitters race to one job; keys expire, are purged, and hold the
result of their job once it succeeded.

The tests of this module share one clone of the migrated template, emptied
before each test (see test_submit.py for why)."""
from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.store.errors import Conflict
from minutehand.store.outcomes import Complete
from minutehand.store.submit import JobSpec
from tests.support import T0, claim, counts, json_text, on_citus, pin, submit_sql, submit_store

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

S = dt.timedelta(seconds=1)
H = dt.timedelta(hours=1)
TTL = dt.timedelta(hours=24)





def key_row(conn: psycopg.Connection, team: str, key: str) -> dict | None:
    row = conn.execute("""SELECT to_jsonb(k) FROM idempotency_keys k JOIN teams t ON t.id = k.team_id
                           WHERE t.name = %s AND k.key = %s""", (team, key)).fetchone()
    return row[0] if row else None


def ts(v: str) -> dt.datetime:
    return dt.datetime.fromisoformat(v)


def claim_job(store, job_id: int, lease_s: float = 30):
    """Lease the job's shard at the store's clock and claim; the job's claim."""
    shard = job_id & 1023
    leases = store.take_leases([shard], "d1", 3600)
    assert shard in leases
    got = [c for c in claim(store, leases, 100, "d1", lease_s).jobs if c.job_id == job_id]
    assert len(got) == 1, f"job {job_id} was not claimable"
    return got[0]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(params=["sql", "store"])
def via(request, pinned_conn, pinned_store):
    """(submit, conflict_error): submit one job by SQL or by the Store, and what a conflict raises there."""
    if request.param == "sql":
        return (lambda **kw: submit_sql(pinned_conn, **kw)), psycopg.Error
    return (lambda **kw: submit_store(pinned_store, **kw)), Conflict


def assert_conflict(exc_info) -> None:
    e = exc_info.value
    if isinstance(e, psycopg.Error):
        assert e.sqlstate == "MH409"
        message = e.diag.message_primary
    else:
        assert isinstance(e, Conflict) and e.status == 409
        message = e.message
    assert "different request" in message


# ---------------------------------------------------------------- same key
def test_same_key_and_request_returns_the_same_job_and_writes_nothing(pinned_conn, via):
    submit, _ = via
    spec = dict(name="charge", due_at=T0 + H, payload={"order": 7}, flex_s=600, idempotency_key="order-7")
    job_id, run_at, created = submit(**spec)
    assert created is True
    before = counts(pinned_conn)
    assert before == {"jobs": 1, "due_minutes": 1, "due_hours": 0, "due_far": 0, "idempotency_keys": 1}
    for _ in range(3):
        again = submit(**spec)
        assert again == (job_id, run_at, False)        # the first run time, not a new draw from the window
    assert counts(pinned_conn) == before
    k = key_row(pinned_conn, "t", "order-7")
    assert k["job_id"] == job_id and ts(k["expires_at"]) == T0 + TTL


def test_keyed_job_lives_on_the_shard_of_its_key(pinned_conn, via):
    submit, _ = via
    job_id, _, _ = submit(idempotency_key="where-am-i")
    team_id = pinned_conn.execute("SELECT id FROM teams WHERE name = 't'").fetchone()[0]
    key_shard = pinned_conn.execute("SELECT mh_key_shard(%s, 'where-am-i')", (team_id,)).fetchone()[0]
    assert job_id & 1023 == key_shard
    assert pinned_conn.execute("SELECT shard FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == key_shard
    assert key_row(pinned_conn, "t", "where-am-i")["shard"] == key_shard


@pytest.mark.parametrize("change", [
    dict(payload={"order": 8}),
    dict(due_at=T0 + 2 * H),
    dict(priority=5),
    dict(name="other-name"),
    dict(max_attempts=9),
    dict(strict=True, flex_s=0),
], ids=lambda c: "+".join(c))
def test_same_key_different_request_is_a_conflict_and_writes_nothing(pinned_conn, via, change):
    submit, error = via
    spec = dict(name="charge", due_at=T0 + H, payload={"order": 7}, flex_s=0, idempotency_key="order-7")
    job_id, _, _ = submit(**spec)
    before = counts(pinned_conn)
    key_before = key_row(pinned_conn, "t", "order-7")
    with pytest.raises(error) as err:
        submit(**{**spec, **change})
    assert_conflict(err)
    assert str(job_id) in str(err.value)                 # names the job the key belongs to
    assert counts(pinned_conn) == before
    assert key_row(pinned_conn, "t", "order-7") == key_before
    # The original request is still answered with the original job.
    assert submit(**spec)[:1] == (job_id,) and submit(**spec)[2] is False


def test_same_key_in_another_team_is_another_job(pinned_conn, via):
    submit, _ = via
    a, _, created_a = submit(team="t", idempotency_key="shared", payload={"x": 1})
    b, _, created_b = submit(team="u", idempotency_key="shared", payload={"x": 1})
    assert created_a and created_b and a != b
    assert counts(pinned_conn)["jobs"] == 2 and counts(pinned_conn)["idempotency_keys"] == 2
    assert key_row(pinned_conn, "t", "shared")["job_id"] == a
    assert key_row(pinned_conn, "u", "shared")["job_id"] == b
    # And another team's different request under the same key is no conflict.
    c, _, created_c = submit(team="u", idempotency_key="shared2", payload={"y": 2})
    d, _, created_d = submit(team="t", idempotency_key="shared2", payload={"z": 3})
    assert created_c and created_d and c != d


def test_single_and_batch_submissions_share_keys(pinned_conn, pinned_store):
    spec = JobSpec("mixed", due_at=T0 + H, payload={"n": 1}, idempotency_key="mix")
    first = pinned_store.submit("t", spec)
    before = counts(pinned_conn)
    [item] = pinned_store.submit_many("t", [spec])
    assert (item.job_id, item.run_at, item.created, item.error) == (first.job_id, first.run_at, False, None)
    assert counts(pinned_conn) == before
    [batch_first] = pinned_store.submit_many("t", [JobSpec("mixed2", idempotency_key="mix2")])
    again = pinned_store.submit("t", JobSpec("mixed2", idempotency_key="mix2"))
    assert (again.job_id, again.created) == (batch_first.job_id, False)


# ---------------------------------------------------------------- concurrency
def race(dsn: str, n: int, sql: str, params_of) -> tuple[list, list]:
    """n connections run `sql` at the same instant; (results, errors)."""
    barrier = threading.Barrier(n)
    results, errors = [], []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            pin(c, T0)
            barrier.wait()
            try:
                row = c.execute(sql, params_of(i)).fetchone()
                with lock:
                    results.append(row)
            except psycopg.Error as e:
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results, errors


SUBMIT_KEYED = ("SELECT job_id, run_at, created FROM submit_job_detail('t', 'race', NULL, %s, "
                "p_idempotency_key => 'race-key')")


def test_twenty_concurrent_submissions_with_one_key_make_one_job(pinned_conn, db_dsn):
    results, errors = race(db_dsn, 20, SUBMIT_KEYED, lambda i: (Jsonb({"same": True}),))
    assert errors == []
    assert len(results) == 20
    assert len({r[0] for r in results}) == 1
    assert sorted(r[2] for r in results) == [False] * 19 + [True]
    assert counts(pinned_conn) == {"jobs": 1, "due_minutes": 1, "due_hours": 0, "due_far": 0, "idempotency_keys": 1}
    assert key_row(pinned_conn, "t", "race-key")["job_id"] == results[0][0]


def test_concurrent_different_requests_with_one_key_one_wins_rest_conflict(pinned_conn, db_dsn):
    results, errors = race(db_dsn, 10, SUBMIT_KEYED, lambda i: (Jsonb({"i": i}),))
    assert len(results) == 1 and results[0][2] is True
    assert len(errors) == 9 and all(e.sqlstate == "MH409" for e in errors)
    assert counts(pinned_conn) == {"jobs": 1, "due_minutes": 1, "due_hours": 0, "due_far": 0, "idempotency_keys": 1}


def test_concurrent_batches_with_one_key_make_one_job(pinned_conn, db_dsn):
    sql = ("SELECT array_agg(job_id ORDER BY idx), array_agg(created ORDER BY idx), array_agg(error ORDER BY idx) "
           "FROM submit_jobs('t', ARRAY['b', 'b'], p_keys => ARRAY['batch-race', 'batch-race'])")
    results, errors = race(db_dsn, 10, sql, lambda i: ())
    assert errors == []
    ids = {i for r in results for i in r[0]}
    assert len(ids) == 1 and None not in ids
    assert sum(c for r in results for c in r[1]) == 1
    assert all(e is None for r in results for e in r[2])
    assert counts(pinned_conn)["jobs"] == 1 and counts(pinned_conn)["idempotency_keys"] == 1


# ---------------------------------------------------------------- expiry
def test_key_expires_after_24_hours(pinned_conn, pinned_store):
    spec = JobSpec("daily", payload={"d": 1}, idempotency_key="day-key")
    first = pinned_store.submit("t", spec)
    pinned_store.clock = T0 + TTL - S                # still inside the 24 h
    assert pinned_store.submit("t", spec).job_id == first.job_id
    assert pinned_store.submit("t", spec).created is False
    before = counts(pinned_conn)
    pinned_store.clock = T0 + TTL + S                # past expires_at
    second = pinned_store.submit("t", spec)
    assert second.created is True and second.job_id != first.job_id
    assert second.run_at == T0 + TTL + S
    after = counts(pinned_conn)
    assert after["jobs"] == before["jobs"] + 1
    assert after["idempotency_keys"] == before["idempotency_keys"]    # the key row starts over
    k = key_row(pinned_conn, "t", "day-key")
    assert k["job_id"] == second.job_id and ts(k["expires_at"]) == T0 + TTL + S + TTL
    assert k["result"] is None and k["completed_at"] is None
    # The new job now owns the key for the next 24 h.
    assert pinned_store.submit("t", spec).job_id == second.job_id


def test_expired_key_accepts_a_different_request(pinned_conn, pinned_store):
    pinned_store.submit("t", JobSpec("v1", payload={"v": 1}, idempotency_key="k"))
    pinned_store.clock = T0 + 2 * H
    with pytest.raises(Conflict):
        pinned_store.submit("t", JobSpec("v2", payload={"v": 2}, idempotency_key="k"))
    pinned_store.clock = T0 + TTL + H
    new = pinned_store.submit("t", JobSpec("v2", payload={"v": 2}, idempotency_key="k"))
    assert new.created
    assert key_row(pinned_conn, "t", "k")["job_id"] == new.job_id


def test_expired_key_in_a_batch_makes_a_new_job(pinned_conn, pinned_store):
    spec = JobSpec("batched", idempotency_key="bk")
    [first] = pinned_store.submit_many("t", [spec])
    pinned_store.clock = T0 + TTL + S
    [second] = pinned_store.submit_many("t", [spec])
    assert second.created and second.error is None and second.job_id != first.job_id
    assert counts(pinned_conn)["jobs"] == 2 and counts(pinned_conn)["idempotency_keys"] == 1
    assert key_row(pinned_conn, "t", "bk")["job_id"] == second.job_id


def test_purge_removes_only_expired_keys(pinned_conn, pinned_store):
    old = pinned_store.submit("t", JobSpec("old", idempotency_key="old-key"))
    pinned_store.clock = T0 + 12 * H
    young = pinned_store.submit("t", JobSpec("young", idempotency_key="young-key"))
    pinned_store.clock = T0 + TTL - S                 # nothing expired yet
    assert pinned_store.purge_keys(range(256)) == 0
    pinned_store.clock = T0 + TTL + S
    before = counts(pinned_conn)
    assert pinned_store.purge_keys(range(256)) == 1
    assert key_row(pinned_conn, "t", "old-key") is None
    assert key_row(pinned_conn, "t", "young-key")["job_id"] == young.job_id
    after = counts(pinned_conn)
    assert after == {**before, "idempotency_keys": before["idempotency_keys"] - 1}   # jobs untouched
    # The SQL form, one shard at a time: only the shard that holds the key purges it.
    pin(pinned_conn, T0 + 12 * H + TTL + S)
    young_shard = young.job_id & 1023
    other_shard = (young_shard + 1) % 256
    assert pinned_conn.execute("SELECT purge_idempotency_keys(%s)", (other_shard,)).fetchone()[0] == 0
    assert key_row(pinned_conn, "t", "young-key") is not None
    assert pinned_conn.execute("SELECT purge_idempotency_keys(%s)", (young_shard,)).fetchone()[0] == 1
    assert counts(pinned_conn)["idempotency_keys"] == 0 and counts(pinned_conn)["jobs"] == 2
    assert old.job_id != young.job_id


# ---------------------------------------------------------------- batches
def test_key_repeated_in_a_batch_makes_one_job(pinned_conn, pinned_store):
    spec = JobSpec("dup", payload={"p": 1}, idempotency_key="dup-key")
    items = pinned_store.submit_many("t", [spec, JobSpec("other"), spec])
    assert [i.error for i in items] == [None, None, None]
    assert items[0].job_id == items[2].job_id and items[0].job_id is not None
    assert (items[0].created, items[2].created) == (True, False)
    assert items[0].run_at == items[2].run_at == T0
    assert counts(pinned_conn) == {"jobs": 2, "due_minutes": 2, "due_hours": 0, "due_far": 0, "idempotency_keys": 1}


def test_key_repeated_in_a_batch_with_another_request_reports_that_item(pinned_conn, pinned_store):
    items = pinned_store.submit_many("t", [JobSpec("a", payload={"p": 1}, idempotency_key="k"),
                                    JobSpec("a", payload={"p": 2}, idempotency_key="k")])
    assert items[0].created and items[0].error is None
    assert items[1].job_id is None and not items[1].created
    assert "k" in items[1].error and "different request" in items[1].error
    assert counts(pinned_conn)["jobs"] == 1 and counts(pinned_conn)["idempotency_keys"] == 1


def test_batch_reuses_a_key_from_before_and_writes_nothing(pinned_conn, pinned_store):
    spec = JobSpec("pre", payload={"p": 1}, idempotency_key="pre-key")
    first = pinned_store.submit("t", spec)
    before = counts(pinned_conn)
    items = pinned_store.submit_many("t", [spec, JobSpec("pre", payload={"p": 2}, idempotency_key="pre-key")])
    assert (items[0].job_id, items[0].created, items[0].error) == (first.job_id, False, None)
    assert items[1].job_id is None and "different request" in items[1].error
    assert counts(pinned_conn) == before


# ---------------------------------------------------------------- results under the key
def test_complete_stores_the_result_under_the_key(pinned_conn, pinned_store):
    job = pinned_store.submit("t", JobSpec("paid", payload={"order": 1}, idempotency_key="pay-1"))
    c = claim_job(pinned_store, job.job_id)
    pinned_store.clock = T0 + 5 * S
    [out] = pinned_store.complete([Complete(job.job_id, c.lease_token, json_text({"receipt": "r-1"}))])
    assert out.ok and out.state == "succeeded"
    k = key_row(pinned_conn, "t", "pay-1")
    assert k["result"] == {"receipt": "r-1"}
    assert ts(k["completed_at"]) == T0 + 5 * S
    assert k["job_id"] == job.job_id
    # A later submission with the key names the finished job (its result is under the key).
    again = pinned_store.submit("t", JobSpec("paid", payload={"order": 1}, idempotency_key="pay-1"))
    assert (again.job_id, again.created) == (job.job_id, False)


def test_complete_without_key_stores_no_key(pinned_conn, pinned_store):
    job = pinned_store.submit("t", JobSpec("plain"))
    c = claim_job(pinned_store, job.job_id)
    [out] = pinned_store.complete([Complete(job.job_id, c.lease_token, json_text({"r": 1}))])
    assert out.ok
    assert counts(pinned_conn)["idempotency_keys"] == 0
    assert pinned_store.status(job.job_id).result == {"r": 1}


def test_completing_a_job_whose_key_moved_on_leaves_the_new_jobs_key_alone(pinned_conn, pinned_store):
    spec = JobSpec("long", idempotency_key="long-key")
    old = pinned_store.submit("t", spec)
    c = claim_job(pinned_store, old.job_id, lease_s=86400)
    pinned_store.clock = T0 + TTL + S              # the key expired; a new job takes it
    new = pinned_store.submit("t", spec)
    assert new.created and new.job_id != old.job_id
    [out] = pinned_store.complete([Complete(old.job_id, c.lease_token, json_text({"from": "old"}))])
    assert out.ok
    k = key_row(pinned_conn, "t", "long-key")
    assert k["job_id"] == new.job_id and k["result"] is None and k["completed_at"] is None


# ---------------------------------------------------------------- the caller's transaction
def test_rolled_back_submission_leaves_the_key_free(pinned_conn, pinned_store):
    with pinned_conn.transaction():
        pinned_conn.execute("SELECT submit_job('t', 'tx', NULL, '{}', p_idempotency_key => 'tx-key')")
        assert key_row(pinned_conn, "t", "tx-key") is not None
        raise psycopg.Rollback()
    assert key_row(pinned_conn, "t", "tx-key") is None
    assert counts(pinned_conn) == {"jobs": 0, "due_minutes": 0, "due_hours": 0, "due_far": 0, "idempotency_keys": 0}
    sub = pinned_store.submit("t", JobSpec("other-request", payload={"now": "different"}, idempotency_key="tx-key"))
    assert sub.created


def wait_until_blocked(conn: psycopg.Connection, marker: str) -> None:
    """Until a session running a statement containing `marker` waits on a lock
    (on Citus it waits on a worker, for the coordinator a client read: Citus
    lists the waits of distributed transactions in citus_lock_waits)."""
    waits = ("SELECT count(*) FROM citus_lock_waits WHERE blocked_statement LIKE %s" if on_citus(conn) else
             "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s")
    for _ in range(500):
        if conn.execute(waits, (f"%{marker}%",)).fetchone()[0]:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the second submitter never waited for the first")


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_second_submitter_waits_for_the_first_transaction(pinned_conn, db_dsn, first_commits):
    first = psycopg.connect(db_dsn)
    try:
        pin(first, T0)
        first.commit()
        first_id = first.execute("SELECT submit_job('t', 'w', NULL, '{}', p_idempotency_key => 'wait-key')"
                                 ).fetchone()[0]
        result = {}

        def second():
            with psycopg.connect(db_dsn, autocommit=True) as c:
                pin(c, T0)
                result["row"] = c.execute("SELECT job_id, created FROM submit_job_detail('t', 'w', NULL, '{}', "
                                          "p_idempotency_key => 'wait-key') /* second-submitter */").fetchone()

        t = threading.Thread(target=second)
        t.start()
        wait_until_blocked(pinned_conn, "second-submitter")
        assert "row" not in result
        first.commit() if first_commits else first.rollback()
        t.join(10)
        assert not t.is_alive()
    finally:
        first.close()
    job_id, created = result["row"]
    if first_commits:
        assert (job_id, created) == (first_id, False)
    else:
        assert created is True and job_id != first_id
    assert counts(pinned_conn)["jobs"] == 1 and counts(pinned_conn)["idempotency_keys"] == 1
    assert key_row(pinned_conn, "t", "wait-key")["job_id"] == job_id
