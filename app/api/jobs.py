"""Job routes: submit one, submit a batch, read status, cancel, list.

Handlers parse types and enforce the limits that only HTTP has (body size,
batch length); what a job may be is decided by the procedures, once, in SQL.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import HeaderParameter, PathParameter, QueryParameter

from app.api import problems
from app.api.auth import Principal
from app.api.context import Context
from app.api.problems import (COMMON, CONFLICT, INVALID, NOT_CANCELLABLE, NOT_FOUND, TOO_LARGE, ApiProblem)
from app.api.schemas import (BatchIn, BatchItemOut, BatchOut, CancelledOut, JobCreated, JobIn, JobOut,
                             JobPageOut, JobSummaryOut, Repeat, State)
from app.store import repeat as repeats
from app.store import records
from app.store.records import JobSpec, JobStatus

SECURITY = [{"bearer": []}]
JOB_DECODER = msgspec.json.Decoder(JobIn)
BATCH_DECODER = msgspec.json.Decoder(BatchIn)

IdempotencyKey = Annotated[str | None, HeaderParameter(
    name="Idempotency-Key", required=False,
    description="the same key from the same team within 24 h returns the first job (200) and creates nothing")]
TeamParam = Annotated[str | None, QueryParameter(
    required=False,
    description="admin token: the team to act for; a team token may only name itself")]
JobIdParam = Annotated[int, PathParameter(ge=-(2**63), le=2**63 - 1, description="the job id")]

def to_repeat(repeat: Repeat | None) -> records.Repeat | None:
    return None if repeat is None else records.Repeat(repeat.every_s, repeat.cron, repeat.timezone)


def check_repeat(repeat: Repeat | None) -> str | None:
    """Why the repeat fields are invalid (cron through APScheduler, the zone
    through zoneinfo); None if valid or absent."""
    return repeats.problem(to_repeat(repeat))


def to_spec(job: JobIn, key: str | None) -> JobSpec:
    payload = {} if job.payload is msgspec.UNSET else bytes(job.payload)    # JSON text, passed through
    return JobSpec(name=job.name, due_at=job.due_at, payload=payload, priority=job.priority,
                   max_attempts=job.max_attempts, flex_s=job.flex_s, strict=job.strict,
                   idempotency_key=key, backoff_base_s=job.backoff_base_s, backoff_cap_s=job.backoff_cap_s,
                   repeat=to_repeat(job.repeat))


def series_id_out(series_id: int | None) -> str | None:
    return str(series_id) if series_id is not None else None


def job_out(s: JobStatus) -> JobOut:
    return JobOut(job_id=str(s.job_id), team=s.team, name=s.name, state=s.state, priority=s.priority,
                  due_at=s.due_at, run_at=s.run_at, strict=s.strict, flex_s=s.flex_s, attempts=s.attempts,
                  max_attempts=s.max_attempts, claimed_by=s.claimed_by, claim_expires_at=s.claim_expires_at,
                  lateness_s=s.lateness.total_seconds() if s.lateness is not None else None,
                  last_error=s.last_error, result=s.result, idempotency_key=s.idempotency_key,
                  created_at=s.created_at, started_at=s.started_at, finished_at=s.finished_at,
                  series_id=series_id_out(s.series_id),
                  repeat=Repeat(s.every_s, s.cron, s.timezone) if s.series_id is not None else None)


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store, settings = ctx.store, ctx.settings

    @post("/v1/jobs", operation_id="submitJob", status_code=201, security=SECURITY, tags=["jobs"],
          request_max_body_size=settings.api_max_body_bytes, summary="Submit a job",
          description="Returns the job id and its assigned run time. With an Idempotency-Key already used "
                      "by this team within 24 h for the same request: the first job, status 200. With "
                      "`repeat`: a series is stored with its first run, an ordinary job whose id, run time "
                      "and `series_id` are returned (continuing the chain, run after run, is not built "
                      "yet); the key then names the series' first run.",
          responses={200: ResponseSpec(JobCreated, description="the job the Idempotency-Key named"),
                     **problems.responses(*COMMON, CONFLICT, TOO_LARGE, INVALID, NOT_FOUND)})
    async def submit_job(request: Request, principal: NamedDependency[Principal], idempotency_key: IdempotencyKey = None,
                         team: TeamParam = None) -> Response[JobCreated]:
        job = problems.decode(JOB_DECODER, await request.body())
        if reason := check_repeat(job.repeat):
            raise ApiProblem(INVALID, reason)
        owner, spec = principal.own_team(team), to_spec(job, idempotency_key)
        if spec.repeat is not None:
            submitted = await ctx.db(store.submit_series, owner, spec)
        else:
            submitted = await ctx.submit(owner, spec)
        return Response(JobCreated(str(submitted.job_id), submitted.run_at, submitted.created,
                                   series_id_out(submitted.series_id)),
                        status_code=201 if submitted.created else 200)

    @post("/v1/jobs/batch", operation_id="submitBatch", status_code=200, security=SECURITY, tags=["jobs"],
          request_max_body_size=settings.api_max_batch_body_bytes, summary="Submit many jobs",
          description=f"Up to {settings.api_max_batch:,} jobs in one request. Each item is validated: valid "
                      "items are committed together, invalid ones are reported (error) and written nowhere. "
                      "An item with `repeat` makes a series and its first run, as POST /v1/jobs does, in "
                      "the same transaction as the other items.",
          responses=problems.responses(*COMMON, TOO_LARGE, INVALID, NOT_FOUND))
    async def submit_batch(request: Request, principal: NamedDependency[Principal], team: TeamParam = None) -> BatchOut:
        batch = problems.decode(BATCH_DECODER, await request.body())
        if len(batch.jobs) > settings.api_max_batch:
            raise ApiProblem(TOO_LARGE, f"a batch holds at most {settings.api_max_batch:,} jobs, this one "
                                        f"{len(batch.jobs):,}: split it")
        owner = principal.own_team(team)
        refused = {i: r for i, j in enumerate(batch.jobs) if (r := check_repeat(j.repeat))}
        send = [i for i in range(len(batch.jobs)) if i not in refused]
        results = await ctx.db(store.submit_many, owner, [to_spec(batch.jobs[i], batch.jobs[i].idempotency_key)
                                                          for i in send]) if send else []
        items: list[BatchItemOut | None] = [None] * len(batch.jobs)
        for i, reason in refused.items():
            items[i] = BatchItemOut(i, None, None, False, reason)
        for r in results:
            i = send[r.idx]
            items[i] = BatchItemOut(i, str(r.job_id) if r.job_id is not None else None, r.run_at, r.created,
                                    r.error, series_id_out(r.series_id))
        created = sum(1 for it in items if it.created)
        rejected = sum(1 for it in items if it.error is not None)
        return BatchOut(created=created, existing=len(items) - created - rejected, rejected=rejected,
                        items=items)

    @get("/v1/jobs/{job_id:int}", operation_id="getJob", security=SECURITY, tags=["jobs"], summary="A job's status",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def job_status(principal: NamedDependency[Principal], job_id: JobIdParam, team: TeamParam = None) -> JobOut:
        status = await ctx.db(store.status, job_id, principal.scope(team))
        if status is None:
            raise ApiProblem(NOT_FOUND, f"no job {job_id}")
        return job_out(status)

    @delete("/v1/jobs/{job_id:int}", operation_id="cancelJob", status_code=200, security=SECURITY, tags=["jobs"],
            summary="Cancel a job that has not started",
            description="A started, finished or already cancelled job answers 409 with its state, unchanged.",
            responses=problems.responses(*COMMON, NOT_FOUND, NOT_CANCELLABLE, INVALID))
    async def cancel_job(principal: NamedDependency[Principal], job_id: JobIdParam, team: TeamParam = None) -> CancelledOut:
        outcome = await ctx.db(store.cancel, job_id, principal.scope(team))
        if outcome.ok:
            return CancelledOut(str(job_id), "cancelled")
        if outcome.state is None:
            raise ApiProblem(NOT_FOUND, f"no job {job_id}")
        raise ApiProblem(NOT_CANCELLABLE, outcome.reason or f"job is {outcome.state}", job_id=str(job_id),
                         state=outcome.state)

    @get("/v1/jobs", operation_id="listJobs", security=SECURITY, tags=["jobs"], summary="A team's jobs, newest first",
         description="Keyset-paginated: pass next_cursor as ?cursor= for the next (older) page. A page reads "
                     "a bounded number of jobs, so with narrow filters it may be short (even empty) while "
                     "next_cursor still points further back; next_cursor null: no older jobs.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def list_jobs(
        principal: NamedDependency[Principal],
        job_state: Annotated[State | None, QueryParameter(name="state", required=False)] = None,
        name: Annotated[str | None, QueryParameter(required=False, max_length=200)] = None,
        due_before: Annotated[dt.datetime | None, QueryParameter(required=False, description="due time < this")] = None,
        due_after: Annotated[dt.datetime | None, QueryParameter(required=False, description="due time >= this")] = None,
        cursor: Annotated[str | None, QueryParameter(required=False, pattern=r"^[0-9]{1,19}$")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
        team: TeamParam = None,
    ) -> JobPageOut:
        for label, value in (("due_before", due_before), ("due_after", due_after)):
            if value is not None and value.tzinfo is None:
                raise ApiProblem(INVALID, f"{label} must be an RFC 3339 time with a UTC offset")
        before = int(cursor) if cursor is not None else None
        if before is not None and before >= 2**63:
            raise ApiProblem(INVALID, "cursor is not one this API returned")
        page = await ctx.db(store.list_jobs, principal.own_team(team), state=job_state, name=name,
                            due_before=due_before, due_after=due_after, before_id=before, limit=limit)
        return JobPageOut([JobSummaryOut(str(j.job_id), j.team, j.name, j.state, j.priority, j.due_at, j.run_at,
                                         j.attempts, j.max_attempts, j.created_at) for j in page.jobs],
                          str(page.next_cursor) if page.next_cursor is not None else None)

    return [submit_job, submit_batch, job_status, cancel_job, list_jobs]
