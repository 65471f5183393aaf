"""Sustained benchmark: jobs that trickle in and run for seconds each, the
shape the scheduler is sized for (a billion jobs a day: 11,574 jobs/s
arriving, each running ~10 s, ~115,740 running at once).

Due-now jobs arrive steadily through POST /v1/jobs/batch (a batch every
100 ms, from a client process of its own), run by 2 `minutehand worker`
processes whose handler sleeps --job-s (asyncio: a sleeping job holds a
slot, not a thread; ops/bench/sleep_worker.py) with worker_concurrency
50,000, against one `minutehand serve` (--dispatchers 2: and one
`minutehand dispatcher`) with dispatch_batch 1,000 and claim_lease_s 15
(so heartbeats happen), on a fresh durable cluster (fsync and
synchronous_commit on; track_functions on for the benchmark's database).
The offered rate steps up (--rates, --step-s each) and the run stops after
the first step that cannot keep up (claims below 95% of the offered rate,
the jobs due and waiting for a claim growing by more than 2 s of arrivals
over the window, or the client unable to offer the rate).

    python -m ops.bench.sustained                                  # 500 .. 11,574 jobs/s, 180 s steps
    python -m ops.bench.sustained --step-s 60 --rates 500,1000,2000,4000
    python -m ops.bench.sustained --dispatchers 2
    python -m ops.bench.sustained --dsn URL       # a server of yours (database mh_bench_sustained is recreated)
    python -m ops.bench.sustained --dsn URL --citus-workers h:p,h:p   # URL a Citus coordinator: the database
                                                                      # made on every node and distributed

Per step, over the step after --warmup-s (the window), every figure from
the database or /proc, nothing from the scheduler's own code:
- completions/s (jobs finished in the window) and the jobs running at once
  (mean over the window: each job's claim-to-finish time within it);
- start lag p50/p99/max (claimed_at - run_at) of the jobs due in the
  window; a job not claimed by the step's end counts up to then (>=);
- claim calls/s and jobs per call: calls of the claim functions
  (--claim-functions) from pg_stat_user_functions, jobs claimed in the
  window from the jobs table;
- CPU per completed job by process (/proc): each serve/dispatcher, each
  worker, the PostgreSQL server in total (postmaster, its live children and
  the children it reaped; on Citus each node apart), and the load generator
  apart;
- database time per procedure: pg_stat_user_functions deltas (calls/s,
  self and total ms per call, self time as a share of one core), the top
  ones by self time;
- the warnings and errors the processes logged in the step, by kind (a
  worker's claim_lost, a dispatcher unreachable, a maintenance run skipped);
  each process's whole output is kept in a folder the run names;
- the machine's load average at the step's end (a shared box).

Before the steps: the floor of any PostgreSQL queue on the same server
(ops/bench/floor/run.sh, ops.bench.store.floor) and the start lag at
1,000 jobs/s the way docs/contributing/benchmarks.md states it (ops.bench.e2e's own step: no-op
jobs submitted through the store, 2 workers x 100, 30 s, a `minutehand
serve` with default settings).
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import multiprocessing as mp
import os
import re
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from minutehand.store import schema
from minutehand.store.store import Store
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.e2e import TEAM, start_lag, start_workers, stop_all
from ops.bench.server import add_server_arguments, bench_server, citus_nodes, minutehand_database
from ops.bench.store import floor

JOB = "midnight.sleep"                # ops/bench/sleep_worker.py: sleeps payload.ms
TICK_S = 0.1                          # a batch every 100 ms
CLIENT_CONNECTIONS = 4                # the load generator's connections (a slow answer does not stall the next tick)
KEEPS_UP = 0.95                       # a step keeps up when claims reach this share of the offered rate
BACKLOG_GROWTH_S = 2.0                # ... and its due jobs waiting for a claim grow by less than this many seconds' arrivals
SERVER_SETTINGS = {"CLAIM_LEASE_S": "15", "DISPATCH_BATCH": "1000"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the load generator
def _offer(port: int, token: str, job_ms: int, rate, sent, refused, behind, stop) -> None:
    """POST /v1/jobs/batch on a fixed schedule of TICK_S ticks, the batch
    size following `rate` (jobs/s; 0: pause). Tick n goes out on connection
    n mod CLIENT_CONNECTIONS; one sent later than a tick after its time
    counts in `behind` (the client could not offer the rate)."""
    bodies: dict[int, bytes] = {}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    t0 = time.monotonic()

    def connection(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        n = k
        while not stop.is_set():
            at = t0 + n * TICK_S
            time.sleep(max(0.0, at - time.monotonic()))
            if time.monotonic() > at + TICK_S:
                with behind.get_lock():
                    behind.value += 1
            r = rate.value
            size = int(r * (n + 1) * TICK_S) - int(r * n * TICK_S)
            n += CLIENT_CONNECTIONS
            if size <= 0:
                continue
            if size not in bodies:
                bodies[size] = json.dumps({"jobs": [{"name": JOB, "payload": {"ms": job_ms}}] * size}).encode()
            try:
                conn.request("POST", "/v1/jobs/batch", bodies[size], headers)
                resp = conn.getresponse()
                answer = json.loads(resp.read())
                ok = resp.status == 200 and not any(i.get("error") for i in answer["items"])
            except (OSError, ValueError, KeyError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                ok = False
            with (sent if ok else refused).get_lock():
                (sent if ok else refused).value += size

    threads = [threading.Thread(target=connection, args=(k,), daemon=True) for k in range(CLIENT_CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class LoadGenerator:
    """The client process offering the rate (its CPU is measured apart)."""

    def __init__(self, port: int, token: str, job_ms: int):
        self.rate = mp.Value("d", 0.0)
        self.sent, self.refused, self.behind = mp.Value("q", 0), mp.Value("q", 0), mp.Value("q", 0)
        self.stop = mp.Event()
        self.proc = mp.Process(target=_offer, args=(port, token, job_ms, self.rate, self.sent, self.refused,
                                                    self.behind, self.stop), daemon=True)
        self.proc.start()

    def counts(self) -> tuple[int, int, int]:
        return self.sent.value, self.refused.value, self.behind.value

    def close(self) -> None:
        self.rate.value = 0.0
        self.stop.set()
        self.proc.join(70)
        if self.proc.is_alive():
            self.proc.kill()


# ---------------------------------------------------------------- what is read
class LogTally:
    """The processes' output, each in a file of its own; counts the warnings
    and errors written since the last call: a worker's by its event name
    (its log lines are JSON), a server's by logger and message (digits out)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.files: dict[str, object] = {}
        self.read_to: dict[str, int] = {}

    def open(self, label: str):
        f = open(self.folder / f"{label.replace(' ', '_')}.log", "w")
        self.files[label] = f
        self.read_to[label] = 0
        return f

    def since_last(self) -> Counter:
        counts: Counter = Counter()
        for label, f in self.files.items():
            f.flush()
            with open(f.name, errors="replace") as r:
                r.seek(self.read_to[label])
                text = r.read()
                self.read_to[label] = r.tell()
            for line in text.splitlines():
                if line.startswith("{"):
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if entry.get("level") in ("warning", "error", "critical"):
                        counts[f"{label.split()[0]}: {entry.get('event')}"
                               + (f" ({entry['reason'].split(':')[0]})" if "reason" in entry else "")] += 1
                elif line.startswith(("WARNING - ", "ERROR - ", "CRITICAL - ")):
                    # LEVEL - time - logger - module - message (minutehand.serve's format)
                    parts = line.split(" - ", 4)
                    logger, message = (parts[2], parts[4]) if len(parts) == 5 else ("", parts[-1])
                    kind = re.sub(r"[0-9]+", "N", re.sub(r'"[^"]*"', '"..."', message))[:90]
                    counts[f"{label.split()[0]}: {parts[0]} {logger}: {kind}"] += 1
        return counts

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU of a process (and of the children it reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / CLK_TCK


def postmaster_of(conn: psycopg.Connection) -> int | None:
    """The server's postmaster pid, if it runs on this machine (a backend's parent)."""
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        parent = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent if Path(f"/proc/{parent}/comm").read_text().strip() in ("postgres", "postmaster") else None
    except (OSError, ValueError, IndexError):
        return None


def postgres_cpu(postmaster: int) -> float:
    """The whole server: the postmaster, its live children, and those it reaped."""
    total = cpu_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                       # gone meanwhile
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


@dataclass
class Snapshot:
    at: dt.datetime
    cpu: dict[str, float]
    functions: dict[str, tuple[int, float, float]]      # name -> calls, total ms, self ms


def postmasters(url: str, citus_workers: str) -> dict[str, int]:
    """{label: postmaster pid} of the servers on this machine: the one
    server, or (citus_workers) the coordinator and each worker node."""
    nodes = {"postgres (all backends)": url}
    if citus_workers:
        nodes = {"postgres coordinator": url}
        user = urlsplit(url).netloc.rpartition("@")[0]
        for host, port in citus_nodes(citus_workers):
            netloc = f"{user}@{host}:{port}" if user else f"{host}:{port}"
            nodes[f"postgres worker {host}:{port}"] = urlsplit(url)._replace(netloc=netloc).geturl()
    found = {}
    for label, node in nodes.items():
        with psycopg.connect(schema.conninfo(node)) as c:
            if (pid := postmaster_of(c)) is not None:
                found[label] = pid
    return found


def snapshot(conn: psycopg.Connection, procs: dict[str, int], servers: dict[str, int]) -> Snapshot:
    cpu = {label: cpu_seconds(pid) for label, pid in procs.items()}
    cpu.update((label, postgres_cpu(pid)) for label, pid in servers.items())
    conn.execute("SELECT pg_stat_clear_snapshot()")
    functions = {name: (calls, total, self_) for name, calls, total, self_ in conn.execute(
        "SELECT funcname, sum(calls)::bigint, sum(total_time), sum(self_time) FROM pg_stat_user_functions GROUP BY 1")}
    return Snapshot(dt.datetime.now(dt.timezone.utc), cpu, functions)


def job_figures(conn: psycopg.Connection, a: dt.datetime, b: dt.datetime, now: dt.datetime) -> dict:
    """From the jobs table: completions and claims in [a, b), the mean
    running at once over it, and the start lag of the jobs due in it (one
    not claimed by `now` counts up to then)."""
    row = conn.execute(
        """SELECT count(*) FILTER (WHERE state = 'succeeded' AND finished_at >= %(a)s AND finished_at < %(b)s),
                  count(*) FILTER (WHERE claimed_at >= %(a)s AND claimed_at < %(b)s),
                  coalesce(sum(extract(epoch FROM least(coalesce(finished_at, %(b)s), %(b)s)
                                              - greatest(claimed_at, %(a)s)))
                           FILTER (WHERE claimed_at < %(b)s AND coalesce(finished_at, %(b)s) > %(a)s), 0),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) FILTER (WHERE run_at >= %(a)s AND run_at < %(b)s),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) FILTER (WHERE run_at >= %(a)s AND run_at < %(b)s),
                  max(lag) FILTER (WHERE run_at >= %(a)s AND run_at < %(b)s),
                  count(*) FILTER (WHERE run_at >= %(a)s AND run_at < %(b)s AND claimed_at IS NULL),
                  count(*) FILTER (WHERE run_at < %(a)s AND (claimed_at IS NULL OR claimed_at >= %(a)s)),
                  count(*) FILTER (WHERE run_at < %(b)s AND (claimed_at IS NULL OR claimed_at >= %(b)s)),
                  count(*) FILTER (WHERE claimed_at >= %(a)s AND claimed_at < %(b)s AND attempts > 1)
             FROM (SELECT state, run_at, claimed_at, finished_at, attempts,
                          extract(epoch FROM coalesce(claimed_at, %(now)s) - run_at)::float8 AS lag
                     FROM jobs) j""",
        {"a": a, "b": b, "now": now}).fetchone()
    seconds = (b - a).total_seconds()
    done, claimed, held, p50, p99, worst, unclaimed, waiting_a, waiting_b, again = row
    return {"completions_per_s": done / seconds, "completions": done, "claims": claimed,
            "claims_per_s": claimed / seconds, "running": float(held) / seconds,
            "lag_p50": p50, "lag_p99": p99, "lag_max": worst, "unclaimed": unclaimed,
            "waiting": (waiting_a, waiting_b), "again": again}


# ---------------------------------------------------------------- one step
@dataclass
class Step:
    rate: float
    jobs: dict
    offered_per_s: float
    behind: int
    refused: int
    cpu_ms_per_job: dict[str, float]
    claim_calls_per_s: float
    jobs_per_call: float | None
    procedures: list[tuple[str, float, float, float, float]]   # name, calls/s, self ms/call, total ms/call, core share
    load: str
    warnings: Counter                                          # the processes' warnings over the whole step

    @property
    def keeps_up(self) -> bool:
        """Claims at the offered rate, the due jobs waiting for a claim not
        growing by more than BACKLOG_GROWTH_S of arrivals over the window, and
        the client able to offer the rate."""
        start, end = self.jobs["waiting"]
        return (self.jobs["claims_per_s"] >= KEEPS_UP * self.rate and end - start <= BACKLOG_GROWTH_S * self.rate
                and self.offered_per_s >= KEEPS_UP * self.rate and not self.refused)


def run_step(rate: float, args, conn: psycopg.Connection, gen: LoadGenerator, procs: dict[str, int],
             servers: dict[str, int], claim_functions: set[str], logs: LogTally) -> Step:
    logs.since_last()
    gen.rate.value = rate
    time.sleep(args.warmup_s)
    a = snapshot(conn, procs, servers)
    sent_a, refused_a, behind_a = gen.counts()
    time.sleep(args.step_s - args.warmup_s)
    b = snapshot(conn, procs, servers)
    sent_b, refused_b, behind_b = gen.counts()
    seconds = (b.at - a.at).total_seconds()
    jobs = job_figures(conn, a.at, b.at, dt.datetime.now(dt.timezone.utc))
    done = max(1, jobs["completions"])
    cpu = {label: (b.cpu[label] - a.cpu[label]) * 1000 / done for label in b.cpu}
    deltas = {name: tuple(x - y for x, y in zip(b.functions[name], a.functions.get(name, (0, 0.0, 0.0))))
              for name in b.functions}
    calls = sum(deltas[f][0] for f in claim_functions if f in deltas)
    procedures = sorted(((name, c / seconds, s / c, t / c, s / 1000 / seconds)
                         for name, (c, t, s) in deltas.items() if c > 0), key=lambda p: -p[4])
    return Step(rate, jobs, (sent_b - sent_a) / seconds, behind_b - behind_a, refused_b - refused_a, cpu,
                calls / seconds, jobs["claims"] / calls if calls else None, procedures[:args.procedures],
                " ".join(Path("/proc/loadavg").read_text().split()[:3]), logs.since_last())


def report(step: Step, generator: str) -> None:
    j = step.jobs
    per_call = f"{step.jobs_per_call:.1f}" if step.jobs_per_call is not None else "-"
    ge = ">= " if j["unclaimed"] else ""
    print(f"\n== offered {step.rate:,.0f} jobs/s (sent {step.offered_per_s:,.0f}/s, {step.behind} ticks late, "
          f"{step.refused} refused) — load average {step.load}"
          f"{'' if step.keeps_up else '  — CANNOT KEEP UP'}", flush=True)
    print(f"completions/s {j['completions_per_s']:,.0f}; claims/s {j['claims_per_s']:,.0f}; "
          f"running at once {j['running']:,.0f}; claims of a job run before (an expired claim) {j['again']:,}; "
          f"due and not yet claimed {j['waiting'][0]:,} at the window's "
          f"start, {j['waiting'][1]:,} at its end")
    if j["lag_p50"] is not None:
        print(f"start lag p50 {j['lag_p50'] * 1000:,.0f} ms, p99 {ge}{j['lag_p99'] * 1000:,.0f} ms, "
              f"max {ge}{j['lag_max']:,.2f} s ({j['unclaimed']:,} due in the window not claimed by its end)")
    print(f"claim calls/s {step.claim_calls_per_s:,.0f}, jobs per call {per_call}")
    total = sum(v for k, v in step.cpu_ms_per_job.items() if k != generator)
    print("CPU per completed job: " + ", ".join(f"{k} {v:.3f} ms" for k, v in step.cpu_ms_per_job.items())
          + f"; all but the load generator {total:.3f} ms")
    print("database time per procedure (top by self time): calls/s, self ms/call, total ms/call, self share of a core")
    for name, cps, self_ms, total_ms, share in step.procedures:
        print(f"  {name:<28} {cps:9,.1f}/s {self_ms:9.3f} {total_ms:9.3f} {share * 100:6.1f}%")
    print("warnings and errors the processes logged in the step: "
          + ("; ".join(f"{k} x{n:,}" for k, n in step.warnings.most_common(8)) or "none"))
    print(flush=True)


# ---------------------------------------------------------------- the run
def readme_lag(url: str, token: str, seconds: int, log) -> dict:
    """ops.bench.e2e's start-lag step, as docs/contributing/benchmarks.md states its figure: a
    `minutehand serve` with default settings, 2 no-op workers x 100."""
    port = _free_port()
    server = start_server(url, port, "", 2, log=log)
    try:
        return start_lag(url, token, port, 1000, seconds, 2, 100)
    finally:
        stop_server(server)


def lag_by_time(conn: psycopg.Connection, every_s: int = 5) -> list[str]:
    """The jobs table's jobs in slices of run time: due, claimed (by now),
    start lag p50 and max of those claimed, and how many claims (of any run
    time) fell in the slice: where a stall shows."""
    claims = dict(conn.execute(
        "SELECT floor(extract(epoch FROM claimed_at) / %(s)s)::bigint, count(*) FROM jobs"
        " WHERE claimed_at IS NOT NULL GROUP BY 1", {"s": every_s}).fetchall())
    lines = []
    for k, due, claimed, p50, worst in conn.execute(
            """SELECT floor(extract(epoch FROM run_at) / %(s)s)::bigint, count(*), count(claimed_at),
                      percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - run_at)),
                      max(extract(epoch FROM claimed_at - run_at))
                 FROM jobs GROUP BY 1 ORDER BY 1""", {"s": every_s}).fetchall():
        at = dt.datetime.fromtimestamp(k * every_s, dt.timezone.utc).strftime("%H:%M:%S")
        lag = f"lag p50 {p50:6.2f} s, max {worst:6.2f} s" if claimed else "lag -"
        lines.append(f"  due {at}+{every_s}s: {due:6,} due, {claimed:6,} claimed, {lag}; "
                     f"claims made in these {every_s} s: {claims.get(k, 0):6,}")
    return lines


def wait_split(conn: psycopg.Connection, dispatchers: int, timeout_s: float = 60) -> None:
    """Until every shard is leased, by as many dispatchers as run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owners, leased = conn.execute("SELECT count(DISTINCT owner), count(*) FROM shards "
                                      "WHERE lease_expires_at > now()").fetchone()
        total = conn.execute("SELECT count(*) FROM shards").fetchone()[0]
        if owners == dispatchers and leased == total:
            return
        time.sleep(0.5)
    raise SystemExit(f"the shards were not split between {dispatchers} dispatchers in {timeout_s:.0f} s")


def run(dsn: str, args) -> None:
    if args.floor_s:
        fl = floor(dsn, args.floor_s)
        print(f"floor (pgbench, same server): claim+delete in batches of 100: "
              f"{fl['floor_claim_delete_batch100_rows_per_s']:,} rows/s; single-row enqueue "
              f"{fl['floor_enqueue_single_per_s']:,}/s", flush=True)
    url = minutehand_database(dsn, "mh_bench_sustained", args.citus_workers, args.citus_shard_count)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"ALTER DATABASE mh_bench_sustained SET track_functions = '{args.track_functions}'")
    with Store(url) as store:
        team_token = store.create_team(TEAM, quota=10**6)
        token = store.create_worker_token("bench")
    logs = LogTally(Path(tempfile.mkdtemp(prefix="mh-bench-sustained-logs-")))
    print(f"the processes' output: {logs.folder}")
    if args.readme_lag_s:
        lag = readme_lag(url, token, args.readme_lag_s, logs.open("readme-lag serve"))
        print(f"start lag at {lag['rate']:,.0f} jobs/s the way docs/contributing/benchmarks.md states it (ops.bench.e2e's step, "
              f"{args.readme_lag_s} s): p50 {lag['p50_ms']:.1f} ms, p99 {lag['p99_ms']:.1f} ms "
              f"({lag['jobs']:,} jobs, {lag['unclaimed']} unclaimed at the end)", flush=True)
        if lag["p99_ms"] > 1000:
            with psycopg.connect(url) as c:
                print("\n".join(lag_by_time(c)), flush=True)
        with psycopg.connect(url, autocommit=True) as c:    # its jobs (of another name) must not linger due
            c.execute("TRUNCATE jobs, claim_checks, retention_checks, retention_marks, due_minutes, due_hours, due_far")

    conn = psycopg.connect(url, autocommit=True)
    port = _free_port()
    servers = [start_server(url, port, "", 2, SERVER_SETTINGS, log=logs.open("serve"))]
    urls = [f"http://127.0.0.1:{port}"]
    workers: list = []
    gen = None
    try:
        for _ in range(args.dispatchers - 1):
            p = _free_port()
            servers.append(start_server(url, p, "", 2, SERVER_SETTINGS, command="dispatcher",
                                        log=logs.open(f"dispatcher {len(servers) + 1}")))
            urls.append(f"http://127.0.0.1:{p}")
        wait_split(conn, args.dispatchers)
        workers = start_workers(port, token, 2, args.concurrency, "ops.bench.sleep_worker:worker", ",".join(urls),
                                [logs.open(f"worker {i + 1}") for i in range(2)])
        time.sleep(3)
        gen = LoadGenerator(port, team_token, int(args.job_s * 1000))
        procs = {"serve (API + dispatcher)": servers[0].pid}
        procs.update({f"dispatcher {i + 2}": s.pid for i, s in enumerate(servers[1:])})
        procs.update({f"worker {i + 1}": w.pid for i, w in enumerate(workers)})
        procs["load generator"] = gen.proc.pid
        pg_servers = postmasters(url, args.citus_workers)
        if not pg_servers:
            print("(the server is not on this machine: no PostgreSQL CPU figure)")
        claim_functions = set(args.claim_functions.split(","))
        print(f"{args.dispatchers} dispatcher(s), 2 workers x {args.concurrency:,}, jobs of {args.job_s:g} s, "
              f"steps of {args.step_s} s (figures over the last {args.step_s - args.warmup_s} s of each)", flush=True)
        steps = []
        for rate in args.rates:
            step = run_step(rate, args, conn, gen, procs, pg_servers, claim_functions, logs)
            steps.append(step)
            report(step, "load generator")
            if not step.keeps_up and not args.keep_going:
                break
    finally:
        if gen is not None:
            gen.close()
        stop_all(workers)
        for s in servers:
            stop_server(s)
        conn.close()
        logs.close()
    summary(steps)


def summary(steps: list[Step]) -> None:
    print("offered/s | completions/s | running | lag p50 | lag p99 | claim calls/s | jobs/call | CPU ms/job (all) | load")
    for s in steps:
        j = s.jobs
        cpu = sum(v for k, v in s.cpu_ms_per_job.items() if k != "load generator")
        per_call = f"{s.jobs_per_call:.1f}" if s.jobs_per_call is not None else "-"
        print(f"{s.rate:,.0f} | {j['completions_per_s']:,.0f} | {j['running']:,.0f} | {(j['lag_p50'] or 0) * 1000:,.0f} ms"
              f" | {'>= ' if j['unclaimed'] else ''}{(j['lag_p99'] or 0) * 1000:,.0f} ms | {s.claim_calls_per_s:,.0f}"
              f" | {per_call} | {cpu:.3f} | {s.load}{'' if s.keeps_up else ' (cannot keep up)'}")
    fast = [s.rate for s in steps if s.keeps_up and s.jobs["lag_p99"] is not None and s.jobs["lag_p99"] < 1.0]
    print(f"highest offered rate with start lag p99 < 1 s: {max(fast):,.0f} jobs/s" if fast
          else "no step had start lag p99 < 1 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")],
                        default=[500, 1000, 2000, 4000, 6000, 8000, 11574], help="offered jobs/s, one step each")
    parser.add_argument("--step-s", type=int, default=180, help="seconds per step")
    parser.add_argument("--warmup-s", type=int, default=20, help="seconds of each step before its figures")
    parser.add_argument("--dispatchers", type=int, choices=(1, 2), default=1,
                        help="1: one `minutehand serve`; 2: and one `minutehand dispatcher`")
    parser.add_argument("--job-s", type=float, default=10.0, help="how long each job's handler sleeps")
    parser.add_argument("--concurrency", type=int, default=50_000, help="worker_concurrency of each worker")
    parser.add_argument("--claim-functions", default="claim_planned_shards,claim_planned,claim_due",
                        help="the functions whose calls count as claim calls (comma-separated)")
    parser.add_argument("--track-functions", choices=("pl", "all"), default="pl",
                        help="track_functions for the benchmark's database (all: SQL functions too)")
    parser.add_argument("--keep-going", action="store_true", help="run every step, even after one fell behind")
    parser.add_argument("--procedures", type=int, default=8, help="how many procedures to list per step")
    parser.add_argument("--floor-s", type=int, default=20, help="seconds of each floor run (0: skip)")
    parser.add_argument("--readme-lag-s", type=int, default=30,
                        help="seconds of the start-lag step in docs/contributing/benchmarks.md at 1,000 jobs/s (0: skip)")
    args = parser.parse_args()
    if not 0 <= args.warmup_s < args.step_s:
        parser.error("--warmup-s must be below --step-s")
    with bench_server(args.dsn, "mh-bench-sustained-") as dsn:
        run(dsn, args)


if __name__ == "__main__":
    main()
