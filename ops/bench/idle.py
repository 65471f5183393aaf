"""Idle cost: the CPU a `minutehand serve` and its PostgreSQL spend with
nothing to do (one team, no jobs, no worker), per second, from /proc: the
dispatcher's shard leases, the maintenance duties (expiry, the chain of
repeating jobs, retention, the wheel) and whatever the server does for them.
On Citus each node apart: every duty over many shards is statements on the
workers too.

    python -m ops.bench.idle                                   # a fresh durable local cluster
    python -m ops.bench.idle --dsn URL                         # a server of yours (database mh_bench_idle is recreated)
    python -m ops.bench.idle --dsn URL --citus-workers h:p,h:p # URL a Citus coordinator

The servers' CPU without minutehand is measured first (on Citus its
maintenance daemon runs per database of the cluster) and taken off. The
first --settle-s seconds of serve (the first shard leases, the first
reads) are left out; the figures are over the --seconds after them.
"""
from __future__ import annotations

import argparse
import time

from minutehand.store.store import Store
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.e2e import TEAM
from ops.bench.server import add_server_arguments, bench_server, minutehand_database
from ops.bench.sustained import cpu_seconds, postgres_cpu, postmasters


def run(dsn: str, args) -> None:
    url = minutehand_database(dsn, "mh_bench_idle", args.citus_workers, args.citus_shard_count)
    with Store(url) as store:
        store.create_team(TEAM)
    servers = postmasters(url, args.citus_workers)

    def cores(pids: dict[str, int]) -> dict[str, float]:
        """Each process's CPU over --seconds, in cores."""
        def cpu() -> dict[str, float]:
            return {k: postgres_cpu(p) if k in servers else cpu_seconds(p) for k, p in pids.items()}
        a, t0 = cpu(), time.monotonic()
        time.sleep(args.seconds)
        b, seconds = cpu(), time.monotonic() - t0
        return {k: (b[k] - a[k]) / seconds for k in b}

    def show(label: str, shares: dict[str, float]) -> None:
        print(f"{label}, in cores: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items())
              + f"; all {sum(shares.values()):.3f}", flush=True)

    # The servers alone first: what they spend with no client (on Citus its
    # own maintenance daemon, per database of the cluster), taken off below.
    alone = cores(servers)
    show(f"without minutehand ({args.seconds:.0f} s)", alone)
    server = start_server(url, _free_port(), "", 2)
    try:
        time.sleep(args.settle_s)
        idle = cores({"serve": server.pid, **servers})
    finally:
        stop_server(server)
    show(f"serve idle ({args.seconds:.0f} s)", idle)
    show("serve idle, less the servers' own", {k: v - alone.get(k, 0.0) for k, v in idle.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with bench_server(args.dsn, "mh-bench-idle-") as dsn:
        run(dsn, args)


if __name__ == "__main__":
    main()
