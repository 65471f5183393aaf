"""The seed's fleet: tens of thousands of workers long-polling over HTTP,
each for one of 1,000 job names, most of them idle, against one or two
dispatching processes; and a trickle of jobs for random names among them.

    python -m ops.bench.fleet                                   # 10,000 and 50,000 workers, 1 and 2 processes
    python -m ops.bench.fleet --workers 10000 --processes 1 [--dsn URL]
    python -m ops.bench.fleet --wait-s 60                       # the longest poll the protocol allows

Per shape (workers x dispatching processes), on a fresh durable local
cluster (or --dsn):
- the dispatching processes: one `minutehand serve` (API + dispatcher) and,
  for two, a `minutehand dispatcher` beside it, each with every setting at
  its default; the workers split evenly between their ports;
- the fleet: simulated workers in client processes of their own (asyncio,
  as many as the open-file limit takes), each worker with one keep-alive
  HTTP connection to every dispatching process, as the worker library
  runs one lease loop per dispatcher URL, and one `POST
  /v1/worker/lease` at a time on each for its one job name (worker i:
  name i mod --names), capacity 1, waiting `--wait-s` (the worker
  library's default, 25 s; the workers start apart, so their waits end
  apart); a worker that gets a job completes it (`POST
  /v1/worker/jobs/{id}/complete`) and polls again;
- connect: how long until every worker's first poll is in (connections
  open at --connect-rate per second), and what failed;
- idle (--idle-s, no jobs): CPU of each dispatching process, of
  PostgreSQL and of the fleet's clients, polls answered (empty) per second, CPU per idle poll; each
  dispatching process's resident memory less its own before the fleet
  came, per connection, and its open file descriptors;
- due jobs (--jobs at --rate per second, each for a random name of the
  fleet's, due now, submitted through the store): lease latency, from the
  job's run time to the worker reading the answer (p50, p99, max), and how
  many arrived within 30 s of the last submission;
- the errors of each phase by kind (connection refused or reset, timeouts,
  statuses other than 200), the first thing to break.

Clients and servers share the machine (2 cores here): a figure of CPU per
idle poll is the dispatching process's own (from /proc), not the clients'.
The dispatching processes start with the open-file limit of the shell
that runs the benchmark (they raise it to the hard limit themselves); each
client process raises its own to the hard limit, and the fleet is split
between as many clients as that takes. Loopback connections leave from
127.0.0.2.. so that 50,000 of them do not run out of ephemeral ports of
one source address.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import queue
import random
import resource
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg

from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.server import bench_server, minutehand_database
from ops.bench.sustained import cpu_seconds, postgres_cpu, postmaster_of, wait_split

TEAM = "fleet"
SOURCES = 32                          # loopback source addresses 127.0.0.2..: ephemeral ports of each
REPORT_S = 1.0                        # clients report their counters this often


# ---------------------------------------------------------------- the fleet (client processes)
def _client(first: int, count: int, ports: list[int], token: str, names: int, wait_s: float,
            connect_rate: float, out: mp.Queue, stop: mp.Event) -> None:
    """Workers first..first+count-1 in one event loop; reports
    ("counts", first, Counter) every REPORT_S and ("job", job_id, t) per job."""
    raise_open_files()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_fleet(first, count, ports, token, names, wait_s, connect_rate, out, stop))


async def _fleet(first: int, count: int, ports: list[int], token: str, names: int, wait_s: float,
                 connect_rate: float, out: mp.Queue, stop: mp.Event) -> None:
    counts: Counter = Counter()
    stopping = asyncio.Event()          # stop, as this loop sees it (an mp.Event costs a lock per look)
    auth = f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nHost: fleet\r\n"

    async def request(reader, writer, path: str, body: bytes) -> tuple[int, bytes]:
        writer.write(f"POST {path} HTTP/1.1\r\n{auth}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await reader.readexactly(length)

    async def poll(i: int, port: int) -> None:
        """Worker i's lease loop at one dispatcher (the worker library runs one per URL)."""
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(f"127.0.0.{2 + i % SOURCES}", 0), limit=1 << 20)
        except OSError as exc:
            counts[f"connect: {type(exc).__name__} {exc.errno}"] += 1
            return
        counts["connected"] += 1
        name = f"fleet.name-{i % names}"
        first_poll = True
        try:
            while not stopping.is_set():
                body = json.dumps({"worker": f"fleet-{i}", "capacity": 1, "names": [name],
                                   "wait_s": wait_s}).encode()
                if first_poll:
                    counts["polling"] += 1
                    first_poll = False
                status, answer = await request(reader, writer, "/v1/worker/lease", body)
                if status != 200:
                    counts[f"lease answered {status}"] += 1
                    await asyncio.sleep(1.0)
                    continue
                jobs = json.loads(answer)["jobs"]
                counts["jobs" if jobs else "empty polls"] += 1
                for job in jobs:
                    out.put(("job", int(job["job_id"]), time.time()))
                    status, _ = await request(reader, writer, f"/v1/worker/jobs/{job['job_id']}/complete",
                                              json.dumps({"lease_token": job["lease_token"]}).encode())
                    counts["completed" if status == 200 else f"complete answered {status}"] += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            counts[f"poll: {type(exc).__name__}"] += 1
        finally:
            writer.close()

    async def report() -> None:
        while not stop.is_set():
            out.put(("counts", first, Counter(counts)))
            await asyncio.sleep(REPORT_S)
        stopping.set()

    reporter = asyncio.ensure_future(report())    # sets `stopping` once told to stop
    tasks = []
    started = time.monotonic()
    for k in range(count):
        tasks.extend(asyncio.ensure_future(poll(first + k, port)) for port in ports)
        ahead = started + (k + 1) / connect_rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    await reporter
    # Polls still waiting end with the servers (stopped after the clients are told).
    await asyncio.wait(tasks, timeout=5)
    out.put(("counts", first, Counter(counts)))


class Fleet:
    def __init__(self, workers: int, ports: list[int], token: str, names: int, wait_s: float, connect_rate: float,
                 open_files: int):
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.stop = ctx.Event()
        self.counts: dict[int, Counter] = {}
        self.delivered: dict[int, float] = {}
        # A client's connections (one per worker and dispatcher) within its open-file limit.
        clients = max(1, math.ceil(workers * len(ports) / (open_files - 1_000)))
        share = math.ceil(workers / clients)
        self.procs = [ctx.Process(target=_client, daemon=True,
                                  args=(first, min(share, workers - first), ports, token, names, wait_s,
                                        connect_rate / clients, self.out, self.stop))
                      for first in range(0, workers, share)]
        for p in self.procs:
            p.start()

    def drain(self) -> Counter:
        """What the clients reported since; the fleet's counters in total."""
        while True:
            try:
                kind, a, b = self.out.get_nowait()
            except queue.Empty:
                break
            if kind == "job":
                self.delivered.setdefault(a, b)
            else:
                self.counts[a] = b
        return sum(self.counts.values(), Counter())

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------- the dispatching processes
def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def raise_open_files() -> int:
    """A client's soft limit of open files raised to the hard one; the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def shape(url: str, token: str, team_token: str, workers: int, processes: int, args, logs: Path,
          open_files: int) -> dict:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("TRUNCATE jobs, claim_checks")
    servers, ports = [], []
    fleet = None
    figures: dict = {"workers": workers, "processes": processes}
    try:
        for k in range(processes):
            port = _free_port()
            servers.append(start_server(url, port, team_token, 2, command="serve" if k == 0 else "dispatcher",
                                        log=open(logs / f"{workers}x{processes}-{k + 1}.log", "w")))
            ports.append(port)
        with psycopg.connect(url, autocommit=True) as c:
            wait_split(c, processes)
            postmaster = postmaster_of(c)
        time.sleep(2)
        base_rss = [rss_mb(s.pid) for s in servers]
        base_fds = [open_fds(s.pid) for s in servers]

        # connect
        fleet = Fleet(workers, ports, token, args.names, args.wait_s, args.connect_rate, open_files)
        started = time.monotonic()
        deadline = started + workers / args.connect_rate + 60
        counts = fleet.drain()
        while counts["polling"] + sum(v for k, v in counts.items() if k.startswith("connect:")) \
                < workers * processes and time.monotonic() < deadline:
            time.sleep(0.5)
            counts = fleet.drain()
        figures["connect_s"] = time.monotonic() - started
        figures["polling"] = counts["polling"]
        figures["connect_errors"] = {k: v for k, v in counts.items() if k.startswith("connect:")}
        time.sleep(args.wait_s * 1.5)      # every first poll has timed out once: polls at their steady rate

        # idle
        counts0 = fleet.drain()
        cpu0 = [cpu_seconds(s.pid) for s in servers]
        clients0 = sum(cpu_seconds(p.pid) for p in fleet.procs)
        pg0 = postgres_cpu(postmaster) if postmaster else None
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        counts1 = fleet.drain()
        elapsed = time.monotonic() - t0
        cpu = [cpu_seconds(s.pid) - c for s, c in zip(servers, cpu0)]
        polls = counts1["empty polls"] - counts0["empty polls"]
        figures.update(
            idle_polls_per_s=polls / elapsed,
            idle_cores=[c / elapsed for c in cpu],
            idle_client_cores=(sum(cpu_seconds(p.pid) for p in fleet.procs) - clients0) / elapsed,
            idle_ms_per_poll=sum(cpu) * 1000 / max(1, polls),
            idle_pg_cores=(postgres_cpu(postmaster) - pg0) / elapsed if postmaster else None,
            rss_mb=[rss_mb(s.pid) for s in servers],
            kb_per_connection=sum(rss_mb(s.pid) - b for s, b in zip(servers, base_rss)) * 1024
            / max(1, counts1["connected"]),
            fds=[open_fds(s.pid) - b for s, b in zip(servers, base_fds)],
            idle_errors={k: v - counts0[k] for k, v in counts1.items()
                         if k not in ("connected", "polling", "empty polls", "jobs", "completed")
                         and v - counts0[k]})

        # due jobs
        run_at: dict[int, float] = {}
        with Store(url, max_size=2) as store:
            t = time.monotonic()
            for n in range(args.jobs):
                job = store.submit(TEAM, JobSpec(name=f"fleet.name-{random.randrange(min(args.names, workers))}"))
                run_at[job.job_id] = job.run_at.timestamp()
                time.sleep(max(0.0, t + (n + 1) / args.rate - time.monotonic()))
        deadline = time.monotonic() + 30
        while len(fleet.delivered.keys() & run_at.keys()) < len(run_at) and time.monotonic() < deadline:
            time.sleep(0.2)
            fleet.drain()
        late = sorted(max(0.0, fleet.delivered[j] - r) * 1000 for j, r in run_at.items() if j in fleet.delivered)
        worst = sorted(((fleet.delivered[j] - r) * 1000, r) for j, r in run_at.items() if j in fleet.delivered)[-5:]
        counts2 = fleet.drain()
        figures.update(jobs=len(run_at), delivered=len(late),
                       lease_p50_ms=pct(late, 50) if late else None, lease_p99_ms=pct(late, 99) if late else None,
                       lease_max_ms=late[-1] if late else None,
                       # the latest, with the second of the minute they were due at
                       worst=[f"{ms:,.0f} ms at :{time.gmtime(r).tm_sec:02d}" for ms, r in reversed(worst)],
                       errors={k: v for k, v in counts2.items()
                               if k not in ("connected", "polling", "empty polls", "jobs", "completed")},
                       server_exit=[s.poll() for s in servers])
        return figures
    finally:
        if fleet is not None:
            fleet.close()
        for s in servers:
            stop_server(s)


def report(f: dict) -> None:
    def cores(xs):
        return " + ".join(f"{x:.2f}" for x in xs)
    print(f"\n{f['workers']:,} workers x {f['processes']} dispatching process(es):", flush=True)
    print(f"  connect: {f['polling']:,} polls in (one per worker and dispatcher) after {f['connect_s']:.1f} s; "
          f"errors {f['connect_errors'] or 'none'}")
    if "idle_polls_per_s" in f:
        pg = f"{f['idle_pg_cores']:.2f}" if f["idle_pg_cores"] is not None else "n/a"
        print(f"  idle: {f['idle_polls_per_s']:,.0f} empty polls/s; cores {cores(f['idle_cores'])} "
              f"(PostgreSQL {pg}, the fleet's clients {f['idle_client_cores']:.2f}); "
              f"{f['idle_ms_per_poll']:.3f} ms CPU per idle poll")
        print(f"  memory: RSS {' + '.join(f'{m:,.0f}' for m in f['rss_mb'])} MB, "
              f"{f['kb_per_connection']:.1f} KB per connection; fds {' + '.join(f'{n:,}' for n in f['fds'])} "
              f"over the process's own; errors {f['idle_errors'] or 'none'}")
    if "delivered" in f:
        if f["delivered"]:
            print(f"  due jobs: {f['delivered']} of {f['jobs']} delivered; lease latency p50 {f['lease_p50_ms']:.1f} "
                  f"ms, p99 {f['lease_p99_ms']:.1f} ms, max {f['lease_max_ms']:.1f} ms; the latest, due at "
                  f"the minute's second: {', '.join(f['worst'])}")
        else:
            print(f"  due jobs: none of {f['jobs']} delivered")
        print(f"  errors over the run: {f['errors'] or 'none'}; servers exited: "
              f"{[e for e in f['server_exit'] if e is not None] or 'none'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="a PostgreSQL server (superuser); default: a fresh durable local cluster")
    p.add_argument("--workers", default="10000,50000", help="fleet sizes, comma-separated (default 10000,50000)")
    p.add_argument("--processes", default="1,2", help="dispatching processes, comma-separated (default 1,2)")
    p.add_argument("--names", type=int, default=1000, help="job names, one per worker in turn (default 1,000)")
    p.add_argument("--wait-s", type=float, default=25.0, help="a poll's wait (default 25, the worker "
                                                              "library's)")
    p.add_argument("--connect-rate", type=float, default=2000.0, help="new connections per second (default 2,000)")
    p.add_argument("--idle-s", type=float, default=30.0, help="the idle window (default 30 s)")
    p.add_argument("--jobs", type=int, default=200, help="due jobs submitted (default 200)")
    p.add_argument("--rate", type=float, default=20.0, help="their rate, per second (default 20)")
    args = p.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    # The dispatching processes start with this shell's limit (and raise it
    # themselves); the clients raise theirs to the hard limit.
    soft, limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"open files: the shell's soft limit {soft:,}, the hard limit {limit:,}", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="mh-bench-fleet-logs-"))
    print(f"the dispatching processes' output: {logs}", flush=True)
    with bench_server(args.dsn, "mh-bench-fleet-") as dsn:
        url = minutehand_database(dsn, "mh_bench_fleet")
        with Store(url) as store:
            team_token = store.create_team(TEAM, quota=10**6)
            token = store.create_worker_token("fleet")
        for processes in (int(n) for n in args.processes.split(",")):
            for workers in sizes:
                report(shape(url, token, team_token, workers, processes, args, logs, limit))


if __name__ == "__main__":
    main()
