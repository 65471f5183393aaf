"""Retention benchmark: finished jobs removed by the dispatcher's maintenance
(retain_jobs, sql/functions/retention.sql) while `minutehand serve` runs, on
a fresh durable cluster (fsync and synchronous_commit on).

    python -m ops.bench.retention                  # about 6 minutes
    python -m ops.bench.retention --quick          # smaller, for a smoke run
    python -m ops.bench.retention --dsn URL        # a server of yours
    python -m ops.bench.retention --compare        # the design measurement alone (docs/operations/retention.md)

Figures, all from one run on the same server:
1. removal rate: a backlog of finished jobs past their retention (written
   set-based, spread over the 256 shards as real ids are) is removed by the
   running server's duty; rows/s from the server's start to the last row
   gone, against the 12,000 completions/s of a billion jobs a day;
2. end-to-end throughput with retention on vs off (the e2e benchmark's
   measurement, ops/bench/e2e.py): the same due-now no-op jobs run by worker
   processes while the table also holds as many expired finished jobs, which
   the duty removes during the run (on: job_retention_s 600, so the measured
   jobs stay) or keeps (off: 10 years) — one removal per completion, as in
   a steady state; the WAL written per job in each; medians of interleaved
   runs;
3. a steady run: jobs submitted at a fixed rate and run by workers for
   several retention periods (retention 20 s); pg_total_relation_size of
   jobs (with its indexes) sampled every 10 s stays flat once the first
   periods have passed, and the jobs removed keep pace with those finished.
"""
from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.e2e import TEAM, start_workers, stop_all, throughput
from ops.bench.server import bench_server, minutehand_database

TARGET_PER_S = 12_000              # completions per second at a billion jobs a day (with spikes' headroom)
OFF_S = 315_360_000                # a retention of 10 years: nothing is removed

# Finished jobs `age` back, with ids made then (time-ordered, spread over the
# shards as mh_new_id spreads them): state dead, never claimed, so the e2e
# measurement (succeeded rows, claimed_at) does not count them.
BACKLOG = """
INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state, attempts,
                  max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at, agreed_at, finished_at)
SELECT mod(g, 256), mh_id_at(now() - %(age)s::interval + g * interval '1 ms') | (mod(g / 256, 8192) << 10)
                    | mod(g, 256),
       (SELECT id FROM teams WHERE name = %(team)s), 'old', '{}', 0, now(), 0, false, now(), 'dead', 1, 1, 1, 60,
       now() - %(age)s::interval, now(), now(), now() - %(age)s::interval
  FROM generate_series(1, %(n)s) g"""


def add_backlog(conn: psycopg.Connection, n: int, age: str = "1 day") -> None:
    conn.execute(BACKLOG, {"n": n, "age": age, "team": TEAM})
    conn.execute("VACUUM ANALYZE jobs")


def sizes(conn: psycopg.Connection) -> tuple[int, int]:
    """(pg_total_relation_size of jobs with its indexes and TOAST, rows)."""
    return conn.execute("SELECT pg_total_relation_size('jobs'), (SELECT count(*) FROM jobs)").fetchone()


def wal(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def wal_since(conn: psycopg.Connection, lsn: str) -> int:
    return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,)).fetchone()[0])


def server_settings(retention_s: int, every_s: float) -> dict[str, str]:
    return {"JOB_RETENTION_S": str(retention_s), "RETENTION_EVERY_S": str(every_s)}


def removal_rate(url: str, token: str, n: int) -> dict:
    """A backlog of n expired finished jobs; the server's duty removes them."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE jobs, claim_checks, retention_checks, retention_marks")
        add_backlog(c, n)
        port = _free_port()
        server = start_server(url, port, token, 2, server_settings(600, 1.0))
        t0 = time.monotonic()          # ready: the dispatcher takes its shards and starts its duties
        try:
            while (left := c.execute("SELECT count(*) FROM jobs").fetchone()[0]) and time.monotonic() - t0 < 600:
                time.sleep(1.0)
            seconds = time.monotonic() - t0
        finally:
            stop_server(server)
    return {"rows": n - left, "seconds": seconds, "rows_per_s": (n - left) / seconds, "left": left}


def e2e_with_retention(url: str, token: str, jobs: int, backlog: int, retention_s: int) -> dict:
    port = _free_port()
    server = start_server(url, port, token, 2, server_settings(retention_s, 1.0))
    mark: dict[str, str] = {}

    def prepare(c: psycopg.Connection) -> None:
        c.execute("TRUNCATE retention_checks, retention_marks")
        add_backlog(c, backlog)
        mark["lsn"] = wal(c)

    try:
        r = throughput(url, port, token, jobs, 2, 500, prepare=prepare)
        with psycopg.connect(url, autocommit=True) as c:
            r["wal_per_job"] = wal_since(c, mark["lsn"]) / jobs
            r["backlog_left"] = c.execute("SELECT count(*) FROM jobs WHERE name = 'old'").fetchone()[0]
    finally:
        stop_server(server)
    return r


def steady(url: str, token: str, rate: int, seconds: int, retention_s: int) -> dict:
    """Submit `rate` due-now jobs a second for `seconds` with workers and retention running."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE jobs, claim_checks, retention_checks, retention_marks")
        c.execute("VACUUM jobs")
        # Space of removed rows is reused once vacuum has seen it. In service
        # autovacuum looks every minute at a table that keeps days of jobs;
        # with a retention of 20 s it must look as much more often to
        # stand for that, so the run shortens both.
        c.execute("ALTER SYSTEM SET autovacuum_naptime = '2s'")
        c.execute("SELECT pg_reload_conf()")
    port = _free_port()
    server = start_server(url, port, token, 2, server_settings(retention_s, 2.0))
    workers = start_workers(port, token, 2, 200)
    samples = []
    try:
        with Store(url) as store, psycopg.connect(url, autocommit=True) as c:
            t0 = time.monotonic()
            tick = submitted = 0
            next_sample = 0.0
            while (elapsed := time.monotonic() - t0) < seconds:
                if elapsed >= next_sample:
                    size, rows = sizes(c)
                    finished, indexes = c.execute("SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                                                  "pg_indexes_size('jobs') FROM jobs").fetchone()
                    samples.append((elapsed, size, rows, submitted, finished))
                    print(f"  t={elapsed:5.0f} s  jobs {size / 1e6:7.1f} MB (indexes {indexes / 1e6:5.1f} MB)  "
                          f"{rows:9,} rows  ({submitted:,} submitted, {finished:,} succeeded kept)", flush=True)
                    next_sample += 10
                store.submit_many(TEAM, [JobSpec(name="noop")] * (rate // 10))
                submitted += rate // 10
                tick += 1
                time.sleep(max(0.0, t0 + tick / 10 - time.monotonic()))
            size, rows = sizes(c)
            samples.append((time.monotonic() - t0, size, rows, submitted, None))
            print(f"  t={samples[-1][0]:5.0f} s  jobs {size / 1e6:7.1f} MB  {rows:9,} rows  ({submitted:,} submitted)")
    finally:
        stop_all(workers)
        stop_server(server)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("ALTER SYSTEM RESET autovacuum_naptime")
            c.execute("SELECT pg_reload_conf()")
    return {"samples": samples, "submitted": submitted, "rate": submitted / seconds}


def delete_vs_drop(url: str, n: int) -> None:
    """The measurement behind the design (docs/operations/retention.md): n finished jobs
    removed by batched deletes walking (shard, id), one shard per statement,
    then VACUUM; against the same rows in one id-range partition dropped whole."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE jobs, claim_checks, retention_checks, retention_marks")
        for batch in (1000, 5000):
            add_backlog(c, n, "10 days")
            size = sizes(c)[0]
            cut = c.execute("SELECT mh_id_at(now())").fetchone()[0]
            lsn, t0, gone = wal(c), time.perf_counter(), 0
            for shard in range(256):
                mark = 0
                while True:
                    got, last = c.execute(
                        """WITH d AS (DELETE FROM jobs j WHERE j.shard = %(s)s AND j.id IN (
                               SELECT id FROM jobs WHERE shard = %(s)s AND id >= %(m)s AND id < %(cut)s
                                ORDER BY id LIMIT %(b)s)
                             AND j.state IN ('succeeded', 'dead', 'cancelled') RETURNING j.id)
                           SELECT count(*), max(id) FROM d""",
                        {"s": shard, "m": mark, "cut": cut, "b": batch}).fetchone()
                    gone += got
                    if got < batch:
                        break
                    mark = last + 1
            seconds, wal_b = time.perf_counter() - t0, wal_since(c, lsn)
            lsn, t0 = wal(c), time.perf_counter()
            c.execute("VACUUM jobs")
            vacuum_s, vacuum_wal = time.perf_counter() - t0, wal_since(c, lsn)
            print(f"   batched deletes of {batch}: {gone:,} rows in {seconds:.1f} s = {gone / seconds:,.0f} rows/s, "
                  f"WAL {wal_b / gone:.0f} B/row; VACUUM {vacuum_s:.1f} s, WAL {vacuum_wal / gone:.0f} B/row "
                  f"(table {size / n:.0f} B/row with its indexes)", flush=True)
        c.execute("CREATE TABLE jobs_by_id (LIKE jobs INCLUDING DEFAULTS) PARTITION BY RANGE (id)")
        c.execute("ALTER TABLE jobs_by_id ADD PRIMARY KEY (shard, id)")
        c.execute(f"CREATE TABLE jobs_by_id_0 PARTITION OF jobs_by_id FOR VALUES FROM (0) TO ({cut})")
        c.execute(BACKLOG.replace("INSERT INTO jobs", "INSERT INTO jobs_by_id"), {"n": n, "age": "10 days", "team": TEAM})
        lsn, t0 = wal(c), time.perf_counter()
        c.execute("DROP TABLE jobs_by_id_0")
        print(f"   one id-range partition of {n:,} rows dropped: {time.perf_counter() - t0:.2f} s, "
              f"WAL {wal_since(c, lsn):,} B in all", flush=True)
        c.execute("DROP TABLE jobs_by_id")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a PostgreSQL server (superuser); default: a fresh durable local cluster")
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and a shorter steady run")
    parser.add_argument("--pairs", type=int, default=3, help="e2e runs with retention off and on, interleaved")
    parser.add_argument("--rate", type=int, default=300,
                        help="jobs/s of the steady run (what the machine's workers keep up with)")
    parser.add_argument("--steady-only", action="store_true", help="only the steady run (3.)")
    parser.add_argument("--steady-s", type=int, default=150, help="seconds of the steady run")
    parser.add_argument("--compare", action="store_true",
                        help="only the design measurement: batched deletes vs dropping a partition")
    args = parser.parse_args()
    backlog = 200_000 if args.quick else 1_000_000
    jobs = 30_000 if args.quick else 100_000
    # beside the e2e run, as many expired jobs as it runs: one removal per
    # completion, as in a steady state where jobs finish and go at one rate
    e2e_backlog = jobs
    steady_s = 60 if args.quick else args.steady_s
    with bench_server(args.dsn, "mh-bench-retention-") as dsn:
        url = minutehand_database(dsn, "mh_bench_retention")
        with Store(url) as store:
            store.create_team(TEAM, quota=10**6)
            token = store.create_worker_token("bench")
        if args.compare:
            print(f"batched deletes vs a dropped partition, {backlog:,} finished jobs", flush=True)
            delete_vs_drop(url, backlog)
            return

        rem = runs = None
        if not args.steady_only:
            print(f"1. removal of a backlog of {backlog:,} expired finished jobs by the running server's duty",
                  flush=True)
            rem = removal_rate(url, token, backlog)
            print(f"   {rem['rows']:,} rows in {rem['seconds']:.1f} s = {rem['rows_per_s']:,.0f} rows/s "
                  f"({rem['rows_per_s'] / TARGET_PER_S:.1f}x the {TARGET_PER_S:,} completions/s of a billion a "
                  f"day; {rem['left']:,} left)", flush=True)

            print(f"2. e2e, {jobs:,} no-op jobs, 2 workers x 500, beside {e2e_backlog:,} expired finished jobs",
                  flush=True)
            runs = {"off": [], "on": []}
            for _ in range(args.pairs):          # interleaved: the machine's drift hits both alike
                for label, retention_s in (("off", OFF_S), ("on", 600)):
                    r = e2e_with_retention(url, token, jobs, e2e_backlog, retention_s)
                    runs[label].append(r)
                    print(f"   retention {label:3}: {r['jobs_per_s']:,.0f} jobs/s ({r['succeeded']:,} succeeded, "
                          f"verified={r['verified']}), WAL {r['wal_per_job']:,.0f} B/job, "
                          f"{r['backlog_left']:,} of the backlog left", flush=True)

        print(f"3. steady: {args.rate:,} jobs/s for {steady_s} s, retention 20 s (the duty every 2 s)", flush=True)
        st = steady(url, token, args.rate, steady_s, 20)

    print()
    if rem is not None and runs is not None:
        print(f"removal by the duty: {rem['rows_per_s']:,.0f} rows/s = {rem['rows_per_s'] / TARGET_PER_S:.1f}x "
              f"{TARGET_PER_S:,}/s")
        off, on = (statistics.median(r["jobs_per_s"] for r in runs[k]) for k in ("off", "on"))
        wal_off, wal_on = (statistics.median(r["wal_per_job"] for r in runs[k]) for k in ("off", "on"))
        print(f"e2e with retention removing as many expired jobs: {on:,.0f} jobs/s vs {off:,.0f} off = "
              f"{on / off:.3f} ({(on / off - 1) * 100:+.1f}%; medians of {args.pairs} interleaved runs each); "
              f"WAL {wal_on:,.0f} vs {wal_off:,.0f} B/job")
    # flat: the size after the first three retention periods (and the walk's margin) against the end
    settled = [s for s in st["samples"] if s[0] >= 60]
    if len(settled) >= 2:
        first, last = settled[0], settled[-1]
        low, high = min(s[1] for s in settled), max(s[1] for s in settled)
        print(f"steady {st['rate']:,.0f} jobs/s, retention 20 s: jobs {first[1] / 1e6:.1f} MB ({first[2]:,} rows) "
              f"at {first[0]:.0f} s, {last[1] / 1e6:.1f} MB ({last[2]:,} rows) at {last[0]:.0f} s "
              f"= {last[1] / first[1]:.2f}x (from 60 s on: {low / 1e6:.1f}-{high / 1e6:.1f} MB), "
              f"while {st['submitted']:,} jobs ran")


if __name__ == "__main__":
    main()
