"""HTTP API benchmark: single POST /v1/jobs requests/s and p99 latency from
64 loopback connections, and jobs/s through POST /v1/jobs/batch in batches
of 1,000, against ONE server process (`minutehand serve`), with the floor of
any PostgreSQL queue on the same server for reference.

    python -m ops.bench.api                 # a fresh durable local cluster
    python -m ops.bench.api --dsn URL       # a server of yours (database mh_bench_api is recreated)
    python -m ops.bench.api --quick         # short runs, to check the script itself

The single-request load comes from wrk (C; `apt-get install -y wrk`): a
Python load generator would take the CPU the server needs on a small
machine. Batches come from Python client processes (one request carries
1,000 jobs, so the client is not the limit). synchronous_commit stays on.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psycopg

from minutehand.store import migrate, schema
from ops.bench.server import bench_server
from minutehand.store.store import Store
from ops.bench.store import floor, recreate

TEAM = "bench"
WRK_HINT = ("wrk not found: the single-request benchmark needs it as its load generator "
            "(Debian/Ubuntu: `apt-get install -y wrk`; macOS: `brew install wrk`)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str, port: int, token: str, workers: int,
                 settings: dict[str, str] | None = None, command: str = "serve", log=None) -> subprocess.Popen:
    """`minutehand serve` (or `minutehand dispatcher`: command); settings: more
    MINUTEHAND_<NAME> values ({"JOB_RETENTION_S": "20"}); log: a file for its
    output (default: this process's)."""
    env = {**os.environ, "MINUTEHAND_DATABASE_URL": url, "MINUTEHAND_HTTP_PORT": str(port),
           "MINUTEHAND_HTTP_HOST": "127.0.0.1", "MINUTEHAND_LOG_LEVEL": "WARNING",
           "MINUTEHAND_API_SUBMIT_WORKERS": str(workers),
           **{f"MINUTEHAND_{k}": v for k, v in (settings or {}).items()}}
    proc = subprocess.Popen([sys.executable, "-m", "minutehand.cli.main", command], env=env,
                            stdout=log, stderr=subprocess.STDOUT if log else None)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited (code {proc.returncode})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return proc
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("the server did not become ready in 30 s")
    except BaseException:                 # not ready, or interrupted (Ctrl-C): no server left behind
        proc.kill()
        raise


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---------------------------------------------------------------- single
def wrk_single(port: int, token: str, seconds: int, connections: int, flex_s: int | None = None
               ) -> dict[str, float]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit(WRK_HINT)
    body = json.dumps({"name": "bench.single", "payload": {"n": 1}, **_flex(flex_s)})
    script = (f'wrk.method = "POST"\nwrk.body = \'{body}\'\n'
              f'wrk.headers["Content-Type"] = "application/json"\n'
              f'wrk.headers["Authorization"] = "Bearer {token}"\n')
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run([wrk, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", f.name,
                              f"http://127.0.0.1:{port}/v1/jobs"], check=True, capture_output=True,
                             text=True).stdout
    finally:
        os.unlink(f.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = _wrk_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = _wrk_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {"rps": rps, "p50_ms": p50, "p99_ms": p99, "non_2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": errors.group(0) if errors else "", "raw": out}


def _wrk_ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


# ---------------------------------------------------------------- batch
def _flex(flex_s: int | None) -> dict:
    """The jobs' flex window (--flex-s): flexible jobs are placed by load at submission."""
    return {} if flex_s is None else {"flex_s": flex_s}


def _batch_client(start, port: int, token: str, size: int, seconds: float, counter, flex_s: int | None = None
                  ) -> None:
    body = json.dumps({"jobs": [{"name": "bench.batch", "payload": {"n": i}, **_flex(flex_s)}
                                for i in range(size)]}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start.wait()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        conn.request("POST", "/v1/jobs/batch", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise SystemExit(f"batch answered {resp.status}: {data[:300]!r}")
        n += size
    with counter.get_lock():
        counter.value += n


def batch_jobs_per_s(port: int, token: str, size: int, seconds: float, clients: int,
                     flex_s: int | None = None) -> float:
    counter = mp.Value("q", 0)
    start = mp.Event()
    procs = [mp.Process(target=_batch_client, args=(start, port, token, size, seconds, counter, flex_s))
             for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a batch client failed (exit {p.exitcode})")
    return counter.value / (time.perf_counter() - t0)


def count_jobs(url: str, name: str) -> int:
    with psycopg.connect(schema.conninfo(url)) as conn:
        return conn.execute("SELECT count(*) FROM jobs WHERE name = %s", (name,)).fetchone()[0]


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a server to use (superuser); default: a fresh durable local cluster")
    ap.add_argument("--seconds", type=int, default=20, help="length of each timed run")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--batch-clients", type=int, default=3)
    ap.add_argument("--submit-workers", type=int, default=None,
                    help="the server's api_submit_workers (default: the setting's default)")
    ap.add_argument("--flex-s", type=int, default=None,
                    help="give every job this flex window (default: none, the jobs run at their due time)")
    ap.add_argument("--limits", action="store_true",
                    help="give the team a submission rate limit and a pending ceiling too high to refuse "
                         "anything, so every submission goes through admission control (docs/guides/teams.md, "
                         "\"Admission control\")")
    ap.add_argument("--quick", action="store_true", help="short runs: check the script, not the numbers")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 3
    if shutil.which("wrk") is None:
        raise SystemExit(WRK_HINT)

    with bench_server(args.dsn, "mh-bench-api-") as args.dsn:
        run(args)


def run(args) -> None:
    from minutehand.settings import Settings
    fl = floor(args.dsn, args.seconds)
    url = recreate(args.dsn, "mh_bench_api")
    migrate.upgrade(url)
    with Store(url) as store:
        limits = dict(submit_rate=1_000_000, submit_burst=1_000_000, max_pending=2**31 - 1) if args.limits else {}
        token = store.create_team(TEAM, quota=1_000_000, **limits)
    workers = args.submit_workers if args.submit_workers is not None else Settings().api_submit_workers
    port = _free_port()
    server = start_server(url, port, token, workers)
    try:
        wrk_single(port, token, 2, args.connections, args.flex_s)    # warm-up: pool, plans, caches
        single = wrk_single(port, token, args.seconds, args.connections, args.flex_s)
        batch = batch_jobs_per_s(port, token, args.batch_size, args.seconds, args.batch_clients, args.flex_s)
    finally:
        stop_server(server)
    stored = count_jobs(url, "bench.single")
    print(f"floor (pgbench, same server): enqueue {fl['floor_enqueue_single_per_s']:,} single-row inserts/s")
    print(f"server: one process (minutehand serve), api_submit_workers={workers}"
          + (f"; every job flexible, flex_s={args.flex_s}" if args.flex_s is not None else "")
          + ("; the team's rate limit and pending ceiling checked on every submission" if args.limits else ""))
    print(f"POST /v1/jobs, {args.connections} connections (wrk), {args.seconds} s: "
          f"{single['rps']:,.0f} requests/s, p50 {single['p50_ms']:.1f} ms, p99 {single['p99_ms']:.1f} ms, "
          f"non-2xx {single['non_2xx']} {single['socket_errors']}  "
          f"({single['rps'] / fl['floor_enqueue_single_per_s']:.2f}x floor enqueue; {stored:,} jobs stored)")
    print(f"POST /v1/jobs/batch, {args.batch_size:,}-job batches, {args.batch_clients} clients: "
          f"{batch:,.0f} jobs/s ({batch / fl['floor_enqueue_single_per_s']:.2f}x floor enqueue)")
    target_single = single["rps"] >= 3000 and single["p99_ms"] < 50
    print(f"targets: single >= 3,000/s with p99 < 50 ms: {'met' if target_single else 'NOT met'}; "
          f"batch >= 50,000 jobs/s: {'met' if batch >= 50_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
