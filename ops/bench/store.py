"""Store benchmark: submit, claim+complete, pending-set invariance, long
transactions — each also as a ratio to the floor of any PostgreSQL queue on
the same server, measured in the same run (ops/bench/floor/run.sh: pgbench
over a one-table SKIP LOCKED queue, single-row enqueue and claim+delete in
batches of 100).

    python -m ops.bench.store                # a fresh local cluster, durable (fsync on)
    python -m ops.bench.store --dsn URL      # a server of yours (its database `mh_bench` is recreated)
    python -m ops.bench.store --quick        # small sizes, to check the script itself

Clients are processes (not threads): on 2 cores the GIL would otherwise
cap the client before the server. synchronous_commit stays on. Each figure
is the median of --repeat runs; a ratio compares runs interleaved in time
(clean, held, clean, held, ...; empty database, far-future database, ...),
so that the drift of a shared machine falls on both sides alike.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import psycopg

from ops.bench.server import bench_server, minutehand_database, recreate
from minutehand.store.claim import ClaimRequest
from minutehand.store.outcomes import Complete
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec

FLOOR = Path(__file__).with_name("floor") / "run.sh"
PGBENCH_LIFECYCLE = Path(__file__).with_name("lifecycle.pgbench.sql")
TEAM = "bench"
CLIENTS = 4


def floor(dsn: str, seconds: int) -> dict[str, int]:
    """The floor's two figures (ops/bench/floor/run.sh), in a recreated database `mh_floor`."""
    url = recreate(dsn, "mh_floor")
    out = subprocess.run(["bash", str(FLOOR), url, str(seconds)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return {k: int(v) for k, v in (line.split("=") for line in out.split() if "=" in line)}


def _parallel(target, args_per_client: list[tuple]) -> float:
    """Run one process per args tuple; seconds from the start signal to the last one's end."""
    start = mp.Event()
    procs = [mp.Process(target=target, args=(start, *a)) for a in args_per_client]
    for p in procs:
        p.start()
    time.sleep(1.0)                       # let every client connect first
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a benchmark client failed (exit {p.exitcode})")
    return time.perf_counter() - t0


# ---------------------------------------------------------------- submit
def _submit_single(start, url: str, seconds: float, counter) -> None:
    with Store(url, max_size=1) as store:
        spec = JobSpec(name="bench.single", payload={"n": 1})
        start.wait()
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            store.submit(TEAM, spec)
            n += 1
        with counter.get_lock():
            counter.value += n


def bench_submit_single(url: str, seconds: float) -> float:
    counter = mp.Value("q", 0)
    elapsed = _parallel(_submit_single, [(url, seconds, counter)] * CLIENTS)
    return counter.value / elapsed


def _submit_batches(start, url: str, batches: int, size: int, due_in_s: float) -> None:
    import datetime as dt
    with Store(url, max_size=1) as store:
        start.wait()
        for _ in range(batches):
            due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=due_in_s) if due_in_s else None
            store.submit_many(TEAM, [JobSpec(name="bench.batch", due_at=due, payload={"n": i})
                                     for i in range(size)])


def bench_submit_batch(url: str, jobs: int, size: int = 10_000) -> float:
    """Due-now jobs in batches of `size`; they feed the lifecycle run."""
    per_client = max(1, jobs // size // CLIENTS)
    elapsed = _parallel(_submit_batches, [(url, per_client, size, 0)] * CLIENTS)
    return per_client * CLIENTS * size / elapsed


# ---------------------------------------------------------------- lifecycle
def _lifecycle(start, url: str, shards: list[int], owner: str, counter) -> None:
    with Store(url, max_size=1) as store:
        leases = store.take_leases(shards, owner, 3600)
        start.wait()
        n, idle = 0, False
        while not idle:
            idle = True
            for shard, epoch in leases.items():
                jobs = store.claim([ClaimRequest(shard, epoch, 100, owner)], owner, 60)[0][0]
                if jobs:
                    store.complete([Complete(j.job_id, j.lease_token, None) for j in jobs])
                    n += len(jobs)
                    idle = False
        with counter.get_lock():
            counter.value += n


def bench_lifecycle(url: str, jobs: int) -> float:
    """Claims of 100 then a batched complete, 4 clients over disjoint shard slices."""
    counter = mp.Value("q", 0)
    slices = [list(range(i, 256, CLIENTS)) for i in range(CLIENTS)]
    elapsed = _parallel(_lifecycle, [(url, s, f"bench-{i}", counter) for i, s in enumerate(slices)])
    if counter.value != jobs:
        raise SystemExit(f"lifecycle: claimed and completed {counter.value} of {jobs}")
    return jobs / elapsed


def bench_lifecycle_pgbench(url: str, seconds: int, jobs: int) -> float:
    """claim(100)+complete driven by pgbench, the floor's own client (4
    connections, -M prepared): the server side alone, without Python."""
    reset_due(url)
    bench_submit_batch(url, jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("CHECKPOINT")
        conn.execute("SELECT take_shard_lease(s, 'pgbench', 3600) FROM generate_series(0, mh_shard_count() - 1) s")
    pgbench = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"
    subprocess.run([pgbench, "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2", "-T", str(seconds),
                    "-f", str(PGBENCH_LIFECYCLE), url], check=True, capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
    if done >= jobs * 0.9:
        raise SystemExit(f"pgbench lifecycle nearly ran out of jobs ({done:,} of {jobs:,}): give it more")
    return done / seconds


def reset_due(url: str) -> None:
    """Empty the due-now work and the records of finished jobs; far-future jobs stay."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM jobs WHERE state <> 'scheduled' OR run_at < now() + interval '1 day'")
        conn.execute("TRUNCATE due_minutes")
        conn.execute("UPDATE shards SET owner = NULL, hand = NULL, lease_expires_at = NULL")
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("CHECKPOINT")


def add_far_future(url: str, count: int) -> None:
    """Jobs due 30 days out, loaded set-based (the same rows submit_jobs writes)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, count, 1_000_000):
            n = min(1_000_000, count - lo)
            conn.execute("""
                WITH g AS (SELECT mh_random_shard() AS shard,
                                  now() + interval '30 days' + random() * interval '1 day' AS run_at
                             FROM generate_series(1, %(n)s)),
                     r AS (SELECT shard, mh_new_id(shard) AS id, run_at FROM g),
                     j AS (INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict,
                                             run_at, state, max_attempts, backoff_base_s, backoff_cap_s,
                                             created_at, updated_at, agreed_at)
                           SELECT shard, id, (SELECT id FROM teams WHERE name = %(team)s), 'bench.far', '{}', 0,
                                  run_at, 0, false, run_at, 'scheduled', 3, 1, 3600, now(), now(), run_at FROM r)
                INSERT INTO due_far (shard, strict, priority, run_at, job_id, team_id)
                SELECT shard, false, 0, run_at, id, (SELECT id FROM teams WHERE name = %(team)s) FROM r""", {"n": n, "team": TEAM})
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def lifecycle_run(url: str, jobs: int, hold_snapshot: bool = False) -> tuple[float, float]:
    """(batched submit jobs/s, claim+complete jobs/s) for `jobs` due-now jobs.
    hold_snapshot: a REPEATABLE READ transaction stays open through the run."""
    with psycopg.connect(url, autocommit=True) as holder:
        if hold_snapshot:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM teams").fetchone()   # takes the snapshot, holds xmin
        reset_due(url)
        submit = bench_submit_batch(url, jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE jobs")
        rate = bench_lifecycle(url, jobs)
        if hold_snapshot:
            holder.execute("ROLLBACK")
    return submit, rate


def alternate(first, second, repeat: int) -> tuple[float, float]:
    """Medians of `repeat` runs of each, interleaved, so that the drift of a
    shared machine falls on both sides of a ratio alike."""
    a, b = [], []
    for _ in range(repeat):
        a.append(first())
        b.append(second())
    return statistics.median(a), statistics.median(b)


def new_database(dsn: str, name: str) -> str:
    url = minutehand_database(dsn, name)
    with Store(url) as store:
        store.create_team(TEAM, quota=1_000_000)
    return url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a server to use (superuser); default: a fresh local cluster")
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--far", default="1000000,10000000", help="far-future set sizes, comma-separated")
    ap.add_argument("--seconds", type=int, default=15, help="length of timed runs (floor, single submit)")
    ap.add_argument("--pgbench-jobs", type=int, default=2_000_000,
                    help="due jobs loaded for the pgbench-driven lifecycle (more than it can finish)")
    ap.add_argument("--repeat", type=int, default=3, help="lifecycle runs per figure (the median is reported)")
    ap.add_argument("--quick", action="store_true", help="small sizes: check the script, not the numbers")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.far, args.seconds, args.repeat, args.pgbench_jobs = 40_000, "100000", 3, 1, 400_000

    with bench_server(args.dsn, "mh-bench-") as args.dsn:
        run(args)


def run(args) -> None:
    fl = floor(args.dsn, args.seconds)
    enq_floor, claim_floor = fl["floor_enqueue_single_per_s"], fl["floor_claim_delete_batch100_rows_per_s"]
    url = new_database(args.dsn, "mh_bench")
    rows = []

    def report(name: str, value: float, floor_value: float | None = None, extra: str = "") -> None:
        ratio = f"{value / floor_value:6.2f}x floor" if floor_value else ""
        rows.append(f"{name:<60} {value:>10,.0f} jobs/s  {ratio} {extra}")
        print(rows[-1], flush=True)

    print(f"floor (pgbench, same server): enqueue {enq_floor:,}/s, claim+delete batch 100 {claim_floor:,} rows/s",
          flush=True)
    report("submit, single-row procedure calls, 4 connections", bench_submit_single(url, args.seconds), enq_floor)
    runs = [lifecycle_run(url, args.jobs) for _ in range(args.repeat)]
    clean = statistics.median(r[1] for r in runs)
    report("submit, batches of 10,000, 4 connections", statistics.median(r[0] for r in runs), enq_floor)
    report(f"claim(100)+complete, 4 connections, {args.jobs:,} jobs", clean, claim_floor)
    report("claim(100)+complete driven by pgbench (the floor's client)",
           bench_lifecycle_pgbench(url, args.seconds, args.pgbench_jobs), claim_floor)

    # A REPEATABLE READ snapshot held open, against clean runs interleaved with it.
    clean, held = alternate(lambda: lifecycle_run(url, args.jobs)[1],
                            lambda: lifecycle_run(url, args.jobs, hold_snapshot=True)[1], args.repeat)
    report("claim+complete, REPEATABLE READ txn held open", held, claim_floor,
           f"ratio to clean {held / clean:.3f} (clean {clean:,.0f})")

    # Far-future jobs wait in a second database, run in turn with the clean one.
    far_url = new_database(args.dsn, "mh_bench_far")
    loaded = 0
    for far in (int(x) for x in args.far.split(",") if x):
        add_far_future(far_url, far - loaded)
        loaded = far
        clean, rate = alternate(lambda: lifecycle_run(url, args.jobs)[1],
                                lambda: lifecycle_run(far_url, args.jobs)[1], args.repeat)
        report(f"claim+complete with {far:,} far-future jobs pending", rate, claim_floor,
               f"ratio to empty {rate / clean:.3f} (empty {clean:,.0f})")
    print("\nsummary")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
