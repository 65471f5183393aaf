"""The chain of a repeating series against a real PostgreSQL, on a pinned
clock: each claim of the newest run marks its series, and continue_series
(the dispatcher's duty, sql/functions/chain.sql) creates the next run at the
series' next fire time. Runs once per period, DST in two zones, what an
outage does under each misfire policy, failures, keys, the unique
(series, due time) that no race gets past, and the team's limits applied to
the runs (delayed, never dropped).

The run through a real dispatcher and worker, and SIGKILL of the process
creating the runs, are in tests/test_chain_processes.py."""
from __future__ import annotations

import datetime as dt

import pytest

from minutehand.store import repeat
from minutehand.store.outcomes import Complete
from minutehand.store.records import Repeat
from minutehand.store.submit import JobSpec
from tests.support import T0, claim_all

pytestmark = pytest.mark.reused_db

UTC = dt.timezone.utc
S = dt.timedelta(seconds=1)
MIN = dt.timedelta(minutes=1)
ALL = range(256)


def lease_all(store):
    """The shards of the series there are, for as long as any test's clock
    travels (only those: a claim walks each leased shard's buckets)."""
    with store.connection() as conn:
        shards = [r["shard"] for r in conn.execute("SELECT DISTINCT shard FROM series ORDER BY 1")]
    return store.take_leases(shards, "d1", 90 * 86400)


@pytest.fixture
def store(pinned_store):
    return pinned_store                          # team "t" is there (the reused database's reset keeps it)


def submit(store, spec: Repeat, due_at=None, **kw) -> int:
    return store.submit("t", JobSpec(name="tick", due_at=due_at, repeat=spec, **kw)).series_id


def runs(conn, series_id: int) -> list[tuple]:
    """(due_at, state) of every run of the series, oldest first."""
    return conn.execute("SELECT due_at, state::text FROM jobs WHERE series_id = %s ORDER BY due_at",
                        (series_id,)).fetchall()


def turn(store, leases, at: dt.datetime) -> list:
    """The clock at `at` (the wheel turned to it): every due run claimed,
    then the chain continued."""
    store.clock = at
    store.maintain()
    got = claim_all(store, leases, lease_s=86400)      # claims outlive the clock's travels
    store.continue_series(ALL)
    return got


def test_an_every_s_series_runs_once_per_period_and_keeps_one_run_ahead(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    for k in range(5):
        got = turn(store, leases, T0 + k * MIN)
        assert [j.due_at for j in got] == [T0 + k * MIN]
    rows = runs(pinned_conn, sid)
    assert [r[0] for r in rows] == [T0 + k * MIN for k in range(6)]
    assert [r[1] for r in rows] == ["claimed"] * 5 + ["scheduled"]
    s = pinned_conn.execute("SELECT last_due_at, chain_after FROM series WHERE id = %s", (sid,)).fetchone()
    assert s == (T0 + 5 * MIN, None)


def test_a_run_is_created_when_its_predecessor_is_claimed_not_before(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0 + MIN)
    leases = lease_all(store)
    turn(store, leases, T0)                       # nothing due yet: nothing claimed, nothing created
    assert len(runs(pinned_conn, sid)) == 1
    turn(store, leases, T0 + MIN)
    assert len(runs(pinned_conn, sid)) == 2


def test_a_cron_series_runs_at_each_fire_time(store, pinned_conn):
    sid = submit(store, Repeat(cron="*/15 * * * *"))
    first = dt.datetime(2030, 1, 1, 12, 15, tzinfo=UTC)
    leases = lease_all(store)
    for k in range(4):
        turn(store, leases, first + k * 15 * MIN)
    assert [r[0] for r in runs(pinned_conn, sid)] == [first + k * 15 * MIN for k in range(5)]


@pytest.mark.parametrize("zone, cron, start, expected", [
    # clocks go forward: 02:30 does not exist and fires once, read with the old offset (03:30 new time)
    ("Europe/Berlin", "30 2 * * *", dt.datetime(2030, 3, 29, 12, tzinfo=UTC),
     ["2030-03-30 01:30", "2030-03-31 01:30", "2030-04-01 00:30", "2030-04-02 00:30"]),
    # clocks go back: 02:30 happens twice and fires in each
    ("Europe/Berlin", "30 2 * * *", dt.datetime(2030, 10, 25, 12, tzinfo=UTC),
     ["2030-10-26 00:30", "2030-10-27 00:30", "2030-10-27 01:30", "2030-10-28 01:30"]),
    ("America/New_York", "30 2 * * *", dt.datetime(2030, 3, 9, 12, tzinfo=UTC),
     ["2030-03-10 07:30", "2030-03-11 06:30", "2030-03-12 06:30", "2030-03-13 06:30"]),
    ("America/New_York", "30 1 * * *", dt.datetime(2030, 11, 2, 12, tzinfo=UTC),
     ["2030-11-03 05:30", "2030-11-03 06:30", "2030-11-04 06:30", "2030-11-05 06:30"]),
    # hourly through the hour that repeats: every real hour, none twice, none skipped
    ("Europe/Berlin", "0 * * * *", dt.datetime(2030, 10, 26, 22, 30, tzinfo=UTC),
     ["2030-10-26 23:00", "2030-10-27 00:00", "2030-10-27 01:00", "2030-10-27 02:00"]),
])
def test_dst_as_apscheduler_defines_it(store, pinned_conn, zone, cron, start, expected):
    store.clock = start
    sid = submit(store, Repeat(cron=cron, timezone=zone))
    leases = lease_all(store)
    for _ in range(len(expected) - 1):
        (due,) = pinned_conn.execute("SELECT max(due_at) FROM jobs WHERE series_id = %s", (sid,)).fetchone()
        turn(store, leases, due)
    got = [r[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M") for r in runs(pinned_conn, sid)]
    assert got == expected


def test_a_failed_or_dead_run_does_not_stop_the_chain(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0, max_attempts=1)
    leases = lease_all(store)
    (job,) = turn(store, leases, T0)
    pinned_conn.execute("SELECT * FROM start(%s, %s)", (job.job_id, job.lease_token))
    pinned_conn.execute("SELECT * FROM fail(%s, %s, 'boom')", (job.job_id, job.lease_token))
    assert [r[1] for r in runs(pinned_conn, sid)] == ["dead", "scheduled"]
    turn(store, leases, T0 + MIN)
    assert len(runs(pinned_conn, sid)) == 3


def test_later_runs_carry_no_idempotency_key(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0, idempotency_key="nightly")
    leases = lease_all(store)
    turn(store, leases, T0)
    keys = pinned_conn.execute("SELECT idempotency_key FROM jobs WHERE series_id = %s ORDER BY due_at",
                               (sid,)).fetchall()
    assert keys == [("nightly",), (None,)]


# ---------------------------------------------------------------- outages
def outage(store, pinned_conn, misfire: str) -> tuple[int, list, list]:
    """A series every 60 s runs at T0, then nothing runs for 3 periods and
    a half: what the first claim after it gets, and the series' runs."""
    sid = submit(store, Repeat(every_s=60, misfire=misfire), due_at=T0)
    leases = lease_all(store)
    turn(store, leases, T0)                      # run 0 claimed; run 1 (T0+1m) waits
    back = T0 + 4 * MIN + dt.timedelta(seconds=30)
    got = turn(store, leases, back)
    got += turn(store, leases, back)             # whatever the chain made due at once
    return sid, got, runs(pinned_conn, sid)


def test_outage_run_once_runs_the_waiting_run_once_and_goes_on_at_the_next_fire_time(store, pinned_conn):
    sid, got, rows = outage(store, pinned_conn, "run_once")
    assert [j.due_at for j in got] == [T0 + MIN]          # one run at once: the one that waited
    assert [r[0] for r in rows] == [T0, T0 + MIN, T0 + 5 * MIN]
    assert [r[1] for r in rows] == ["claimed", "claimed", "scheduled"]


def test_outage_skip_drops_the_waiting_run_and_goes_on_at_the_next_fire_time(store, pinned_conn):
    sid, got, rows = outage(store, pinned_conn, "skip")
    assert got == []                                       # nothing runs at once
    assert [r[0] for r in rows] == [T0, T0 + MIN, T0 + 5 * MIN]
    assert [r[1] for r in rows] == ["claimed", "cancelled", "scheduled"]
    (reason,) = pinned_conn.execute("SELECT last_error FROM jobs WHERE series_id = %s AND due_at = %s",
                                    (sid, T0 + MIN)).fetchone()
    assert "misfire skip" in reason
    stats = pinned_conn.execute("SELECT sum(cancelled) FROM team_stats").fetchone()[0]
    assert stats == 1


def test_skip_keeps_a_run_that_is_only_late_within_its_period(store, pinned_conn):
    submit(store, Repeat(every_s=60, misfire="skip"), due_at=T0)
    leases = lease_all(store)
    got = turn(store, leases, T0 + dt.timedelta(seconds=59))
    assert [j.due_at for j in got] == [T0]


def test_a_series_is_not_chained_twice_for_one_mark(store, pinned_conn):
    """Two dispatchers that both read the mark: the second's creation
    finds the mark gone (compare and set) and writes nothing."""
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    store.clock = T0
    claim_all(store, leases)
    (after,) = pinned_conn.execute("SELECT chain_after FROM series WHERE id = %s", (sid,)).fetchone()
    shard = sid & 1023
    for _ in range(2):
        pinned_conn.execute("SELECT * FROM chain_series(%s, %s, %s, %s, %s)",
                            (shard, [sid], [after], [T0 + MIN], [None]))
    assert [r[0] for r in runs(pinned_conn, sid)] == [T0, T0 + MIN]


def test_a_run_already_at_that_time_keeps_its_place(store, pinned_conn):
    """A run cancelled at a fire time blocks that time for good; the chain
    moves on to the fire time after it instead of stopping."""
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    turn(store, leases, T0)
    (waiting,) = pinned_conn.execute("SELECT last_job_id FROM series WHERE id = %s", (sid,)).fetchone()
    pinned_conn.execute("SELECT * FROM cancel(%s, 't')", (waiting,))
    # as if the series had been marked again from T0 (a resume, a new spec)
    pinned_conn.execute("UPDATE series SET chain_after = %s WHERE id = %s", (T0, sid))
    store.continue_series(ALL)                   # T0+1m is taken: the mark moves to it
    assert len(runs(pinned_conn, sid)) == 2
    store.clock = T0 + MIN                       # and is read again when that time comes
    store.continue_series(ALL)
    assert [r[0] for r in runs(pinned_conn, sid)] == [T0, T0 + MIN, T0 + 2 * MIN]


def test_a_series_with_no_fire_time_within_the_horizon_is_looked_at_again_in_a_day(store, pinned_conn):
    store.clock = dt.datetime(2032, 2, 28, tzinfo=UTC)
    sid = submit(store, Repeat(cron="0 0 29 2 *"))               # 2032-02-29, then 2036
    leases = lease_all(store)
    turn(store, leases, dt.datetime(2032, 2, 29, tzinfo=UTC))
    assert len(runs(pinned_conn, sid)) == 1
    (after,) = pinned_conn.execute("SELECT chain_after FROM series WHERE id = %s", (sid,)).fetchone()
    assert after == dt.datetime(2032, 3, 1, tzinfo=UTC)


# ---------------------------------------------------------------- fire times
def test_next_fire_never_returns_a_time_at_or_before_after():
    spec = Repeat(cron="*/30 * * * *", timezone="Europe/Berlin")
    t = dt.datetime(2030, 10, 26, 23, 0, tzinfo=UTC)
    seen = []
    for _ in range(8):
        t = repeat.next_fire(spec, t, t, t)
        seen.append(t)
    assert seen == [dt.datetime(2030, 10, 26, 23, 30, tzinfo=UTC) + k * 30 * MIN for k in range(8)]


def test_every_s_fire_times_count_from_the_first_run():
    spec = Repeat(every_s=90)
    assert repeat.next_fire(spec, T0, T0 + dt.timedelta(seconds=100), T0) == T0 + dt.timedelta(seconds=180)
    assert repeat.next_fire(spec, T0, T0 - MIN, T0) == T0


# ---------------------------------------------------------------- control, through the chain
def test_pause_and_resume_through_the_chain(store, pinned_conn):
    """Paused: the waiting run is cancelled and no run follows a claim;
    resumed: the next run is the first fire time after now (no catch-up)."""
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    (started,) = turn(store, leases, T0)                   # run 0 claimed: run 1 (T0+1m) waits
    pinned_conn.execute("SELECT * FROM start(%s, %s)", (started.job_id, started.lease_token))
    store.pause_series("t", sid)
    turn(store, leases, T0 + 3 * MIN)
    assert [r[1] for r in runs(pinned_conn, sid)] == ["running", "cancelled"]
    store.clock = T0 + 3 * MIN + dt.timedelta(seconds=10)
    store.resume_series("t", sid)
    store.continue_series(ALL)
    assert [r[0] for r in runs(pinned_conn, sid)] == [T0, T0 + MIN, T0 + 4 * MIN]
    turn(store, leases, T0 + 4 * MIN)
    assert len(runs(pinned_conn, sid)) == 4


def test_a_new_spec_takes_effect_from_the_next_run_and_leaves_a_started_one_alone(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    (started,) = turn(store, leases, T0)
    pinned_conn.execute("SELECT * FROM start(%s, %s)", (started.job_id, started.lease_token))
    store.change_series("t", sid, Repeat(cron="*/10 * * * *"))
    store.continue_series(ALL)
    rows = runs(pinned_conn, sid)
    assert [r[1] for r in rows] == ["running", "cancelled", "scheduled"]
    assert rows[2][0] == dt.datetime(2030, 1, 1, 12, 10, tzinfo=UTC)


def test_a_cancelled_series_makes_no_further_run_even_if_its_mark_was_read(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    store.clock = T0
    claim_all(store, leases)
    (after,) = pinned_conn.execute("SELECT chain_after FROM series WHERE id = %s", (sid,)).fetchone()
    store.cancel_series("t", sid)
    pinned_conn.execute("SELECT * FROM chain_series(%s, %s, %s, %s, %s)",
                        (sid & 1023, [sid], [after], [T0 + MIN], [None]))
    assert len(runs(pinned_conn, sid)) == 1


def test_cancelling_a_waiting_run_skips_one_occurrence_not_the_series(store, pinned_conn):
    sid = submit(store, Repeat(every_s=60), due_at=T0)
    leases = lease_all(store)
    turn(store, leases, T0)
    (waiting,) = pinned_conn.execute("SELECT last_job_id FROM series WHERE id = %s", (sid,)).fetchone()
    assert pinned_conn.execute("SELECT ok FROM cancel(%s, 't')", (waiting,)).fetchone() == (True,)
    turn(store, leases, T0 + MIN)                    # the cancelled run's time: the chain goes on from it
    rows = runs(pinned_conn, sid)
    assert [(r[0], r[1]) for r in rows] == [(T0, "claimed"), (T0 + MIN, "cancelled"), (T0 + 2 * MIN, "scheduled")]


def test_skip_drops_even_the_first_run_once_the_next_fire_time_came(store, pinned_conn):
    sid = submit(store, Repeat(cron="*/5 * * * *", misfire="skip"))       # first fire 12:05, deadline 12:10
    leases = lease_all(store)
    got = turn(store, leases, dt.datetime(2030, 1, 1, 12, 12, tzinfo=UTC))
    assert got == []
    rows = runs(pinned_conn, sid)
    assert [(r[0].astimezone(UTC).strftime("%H:%M"), r[1]) for r in rows] == [("12:05", "cancelled"),
                                                                              ("12:15", "scheduled")]


# ---------------------------------------------------------------- the team's limits
def limit(conn, *, rate: float | None = None, burst: int | None = None, max_pending: int | None = None) -> None:
    conn.execute("UPDATE teams SET submit_rate = %s, submit_burst = %s, max_pending = %s WHERE name = 't'",
                 (rate, burst, max_pending))


def pending(conn) -> int:
    return conn.execute("SELECT coalesce(sum(pending), 0) FROM team_pending").fetchone()[0]


def test_a_teams_series_together_run_at_its_rate_and_none_is_dropped(store, pinned_conn):
    """20 series every second against a team limited to 0.5 jobs/s: each
    later run takes its token, ahead if need be, and is placed when that
    token comes. Over 40 s the team's later runs start at its rate (1 from
    the burst + 20), none dropped (the misfire-skip ones neither), each
    series still with its waiting run; its submissions wait for the bucket."""
    sids = [submit(store, Repeat(every_s=1, misfire="skip" if i % 2 else "run_once"), due_at=T0) for i in range(20)]
    limit(pinned_conn, rate=0.5, burst=1)
    leases = lease_all(store)
    first = {r[0] for r in pinned_conn.execute("SELECT last_job_id FROM series")}
    later = []
    for k in range(41):
        got = turn(store, leases, T0 + k * S)
        store.complete([Complete(j.job_id, j.lease_token) for j in got])
        later += [j for j in got if j.job_id not in first]
    assert 15 <= len(later) <= 0.5 * 40 + 1, len(later)
    starts = sorted(j.run_at for j in later)
    assert all(b - a >= 2 * S for a, b in zip(starts[1:], starts[2:])), starts      # one token each 2 s
    states = dict(pinned_conn.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1").fetchall())
    assert "cancelled" not in states and states["scheduled"] == len(sids)
    assert pending(pinned_conn) == len(sids)
    admitted = store.admit("t", 1, at_least=1)
    assert (admitted.admitted, admitted.limited_by) == (0, "rate") and admitted.retry_after_s > 10


def test_a_run_over_the_pending_ceiling_is_held_back_then_created_at_its_own_fire_time(store, pinned_conn):
    a, b = (submit(store, Repeat(every_s=60), due_at=T0) for _ in range(2))
    limit(pinned_conn, max_pending=2)
    leases = lease_all(store)
    claimed = {j.job_id: j for j in turn(store, leases, T0)}        # both first runs: the ceiling is reached
    held = "SELECT id, held_due_at, chain_after FROM series ORDER BY id"
    assert pinned_conn.execute(held).fetchall() == [(a, T0 + MIN, T0 + S), (b, T0 + MIN, T0 + S)]
    assert pending(pinned_conn) == 2 and len(runs(pinned_conn, a)) == len(runs(pinned_conn, b)) == 1
    first = {sid: pinned_conn.execute("SELECT last_job_id FROM series WHERE id = %s", (sid,)).fetchone()[0]
             for sid in (a, b)}
    store.complete([Complete(first[a], claimed[first[a]].lease_token)])
    turn(store, leases, T0 + 5 * MIN)                    # room for one: created, due at the fire time held
    made = [sid for sid in (a, b) if len(runs(pinned_conn, sid)) == 2]
    assert len(made) == 1 and pending(pinned_conn) == 2
    (other,) = {a, b} - set(made)
    assert runs(pinned_conn, made[0])[1] == (T0 + MIN, "scheduled")
    assert pinned_conn.execute("SELECT run_at FROM jobs WHERE series_id = %s AND due_at = %s",
                               (made[0], T0 + MIN)).fetchone()[0] == T0 + 5 * MIN
    assert pinned_conn.execute("SELECT held_due_at FROM series WHERE id = %s", (other,)).fetchone()[0] == T0 + MIN
    (still,) = [j for j in first.values()
                if pinned_conn.execute("SELECT state FROM jobs WHERE id = %s", (j,)).fetchone()[0] == "claimed"]
    store.complete([Complete(still, claimed[still].lease_token)])
    # The made run is claimed (its series wants the run after it, due later):
    # the one room goes to the run held longest, due first.
    turn(store, leases, T0 + 6 * MIN)
    assert runs(pinned_conn, other)[1][0] == T0 + MIN and pending(pinned_conn) == 2
    assert pinned_conn.execute("SELECT held_due_at FROM series WHERE id = %s", (made[0],)).fetchone()[0] == \
        T0 + 7 * MIN
    # A pause drops the held run with the series' mark; the resume starts after it.
    store.pause_series("t", made[0])
    assert pinned_conn.execute("SELECT held_due_at, chain_after FROM series WHERE id = %s",
                               (made[0],)).fetchone() == (None, None)
