"""Citus beside plain PostgreSQL in one run: the no-op end-to-end shapes of
ops/bench/e2e.py (2 workers x 10 and x 500) on a fresh local durable plain
cluster and on the Citus cluster given, alternating round by round (plain,
Citus, plain, Citus: absolute rates drift on a shared machine, their ratio
less), with the Citus/plain ratio of each shape. Over each run, per job:

- CPU of serve and of each PostgreSQL server (on Citus: the coordinator
  and each worker node), from /proc;
- the coordinator's transactions (pg_stat_database) and, on Citus, its
  distributed executions, single-shard and multi-shard (Citus' own
  counters, citus_stat_counters, switched on for the bench database);
- on Citus, worker commits in two phases (rows Citus adds to
  pg_dist_transaction for each worker of each two-phase commit, with its
  recovery of them paused for the run, then resumed).

    python -m ops.bench.citus_vs_plain --dsn postgresql://postgres@127.0.0.1:9900/postgres \\
        --citus-workers 127.0.0.1:9901,127.0.0.1:9902 [--rounds 2] [--jobs 20000]

The Citus database (mh_bench_e2e) is made on every node and distributed
(--citus-shard-count Citus shards), as by ops/bench/e2e.py.
"""
from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from minutehand.store.store import Store
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.e2e import TEAM, throughput
from ops.bench.server import add_server_arguments, bench_server, minutehand_database
from ops.bench.sustained import cpu_seconds, postgres_cpu, postmasters

SHAPES = (("2 workers x 10", 2, 10), ("2 workers x 500", 2, 500))
DB = "mh_bench_e2e"


def _coordinator_counts(url: str, citus: bool) -> dict[str, float]:
    """What the coordinator counted so far for the bench database."""
    with psycopg.connect(url, autocommit=True) as c:
        counts = {"coordinator transactions": c.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]}
        if citus:
            single, multi = c.execute("SELECT query_execution_single_shard, query_execution_multi_shard "
                                      "FROM citus_stat_counters WHERE name = current_database()").fetchone()
            counts["single-shard executions"] = single
            counts["multi-shard executions"] = multi
            counts["worker commits in two phases"] = c.execute("SELECT count(*) FROM pg_dist_transaction").fetchone()[0]
    return counts


@contextmanager
def _two_phase_kept(url: str, citus: bool) -> Iterator[None]:
    """Citus' recovery of two-phase commits (which deletes their rows) paused meanwhile."""
    if not citus:
        yield
        return
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
        c.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("ALTER SYSTEM RESET citus.recover_2pc_interval")
            c.execute("SELECT pg_reload_conf()")


def one_round(dsn: str, citus_workers: str, shard_count: int, jobs: int) -> dict[str, dict[str, float]]:
    """{shape: figures} on one server (Citus when citus_workers)."""
    citus = bool(citus_workers)
    url = minutehand_database(dsn, DB, citus_workers, shard_count)
    with Store(url) as store:
        store.create_team(TEAM, quota=10**6)
        token = store.create_worker_token("bench")
    if citus:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"ALTER DATABASE {DB} SET citus.enable_stat_counters = on")
    servers = postmasters(url, citus_workers)
    port = _free_port()
    server = start_server(url, port, "", 2)
    figures: dict[str, dict[str, float]] = {}
    try:
        with _two_phase_kept(url, citus):
            for label, processes, concurrency in SHAPES:
                cpu0 = {"serve": cpu_seconds(server.pid), **{k: postgres_cpu(p) for k, p in servers.items()}}
                counts0 = _coordinator_counts(url, citus)
                r = throughput(url, port, token, jobs, processes, concurrency)
                cpu1 = {"serve": cpu_seconds(server.pid), **{k: postgres_cpu(p) for k, p in servers.items()}}
                counts1 = _coordinator_counts(url, citus)
                n = max(r["succeeded"], 1)
                figures[label] = {"jobs/s": r["jobs_per_s"], "verified": float(r["verified"]),
                                  **{f"{k} CPU ms/job": (cpu1[k] - cpu0[k]) * 1000 / n for k in cpu0},
                                  **{f"{k}/job": (counts1[k] - counts0[k]) / n for k in counts0}}
    finally:
        stop_server(server)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    if not (args.dsn and args.citus_workers):
        parser.error("--dsn (a Citus coordinator) and --citus-workers are needed")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"plain": [], "Citus": []}
    with bench_server(None, "mh-bench-vs-") as plain_dsn:
        for i in range(args.rounds):
            for name, dsn, workers in (("plain", plain_dsn, ""), ("Citus", args.dsn, args.citus_workers)):
                runs[name].append(one_round(dsn, workers, args.citus_shard_count, args.jobs))
                for label, f in runs[name][-1].items():
                    print(f"round {i + 1}, {name}, {label}: " + ", ".join(
                        f"{k} {v:,.3f}" if v < 100 else f"{k} {v:,.0f}" for k, v in f.items()), flush=True)
    print()
    for label, _, _ in SHAPES:
        plain = statistics.median(r[label]["jobs/s"] for r in runs["plain"])
        citus = statistics.median(r[label]["jobs/s"] for r in runs["Citus"])
        print(f"{label}: plain {plain:,.0f} jobs/s, Citus {citus:,.0f} jobs/s: Citus/plain {citus / plain:.2f}x "
              f"(medians of {args.rounds} rounds each)")
        for name in runs:
            keys = [k for k in runs[name][0][label] if k not in ("jobs/s", "verified")]
            print(f"  {name}, per job: " + ", ".join(
                f"{k.removesuffix('/job')} {statistics.median(r[label][k] for r in runs[name]):.3f}" for k in keys))


if __name__ == "__main__":
    main()
