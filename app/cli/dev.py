"""`minutehand dev`: the embedded PostgreSQL (started if needed, reused if
running), migrated; the HTTP API (`minutehand serve`, as a child process)
with the demo team's token printed; and a demo workload through the store,
with a status line every few seconds (the dispatcher and workers are the
next issue: until then the demo claims and completes through the store
itself). Ctrl-C stops it all cleanly, and the database too if this
command started it."""
from __future__ import annotations

import datetime as dt
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import psycopg

from app.localpg import LocalCluster
from app.settings import Settings
from app.store import migrate
from app.store.records import JobSpec
from app.store.store import Store

DB_NAME = "minutehand"
TEAM = "demo"
UTC = dt.timezone.utc


def embedded_database(settings: Settings) -> tuple[str, LocalCluster, bool]:
    """The dev cluster's URL, the cluster, and whether this call started it."""
    cluster = LocalCluster(settings.data_dir / "pgdata")
    was_running = cluster.running()
    cluster.ensure_started()
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone():
            conn.execute(f"CREATE DATABASE {DB_NAME}")
    return cluster.dsn(DB_NAME), cluster, not was_running


def demo_jobs(n: int) -> list[JobSpec]:
    """Mostly due now; some soon with a flex window; a few far ahead (they wait in the far levels)."""
    now = dt.datetime.now(UTC)
    jobs = []
    for i in range(n):
        r = random.random()
        if r < 0.8:
            jobs.append(JobSpec(name="demo.now", payload={"i": i}, priority=random.choice([0, 0, 5])))
        elif r < 0.95:
            jobs.append(JobSpec(name="demo.soon", payload={"i": i}, flex_s=10,
                                due_at=now + dt.timedelta(seconds=random.uniform(5, 60))))
        else:
            jobs.append(JobSpec(name="demo.later", payload={"i": i},
                                due_at=now + dt.timedelta(days=random.uniform(1, 5))))
    return jobs


class Stop(Exception):
    pass


def start_api(settings: Settings, url: str) -> subprocess.Popen:
    """`minutehand serve` on the dev database, as a child process."""
    env = {**os.environ, "MINUTEHAND_DATABASE_URL": url, "MINUTEHAND_HTTP_HOST": settings.http_host,
           "MINUTEHAND_HTTP_PORT": str(settings.http_port), "MINUTEHAND_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([sys.executable, "-m", "app.cli.main", "serve"], env=env)


def run(settings: Settings, args) -> None:
    cluster, started_here = None, False
    url = settings.database_url
    if not url:
        url, cluster, started_here = embedded_database(settings)
        print(f"embedded PostgreSQL at {url} (data in {cluster.data_dir})")
    migrate.upgrade(url)
    print(f"schema at revision {migrate.current(url)}")

    def on_term(*_):
        raise Stop
    signal.signal(signal.SIGTERM, on_term)
    owner = f"dev-{os.getpid()}"
    counts = dict(submitted=0, claimed=0, succeeded=0, failed=0)
    lateness: list[float] = []
    store = Store(url)
    leases: dict[int, int] = {}
    api = start_api(settings, url)
    try:
        # A token is shown once: a second run rotates it to show a fresh one.
        token = store.rotate_token(TEAM) if store.team_exists(TEAM) else store.create_team(TEAM)
        base = f"http://{settings.http_host}:{settings.http_port}"
        print(f"HTTP API at {base} (OpenAPI: {base}/schema/swagger); team {TEAM!r} token: {token}")
        print(f"  curl -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
              f"-d '{{\"name\": \"hello\"}}' {base}/v1/jobs")
        print(f"demo: team {TEAM!r}, {args.rate} jobs/s; Ctrl-C stops")
        end = time.monotonic() + args.seconds if args.seconds else None
        next_lease, next_maint, next_report = 0.0, 0.0, time.monotonic() + 5
        while end is None or time.monotonic() < end:
            tick = time.monotonic()
            if tick >= next_lease:
                leases = store.take_leases(range(256), owner, 15)
                next_lease = tick + 5
            for item in store.submit_many(TEAM, demo_jobs(args.rate)):
                counts["submitted"] += item.created
            claimed = store.claim(leases, 50, owner, 30).jobs
            counts["claimed"] += len(claimed)
            now = dt.datetime.now(UTC)
            lateness += [(now - j.run_at).total_seconds() for j in claimed]
            store.start([(j.job_id, j.lease_token) for j in claimed])
            ok = [j for j in claimed if random.random() < 0.95]
            bad = [j for j in claimed if j not in ok]
            store.complete([(j.job_id, j.lease_token, {"ok": True}) for j in ok])
            store.fail([(j.job_id, j.lease_token, "demo failure", True) for j in bad])
            counts["succeeded"] += len(ok)
            counts["failed"] += len(bad)
            if tick >= next_maint:
                m = store.maintain()
                if m.from_far or m.from_hours or m.carried or m.claims_returned:
                    print(f"  maintenance: {m}")
                next_maint = tick + 10
            if tick >= next_report:
                p50 = statistics.median(lateness) if lateness else 0.0
                p99 = statistics.quantiles(lateness, n=100)[98] if len(lateness) >= 100 else max(lateness, default=0.0)
                print(f"{dt.datetime.now():%H:%M:%S} submitted {counts['submitted']:,}  claimed {counts['claimed']:,}  "
                      f"succeeded {counts['succeeded']:,}  failed (retrying) {counts['failed']:,}  "
                      f"start - run time p50 {p50:.2f}s p99 {p99:.2f}s", flush=True)
                lateness.clear()
                next_report = tick + 5
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    except (KeyboardInterrupt, Stop):
        print("\nstopping")
    finally:
        api.terminate()
        api.wait(timeout=15)
        store.release_leases(leases, owner)
        store.close()
        if started_here:
            cluster.stop()
            print("embedded PostgreSQL stopped")
