"""Traces with OpenTelemetry installed (the SDK's in-memory exporter): the
client sends its caller's traceparent with each request; the worker runs
each handler in a span with the job's id, name, team, attempt and
lateness, records a failure on it, and makes it a child of the trace the
job carries (LeasedJob.traceparent)."""
from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from minutehand.client import Client
from minutehand.protocol import JobId, LeasedJob
from minutehand.worker import Job, Worker
from minutehand.worker.grace import Grace
from minutehand.worker.outbox import Outbox
from minutehand.worker.runner import JobRunner
from minutehand.worker.slots import Slots
from tests.support import running
from tests.processes import Server, wait_until

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracing() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


@pytest.fixture(autouse=True)
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER


class Recording(Outbox):
    def __init__(self):
        super().__init__(None, [], worker_id="w", flush_s=0)
        self.sent = []

    def send(self, kind, item, extend_s=None):
        self.sent.append((kind, item))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def run_one(handlers, name: str, traceparent: str | None) -> list:
    async def main():
        slots = Slots(1)
        runner = JobRunner(handlers, "w", slots, Grace(asyncio.Event()), 1)
        outbox = Recording()
        now = dt.datetime.now(dt.timezone.utc)
        lj = LeasedJob(job_id=JobId(7), team="billing", name=name, payload=b'{"n": 1}', attempt=2, max_attempts=3,
                       idempotency_key=None, lease_token=uuid.UUID(int=1), claim_expires_at=now, claim_s=30.0,
                       due_at=now, run_at=now - dt.timedelta(seconds=3), traceparent=traceparent)
        await slots.take(1)
        runner.start_job(lj, outbox, time.monotonic())
        await runner.stop()
        return outbox.sent

    return asyncio.run(main())


@pytest.mark.unit
def test_the_handlers_span_is_a_child_of_the_jobs_trace_and_records_a_failure(spans):
    def ok(job: Job):
        return None

    def broken(job: Job):
        raise RuntimeError("printer on fire")

    with trace.get_tracer("test").start_as_current_span("checkout") as submitter:
        carrier: dict[str, str] = {}
        from opentelemetry import propagate
        propagate.inject(carrier)
    run_one({"ok": ok}, "ok", carrier["traceparent"])
    sent = run_one({"broken": broken}, "broken", carrier["traceparent"])
    assert [k for k, _ in sent] == ["start", "fail"]
    by_name = {s.name: s for s in spans.get_finished_spans()}
    handler = by_name["ok"]
    assert handler.context.trace_id == submitter.get_span_context().trace_id
    assert handler.parent.span_id == submitter.get_span_context().span_id
    assert handler.kind == trace.SpanKind.CONSUMER
    assert handler.attributes["minutehand.job.id"] == "7"
    assert (handler.attributes["minutehand.job.name"], handler.attributes["minutehand.job.team"],
            handler.attributes["minutehand.job.attempt"]) == ("ok", "billing", 2)
    assert handler.attributes["minutehand.job.lateness_s"] >= 3
    failed = by_name["broken"]
    assert failed.status.status_code == StatusCode.ERROR
    assert any(e.name == "exception" and "printer on fire" in e.attributes["exception.message"] for e in failed.events)


@pytest.mark.unit
def test_a_job_without_a_traceparent_starts_a_trace_of_its_own(spans):
    run_one({"ok": lambda job: None}, "ok", None)
    (span,) = spans.get_finished_spans()
    assert span.parent is None and span.attributes["minutehand.job.name"] == "ok"


@pytest.mark.processes
def test_the_client_sends_the_callers_traceparent_and_the_worker_traces_the_run(db_dsn, live_store, token, spans):
    sent_headers: list[httpx.Headers] = []
    transport = httpx.HTTPTransport()

    class Recorder(httpx.BaseTransport):
        def handle_request(self, request):
            sent_headers.append(request.headers)
            return transport.handle_request(request)

    server = Server(db_dsn)
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)

        @worker.job("traced")
        def traced(job: Job):
            return None

        with Client(server.url, live_store.rotate_token("t"), transport=Recorder()) as client:
            with trace.get_tracer("test").start_as_current_span("checkout") as submitter:
                created = client.submit("traced")
            with running(worker):
                wait_until(lambda: client.status(created.job_id).state == "succeeded", 120, "the job to run")
    finally:
        server.stop()
    expected = f"00-{submitter.get_span_context().trace_id:032x}-{submitter.get_span_context().span_id:016x}-"
    assert sent_headers[0]["traceparent"].startswith(expected)
    handler = next(s for s in spans.get_finished_spans() if s.name == "traced")
    assert handler.attributes["minutehand.job.id"] == str(created.job_id)
