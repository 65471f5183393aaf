"""The demo workload's worker (`minutehand dev` runs it as a child process):
handlers for the demo job names that take a few milliseconds and fail now
and then, so retries show up too."""
from __future__ import annotations

import asyncio
import random

from app.worker import Job, Worker

worker = Worker()


async def _work(job: Job) -> dict:
    await asyncio.sleep(random.uniform(0.001, 0.05))
    if random.random() < 0.05:
        raise RuntimeError("demo failure (retried with backoff)")
    return {"ok": True, "attempt": job.attempt}


for _name in ("demo.now", "demo.soon", "demo.later"):
    worker.job(_name)(_work)
