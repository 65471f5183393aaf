"""What the Citus shard count costs (ops/citus/README.md, "Why 16"): for each
count, a database made on every node of a local Citus cluster (a
coordinator and workers with the citus extension installed, the workers
registered; ops/citus/README.md), migrated and distributed with that count;
prints the shard placements, the time `distribute` took, the router
planning time of a claim's DELETE on one bucket of one shard, and the time
of a fresh session's first statements on 60 wheel partitions against the
same statements warm (the metadata each backend loads on first touch).

    python -m ops.bench.citus_layout --coordinator 127.0.0.1:9700 \
        --workers 127.0.0.1:9701,127.0.0.1:9702 --counts 4,16
"""
from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from minutehand.store import citus, migrate

CLAIM = ("EXPLAIN (SUMMARY) DELETE FROM due_m240 d WHERE d.shard = 5 AND d.ctid = ANY (ARRAY("
         "SELECT c.ctid FROM due_m240 c WHERE c.shard = 5 AND c.run_at <= now() "
         "ORDER BY c.strict DESC, c.priority DESC, c.run_at LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING d.job_id")


def _node(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host, int(port)


def make_database(name: str, coordinator: tuple[str, int], workers: list[tuple[str, int]]) -> None:
    for host, port in [*workers, coordinator]:
        with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
        with psycopg.connect(host=host, port=port, user="postgres", dbname=name, autocommit=True) as c:
            c.execute("CREATE EXTENSION citus")
    with psycopg.connect(host=coordinator[0], port=coordinator[1], user="postgres", dbname=name,
                         autocommit=True) as c:
        c.execute("SELECT citus_set_coordinator_host(%s, %s)", coordinator)
        for w in workers:
            c.execute("SELECT citus_add_node(%s, %s)", w)


def planning_ms(conn: psycopg.Connection, runs: int = 40) -> float:
    out = []
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            rows = conn.execute(CLAIM).fetchall()
        out += [float(r[0].split(":")[1].split()[0]) for r in rows if r[0].startswith("Planning Time")]
    return statistics.median(out)


def first_touch_ms(url: str) -> tuple[float, float]:
    stmts = [f"SELECT count(*) FROM due_m{slot:03d} WHERE shard = 5" for slot in range(0, 480, 8)]
    fresh = []
    for _ in range(5):
        with psycopg.connect(url, autocommit=True) as c:
            t = time.perf_counter()
            for s in stmts:
                c.execute(s).fetchall()
            fresh.append((time.perf_counter() - t) * 1000)
        with psycopg.connect(url, autocommit=True) as c:
            for s in stmts:
                c.execute(s).fetchall()
            t = time.perf_counter()
            for s in stmts:
                c.execute(s).fetchall()
            warm = (time.perf_counter() - t) * 1000
    return statistics.median(fresh), warm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coordinator", default="127.0.0.1:9700")
    p.add_argument("--workers", default="127.0.0.1:9701,127.0.0.1:9702")
    p.add_argument("--counts", default="4,16")
    args = p.parse_args()
    coordinator = _node(args.coordinator)
    workers = [_node(w) for w in args.workers.split(",")]
    for n in (int(x) for x in args.counts.split(",")):
        name = f"mh_layout_{n}"
        make_database(name, coordinator, workers)
        url = f"postgresql://postgres@{coordinator[0]}:{coordinator[1]}/{name}"
        migrate.upgrade(url)
        t = time.monotonic()
        citus.distribute(url, n)
        took = time.monotonic() - t
        with psycopg.connect(url + "?options=-c%20search_path%3Dminutehand", autocommit=True) as c:
            placements = citus.placements(c)
            plan = planning_ms(c)
        fresh, warm = first_touch_ms(url + "?options=-c%20search_path%3Dminutehand")
        print(f"citus_shard_count={n} placements={placements} distribute_s={took:.1f} "
              f"claim_planning_ms={plan:.3f} first_touch_60_partitions_ms={fresh:.0f} warm_ms={warm:.0f}")


if __name__ == "__main__":
    main()
