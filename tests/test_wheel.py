"""The timing wheel as the clock moves: far-future jobs cascade down level by
level into the minute bucket of their run time, passed buckets are swept
forward and emptied with TRUNCATE, a shard whose hand is behind drains its
oldest bucket first, past run times go to the current bucket, concurrent
maintenance neither fails nor duplicates rows, and a cancel takes its job's
row off wherever it waits (a row whose job no longer waits is not carried).

The clock is pinned (make_store(clock=...), store.clock = ...); nothing sleeps."""
from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.store.outcomes import Fail, Release
from minutehand.store.submit import JobSpec
from tests.support import T0, claim, make_store, on_citus, pin, table_of

TEAM = "wheelers"
S = dt.timedelta(seconds=1)
MIN = dt.timedelta(minutes=1)
H = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
LONG_LEASE = 30 * 24 * 3600          # shard leases that outlive every clock a test reaches

WHERE_SQL = """
    SELECT job_id, tableoid::regclass::text, slot, run_at FROM due_minutes WHERE job_id = ANY(%(ids)s)
    UNION ALL SELECT job_id, tableoid::regclass::text, slot, run_at FROM due_hours WHERE job_id = ANY(%(ids)s)
    UNION ALL SELECT job_id, 'due_far', NULL, run_at FROM due_far WHERE job_id = ANY(%(ids)s)"""


# ---------------------------------------------------------------- helpers

@pytest.fixture
def pinned_store(db_dsn):
    """This module's own: on the test's fresh database, clock pinned to T0, team TEAM."""
    s = make_store(db_dsn, clock=T0)
    s.create_team(TEAM)
    yield s
    s.close()


def where(db: psycopg.Connection, ids) -> dict[int, list[str]]:
    """job id -> the tables/partitions holding a due row of it (a list: duplicates show)."""
    out: dict[int, list[str]] = {i: [] for i in ids}
    for job_id, rel, _slot, _run_at in db.execute(WHERE_SQL, {"ids": list(ids)}).fetchall():
        out[job_id].append(table_of(db, rel))
    return out


def due_total(db: psycopg.Connection) -> tuple[int, int]:
    """(rows, distinct jobs) over every level of the wheel."""
    return db.execute("""SELECT count(*), count(DISTINCT job_id) FROM (
        SELECT job_id FROM due_minutes UNION ALL SELECT job_id FROM due_hours
        UNION ALL SELECT job_id FROM due_far) d""").fetchone()


def minute_part(db: psycopg.Connection, t: dt.datetime) -> str:
    return db.execute("SELECT mh_minute_part(mh_minute_slot(%s::timestamptz))", (t,)).fetchone()[0]


def hour_part(db: psycopg.Connection, t: dt.datetime) -> str:
    return db.execute("SELECT mh_hour_part(mh_hour_slot(%s::timestamptz))", (t,)).fetchone()[0]


def bounds(db: psycopg.Connection, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """(mh_minute_end(now), mh_hour_end(now))."""
    return db.execute("SELECT mh_minute_end(%(t)s::timestamptz), mh_hour_end(%(t)s::timestamptz)",
                      {"t": now}).fetchone()


def keys_on_shard(db: psycopg.Connection, shard: int, n: int, prefix: str) -> list[str]:
    """Idempotency keys that put the team's jobs on `shard`."""
    rows = db.execute("""SELECT k FROM generate_series(1, 200000) g, LATERAL (SELECT %(p)s || g AS k) x
                          WHERE mh_key_shard((SELECT id FROM teams WHERE name = %(team)s), k) = %(shard)s
                          LIMIT %(n)s""", {"p": prefix, "team": TEAM, "shard": shard, "n": n}).fetchall()
    assert len(rows) == n
    return [r[0] for r in rows]


def maintain(store) -> None:
    store.cascade()
    store.sweep()


def claim_ids(store, leases, limit: int = 1000) -> list[int]:
    return [j.job_id for j in claim(store, leases, limit, "d1", 30).jobs]


# ---------------------------------------------------------------- far future down to the minute

def test_far_jobs_cascade_down_to_the_minute_bucket_of_their_run_time(db_dsn, db, pinned_store):
    offsets = [0 * S, 17 * MIN + 5 * S, 59 * MIN + 29 * S, H + 29 * S, 5 * H + 42 * MIN,
               6 * H - 30 * S, 6 * H + 59 * MIN, 11 * H + 1 * S]
    due = {T0 + 3 * DAY + o: None for o in offsets}
    for t in due:
        due[t] = pinned_store.submit(TEAM, JobSpec(name="far", due_at=t, strict=True)).job_id
    run_at = {job_id: t for t, job_id in due.items()}
    ids = set(run_at)

    # now: every one in due_far, none on the minute or hour level
    assert all(w == ["due_far"] for w in where(db, ids).values())
    # claims ask the shards of these jobs (no other job exists)
    shards = {r[0] for r in db.execute("SELECT shard FROM jobs").fetchall()}
    leases = pinned_store.take_leases(sorted(shards), "d1", LONG_LEASE)

    # The clock moves by hours, and stops one second before and at each run time.
    # On Citus, where each step's maintenance takes seconds, by 3 hours while
    # every job is more than 12 hours away (a cascade then spans 3 hours).
    last_due, first_due = max(run_at.values()), min(run_at.values())
    far_step = 3 if on_citus(db) else 1
    instants = {T0 + k * H for k in range(1, 200)
                if T0 + k * H <= last_due and (k % far_step == 0 or T0 + k * H >= first_due - 12 * H)}
    instants |= {t - S for t in run_at.values()} | set(run_at.values())
    m_part = {i: minute_part(db, t) for i, t in run_at.items()}
    h_part = {i: hour_part(db, t) for i, t in run_at.items()}
    pending = set(ids)
    hourly_steps = 0
    for clock in sorted(instants):
        hourly_steps += clock in {T0 + k * H for k in range(200)}
        pinned_store.clock = clock
        maintain(pinned_store)
        minute_end, hour_end = bounds(db, clock)
        # none lost, none doubled: one due row per job not yet claimed
        assert due_total(db) == (len(pending), len(pending)), clock
        placed = where(db, pending)
        for job_id in pending:
            t, rels = run_at[job_id], placed[job_id]
            assert len(rels) == 1, (clock, t, rels)
            rel = rels[0]
            # the level its run time belongs to at this clock, and the slot of that level
            if t >= hour_end:
                assert rel == "due_far", (clock, t, rel)
            elif t >= minute_end:
                assert rel == h_part[job_id], (clock, t, rel)
            else:
                assert rel == m_part[job_id], (clock, t, rel)
            if clock >= t - 7 * H:
                assert rel != "due_far", (clock, t, rel)
            if clock >= t - 6 * H:
                assert rel == m_part[job_id], (clock, t, rel)
        # exactly the jobs whose run time has come are claimable: none a second early
        got = claim(pinned_store, leases, 1000, "d1", 30).jobs
        assert {j.job_id for j in got} == {i for i in pending if run_at[i] <= clock}, clock
        for j in got:
            assert j.run_at == run_at[j.job_id] == clock and j.attempt == 1
        pending -= {j.job_id for j in got}
    assert not pending
    assert hourly_steps >= (80 if far_step == 1 else 40)
    assert due_total(db) == (0, 0)


def test_jobs_due_inside_the_hour_level_cascade_to_minutes_in_bulk(db_dsn, db, pinned_store):
    """Hour slots are moved whole, once the minute level's end passes them, and emptied."""
    base = T0 + 20 * H
    specs = [JobSpec(name="h", due_at=base + i * 37 * S) for i in range(500)]   # ~5 h worth
    items = pinned_store.submit_many(TEAM, specs)
    ids = {it.job_id for it in items}
    assert set(r for rels in where(db, ids).values() for r in rels) <= {
        hour_part(db, base + k * H) for k in range(7)}
    for k in range(20):                            # until just before the first is due
        pinned_store.clock = T0 + k * H
        maintain(pinned_store)
        assert due_total(db) == (500, 500)
    placed = db.execute(WHERE_SQL, {"ids": list(ids)}).fetchall()
    for job_id, rel, slot, run_at in placed:
        assert table_of(db, rel) == minute_part(db, run_at)
    assert db.execute("SELECT count(*) FROM due_hours").fetchone()[0] == 0


# ---------------------------------------------------------------- the sweep

def test_sweep_carries_leftovers_forward_and_truncates_the_passed_bucket(db_dsn, db, pinned_store):
    ids = {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="left", due_at=T0) for _ in range(300)])}
    old = minute_part(db, T0)
    assert set(r for rels in where(db, ids).values() for r in rels) == {old}
    node_before = db.execute("SELECT pg_relation_filenode(%s::regclass)", (old,)).fetchone()[0]

    later = T0 + 31 * MIN + 10 * S
    pinned_store.clock = later
    assert pinned_store.sweep()[1] == 300
    cur = minute_part(db, later)
    assert where(db, ids) == {i: [cur] for i in ids}                # carried whole into the current bucket
    assert due_total(db) == (300, 300)
    assert db.execute(f"SELECT count(*) FROM {old}").fetchone()[0] == 0
    node_after, size = db.execute("SELECT pg_relation_filenode(%(r)s::regclass), pg_relation_size(%(r)s::regclass)",
                                  {"r": old}).fetchone()
    assert node_after != node_before                                  # emptied by TRUNCATE, not DELETE
    assert size == 0
    # their run times are kept; the slot is the current one
    assert db.execute("SELECT DISTINCT run_at FROM due_minutes").fetchall() == [(T0,)]
    assert pinned_store.sweep() == (0, 0)                             # once
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    got = claim(pinned_store, leases, 1000, "d1", 30).jobs
    assert {j.job_id for j in got} == ids
    assert {j.run_at for j in got} == {T0}


def test_the_sweep_drops_rows_whose_jobs_no_longer_wait(db_dsn, db, pinned_store):
    """A row left on the wheel for a job that ended (from before cancels took
    their rows, or written around the procedures) is dropped by the sweep,
    not carried forward again; the waiting ones beside it are carried."""
    ids = [it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="left", due_at=T0) for _ in range(30)])]
    stale = db.execute("SELECT to_jsonb(d) FROM due_minutes d WHERE job_id = ANY (%s)", (ids[:10],)).fetchall()
    for job_id in ids[:10]:
        assert pinned_store.cancel(job_id, TEAM).ok
    gone = ids[10:13]
    db.execute("DELETE FROM jobs WHERE id = ANY (%s)", (gone,))                     # as retention would
    db.execute("""INSERT INTO due_minutes SELECT * FROM jsonb_populate_recordset(NULL::due_minutes, %s)""",
               (Jsonb([r[0] for r in stale]),))                                  # the old rows, put back
    assert due_total(db) == (30, 30)
    pinned_store.clock = T0 + 31 * MIN + 10 * S
    assert pinned_store.sweep()[1] == 17
    cur = minute_part(db, pinned_store.clock)
    assert where(db, ids) == {i: [cur] if i in ids[13:] else [] for i in ids}
    pinned_store.clock = T0 + 62 * MIN + 10 * S
    assert pinned_store.sweep()[1] == 17


def test_rows_left_behind_a_stopped_dispatcher_are_not_lost(db_dsn, db, pinned_store):
    """Whatever the hand does, the sweep brings every leftover back within 31 minutes."""
    pinned_store.clock = T0 - 10 * MIN
    ids = {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="x", due_at=T0 - 10 * MIN)] * 40)}
    pinned_store.clock = T0 + 21 * MIN              # 31 minutes after they were due
    maintain(pinned_store)
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    assert set(claim_ids(pinned_store, leases)) == ids


# ---------------------------------------------------------------- the hand

def _old_and_new_on_shard(db, store, shard: int):
    """5 jobs in the bucket 10 minutes back (priority 0) and 5 in the current one (strict,
    priority 100), all on `shard`."""
    keys = keys_on_shard(db, shard, 10, "catchup-")
    store.clock = T0 - 10 * MIN
    old = [store.submit(TEAM, JobSpec(name=f"old{i}", due_at=T0 - 10 * MIN + i * S, idempotency_key=k)).job_id
           for i, k in enumerate(keys[:5])]
    store.clock = T0
    new = [store.submit(TEAM, JobSpec(name=f"new{i}", due_at=T0 - (5 - i) * S, priority=100, strict=True,
                                      idempotency_key=k)).job_id
           for i, k in enumerate(keys[5:])]
    assert {minute_part(db, T0 - 10 * MIN)} == {r for i in old for r in where(db, [i])[i]}
    assert {minute_part(db, T0)} == {r for i in new for r in where(db, [i])[i]}
    return old, new


def test_a_hand_left_behind_drains_its_oldest_bucket_first(db_dsn, db, pinned_store):
    shard = 7
    old, new = _old_and_new_on_shard(db, pinned_store, shard)
    db.execute("UPDATE shards SET hand = %s WHERE shard = %s", (T0.replace(second=0) - 10 * MIN, shard))
    [epoch] = pinned_store.take_leases([shard], "d1", 3600).values()

    first = [j.job_id for j in claim(pinned_store, {shard: epoch}, 3, "d1", 30).jobs]
    assert first == old[:3]                      # the old bucket first, despite lower priority
    rest = [j.job_id for j in claim(pinned_store, {shard: epoch}, 100, "d1", 30).jobs]
    assert rest == old[3:] + new                 # then the rest of it, then the current bucket
    # the dispatcher's next look at the shard moves the hand: one minute behind now
    pin(db, T0)
    db.execute("SELECT * FROM due_edge(%s)", (shard,))
    assert db.execute("SELECT hand FROM shards WHERE shard = %s", (shard,)).fetchone()[0] == \
        T0.replace(second=0) - MIN
    assert claim(pinned_store, {shard: epoch}, 100, "d1", 30).jobs == []


def test_after_a_dispatcher_pause_the_claim_catches_up_from_where_it_stopped(db_dsn, db, pinned_store):
    shard = 7
    [epoch] = pinned_store.take_leases([shard], "d1", 3600).values()
    pinned_store.clock = T0 - 10 * MIN - 20 * S
    assert claim(pinned_store, {shard: epoch}, 100, "d1", 30).jobs == []  # the dispatcher was running
    old, new = _old_and_new_on_shard(db, pinned_store, shard)          # then paused 10 minutes
    pinned_store.clock = T0
    got = [j.job_id for j in claim(pinned_store, {shard: epoch}, 100, "d1", 30).jobs]
    assert got == old + new


# ---------------------------------------------------------------- past run times

def test_a_past_run_time_goes_to_the_current_bucket_and_is_claimed_at_once(db_dsn, db, pinned_store):
    for ago in (2 * H, 5 * MIN, 40 * DAY):
        sub = pinned_store.submit(TEAM, JobSpec(name="late", due_at=T0 - ago))
        assert sub.run_at == T0
        assert where(db, [sub.job_id]) == {sub.job_id: [minute_part(db, T0)]}
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    got = claim(pinned_store, leases, 100, "d1", 30).jobs
    assert len(got) == 3 and {j.run_at for j in got} == {T0}
    assert sorted(j.due_at for j in got) == [T0 - 40 * DAY, T0 - 2 * H, T0 - 5 * MIN]


# ---------------------------------------------------------------- long outages

def test_after_a_30_hour_maintenance_outage_every_overdue_job_is_claimable(db_dsn, db, pinned_store):
    ids = {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="o", due_at=T0 + 10 * H + i * MIN)
                                                        for i in range(30)])}
    assert all(rels[0].startswith("due_h") for rels in where(db, ids).values())
    pinned_store.clock = T0 + 30 * H               # nothing ran for 30 hours
    maintain(pinned_store)
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    assert set(claim_ids(pinned_store, leases)) == ids


def test_the_first_sweep_carries_every_passed_bucket(db_dsn, db, pinned_store):
    """A fresh install: jobs submitted, nothing claimed, maintenance starts 3 hours later."""
    ids = {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="early", due_at=T0)] * 20)}
    pinned_store.clock = T0 + 3 * H
    maintain(pinned_store)
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    assert set(claim_ids(pinned_store, leases)) == ids


def test_the_first_sweep_after_an_8_hour_outage_loses_no_job(db_dsn, db, pinned_store):
    maintain(pinned_store)                            # maintenance ran at T0 ...
    ids = {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="a", due_at=T0 + 10 * S)] * 50)}
    pinned_store.clock = T0 + 8 * H                   # ... then nothing ran for 8 hours
    ids |= {it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="b", due_at=T0 + 8 * H)] * 50)}
    assert due_total(db) == (100, 100)
    maintain(pinned_store)
    assert due_total(db) == (100, 100)
    leases = pinned_store.take_leases(range(256), "d1", 3600)
    assert set(claim_ids(pinned_store, leases)) == ids


# ---------------------------------------------------------------- concurrent maintenance

def test_concurrent_cascades_and_sweeps_neither_fail_nor_duplicate(db_dsn, db, pinned_store):
    items = pinned_store.submit_many(
        TEAM,
        [JobSpec(name="f", due_at=T0 + 3 * DAY + i * 7 * S) for i in range(3000)]      # due_far
        + [JobSpec(name="h", due_at=T0 + 3 * H + i * 11 * S) for i in range(3000)]    # minutes and hours
        + [JobSpec(name="m", due_at=T0 + i * S) for i in range(600)])                 # minutes
    ids = {it.job_id for it in items}
    n = len(ids)
    assert due_total(db) == (n, n)
    maintain(pinned_store)              # maintenance has been running (see the first-sweep test)
    clock = T0 + 6 * H                  # a shorter gap than the outage tests
    minute_end, hour_end = bounds(db, clock)
    to_move = db.execute("SELECT (SELECT count(*) FROM due_far WHERE run_at < %s)"
                         " + (SELECT count(*) FROM due_hours WHERE run_at < %s)", (hour_end, minute_end)).fetchone()[0]
    assert to_move > 3000 - 1500
    stores = [make_store(db_dsn, clock=clock, max_size=1) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []
    results: list = [None] * len(stores)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = stores[i].cascade() if i % 2 == 0 else stores[i].sweep()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for s in stores:
            s.close()
    assert not errors, errors
    assert due_total(db) == (n, n)
    # the cascades together moved what was due to move, once (cascade and sweep share the wheel's
    # lock: a cascade that found a sweep at work stepped aside, and the next run does its part)
    moved = sum(sum(results[i]) for i in (0, 2))
    pinned_store.clock = clock
    moved += sum(pinned_store.cascade())
    assert moved == to_move
    # at the new clock everything sits where it belongs, each row once
    pinned_store.clock = clock
    maintain(pinned_store)
    minute_end, hour_end = bounds(db, clock)
    for job_id, rel, _slot, run_at in db.execute(WHERE_SQL, {"ids": list(ids)}).fetchall():
        rel = table_of(db, rel)
        if run_at >= hour_end:
            assert rel == "due_far"
        elif run_at >= minute_end:
            assert rel == hour_part(db, run_at)
        else:
            assert rel.startswith("due_m")
    assert due_total(db) == (n, n)

    # claims racing cascades and sweeps (run 40 minutes later) take each due job once
    leases = pinned_store.take_leases(range(256), "d1", LONG_LEASE)
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        s = make_store(db_dsn, clock=clock, max_size=1)
        try:
            while batch := [j.job_id for j in claim(s, leases, 50, "d1", 30).jobs]:
                with lock:
                    claimed.extend(batch)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            s.close()

    def maint(kind: str) -> None:
        s = make_store(db_dsn, clock=clock + 40 * MIN, max_size=1)
        try:
            for _ in range(3):
                s.cascade() if kind == "cascade" else s.sweep()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=claimer) for _ in range(3)] + \
              [threading.Thread(target=maint, args=(k,)) for k in ("cascade", "sweep")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(claimed) == len(set(claimed))
    assert due_total(db) == (n - len(claimed),) * 2
    # whatever the sweep carried forward meanwhile is still there to claim, 40 minutes on, by a
    # dispatcher whose hand stayed where the claimers stopped (set by hand: see the catch-up xfail)
    pinned_store.clock = clock + 40 * MIN
    maintain(pinned_store)
    db.execute("UPDATE shards SET hand = %s", (clock.replace(second=0),))
    rest: list[int] = []
    while more := claim_ids(pinned_store, leases, 1000):
        rest += more
    everything = claimed + rest
    assert len(everything) == len(set(everything))
    due_by_then = db.execute("SELECT count(*) FROM jobs WHERE run_at <= %s", (pinned_store.clock,)).fetchone()[0]
    assert len(everything) == due_by_then
    assert due_total(db) == (n - len(everything),) * 2


# ---------------------------------------------------------------- cancel

# Where a job's row waits when it is cancelled: its due time from T0, the
# clock moves before the cancel (maintenance at each), and the level then.
WAITS = {
    "due now": (0 * S, [], "due_m"),
    "later today": (3 * H, [], "due_m"),
    "tomorrow": (30 * H, [], "due_h"),
    "next week": (7 * DAY, [], "due_far"),
    "cascaded into the hours": (4 * DAY, [2 * DAY], "due_h"),
    "cascaded into the minutes": (4 * DAY, [2 * DAY, 4 * DAY - 2 * H], "due_m"),
    "hours into minutes": (20 * H, [15 * H], "due_m"),
    "carried forward": (0 * S, [45 * MIN], "due_m"),
    "carried forward twice": (0 * S, [45 * MIN, 80 * MIN], "due_m"),
}


@pytest.mark.parametrize("case", WAITS)
def test_a_cancel_takes_the_row_off_wherever_it_waits(db_dsn, db, pinned_store, case):
    """Only the cancelled job's row goes: its neighbours (same run time, on
    its shard and others) stay where they are."""
    due, moves, level = WAITS[case]
    keys = keys_on_shard(db, 7, 12, "unwheel-")
    ids = [it.job_id for it in pinned_store.submit_many(
        TEAM, [JobSpec(name="w", due_at=T0 + due, strict=True, idempotency_key=k) for k in keys]
        + [JobSpec(name="w", due_at=T0 + due, strict=True)] * 12)]
    for move in moves:
        pinned_store.clock = T0 + move
        maintain(pinned_store)
    before = where(db, ids)
    assert all(rels and rels[0].startswith(level) for rels in before.values()), before
    for job_id in ids[:3] + ids[12:15]:
        assert pinned_store.cancel(job_id, TEAM).ok
    assert where(db, ids) == {i: [] if i in ids[:3] + ids[12:15] else before[i] for i in ids}


@pytest.mark.parametrize("back", ["released", "retrying"])
def test_a_cancel_takes_the_row_of_a_job_put_back(db_dsn, db, pinned_store, back):
    """Given back (its old run time, in the bucket it was given back in) or
    failed (due again after its backoff)."""
    ids = [it.job_id for it in pinned_store.submit_many(TEAM, [JobSpec(name="b", due_at=T0)] * 5)]
    pinned_store.clock = T0 + 5 * MIN
    leases = pinned_store.take_leases(range(256), "d1", LONG_LEASE)
    got = claim(pinned_store, leases, 100, "d1", 600).jobs
    assert {j.job_id for j in got} == set(ids)
    pinned_store.clock = T0 + 7 * MIN
    if back == "released":
        assert all(o.ok for o in pinned_store.release([Release(j.job_id, j.lease_token) for j in got]))
        assert set(where(db, ids)[ids[0]]) == {minute_part(db, T0 + 7 * MIN)}
    else:
        assert all(o.ok for o in pinned_store.fail([Fail(j.job_id, j.lease_token, "again", True) for j in got]))
    pinned_store.clock = T0 + 9 * MIN
    assert pinned_store.cancel(ids[0], TEAM).ok
    assert where(db, ids)[ids[0]] == []
    assert all(len(rels) == 1 for i, rels in where(db, ids).items() if i != ids[0])
