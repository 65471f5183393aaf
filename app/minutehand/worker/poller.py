"""One dispatcher's lease loop: reserve slots, long-poll for as many jobs,
hand what came to the runner. Each dispatcher only hands out jobs of the
shards it owns, so a worker runs one loop per URL; a loop whose dispatcher
fails backs off and retries, the others carry on."""
from __future__ import annotations

import asyncio
import logging
import math
import time

import msgspec

from minutehand.protocol import MAX_CAPACITY, Held, LeaseIn
from minutehand.worker.client import DispatcherClient, Refused, Unavailable
from minutehand.worker.grace import Grace
from minutehand.worker.job import error_text
from minutehand.worker.logs import fields, log
from minutehand.worker.outbox import Outbox
from minutehand.worker.runner import JobRunner
from minutehand.worker.slots import Slots


class LeaseShares:
    """How many slots each URL's loop reserves for one poll. With several
    dispatchers a loop whose last poll was empty asks for one job (an idle
    dispatcher must not sit on slots a busy one could fill); busy loops
    split the concurrency between them."""

    def __init__(self, urls: list[str], concurrency: int):
        self.concurrency = concurrency
        self.productive = {u: False for u in urls}

    def share(self, url: str) -> int:
        if len(self.productive) == 1:
            return min(self.concurrency, MAX_CAPACITY)
        if not self.productive[url]:
            return 1
        busy = sum(self.productive.values())
        return min(max(1, math.ceil(self.concurrency / busy)), MAX_CAPACITY)


class Poller:
    """An AsyncService: start() begins the loop; stop() (once `stopping` is
    set and the slots closed) asks the dispatcher to answer the poll in
    flight at once and waits for it until the grace period ends — a
    dispatcher may already have claimed jobs for us, and its answer is how
    we give them back — then cuts it."""

    def __init__(self, client: DispatcherClient, outbox: Outbox, runner: JobRunner, slots: Slots,
                 shares: LeaseShares, lease: LeaseIn, stopping: asyncio.Event, grace: Grace):
        self.client = client
        self.outbox = outbox
        self.runner = runner
        self.slots = slots
        self.shares = shares
        self.lease = lease                  # what every poll asks for, but its capacity
        self.stopping = stopping
        self.grace = grace
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.poll())

    async def stop(self) -> None:
        if self._task is None:
            return
        asking = asyncio.create_task(self._end_polls())
        try:
            await self.grace.wait([self._task])
        finally:
            asking.cancel()
        if not self._task.done():
            self._task.cancel()
            log.warning("lease_abandoned", **fields(self.lease.worker, reason="grace period over during a long-poll"))
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def _end_polls(self) -> None:
        """Ask the dispatcher to answer our waiting poll now rather than at
        its wait_s, and again each second: a poll that set out as the stop
        began may arrive after an ask. A dispatcher that cannot (away, or
        older than the call) leaves the poll to end at its wait_s."""
        while not self._task.done():
            try:
                await self.client.end_polls(self.lease.worker)
            except (Unavailable, Refused):
                return
            await asyncio.sleep(1.0)

    async def poll(self) -> None:
        client, outbox, slots, worker_id = self.client, self.outbox, self.slots, self.lease.worker
        backoff = 0.2
        while not self.stopping.is_set():
            want = self.shares.share(client.url)
            got = await slots.take(want)
            if not got:
                return                                  # closed: stopping
            if got < want:                              # a few more may free up in a moment:
                await asyncio.sleep(0.005)              # one bigger lease beats several small ones
                got += slots.try_take(want - got)
            if self.stopping.is_set():
                slots.give(got)
                return
            try:
                out = await client.lease(msgspec.structs.replace(self.lease, capacity=got))
            except Exception as exc:                    # Unavailable, Refused, or a bug: the loop goes on
                slots.give(got)
                self.shares.productive[client.url] = False
                event = ("dispatcher_unavailable" if isinstance(exc, Unavailable) else
                         "lease_refused" if isinstance(exc, Refused) else "lease_failed")
                log.log(logging.WARNING if isinstance(exc, Unavailable) else logging.ERROR, event,
                        exc_info=event == "lease_failed",
                        **fields(worker_id, url=client.url, reason=f"retry in {backoff:.1f}s",
                                 error=(str(exc) if event != "lease_failed" else error_text(exc))[:2000]))
                await self._sleep_unless_stopped(backoff)
                backoff = min(backoff * 2, 10.0 if isinstance(exc, Unavailable) else 60.0)   # a bad token: slower
                continue
            received = time.monotonic()
            backoff = 0.2
            jobs, extra = out.jobs[:got], out.jobs[got:]
            slots.give(got - len(jobs))
            self.shares.productive[client.url] = bool(jobs)
            if not jobs:
                # Let a poll waiting for a slot (another dispatcher's) take the one
                # just given back before this loop takes it again: with fewer
                # slots than dispatchers, one loop could otherwise keep them all.
                await asyncio.sleep(0)
            if jobs:
                outbox.claim_s = jobs[0].claim_s
            for lj in extra:                            # more than asked for: not ours to run
                outbox.release(Held(job_id=lj.job_id, lease_token=lj.lease_token))
            for lj in jobs:
                if self.stopping.is_set():
                    slots.give(1)
                    outbox.release(Held(job_id=lj.job_id, lease_token=lj.lease_token))
                    log.info("job_released", **fields(worker_id, job_id=lj.job_id, name=lj.name,
                                                      attempt=lj.attempt, reason="worker stopping"))
                else:
                    self.runner.start_job(lj, outbox, received)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            pass
