"""Webhook delivery: each team's events (its dead jobs) POSTed to its
webhook, in order, in batches, at least once.

A duty of the dispatcher's maintenance (app/minutehand/maintenance/schedule.py), run
by one dispatcher at a time (the holder of the `webhooks` duty lease). Each
run reads the webhooks with events past their position and not backing off
(one statement), POSTs each one's next batch (up to `batch` events) from a
small thread pool, and records the attempt. A 2xx moves the webhook's
position past the batch; anything else (another status, a timeout, a
refused connection) raises its backoff: the batch is tried again after a
random time in [d/2, d], d = min(cap, base * 2^(failures - 1)). Nothing is
moved before the answer, so a deliverer killed mid-request leaves the
batch where it was and the next holder of the lease sends it again: the
receiver deduplicates by event_id.

The body, JSON:
    {"team": "...", "events": [{"event_id": "...", "kind": "dead", "job_id": "...",
      "name": "...", "attempts": 3, "max_attempts": 3, "error": "...", "at": "..."}, ...]}
signed in the header `Minutehand-Signature: sha256=<hex>`, the HMAC-SHA256
of the body's bytes under the team's secret (see sign()).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from minutehand.store.dead import PendingDelivery
from minutehand.store.store import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Minutehand-Signature"
# The error text of a delivery kept in the deliveries table, at most.
ERROR_CHARS = 500


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
    """A Service (minutehand.lifecycle): its HTTP client lives from start()
    to stop(); deliver() is the duty."""

    def __init__(self, store: Store, *, timeout_s: float = 10.0, backoff_base_s: float = 1.0,
                 backoff_cap_s: float = 600.0, batch: int = 100, concurrency: int = 8):
        self.store = store
        self.timeout_s = timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.batch = batch
        self.concurrency = concurrency
        self.client: httpx.Client | None = None
        self.pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self.client = httpx.Client(timeout=self.timeout_s, follow_redirects=False,
                                   headers={"User-Agent": "minutehand-webhooks"})
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="webhook")

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.client is not None:
            self.client.close()

    def deliver(self) -> int:
        """One pass: every due webhook's next batch, at once; how many batches a 2xx acknowledged."""
        pending = self.store.webhooks_due(batch=self.batch, limit=4 * self.concurrency)
        if not pending:
            return 0
        return sum(self.pool.map(self.post, pending))

    def post(self, pending: PendingDelivery) -> bool:
        body = body_of(pending)
        status, error = None, None
        started = time.monotonic()
        try:
            response = self.client.post(pending.url, content=body, headers={
                "Content-Type": "application/json", SIGNATURE_HEADER: sign(pending.secret, body)})
            status = response.status_code
            if not 200 <= status < 300:
                error = f"HTTP {status}: {response.text[:200]}"
        except httpx.TimeoutException:
            error = f"no answer within {self.timeout_s:g} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        ok = error is None
        duration_ms = int((time.monotonic() - started) * 1000)
        self.store.record_delivery(pending, status=status, error=error, duration_ms=duration_ms, ok=ok,
                                   retry_s=backoff_s(pending.failures + 1, self.backoff_base_s,
                                                     self.backoff_cap_s))
        if not ok:
            log.info("webhook of team %s: attempt %d failed (%s)", pending.team, pending.failures + 1, error)
        return ok
