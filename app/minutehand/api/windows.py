"""Default flex windows: what a job submitted without flex_s (and not
strict) gets. Per job name, and for cron series on round minutes (the
minute field lists only 0, 15, 30, 45, or steps of 15 or 30 from 0); a
team's own rule wins over the operator's, which applies to every team.

    /v1/teams/{name}/windows                        a team's rules (the team itself, or the admin)
    /v1/teams/{name}/windows/round-cron             its round-cron default
    /v1/teams/{name}/windows/names/{job_name}       its default for a job name
    /v1/windows, /v1/windows/round-cron, /v1/windows/names/{job_name}   the operator's (admin only)

A job name may hold '/', so it is the rest of the path (%2F works too).
"""
from __future__ import annotations

import re
from typing import Annotated

from litestar import delete, get, put
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, PathParameter, QueryParameter

from minutehand.api import problems
from minutehand.api.problems import COMMON
from minutehand.protocol.api import WindowIn, WindowOut, WindowPageOut
from minutehand.protocol import JOB_NAME_PATTERN
from minutehand.store.spread import FlexDefault
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import FORBIDDEN, INVALID, NOT_FOUND, ApiProblem

SECURITY = [{"bearer": []}]
PAGE_MAX = 1000
ROUND_CRON = ("cron series whose minute field lists only 0, 15, 30 and 45 (or */15, */30), such as `0 0 * * *`, "
              "`0 * * * *`, `*/15 * * * *`, and no rule for their job name")
APPLIES = ("Applies to jobs submitted from then on (a job keeps the window it got); explicit flex_s (0 "
           "included) and strict win over it.")
_NAME = re.compile(JOB_NAME_PATTERN)
Cursor = Annotated[str | None, QueryParameter(required=False, max_length=200,
                                              description="the next_cursor of the previous page")]
Limit = Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)]
# The rest of the path, checked by _job_name (Litestar's own pattern would see its leading '/').
JobNameParam = Annotated[str, PathParameter(schema_extra={"pattern": JOB_NAME_PATTERN},
                                            description="the job name (it may hold '/')")]


def window_out(w: FlexDefault) -> WindowOut:
    return WindowOut(w.team, w.job_name, w.flex_s, w.updated_at)


def _job_name(path: object) -> str:
    """The job name from the rest of the path ('/' kept), checked before the database."""
    name = str(path).lstrip("/")
    if not _NAME.fullmatch(name):
        raise ApiProblem(INVALID, f"job name {name[:200]!r} must be 1 to 200 characters from letters, digits "
                                  "and _ . : / -")
    return name


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store

    async def put_window(team: str | None, job_name: str | None, data: WindowIn) -> WindowOut:
        return window_out(await ctx.db(store.set_flex_default, team, job_name, int(data.flex_s)))

    async def delete_window(team: str | None, job_name: str | None) -> None:
        if not await ctx.db(store.delete_flex_default, team, job_name):
            what = f"job name {job_name!r}" if job_name is not None else "round-cron series"
            raise ApiProblem(NOT_FOUND, f"no default window for {what}" + (f" in team {team!r}" if team else ""))

    async def page(team: str | None, cursor: str | None, limit: int) -> WindowPageOut:
        rows, next_cursor = await ctx.db(store.flex_defaults, team, after=cursor, limit=limit)
        return WindowPageOut(team, [window_out(w) for w in rows], next_cursor)

    team_responses = problems.responses(*COMMON, NOT_FOUND, INVALID)
    admin_responses = problems.responses(*COMMON, FORBIDDEN, NOT_FOUND, INVALID)

    # ------------------------------------------------------------ a team's
    @get("/v1/teams/{name:str}/windows", operation_id="teamWindows", security=SECURITY, tags=["windows"],
         summary="A team's default flex windows",
         description="The admin names any team; a team's token only its own (its name or `me`). The round-cron "
                     "rule (job_name null) first, then by job name; keyset-paginated (next_cursor as ?cursor=). "
                     "The operator's rules (GET /v1/windows) apply where the team has none.",
         responses=team_responses, exception_handlers=problems.parameters())
    async def team_windows(principal: NamedDependency[Principal], name: FromPath[str], cursor: Cursor = None,
                           limit: Limit = PAGE_MAX) -> WindowPageOut:
        return await page(principal.path_team(name), cursor, limit)

    @put("/v1/teams/{name:str}/windows/round-cron", operation_id="setTeamRoundCronWindow", status_code=200,
         security=SECURITY, tags=["windows"], request_max_body_size=4096,
         summary="Set a team's default flex window for round-minute cron series",
         description=f"For the team's {ROUND_CRON}. {APPLIES}", responses=team_responses)
    async def set_team_round_cron(data: JSONBody[WindowIn], principal: NamedDependency[Principal],
                                  name: FromPath[str]) -> WindowOut:
        return await put_window(principal.path_team(name), None, data)

    @delete("/v1/teams/{name:str}/windows/round-cron", operation_id="deleteTeamRoundCronWindow", status_code=204,
            security=SECURITY, tags=["windows"], summary="Remove a team's round-cron default flex window",
            description="The operator's (if any) applies again. 404 if the team had none.",
            responses=team_responses)
    async def delete_team_round_cron(principal: NamedDependency[Principal], name: FromPath[str]) -> None:
        return await delete_window(principal.path_team(name), None)

    @put("/v1/teams/{name:str}/windows/names/{job_name:path}", operation_id="setTeamNameWindow", status_code=200,
         security=SECURITY, tags=["windows"], request_max_body_size=4096,
         summary="Set a team's default flex window for a job name",
         description=f"Jobs of this name the team submits without flex_s, and its series of this name. {APPLIES}",
         responses=team_responses)
    async def set_team_name(data: JSONBody[WindowIn], principal: NamedDependency[Principal], name: FromPath[str],
                            job_name: JobNameParam) -> WindowOut:
        return await put_window(principal.path_team(name), _job_name(job_name), data)

    @delete("/v1/teams/{name:str}/windows/names/{job_name:path}", operation_id="deleteTeamNameWindow",
            status_code=204, security=SECURITY, tags=["windows"],
            summary="Remove a team's default flex window for a job name",
            description="The operator's (if any) applies again. 404 if the team had none.",
            responses=team_responses)
    async def delete_team_name(principal: NamedDependency[Principal], name: FromPath[str],
                               job_name: JobNameParam) -> None:
        return await delete_window(principal.path_team(name), _job_name(job_name))

    # ------------------------------------------------------------ the operator's
    @get("/v1/windows", operation_id="operatorWindows", security=SECURITY, tags=["windows"],
         opt={"admin_only": True}, summary="The operator's default flex windows (admin)",
         description="Rules for every team (a team's own rule wins). The round-cron rule first, then by job "
                     "name; keyset-paginated.",
         responses=admin_responses, exception_handlers=problems.parameters())
    async def operator_windows(principal: NamedDependency[Principal], cursor: Cursor = None,
                               limit: Limit = PAGE_MAX) -> WindowPageOut:
        principal.require_admin()
        return await page(None, cursor, limit)

    @put("/v1/windows/round-cron", operation_id="setRoundCronWindow", status_code=200, security=SECURITY,
         tags=["windows"], request_max_body_size=4096, opt={"admin_only": True},
         summary="Set the operator's default flex window for round-minute cron series (admin)",
         description=f"For every team's {ROUND_CRON}, unless the team has its own. {APPLIES}",
         responses=admin_responses)
    async def set_round_cron(data: JSONBody[WindowIn], principal: NamedDependency[Principal]) -> WindowOut:
        principal.require_admin()
        return await put_window(None, None, data)

    @delete("/v1/windows/round-cron", operation_id="deleteRoundCronWindow", status_code=204, security=SECURITY,
            tags=["windows"], opt={"admin_only": True},
            summary="Remove the operator's round-cron default flex window (admin)",
            description="404 if there was none.", responses=admin_responses)
    async def delete_round_cron(principal: NamedDependency[Principal]) -> None:
        principal.require_admin()
        return await delete_window(None, None)

    @put("/v1/windows/names/{job_name:path}", operation_id="setNameWindow", status_code=200, security=SECURITY,
         tags=["windows"], request_max_body_size=4096, opt={"admin_only": True},
         summary="Set the operator's default flex window for a job name (admin)",
         description=f"For every team without its own rule for the name. {APPLIES}", responses=admin_responses)
    async def set_name(data: JSONBody[WindowIn], principal: NamedDependency[Principal],
                       job_name: JobNameParam) -> WindowOut:
        principal.require_admin()
        return await put_window(None, _job_name(job_name), data)

    @delete("/v1/windows/names/{job_name:path}", operation_id="deleteNameWindow", status_code=204,
            security=SECURITY, tags=["windows"], opt={"admin_only": True},
            summary="Remove the operator's default flex window for a job name (admin)",
            description="404 if there was none.", responses=admin_responses)
    async def delete_name(principal: NamedDependency[Principal], job_name: JobNameParam) -> None:
        principal.require_admin()
        return await delete_window(None, _job_name(job_name))

    return [team_windows, set_team_round_cron, delete_team_round_cron, set_team_name, delete_team_name,
            operator_windows, set_round_cron, delete_round_cron, set_name, delete_name]
