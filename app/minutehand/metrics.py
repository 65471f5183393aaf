"""What a serve or dispatcher process measures of itself, for Prometheus
(docs/operations/metrics.md): batch sizes, shard leases, database round trips and
pool waits. Families named minutehand_*, defined once here, in
prometheus_client's default registry (REGISTRY), beside its process and
garbage-collector families and the HTTP requests Litestar's middleware
counts (app/minutehand/api/metrics.py); several apps built in one Python process, as
tests do, share them.

The counts of jobs by state are not here: they are read from the database
(app/minutehand/api/metrics.py), where every transition is counted by the transaction
that makes it. A leaf: imports nothing of minutehand, so the store and the
dispatcher may record into it.

Recording is cheap: an increment or an observation is a lock and an add;
the hot paths record once per batch, not per job."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Batch sizes: 1 (a lone event, written at once) to a full dispatch_batch or outcome batch.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)

CLAIM_BATCH = Histogram("minutehand_claim_batch_jobs", "Jobs claimed per claim round trip (every shard's claims "
                        "of one dispatch round, sent together)", buckets=BATCH_BUCKETS)
OUTCOME_BATCH = Histogram("minutehand_outcome_batch_reports", "Worker reports written per procedure call, by "
                          "kind (start, heartbeat, record, complete, fail, release)", ["kind"],
                          buckets=BATCH_BUCKETS)
SUBMIT_BATCH = Histogram("minutehand_submit_batch_jobs", "Jobs per submission call to the database (a single "
                         "submission, coalesced singles, or a batch)", buckets=BATCH_BUCKETS)
SHARD_LEASES = Gauge("minutehand_shard_leases", "Shard leases this dispatcher holds")
SHARD_TAKEOVERS = Counter("minutehand_shard_takeovers", "Shard leases this dispatcher gained (at its start, and "
                          "when a dispatcher joined, left or died)")
STALE_CLAIMS = Counter("minutehand_stale_claims_refused", "Claims refused because this dispatcher's lease of the "
                       "shard was stale (another owns it now): the shard is dropped")
SHARDS_ASIDE = Counter("minutehand_shards_set_aside", "Shards a dispatcher left aside for a few seconds because "
                       "their read or claim could not reach their node (on Citus: a worker node away)")
DB_SECONDS = Histogram("minutehand_db_seconds", "Time a store call held its database connection: one statement "
                       "or one pipelined round trip (the clock starts once the connection is had)", ["pool"],
                       buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


@contextmanager
def timed(histogram: Histogram) -> Iterator[None]:
    """Observe how long the block took (perf_counter: cheaper than the
    prometheus_client decorator's closure per call)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - start)


class PoolStats(Collector):
    """The connection pools' own counters (psycopg_pool's get_stats), read
    when scraped: waits for a connection, connections in use."""

    def __init__(self) -> None:
        self._pools: dict[int, tuple[str, Callable[[], dict[str, int]]]] = {}
        self._lock = threading.Lock()

    def watch(self, name: str, get_stats: Callable[[], dict[str, int]]) -> Callable[[], None]:
        """Report a pool under this name; returns the call that stops it."""
        key = id(get_stats)
        with self._lock:
            self._pools[key] = (name, get_stats)

        def forget() -> None:
            with self._lock:
                self._pools.pop(key, None)
        return forget

    def collect(self) -> Iterator[Any]:
        waited = CounterMetricFamily("minutehand_db_pool_wait_seconds", "Time requests waited for a pooled "
                                     "connection, in all", labels=["pool"])
        requests = CounterMetricFamily("minutehand_db_pool_requests", "Connections asked of the pool",
                                       labels=["pool"])
        timeouts = CounterMetricFamily("minutehand_db_pool_timeouts", "Requests that gave up waiting for a "
                                       "connection (the API answers 503)", labels=["pool"])
        waiting = GaugeMetricFamily("minutehand_db_pool_waiting", "Requests waiting for a connection now",
                                    labels=["pool"])
        connections = GaugeMetricFamily("minutehand_db_pool_connections", "The pool's connections: size (open), "
                                        "idle (available), max", labels=["pool", "state"])
        with self._lock:
            pools = list(self._pools.values())
        for name, get_stats in pools:
            s = get_stats()
            waited.add_metric([name], s.get("requests_wait_ms", 0) / 1000)
            requests.add_metric([name], s.get("requests_num", 0))
            timeouts.add_metric([name], s.get("requests_errors", 0))
            waiting.add_metric([name], s.get("requests_waiting", 0))
            for state, key in (("size", "pool_size"), ("idle", "pool_available"), ("max", "pool_max")):
                connections.add_metric([name, state], s.get(key, 0))
        yield from (waited, requests, timeouts, waiting, connections)

    def describe(self) -> list:
        return []


POOLS = PoolStats()
REGISTRY.register(POOLS)
