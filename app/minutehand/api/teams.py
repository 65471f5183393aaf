"""Team routes: create a team, set its quota and weight, list teams and
rotate a team's token (admin); a team's settings and statistics, and the
fleet's (admin)."""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import get, patch, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter

from minutehand.api import problems
from minutehand.api.problems import COMMON
from minutehand.protocol.api import (BucketOut, CountsOut, DistributionOut, FleetStatsOut, FleetTeamOut, Integer,
                                    NameStatsOut, OtherStatsOut, StatsOut, TeamIn, TeamOut, TeamPageOut,
                                    TeamSettingsIn, TeamTokenOut, text_problem)
from minutehand.rules import TEAM_NAME_PATTERN, retention_problem
from minutehand.store.stats import STATS_BOUNDS_S, Tally, quantile_bound
from minutehand.store.store import Store
from minutehand.store.teams import KEEP, TeamSettings
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import CONFLICT, FORBIDDEN, INVALID, NOT_FOUND, ApiProblem

SECURITY = [{"bearer": []}]
TEAMS_PAGE_MAX = 1000
APPLIED = "The dispatcher applies a new quota or weight within a few seconds (it rereads teams periodically)."
ADMITTED = ("A new admission limit applies at once on the server process that set it, within the "
            "admission_cache_s setting on the others.")
STATS_WINDOW_S = 86400
WindowParam = Annotated[int, QueryParameter(
    ge=60, le=Store.STATS_MAX_WINDOW_S,
    description="seconds back from now (60 to 30 days); the window starts at the minute (within the last hour "
                "or two) or the hour (further back) at or before now - window_s")]
STATS_DESCRIPTION = (
    "Counted as the events happen (never a scan of jobs), per minute, folded into hours after an hour or "
    "two, kept 35 days. submitted: jobs created; started: jobs started for the first time; succeeded, "
    "dead, cancelled: jobs that ended so; failed: failures that were retried. lateness: of first starts, "
    "start - agreed run time; run_time: of finished jobs, finish - first start; as histograms over fixed "
    "buckets, p50/p99 given as the upper bound of their bucket. running: claimed or running now.")


def _histogram(hist: tuple[int, ...]) -> DistributionOut:
    bounds = [*STATS_BOUNDS_S, None]
    return DistributionOut(sum(hist), quantile_bound(hist, 0.5), quantile_bound(hist, 0.99),
                           [BucketOut(b, n) for b, n in zip(bounds, hist)])


def counts_out(t: Tally) -> CountsOut:
    return CountsOut(t.submitted, t.started, t.succeeded, t.failed, t.dead, t.cancelled,
                     _histogram(t.lateness_hist), _histogram(t.runtime_hist))


def team_out(team: TeamSettings) -> TeamOut:
    return TeamOut(team.name, team.quota, team.weight, team.created_at, team.submit_rate, team.submit_burst,
                   team.max_pending, team.retention_s)


def _given(value: Any) -> Any:
    """A body field for update_team: omitted keeps (KEEP), null clears (None)."""
    if value is msgspec.UNSET:
        return KEEP
    return int(value) if isinstance(value, Integer) else value


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store

    @post("/v1/teams", operation_id="createTeam", status_code=201, security=SECURITY, tags=["teams"], request_max_body_size=4096,
          opt={"admin_only": True},                  # a team's token is refused before its body is read
          summary="Create a team (admin)",
          description="Returns the team's token, shown this once. quota and weight omitted: the server's "
                      "default_team_quota and default_team_weight settings.",
          responses=problems.responses(*COMMON, FORBIDDEN, CONFLICT, INVALID))
    async def create_team(data: JSONBody[TeamIn], principal: NamedDependency[Principal]) -> TeamTokenOut:
        principal.require_admin()
        team = data
        if reason := text_problem("name", team.name):
            raise ApiProblem(INVALID, reason)
        retention_s = None if team.retention_s in (None, msgspec.UNSET) else int(team.retention_s)
        if reason := retention_problem(retention_s):
            raise ApiProblem(INVALID, reason)
        settings = ctx.settings
        quota = settings.default_team_quota if team.quota is msgspec.UNSET else int(team.quota)
        weight = settings.default_team_weight if team.weight is msgspec.UNSET else int(team.weight)
        # Omitted: the defaults (a burst omitted: one second's worth); null: none.
        rate = settings.default_team_submit_rate or None if team.submit_rate is msgspec.UNSET else team.submit_rate
        if team.submit_burst is not msgspec.UNSET:
            burst = _given(team.submit_burst)
        elif team.submit_rate is msgspec.UNSET:
            burst = settings.default_team_submit_burst or None
        else:
            burst = None
        max_pending = None if team.max_pending is msgspec.UNSET else _given(team.max_pending)
        token = await ctx.db(store.create_team, team.name, quota=quota, weight=weight, submit_rate=rate,
                             submit_burst=burst, max_pending=max_pending, retention_s=retention_s)
        return TeamTokenOut(team.name, token)

    @post("/v1/teams/{name:str}/token", operation_id="rotateToken", status_code=200, security=SECURITY, tags=["teams"],
          summary="Rotate a team's token (admin)",
          description="The old token stops working (in other server processes within api_token_cache_s).",
          responses=problems.responses(*COMMON, FORBIDDEN, NOT_FOUND))
    async def rotate_token(principal: NamedDependency[Principal], name: FromPath[str]) -> TeamTokenOut:
        principal.require_admin()
        token = await ctx.db(store.rotate_token, name)
        ctx.tokens.forget_team(name)
        return TeamTokenOut(name, token)

    @get("/v1/teams/{name:str}/stats", operation_id="teamStats", security=SECURITY, tags=["teams"],
         summary="A team's statistics, by job name",
         description="`me` names the caller's own team. " + STATS_DESCRIPTION + " The "
                     f"{Store.STATS_NAMES} job names of most volume are listed one by one, the rest added up "
                     "in `other`.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID), exception_handlers=problems.parameters())
    async def team_stats(principal: NamedDependency[Principal], name: FromPath[str],
                         window_s: WindowParam = STATS_WINDOW_S) -> StatsOut:
        team = principal.own_team(None if name == "me" else name)
        stats = await ctx.db(store.team_stats, team, window_s=window_s)
        if stats is None:
            raise ApiProblem(NOT_FOUND, f"no such team {team!r}")
        return StatsOut(team=stats.team, window_start=stats.window_start, window_s=window_s, running=stats.running,
                        quota=stats.quota, total=counts_out(stats.total),
                        names=[NameStatsOut(n, counts_out(t)) for n, t in stats.names.items()],
                        other=OtherStatsOut(stats.other_names, counts_out(stats.other)) if stats.other else None)

    @patch("/v1/teams/{name:str}", operation_id="setTeam", status_code=200, security=SECURITY, tags=["teams"],
           request_max_body_size=4096,
           opt={"admin_only": True},                 # a team's token is refused before its body is read
           summary="Set a team's quota, weight, admission limits and retention (admin)",
           description="A field omitted keeps its value; at least one is required; null clears an admission "
                       "limit (submit_rate null: no rate limit; max_pending null: the server's "
                       "max_pending_per_team); retention_s null: the server's job_retention_s again. Answers the "
                       "team's settings. " + APPLIED + " " + ADMITTED,
           responses=problems.responses(*COMMON, FORBIDDEN, NOT_FOUND, INVALID))
    async def set_team(data: JSONBody[TeamSettingsIn], principal: NamedDependency[Principal],
                       name: FromPath[str]) -> TeamOut:
        principal.require_admin()
        if all(getattr(data, f) is msgspec.UNSET for f in data.__struct_fields__):
            raise ApiProblem(INVALID, "request body: give at least one of " + ", ".join(data.__struct_fields__))
        if data.retention_s is not msgspec.UNSET and (reason := retention_problem(data.retention_s)):
            raise ApiProblem(INVALID, reason)
        team = await ctx.db(store.update_team, name,
                            quota=None if data.quota is msgspec.UNSET else int(data.quota),
                            weight=None if data.weight is msgspec.UNSET else int(data.weight),
                            submit_rate=_given(data.submit_rate), submit_burst=_given(data.submit_burst),
                            max_pending=_given(data.max_pending), retention_s=_given(data.retention_s))
        ctx.admission.forget(name)
        return team_out(team)

    @get("/v1/teams/{name:str}", operation_id="getTeam", security=SECURITY, tags=["teams"],
         summary="A team's quota, weight, admission limits and retention",
         description="The admin names any team; a team's token only its own (by its name or `me`).",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def get_team(principal: NamedDependency[Principal], name: FromPath[str]) -> TeamOut:
        team_name = principal.path_team(name)
        team = await ctx.db(store.team, team_name)
        if team is None:
            raise ApiProblem(NOT_FOUND, f"no such team {team_name!r}")
        return team_out(team)

    @get("/v1/teams", operation_id="listTeams", security=SECURITY, tags=["teams"], summary="Every team, by name (admin)",
         description="Keyset-paginated by name: pass next_cursor as ?cursor= for the next page; next_cursor "
                     "null: no more teams. " + APPLIED,
         responses=problems.responses(*COMMON, FORBIDDEN),
         exception_handlers=problems.parameters())
    async def list_teams(
        principal: NamedDependency[Principal],
        cursor: Annotated[str | None, QueryParameter(required=False, pattern=TEAM_NAME_PATTERN,
                                                     description="the next_cursor of the previous page")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=TEAMS_PAGE_MAX)] = 100,
    ) -> TeamPageOut:
        principal.require_admin()
        page = await ctx.db(store.list_teams, after=cursor, limit=limit)
        return TeamPageOut([team_out(t) for t in page.teams], page.next_cursor)

    @get("/v1/stats", operation_id="fleetStats", security=SECURITY, tags=["teams"],
         summary="Every team's statistics (admin)", opt={"admin_only": True},
         description=STATS_DESCRIPTION + " One row per team, and the sums.",
         responses=problems.responses(*COMMON, FORBIDDEN), exception_handlers=problems.parameters())
    async def fleet_stats(principal: NamedDependency[Principal], window_s: WindowParam = STATS_WINDOW_S
                          ) -> FleetStatsOut:
        principal.require_admin()
        stats = await ctx.db(store.fleet_stats, window_s=window_s)
        return FleetStatsOut(window_start=stats.window_start, window_s=window_s, running=stats.running,
                             total=counts_out(stats.total),
                             teams=[FleetTeamOut(t.team, t.running, t.quota, counts_out(t.tally)) for t in stats.teams])

    return [create_team, rotate_token, team_stats, fleet_stats, set_team, get_team, list_teams]
