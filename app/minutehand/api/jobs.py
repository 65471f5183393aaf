"""Job routes: submit one, submit a batch, read status, cancel, list.

Handlers parse types and enforce the limits that only HTTP has (body size,
batch length); what a job may be is decided by the procedures, once, in SQL.
What the database cannot store at all or a worker cannot read
(jsontext.json_text_problem: a NUL in a string, a number beyond a double
like 1e400), idempotency keys and repeat specs (rules.repeat_problem) are
checked here, so that in a batch such an item is refused alone instead of
failing the whole call.

Bodies are typed `data` parameters, decoded by msgspec (bodies.py). A batch
is the exception: its handler gets the bytes as sent (BatchBody, documented
as BatchIn) and reads them in two steps: its `jobs` array as raw items first
(cheap: no item is decoded), so that one over the length limit is refused
before any work per item; then item by item, so that an item that cannot be
decoded is reported in its place while the others are submitted. Large
batches are read in a worker thread, off the event loop.

Each job submitted keeps the trace context of its request (traces.py: the
request's span, else a valid `traceparent` header; an invalid one is
ignored), a batch's jobs all the same one.
"""
from __future__ import annotations

import datetime as dt
import functools
from typing import Annotated, TypeVar, get_args

import anyio.to_thread
import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import HeaderParameter, JSONBody, PathParameter, QueryParameter

from minutehand.api import problems, traces
from minutehand.api.bodies import RawBody
from minutehand.api.problems import ADMISSION, COMMON
from minutehand.protocol.api import (KEY_RULE, KEY_SCHEMA, BatchIn, BatchItemOut, BatchJobIn, BatchOut, CancelledOut,
                                    JobCreated, JobIn, JobOut, JobPageOut, JobSummaryOut, Repeat, State, decoder,
                                    key_problem, text_problem)
from minutehand.protocol import JobId
from minutehand.protocol.jsontext import MAX_JSON_DEPTH, json_text_problem, may_overflow
from minutehand.rules import TEAM_NAME_PATTERN, repeat_problem
from minutehand.store import records
from minutehand.store.jobs import JobStatus
from minutehand.store.submit import JobSpec
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import CONFLICT, INVALID, MALFORMED, NOT_CANCELLABLE, NOT_FOUND, TOO_LARGE, ApiProblem

SECURITY = [{"bearer": []}]
BATCH_DECODER = decoder(BatchIn)
ITEM_DECODER = decoder(BatchJobIn)
# A batch body larger than this is read in a worker thread (decoding ~1 MB
# of items takes a few milliseconds, which the event loop should not spend).
BATCH_INLINE_BYTES = 512 * 1024
STATES = get_args(State)

# Checked by header_key (422), not by Litestar: the schema only says what it accepts.
IdempotencyKey = Annotated[str | None, HeaderParameter(
    name="Idempotency-Key", required=False, schema_extra=KEY_SCHEMA,
    description="the same key from the same team within 24 h returns the first job (200) and creates nothing. "
                f"{KEY_RULE}; sent once (two such headers are refused)")]
TeamParam = Annotated[str | None, QueryParameter(
    required=False, pattern=TEAM_NAME_PATTERN,
    description="admin token: the team to act for; a team token may only name itself")]
JobIdParam = Annotated[int, PathParameter(ge=-(2**63), le=2**63 - 1, description="the job id")]

# A time in a query is RFC 3339 text, read as a body's is: Litestar's own
# reading of a datetime parameter also takes a number (seconds since 1970).
TIME_SCHEMA = {"format": "date-time"}


def query_time(label: str, value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        time = msgspec.convert(value, dt.datetime)
    except msgspec.ValidationError:
        raise ApiProblem(MALFORMED, f"{label}: {value[:100]!r} is not an RFC 3339 date-time") from None
    if time.tzinfo is None:
        raise ApiProblem(INVALID, f"{label} must be an RFC 3339 time with a UTC offset")
    return time


def to_repeat(repeat: Repeat | None) -> records.Repeat | None:
    if repeat is None:
        return None
    return records.Repeat(int(repeat.every_s) if repeat.every_s is not None else None, repeat.cron,
                          repeat.timezone, repeat.misfire)


def check_repeat(repeat: Repeat | None) -> str | None:
    """Why the repeat fields are invalid (rules.repeat_problem); None if valid or absent."""
    if repeat is not None and (reason := text_problem("repeat.cron", repeat.cron)
                               or text_problem("repeat.timezone", repeat.timezone)):
        return reason
    return repeat_problem(to_repeat(repeat))


def to_spec(job: JobIn, key: str | None, traceparent: str | None = None) -> JobSpec | str:
    """The job to submit, or why it cannot be (what the database could not
    store, a bad idempotency key or repeat spec)."""
    if job.payload is msgspec.UNSET:
        payload = {}
    else:
        payload = bytes(job.payload)            # JSON text, passed through
        # (Most payloads are short, ASCII and free of \u escapes and exponents: no call.)
        if (len(payload) > MAX_JSON_DEPTH or b"\\u" in payload or not payload.isascii()
                or may_overflow(payload)) and (reason := json_text_problem("payload", payload)):
            return reason
    if "\x00" in job.name:
        return text_problem("name", job.name)
    if key is not None and (reason := key_problem(key)):
        return reason
    if job.repeat is not None and (reason := check_repeat(job.repeat)):
        return reason
    return JobSpec(name=job.name, due_at=job.due_at, payload=payload, priority=int(job.priority),
                   max_attempts=int(job.max_attempts),
                   flex_s=None if job.flex_s is None else int(job.flex_s), strict=job.strict,
                   idempotency_key=key, backoff_base_s=job.backoff_base_s, backoff_cap_s=job.backoff_cap_s,
                   repeat=to_repeat(job.repeat) if job.repeat is not None else None, traceparent=traceparent)


def header_key(request: Request) -> str:
    """The Idempotency-Key header, exactly as sent (Litestar would take the
    first of several, and read other bytes than ASCII as Latin-1)."""
    values = [v for k, v in request.scope["headers"] if k == b"idempotency-key"]
    if len(values) != 1:
        raise ApiProblem(MALFORMED, f"{len(values)} Idempotency-Key headers: send one")
    raw = values[0]
    if not raw.isascii():
        byte = next(b for b in raw if b > 0x7F)
        raise ApiProblem(INVALID, f"Idempotency-Key contains the byte 0x{byte:02X}, which is not ASCII: it "
                                  f"must be {KEY_RULE}")
    key = raw.decode("ascii")
    if reason := key_problem(key):
        raise ApiProblem(INVALID, reason.replace("idempotency key", "Idempotency-Key", 1))
    return key


# ---------------------------------------------------------------- batches
class BatchBody(RawBody):
    """POST /v1/jobs/batch's body as sent, read by parse_batch. A Struct
    `data` would be decoded whole, on the event loop, before the handler
    runs, and one bad item would refuse the batch."""
    schema = BatchIn


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    jobs: list[msgspec.Raw]


class _Shape(msgspec.Struct, forbid_unknown_fields=True):
    jobs: msgspec.Raw


ENVELOPE = msgspec.json.Decoder(_Envelope)
SHAPE = msgspec.json.Decoder(_Shape)


@functools.cache
def _bounded_envelope(limit: int) -> msgspec.json.Decoder:
    """A decoder of the envelope that stops reading `jobs` at item limit+1.
    msgspec checks a list's max_length only after building the whole list
    (a body of 20 million `{}` items: 1 GB and 3.5 s), but an array_like
    Struct of `limit` optional fields refuses the first item too many."""
    items = msgspec.defstruct("BatchItems", [(f"i{n}", msgspec.Raw | msgspec.UnsetType, msgspec.UNSET)
                                             for n in range(limit)], array_like=True, forbid_unknown_fields=True)
    return msgspec.json.Decoder(msgspec.defstruct("BatchEnvelope", [("jobs", items)], forbid_unknown_fields=True))


def batch_items(body: bytes, limit: int) -> list[msgspec.Raw]:
    """The `jobs` of a batch body, each as its JSON text; 413 over `limit`
    items, 400 for malformed JSON, 422 for another shape."""
    try:
        if body.count(b",") < limit:             # at most `limit` items: a list costs no more
            items = problems.decode(ENVELOPE, body).jobs
        else:
            envelope = _bounded_envelope(limit).decode(body)
            items = [raw for raw in msgspec.structs.astuple(envelope.jobs) if raw is not msgspec.UNSET]
    except msgspec.ValidationError as exc:     # the shape, or one item too many
        shape = problems.decode(SHAPE, body)     # the shape's own 422, if that was it
        if bytes(memoryview(shape.jobs)[:1]) != b"[":
            raise ApiProblem(INVALID, f"request body: {exc}") from None
        raise ApiProblem(TOO_LARGE, f"a batch holds at most {limit:,} jobs, this one more: split it",
                         max_items=limit) from None
    except msgspec.DecodeError as exc:
        raise ApiProblem(MALFORMED, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise problems.too_deep() from None
    if len(items) > limit:
        raise ApiProblem(TOO_LARGE, f"a batch holds at most {limit:,} jobs, this one {len(items):,}: split it",
                         max_items=limit)
    return items


def _item_error(i: int, exc: Exception) -> str:
    """msgspec's reason, located in the request (`$.jobs[i]...`)."""
    text = str(exc)
    if " - at `$" in text:
        return text.replace(" - at `$", f" - at `$.jobs[{i}]", 1)
    return f"{text} - at `$.jobs[{i}]`"


def parse_batch(body: bytes, limit: int, traceparent: str | None = None) -> list[JobSpec | str]:
    """Each job of a batch as its JobSpec (each with this traceparent), or
    why it is refused.

    Fewer commas than `limit` prove at most `limit` items, so the whole
    batch is first decoded at once (the fastest way, and what nearly every
    batch needs); if anything in it does not decode, it is read again, its
    items counted before any is decoded, then each decoded alone."""
    if body.count(b",") < limit:
        try:
            batch = BATCH_DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            pass                                 # item by item below: whose error, or the envelope's
        else:
            return [to_spec(job, job.idempotency_key, traceparent) for job in batch.jobs]
    parsed: list[JobSpec | str] = []
    for i, raw in enumerate(batch_items(body, limit)):
        try:
            job = ITEM_DECODER.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            parsed.append(_item_error(i, exc))
            continue
        except RecursionError:
            parsed.append(f"jobs[{i}] is nested too deeply to read")
            continue
        parsed.append(to_spec(job, job.idempotency_key, traceparent))
    return parsed


def series_id_out(series_id: int | None) -> str | None:
    return str(series_id) if series_id is not None else None


A = TypeVar("A", bound=msgspec.Struct)


def from_record(answer: type[A], record: object, **shaped: object) -> A:
    """An answer built from the store's record: each of its fields the
    record has, by name, but those this API shapes itself (`shaped`)."""
    return answer(**{f: getattr(record, f) for f in answer.__struct_fields__
                     if f not in shaped and hasattr(record, f)}, **shaped)


def job_out(s: JobStatus) -> JobOut:
    return from_record(JobOut, s, job_id=JobId(s.job_id), series_id=series_id_out(s.series_id), repeat=(
        Repeat(s.every_s, s.cron, s.timezone, s.misfire) if s.series_id is not None else None),
        lateness_s=s.lateness.total_seconds() if s.lateness is not None else None)


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store, settings = ctx.store, ctx.settings
    # Built now (~0.3 s and 5 MB for 10,000 items, once per process), not
    # on the event loop by the first batch that needs it.
    _bounded_envelope(settings.api_max_batch)

    async def no_job(job_id: int, scope: str | None) -> ApiProblem:
        """The 404 of an id with no job (for this team). The id says when it
        was made: older than the team's retention, a finished job of that id
        would have been removed (expired); younger, it would still be here,
        so there was no such job. An id cannot say whether it was ever used,
        hence "or never existed"."""
        gone = await ctx.db(store.job_gone, job_id, scope, ctx.settings.job_retention_s)
        if gone.expired:
            return ApiProblem(NOT_FOUND, f"no job {job_id}: it expired (or never existed). Its id was made at "
                              f"{gone.made_at.isoformat()}, more than {gone.retention_s} s ago, the retention "
                              "of finished jobs, after which they are removed", job_id=str(job_id), expired=True)
        return ApiProblem(NOT_FOUND, f"no job {job_id}", job_id=str(job_id), expired=False)

    @post("/v1/jobs", operation_id="submitJob", status_code=201, security=SECURITY, tags=["jobs"],
          request_max_body_size=settings.api_max_body_bytes, summary="Submit a job",
          description="Returns the job id and its assigned run time. With an Idempotency-Key already used "
                      "by this team within 24 h for the same request: the first job, status 200. With "
                      "`repeat`: a series and its first run, an ordinary job whose id, run time and "
                      "`series_id` are returned (each later run is created when the one before it is "
                      "claimed); the key then names the series' first run. Over the team's submission "
                      "rate: 429 with Retry-After; over its ceiling of pending jobs: 429. Nothing is "
                      "written then.",
          responses={200: ResponseSpec(JobCreated, description="the job the Idempotency-Key named"),
                     **problems.responses(*COMMON, CONFLICT, TOO_LARGE, INVALID, NOT_FOUND, *ADMISSION)})
    async def submit_job(request: Request, data: JSONBody[JobIn], principal: NamedDependency[Principal],
                         idempotency_key: IdempotencyKey = None, team: TeamParam = None) -> Response[JobCreated]:
        spec = to_spec(data, header_key(request) if idempotency_key is not None else None,
                       traces.traceparent(request))
        if isinstance(spec, str):
            raise ApiProblem(INVALID, spec)
        owner = principal.own_team(team)
        if spec.repeat is not None:
            submitted = await ctx.admitted(owner, 1, store.submit_series, owner, spec)
        else:
            submitted = await ctx.submit(owner, spec)
        return Response(JobCreated(JobId(submitted.job_id), submitted.run_at, submitted.created,
                                   series_id_out(submitted.series_id)),
                        status_code=201 if submitted.created else 200)

    @post("/v1/jobs/batch", operation_id="submitBatch", status_code=200, security=SECURITY, tags=["jobs"],
          request_max_body_size=settings.api_max_batch_body_bytes, summary="Submit many jobs",
          description=f"Up to {settings.api_max_batch:,} jobs in one request. Each item is validated: valid "
                      "items are committed together, invalid ones are reported (error) and written nowhere, "
                      "including an item of the wrong shape or types (its decoding error, located at "
                      "`$.jobs[i]`). An item with `repeat` makes a series and its first run, as POST "
                      "/v1/jobs does, in the same transaction as the other items. The batch's valid items "
                      "count against the team's submission rate and pending ceiling all together: over "
                      "either, 429 and nothing is written (over the rate: Retry-After).",
          responses=problems.responses(*COMMON, TOO_LARGE, INVALID, NOT_FOUND, *ADMISSION))
    async def submit_batch(request: Request, data: JSONBody[BatchBody], principal: NamedDependency[Principal],
                           team: TeamParam = None) -> BatchOut:
        owner = principal.own_team(team)
        body = data.raw
        traceparent = traces.traceparent(request)
        if len(body) > BATCH_INLINE_BYTES:
            parsed = await anyio.to_thread.run_sync(parse_batch, body, settings.api_max_batch, traceparent)
        else:
            parsed = parse_batch(body, settings.api_max_batch, traceparent)
        del body, data
        send = [i for i, p in enumerate(parsed) if not isinstance(p, str)]
        # Admitted all together or none (429: nothing written).
        results = await ctx.admitted(owner, len(send), store.submit_many, owner,
                                     [parsed[i] for i in send]) if send else []
        items: list[BatchItemOut | None] = [None] * len(parsed)
        for i, p in enumerate(parsed):
            if isinstance(p, str):
                items[i] = BatchItemOut(i, None, None, False, p)
        for r in results:
            i = send[r.idx]
            items[i] = BatchItemOut(i, JobId(r.job_id) if r.job_id is not None else None, r.run_at, r.created,
                                    r.error, series_id_out(r.series_id))
        created = sum(1 for it in items if it.created)
        rejected = sum(1 for it in items if it.error is not None)
        return BatchOut(created=created, existing=len(items) - created - rejected, rejected=rejected,
                        items=items)

    @get("/v1/jobs/{job_id:int}", operation_id="getJob", security=SECURITY, tags=["jobs"], summary="A job's status",
         description="Finished jobs are kept for their team's retention (retention_s, else the server's "
                     "job_retention_s) after they finish, then removed: a removed job answers 404 with "
                     "`expired` true.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def job_status(principal: NamedDependency[Principal], job_id: JobIdParam, team: TeamParam = None) -> JobOut:
        scope = principal.scope(team)
        status = await ctx.db(store.status, job_id, scope)
        if status is None:
            raise await no_job(job_id, scope)
        return job_out(status)

    @delete("/v1/jobs/{job_id:int}", operation_id="cancelJob", status_code=200, security=SECURITY, tags=["jobs"],
            summary="Cancel a job that has not started",
            description="A waiting job is cancelled (200). A job claimed by a worker that has not reported its "
                        "start may already be running there, so its cancel is requested (202, state `claimed`): "
                        "it is cancelled if the worker gives it back or its claim expires without a start; if "
                        "the worker reports the start, the job runs on and ends as it ends (succeeded, failed), "
                        "never `cancelled`. A running, finished or already cancelled job answers 409 with its "
                        "state, unchanged.",
            responses={202: ResponseSpec(CancelledOut, description="the cancel is requested of the worker that "
                                                                   "holds the job"),
                       **problems.responses(*COMMON, NOT_FOUND, NOT_CANCELLABLE, INVALID)})
    async def cancel_job(principal: NamedDependency[Principal], job_id: JobIdParam,
                         team: TeamParam = None) -> Response[CancelledOut]:
        outcome = await ctx.db(store.cancel, job_id, principal.scope(team))
        if outcome.ok:
            return Response(CancelledOut(JobId(job_id), outcome.state),
                            status_code=200 if outcome.state == "cancelled" else 202)
        if outcome.state is None:
            raise await no_job(job_id, principal.scope(team))
        raise ApiProblem(NOT_CANCELLABLE, outcome.reason or f"job is {outcome.state}", job_id=str(job_id),
                         state=outcome.state)

    @get("/v1/jobs", operation_id="listJobs", security=SECURITY, tags=["jobs"], summary="A team's jobs, newest first",
         description="Keyset-paginated: pass next_cursor as ?cursor= for the next (older) page. A page reads "
                     "a bounded number of jobs, so with narrow filters it may be short (even empty) while "
                     "next_cursor still points further back; next_cursor null: no older jobs.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID),
         exception_handlers=problems.parameters(names={"job_state": "state"}, allowed={"state": STATES}))
    async def list_jobs(
        principal: NamedDependency[Principal],
        job_state: Annotated[State | None, QueryParameter(name="state", required=False)] = None,
        name: Annotated[str | None, QueryParameter(required=False, max_length=200)] = None,
        due_before: Annotated[str | None, QueryParameter(required=False, schema_extra=TIME_SCHEMA,
                                                         description="due time < this")] = None,
        due_after: Annotated[str | None, QueryParameter(required=False, schema_extra=TIME_SCHEMA,
                                                        description="due time >= this")] = None,
        cursor: Annotated[str | None, QueryParameter(required=False, pattern=r"^[0-9]{1,19}$")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
        team: TeamParam = None,
    ) -> JobPageOut:
        before_time, after_time = query_time("due_before", due_before), query_time("due_after", due_after)
        before = int(cursor) if cursor is not None else None
        if before is not None and before >= 2**63:
            raise ApiProblem(INVALID, "cursor is not one this API returned")
        page = await ctx.db(store.list_jobs, principal.own_team(team), state=job_state, name=name,
                            due_before=before_time, due_after=after_time, before_id=before, limit=limit)
        return JobPageOut([from_record(JobSummaryOut, j, job_id=JobId(j.job_id)) for j in page.jobs],
                          str(page.next_cursor) if page.next_cursor is not None else None)

    return [submit_job, submit_batch, job_status, cancel_job, list_jobs]
