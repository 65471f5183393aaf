"""What the counters' reads cost when one team uses very many job names
(docs/guides/teams.md, "Statistics"): team_stats keeps a team's first mh_stats_names()
names apart and counts the rest as one `(other)` row, so the reads should
cost the same with 600 names as with 60,000.

    python -m ops.bench.stats_names                    # a fresh durable local cluster
    python -m ops.bench.stats_names --dsn URL          # a server of yours (database mh_bench_names is recreated)
    python -m ops.bench.stats_names --names 60000 --repeat 3

For each number of names, a database of its own: team `wide` submits that
many distinct names (submit_jobs, batches of 10,000), the events of their
start and completion are counted a minute apart (mh_add_stats, as the
outcome procedures count them), three hours later those minutes are rolled
up into their hour and every name is submitted once more. Then, each the
median of --repeat runs:
- /metrics, uncached: the database read of a process that has not read
  before (DatabaseMetrics.refresh: every row since the first event);
- the team's statistics over an hour, a day and 30 days (Store.team_stats);
- the fleet's statistics over a day (Store.fleet_stats);
- the admin overview, the fleet's and the team's (Store.admin_overview).
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from collections.abc import Callable

import psycopg

from minutehand.api.metrics import DatabaseMetrics
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.server import bench_server
from ops.bench.store import new_database

TEAM = "wide"
T0 = dt.datetime(2030, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
LATER = T0 + dt.timedelta(hours=3)
BATCH = 10_000
# One event of every name of the team, as the outcome procedures hand it to mh_add_stats.
EVENTS = """
SELECT mh_add_stats(%(at)s, ARRAY(
    SELECT ROW(%(stripe)s + g %% 16, (SELECT id FROM teams WHERE name = %(team)s), 'n' || lpad(g::text, 6, '0'),
               %(submitted)s, %(started)s, %(succeeded)s, 0, 0, 0, %(lateness_s)s, %(runtime_s)s)::stats_delta
      FROM generate_series(0, %(names)s - 1) g))"""


def fill(url: str, names: int) -> None:
    store = Store(url, clock=T0)
    try:
        store.create_team(TEAM, quota=1_000_000)
        for i in range(0, names, BATCH):
            store.submit_many(TEAM, [JobSpec(f"n{k:06}", due_at=T0 + dt.timedelta(days=2))
                                     for k in range(i, min(i + BATCH, names))])
    finally:
        store.close()
    event = {"team": TEAM, "names": names, "submitted": 0, "started": 0, "succeeded": 0, "lateness_s": None,
             "runtime_s": None, "stripe": 16}
    with psycopg.connect(url, autocommit=True) as conn:
        for at, counts in ((T0 + dt.timedelta(minutes=1), {"started": 1, "lateness_s": 0.5}),
                           (T0 + dt.timedelta(minutes=2), {"succeeded": 1, "runtime_s": 2.0}),
                           (LATER, {"submitted": 1, "stripe": 0})):
            conn.execute("SELECT set_config('minutehand.now', %s, false)", (at.isoformat(),))
            if at == LATER:
                conn.execute("SELECT roll_up_stats()")
            conn.execute(EVENTS, {**event, **counts, "at": at})
        conn.execute("VACUUM ANALYZE")


def median_s(call: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def measure(url: str, repeat: int) -> dict[str, float]:
    store = Store(url, clock=LATER)
    try:
        return {
            "/metrics, uncached": median_s(
                lambda: DatabaseMetrics(store, names_per_team=50, read_s=0).refresh(), repeat),
            "team stats, 1 h": median_s(lambda: store.team_stats(TEAM, window_s=3600), repeat),
            "team stats, 1 day": median_s(lambda: store.team_stats(TEAM, window_s=86400), repeat),
            "team stats, 30 days": median_s(lambda: store.team_stats(TEAM, window_s=30 * 86400), repeat),
            "fleet stats, 1 day": median_s(lambda: store.fleet_stats(window_s=86400), repeat),
            "admin overview, fleet": median_s(lambda: store.admin_overview(None), repeat),
            "admin overview, team": median_s(lambda: store.admin_overview(TEAM), repeat),
        }
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a server to use (superuser); default: a fresh durable local cluster")
    ap.add_argument("--names", default="600,60000", help="job names of the team, comma-separated: one run each")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each read (the median is shown)")
    args = ap.parse_args()
    sizes = [int(n) for n in args.names.split(",")]
    figures: dict[int, dict[str, float]] = {}
    with bench_server(args.dsn, "mh-bench-names-") as dsn:
        for names in sizes:
            url = new_database(dsn, "mh_bench_names")
            started = time.perf_counter()
            fill(url, names)
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT count(*) FROM team_stats").fetchone()[0]
            print(f"{names:,} names: filled in {time.perf_counter() - started:.1f} s, {rows:,} rows of team_stats")
            figures[names] = measure(url, args.repeat)
    print(f"\nmedian of {args.repeat} runs, seconds")
    print(f"{'read':<24}" + "".join(f"{f'{n:,} names':>16}" for n in sizes))
    for read in figures[sizes[0]]:
        print(f"{read:<24}" + "".join(f"{figures[n][read]:>16.4f}" for n in sizes))


if __name__ == "__main__":
    main()
