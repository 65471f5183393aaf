"""Concurrent claimers and competing dispatchers against a real PostgreSQL.

* 20,000 due jobs, 8 connections claiming from every shard at once under one
  owner's leases: each job is handed out exactly once, and nothing is left.
* Two dispatchers: B gets none of A's shards while A's lease runs; once it
  lapses (pinned clock advanced) B takes them with a higher epoch, and A's
  claims with the old epoch are refused (fencing).
"""
from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from minutehand.store.errors import StaleLease
from minutehand.store.submit import JobSpec
from tests.support import T0, claim, lease_all, make_store, on_citus, pin

TEAM = "racers"
N_JOBS = 20_000
# On Citus every claim_due is a statement through the coordinator, and eight
# claimers walk 256 shards each: with 20,000 jobs the test took minutes there.
# 4,000 still leave each shard several claims for the claimers to race for.
N_JOBS_CITUS = 4_000
N_CLAIMERS = 8
S = dt.timedelta(seconds=1)


def run_threads(n: int, target: Callable[[int], object]) -> list:
    """Run target(i) in n threads started together; their results, or the first error raised."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a claimer hung"
    if errors:
        raise errors[0]
    return results


def submit_due_jobs(dsn: str, n: int) -> set[int]:
    """n jobs due by T0, over the previous and the current minute bucket, mixed priorities."""
    ids: set[int] = set()
    store = make_store(dsn, clock=T0 - 60 * S)
    try:
        store.create_team(TEAM)
        for clock in (T0 - 60 * S, T0):
            store.clock = clock
            for start in range(0, n // 2, 2000):
                batch = [JobSpec(name=f"job-{start + i}", due_at=clock - (i % 50) * S, priority=i % 7 - 3,
                                 strict=(i % 11 == 0))
                         for i in range(2000)]
                items = store.submit_many(TEAM, batch)
                assert all(it.error is None and it.created for it in items)
                ids.update(it.job_id for it in items)
    finally:
        store.close()
    assert len(ids) == n
    return ids


# ---------------------------------------------------------------- many claimers

def _claim_with_stores(dsn: str, leases: dict[int, int]) -> Callable[[int], list[int]]:
    def claimer(i: int) -> list[int]:
        store = make_store(dsn, clock=T0, max_size=1)
        got: list[int] = []
        try:
            while True:
                jobs = claim(store, leases, 10, "d1", 300, worker=f"w{i}").jobs
                if not jobs:
                    return got
                got.extend(j.job_id for j in jobs)
        finally:
            store.close()
    return claimer


def _claim_with_raw_connections(dsn: str, leases: dict[int, int]) -> Callable[[int], list[int]]:
    """Each connection walks the shards in its own random order, one claim_due per statement."""
    def claimer(i: int) -> list[int]:
        got: list[int] = []
        order = list(leases)
        random.Random(i).shuffle(order)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pin(conn, T0)
            while True:
                before = len(got)
                for shard in order:
                    rows = conn.execute("SELECT job_id FROM claim_due(%s, 7, 'd1', %s, 300, %s)",
                                        (shard, leases[shard], f"w{i}"), prepare=True).fetchall()
                    got.extend(r[0] for r in rows)
                if len(got) == before:
                    return got
    return claimer


@pytest.mark.parametrize("how", ["store", "raw"])
def test_concurrent_claimers_take_every_job_exactly_once(db_dsn, db, how):
    n = N_JOBS_CITUS if on_citus(db) else N_JOBS
    ids = submit_due_jobs(db_dsn, n)
    store = make_store(db_dsn, clock=T0, max_size=1)
    try:
        leases = lease_all(store, "d1")
    finally:
        store.close()
    assert len(leases) == 256

    make = _claim_with_stores if how == "store" else _claim_with_raw_connections
    per_claimer = run_threads(N_CLAIMERS, make(db_dsn, leases))

    claimed = [job_id for got in per_claimer for job_id in got]
    assert len(claimed) == n                           # no job handed out twice ...
    assert set(claimed) == ids                         # ... and every job handed out
    assert sum(1 for got in per_claimer if got) >= 2   # the claimers really did compete
    pin(db, T0)
    assert db.execute("SELECT count(*) FROM due_minutes").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM due_hours").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM due_far").fetchone()[0] == 0
    rows = db.execute("SELECT state::text, attempts, count(*) FROM jobs GROUP BY 1, 2").fetchall()
    assert rows == [("claimed", 1, n)]
    # each job's claim recorded the claimer that got it
    by_worker = dict(db.execute("SELECT claimed_by, count(*) FROM jobs GROUP BY 1").fetchall())
    assert by_worker == {f"w{i}": len(got) for i, got in enumerate(per_claimer) if got}


# ---------------------------------------------------------------- two dispatchers

@pytest.fixture
def dispatchers(db_dsn):
    """Stores for dispatcher A and B, both at clock T0, and a team with 512 due jobs."""
    a = make_store(db_dsn, clock=T0)
    b = make_store(db_dsn, clock=T0)
    a.create_team(TEAM)
    a.submit_many(TEAM, [JobSpec(name=f"j{i}", due_at=T0 - S) for i in range(512)])
    yield a, b
    a.close()
    b.close()


def refused_shards(store, leases: dict[int, int], owner: str) -> set[int]:
    """Shards on which Store.claim refused `owner`: it reports them in ClaimResult.refused (or, as
    before that was implemented, raises); a refused claim hands out no job."""
    try:
        result = claim(store, leases, 100, owner, 30)
    except (StaleLease, psycopg.Error):
        return set(leases)
    assert result.jobs == []
    return set(result.refused)


def raw_claim(dsn: str, clock: dt.datetime, shard: int, owner: str, epoch: int, limit: int = 100):
    """(job_id, attempt) of each job claimed; a stale lease raises StaleLease
    (claim_due answers it with one row saying why, and claims nothing)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pin(conn, clock)
        rows = conn.execute("SELECT job_id, attempt, refused FROM claim_due(%s, %s, %s, %s, 30)",
                            (shard, limit, owner, epoch)).fetchall()
    if rows and rows[0][2] is not None:
        assert rows == [(None, None, rows[0][2])] and "does not hold a current lease" in rows[0][2]
        raise StaleLease(rows[0][2])
    return [(job_id, attempt) for job_id, attempt, _ in rows]


def stale(claim_call) -> bool:
    try:
        claim_call()
    except StaleLease:
        return True
    return False


def test_a_live_lease_keeps_another_dispatcher_out(db_dsn, db, dispatchers):
    a, b = dispatchers
    a_leases = a.take_leases(range(256), "A", 60)
    assert len(a_leases) == 256
    assert b.take_leases(range(256), "B", 60) == {}          # none granted while A's run
    # B using A's epochs, under its own name or A's, is refused on every shard
    for shard in (0, 17, 255):
        assert stale(lambda: raw_claim(db_dsn, T0, shard, "B", a_leases[shard]))
        assert stale(lambda: raw_claim(db_dsn, T0, shard, "A", a_leases[shard] + 1))
    assert refused_shards(b, {5: a_leases[5], 6: a_leases[6]}, "B") == {5, 6}
    # A renewing before expiry keeps its epochs; B still gets nothing, even just before expiry
    a.clock = b.clock = T0 + 30 * S
    assert a.take_leases(range(256), "A", 60) == a_leases
    b.clock = T0 + 89 * S
    assert b.take_leases(range(256), "B", 60) == {}
    # nothing was claimed by the refused attempts
    assert db.execute("SELECT count(*) FROM jobs WHERE state <> 'scheduled'").fetchone()[0] == 0
    assert len([j for j in claim(a, a_leases, 100, "A", 30).jobs]) == 512


def test_fencing_after_the_lease_lapses(db_dsn, db, dispatchers):
    a, b = dispatchers
    a_leases = a.take_leases(range(256), "A", 60)
    first = claim(a, {s: a_leases[s] for s in range(128)}, 100, "A", 30).jobs   # A works half the shards
    assert first

    # A pauses; its lease runs out; B takes every shard with a higher epoch.
    later = T0 + 61 * S
    a.clock = b.clock = later
    b_leases = b.take_leases(range(256), "B", 60)
    assert set(b_leases) == set(range(256))
    assert all(b_leases[s] > a_leases[s] for s in range(256))
    pin(db, later)
    assert db.execute("SELECT count(DISTINCT owner), min(owner) FROM shards").fetchone() == (1, "B")

    # A wakes up: every claim with its old epoch is refused, nothing changes.
    before = db.execute("SELECT count(*) FROM jobs WHERE state = 'claimed'").fetchone()[0]
    for shard in range(256):
        assert stale(lambda: raw_claim(db_dsn, later, shard, "A", a_leases[shard]))
    assert refused_shards(a, a_leases, "A") == set(range(256))
    # even if A's clock still reads T0 (its view before the pause): the epoch fences it, not the time
    assert stale(lambda: raw_claim(db_dsn, T0, 9, "A", a_leases[9]))
    assert a.take_leases(range(256), "A", 60) == {}           # nor can it take them back
    assert db.execute("SELECT count(*) FROM jobs WHERE state = 'claimed'").fetchone()[0] == before
    # B claims what is left; A's first claims are untouched
    rest = claim(b, b_leases, 100, "B", 30).jobs
    assert len(first) + len(rest) == 512
    assert not {j.job_id for j in first} & {j.job_id for j in rest}
    # B can even claim with A's old name? no: the epoch and the owner must both match
    assert stale(lambda: raw_claim(db_dsn, later, 3, "A", b_leases[3]))


def test_released_lease_is_taken_at_once_with_a_higher_epoch(db_dsn, db, dispatchers):
    a, b = dispatchers
    a_leases = a.take_leases([7, 8], "A", 60)
    a.release_leases({7: a_leases[7]}, "A")
    b_leases = b.take_leases([7, 8], "B", 60)
    assert set(b_leases) == {7}                               # 8 is still A's
    assert b_leases[7] > a_leases[7]
    assert stale(lambda: raw_claim(db_dsn, T0, 7, "A", a_leases[7]))
    a.release_leases({7: a_leases[7]}, "A")                    # a stale holder cannot release it
    assert db.execute("SELECT owner, epoch FROM shards WHERE shard = 7").fetchone() == ("B", b_leases[7])


def test_two_dispatchers_racing_for_the_same_shards_split_them(db_dsn, dispatchers):
    """Both ask for every shard at the same instant: each shard goes to exactly one."""
    a, b = dispatchers
    stores = {"A": a, "B": b}

    def take(i: int) -> dict[int, int]:
        owner = "AB"[i]
        return stores[owner].take_leases(range(256), owner, 60)

    got_a, got_b = run_threads(2, take)
    assert not set(got_a) & set(got_b)
    assert set(got_a) | set(got_b) == set(range(256))


def _waiting_on_locks(db: psycopg.Connection) -> int:
    """Sessions waiting on a lock (on Citus they wait on a worker, and for the
    coordinator on a client read: Citus lists those waits in citus_lock_waits)."""
    if on_citus(db):
        return db.execute("SELECT count(DISTINCT waiting_gpid) FROM citus_lock_waits").fetchone()[0]
    return db.execute("""SELECT count(*) FROM pg_stat_activity
                          WHERE datname = current_database() AND wait_event_type = 'Lock'""").fetchone()[0]


def test_dispatchers_taking_overlapping_shards_in_different_orders_do_not_deadlock(db_dsn, db, dispatchers):
    """A rebalancing dispatcher may ask for its shards in any order. Made deterministic: a third
    session holds shard 128 until A (ascending) and B (descending) both wait for it."""
    a, b = dispatchers
    holder = psycopg.connect(db_dsn)
    holder.execute("SELECT 1 FROM shards WHERE shard = 128 FOR UPDATE")

    def take(i: int) -> dict[int, int]:
        owner, store = ("A", a) if i == 0 else ("B", b)
        order = list(range(256)) if i == 0 else list(reversed(range(256)))
        return store.take_leases(order, owner, 60)

    results: list = [None, None]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = take(i)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while _waiting_on_locks(db) < 2 and not errors:
            assert time.monotonic() < deadline, "the dispatchers never queued on shard 128"
            time.sleep(0.02)
    finally:
        holder.rollback()
        holder.close()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    got_a, got_b = results
    assert not set(got_a) & set(got_b)
    assert set(got_a) | set(got_b) == set(range(256))


def test_claim_with_one_stale_shard_refuses_only_that_shard(db_dsn, db, dispatchers):
    """Store.claim: 'a shard whose lease went stale is refused alone' (ClaimResult.refused)."""
    a, b = dispatchers
    leases = lease_all(a, "A")
    stale = dict(leases)
    stale[200] = leases[200] + 1                         # as if another dispatcher had taken it
    result = claim(a, stale, 100, "A", 30)
    assert set(result.refused) == {200}
    # every job claimed on the other shards is handed back to the caller
    claimed_now = db.execute("SELECT count(*) FROM jobs WHERE state = 'claimed'").fetchone()[0]
    assert len(result.jobs) == claimed_now
