"""Many idle long-polls of workers that take only some job names, and a
trickle of jobs for a few of those names: how late each job reaches a
worker of its name, and how many claims the dispatcher sends per job.

    python -m ops.bench.long_polls                       # a fresh durable local cluster
    python -m ops.bench.long_polls --dsn URL [--workers N --names N --jobs N]
    python -m ops.bench.long_polls --dsn COORDINATOR_URL --citus-workers HOST:PORT,...

One dispatcher in this process (minutehand.serve.dispatcher_parts, as
`minutehand dispatcher` builds it) with every shard; `workers` long-polls
in one event loop, each for one of `names` job names (workers / names per
name), each waiting 10-30 s (chosen at random per poll), through Dispatcher.lease: the call the HTTP route
(POST /v1/worker/lease) makes once it has read the request, so the
figures leave out HTTP (10,000 concurrent HTTP long-polls from one process
on two cores would measure the client). A worker that gets a job polls
again at once. Jobs are submitted one every `interval` seconds for the
first `hot` names in turn, alternating a single submission (submit_job:
a wake-up naming the shard, then a read) and a batch of one (submit_jobs:
a wake-up counting the row with its name, as the HTTP API's coalesced
submissions send); every fifth is due a second later instead of now (it
comes due by the clock). Lateness is delivery (the lease call returning)
less the job's run time; claims are the claim requests the dispatcher sent
(Store.claim's requests, each a claim statement of a shard or a worker's
planned claims of a bucket) while the jobs went out.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import random
import resource
import statistics
import time

from minutehand.serve import dispatcher_parts
from minutehand.settings import Settings
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.server import add_server_arguments, bench_server, minutehand_database

UTC = dt.timezone.utc


def run(url: str, workers: int, names: int, hot: int, jobs: int, interval: float) -> dict:
    store = Store(url, max_size=8)
    store.create_team("t")
    requests = [0]
    claim = store.claim

    def counting(reqs, *a, **kw):
        requests[0] += len(reqs)
        return claim(reqs, *a, **kw)
    store.claim = counting
    d, parts = dispatcher_parts(Settings(dispatcher_name="bench-long-polls", shard_lease_s=10), store)
    parts.start()
    try:
        while len(d.owned_shards()) < 256:
            time.sleep(0.05)
        return asyncio.run(_drive(d, store, requests, workers, names, hot, jobs, interval))
    finally:
        parts.stop()
        store.close()


async def _drive(d, store: Store, requests: list[int], workers: int, names: int, hot: int, jobs: int,
                 interval: float) -> dict:
    run_at: dict[int, float] = {}
    delivered: dict[int, float] = {}
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        name = f"name-{i % names}"
        while not stop.is_set():
            # Each its own wait (10-30 s): workers started apart do not time out together.
            for job in await d.lease(f"w{i}", 1, [name], 10.0 + 20.0 * random.random()):
                delivered.setdefault(int(job.job_id), time.time())

    polls = [asyncio.ensure_future(worker(i)) for i in range(workers)]
    await asyncio.sleep(3.0)                       # every poll waits; the first reads are done
    before = requests[0]

    def submit(k: int) -> None:
        name = f"name-{k % hot}"
        later = k % 5 == 4
        due = dt.datetime.now(UTC) + dt.timedelta(seconds=1 if later else 0)
        if k % 2:
            r = store.submit("t", JobSpec(name=name, due_at=due if later else None))
            run_at[r.job_id] = r.run_at.timestamp()
        else:
            item = store.submit_many("t", [JobSpec(name=name, due_at=due if later else None)])[0]
            run_at[item.job_id] = item.run_at.timestamp()

    started = time.monotonic()
    for k in range(jobs):
        await asyncio.to_thread(submit, k)
        await asyncio.sleep(max(0.0, started + (k + 1) * interval - time.monotonic()))
    deadline = time.monotonic() + 60
    while len(delivered.keys() & run_at.keys()) < jobs and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    claims = requests[0] - before
    stop.set()
    d.close_polls()
    await asyncio.gather(*polls, return_exceptions=True)
    late = sorted(max(0.0, delivered[j] - run_at[j]) * 1000 for j in run_at if j in delivered)
    q = statistics.quantiles(late, n=100, method="inclusive") if len(late) >= 2 else late * 99
    return {"jobs": jobs, "delivered": len(late), "late_p50_ms": q[49] if late else None,
            "late_p99_ms": q[98] if late else None, "late_max_ms": late[-1] if late else None,
            "claims_per_job": claims / max(1, len(late))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    p.add_argument("--workers", type=int, default=10_000, help="long-polling workers (default 10,000)")
    p.add_argument("--names", type=int, default=1_000, help="job names the workers take, one each (default 1,000)")
    p.add_argument("--hot", type=int, default=5, help="names jobs are submitted for (default 5)")
    p.add_argument("--jobs", type=int, default=100, help="jobs submitted (default 100)")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between submissions (default 0.2)")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    with bench_server(args.dsn, "mh-bench-long-polls-") as dsn:
        url = minutehand_database(dsn, "mh_bench_long_polls", args.citus_workers, args.citus_shard_count)
        figures = run(url, args.workers, args.names, args.hot, args.jobs, args.interval)
    print(f"{args.workers} long-polls of {args.names} names, {args.jobs} jobs for {args.hot} of them, "
          f"one every {args.interval} s:")
    for k, v in figures.items():
        print(f"  {k} = {v:.1f}" if isinstance(v, float) else f"  {k} = {v}")


if __name__ == "__main__":
    main()
