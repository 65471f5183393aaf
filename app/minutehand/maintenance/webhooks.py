"""Webhook delivery: each team's events (its dead jobs) POSTed to its
webhook, in order, in batches, at least once.

A duty of the dispatcher's maintenance (app/minutehand/maintenance/schedule.py), run
by one dispatcher at a time (the holder of the `webhooks` duty lease). Each
pass reads the webhooks with events past their position, not backing off
and whose team has no delivery in flight (one statement), and starts a
POST of each one's next batch (up to `batch` events; at most `concurrency`
in flight) in the deliverer's event loop; each records its attempt when it
ends. A POST has a deadline for the whole request (connect, send, the
answer), and of the answer only the status counts: its body is read up to
ANSWER_BYTES, never whole. So a slow receiver holds up only its own team:
the pass waits for its POSTs only a while, those still running go on, and
their team is skipped until they end. A 2xx moves the webhook's position
past the batch; anything else (another status, no status by the deadline,
a refused connection) raises its backoff: the batch is tried again after a
random time in [d/2, d], d = min(cap, base * 2^(failures - 1)). Nothing is
moved before the answer, so a deliverer killed or stopped mid-request
leaves the batch where it was and the next holder of the lease sends it
again: the receiver deduplicates by event_id.

The body, JSON:
    {"team": "...", "events": [{"event_id": "...", "kind": "dead", "job_id": "...",
      "name": "...", "attempts": 3, "max_attempts": 3, "error": "...", "at": "..."}, ...]}
signed in the header `Minutehand-Signature: sha256=<hex>`, the HMAC-SHA256
of the body's bytes under the team's secret (see sign()).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

import httpx

from minutehand.store.dead import PendingDelivery
from minutehand.store.store import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Minutehand-Signature"
# The error text of a delivery kept in the deliveries table, at most.
ERROR_CHARS = 500
# The most of an answer's body read: its start goes into a failure's error,
# and a short one read to its end leaves the connection reusable.
ANSWER_BYTES = 4096


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for a body: how a receiver verifies it
    (compare with hmac.compare_digest)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def body_of(pending: PendingDelivery) -> bytes:
    """The POST body: ids as decimal strings (64 bits, past what a JSON number holds exactly)."""
    events = [{"event_id": str(e["id"]), "kind": e["kind"], "job_id": str(e["job_id"]), "name": e["name"],
               "attempts": e["attempts"], "max_attempts": e["max_attempts"], "error": e["error"], "at": e["at"]}
              for e in pending.events]
    return json.dumps({"team": pending.team, "events": events}, separators=(",", ":")).encode()


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """The wait before the next attempt after the failures-th failure in a row."""
    d = min(cap_s, base_s * 2 ** (max(failures, 1) - 1))
    return random.uniform(d / 2, d)


class WebhookDeliverer:
    """A Service (minutehand.lifecycle): its event loop, HTTP client and
    recording threads live from start() to stop(); deliver() is the duty.
    timeout_s is each POST's deadline, for the whole request."""

    def __init__(self, store: Store, *, timeout_s: float = 10.0, backoff_base_s: float = 1.0,
                 backoff_cap_s: float = 600.0, batch: int = 100, concurrency: int = 8):
        self.store = store
        self.timeout_s = timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.batch = batch
        self.concurrency = concurrency
        self.client: httpx.AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None          # the store's calls, off the event loop
        self.lock = threading.Lock()
        self.in_flight: dict[int, Future] = {}              # team id: its POST, until recorded

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="webhooks", daemon=True)
        self.thread.start()
        # The deadline (asyncio.timeout) bounds the whole request; httpx's own
        # timeouts are per phase and per read, which a trickling answer never trips.
        self.client = httpx.AsyncClient(timeout=None, follow_redirects=False,
                                        headers={"User-Agent": "minutehand-webhooks",
                                                 "Accept-Encoding": "identity"})
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="webhook")

    def stop(self) -> None:
        # POSTs in flight end unrecorded: their batches are sent again by the
        # next holder of the duty (at least once).
        if self.loop is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    async def _close(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()
        await self.loop.shutdown_asyncgens()

    def deliver(self, wait_s: float | None = None) -> int:
        """One pass: the next batch of every due webhook whose team has no
        POST in flight, all POSTed at once; waits for them up to wait_s (None:
        until they end, each within the deadline) and answers how many a 2xx
        acknowledged. Those still running go on and record themselves."""
        with self.lock:
            busy = list(self.in_flight)
        if len(busy) >= self.concurrency:
            return 0
        pending = self.store.webhooks_due(batch=self.batch, limit=self.concurrency - len(busy), busy=busy)
        posts = []
        for p in pending:
            post = asyncio.run_coroutine_threadsafe(self.post(p), self.loop)
            with self.lock:
                self.in_flight[p.team_id] = post
            post.add_done_callback(lambda f, team_id=p.team_id: self._ended(team_id, f))
            posts.append(post)
        done, _ = wait(posts, timeout=wait_s)
        return sum(1 for f in done if not f.cancelled() and f.exception() is None and f.result())

    def _ended(self, team_id: int, post: Future) -> None:
        with self.lock:
            self.in_flight.pop(team_id, None)
        if not post.cancelled() and post.exception() is not None:
            log.warning("webhook delivery of team %d failed: %s", team_id, post.exception())

    async def post(self, pending: PendingDelivery) -> bool:
        body = body_of(pending)
        status, answer, error = None, bytearray(), None

        async def exchange() -> None:
            nonlocal status
            async with self.client.stream("POST", pending.url, content=body, headers={
                    "Content-Type": "application/json", SIGNATURE_HEADER: sign(pending.secret, body)}) as response:
                status = response.status_code
                async for chunk in response.aiter_raw():
                    answer.extend(chunk[:ANSWER_BYTES - len(answer)])
                    if len(answer) >= ANSWER_BYTES:
                        break                       # closing the answer unread closes its connection

        started = time.monotonic()
        # Once the status is in, the rest of the answer (slow, cut off) does not change the outcome.
        try:
            async with asyncio.timeout(self.timeout_s):
                await exchange()
        except TimeoutError:
            if status is None:
                error = f"no answer within {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            if status is None:
                error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        if error is None and not 200 <= status < 300:
            error = f"HTTP {status}: {answer.decode(errors='replace')[:200]}"
        ok = error is None
        duration_ms = int((time.monotonic() - started) * 1000)
        retry_s = backoff_s(pending.failures + 1, self.backoff_base_s, self.backoff_cap_s)
        await self.loop.run_in_executor(self.pool, lambda: self.store.record_delivery(
            pending, status=status, error=error, duration_ms=duration_ms, ok=ok, retry_s=retry_s))
        if not ok:
            log.info("webhook of team %s: attempt %d failed (%s)", pending.team, pending.failures + 1, error)
        return ok
