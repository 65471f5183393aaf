"""Traces with OpenTelemetry installed (the SDK's in-memory exporter): the
client sends its caller's traceparent with each request; the worker runs
each handler in a span with the job's id, name, team, attempt and
lateness, records a failure on it, and makes it a child of the trace the
job carries (LeasedJob.traceparent). The server keeps the traceparent a
job was submitted under (jobs.traceparent: HTTP's header, submit_job's and
submit_jobs' parameter, the client's in-transaction submit) and the claim
hands it to the worker, so a submit and the handler that runs its job are
one trace; an invalid traceparent is ignored, never refused."""
from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from minutehand import client as mh
from minutehand.api.traces import valid
from minutehand.client import Client, job
from minutehand.protocol import JobId, LeasedJob
from minutehand.store.claim import ClaimedJob, ClaimRequest, PlannedClaim
from minutehand.worker import Job, Worker
from minutehand.worker.grace import Grace
from minutehand.worker.outbox import Outbox
from minutehand.worker.runner import JobRunner
from minutehand.worker.slots import Slots
from minutehand.api.app import create_app
from minutehand.settings import Settings
from minutehand.store import migrate
from tests.support import lease_all, running
from tests.processes import Server, serving, wait_until

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


# W3C Trace Context's traceparent: version-traceid-parentid-flags, lowercase hex.
GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INVALID = [
    "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",              # no flags
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",              # uppercase
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",              # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",              # all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",              # version ff
    "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",              # a dash out of place
    "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",             # too long
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01",              # not hex
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
]


def traceparent_of(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def stored(dsn: str, job_ids) -> dict[int, str | None]:
    with psycopg.connect(dsn) as c:
        return dict(c.execute("SELECT id, traceparent FROM minutehand.jobs WHERE id = ANY (%s)",
                              ([int(i) for i in job_ids],)).fetchall())


@pytest.mark.unit
def test_a_traceparent_is_kept_only_when_valid():
    assert valid(GOOD) == GOOD
    assert valid("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") is not None   # another version
    assert [t for t in INVALID if valid(t) is not None] == []


def test_the_procedures_keep_a_valid_traceparent_and_ignore_any_other(db):
    """mh_traceparent, which every submission path applies, agrees with the
    API's check; submit_job, submit_jobs (one per job) and submit_series
    keep it, with an invalid one the job is submitted all the same, without."""
    for t in [GOOD, *INVALID, None]:
        assert db.execute("SELECT mh_traceparent(%s)", (t,)).fetchone()[0] == valid(t), t
    db.execute("INSERT INTO teams (name) VALUES ('tr')")
    one = db.execute("SELECT submit_job('tr', 'a', p_traceparent => %s)", (GOOD,)).fetchone()[0]
    bad = db.execute("SELECT submit_job('tr', 'a', p_traceparent => 'nonsense')").fetchone()[0]
    plain = db.execute("SELECT submit_job('tr', 'a')").fetchone()[0]
    many = [r[0] for r in db.execute(
        "SELECT job_id FROM submit_jobs('tr', ARRAY['b', 'b', 'b'], p_keys => ARRAY[NULL, 'k', NULL],"
        " p_traceparents => ARRAY[%s, %s, 'x']) ORDER BY idx", (GOOD, GOOD.replace("01", "00", 1))).fetchall()]
    series = db.execute("SELECT job_id FROM submit_series('tr', 'c', p_every_s => 60, p_traceparent => %s)",
                        (GOOD,)).fetchone()[0]
    kept = dict(db.execute("SELECT id, traceparent FROM jobs").fetchall())
    assert [kept[i] for i in (one, bad, plain, *many, series)] == [GOOD, None, None, GOOD, GOOD.replace("01", "00", 1),
                                                                 None, GOOD]
    with pytest.raises(psycopg.Error, match="p_traceparents has a different length"):
        db.execute("SELECT * FROM submit_jobs('tr', ARRAY['b'], p_traceparents => ARRAY['x', 'y'])")


def test_every_claim_hands_on_the_jobs_traceparent(db_dsn, live_store):
    """The dispatcher's planned claims and claim_due return each job's
    traceparent (None for a job submitted without one)."""
    from minutehand.store.submit import JobSpec

    def submit() -> dict[int, str | None]:
        return {live_store.submit("t", JobSpec("traced", traceparent=GOOD)).job_id: GOOD,
                live_store.submit("t", JobSpec("untraced")).job_id: None}

    def got(results) -> dict[int, str | None]:
        assert all(isinstance(j, ClaimedJob) for answer in results for j in answer)
        return {j.job_id: j.traceparent for answer in results for j in answer}

    leases = lease_all(live_store)
    planned_jobs = submit()
    with live_store.connection() as conn:
        rows = conn.execute("SELECT shard, bucket, strict, priority, team_id, due FROM due_edges(%s, %s)",
                            (list(leases), [None] * len(leases))).fetchall()
    planned = [PlannedClaim(r["shard"], leases[r["shard"]], "w", r["bucket"], [r["strict"]], [r["priority"]],
                            [r["team_id"]], [r["due"]]) for r in rows if r["team_id"] is not None]
    results, refused = live_store.claim(planned, "d1", 30)
    assert not refused and got(results) == planned_jobs
    due_jobs = submit()
    results, refused = live_store.claim([ClaimRequest(s, e, 10, "w") for s, e in leases.items()], "d1", 30)
    assert not refused and got(results) == due_jobs


@pytest.mark.processes
def test_a_submit_and_the_handler_that_runs_its_job_are_one_trace(db_dsn, live_store, token, spans):
    """A real `minutehand serve` and a worker: whether submitted over HTTP
    (one job, a batch), through submit_job in SQL or in the caller's own
    transaction (client/tx.py), the handler's span is a child of the
    submitter's span, in its trace. An invalid traceparent header gives a
    201 and a job without one; a job submitted without one is leased with
    traceparent None and its handler's span starts a trace of its own."""
    sent_headers: list[httpx.Headers] = []
    transport = httpx.HTTPTransport()

    class Recorder(httpx.BaseTransport):
        def handle_request(self, request):
            sent_headers.append(request.headers)
            return transport.handle_request(request)

    leased: dict[int, str | None] = {}
    server = Server(db_dsn)
    try:
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=4, grace_s=5)

        @worker.job("traced")
        def traced(job: Job):
            leased[int(job.id)] = trace.get_current_span().get_span_context().trace_id
            return None

        tracer = trace.get_tracer("test")
        team_token = live_store.rotate_token("t")
        with Client(server.url, team_token, transport=Recorder()) as client:
            with tracer.start_as_current_span("checkout") as one:
                created = client.submit("traced", {"via": "http"})
            with tracer.start_as_current_span("batch") as batch:
                many = client.submit_many([job("traced", {"via": "batch", "i": i}) for i in range(2)])
            with tracer.start_as_current_span("sql") as sql, psycopg.connect(db_dsn) as conn:
                carrier: dict[str, str] = {}
                propagate.inject(carrier)
                in_sql = conn.execute("SELECT minutehand.submit_job('t', 'traced', p_traceparent => %s)",
                                      (carrier["traceparent"],)).fetchone()[0]
            with tracer.start_as_current_span("in-transaction") as tx, psycopg.connect(db_dsn) as conn:
                in_tx = mh.submit(conn, "traced", {"via": "tx"}, team="t")
                tx_many = mh.submit_many(conn, [job("traced", {"via": "tx-many"})], team="t")
            plain = client.submit("traced", {"via": "no span"})
            answer = httpx.post(server.url + "/v1/jobs", json={"name": "traced", "payload": {"via": "invalid"}},
                                headers={"Authorization": f"Bearer {team_token}", "traceparent": INVALID[3]})
            assert answer.status_code == 201, answer.text
            invalid = int(answer.json()["job_id"])
            answer = httpx.post(server.url + "/v1/jobs/batch", json={"jobs": [{"name": "traced"}]},
                                headers={"Authorization": f"Bearer {team_token}", "traceparent": "garbage"})
            assert answer.status_code == 200 and answer.json()["created"] == 1, answer.text
            invalid_batch = int(answer.json()["items"][0]["job_id"])
            expected = {created.job_id: one, in_sql: sql, in_tx.job_id: tx, tx_many.items[0].job_id: tx,
                        **{it.job_id: batch for it in many.items}}
            untraced = [plain.job_id, invalid, invalid_batch]
            assert stored(db_dsn, untraced) == {int(i): None for i in untraced}
            assert stored(db_dsn, expected) == {int(i): traceparent_of(s) for i, s in expected.items()}
            with running(worker):
                wait_until(lambda: len(leased) == len(expected) + len(untraced), 120, "the jobs to run")
    finally:
        server.stop()
    assert sent_headers[0]["traceparent"] == traceparent_of(one)
    handlers = {int(s.attributes["minutehand.job.id"]): s for s in spans.get_finished_spans() if s.name == "traced"}
    assert set(handlers) == {int(i) for i in [*expected, *untraced]}
    for job_id, submitter in expected.items():
        span = handlers[int(job_id)]
        assert span.context.trace_id == submitter.get_span_context().trace_id, job_id
        assert span.parent is not None and span.parent.span_id == submitter.get_span_context().span_id, job_id
        assert (span.attributes["minutehand.job.name"], span.attributes["minutehand.job.team"],
                span.attributes["minutehand.job.attempt"]) == ("traced", "t", 1)
        assert "minutehand.job.lateness_s" in span.attributes
    own_traces = {s.get_span_context().trace_id for s in (one, batch, sql, tx)}
    for job_id in untraced:
        span = handlers[int(job_id)]
        assert span.parent is None and span.context.trace_id not in own_traces, job_id


def test_a_server_with_a_tracer_provider_spans_each_request_and_its_jobs_are_its_children(db_dsn, live_store, spans):
    """Made in a process whose tracer provider is set up (this one's: the
    SDK's), the app has Litestar's OpenTelemetry plugin: each request is a
    server span, a child of the caller's, and the jobs it submits (one, a
    batch) keep that request span's traceparent, so the trace reads the
    caller, the request, the handler."""
    with serving(create_app(Settings(api_submit_workers=0), live_store, head=migrate.head())) as url, \
            Client(url, live_store.rotate_token("t")) as client:
        with trace.get_tracer("test").start_as_current_span("checkout") as caller:
            one = client.submit("traced")
            many = client.submit_many([job("traced"), job("traced")])
        # (a request's span ends just after its answer is sent)
        wait_until(lambda: len([s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]) == 2,
                   10, "the requests' spans")
    requests = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert len(requests) == 2 and all(r.parent.span_id == caller.get_span_context().span_id for r in requests)
    single, batch = sorted(requests, key=lambda r: r.start_time)
    assert stored(db_dsn, [one.job_id]) == {int(one.job_id): traceparent_of(single)}
    assert stored(db_dsn, [i.job_id for i in many.items]) == {int(i.job_id): traceparent_of(batch) for i in many.items}
