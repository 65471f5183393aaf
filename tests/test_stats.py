"""Truthful lateness and exact counters, against a real PostgreSQL with the
clock pinned: the status record's due / agreed / start / lateness for
strict, flexible and overdue waiting jobs; team_running and team_stats
after a mixed run of claims, starts, completions, failures, releases,
expiries and cancels, compared with a recount of the jobs table; two
concurrent batches over the same counter rows; a team's first 50 names kept
apart, never more under concurrent batches; the roll-up into hour rows,
the window and retention."""
from __future__ import annotations

import datetime as dt
import random
import threading

import psycopg
import pytest

from minutehand.store.outcomes import Complete, Fail, Release, Start
from minutehand.store.stats import STATS_BOUNDS_S, quantile_bound
from minutehand.store.submit import JobSpec
from tests.support import T0, claim, lease_all, pin

pytestmark = pytest.mark.reused_db

S = dt.timedelta(seconds=1)
H = dt.timedelta(hours=1)
BUCKETS = len(STATS_BOUNDS_S) + 1


def claim_due(store, lease_s: float = 30):
    """Every due job, claimed from the shards holding waiting jobs only: on
    Citus a claim is a statement per shard, and most of the 256 are empty."""
    with store.connection() as c:
        waiting = {r["shard"] for r in c.execute(
            "SELECT DISTINCT shard FROM jobs WHERE state IN ('scheduled', 'retrying')")}
    return claim(store, {s: e for s, e in lease_all(store).items() if s in waiting}, 1000, "d1", lease_s).jobs


def running_recount(conn) -> tuple[set, set]:
    kept = {r for r in conn.execute("SELECT shard, team_id, running FROM team_running WHERE running > 0")}
    actual = {r for r in conn.execute("SELECT shard, team_id, count(*) FROM jobs "
                                      "WHERE state IN ('claimed', 'running') GROUP BY 1, 2")}
    return kept, actual


def stats_by_name(conn) -> dict:
    """team_stats added up per (team, name), every row whatever its window."""
    rows = conn.execute("""
        SELECT t.name, s.name, sum(s.submitted), sum(s.started), sum(s.succeeded), sum(s.failed), sum(s.dead),
               sum(s.cancelled), mh_hist_sum(array_agg(s.lateness_hist)), mh_hist_sum(array_agg(s.runtime_hist))
          FROM team_stats s JOIN teams t ON t.id = s.team_id GROUP BY 1, 2""").fetchall()
    return {(r[0], r[1]): (*map(int, r[2:8]), list(r[8]), list(r[9])) for r in rows}


def jobs_recount(conn, failed: dict) -> dict:
    """The same numbers from the jobs themselves (failed: retried failures, as the run counted them)."""
    rows = conn.execute("""
        SELECT t.name, j.name, count(*), count(j.started_at),
               count(*) FILTER (WHERE j.state = 'succeeded'), count(*) FILTER (WHERE j.state = 'dead'),
               count(*) FILTER (WHERE j.state = 'cancelled'),
               array_agg(mh_stats_bucket(mh_seconds(j.lateness))) FILTER (WHERE j.started_at IS NOT NULL),
               array_agg(mh_stats_bucket(mh_seconds(j.finished_at - j.started_at)))
                   FILTER (WHERE j.state IN ('succeeded', 'dead') AND j.started_at IS NOT NULL)
          FROM jobs j JOIN teams t ON t.id = j.team_id GROUP BY 1, 2""").fetchall()
    out = {}
    for team, name, submitted, started, succeeded, dead, cancelled, lat, run in rows:
        hist = lambda buckets: [(buckets or []).count(b) for b in range(1, BUCKETS + 1)]   # noqa: E731
        out[(team, name)] = (submitted, started, succeeded, failed.get((team, name), 0), dead, cancelled,
                             hist(lat), hist(run))
    return out


# ---------------------------------------------------------------- lateness in the status record
def test_strict_flexible_and_waiting_jobs_show_due_agreed_start_and_lateness(pinned_store, pinned_conn):
    store = pinned_store
    strict = store.submit("t", JobSpec("strict", due_at=T0 + 60 * S, strict=True)).job_id
    flex = store.submit("t", JobSpec("flex", due_at=T0 + 60 * S, flex_s=120))
    waits = store.submit("t", JobSpec("waits", due_at=T0 + 10 * S)).job_id
    past = store.submit("t", JobSpec("past", due_at=T0 - H)).job_id

    st = store.status(strict)
    assert (st.due_at, st.agreed_at, st.run_at, st.lateness, st.lateness_final) == \
        (T0 + 60 * S, T0 + 60 * S, T0 + 60 * S, None, False)
    fl = store.status(flex.job_id)
    # the spread is chosen once, at submission: it is the agreed time
    assert fl.agreed_at == fl.run_at == flex.run_at and T0 + 60 * S <= fl.agreed_at <= T0 + 180 * S
    ps = store.status(past)
    assert ps.agreed_at == T0 and ps.due_at == T0 - H          # a past due time runs at once: agreed now

    # Overdue and waiting: the lateness so far, against the agreed time.
    store.clock = T0 + 40 * S
    w = store.status(waits)
    assert (w.state, w.lateness, w.lateness_final) == ("scheduled", 30 * S, False)
    assert store.status(past).lateness == 40 * S               # an hour past due, 40 s past the agreement
    got = {c.job_id: c for c in claim_due(store)}
    assert set(got) == {waits, past}
    store.clock = T0 + 45 * S
    assert store.status(waits).lateness == 35 * S              # claimed, not started: still so far
    store.start([Start(waits, got[waits].lease_token)])
    store.clock = T0 + 50 * S
    w = store.status(waits)
    assert (w.state, w.started_at, w.lateness, w.lateness_final) == ("running", T0 + 45 * S, 35 * S, True)
    # a retry keeps the first start's lateness
    store.fail([Fail(waits, got[waits].lease_token, "boom")])
    store.clock = T0 + 10 * H
    w = store.status(waits)
    assert (w.state, w.lateness, w.lateness_final) == ("retrying", 35 * S, True) and w.run_at > T0 + 50 * S

    # The strict job starts 2 s after its time, the flexible one 1 s after its agreed time.
    store.clock = T0 + 62 * S
    got = {c.job_id: c for c in claim_due(store)}
    assert strict in got
    store.start([Start(strict, got[strict].lease_token)])
    st = store.status(strict)
    assert (st.started_at, st.lateness, st.lateness_final) == (T0 + 62 * S, 2 * S, True)
    store.clock = fl.agreed_at + S
    got = {c.job_id: c for c in claim_due(store)}
    store.start([Start(flex.job_id, got[flex.job_id].lease_token)])
    store.clock = fl.agreed_at + 4 * S
    store.complete([Complete(flex.job_id, got[flex.job_id].lease_token)])
    fl = store.status(flex.job_id)
    assert (fl.lateness, fl.finished_at - fl.started_at) == (S, 3 * S)   # not due + spread - due

    # ...and the counters say the same: 1 s lands in (0.5, 1], 2 s in (1, 2.5], 35 s in (30, 60]
    stats = store.team_stats("t", window_s=86400)
    assert stats.names["flex"].lateness_hist[STATS_BOUNDS_S.index(1.0)] == 1
    assert stats.names["flex"].runtime_hist[STATS_BOUNDS_S.index(5.0)] == 1
    assert stats.names["strict"].lateness_hist[STATS_BOUNDS_S.index(2.5)] == 1
    assert stats.names["waits"].lateness_hist[STATS_BOUNDS_S.index(60.0)] == 1
    assert (stats.names["waits"].started, stats.names["waits"].failed) == (1, 1)
    # running: strict, past (claimed, never started) and the retry of waits (claimed again)
    assert stats.total.started == 3 and stats.running == 3
    assert quantile_bound(stats.names["strict"].lateness_hist, 0.5) == 2.5


def test_quantiles_are_bucket_upper_bounds():
    hist = [0] * BUCKETS
    hist[0], hist[3], hist[BUCKETS - 1] = 50, 49, 1              # <= 0: 50, (0.05, 0.1]: 49, over an hour: 1
    assert quantile_bound(hist, 0.5) == 0.0 and quantile_bound(hist, 0.99) == 0.1
    hist[BUCKETS - 1] = 10
    assert quantile_bound(hist, 0.99) is None                    # beyond the last bound
    assert quantile_bound([0] * BUCKETS, 0.5) is None


def test_bucket_bounds_in_sql_and_python_agree(pinned_conn):
    assert list(pinned_conn.execute("SELECT mh_stats_bounds()").fetchone()[0]) == list(STATS_BOUNDS_S)
    values = [-1.0, 0.0, 0.001, 0.01, 0.0100001, 0.3, 1.0, 3599.0, 3600.0, 3600.5, 1e9]
    got = pinned_conn.execute("SELECT array_agg(mh_stats_bucket(v) ORDER BY o) FROM unnest(%s::float8[]) "
                              "WITH ORDINALITY u(v, o)", (values,)).fetchone()[0]
    expect = [1 + sum(b < v for b in STATS_BOUNDS_S) for v in values]
    assert got == expect == [1, 1, 2, 2, 3, 6, 7, 15, 15, 16, 16]


def test_the_histograms_written_out_bucket_by_bucket_cover_every_bucket(pinned_conn):
    """mh_hist_add and mh_add_stats spell the buckets out one by one: as many
    as mh_stats_buckets() says, each counted where mh_stats_bucket puts it."""
    n = pinned_conn.execute("SELECT mh_stats_buckets()").fetchone()[0]
    assert n == BUCKETS == len(STATS_BOUNDS_S) + 1
    a, b = list(range(1, n + 1)), [10 * i for i in range(1, n + 1)]
    assert pinned_conn.execute("SELECT mh_hist_add(%s::bigint[], %s::bigint[])", (a, b)).fetchone()[0] == \
        [x + y for x, y in zip(a, b)]
    with pinned_conn.transaction(force_rollback=True):
        team = pinned_conn.execute("INSERT INTO teams (name) VALUES ('hist') RETURNING id").fetchone()[0]
        # one value in each bucket, twice over (the second batch updates the row)
        values = [-1.0] + [bound + 0.0001 for bound in STATS_BOUNDS_S]
        for _ in range(2):
            pinned_conn.execute("""SELECT mh_add_stats(mh_now(), array_agg(ROW(16, %s, 'x', 0, 1, 1, 0, 0, 0, v, v)
                                                                            ::stats_delta))
                                     FROM unnest(%s::float8[]) v""", (team, values))
        hists = pinned_conn.execute("SELECT lateness_hist, runtime_hist FROM team_stats WHERE team_id = %s",
                                    (team,)).fetchone()
    assert list(hists) == [[2] * n, [2] * n]


# ---------------------------------------------------------------- the mixed run
def test_counters_after_a_mixed_run_equal_a_recount_of_the_jobs(pinned_store, pinned_conn):
    store, rng = pinned_store, random.Random(7)
    failed: dict[tuple[str, str], int] = {}
    names = ["a", "b", "c.d", "e/f"]
    now = T0

    def submit_some():
        for team in ("t", "u"):
            store.submit(team, JobSpec(rng.choice(names), max_attempts=rng.choice([1, 2, 3]),
                                       backoff_base_s=1, backoff_cap_s=2, flex_s=rng.choice([0, 5])))
            batch = [JobSpec(rng.choice(names), max_attempts=rng.choice([1, 2, 3]), backoff_base_s=1,
                             backoff_cap_s=2, flex_s=rng.choice([0, 0, 20]),
                             idempotency_key=rng.choice([None, None, f"k{rng.randrange(30)}"]))
                     for _ in range(rng.randrange(5, 25))]
            store.submit_many(team, batch)

    for step in range(25):
        if step < 15:
            submit_some()
        now += dt.timedelta(seconds=rng.choice([1, 3, 7, 31]))
        store.clock = now
        jobs = claim_due(store, lease_s=rng.choice([5, 30]))
        starts = [c for c in jobs if rng.random() < 0.7]
        store.start([Start(c.job_id, c.lease_token) for c in starts])
        store.start([Start(c.job_id, c.lease_token) for c in starts[:3]])      # repeated: counted once
        now += dt.timedelta(seconds=rng.choice([0, 1, 2]), milliseconds=rng.randrange(1000))
        store.clock = now
        completes, fails, releases, cancels = [], [], [], []
        for c in jobs:
            r = rng.random()
            (completes if r < 0.35 else fails if r < 0.6 else releases if r < 0.7 else
             cancels if r < 0.8 else []).append(c)                            # the rest: left to expire
        store.complete([Complete(c.job_id, c.lease_token) for c in completes])
        for o, c in zip(store.fail([Fail(c.job_id, c.lease_token, "x", rng.random() < 0.8) for c in fails]), fails):
            if o.state == "retrying":
                failed[(c.team, c.name)] = failed.get((c.team, c.name), 0) + 1
        store.release([Release(c.job_id, c.lease_token) for c in releases])
        for c in cancels:
            store.cancel(c.job_id, c.team)              # only the claimed, not started, are cancelled
        waiting = pinned_conn.execute("SELECT id, team_id FROM jobs WHERE state = 'scheduled' LIMIT 2").fetchall()
        for job_id, _ in waiting:
            store.cancel(job_id, None)
        store.expire_claims(range(256))
        # complete after an expiry: refused (the claim is gone), changes nothing
        store.complete([Complete(c.job_id, c.lease_token) for c in jobs[:2]])
        kept, actual = running_recount(pinned_conn)
        assert kept == actual, step

    counted = pinned_conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    states = dict(pinned_conn.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1").fetchall())
    assert counted > 300 and all(states.get(s) for s in ("succeeded", "dead", "cancelled")), states
    assert sum(failed.values()) > 10
    assert stats_by_name(pinned_conn) == jobs_recount(pinned_conn, failed)

    # The API's reading: per team, its own names only; totals add up.
    t = store.team_stats("t", window_s=86400)
    recount = jobs_recount(pinned_conn, failed)
    assert set(t.names) == {n for team, n in recount if team == "t"} and t.other is None
    assert t.total.submitted == sum(v[0] for k, v in recount.items() if k[0] == "t")
    t_id = pinned_conn.execute("SELECT id FROM teams WHERE name = 't'").fetchone()[0]
    assert t.running == sum(r[2] for r in running_recount(pinned_conn)[1] if r[1] == t_id)

    # Folded into hour rows and read back: the same numbers.
    store.clock = now + 3 * H
    with store.connection() as c:
        minute_rows = c.execute("SELECT count(*) AS n FROM team_stats WHERE stripe >= 0").fetchone()["n"]
    assert store.roll_up_stats() == minute_rows
    assert pinned_conn.execute("SELECT count(*) FROM team_stats WHERE stripe >= 0").fetchone()[0] == 0
    assert stats_by_name(pinned_conn) == jobs_recount(pinned_conn, failed)
    later = store.team_stats("t", window_s=86400)
    assert (later.total, later.names) == (t.total, t.names)
    assert store.roll_up_stats() == 0


def test_the_name_list_is_bounded_the_rest_is_other(pinned_store):
    pinned_store.submit_many("t", [JobSpec(f"n{i:02}") for i in range(12) for _ in range(i + 1)])
    s = pinned_store.team_stats("t", names=5)
    assert list(s.names) == ["n11", "n10", "n09", "n08", "n07"]         # most volume first
    assert s.other_names == 7 and s.other.submitted == sum(range(1, 8))
    assert s.total.submitted == sum(range(1, 13))


def test_window_rollup_and_retention(pinned_store, pinned_conn):
    store = pinned_store
    store.submit_many("t", [JobSpec("old")] * 3)
    store.clock = T0 + 2 * H
    store.submit("t", JobSpec("new"))
    assert store.team_stats("t", window_s=3600).total.submitted == 1
    assert store.team_stats("t", window_s=3 * 3600).total.submitted == 4
    store.clock = T0 + 5 * H
    minute_rows = pinned_conn.execute("SELECT count(*) FROM team_stats").fetchone()[0]
    assert store.roll_up_stats() == minute_rows >= 2
    rows = pinned_conn.execute("SELECT minute, stripe FROM team_stats ORDER BY minute").fetchall()
    assert {r[1] for r in rows} == {-1}
    assert [r[0] for r in rows] == [T0.replace(minute=0, second=0), (T0 + 2 * H).replace(minute=0, second=0)]
    s = store.team_stats("t", window_s=4 * 3600)               # starts at an hour: 5 h - 4 h = T0 + 1 h -> 13:00
    assert s.window_start == (T0 + H).replace(minute=0, second=0) and s.total.submitted == 1
    assert store.team_stats("t", window_s=5 * 3600 + 60).total.submitted == 4
    assert store.team_stats("t", window_s=600).window_start == (T0 + 5 * H - 600 * S).replace(second=0)
    fleet = store.fleet_stats(window_s=86400)
    assert fleet.total.submitted == 4 and [x.team for x in fleet.teams] == ["t", "u"]
    store.clock = T0 + dt.timedelta(days=35) + 1.5 * H
    assert store.purge_stats() == 1                                  # the hour of "old"
    assert pinned_conn.execute("SELECT name FROM team_stats WHERE stripe <> -2").fetchall() == [("new",)]
    # What it counted is kept in the row of everything purged (the /metrics counters never go back).
    assert pinned_conn.execute("SELECT minute = '-infinity', name, submitted FROM team_stats WHERE stripe = -2"
                               ).fetchall() == [(True, "old", 3)]
    assert store.maintain().stats_purged == 0


# ---------------------------------------------------------------- concurrent batches
def test_two_concurrent_batches_over_the_same_counter_rows_do_not_deadlock(pinned_store, db_dsn):
    """Two outcome batches of one team and name, spread over every stripe,
    in opposite input orders, each in a transaction held open while the
    other runs: they wait for each other and count exactly."""
    store = pinned_store
    store.submit_many("t", [JobSpec("same")] * 400)
    jobs = claim_due(store)
    assert len(jobs) == 400
    half = [jobs[0::2], jobs[1::2]]
    conns = [psycopg.connect(db_dsn) for _ in range(2)]
    errors: list[BaseException] = []
    try:
        for c in conns:
            pin(c, T0 + S)
        for c, part in zip(conns, half):     # started in one transaction each: running, counted
            c.execute("SELECT count(*) FROM start_many(%s, %s)", ([j.job_id for j in part], [j.lease_token for j in part]))
            c.commit()
        barrier = threading.Barrier(2)

        def run(c, part, order):
            try:
                part = sorted(part, key=lambda j: j.job_id, reverse=order)
                barrier.wait()
                c.execute("SELECT count(*) FROM complete_many(%s, %s, NULL)",
                          ([j.job_id for j in part], [j.lease_token for j in part]))
                c.commit()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                c.rollback()

        threads = [threading.Thread(target=run, args=(c, p, o)) for c, p, o in zip(conns, half, (False, True))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in conns:
            c.close()
    assert not errors, errors
    s = store.team_stats("t")
    assert (s.total.started, s.total.succeeded, s.running) == (400, 400, 0)
    with store.connection() as c:
        assert c.execute("SELECT count(DISTINCT stripe) AS n FROM team_stats WHERE stripe >= 16").fetchone()["n"] == 16


def test_a_batch_waits_for_another_holding_its_counter_rows(pinned_store, db_dsn):
    store = pinned_store
    store.submit_many("t", [JobSpec("held")] * 64)
    jobs = claim_due(store)
    a, b = jobs[:32], jobs[32:]
    with psycopg.connect(db_dsn) as holder, psycopg.connect(db_dsn) as other:
        for c in (holder, other):
            pin(c, T0 + S)
            c.commit()
        holder.execute("SELECT count(*) FROM complete_many(%s, %s, NULL)", ([j.job_id for j in a], [j.lease_token for j in a]))
        done = threading.Event()

        def second():
            other.execute("SELECT count(*) FROM complete_many(%s, %s, NULL)",
                          ([j.job_id for j in b][::-1], [j.lease_token for j in b][::-1]))
            other.commit()
            done.set()

        t = threading.Thread(target=second)
        t.start()
        assert not done.wait(1.0)            # waits on the rows the first holds (counters, team_running)
        holder.commit()
        t.join(30)
        assert done.is_set()
    s = store.team_stats("t")
    assert (s.total.succeeded, s.total.started, s.running) == (64, 64, 0)


def test_a_teams_first_names_are_kept_apart_and_concurrent_batches_never_keep_more(pinned_store, db_dsn):
    """Two transactions bringing 30 new names each to a team with room for
    50: the second waits for the first to commit, then keeps 20 of its names
    apart (in name order) and counts the other ten as "(other)", as every
    later name of the team."""
    with psycopg.connect(db_dsn) as first, psycopg.connect(db_dsn) as second:
        for c in (first, second):
            pin(c, T0)
            c.commit()
        first.execute("SELECT count(*) FROM submit_jobs('t', %s)", ([f"a{i:02}" for i in range(30)],))
        done = threading.Event()

        def run():
            second.execute("SELECT count(*) FROM submit_jobs('t', %s)", ([f"b{i:02}" for i in range(30)][::-1],))
            second.commit()
            done.set()

        t = threading.Thread(target=run)
        t.start()
        assert not done.wait(1.0)            # waits for the first's names to be kept or not
        first.commit()
        t.join(30)
        assert done.is_set()
    pinned_store.submit_many("t", [JobSpec("a00"), JobSpec("b29"), JobSpec("c")])
    s = pinned_store.team_stats("t")
    kept = {f"a{i:02}" for i in range(30)} | {f"b{i:02}" for i in range(20)}
    assert set(s.names) == kept and s.names["a00"].submitted == 2
    assert (s.other.submitted, s.other_names, s.total.submitted) == (12, 1, 63)
    with pinned_store.connection() as c:
        assert {r["name"] for r in c.execute("SELECT name FROM team_stats_names")} == kept
        assert {r["name"] for r in c.execute("SELECT DISTINCT name FROM team_stats")} == kept | {"(other)"}
