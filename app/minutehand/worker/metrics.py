"""A worker's own Prometheus metrics (docs/operations/metrics.md), served on
worker_metrics_port when it is set (0: off, the default): what this
worker ran, by job name (its handlers' names: bounded) and outcome, and how
long the handlers took. The counts of jobs fleet-wide are the server's
(its /metrics reads them from the database); these say what each worker
did. prometheus-client is a base dependency (small, pure Python, no
dependencies of its own), so the worker library needs nothing more."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

JOBS = Counter("minutehand_worker_jobs", "Jobs this worker ran, by job name and outcome: succeeded, failed "
               "(reported; retried or dead as the server decides), replayed (a stored result under its "
               "idempotency key), dropped (its claim was lost: not reported), refused (reported and refused: "
               "the claim was gone; or not delivered)", ["name", "outcome"])
JOB_SECONDS = Histogram("minutehand_worker_job_seconds", "From the job's arrival to its outcome, by job name",
                        ["name"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600))
BUSY = Gauge("minutehand_worker_jobs_running", "Jobs this worker holds now (running, or done and reporting)")


# The labelled series by (name, outcome), looked up once: labels() per job
# costs more than the increment.
_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}


def record(name: str, outcome: str, seconds: float) -> None:
    series = _series.get((name, outcome))
    if series is None:
        series = _series[name, outcome] = (JOBS.labels(name, outcome), JOB_SECONDS.labels(name))
    series[0].inc()
    series[1].observe(seconds)


class MetricsServer:
    """An AsyncService: prometheus_client's own HTTP server (a thread) on
    host:port from start() to stop(). running() says how many jobs this
    worker holds, read when scraped."""

    def __init__(self, host: str, port: int, running: Callable[[], int]):
        self.host, self.port = host, port
        self.running = running
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        BUSY.set_function(self.running)
        self._server, self._thread = prometheus_client.start_http_server(self.port, self.host)

    async def stop(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.shutdown)
            self._server.server_close()
            self._server = None
