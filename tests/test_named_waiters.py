"""Workers that take only some job names, behind many idle long-polls of
other names: the dispatcher knows, per shard, the job names its due rows
may have (due_edges, and the wake-ups of bulk submissions), so a due job
reaches a worker of its name without rounds that look for the others."""
from __future__ import annotations

import asyncio
import datetime as dt
import time

import psycopg
import pytest

from minutehand.dispatch import dispatcher
from minutehand.dispatch.fairness import DueIndex
from minutehand.store.submit import JobSpec
from tests.support import T0, UTC, make_store, skip_on_citus, started_dispatcher

IDLE = 1000


# ---------------------------------------------------------------- what the dispatcher keeps
def test_names_are_replaced_by_a_read_added_to_by_arrivals_and_unknown_absorbs():
    index = DueIndex()
    cell = ((0.0, False, 0), 1)
    index.set_shard(3, {cell: [1, 0.0]}, 32, {"a"})
    assert index.may_hold(3, ("a", "z")) and not index.may_hold(3, ("b",))
    index.add_to_shard(3, {cell: [1, 0.0]}, names={"b"})
    assert index.may_hold(3, ("b",)) and not index.may_hold(3, ("c",))
    index.add_to_shard(3, {cell: [1, 0.0]}, names=None)           # a wake-up that could not name them
    assert index.may_hold(3, ("c",))
    index.set_shard(3, {cell: [1, 0.0]}, 32, {"c"})                 # a whole read: what is due now
    assert not index.may_hold(3, ("a",)) and index.may_hold(3, ("c",))
    index.add_to_shard(4, {cell: [1, 0.0]}, names={"d"})            # a shard never read: its arrivals only
    by_name, unknown = index.holders([3, 4])
    assert dict(by_name) == {"c": [3], "d": [4]} and unknown == []
    index.add_to_shard(4, {cell: [1, 0.0]}, names={f"n{i}" for i in range(100)})
    assert index.holders([4])[1] == [4]                             # past NAMES_PER_SHARD: unknown


def test_a_wake_up_names_its_rows_job_names():
    shards: set[int] = set()
    names: dict[int, set[str]] = {}
    cells = dispatcher._parse_wake_up("@60/5,7/0/0/1/2/100,9,7=a.b:c/d+e-f_g,9=h", shards, names)
    assert cells == {7: {((60.0, False, 0), 1): [2, 60.1]}}
    assert shards == {9} and names == {7: {"a.b:c/d", "e-f_g"}, 9: {"h"}}


# ---------------------------------------------------------------- what the database says
def test_due_edges_name_the_job_names_of_the_rows_they_counted(db_dsn, db):
    """Every cell names the job names of its due rows; a cell counted up
    to the cap, or with more names than mh_edge_names(), names none
    (unknown)."""
    s = make_store(db_dsn, clock=T0)
    s.create_team("t")
    try:
        items = s.submit_many("t", [JobSpec(name=f"n{i % 3}", due_at=T0 - dt.timedelta(seconds=5)) for i in range(60)])
    finally:
        s.close()
    assert all(i.error is None for i in items)
    db.execute("SELECT set_config('minutehand.now', %s, false)", (T0.isoformat(),))
    want = {}
    for shard, name in db.execute("SELECT shard, name FROM jobs"):
        want.setdefault(shard, set()).add(name)
    shards = list(range(256))
    got: dict[int, set[str] | None] = {}
    capped: dict[int, set[str] | None] = {}
    for cap, into in ((32, got), (2, capped)):
        for shard, due, names in db.execute("SELECT shard, due, names FROM due_edges(%s, %s, %s) "
                                            "WHERE team_id IS NOT NULL", (shards, [None] * 256, cap)):
            known = into.get(shard, set())
            into[shard] = None if known is None or names is None else known | set(names)
    assert got == want
    # Capped at two rows a cell: a cell of one row names it; one counted up to the cap is unknown.
    rows = dict(db.execute("SELECT shard, count(*) FROM due_minutes GROUP BY shard").fetchall())
    assert capped == {sh: (want[sh] if rows[sh] == 1 else None) for sh in want}

    # More distinct names in a cell than mh_edge_names(): unknown.
    limit = db.execute("SELECT mh_edge_names()").fetchone()[0]
    shard = next(iter(want))
    db.execute("""INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at,
                                    state, max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at,
                                    agreed_at)
                  SELECT %(s)s, -g, t.id, 'many' || g, '{}', 0, %(t)s, 0, false, %(t)s, 'scheduled', 3, 1, 60,
                         %(t)s, %(t)s, %(t)s
                    FROM generate_series(1, %(n)s) g, teams t WHERE t.name = 't'""",
               {"s": shard, "t": T0 - dt.timedelta(seconds=1), "n": limit + 1})
    db.execute("""INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
                  SELECT mh_minute_slot(%(t)s), %(s)s, false, 0, %(t)s, -g, t.id
                    FROM generate_series(1, %(n)s) g, teams t WHERE t.name = 't'""",
               {"s": shard, "t": T0 - dt.timedelta(seconds=1), "n": limit + 1})
    names = [r[0] for r in db.execute("SELECT names FROM due_edges(%s, %s, 1000) WHERE team_id IS NOT NULL",
                                      ([shard], [None]))]
    assert names == [None]


# ---------------------------------------------------------------- through the dispatcher
def _watch_claims(s) -> list[tuple[float, tuple | None]]:
    """Every claim request the dispatcher sends: (when, its job names)."""
    seen: list[tuple[float, tuple | None]] = []
    claim = s.claim

    def counting(requests, *a, **kw):
        now = time.monotonic()
        seen.extend((now, None if r.names is None else tuple(r.names)) for r in requests)
        return claim(requests, *a, **kw)
    s.claim = counting
    return seen


async def _behind_idle_polls(d, s, submit, idle: int = IDLE, wait_s: float = 30.0):
    """`idle` long-polls each for a name with nothing due, and one for "x";
    then `submit()` (in a thread); what the "x" poll got and when (s after
    the submit), and the run time of the job it submitted."""
    polls = [asyncio.ensure_future(d.lease(f"idle{i}", 5, [f"idle-{i}"], wait_s)) for i in range(idle)]
    await asyncio.sleep(1.0)                       # every poll waits, the first reads are done
    eager = asyncio.ensure_future(d.lease("eager", 1, ["x"], wait_s))
    await asyncio.sleep(0.2)
    run_at = await asyncio.to_thread(submit)
    got = await eager
    took = time.time() - run_at.timestamp()
    d.close_polls()
    await asyncio.gather(*polls)
    return got, took, run_at


def _delivered_once(db_dsn: str, job_id: int) -> None:
    with psycopg.connect(db_dsn) as conn:
        state, attempts = conn.execute("SELECT state, attempts FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert (state, attempts) == ("claimed", 1)


def _no_probe_of_idle_filters(seen: list) -> None:
    probed = [names for _, names in seen if names != ("x",)]
    assert probed == [], f"{len(probed)} claims for idle filters, e.g. {probed[:3]}"


@pytest.mark.parametrize("bulk", [False, True], ids=["single", "batch"])
def test_a_job_due_now_reaches_its_worker_past_a_thousand_idle_named_polls(db_dsn, db, bulk):
    """1,000 workers wait for names with nothing due (and rows of another
    name keep shards due); a job of "x" submitted due now (alone: its
    wake-up names the shard, which is read; in a batch: its wake-up counts
    it with its name) goes to the "x" worker, once, and no claim looks for
    the idle workers' names (before, each round tried 32 of them: seconds
    behind 31, tens behind 500)."""
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    for _ in range(50):                            # rows of a name nobody waits for: shards stay due
        s.submit("t", JobSpec(name="busy", due_at=dt.datetime.now(UTC) - dt.timedelta(seconds=1)))
    d = started_dispatcher(s)
    seen = _watch_claims(s)
    job: list[int] = []

    def submit():
        r = s.submit_many("t", [JobSpec(name="x")])[0] if bulk else s.submit("t", JobSpec(name="x"))
        job.append(r.job_id)
        return r.run_at
    try:
        got, took, _ = asyncio.run(_behind_idle_polls(d, s, submit))
    finally:
        d.stop()
        s.close()
    print(f"\ndue now ({'batch' if bulk else 'single'}), behind {IDLE} idle named polls: delivered {took * 1000:.0f} ms after its run time, "
          f"{len(seen)} claim requests in all")
    assert [int(j.job_id) for j in got] == job
    _delivered_once(db_dsn, job[0])
    _no_probe_of_idle_filters(seen)


def test_a_job_coming_due_by_its_run_time_reaches_its_worker_past_idle_polls(db_dsn, db):
    """The job is submitted for 3 s later: it comes due by the clock (the
    dispatcher reads what came due since, with its names) and goes to the
    "x" worker with no claim for the idle names."""
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    d = started_dispatcher(s)
    seen = _watch_claims(s)
    job: list[int] = []

    def submit():
        r = s.submit("t", JobSpec(name="x", due_at=dt.datetime.now(UTC) + dt.timedelta(seconds=3), strict=True))
        job.append(r.job_id)
        return r.run_at
    try:
        got, took, _ = asyncio.run(_behind_idle_polls(d, s, submit))
    finally:
        d.stop()
        s.close()
    print(f"\ndue by its run time, behind {IDLE} idle named polls: delivered {took * 1000:.0f} ms after it")
    assert [int(j.job_id) for j in got] == job
    _delivered_once(db_dsn, job[0])
    _no_probe_of_idle_filters(seen)


def test_a_job_due_as_the_minute_turns_reaches_its_worker_past_idle_polls(db_dsn, db):
    """The job waits in the next minute's bucket, due as that minute
    begins (up to a minute's wait): the minute turning reads every shard
    again, and the job goes to the "x" worker with no claim for the idle
    names."""
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    d = started_dispatcher(s)
    seen = _watch_claims(s)
    job: list[int] = []

    def submit():
        now = dt.datetime.now(UTC)
        turn = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        if (turn - now).total_seconds() < 5:       # not already in the turn's reads
            turn += dt.timedelta(minutes=1)
        r = s.submit("t", JobSpec(name="x", due_at=turn, strict=True))
        job.append(r.job_id)
        return r.run_at
    try:
        got, took, run_at = asyncio.run(_behind_idle_polls(d, s, submit, idle=200, wait_s=130.0))
    finally:
        d.stop()
        s.close()
    print(f"\ndue as the minute turned ({run_at:%H:%M:%S}), behind 200 idle named polls: "
          f"delivered {took * 1000:.0f} ms after it")
    assert [int(j.job_id) for j in got] == job
    _delivered_once(db_dsn, job[0])
    _no_probe_of_idle_filters(seen)


def test_a_job_whose_names_the_wake_up_could_not_carry_still_reaches_its_worker(db_dsn, db):
    """A bulk submission whose wake-up would be too long with its names
    (long names over every shard) counts its rows without them: the
    dispatcher does not know the names there, looks as it did before, and
    the "x" job still goes to its worker, once."""
    # (Where names are unknown a filter probes shard by shard: it took over 90 s there.)
    skip_on_citus(db, "a filter probing 256 shards one by one through the Citus coordinator takes minutes")
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    d = started_dispatcher(s)
    job: list[int] = []
    payloads: list[str] = []

    def submit():
        with psycopg.connect(db_dsn, autocommit=True) as listener:
            listener.execute(f"LISTEN {dispatcher.CHANNEL}")
            due = dt.datetime.now(UTC) - dt.timedelta(seconds=1)
            items = s.submit_many("t", [JobSpec(name="x", due_at=due)]
                                  + [JobSpec(name=f"filler-{'n' * 150}-{i}", due_at=due) for i in range(600)])
            payloads.extend(n.payload for n in listener.notifies(timeout=0.5))
        job.append(items[0].job_id)
        return due
    try:
        got, took, _ = asyncio.run(_behind_idle_polls(d, s, submit, idle=50, wait_s=90.0))
    finally:
        d.stop()
        s.close()
    print(f"\nnames unknown, behind 50 idle named polls: delivered {took * 1000:.0f} ms after its run time")
    assert [int(j.job_id) for j in got] == job
    _delivered_once(db_dsn, job[0])
    names: dict[int, set[str]] = {}
    counted = [dispatcher._parse_wake_up(p, set(), names) for p in payloads]
    assert any(counted) and names == {}            # counted, and no names: unknown
