"""Admission control's cost, measured as A/B pairs interleaved in time on one
server (docs/guides/teams.md, "Admission control"), so that the drift of a shared machine
falls on both sides of each ratio alike:

1. the pending count: mh_add_stats with its team_pending upsert (as it is)
   vs without (its body with that statement taken out: the code before
   admission control), alternated by redefining the function between runs.
   Figures: single submit_job calls (4 processes), submit_jobs batches of
   10,000 and claim(100)+complete (4 processes), as in ops.bench.store;
2. the admission call, through one `minutehand serve`: a team without
   limits (no call) vs a team with a rate limit and a ceiling too high to
   refuse anything (mh_admit before every submission: its bucket row
   updated, its pending rows read). Single POST /v1/jobs from wrk, and
   1,000-job batches, as in ops.bench.api.

    python -m ops.bench.admission             # a fresh durable local cluster
    python -m ops.bench.admission --dsn URL   # a server of yours (databases mh_bench_adm* are recreated)
    python -m ops.bench.admission --quick     # short runs, to check the script itself
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
from collections.abc import Callable

import psycopg

from minutehand.store import sqlfiles
from minutehand.store.store import Store
from ops.bench.api import WRK_HINT, _free_port, batch_jobs_per_s, start_server, stop_server, wrk_single
from ops.bench.server import bench_server
from ops.bench.store import TEAM, bench_submit_single, lifecycle_run, new_database

# The statement of mh_add_stats that keeps team_pending, up to its `;`.
PENDING_UPSERT = re.compile(r"\n\s*INSERT INTO team_pending.*?;", re.S)


def add_stats_definition(with_pending: bool) -> str:
    """CREATE OR REPLACE of mh_add_stats, as sql/functions/stats.sql has it
    or without its team_pending upsert."""
    stmt = next(s for f, name, s in sqlfiles.function_definitions() if name == "mh_add_stats")
    if with_pending:
        return stmt
    stripped, n = PENDING_UPSERT.subn("", stmt)
    assert n == 1, "mh_add_stats no longer has one team_pending upsert: update this benchmark"
    return stripped


def use(url: str, with_pending: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(add_stats_definition(with_pending))


def pairs(run: Callable[[bool], float], repeat: int) -> tuple[float, float]:
    """Medians of run(False) and run(True), interleaved."""
    off, on = [], []
    for _ in range(repeat):
        off.append(run(False))
        on.append(run(True))
    return statistics.median(off), statistics.median(on)


def line(label: str, unit: str, before: float, after: float) -> None:
    print(f"{label}: {before:,.0f} -> {after:,.0f} {unit} ({after / before:.3f}x)")


def bench_counter(dsn: str, seconds: float, jobs: int, repeat: int) -> None:
    url = new_database(dsn, "mh_bench_adm")

    def single(with_pending: bool) -> float:
        use(url, with_pending)
        return bench_submit_single(url, seconds)

    def lifecycle(with_pending: bool) -> tuple[float, float]:
        use(url, with_pending)
        return lifecycle_run(url, jobs)

    print(f"1. the pending count in mh_add_stats: without -> with, medians of {repeat} interleaved runs")
    line("   submit_job, single calls, 4 processes", "jobs/s", *pairs(single, repeat))
    runs = {False: [], True: []}
    for _ in range(repeat):
        for variant in (False, True):
            runs[variant].append(lifecycle(variant))
    for i, label in enumerate(("submit_jobs, batches of 10,000, 4 processes", "claim(100)+complete, 4 processes")):
        line(f"   {label}", "jobs/s", statistics.median(r[i] for r in runs[False]),
             statistics.median(r[i] for r in runs[True]))
    use(url, True)


def bench_admission(dsn: str, seconds: int, repeat: int) -> None:
    url = new_database(dsn, "mh_bench_adm_api")
    with Store(url) as store:
        limited = store.create_team("limited", quota=1_000_000, submit_rate=1_000_000, submit_burst=1_000_000,
                                    max_pending=2**31 - 1)
        free = store.rotate_token(TEAM)
    port = _free_port()
    server = start_server(url, port, free, 2)
    try:
        wrk_single(port, free, 2, 64)          # warm-up: pool, plans, caches
        wrk_single(port, limited, 2, 64)
        print(f"2. the admission call through one `minutehand serve`: a team without limits -> one with "
              f"limits that refuse nothing, medians of {repeat} interleaved runs of {seconds} s")
        single = pairs(lambda on: wrk_single(port, limited if on else free, seconds, 64)["rps"], repeat)
        line("   POST /v1/jobs, 64 connections (wrk)", "requests/s", *single)
        batch = pairs(lambda on: batch_jobs_per_s(port, limited if on else free, 1000, seconds, 3), repeat)
        line("   POST /v1/jobs/batch, 1,000-job batches, 3 clients", "jobs/s", *batch)
    finally:
        stop_server(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a server to use (superuser); default: a fresh durable local cluster")
    ap.add_argument("--seconds", type=int, default=8, help="length of each timed run")
    ap.add_argument("--jobs", type=int, default=80_000, help="jobs of each submit_jobs + claim+complete run (a multiple of 40,000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side")
    ap.add_argument("--quick", action="store_true", help="short runs: check the script, not the numbers")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.jobs, args.repeat = 2, 40_000, 1
    if shutil.which("wrk") is None:
        raise SystemExit(WRK_HINT)
    with bench_server(args.dsn, "mh-bench-adm-") as dsn:
        bench_counter(dsn, args.seconds, args.jobs, args.repeat)
        bench_admission(dsn, args.seconds, args.repeat)


if __name__ == "__main__":
    main()
