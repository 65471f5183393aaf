"""The end-to-end benchmark's worker: one handler, doing nothing
(`minutehand worker ops.bench.noop_worker:worker`). Async, like the
peers' no-op handlers in ops/bench/peers.py: a sync handler would run in
a thread."""
from minutehand.worker import Job, Worker

worker = Worker()


@worker.job("noop")
async def noop(job: Job) -> None:
    return None
