"""Crashes with real processes: a child (tests/crash_claimer.py) does its work
in an explicit transaction and is killed with SIGKILL, before or after its
COMMIT. Both processes pin the same clock. No job may be lost: work killed
before commit is rolled back by the server and is available again at once;
a claim killed after commit is returned when it expires.

The test waits for the server to notice the dead backend (pg_stat_activity)
rather than sleeping a fixed time."""
from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from minutehand.store.submit import JobSpec
from tests.support import T0, claim, lease_all, make_store

pytestmark = pytest.mark.processes

CHILD = Path(__file__).with_name("crash_claimer.py")
TEAM = "crashers"
S = dt.timedelta(seconds=1)
LEASE_S = 30


class Child:
    """The child process: started, read until it sleeps, then killed."""

    def __init__(self, dsn: str, clock: dt.datetime, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(CHILD), dsn, clock.isoformat(), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        while True:
            line = self.proc.stdout.readline()
            if not line:                                   # it died on its own: show why
                self.proc.wait(timeout=10)
                raise AssertionError(f"child exited {self.proc.returncode}: {self.proc.stderr.read()}")
            line = line.rstrip("\n")
            self.lines.append(line)
            if line == "sleeping":
                break
        self.backend_pid = int(self.field("pid")[0])

    def field(self, word: str) -> list[str]:
        for line in self.lines:
            parts = line.split(" ")
            if parts[0] == word:
                return parts[1:]
        raise KeyError(word)

    def ids(self, word: str) -> set[int]:
        n, *rest = self.field(word)
        ids = {int(x) for x in rest[0].split(",")} if rest and rest[0] else set()
        assert len(ids) == int(n)
        return ids

    def kill(self, db: psycopg.Connection) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        assert self.proc.returncode == -signal.SIGKILL
        self.proc.stdout.close()
        self.proc.stderr.close()
        wait_backend_gone(db, self.backend_pid)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_backend_gone(db: psycopg.Connection, pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while db.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} still alive {timeout} s after its client died"
        time.sleep(0.02)


@pytest.fixture
def children():
    started: list[Child] = []

    def start(*args, **kwargs) -> Child:
        child = Child(*args, **kwargs)
        started.append(child)
        return child
    yield start
    for child in started:
        child.cleanup()


@pytest.fixture
def pinned_store(db_dsn):
    """This module's own: on the test's fresh database, clock pinned to T0, team TEAM."""
    # A claim that waits on a lock the (live or dying) child holds fails after 5 s instead of hanging:
    # claims are meant to skip rows other claimers hold, never to wait for them.
    s = make_store(make_conninfo(db_dsn, options="-c lock_timeout=5000"), clock=T0)
    s.create_team(TEAM)
    yield s
    s.close()


def submit_due(store, n: int, due: dt.datetime = T0 - 5 * S) -> set[int]:
    items = store.submit_many(TEAM, [JobSpec(name=f"j{i}", due_at=due) for i in range(n)])
    assert all(it.created for it in items)
    return {it.job_id for it in items}


def lease_arg(leases: dict[int, int]) -> str:
    return ",".join(f"{s}:{e}" for s, e in sorted(leases.items()))


def jobs_by_state(db: psycopg.Connection, ids: set[int]) -> dict[tuple[str, int], int]:
    rows = db.execute("SELECT state::text, attempts, count(*) FROM jobs WHERE id = ANY(%s) GROUP BY 1, 2",
                      (list(ids),)).fetchall()
    return {(state, attempts): n for state, attempts, n in rows}


def due_count(db: psycopg.Connection) -> int:
    return db.execute("SELECT (SELECT count(*) FROM due_minutes) + (SELECT count(*) FROM due_hours)"
                      " + (SELECT count(*) FROM due_far)").fetchone()[0]


# ---------------------------------------------------------------- claims

def test_claimer_killed_before_commit_loses_nothing(db_dsn, db, pinned_store, children):
    ids = submit_due(pinned_store, 300)
    leases = lease_all(pinned_store, "d1")
    child = children(db_dsn, T0, "claim", "d1", lease_arg(leases), "1000", str(LEASE_S))
    taken = child.ids("claimed")
    assert taken == ids                                    # it claimed every job ...
    # ... in a transaction still open: others skip its locked rows, and see nothing changed
    assert claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs == []
    assert jobs_by_state(db, ids) == {("scheduled", 0): 300}

    child.kill(db)

    # the server rolled it back: every job is claimable again at once, as a first attempt
    assert jobs_by_state(db, ids) == {("scheduled", 0): 300}
    assert due_count(db) == 300
    again = claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs
    assert {j.job_id for j in again} == ids and len(again) == 300
    assert {j.attempt for j in again} == {1}
    assert jobs_by_state(db, ids) == {("claimed", 1): 300}
    assert due_count(db) == 0


def test_claimer_killed_before_commit_minutes_later_loses_nothing(db_dsn, db, pinned_store, children):
    """The claimer hung for 3 minutes before it died: its jobs are claimable as soon as it is gone."""
    leases = lease_all(pinned_store, "d1")
    assert claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs == []     # a dispatcher was at work
    ids = submit_due(pinned_store, 100)
    child = children(db_dsn, T0, "claim", "d1", lease_arg(leases), "1000", str(LEASE_S))
    assert child.ids("claimed") == ids
    pinned_store.clock = T0 + 3 * 60 * S
    assert claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs == []     # locked by the live claimer
    child.kill(db)
    assert jobs_by_state(db, ids) == {("scheduled", 0): 100}
    again = claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs
    assert {j.job_id for j in again} == ids


def test_claimer_killed_after_commit_gets_its_jobs_back_on_expiry(db_dsn, db, pinned_store, children):
    ids = submit_due(pinned_store, 300)
    leases = lease_all(pinned_store, "d1")
    child = children(db_dsn, T0, "claim", "d1", lease_arg(leases), "1000", str(LEASE_S), "--commit")
    assert child.ids("claimed") == ids
    child.kill(db)

    # committed: the jobs stay claimed by the dead process until the claim expires
    assert jobs_by_state(db, ids) == {("claimed", 1): 300}
    assert claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs == []
    expiry = db.execute("SELECT min(claim_expires_at), max(claim_expires_at) FROM jobs").fetchone()
    assert expiry == (T0 + LEASE_S * S, T0 + LEASE_S * S)
    pinned_store.clock = T0 + LEASE_S * S - S              # not yet
    assert pinned_store.expire_claims(range(256)) == (0, 0)
    assert jobs_by_state(db, ids) == {("claimed", 1): 300}

    pinned_store.clock = T0 + (LEASE_S + 1) * S            # past claim_expires_at
    assert pinned_store.expire_claims(range(256)) == (300, 0)
    assert jobs_by_state(db, ids) == {("scheduled", 1): 300}
    assert pinned_store.expire_claims(range(256)) == (0, 0)  # returned once, not twice
    again = claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs
    assert {j.job_id for j in again} == ids and len(again) == 300
    assert {j.attempt for j in again} == {2}
    assert due_count(db) == 0


def test_claimer_killed_after_commit_on_its_last_attempt_leaves_jobs_dead(db_dsn, db, pinned_store, children):
    items = pinned_store.submit_many(TEAM, [JobSpec(name=f"once{i}", due_at=T0, max_attempts=1) for i in range(20)])
    ids = {it.job_id for it in items}
    leases = lease_all(pinned_store, "d1")
    child = children(db_dsn, T0, "claim", "d1", lease_arg(leases), "1000", str(LEASE_S), "--commit")
    assert child.ids("claimed") == ids
    child.kill(db)
    pinned_store.clock = T0 + (LEASE_S + 1) * S
    assert pinned_store.expire_claims(range(256)) == (0, 20)
    assert jobs_by_state(db, ids) == {("dead", 1): 20}
    assert due_count(db) == 0
    assert db.execute("SELECT count(*) FROM jobs WHERE last_error LIKE '%%expired%%'").fetchone()[0] == 20


def test_two_claimers_killed_at_once_one_before_one_after_commit(db_dsn, db, pinned_store, children):
    """Disjoint shard sets: the uncommitted half is back at once, the committed half on expiry."""
    ids = submit_due(pinned_store, 400)
    leases = lease_all(pinned_store, "d1")
    low = {s: e for s, e in leases.items() if s < 128}
    high = {s: e for s, e in leases.items() if s >= 128}
    open_child = children(db_dsn, T0, "claim", "d1", lease_arg(low), "1000", str(LEASE_S))
    done_child = children(db_dsn, T0, "claim", "d1", lease_arg(high), "1000", str(LEASE_S), "--commit")
    open_ids, done_ids = open_child.ids("claimed"), done_child.ids("claimed")
    assert open_ids | done_ids == ids and not open_ids & done_ids
    open_child.kill(db)
    done_child.kill(db)
    now = claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs
    assert {j.job_id for j in now} == open_ids
    pinned_store.clock = T0 + (LEASE_S + 1) * S
    returned, dead = pinned_store.expire_claims(range(256))
    # the claims made just now (by the test, at T0) expire too: both halves come back
    assert (returned, dead) == (400, 0)
    again = claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs
    assert {j.job_id for j in again} == ids
    assert {j.job_id: j.attempt for j in again} == {i: 2 for i in ids}


# ---------------------------------------------------------------- submission and maintenance

def test_submitter_killed_before_commit_leaves_no_half_written_job(db_dsn, db, pinned_store, children):
    child = children(db_dsn, T0, "submit", TEAM, "50", (T0 + 10 * S).isoformat())
    ids = child.ids("submitted")
    assert len(ids) == 50
    child.kill(db)
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert due_count(db) == 0

    child = children(db_dsn, T0, "submit", TEAM, "50", (T0 + 10 * S).isoformat(), "--commit")
    ids = child.ids("submitted")
    child.kill(db)
    assert jobs_by_state(db, ids) == {("scheduled", 0): 50}
    assert due_count(db) == 50


@pytest.mark.parametrize("duty", ["cascade", "sweep"])
def test_maintenance_killed_mid_transaction_loses_nothing(db_dsn, db, pinned_store, children, duty):
    if duty == "cascade":
        # due in 3 days: in due_far at T0, cascaded down once the clock is 2 days on
        ids = submit_due(pinned_store, 200, due=T0 + dt.timedelta(days=3))
        later = T0 + dt.timedelta(days=2)
        where = "due_far"
    else:
        # left unclaimed in the bucket of T0, swept forward 31 minutes later
        ids = submit_due(pinned_store, 200)
        later = T0 + 31 * 60 * S
        where = "due_minutes"
    assert db.execute(f"SELECT count(*) FROM {where}").fetchone()[0] == 200

    child = children(db_dsn, later, duty)
    assert int(child.field("moved")[0]) == 200
    # while it holds the wheel, another run of the same duty steps aside at once
    pinned_store.clock = later
    assert (pinned_store.cascade() if duty == "cascade" else pinned_store.sweep()) in ((0, 0), (0, 0.0))
    child.kill(db)

    # rolled back: every row where it was, none lost, none doubled
    assert db.execute(f"SELECT count(*) FROM {where}").fetchone()[0] == 200
    assert due_count(db) == 200
    # and the duty runs again as if nothing happened
    if duty == "cascade":
        assert sum(pinned_store.cascade()) == 200
        assert db.execute("SELECT count(*) FROM due_far").fetchone()[0] == 0
    else:
        assert pinned_store.sweep()[1] == 200
    assert due_count(db) == 200
    rows = db.execute("SELECT count(*), count(DISTINCT job_id) FROM (SELECT job_id FROM due_minutes "
                      "UNION ALL SELECT job_id FROM due_hours UNION ALL SELECT job_id FROM due_far) d").fetchone()
    assert rows == (200, 200)
    if duty == "sweep":
        leases = lease_all(pinned_store, "d1")
        assert {j.job_id for j in claim(pinned_store, leases, 1000, "d1", LEASE_S).jobs} == ids
