"""`minutehand dev`: the embedded PostgreSQL (started if needed, reused if
running), migrated; `minutehand serve` (HTTP API + dispatcher) and a demo
worker (`minutehand worker minutehand.dev.demo_worker:worker`) as child processes;
and a demo workload submitted through the store, with a status line every
few seconds.

It prints what a newcomer needs: the demo team's token (with a curl line),
the admin UI's address and a token to sign in with (the admin_token
setting, or one made up for this run and handed to serve), and the environment for a worker of their own against this instance (the
database URL, the dispatcher URL and a worker token "dev-user" of its own,
new each run).

The demo never outruns the machine: the submitter pauses while the demo
team has more than a few seconds' worth of due jobs not yet started, and
says so. At start, what a previous run left unfinished is reported, and its
backlog (jobs due by now or soon) is cancelled (see cancel_leftovers for why).

Stopping: SIGINT (Ctrl-C) or SIGTERM. Handlers for both are installed
explicitly, so a SIGINT that was ignored when this started (a background
job of a script, `setsid`) still stops it. The children run in a process
group of their own, so a Ctrl-C reaches only this process, which stops the
worker first (it gives back what it holds), then serve, then the database
if this command started it. Each child also stops by itself if this
process dies without stopping it (its stdin, a pipe from here, closes).

Run as `python -m minutehand.dev.command ARGS...`, this module is the children's entry
point: `minutehand ARGS...` plus that stdin watch.
"""
from __future__ import annotations

import datetime as dt
import os
import random
import runpy
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

from minutehand.dev.demo_worker import NAMES as DEMO_NAMES
from minutehand.dev.localpg import LocalCluster
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.records import Repeat
from minutehand.store.stats import quantile_bound
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec

DB_NAME = "minutehand"
TEAM = "demo"
DEMO_WORKER = "demo-worker"     # the worker token of the demo worker (a child process)
USER_WORKER = "dev-user"        # the worker token printed for the user's own worker
BACKLOG_S = 5                   # the submitter pauses above this many seconds' worth of due jobs
LEFTOVER_SOON_S = 120           # a previous run's jobs due within this long are its backlog
UTC = dt.timezone.utc

# ---------------------------------------------------------------- stopping
class Stop(Exception):
    pass


class Stopper:
    """SIGINT and SIGTERM handlers. While `deferred` (setting up the database:
    an initdb or migration cut short can leave a cluster that does not start),
    a signal is only recorded and raised at the next check(); otherwise it
    raises Stop at once. While stopping, a further signal only sets `hurry`:
    the children are then killed instead of waited for."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.deferred = False
        self.stopping = False
        self.hurry = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.stopping:
            self.hurry = True
            print(f"\n{signal.Signals(signum).name} again: killing the children", flush=True)
            return
        self.signal = self.signal or signal.Signals(signum).name
        if not self.deferred:
            raise Stop

    def check(self) -> None:
        if self.signal:
            raise Stop


# ---------------------------------------------------------------- children
def child_main(argv: list[str]) -> None:
    """A child's entry: `minutehand argv...`, and SIGTERM to itself when its
    stdin (a pipe from `minutehand dev`) closes, i.e. when the parent is gone
    however it ended."""
    def watch() -> None:
        # os.read, not sys.stdin: a daemon thread blocked inside the buffered
        # reader would hold its lock when the interpreter shuts down (fatal).
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    # The `minutehand` program, run as a program (as `python -m` would), not
    # imported: the CLI reaches this package, so this package does not import the CLI.
    sys.argv = ["minutehand", *argv]
    runpy.run_module("minutehand.cli.main", run_name="__main__", alter_sys=True)


def start_child(settings: Settings, env: dict[str, str], *argv: str) -> subprocess.Popen:
    """A `minutehand ...` child process with the dev settings, in a process
    group of its own (a Ctrl-C in the terminal reaches only the parent)."""
    env = {**os.environ, "MINUTEHAND_HTTP_HOST": settings.http_host,
           "MINUTEHAND_HTTP_PORT": str(settings.http_port), "MINUTEHAND_LOG_LEVEL": "WARNING", **env}
    return subprocess.Popen([sys.executable, "-m", "minutehand.dev.command", *argv], env=env,
                            stdin=subprocess.PIPE, process_group=0)


def wait_for_api(base: str, serve: subprocess.Popen, timeout: float = 60) -> None:
    """Until serve answers /healthz (so the printed curl line works at once,
    and the demo worker does not start with connection errors)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            raise SystemExit(f"minutehand serve exited with code {serve.returncode} (is {base} in use?)")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"minutehand serve did not answer at {base} within {timeout:.0f} s")


def stop_child(proc: subprocess.Popen, stopper: Stopper, timeout: float = 40) -> None:
    """SIGTERM, then wait (the worker drains within worker_grace_s); SIGKILL
    after `timeout` or at once when a second signal asked to hurry."""
    if proc.poll() is None:
        proc.terminate()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not stopper.hurry and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdin:
        proc.stdin.close()


# ---------------------------------------------------------------- the database
def embedded_cluster(settings: Settings) -> tuple[LocalCluster, bool]:
    """The dev cluster, started, and whether this call started it."""
    cluster = LocalCluster(settings.data_dir / "pgdata")
    was_running = cluster.running()
    cluster.ensure_started()
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone():
            conn.execute(f"CREATE DATABASE {DB_NAME}")
    return cluster, not was_running


def cancel_leftovers(store: Store) -> None:
    """Report what a previous run left unfinished, and cancel its backlog:
    the demo jobs due by now or within LEFTOVER_SOON_S.

    Why cancel rather than run them: they are synthetic jobs nobody waits
    for. Run first, a backlog carried over would make this run's status line
    report the previous run's lateness (minutes, not milliseconds), and the
    submitter would start paused behind it. The demo jobs due later (demo.later,
    days ahead) are kept: they are no backlog, and they are there to show that
    a job waiting in the wheel's far levels starts on time; if no demo runs
    when they come due, a later start cancels them as backlog. Cancelling goes
    through the store's cancel (one procedure call per job), which refuses a
    job that started meanwhile. Jobs still claimed by a previous worker cannot
    be cancelled: their claims expire (claim_lease_s) and the demo worker
    runs them."""
    if not store.team_exists(TEAM):
        return
    pending = store.unstarted_jobs(TEAM, list(DEMO_NAMES), soon_s=LEFTOVER_SOON_S)
    stats = store.team_stats(TEAM, window_s=86400)
    claimed = stats.running if stats else 0
    backlog_ids = [p["id"] for p in pending if p["soon"]]
    later = len(pending) - len(backlog_ids)
    if not pending and not claimed:
        return
    print(f"left from a previous run: {len(backlog_ids):,} unstarted demo jobs due by now or within "
          f"{LEFTOVER_SOON_S} s, {later:,} due later, {claimed:,} claimed or running", flush=True)
    if backlog_ids:
        t0 = time.monotonic()
        cancelled = 0
        pool = ThreadPoolExecutor(4)
        try:                            # in chunks: a Ctrl-C waits for one chunk at most
            for i in range(0, len(backlog_ids), 1000):
                cancelled += sum(pool.map(lambda job_id: store.cancel(job_id, TEAM).ok,
                                          backlog_ids[i:i + 1000]))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        print(f"  cancelled {cancelled:,} of the {len(backlog_ids):,} due ones in {time.monotonic() - t0:.1f} s: "
              "synthetic jobs, and this run starts without a backlog", flush=True)
    if later:
        print(f"  kept the {later:,} due later (demo.later): they run when due if a demo runs then", flush=True)
    if claimed:
        print("  the claimed ones come back when their claims expire, and the demo worker runs them", flush=True)


def backlog(store: Store, cap: int) -> int:
    """The demo's due jobs not yet claimed, up to cap. Only the demo's own job
    names count: jobs the user submits as team "demo" under other names (for
    a worker of their own) are theirs."""
    return store.due_unclaimed(TEAM, list(DEMO_NAMES), cap)


# ---------------------------------------------------------------- the demo
def _bound(s: float | None) -> str:
    """A histogram bucket's upper bound as the status line shows it."""
    return "over 1 h" if s is None else f"{s:g}s"


def start_demo_series(store: Store) -> None:
    """A repeating job, every 30 s (a run a period late is folded into the
    next: misfire run_once), made once per database: a later run finds it
    (the leftover run cancel_leftovers cancelled only skips one occurrence)."""
    if not any(s.name == "demo.tick" and s.state != "cancelled" for s in store.list_series(TEAM).series):
        store.submit(TEAM, JobSpec(name="demo.tick", repeat=Repeat(every_s=30)))


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


def print_intro(url: str, base: str, token: str, user_token: str, rate: int, admin_token: str | None) -> None:
    bindir = Path(sys.executable).parent
    print(f"HTTP API and dispatcher at {base} (OpenAPI: {base}/schema/swagger); team {TEAM!r} token: {token}")
    print(f"  curl -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
          f"-d '{{\"name\": \"demo.now\"}}' {base}/v1/jobs")
    signin = f"the admin token {admin_token}" if admin_token else "your admin_token setting"
    print(f"admin UI at {base}/admin/ : sign in with {signin} (or the team token above)")
    print(f"your own worker against this instance (in another shell, in the folder of mymodule.py; it gets\n"
          f"the jobs named after its handlers; worker token {USER_WORKER!r}, new each run, shown once):\n"
          f"  export MINUTEHAND_DATABASE_URL={url}\n"
          f"  export MINUTEHAND_WORKER_URLS={base}\n"
          f"  export MINUTEHAND_WORKER_TOKEN={user_token}\n"
          f"  {bindir / 'minutehand'} worker mymodule:worker")
    print(f"demo: team {TEAM!r}, up to {rate} jobs/s ({', '.join(DEMO_NAMES)}), run by a demo worker; "
          "Ctrl-C stops", flush=True)


def run(settings: Settings, args) -> None:
    stopper = Stopper()
    stopper.install()
    cluster, started_here = None, False
    children: list[subprocess.Popen] = []
    store = None
    try:
        stopper.deferred = True
        url = settings.database_url
        if not url:
            cluster, started_here = embedded_cluster(settings)
            url = cluster.dsn(DB_NAME)
            print(f"embedded PostgreSQL at {url} (data in {cluster.data_dir})", flush=True)
        migrate.upgrade(url)
        print(f"schema at revision {migrate.current(url)}", flush=True)
        stopper.deferred = False
        stopper.check()

        store = Store(url)
        # A token is shown once: each run rotates them to show fresh ones.
        token = store.rotate_token(TEAM) if store.team_exists(TEAM) else store.create_team(
            TEAM, quota=settings.default_team_quota, weight=settings.default_team_weight)
        demo_token = store.create_worker_token(DEMO_WORKER)
        user_token = store.create_worker_token(USER_WORKER)
        cancel_leftovers(store)
        start_demo_series(store)

        base = f"http://{settings.http_host}:{settings.http_port}"
        # The admin UI needs an admin token: the setting's, or one for this run.
        admin_token = settings.admin_token or "mha_" + secrets.token_urlsafe(24)
        children.append(start_child(settings, {"MINUTEHAND_DATABASE_URL": url, "MINUTEHAND_ADMIN_TOKEN": admin_token},
                                    "serve"))
        wait_for_api(base, children[0])
        # The demo worker logs errors only: its jobs fail on purpose now and
        # then (retries show in the status line), a warning line each would
        # bury the status lines.
        children.append(start_child(settings, {"MINUTEHAND_WORKER_URLS": base,
                                               "MINUTEHAND_WORKER_TOKEN": demo_token,
                                               "MINUTEHAND_WORKER_CONCURRENCY": "50",
                                               "MINUTEHAND_LOG_LEVEL": "ERROR"},
                                    "worker", "minutehand.dev.demo_worker:worker"))
        print_intro(url, base, token, user_token, args.rate, None if settings.admin_token else admin_token)
        demo_loop(store, children, args)
    except Stop:
        print(f"\nstopping ({stopper.signal})", flush=True)
    finally:
        stopper.stopping = True
        for child in reversed(children):        # the worker first: it gives back what it holds
            stop_child(child, stopper)
        if store is not None:
            store.close()
        if started_here:
            cluster.stop()
            print("embedded PostgreSQL stopped", flush=True)


def demo_loop(store: Store, children: list[subprocess.Popen], args) -> None:
    """Submit `rate` jobs a second, pausing while more than BACKLOG_S seconds'
    worth of the demo's due jobs wait unstarted (a busy machine runs fewer
    than `rate` a second: the backlog would only grow); a status line every 5 s."""
    end = time.monotonic() + args.seconds if args.seconds else None
    next_report = time.monotonic() + 5
    submitted, paused = 0, False
    limit = max(1, BACKLOG_S * args.rate)
    while end is None or time.monotonic() < end:
        tick = time.monotonic()
        for child in children:
            if child.poll() is not None:
                raise SystemExit(f"a child process (minutehand {' '.join(map(str, child.args[3:]))}) "
                                 f"exited with code {child.returncode}")
        waiting = backlog(store, limit + 1)
        if waiting > limit and not paused:
            paused = True
            print(f"{dt.datetime.now():%H:%M:%S} pausing the demo: over {limit:,} due jobs not started "
                  f"({BACKLOG_S} s at {args.rate}/s): this machine runs fewer than {args.rate} jobs/s "
                  "(try --rate lower)", flush=True)
        elif paused and waiting <= limit // 2:
            paused = False
            print(f"{dt.datetime.now():%H:%M:%S} resuming the demo: {waiting:,} due jobs not started",
                  flush=True)
        if not paused:
            submitted += sum(item.created for item in store.submit_many(TEAM, demo_jobs(args.rate)))
        if tick >= next_report:
            s = store.team_stats(TEAM, window_s=3600)
            t = s.total
            by_state = (f"started {t.started:,}, succeeded {t.succeeded:,}, failed {t.failed:,}, dead {t.dead:,}, "
                        f"running {s.running:,}")
            p50, p99 = quantile_bound(t.lateness_hist, 0.5), quantile_bound(t.lateness_hist, 0.99)
            late = ("no starts yet" if not t.started else
                    f"start - agreed run time p50 <= {_bound(p50)} p99 <= {_bound(p99)}")
            due = (f"{'over ' if waiting > limit else ''}{min(waiting, limit):,} due not started"
                   + (" (paused)" if paused else ""))
            print(f"{dt.datetime.now():%H:%M:%S} submitted {submitted:,}; {due}; last hour: {by_state}; {late}",
                  flush=True)
            next_report = tick + 5
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))


if __name__ == "__main__":
    child_main(sys.argv[1:])
