"""One run of a worker: its clients, slots, outboxes, job runner and lease
loops, started in that order and stopped in reverse (minutehand.lifecycle),
so a loop stops asking before the jobs are waited for, and the jobs are
done before the last outcomes are sent."""
from __future__ import annotations

import asyncio

from minutehand.lifecycle import AsyncServices
from minutehand.protocol import LeaseIn
from minutehand.worker.client import DispatcherClient
from minutehand.worker.grace import Grace
from minutehand.worker.logs import fields, log
from minutehand.worker.metrics import MetricsServer
from minutehand.worker.outbox import Outbox
from minutehand.worker.poller import LeaseShares, Poller
from minutehand.worker.runner import Handler, JobRunner
from minutehand.worker.slots import Slots


class Session:
    """An AsyncService. stop() is called once `stopping` is set: new leases
    stop, running jobs get grace_s (less if `hurry` is set), then the rest
    are failed (retryable: due again after their backoff)."""

    def __init__(self, *, handlers: dict[str, Handler], urls: list[str], token: str, concurrency: int,
                 grace_s: float, worker_id: str, wait_s: float, flush_s: float, teams: list[str] | None,
                 stopping: asyncio.Event, hurry: asyncio.Event, metrics: tuple[str, int] | None = None):
        self.worker_id = worker_id
        self.grace_s = grace_s
        self.names = sorted(handlers)
        self.concurrency = concurrency
        self.grace = Grace(hurry)
        self.slots = Slots(concurrency)
        self.clients = [DispatcherClient(u, token) for u in urls]
        self.outboxes = [Outbox(c, [o for o in self.clients if o is not c], worker_id=worker_id, flush_s=flush_s)
                         for c in self.clients]
        self.runner = JobRunner(handlers, worker_id, self.slots, self.grace, concurrency)
        shares = LeaseShares(urls, concurrency)
        lease = LeaseIn(worker=worker_id, capacity=1, names=self.names, wait_s=wait_s, teams=teams)
        self.pollers = [Poller(c, o, self.runner, self.slots, shares, lease, stopping, self.grace)
                        for c, o in zip(self.clients, self.outboxes)]
        # metrics (host, port): first up, last down, so a scrape sees the whole run
        served = [MetricsServer(*metrics, lambda: len(self.runner.jobs))] if metrics else []
        self.services = AsyncServices(*served, *self.outboxes, self.runner, *self.pollers)

    async def start(self) -> None:
        log.info("worker_started", **fields(self.worker_id, count=self.concurrency, name=",".join(self.names),
                                            url=",".join(c.url for c in self.clients)))
        await self.services.start()

    async def stop(self) -> None:
        self.grace.begin(self.grace_s)
        log.info("worker_stopping", **fields(self.worker_id, count=len(self.runner.jobs)))
        self.slots.close()
        try:
            await self.services.stop()
        finally:
            for c in self.clients:
                await c.close()
            log.info("worker_stopped", **fields(self.worker_id))
