"""Dead jobs: requeue or discard one, or every dead job of a team and
name; and the team's feed of terminal failures.

    POST /v1/jobs/{id}/requeue?max_attempts=    a dead job due again now (a new attempt budget)
    POST /v1/jobs/{id}/discard                  a dead job set aside for good (state discarded)
    POST /v1/dead/requeue, /v1/dead/discard     every dead job of a name ({"name": ...})
    GET  /v1/teams/{name}/events?after=&limit=  the team's events, oldest first (name: the team or `me`)

What may be requeued is decided by the procedures (sql/functions/dead.sql);
another team's job is "no such job" (404), as an unknown one. A requeue
puts jobs back as a submission writes them, so it is admitted as one
(app/minutehand/web/admission.py): the jobs it would put back count against
the team's submission rate and pending ceiling, all or none (429, nothing
requeued). The feed's cursor is opaque to clients (app/minutehand/rules.py
makes and reads it).
"""
from __future__ import annotations

import functools
from typing import Annotated

from litestar import get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter

from minutehand.api import problems
from minutehand.api.jobs import JobIdParam, TeamParam
from minutehand.api.problems import ADMISSION, COMMON
from minutehand.protocol.api import (BUDGET_DOC, INT32_MAX, INT32_MIN, DeadDiscardedOut, DeadDiscardIn,
                                    DeadRequeuedOut, DeadRequeueIn, EventOut, EventPageOut, SettledOut)
from minutehand.protocol import JobId
from minutehand.rules import EVENTS_START, NOT_AN_EVENTS_CURSOR, decode_events_cursor, encode_events_cursor
from minutehand.store.dead import DeadSettled, JobEvent
from minutehand.store.records import Outcome
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import INVALID, NOT_DEAD, NOT_FOUND, TOO_LARGE, ApiProblem

SECURITY = [{"bearer": []}]
TAGS = ["dead jobs"]
EVENTS_PAGE_MAX = 1000
SETTLE_BODY_BYTES = 4096


def event_out(e: JobEvent) -> EventOut:
    return EventOut(str(e.id), e.kind, JobId(e.job_id), e.name, e.attempts, e.max_attempts, e.error, e.at)


def settled(job_id: int, outcome: Outcome) -> SettledOut:
    """The answer to a requeue or discard, or its refusal: 404 (no such job
    of this team) or 409 with the job's state, nothing written."""
    if outcome.ok:
        return SettledOut(JobId(job_id), outcome.state)
    if outcome.state is None:
        raise ApiProblem(NOT_FOUND, f"no job {job_id}")
    raise ApiProblem(NOT_DEAD, outcome.reason or f"job is {outcome.state}", job_id=str(job_id),
                     state=outcome.state)


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store
    one_job = problems.responses(*COMMON, NOT_FOUND, NOT_DEAD, INVALID)
    admitted = ("It counts against the team's submission rate and pending ceiling as a submission does: "
                "over either, 429 and nothing is requeued (over the rate: Retry-After).")

    @post("/v1/jobs/{job_id:int}/requeue", operation_id="requeueJob", status_code=200, security=SECURITY,
          tags=TAGS, summary="Run a dead job again",
          description="The job goes back on the timing wheel, due now, its attempts counted from 0 against "
                      "max_attempts (1 to 100; omitted: the job's own). A job that is not dead, including one "
                      "requeued and waiting again, answers 409 with its state, unchanged. " + admitted,
          responses=problems.responses(*COMMON, NOT_FOUND, NOT_DEAD, INVALID, *ADMISSION))
    async def requeue_job(
        principal: NamedDependency[Principal], job_id: JobIdParam, team: TeamParam = None,
        # The range is the procedure's to refuse (422), as the body's; the
        # schema says it, Litestar only keeps the value within 32 bits.
        max_attempts: Annotated[int | None, QueryParameter(
            required=False, ge=INT32_MIN, le=INT32_MAX, schema_extra={"minimum": 1, "maximum": 100},
            description=BUDGET_DOC)] = None,
    ) -> SettledOut:
        owner = await ctx.db(store.team_of, job_id, principal.scope(team))
        if owner is None:
            raise ApiProblem(NOT_FOUND, f"no job {job_id}")
        return settled(job_id, await ctx.admitted(owner, 1, store.requeue, job_id, owner, max_attempts))

    @post("/v1/jobs/{job_id:int}/discard", operation_id="discardJob", status_code=200, security=SECURITY,
          tags=TAGS, summary="Set a dead job aside for good",
          description="Its state becomes `discarded` (kept, with its last error; never requeued). A job that "
                      "is not dead answers 409 with its state, unchanged.",
          responses=one_job)
    async def discard_job(principal: NamedDependency[Principal], job_id: JobIdParam,
                          team: TeamParam = None) -> SettledOut:
        return settled(job_id, await ctx.db(store.discard, job_id, principal.scope(team)))

    @post("/v1/dead/requeue", operation_id="requeueDead", status_code=200, security=SECURITY, tags=TAGS,
          request_max_body_size=SETTLE_BODY_BYTES, summary="Run every dead job of a name again",
          description="Each dead job of the team with this name, as POST /v1/jobs/{id}/requeue does, up to "
                      "`limit` per call; `more` true: call again for the rest. The jobs one call would put "
                      "back are admitted together, as a batch is: " + admitted + " More than the team's "
                      "burst at once: 413 (a smaller limit).",
          responses=problems.responses(*COMMON, NOT_FOUND, INVALID, TOO_LARGE, *ADMISSION))
    async def requeue_dead(data: JSONBody[DeadRequeueIn], principal: NamedDependency[Principal],
                           team: TeamParam = None) -> DeadRequeuedOut:
        owner = principal.own_team(team)
        budget = int(data.max_attempts) if data.max_attempts is not None else None

        def requeue() -> DeadSettled:
            limit = int(data.limit)
            if ctx.admission.limited(owner):
                # Admitted for the jobs there are (at most the limit), and requeued no more than those.
                limit = store.dead_count(owner, data.name, max_attempts=budget, limit=limit)
                if limit == 0:
                    return DeadSettled(0, False)
            return ctx.admission.admitted(owner, limit, functools.partial(
                store.requeue_dead, owner, data.name, max_attempts=budget, limit=limit))

        done = await ctx.db(requeue)
        return DeadRequeuedOut(done.count, done.more)

    @post("/v1/dead/discard", operation_id="discardDead", status_code=200, security=SECURITY, tags=TAGS,
          request_max_body_size=SETTLE_BODY_BYTES, summary="Set every dead job of a name aside",
          description="Each dead job of the team with this name, as POST /v1/jobs/{id}/discard does, up to "
                      "`limit` per call; `more` true: call again for the rest.",
          responses=problems.responses(*COMMON, NOT_FOUND, INVALID, TOO_LARGE))
    async def discard_dead(data: JSONBody[DeadDiscardIn], principal: NamedDependency[Principal],
                           team: TeamParam = None) -> DeadDiscardedOut:
        done = await ctx.db(store.discard_dead, principal.own_team(team), data.name, limit=int(data.limit))
        return DeadDiscardedOut(done.count, done.more)

    @get("/v1/teams/{name:str}/events", operation_id="teamEvents", security=SECURITY, tags=TAGS,
         summary="The team's terminal failures, oldest first",
         description="Every job of the team that became dead (failed on its last attempt, or its last claim "
                     "expired), in the order they were committed, kept 7 days. Pass next_cursor as ?after= "
                     "to read on; with nothing new the same cursor comes back (poll with it). An event shows "
                     "once no transaction older than it is still running (usually at once), so none can "
                     "appear behind a cursor already handed out. `name`: the team, or `me`.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID), exception_handlers=problems.parameters())
    async def team_events(
        principal: NamedDependency[Principal], name: FromPath[str],
        after: Annotated[str | None, QueryParameter(required=False, max_length=100,
                                                    description="the next_cursor of the previous page")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=EVENTS_PAGE_MAX)] = 100,
    ) -> EventPageOut:
        team = principal.path_team(name)
        position = decode_events_cursor(after) if after is not None else EVENTS_START
        if position is None:
            raise ApiProblem(INVALID, NOT_AN_EVENTS_CURSOR)
        if principal.is_admin and not await ctx.db(store.team_exists, team):
            raise ApiProblem(NOT_FOUND, f"no such team {team!r}")
        events = await ctx.db(store.events, team, after=position, limit=limit)
        last = (events[-1].xid, events[-1].id) if events else position
        return EventPageOut([event_out(e) for e in events], encode_events_cursor(*last))

    return [requeue_job, discard_job, requeue_dead, discard_dead, team_events]
