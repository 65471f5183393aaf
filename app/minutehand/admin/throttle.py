"""Failed sign-ins per client address: a token bucket each, in this
process. A failure takes a token; the bucket holds FAILURES and refills
FAILURES a minute. An empty bucket refuses the client's next sign-ins (429,
Retry-After) before their token is even looked at, so guessing tokens costs
minutes per handful instead of a hundred a second. A successful sign-in
takes nothing.

Per process, not shared: each `serve` process behind a load balancer lets a
client as many tries again, which still caps guessing; the buckets live in
memory only (at most MAX_CLIENTS, those that filled up again dropped first).
"""
from __future__ import annotations

import time
from collections.abc import Callable

FAILURES = 10                    # failed sign-ins a client may make at once, and again each PER_S
PER_S = 60.0
MAX_CLIENTS = 10_000


class SignInThrottle:
    def __init__(self, failures: int = FAILURES, per_s: float = PER_S, max_clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic):
        self.capacity = float(failures)
        self.rate = failures / per_s             # tokens back per second
        self.max_clients = max_clients
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}     # client -> (tokens, when counted)

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (self.capacity, now))
        return min(self.capacity, tokens + (now - at) * self.rate)

    def wait_s(self, client: str) -> float:
        """0 if the client may try to sign in now, else the seconds until it may."""
        tokens = self._tokens(client, self.clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def failed(self, client: str) -> None:
        """A failed sign-in of the client: it takes a token."""
        now = self.clock()
        tokens = self._tokens(client, now)
        self._buckets.pop(client, None)          # re-inserted last: the dict stays oldest first
        self._buckets[client] = (max(0.0, tokens - 1), now)
        if len(self._buckets) > self.max_clients:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again (they hold nothing), then the oldest."""
        for client in [c for c in self._buckets if self._tokens(c, now) >= self.capacity]:
            del self._buckets[client]
        while len(self._buckets) > self.max_clients:
            del self._buckets[next(iter(self._buckets))]
