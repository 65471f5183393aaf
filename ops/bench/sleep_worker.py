"""The midnight and sustained benchmarks' worker: one handler that sleeps as
long as its job's payload says (`minutehand worker ops.bench.sleep_worker:worker`),
so a fleet's capacity is its concurrency / that time. Async: a sleeping job
holds a slot, not a thread."""
import asyncio

from minutehand.worker import Job, Worker

worker = Worker()


@worker.job("midnight.sleep")
async def sleep(job: Job) -> None:
    await asyncio.sleep(job.payload["ms"] / 1000)
