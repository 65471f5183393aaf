"""Outcomes of the jobs one dispatcher handed out, sent in batches: one
POST /v1/worker/outcomes carries whatever gathered meanwhile, split only
where the protocol's limits require."""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from minutehand.protocol import MAX_ITEMS, Completed, Failed, Held, OutcomesIn, Recorded
from minutehand.worker.client import DispatcherClient, Refused, Unavailable
from minutehand.worker.job import error_text
from minutehand.worker.logs import log

MAX_REQUEST_BYTES = 4 << 20   # outcomes per request, roughly: well under the server's body limit


class Outbox:
    """Outcomes of the jobs one dispatcher handed out, sent together: whatever
    gathers in `flush_s` (and while the previous request is on its way) goes
    in one POST /v1/worker/outcomes. If that dispatcher cannot be reached
    they go to another (outcomes are per job and lease token, not per
    dispatcher); if none can, recorded results, completions, failures and
    releases are kept and retried, heartbeats are answered None (the next
    one will try)."""

    KINDS = ("start", "heartbeat", "record", "complete", "fail", "release")
    NOT_RETRIED = ("start", "heartbeat")     # a later report covers them

    def __init__(self, client: DispatcherClient, others: list[DispatcherClient], *, worker_id: str,
                 flush_s: float, drain_s: float = 5.0):
        self.client = client
        self.others = others
        self.worker_id = worker_id
        self.flush_s = flush_s            # how long outcomes wait to be sent together
        self.drain_s = drain_s            # how long stop() waits for queued outcomes to go out
        self.claim_s = 30.0               # this dispatcher's claim period, as its last lease said
        self.items: list[tuple[str, Any, float | None, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle (AsyncService)
    async def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Send what is queued (for at most drain_s), then end the sender."""
        if self._task is None:
            return
        await self.drain(self.drain_s)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    # ------------------------------------------------------------ outcomes
    def send(self, kind: str, item, extend_s: float | None = None) -> asyncio.Future:
        """Queue one outcome; the future gets its OutcomeOut, or None if undelivered."""
        fut = asyncio.get_running_loop().create_future()
        self.items.append((kind, item, extend_s, fut))
        self.idle.clear()
        self.wake.set()
        return fut

    def release(self, held: Held) -> None:
        """Give back a job whose handler never ran (the poller's only use).
        The dispatcher refuses a job whose start was reported; that refusal,
        like any, is logged and not retried: the job's claim then expires."""
        self.send("release", held)

    async def run(self) -> None:
        backoff = 0.2
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.flush_s)
            self.wake.clear()
            batch, self.items = _without_covered_starts(self.items), []
            left = await self.deliver(batch)
            if left:
                self.items[:0] = left
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self.wake.set()
            else:
                backoff = 0.2
                if not self.items:
                    self.idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait for every queued outcome to be sent (or give up after timeout_s)."""
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("outcomes_unsent", extra={"worker": self.worker_id, "url": self.client.url,
                                                  "count": len(self.items),
                                                  "reason": "no dispatcher reachable; their claims will expire"})

    async def deliver(self, batch: list) -> list:
        """Send a batch in as few requests as the protocol allows; what could not
        be delivered anywhere and is worth retrying."""
        left = []
        for request in _requests(batch):
            body = OutcomesIn(**{k: [i[1] for i in request[k]] for k in self.KINDS},
                              extend_s=request["extend_s"])
            answer, error = None, None
            for client in (self.client, *self.others):
                try:
                    # a third of a claim: time to try another dispatcher before claims run out
                    timeout_s = min(10.0, max(2.0, self.claim_s / 3))
                    answer, error = await client.outcomes(body, timeout_s=timeout_s), None
                    break
                except Refused as exc:                  # the request itself is wrong: not retried
                    error = exc
                    log.error("outcomes_refused", extra={"worker": self.worker_id, "url": client.url,
                                                         "error": str(exc)[:2000], "reason": "not retried"})
                    break
                except Exception as exc:                # Unavailable (or a surprise): elsewhere, or later
                    error = exc
                    log.warning("dispatcher_unavailable", exc_info=not isinstance(exc, Unavailable),
                                extra={"worker": self.worker_id, "url": client.url,
                                       "error": (str(exc) if isinstance(exc, Unavailable) else error_text(exc))[:2000],
                                       "reason": "sending outcomes"})
            for kind in self.KINDS:
                results = getattr(answer, kind) if answer is not None else [None] * len(request[kind])
                for item, result in zip(request[kind], results):
                    fut = item[3]
                    if result is None and kind not in self.NOT_RETRIED and not isinstance(error, Refused):
                        left.append(item)               # retried: it must get through
                        continue
                    if result is not None and not result.ok and kind not in self.NOT_RETRIED:
                        log.warning("outcome_refused", extra={
                            "worker": self.worker_id, "job_id": result.job_id, "state": getattr(result, "state", None),
                            "reason": f"{kind}: {result.reason} (not retried)"})
                    if not fut.done():
                        fut.set_result(result)
        return left


def _without_covered_starts(batch: list) -> list:
    """The batch less the starts of jobs whose completion or failure goes in
    it too: that report records the start (at the claim), and a job done
    quickly costs one write, not two. Those starts are answered None."""
    done = {i[1].job_id for i in batch if i[0] in ("complete", "fail")}
    if not done:
        return batch
    kept = []
    for item in batch:
        if item[0] == "start" and item[1].job_id in done:
            if not item[3].done():
                item[3].set_result(None)
        else:
            kept.append(item)
    return kept


def _requests(batch: list) -> list[dict]:
    """Split a batch into request bodies: one extend_s per request (heartbeats
    of different claim periods go separately), at most MAX_ITEMS per list and
    about MAX_REQUEST_BYTES per request (results and errors can be large: a
    request over the server's body limit would be refused whole)."""
    # item: (kind, body, extend_s, future); the other kinds ride with the first heartbeats
    ride = next((i[2] for i in batch if i[0] == "heartbeat"), None)
    groups: dict[float | None, list] = {}
    for item in batch:
        groups.setdefault(item[2] if item[0] == "heartbeat" else ride, []).append(item)
    requests: list[dict] = []
    for extend_s, items in groups.items():
        request, size = None, 0
        for item in items:
            n = _size(item[1])
            if request is None or size + n > MAX_REQUEST_BYTES or len(request[item[0]]) >= MAX_ITEMS:
                request, size = {"extend_s": extend_s, **{k: [] for k in Outbox.KINDS}}, 0
                requests.append(request)
            request[item[0]].append(item)
            size += n
    return requests


def _size(body) -> int:
    """About how many bytes an outcome adds to a request."""
    if isinstance(body, Completed | Recorded) and isinstance(body.result, msgspec.Raw):
        return len(body.result) + 100
    if isinstance(body, Failed):
        return len(body.error) * 2 + 100
    return 100
