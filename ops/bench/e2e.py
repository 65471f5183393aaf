"""End-to-end benchmark: due-now no-op jobs submitted in batches, run by
worker processes through the HTTP pull protocol, against one `minutehand
serve` process (API + dispatcher), on a fresh durable cluster
(fsync and synchronous_commit on).

    python -m ops.bench.e2e                       # 100,000 jobs, peers too
    python -m ops.bench.e2e --jobs 20000 --no-peers --quick
    python -m ops.bench.e2e --dsn URL             # a server of yours
    python -m ops.bench.e2e --dsn URL --citus-workers h:p,h:p   # URL a Citus coordinator

Figures, all from one run on the same server:
- jobs/s from the first claim to the last completion (min(claimed_at) ..
  max(finished_at) of the jobs), verified by counting succeeded rows;
  with the peers' figure in the same shape (2 worker processes,
  concurrency 10), and with a worker setting that suits no-op jobs;
- the floor of any PostgreSQL queue on the server (pgbench,
  ops/bench/floor/run.sh);
- Procrastinate and PgQueuer on the same workload (ops/bench/peers.py);
- start lag (claim time - run time) p50/p99 at a steady 1,000 jobs/s;
- database round trips per job of the serve process (API and dispatcher):
  its store's own count of calls (minutehand_db_seconds_count: one
  statement or one pipelined round trip each), over a throughput run.
On a Citus coordinator (--citus-workers) the database is made on every node
and distributed (`migrate --citus`, --citus-shard-count Citus shards).
"""
from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import time
from collections.abc import Callable

import psycopg

from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.server import add_server_arguments, bench_server, minutehand_database
from ops.bench.store import floor

TEAM = "bench"


def start_workers(port: int, token: str, processes: int, concurrency: int,
                  app: str = "ops.bench.noop_worker:worker", urls: str | None = None,
                  logs: list | None = None) -> list[subprocess.Popen]:
    """`minutehand worker` processes of `app`, against the server on port (or
    the comma-separated urls); logs: a file per process for its output."""
    env = {**os.environ, "MINUTEHAND_WORKER_URLS": urls or f"http://127.0.0.1:{port}", "MINUTEHAND_WORKER_TOKEN": token,
           "MINUTEHAND_WORKER_CONCURRENCY": str(concurrency), "MINUTEHAND_LOG_LEVEL": "WARNING"}
    return [subprocess.Popen([sys.executable, "-m", "minutehand.cli.main", "worker", app], env=env,
                             stdout=logs[i] if logs else None, stderr=subprocess.STDOUT if logs else None)
            for i in range(processes)]


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def submit(store: Store, jobs: int, batch: int = 10_000) -> None:
    for start in range(0, jobs, batch):
        items = store.submit_many(TEAM, [JobSpec(name="noop")] * min(batch, jobs - start))
        assert all(i.error is None for i in items)


def store_round_trips(port: int) -> float:
    """The serve process's store calls so far (minutehand_db_seconds_count, every pool)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("minutehand_db_seconds_count"))


def clear(url: str, tables: str) -> None:
    """TRUNCATE with the server running: on Citus, where it locks every
    shard on every node, it may meet the dispatcher's statements in a
    distributed deadlock and be cancelled; then again."""
    for attempt in range(10):
        try:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(f"TRUNCATE {tables}")
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 9:
                raise
            time.sleep(1.0)


def throughput(url: str, port: int, token: str, jobs: int, processes: int, concurrency: int,
               prepare: Callable[[psycopg.Connection], None] | None = None) -> dict:
    """Submit `jobs` first, then start the workers; jobs/s from first claim to last completion.
    prepare: called after the submission, before the workers start (the retention benchmark
    adds finished jobs there that are neither claimed nor succeeded)."""
    clear(url, "jobs, claim_checks, due_minutes")
    with Store(url) as store:
        submit(store, jobs)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE jobs")
        if prepare is not None:
            prepare(c)
    calls = store_round_trips(port)
    workers = start_workers(port, token, processes, concurrency)
    deadline = time.monotonic() + 600
    try:
        with psycopg.connect(url, autocommit=True) as c:
            while time.monotonic() < deadline:
                done = c.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
                if done >= jobs:
                    break
                time.sleep(0.5)
            first, last, succeeded = c.execute(
                "SELECT min(claimed_at), max(finished_at), count(*) FILTER (WHERE state = 'succeeded') FROM jobs"
            ).fetchone()
        calls = store_round_trips(port) - calls
    finally:
        stop_all(workers)
    seconds = (last - first).total_seconds()
    return {"jobs_per_s": succeeded / seconds, "seconds": seconds, "verified": succeeded == jobs,
            "succeeded": succeeded, "round_trips_per_job": calls / max(succeeded, 1)}


def start_lag(url: str, token: str, port: int, rate: int, seconds: float, processes: int,
              concurrency: int) -> dict:
    """Submit `rate` due-now jobs per second (10 batches a second) with workers
    running; lag = claim time - run time of each job."""
    clear(url, "jobs, claim_checks")
    workers = start_workers(port, token, processes, concurrency)
    time.sleep(2)
    try:
        with Store(url) as store:
            t0 = time.monotonic()
            tick = 0
            while time.monotonic() - t0 < seconds:
                store.submit_many(TEAM, [JobSpec(name="noop")] * (rate // 10))
                tick += 1
                time.sleep(max(0.0, t0 + tick / 10 - time.monotonic()))
        time.sleep(2)
        with psycopg.connect(url) as c:
            p50, p99, n, late = c.execute(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s),"
                "       count(*), count(*) FILTER (WHERE s IS NULL)"
                "  FROM (SELECT extract(epoch FROM claimed_at - run_at) AS s FROM jobs) x").fetchone()
    finally:
        stop_all(workers)
    if p50 is None:                       # nothing was claimed in time: say so, not crash
        p50 = p99 = float("nan")
    return {"p50_ms": p50 * 1000, "p99_ms": p99 * 1000, "jobs": n, "unclaimed": late,
            "rate": n / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--no-peers", action="store_true", help="skip Procrastinate and PgQueuer")
    parser.add_argument("--quick", action="store_true", help="short floor and lag runs")
    args = parser.parse_args()
    with bench_server(args.dsn, "mh-bench-e2e-") as dsn:
        run(dsn, args)


def run(dsn: str, args) -> None:
    fl = floor(dsn, 5 if args.quick else 20)
    floor_rate = fl["floor_claim_delete_batch100_rows_per_s"]
    url = minutehand_database(dsn, "mh_bench_e2e", args.citus_workers, args.citus_shard_count)
    with Store(url) as store:
        store.create_team(TEAM, quota=10**6)
        token = store.create_worker_token("bench")
    port = _free_port()
    server = start_server(url, port, "", 2)
    try:
        # The lag first, on fresh tables: right after 200,000 claims the
        # current minute's partition is full of dead rows until vacuumed.
        lag = start_lag(url, token, port, 1000, 10 if args.quick else 30, 2, 100)
        print(f"start lag at {lag['rate']:,.0f} jobs/s: p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms",
              flush=True)
        ours = {}
        for label, procs, conc in (("2 workers x 10", 2, 10), ("2 workers x 500", 2, 500)):
            ours[label] = throughput(url, port, token, args.jobs, procs, conc)
            print(f"minutehand e2e, {label}: {ours[label]['jobs_per_s']:,.0f} jobs/s "
                  f"({ours[label]['seconds']:.1f} s, {ours[label]['succeeded']:,} succeeded, "
                  f"verified={ours[label]['verified']}; {ours[label]['round_trips_per_job']:.3f} "
                  f"store round trips per job)", flush=True)
    finally:
        stop_server(server)
    peers = {}
    if not args.no_peers:
        from ops.bench import peers as peer_bench
        peers["PgQueuer"] = peer_bench.run_pgqueuer(dsn, args.jobs, workers=2, concurrency=10)
        peers["Procrastinate"] = peer_bench.run_procrastinate(dsn, args.jobs, workers=2, concurrency=10)

    print()
    print(f"floor (pgbench, same server): claim+delete in batches of 100: {floor_rate:,} rows/s")
    for label, r in ours.items():
        print(f"minutehand, {label}: {r['jobs_per_s']:,.0f} jobs/s = {r['jobs_per_s'] / floor_rate:.2f}x floor"
              f" (verified {r['succeeded']:,}/{args.jobs:,} succeeded; {r['round_trips_per_job']:.3f} "
              f"store round trips per job)")
    same = ours["2 workers x 10"]["jobs_per_s"]
    best = max(r["jobs_per_s"] for r in ours.values())
    for name, r in peers.items():
        print(f"{name}, 2 workers x 10: {r['jobs_per_s']:,.0f} jobs/s = {r['jobs_per_s'] / floor_rate:.3f}x floor "
              f"(verified={r['verified']}); minutehand is {same / r['jobs_per_s']:.1f}x at the same shape, "
              f"{best / r['jobs_per_s']:.1f}x at its best")
    print(f"start lag at {lag['rate']:,.0f} jobs/s: p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms "
          f"({lag['jobs']:,} jobs, {lag['unclaimed']} unclaimed at the end)")


if __name__ == "__main__":
    main()
