"""`minutehand dev`: the embedded PostgreSQL (started if needed, reused if
running), migrated; `minutehand serve` (HTTP API + dispatcher) and a demo
worker (`minutehand worker app.cli.demo_worker:worker`) as child processes,
with the demo team's token printed; and a demo workload submitted through
the store, with a status line every few seconds. Ctrl-C stops it all
cleanly, and the database too if this command started it."""
from __future__ import annotations

import datetime as dt
import os
import random
import signal
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


def start_child(settings: Settings, env: dict[str, str], *argv: str) -> subprocess.Popen:
    """A `minutehand ...` child process with the dev settings."""
    env = {**os.environ, "MINUTEHAND_HTTP_HOST": settings.http_host,
           "MINUTEHAND_HTTP_PORT": str(settings.http_port), "MINUTEHAND_LOG_LEVEL": "WARNING", **env}
    return subprocess.Popen([sys.executable, "-m", "app.cli.main", *argv], env=env)


def stop_child(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


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
    store = Store(url)
    base = f"http://{settings.http_host}:{settings.http_port}"
    children = [start_child(settings, {"MINUTEHAND_DATABASE_URL": url}, "serve")]
    try:
        # A token is shown once: a second run rotates it to show a fresh one.
        token = store.rotate_token(TEAM) if store.team_exists(TEAM) else store.create_team(TEAM)
        worker_token = store.create_worker_token("demo-worker")
        children.append(start_child(settings, {"MINUTEHAND_WORKER_URLS": base, "MINUTEHAND_WORKER_TOKEN": worker_token,
                                               "MINUTEHAND_WORKER_CONCURRENCY": "50"},
                                    "worker", "app.cli.demo_worker:worker"))
        print(f"HTTP API and dispatcher at {base} (OpenAPI: {base}/schema/swagger); team {TEAM!r} token: {token}")
        print(f"  curl -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
              f"-d '{{\"name\": \"demo.now\"}}' {base}/v1/jobs")
        print(f"demo: team {TEAM!r}, {args.rate} jobs/s, run by a demo worker; Ctrl-C stops")
        end = time.monotonic() + args.seconds if args.seconds else None
        next_report = time.monotonic() + 5
        submitted = 0
        while end is None or time.monotonic() < end:
            tick = time.monotonic()
            submitted += sum(item.created for item in store.submit_many(TEAM, demo_jobs(args.rate)))
            if tick >= next_report:
                s = store.team_stats(TEAM, window_s=3600)
                by_state = ", ".join(f"{k} {v:,}" for k, v in sorted(s.by_state.items()))
                late = (f"start - due p50 {s.lateness_p50_s:.3f}s p99 {s.lateness_p99_s:.3f}s"
                        if s.lateness_p50_s is not None else "no starts yet")
                print(f"{dt.datetime.now():%H:%M:%S} submitted {submitted:,}; last hour: {by_state}; {late}",
                      flush=True)
                next_report = tick + 5
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    except (KeyboardInterrupt, Stop):
        print("\nstopping")
    finally:
        for child in reversed(children):        # the worker first: it gives back what it holds
            stop_child(child)
        store.close()
        if started_here:
            cluster.stop()
            print("embedded PostgreSQL stopped")
