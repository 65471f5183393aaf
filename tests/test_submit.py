"""Submission against a real PostgreSQL: submit_job / submit_job_detail /
submit_jobs called as SQL, and Store.submit / Store.submit_many.

Every refusal is checked twice: the SQLSTATE (SQL) or StoreError class
(Store) it raises, and that nothing at all was written (row counts of jobs,
the three wheel levels and idempotency_keys before and after).

Speed: the tests of this module share one clone of the migrated template
(cloning and dropping a database per test costs ~0.3 s with 576 wheel
partitions); the module is marked reused_db, so `db_dsn` is that clone,
emptied back to the migrated state before each test instead."""
from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.store.errors import InvalidInput, NotFound, PayloadTooLarge, StoreError
from minutehand.store.submit import JobSpec
from tests.support import T0, claim, counts, due_rows, minute_part, pin, submit_sql, submit_store

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

S = dt.timedelta(seconds=1)
H = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
BIG_PAYLOAD = {"blob": "x" * 300_000}          # > 262144 bytes once encoded


# ---------------------------------------------------------------- helpers








def hour_part(conn: psycopg.Connection, t: dt.datetime) -> str:
    return conn.execute("SELECT mh_hour_part(mh_hour_slot(%s))", (t,)).fetchone()[0]


def job(conn: psycopg.Connection, job_id: int) -> dict | None:
    row = conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()
    return row[0] if row else None


def job_row(conn: psycopg.Connection, job_id: int) -> tuple:
    return conn.execute("SELECT shard, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,"
                        " attempts, max_attempts, idempotency_key FROM jobs WHERE id = %s", (job_id,)).fetchone()


# ---------------------------------------------------------------- fixtures
@pytest.fixture(params=["sql", "store"])
def submit(request, pinned_conn, pinned_store):
    """Submit one job by either path; returns (job_id, run_at, created)."""
    if request.param == "sql":
        return lambda **kw: submit_sql(pinned_conn, **kw)
    return lambda **kw: submit_store(pinned_store, **kw)


# ---------------------------------------------------------------- happy paths
def test_due_now_goes_to_current_minute_bucket(pinned_conn, submit):
    job_id, run_at, created = submit(name="now", payload={"k": [1, 2]})
    assert created is True
    assert run_at == T0
    j = job(pinned_conn, job_id)
    assert j["state"] == "scheduled" and j["attempts"] == 0 and j["max_attempts"] == 3
    assert j["payload"] == {"k": [1, 2]} and j["name"] == "now"
    assert dt.datetime.fromisoformat(j["due_at"]) == T0
    assert j["shard"] == pinned_conn.execute("SELECT mh_shard_of(%s)", (job_id,)).fetchone()[0]
    assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, T0), T0)]


def test_due_in_the_past_runs_now_in_current_bucket(pinned_conn, submit):
    past = T0 - 3 * DAY
    job_id, run_at, created = submit(name="late", due_at=past)
    assert created and run_at == T0
    j = job(pinned_conn, job_id)
    assert dt.datetime.fromisoformat(j["due_at"]) == past          # the requested time is kept
    assert dt.datetime.fromisoformat(j["run_at"]) == T0
    assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, T0), T0)]


def test_strict_due_in_the_past_also_runs_now(pinned_conn, submit):
    job_id, run_at, _ = submit(name="late-strict", due_at=T0 - 90 * S, strict=True)
    assert run_at == T0
    assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, T0), T0)]


def test_due_in_two_hours_goes_to_its_minute_bucket(pinned_conn, submit):
    due = T0 + 2 * H + 7 * S
    job_id, run_at, _ = submit(name="soon", due_at=due)
    assert run_at == due
    part = minute_part(pinned_conn, due)
    assert part != minute_part(pinned_conn, T0)
    assert due_rows(pinned_conn, job_id) == [(part, due)]


def test_due_in_thirty_hours_goes_to_hour_level(pinned_conn, submit):
    due = T0 + 30 * H
    job_id, run_at, _ = submit(name="tomorrow", due_at=due)
    assert run_at == due
    assert due_rows(pinned_conn, job_id) == [(hour_part(pinned_conn, due), due)]


def test_due_in_five_days_goes_to_far_level(pinned_conn, submit):
    due = T0 + 5 * DAY
    job_id, run_at, _ = submit(name="later", due_at=due)
    assert run_at == due
    assert due_rows(pinned_conn, job_id) == [("due_far", due)]


def test_submit_job_returns_the_id_of_the_written_job(pinned_conn):
    job_id = pinned_conn.execute("SELECT submit_job('t', 'plain', %s, '{\"a\": 1}')", (T0 + H,)).fetchone()[0]
    assert isinstance(job_id, int)
    shard, team_id, name, payload, *_ = job_row(pinned_conn, job_id)
    assert (name, payload) == ("plain", {"a": 1})
    assert shard == job_id & 1023
    assert team_id == pinned_conn.execute("SELECT id FROM teams WHERE name = 't'").fetchone()[0]
    assert len(due_rows(pinned_conn, job_id)) == 1


def test_every_job_gets_its_own_id_and_one_due_row(pinned_conn, submit):
    ids = [submit(name=f"j{i}")[0] for i in range(30)]
    assert len(set(ids)) == 30
    assert counts(pinned_conn) == {"jobs": 30, "due_minutes": 30, "due_hours": 0, "due_far": 0, "idempotency_keys": 0}


def test_flexible_window_spreads_run_at_inside_the_window(pinned_conn, submit):
    due, flex = T0 + H, 600
    runs = []
    for i in range(40):
        job_id, run_at, _ = submit(name=f"flex{i}", due_at=due, flex_s=flex)
        assert due <= run_at <= due + flex * S
        assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, run_at), run_at)]
        j = job(pinned_conn, job_id)
        assert dt.datetime.fromisoformat(j["due_at"]) == due and j["flex_s"] == flex
        runs.append(run_at)
    assert len(set(runs)) >= 35                           # spread, not all on one instant
    assert max(runs) - min(runs) > 120 * S                # across the window, not bunched


def test_strict_job_runs_exactly_at_due(pinned_conn, submit):
    due = T0 + H + 123 * S
    for i in range(5):
        job_id, run_at, _ = submit(name=f"strict{i}", due_at=due, strict=True)
        assert run_at == due
        assert job(pinned_conn, job_id)["strict"] is True
        assert due_rows(pinned_conn, job_id) == [(minute_part(pinned_conn, due), due)]


@pytest.mark.parametrize("kw", [
    dict(name="n" * 200),
    dict(name="a-Z_0.9:/x"),
    dict(priority=100), dict(priority=-100),
    dict(max_attempts=1), dict(max_attempts=100),
    dict(flex_s=86400),
    dict(due_at=T0 + dt.timedelta(days=366)),
    dict(payload={"blob": "x" * 200_000}),
], ids=lambda kw: next(iter(kw)) + "=" + str(next(iter(kw.values())))[:20])
def test_limits_are_inclusive(pinned_conn, submit, kw):
    before = counts(pinned_conn)
    job_id, _, created = submit(**kw)
    assert created and job(pinned_conn, job_id) is not None
    after = counts(pinned_conn)
    assert after["jobs"] == before["jobs"] + 1
    assert sum(after[t] for t in ("due_minutes", "due_hours", "due_far")) == 1


# ---------------------------------------------------------------- refusals
REFUSALS = [
    ("unknown team", dict(team="nosuchteam"), "MH404", NotFound, "unknown team"),
    ("priority too high", dict(priority=101), "MH400", InvalidInput, "priority"),
    ("priority too low", dict(priority=-101), "MH400", InvalidInput, "priority"),
    ("zero attempts", dict(max_attempts=0), "MH400", InvalidInput, "max_attempts"),
    ("negative attempts", dict(max_attempts=-1), "MH400", InvalidInput, "max_attempts"),
    ("too many attempts", dict(max_attempts=101), "MH400", InvalidInput, "max_attempts"),
    ("empty name", dict(name=""), "MH400", InvalidInput, "name"),
    ("long name", dict(name="n" * 201), "MH400", InvalidInput, "name"),
    ("space in name", dict(name="a b"), "MH400", InvalidInput, "name"),
    ("semicolon in name", dict(name="a;drop"), "MH400", InvalidInput, "name"),
    ("non-ascii name", dict(name="jöb"), "MH400", InvalidInput, "name"),
    ("negative flex", dict(flex_s=-1), "MH400", InvalidInput, "flex"),
    ("flex over a day", dict(flex_s=86401), "MH400", InvalidInput, "flex"),
    ("strict with flex", dict(strict=True, flex_s=10), "MH400", InvalidInput, "strict"),
    ("due too far ahead", dict(due_at=T0 + dt.timedelta(days=366) + S), "MH400", InvalidInput, "ahead"),
    ("payload too large", dict(payload=BIG_PAYLOAD), "MH413", PayloadTooLarge, "payload"),
    ("zero backoff base", dict(backoff_base_s=0), "MH400", InvalidInput, "backoff base"),
    ("cap below base", dict(backoff_base_s=10, backoff_cap_s=5), "MH400", InvalidInput, "backoff cap"),
    ("empty key", dict(idempotency_key=""), "MH400", InvalidInput, "idempotency key"),
    ("long key", dict(idempotency_key="k" * 256), "MH400", InvalidInput, "idempotency key"),
]


@pytest.mark.parametrize("kw,sqlstate,msg", [(kw, st, msg) for _, kw, st, _, msg in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_refusal_via_sql_writes_nothing(pinned_conn, kw, sqlstate, msg):
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        submit_sql(pinned_conn, **kw)
    assert err.value.sqlstate == sqlstate
    assert msg in err.value.diag.message_primary
    assert counts(pinned_conn) == before


@pytest.mark.parametrize("kw,exc,msg", [(kw, exc, msg) for _, kw, _, exc, msg in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_refusal_via_store_writes_nothing(pinned_conn, pinned_store, kw, exc, msg):
    before = counts(pinned_conn)
    with pytest.raises(exc) as err:
        submit_store(pinned_store, **kw)
    assert isinstance(err.value, StoreError)
    assert err.value.status == {InvalidInput: 400, NotFound: 404, PayloadTooLarge: 413}[exc]
    assert msg in err.value.message
    assert counts(pinned_conn) == before
    # The pooled connection is still usable after the refusal.
    assert submit_store(pinned_store, name="after-refusal")[2] is True


@pytest.mark.parametrize("due", ["infinity", "-infinity"])
def test_infinite_due_time_is_refused(pinned_conn, due):
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute(f"SELECT submit_job('t', 'n', '{due}')")
    assert err.value.sqlstate == "MH400"
    assert "finite" in err.value.diag.message_primary
    assert counts(pinned_conn) == before


def test_due_time_that_is_not_a_time_is_refused(pinned_conn):
    before = counts(pinned_conn)
    with pytest.raises(psycopg.errors.InvalidDatetimeFormat) as err:
        pinned_conn.execute("SELECT submit_job('t', 'n', 'not-a-time')")
    assert err.value.sqlstate == "22007"
    assert counts(pinned_conn) == before


def test_null_name_is_refused(pinned_conn):
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute("SELECT submit_job('t', NULL)")
    assert err.value.sqlstate == "MH400"
    assert counts(pinned_conn) == before


def test_payload_limit_holds_for_a_payload_read_from_a_table(pinned_conn):
    # The same 1 MB payload is refused when sent as a parameter (the API path) ...
    pinned_conn.execute("CREATE TEMP TABLE staging (p jsonb)")
    pinned_conn.execute("INSERT INTO staging SELECT jsonb_build_object('b', repeat('x', 1000000))")
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute("SELECT submit_job('t', 'direct', NULL, jsonb_build_object('b', repeat('x', 1000000)))")
    assert err.value.sqlstate == "MH413"
    # ... and must be refused the same way when it comes from a table column.
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute("SELECT submit_job('t', 'from-table', NULL, p) FROM staging")
    assert err.value.sqlstate == "MH413"
    assert counts(pinned_conn) == before


# ---------------------------------------------------------------- the caller's transaction
def test_rollback_of_the_callers_transaction_leaves_no_job(pinned_conn):
    before = counts(pinned_conn)
    with pinned_conn.transaction():
        job_id = pinned_conn.execute("SELECT submit_job('t', 'tx', NULL, '{}')").fetchone()[0]
        assert job(pinned_conn, job_id) is not None         # visible inside the transaction
        assert len(due_rows(pinned_conn, job_id)) == 1
        raise psycopg.Rollback()
    assert job(pinned_conn, job_id) is None
    assert due_rows(pinned_conn, job_id) == []
    assert counts(pinned_conn) == before


def test_commit_of_the_callers_transaction_makes_a_claimable_job(pinned_conn, pinned_store, db_dsn):
    with psycopg.connect(db_dsn) as other:                 # not autocommit: an explicit transaction
        pin(other, T0)
        other.commit()
        other.execute("CREATE TEMP TABLE orders (id int)")
        other.execute("INSERT INTO orders VALUES (1)")
        job_id = other.execute("SELECT submit_job('t', 'tx', NULL, '{\"order\": 1}')").fetchone()[0]
        assert job(pinned_conn, job_id) is None              # not visible before the commit
        other.commit()
    assert job(pinned_conn, job_id)["state"] == "scheduled"
    shard = job_id & 1023
    leases = pinned_store.take_leases([shard], "d1", 3600)
    claimed = claim(pinned_store, leases, 10, "d1", 30).jobs
    assert [c.job_id for c in claimed] == [job_id]
    assert claimed[0].payload == {"order": 1} and claimed[0].attempt == 1
    assert due_rows(pinned_conn, job_id) == []


def test_error_later_in_the_callers_transaction_rolls_back_the_job(pinned_conn, db_dsn):
    before = counts(pinned_conn)
    with psycopg.connect(db_dsn) as other:
        pin(other, T0)
        other.commit()
        other.execute("SELECT submit_job('t', 'first', NULL, '{}')")
        with pytest.raises(psycopg.Error):
            other.execute("SELECT submit_job('t', 'bad name!', NULL, '{}')")
        other.rollback()
    assert counts(pinned_conn) == before


# ---------------------------------------------------------------- batches
def batch_specs() -> tuple[list[JobSpec], set[int]]:
    """A mixed batch and the indexes of its invalid items."""
    specs = [
        JobSpec("ok-now"),                                             # 0
        JobSpec("bad name"),                                           # 1
        JobSpec("ok-past", due_at=T0 - H),                             # 2
        JobSpec("bad-prio", priority=500),                             # 3
        JobSpec("ok-2h", due_at=T0 + 2 * H),                           # 4
        JobSpec("bad-attempts", max_attempts=0),                       # 5
        JobSpec("ok-30h", due_at=T0 + 30 * H),                         # 6
        JobSpec("bad-flex", flex_s=-5),                                # 7
        JobSpec("ok-5d", due_at=T0 + 5 * DAY),                         # 8
        JobSpec("bad-strict", strict=True, flex_s=60),                 # 9
        JobSpec("bad-ahead", due_at=T0 + 400 * DAY),                   # 10
        JobSpec("bad-payload", payload=BIG_PAYLOAD),                   # 11
        JobSpec("ok-keyed", idempotency_key="k1"),                     # 12
        JobSpec("", idempotency_key="k2"),                             # 13
    ]
    return specs, {1, 3, 5, 7, 9, 10, 11, 13}


def test_batch_via_store_writes_valid_items_and_reports_invalid_ones(pinned_conn, pinned_store):
    specs, bad = batch_specs()
    before = counts(pinned_conn)
    items = pinned_store.submit_many("t", specs)
    assert [i.idx for i in items] == list(range(len(specs)))
    for i in items:
        if i.idx in bad:
            assert i.error and i.job_id is None and i.run_at is None and i.created is False, i
        else:
            assert i.error is None and i.created is True and i.job_id is not None, i
    reasons = {i.idx: i.error for i in items if i.idx in bad}
    assert "name" in reasons[1] and "priority" in reasons[3] and "max_attempts" in reasons[5]
    assert "flex" in reasons[7] and "strict" in reasons[9] and "ahead" in reasons[10]
    assert "payload" in reasons[11] and "name" in reasons[13]

    after = counts(pinned_conn)
    good = len(specs) - len(bad)
    assert after["jobs"] == before["jobs"] + good
    assert after["idempotency_keys"] == before["idempotency_keys"] + 1      # only k1; k2's item was invalid
    assert (after["due_minutes"], after["due_hours"], after["due_far"]) == (4, 1, 1)
    names = {r[0] for r in pinned_conn.execute("SELECT name FROM jobs")}
    assert names == {s.name for k, s in enumerate(specs) if k not in bad}

    by = {i.idx: i for i in items}
    assert by[0].run_at == T0 and by[2].run_at == T0 and by[4].run_at == T0 + 2 * H
    assert due_rows(pinned_conn, by[2].job_id) == [(minute_part(pinned_conn, T0), T0)]
    assert due_rows(pinned_conn, by[4].job_id) == [(minute_part(pinned_conn, T0 + 2 * H), T0 + 2 * H)]
    assert due_rows(pinned_conn, by[6].job_id) == [(hour_part(pinned_conn, T0 + 30 * H), T0 + 30 * H)]
    assert due_rows(pinned_conn, by[8].job_id) == [("due_far", T0 + 5 * DAY)]


def test_batch_via_sql_writes_valid_items_and_reports_invalid_ones(pinned_conn):
    before = counts(pinned_conn)
    rows = pinned_conn.execute(
        """SELECT idx, job_id, run_at, created, error FROM submit_jobs('t',
               ARRAY['a', 'b c', 'd', NULL, 'e'],
               ARRAY[NULL, NULL, %s, NULL, NULL]::timestamptz[],
               NULL,
               ARRAY[0, 0, 0, 0, 1000])
           ORDER BY idx""", (T0 + 30 * H,)).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    ok = {r[0]: r for r in rows if r[4] is None}
    assert set(ok) == {0, 2}
    assert all(r[3] is True and r[1] is not None for r in ok.values())
    for idx in (1, 3, 4):
        assert rows[idx][1] is None and rows[idx][3] is False and rows[idx][4]
    assert "priority" in rows[4][4]
    after = counts(pinned_conn)
    assert after["jobs"] == before["jobs"] + 2
    assert (after["due_minutes"], after["due_hours"]) == (1, 1)


def test_batch_of_unknown_team_writes_nothing(pinned_conn, pinned_store):
    before = counts(pinned_conn)
    with pytest.raises(NotFound):
        pinned_store.submit_many("nosuchteam", [JobSpec("a"), JobSpec("b")])
    assert counts(pinned_conn) == before


def test_batch_with_only_invalid_items_writes_nothing(pinned_conn, pinned_store):
    before = counts(pinned_conn)
    items = pinned_store.submit_many("t", [JobSpec("x y"), JobSpec("ok", priority=-101)])
    assert all(i.error and i.job_id is None for i in items)
    assert counts(pinned_conn) == before


def test_batch_flexible_and_strict(pinned_conn, pinned_store):
    due = T0 + H
    items = pinned_store.submit_many("t", [JobSpec(f"f{i}", due_at=due, flex_s=900) for i in range(30)]
                              + [JobSpec("s", due_at=due, strict=True)])
    flex, strict = items[:-1], items[-1]
    assert all(due <= i.run_at <= due + 900 * S for i in flex)
    assert len({i.run_at for i in flex}) >= 25
    assert strict.run_at == due


def test_batch_of_ten_thousand(pinned_conn, pinned_store):
    n = 10_000
    specs = [JobSpec(f"bulk-{i}", due_at=(T0, T0 + 3 * H, T0 + 30 * H, T0 + 5 * DAY)[i % 4], payload={"i": i})
             for i in range(n)]
    before = counts(pinned_conn)
    items = pinned_store.submit_many("t", specs)
    assert len(items) == n
    assert all(i.error is None and i.created for i in items)
    assert len({i.job_id for i in items}) == n
    after = counts(pinned_conn)
    assert after["jobs"] - before["jobs"] == n
    assert (after["due_minutes"], after["due_hours"], after["due_far"]) == (n // 2, n // 4, n // 4)
    # Every job has exactly one due row, at its own run time, on its own shard.
    assert pinned_conn.execute(
        """SELECT count(*) FROM jobs j
             JOIN (SELECT shard, job_id, run_at FROM due_minutes UNION ALL
                   SELECT shard, job_id, run_at FROM due_hours UNION ALL
                   SELECT shard, job_id, run_at FROM due_far) d
               ON d.job_id = j.id AND d.shard = j.shard AND d.run_at = j.run_at""").fetchone()[0] == n
    # Spread over the shards, not piled on one.
    assert pinned_conn.execute("SELECT count(DISTINCT shard) FROM jobs").fetchone()[0] > 200


def test_the_smallest_backoff_base_is_taken(pinned_store):
    """0.01 s, the documented minimum, arrives as a real (a little under 0.01)."""
    sub = pinned_store.submit("t", JobSpec("tiny-backoff", due_at=T0, backoff_base_s=0.01, backoff_cap_s=0.01))
    assert sub.created


def test_a_number_beyond_a_double_is_refused_alone_via_sql(pinned_conn):
    """jsonb keeps 1e400, but no worker's JSON decoder reads it: submit_job
    refuses it (MH400), a batch reports that item alone."""
    huge = Jsonb(None, dumps=lambda _: '{"n": [1, {"x": -1e400}]}')
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        pinned_conn.execute("SELECT submit_job(p_team => 't', p_name => 'job', p_payload => %s)", (huge,))
    assert err.value.sqlstate == "MH400" and "beyond a double" in err.value.diag.message_primary
    assert counts(pinned_conn) == before
    items = pinned_conn.execute(
        """SELECT idx, job_id, error FROM submit_jobs(p_team => 't', p_names => ARRAY['a', 'b'],
                                                      p_payloads => ARRAY[%s::jsonb, '{"x": 1e300}'::jsonb])
            ORDER BY idx""", (huge,)).fetchall()
    assert items[0][1] is None and "beyond a double" in items[0][2]
    assert items[1][1] is not None and items[1][2] is None
    assert counts(pinned_conn)["jobs"] == before["jobs"] + 1
