"""Midnight from repeating series: the chain, and spreading, over simulated days.

20,000 series from 50 teams (sizes skewed), half `0 0 * * *` and half
`0 * * * *`; 70% have a window (flex_s drawn from 10, 30 and 60 minutes),
the rest are strict. The clock is pinned and advanced a minute at a time
over two simulated days from 23:00 the evening before, 5 minutes at a
time: at each step every due run is claimed (claim_due on the shards whose
due_edge shows due rows) and completed, then the chain creates the next
runs (Store.continue_series, what the dispatcher's maintenance runs four
times a second). Runs are counted per minute of their agreed run time, the
minute the dispatcher hands them out at. The same series run twice, on a fresh database each: with their
windows (spreading on) and without (every run at its fire time: off).

    python -m ops.bench.series_midnight                       # 20,000 series, 2 days (~10 min per mode)
    python -m ops.bench.series_midnight --series 2000 --days 1   # a quick look
    python -m ops.bench.series_midnight --dsn URL             # a server of yours (database mh_bench_series is recreated)

Figures, per mode:
- runs dispatched per minute: the first midnight's hour minute by minute
  (a table), every hour's busiest minute, and a PNG of every minute of both
  modes (matplotlib; --png);
- max / mean minute: the busiest minute against the mean minute of the
  simulated days, and of the first midnight hour;
- runs created per second by the chain (wall time inside continue_series);
- duplicate runs (two runs of a series at one due time) and missing runs
  (a fire time between a series' first run and its newest without a run),
  counted from the jobs table: both must be 0.
"""
from __future__ import annotations

import argparse
import datetime as dt
import random
import time
from collections import Counter
from dataclasses import dataclass

from minutehand.store import migrate
from minutehand.store.claim import ClaimRequest
from minutehand.store.records import Repeat
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.server import bench_server
from ops.bench.store import recreate

UTC = dt.timezone.utc
MIDNIGHT = dt.datetime(2030, 1, 1, tzinfo=UTC)
START = MIDNIGHT - dt.timedelta(hours=1)
MIN = dt.timedelta(minutes=1)
STEP = dt.timedelta(minutes=5)   # the pinned clock's step: every due run is claimed at each
WINDOWS_S = (600, 1800, 3600)
WINDOWED = 0.7
TEAMS = 50
SHARDS = range(256)
CRONS = {"daily": "0 0 * * *", "hourly": "0 * * * *"}
PERIOD = {"daily": dt.timedelta(days=1), "hourly": dt.timedelta(hours=1)}


@dataclass
class Result:
    mode: str
    per_minute: Counter             # minute -> runs claimed in it
    chain_runs: int
    chain_s: float
    submitted_s: float
    duplicates: int
    missing: int
    series: int


def plan(n: int, seed: int) -> list[tuple[str, str, int]]:
    """(team, kind, flex_s) per series: team sizes skewed (team i ~ 1/(i+1))."""
    rng = random.Random(seed)
    teams = [f"team{i:02d}" for i in range(TEAMS)]
    weights = [1 / (i + 1) for i in range(TEAMS)]
    out = []
    for i in range(n):
        kind = "daily" if i % 2 == 0 else "hourly"
        flex = rng.choice(WINDOWS_S) if rng.random() < WINDOWED else 0
        out.append((rng.choices(teams, weights)[0], kind, flex))
    return out


def run(url: str, mode: str, specs: list[tuple[str, str, int]], days: int) -> Result:
    migrate.upgrade(url)
    with Store(url, max_size=4, clock=START) as store:
        for t in sorted({s[0] for s in specs}):
            store.create_team(t, quota=1_000_000)
        t0 = time.perf_counter()
        by_team: dict[str, list[JobSpec]] = {}
        for team, kind, flex in specs:
            flex = flex if mode == "on" else 0
            by_team.setdefault(team, []).append(JobSpec(
                name=f"report.{kind}", flex_s=flex, strict=flex == 0, repeat=Repeat(cron=CRONS[kind])))
        for team, jobs in by_team.items():
            for i in range(0, len(jobs), 500):
                items = store.submit_many(team, jobs[i:i + 500])
                assert all(it.error is None for it in items), [it.error for it in items if it.error][:3]
        submitted_s = time.perf_counter() - t0
        leases = store.take_leases(SHARDS, "bench", (days + 1) * 86400)
        chain_runs, chain_s = 0, 0.0
        end = MIDNIGHT + dt.timedelta(days=days)
        at = START
        while at < end:
            at += STEP
            store.clock = at
            if at.minute % 30 == 0:
                store.maintain()                 # the wheel's cascade and sweep, as its duty does
            claim_and_complete(store, leases)
            t = time.perf_counter()
            while (made := store.continue_series(SHARDS, 5000)):
                chain_runs += made
            chain_s += time.perf_counter() - t
        duplicates, missing = audit(store)
        per_minute = dispatched_per_minute(store)
    return Result(mode, per_minute, chain_runs, chain_s, submitted_s, duplicates, missing, len(specs))


def claim_and_complete(store: Store, leases: dict[int, int]) -> int:
    """Every run due now claimed and completed: the shards' looks (due_edge,
    which also moves their hands), then claims on the shards with due rows."""
    total = 0
    while True:
        edges = store.due_edges(SHARDS)
        due = {s: sum(c.due for c in cells) for s, (cells, _) in edges.items() if cells}
        if not due:
            return total
        results, _ = store.claim([ClaimRequest(s, leases[s], min(n, 10_000), None) for s, n in due.items()],
                                 "bench", 3600)
        jobs = [j for answer in results if isinstance(answer, list) for j in answer]
        total += len(jobs)
        with store.connection() as conn:
            conn.execute("SELECT count(*) FROM complete_many(%s, %s)",
                         ([j.job_id for j in jobs], [j.lease_token for j in jobs]))


def dispatched_per_minute(store: Store) -> Counter:
    """Runs per minute of their agreed run time, the time the dispatcher
    hands them out at (the simulation claims every STEP: a run's claim time
    is the step after its run time, so the agreed time is the finer figure)."""
    with store.connection() as conn:
        rows = conn.execute("SELECT date_trunc('minute', agreed_at) AS m, count(*) AS n FROM jobs "
                            "WHERE state = 'succeeded' GROUP BY 1").fetchall()
    return Counter({r["m"]: r["n"] for r in rows})


def audit(store: Store) -> tuple[int, int]:
    """(duplicates, missing): runs of a series at one due time beyond the
    first; fire times between a series' first and newest run without one."""
    with store.connection() as conn:
        rows = conn.execute("""
            SELECT s.cron, count(*) AS n, count(DISTINCT j.due_at) AS distinct_n,
                   min(j.due_at) AS first, max(j.due_at) AS last
              FROM jobs j JOIN series s ON s.shard = j.shard AND s.id = j.series_id
             GROUP BY s.id, s.cron""").fetchall()
    kinds = {v: k for k, v in CRONS.items()}
    duplicates = sum(r["n"] - r["distinct_n"] for r in rows)
    missing = sum((r["last"] - r["first"]) // PERIOD[kinds[r["cron"]]] + 1 - r["distinct_n"] for r in rows)
    return duplicates, missing


def report(results: list[Result], days: int, png: str | None) -> None:
    minutes = [START + i * MIN for i in range(int((dt.timedelta(days=days) + (MIDNIGHT - START)) / MIN))]
    print(f"\nruns dispatched per minute, the first midnight hour ({', '.join(r.mode for r in results)}):")
    print("  minute  " + "  ".join(f"{'spreading ' + r.mode:>14}" for r in results))
    for m in minutes:
        if MIDNIGHT <= m < MIDNIGHT + dt.timedelta(hours=1):
            print(f"  {m:%H:%M}   " + "  ".join(f"{r.per_minute[m]:>14,}" for r in results))
    print("\nthe busiest minute of each hour:")
    print("  hour              " + "  ".join(f"{'spreading ' + r.mode:>14}" for r in results))
    hour = START
    while hour < minutes[-1]:
        span = [hour + i * MIN for i in range(60)]
        print(f"  {hour:%Y-%m-%d %H}:00  " + "  ".join(f"{max(r.per_minute[m] for m in span):>14,}" for r in results))
        hour += dt.timedelta(hours=1)
    print()
    first_hour = [MIDNIGHT + i * MIN for i in range(60)]
    for r in results:
        total = sum(r.per_minute[m] for m in minutes)
        busiest = max(minutes, key=lambda m: r.per_minute[m])
        hour_mean = sum(r.per_minute[m] for m in first_hour) / 60
        print(f"spreading {r.mode:>3}: {r.series:,} series, {total:,} runs over {days} day(s); busiest minute "
              f"{busiest:%m-%d %H:%M} with {r.per_minute[busiest]:,}: {r.per_minute[busiest] / (total / len(minutes)):.1f}x "
              f"the mean minute, {max(r.per_minute[m] for m in first_hour) / hour_mean:.2f}x the mean minute of the "
              f"midnight hour; chain {r.chain_runs:,} runs in {r.chain_s:.1f} s = {r.chain_runs / r.chain_s:,.0f} runs/s; "
              f"duplicate runs {r.duplicates}, missing runs {r.missing}; series submitted in {r.submitted_s:.1f} s")
    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(14, 5))
        for r in results:
            ax.plot([(m - START) / dt.timedelta(hours=1) for m in minutes], [r.per_minute[m] for m in minutes],
                    label=f"spreading {r.mode}", linewidth=0.8)
        ax.set_yscale("symlog")
        ax.set_xlabel(f"hours since {START:%Y-%m-%d %H:%M} UTC")
        ax.set_ylabel("runs dispatched per minute")
        ax.set_title(f"{results[0].series:,} repeating series ({CRONS['daily']} and {CRONS['hourly']}), "
                     f"{WINDOWED:.0%} with windows")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        print(f"plot: {png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=20_000)
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--modes", default="on,off")
    p.add_argument("--png", default="series_midnight.png", help="where the plot goes ('' for none)")
    p.add_argument("--dsn", help="a PostgreSQL server (superuser); default: a fresh local cluster")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    specs = plan(a.series, a.seed)
    results = []
    with bench_server(a.dsn, "mh-bench-series-") as dsn:
        for mode in a.modes.split(","):
            url = recreate(dsn, "mh_bench_series")
            t = time.perf_counter()
            results.append(run(url, mode, specs, a.days))
            print(f"spreading {mode}: simulated in {time.perf_counter() - t:.0f} s", flush=True)
    report(results, a.days, a.png or None)


if __name__ == "__main__":
    main()
