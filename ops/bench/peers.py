"""The peers of the end-to-end benchmark: the same workload through
Procrastinate and PgQueuer (the `bench` extra), each in a fresh database of
the given server, created and dropped here.

    python -m ops.bench.peers                      # a fresh durable local cluster
    python -m ops.bench.peers --dsn URL --jobs N   # a server of yours (superuser)

Workload: N due-now no-op jobs enqueued with the peer's bulk enqueue in
batches of 10,000 (Procrastinate `Task.batch_defer_async`, PgQueuer
`Queries.enqueue` with lists), then run by `workers` OS processes, each with
`concurrency` (Procrastinate `run_worker_async(concurrency=...)`; PgQueuer
`QueueManager.run(batch_size=...)`), both in their drain mode (exit once the
queue is empty). The handler is an async no-op.

jobs/s counts from the first job start to the last job done, both read from
the peer's own tables (server clock: Procrastinate's procrastinate_events
'started'/'succeeded', PgQueuer's pgqueuer_log 'picked'/'successful'), and is
verified by counting finished rows: exactly N distinct jobs, each once.

    run_procrastinate(dsn, jobs, workers=2, concurrency=10) -> dict
    run_pgqueuer(dsn, jobs, workers=2, concurrency=10) -> dict
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from importlib.metadata import version

import psycopg

from ops.bench.server import bench_server
from ops.bench.store import floor, recreate

BATCH = 10_000
TASK = "bench_noop"
MP = mp.get_context("spawn")   # fresh interpreters: safe whatever threads or loops the caller has


# ---------------------------------------------------------------- shared
def _run_workers(target, url: str, workers: int, concurrency: int, timeout: float) -> tuple[float, list]:
    """Start `workers` processes of target(url, concurrency, barrier); all
    connect first, then start together. Waits for them to drain and exit (or
    stops them at `timeout`). (wall seconds from the start to the last exit,
    exit codes)."""
    barrier = MP.Barrier(workers + 1)
    procs = [MP.Process(target=target, args=(url, concurrency, barrier)) for _ in range(workers)]
    for p in procs:
        p.start()
    t0 = time.perf_counter()
    try:
        barrier.wait(timeout=120)
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():             # SIGTERM: both peers stop gracefully on it
                p.terminate()
                p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return time.perf_counter() - t0, [p.exitcode for p in procs]


def _figures(url: str, jobs: int, sql: str, exit_codes: list) -> dict:
    """`sql` returns (finished rows, distinct finished jobs, jobs not finished,
    seconds from the first start to the last finish)."""
    with psycopg.connect(url) as conn:
        done, distinct, left, seconds = conn.execute(sql).fetchone()
    seconds = float(seconds or 0)
    return {"jobs": jobs, "done": done, "seconds": seconds, "jobs_per_s": done / seconds if seconds else 0.0,
            "verified": done == distinct == jobs and left == 0 and exit_codes == [0] * len(exit_codes),
            "worker_exit_codes": exit_codes}


def _run(peer: str, dsn: str, jobs: int, workers: int, concurrency: int, timeout: float | None,
         install_and_enqueue, worker, sql: str) -> dict:
    url = recreate(dsn, f"mh_peer_{peer}")
    try:
        enqueue_s = asyncio.run(install_and_enqueue(url, jobs))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")      # what autovacuum would have done; no stats drift mid-run
        wall, exit_codes = _run_workers(worker, url, workers, concurrency, timeout or 120 + jobs / 50)
        return {"peer": peer, "version": version(peer), "workers": workers, "concurrency": concurrency,
                "enqueue_per_s": jobs / enqueue_s, "wall_s": wall, **_figures(url, jobs, sql, exit_codes)}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "mh_peer_{peer}" WITH (FORCE)')


# ---------------------------------------------------------------- Procrastinate
def _procrastinate_app(url: str):
    import procrastinate
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))   # its default pool

    @app.task(name=TASK)
    async def bench_noop() -> None:
        pass

    return app


async def procrastinate_enqueue(url: str, jobs: int) -> float:
    """Schema (what `procrastinate schema --apply` runs), then batch_defer_async
    in batches; the seconds the enqueue took."""
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks[TASK]
        t0 = time.perf_counter()
        for lo in range(0, jobs, BATCH):
            await task.batch_defer_async(*({} for _ in range(min(BATCH, jobs - lo))))
        return time.perf_counter() - t0


def procrastinate_worker(url: str, concurrency: int, barrier) -> None:
    async def main() -> None:
        app = _procrastinate_app(url)
        async with app.open_async():
            barrier.wait(timeout=120)
            await app.run_worker_async(concurrency=concurrency, wait=False)
    asyncio.run(main())


PROCRASTINATE_SQL = """
    SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
           (SELECT count(DISTINCT job_id) FROM procrastinate_events WHERE type = 'succeeded'),
           (SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'),
           (SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                                    - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events)"""


def run_procrastinate(dsn: str, jobs: int, workers: int = 2, concurrency: int = 10,
                      timeout: float | None = None) -> dict:
    return _run("procrastinate", dsn, jobs, workers, concurrency, timeout,
                procrastinate_enqueue, procrastinate_worker, PROCRASTINATE_SQL)


# ---------------------------------------------------------------- PgQueuer
async def pgqueuer_enqueue(url: str, jobs: int) -> float:
    """Queries.install (what `pgq install` runs), then Queries.enqueue with
    lists in batches; the seconds the enqueue took."""
    from pgqueuer import PsycopgDriver, Queries
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        t0 = time.perf_counter()
        for lo in range(0, jobs, BATCH):
            n = min(BATCH, jobs - lo)
            await queries.enqueue([TASK] * n, [None] * n, [0] * n)
        return time.perf_counter() - t0


def pgqueuer_worker(url: str, concurrency: int, barrier) -> None:
    from pgqueuer import Job, PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            qm = QueueManager(Queries(PsycopgDriver(conn)))

            @qm.entrypoint(TASK)
            async def bench_noop(job: Job) -> None:
                pass

            barrier.wait(timeout=120)
            await qm.run(batch_size=concurrency, mode=QueueExecutionMode.drain)
    asyncio.run(main())


PGQUEUER_SQL = """
    SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'),
           (SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'),
           (SELECT count(*) FROM pgqueuer),
           (SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                                    - min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log)"""


def run_pgqueuer(dsn: str, jobs: int, workers: int = 2, concurrency: int = 10,
                 timeout: float | None = None) -> dict:
    return _run("pgqueuer", dsn, jobs, workers, concurrency, timeout,
                pgqueuer_enqueue, pgqueuer_worker, PGQUEUER_SQL)


PEERS = {"procrastinate": run_procrastinate, "pgqueuer": run_pgqueuer}


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a server to use (superuser); default: a fresh local cluster")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=15, help="length of the floor's timed runs")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of: " + ", ".join(PEERS))
    args = ap.parse_args()

    with bench_server(args.dsn, "mh-bench-peers-") as dsn:
        claim_floor = floor(dsn, args.seconds)["floor_claim_delete_batch100_rows_per_s"]
        print(f"floor (pgbench, same server): claim+delete batch 100 {claim_floor:,} rows/s", flush=True)
        results = {}
        for name in args.peers.split(","):
            r = results[name] = PEERS[name](dsn, args.jobs, args.workers, args.concurrency)
            print(f"{name} {r['version']:<8} {r['jobs']:,} no-op jobs, {r['workers']} workers x {r['concurrency']}: "
                  f"{r['jobs_per_s']:>8,.0f} jobs/s {r['jobs_per_s'] / claim_floor:6.3f}x floor  "
                  f"({r['seconds']:.1f} s first start to last done; {r['done']:,} done, "
                  f"{'verified' if r['verified'] else 'NOT VERIFIED, worker exits ' + str(r['worker_exit_codes'])}; bulk enqueue {r['enqueue_per_s']:,.0f} jobs/s)",
                  flush=True)
        if {"procrastinate", "pgqueuer"} <= results.keys():
            ratio = results["pgqueuer"]["jobs_per_s"] / results["procrastinate"]["jobs_per_s"]
            print(f"pgqueuer / procrastinate: {ratio:.2f}x")
        if not all(r["verified"] for r in results.values()):
            raise SystemExit("a peer's run was not verified")


if __name__ == "__main__":
    from ops.bench.peers import main as imported_main   # Procrastinate warns of an App made in __main__
    imported_main()
