"""The demo workload's worker (`minutehand dev` runs it as a child process):
handlers for the demo job names (NAMES: what app/minutehand/dev/command.py submits as team
"demo") that take 1-50 ms and fail 5% of the time, so retries show up too.
It asks only for these names: jobs of other names wait for other workers."""
from __future__ import annotations

import asyncio
import random

from minutehand.worker import Job, Worker

NAMES = ("demo.now", "demo.soon", "demo.later", "demo.tick")

worker = Worker()


async def _work(job: Job) -> dict:
    await asyncio.sleep(random.uniform(0.001, 0.05))
    if random.random() < 0.05:
        raise RuntimeError("demo failure (retried with backoff)")
    return {"ok": True, "attempt": job.attempt}


for _name in NAMES:
    worker.job(_name)(_work)
