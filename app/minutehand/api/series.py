"""Series routes: read a repeating job's series (its spec, state, waiting
run, next fire times and newest runs), list a team's series, and pause,
resume, cancel or change one.

What a series may be is decided by the procedures (sql/functions/series.sql);
a new spec is checked here first (app/minutehand/rules.py: its cron
expression parsed with APScheduler, app/minutehand/store/repeat.py, its zone
an IANA name), and the next fire times are computed there too (as the admin
UI shows them), outside any transaction. A series
of another team is "no such series" (404), as an unknown one.
"""
from __future__ import annotations

from typing import Annotated

import anyio.to_thread
import msgspec
from litestar import get, patch, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody, PathParameter, QueryParameter

from minutehand import rules
from minutehand.api import problems
from minutehand.api.jobs import TeamParam, series_id_out
from minutehand.api.problems import COMMON
from minutehand.protocol.api import (SeriesChangeIn, SeriesControlOut, SeriesOut, SeriesPageOut, SeriesRepeat,
                                    SeriesRunOut, SeriesSummaryOut, WaitingRunOut, text_problem)
from minutehand.protocol import JobId
from minutehand.rules import NEXT_FIRE_TIMES, next_fire_times
from minutehand.store.records import Repeat
from minutehand.store.series import SeriesControl, SeriesDetail
from minutehand.store.store import Store
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import CONFLICT, INVALID, NOT_FOUND, ApiProblem

SECURITY = [{"bearer": []}]
TAGS = ["series"]
CHANGE_BODY_BYTES = 4096
SeriesIdParam = Annotated[int, PathParameter(ge=-(2**63), le=2**63 - 1, description="the series id")]


def series_out(s: SeriesDetail, fire_times: list) -> SeriesOut:
    waiting = (WaitingRunOut(JobId(s.last_job_id), s.last_job_state, s.last_due_at, s.last_job_run_at)
               if s.last_job_state is not None else None)
    return SeriesOut(
        series_id=str(s.series_id), team=s.team, name=s.name, payload=s.payload, priority=s.priority,
        max_attempts=s.max_attempts, flex_s=s.flex_s, strict=s.strict, backoff_base_s=s.backoff_base_s,
        backoff_cap_s=s.backoff_cap_s, repeat=_repeat_out(s.repeat), misfire=s.misfire, state=s.state,
        first_due_at=s.first_due_at, last_due_at=s.last_due_at, chain_after=s.chain_after, paused_at=s.paused_at,
        cancelled_at=s.cancelled_at, created_at=s.created_at, updated_at=s.updated_at, waiting_run=waiting,
        next_fire_times=fire_times,
        last_runs=[SeriesRunOut(JobId(r.job_id), r.due_at, r.agreed_at, r.state, r.attempts, r.started_at,
                                r.finished_at, r.last_error) for r in s.runs])


def _repeat_out(r: Repeat) -> SeriesRepeat:
    return SeriesRepeat(r.every_s, r.cron, r.timezone)


def to_repeat(spec: SeriesRepeat) -> Repeat:
    return Repeat(every_s=int(spec.every_s) if spec.every_s is not None else None, cron=spec.cron,
                  timezone=spec.timezone)


def repeat_problem(spec: SeriesRepeat) -> str | None:
    """Why the spec is refused (rules.repeat_problem); None if valid."""
    return (text_problem("repeat.cron", spec.cron) or text_problem("repeat.timezone", spec.timezone)
            or rules.repeat_problem(to_repeat(spec)))


def control_out(c: SeriesControl) -> SeriesControlOut:
    return SeriesControlOut(series_id_out(c.series_id), c.state, c.changed,
                            JobId(c.cancelled_run) if c.cancelled_run is not None else None)


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store

    @get("/v1/series/{series_id:int}", operation_id="getSeries", security=SECURITY, tags=TAGS,
         summary="A series: spec, state, waiting run, next fire times, newest runs",
         description=f"next_fire_times: the next {NEXT_FIRE_TIMES} fire times after now (cron in its zone, DST "
                     "included; every_s counted from the first due time), none beyond 366 days; last_runs: "
                     f"the {Store.SERIES_RUNS} newest runs, newest first, with their outcomes.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def get_series(principal: NamedDependency[Principal], series_id: SeriesIdParam,
                         team: TeamParam = None) -> SeriesOut:
        detail = await ctx.db(store.series, principal.own_team(team), series_id)
        times = await anyio.to_thread.run_sync(next_fire_times, detail)
        return series_out(detail, times)

    @get("/v1/series", operation_id="listSeries", security=SECURITY, tags=TAGS,
         summary="A team's series, newest first",
         description="Keyset-paginated: pass next_cursor as ?cursor= for the next (older) page; next_cursor "
                     "null: no more series.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID), exception_handlers=problems.parameters())
    async def list_series(
        principal: NamedDependency[Principal],
        cursor: Annotated[str | None, QueryParameter(required=False, pattern=r"^-?[0-9]{1,19}$",
                                                     description="the next_cursor of the previous page")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=Store.SERIES_PAGE_MAX)] = 100,
        team: TeamParam = None,
    ) -> SeriesPageOut:
        after = int(cursor) if cursor is not None else None
        if after is not None and not -(2**63) <= after < 2**63:
            raise ApiProblem(INVALID, "cursor is not one this API returned")
        page = await ctx.db(store.list_series, principal.own_team(team), after=after, limit=limit)
        return SeriesPageOut([SeriesSummaryOut(str(s.series_id), s.name, _repeat_out(Repeat(s.every_s, s.cron,
                                                                                           s.timezone)),
                                               s.misfire, s.state, s.first_due_at, s.last_due_at,
                                               JobId(s.last_job_id), s.created_at) for s in page.series],
                             str(page.next_cursor) if page.next_cursor is not None else None)

    @post("/v1/series/{series_id:int}/pause", operation_id="pauseSeries", status_code=200, security=SECURITY,
          tags=TAGS, summary="Pause a series",
          description="No further run is created until it is resumed; its waiting run is cancelled if it has "
                      "not started (a started run finishes). A paused or cancelled series is left as it is "
                      "(changed false).",
          responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def pause_series(principal: NamedDependency[Principal], series_id: SeriesIdParam,
                           team: TeamParam = None) -> SeriesControlOut:
        return control_out(await ctx.db(store.pause_series, principal.own_team(team), series_id))

    @post("/v1/series/{series_id:int}/resume", operation_id="resumeSeries", status_code=200, security=SECURITY,
          tags=TAGS, summary="Resume a paused series",
          description="Its next run is created at its first fire time after now (the fire times of the pause "
                      "are not caught up). An active series is left as it is; a cancelled one is 409.",
          responses=problems.responses(*COMMON, NOT_FOUND, CONFLICT, INVALID))
    async def resume_series(principal: NamedDependency[Principal], series_id: SeriesIdParam,
                            team: TeamParam = None) -> SeriesControlOut:
        return control_out(await ctx.db(store.resume_series, principal.own_team(team), series_id))

    @post("/v1/series/{series_id:int}/cancel", operation_id="cancelSeries", status_code=200, security=SECURITY,
          tags=TAGS, summary="Cancel a series",
          description="No further run is created; its waiting run is cancelled if it has not started (a "
                      "started run finishes). Cancelling it again changes nothing (changed false).",
          responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def cancel_series(principal: NamedDependency[Principal], series_id: SeriesIdParam,
                            team: TeamParam = None) -> SeriesControlOut:
        return control_out(await ctx.db(store.cancel_series, principal.own_team(team), series_id))

    @patch("/v1/series/{series_id:int}", operation_id="changeSeries", status_code=200, security=SECURITY,
           tags=TAGS, request_max_body_size=CHANGE_BODY_BYTES, summary="Change a series' repeat spec",
           description="From the next run: the waiting run is cancelled if it has not started (a started run "
                       "finishes), and the next run is created at the new spec's first fire time after now "
                       "(a paused series keeps the new spec for its resume). A cron expression must fire "
                       "within 366 days. A cancelled series is 409.",
           responses=problems.responses(*COMMON, NOT_FOUND, CONFLICT, INVALID))
    async def change_series(data: JSONBody[SeriesChangeIn], principal: NamedDependency[Principal],
                            series_id: SeriesIdParam, team: TeamParam = None) -> SeriesControlOut:
        if reason := repeat_problem(data.repeat):
            raise ApiProblem(INVALID, reason)
        misfire = None if data.misfire is msgspec.UNSET else data.misfire
        return control_out(await ctx.db(store.change_series, principal.own_team(team), series_id,
                                        to_repeat(data.repeat), misfire))

    return [get_series, list_series, pause_series, resume_series, cancel_series, change_series]
