"""Team routes: create a team and rotate its token (admin), a team's
statistics, and the fleet's (admin)."""
from __future__ import annotations

from typing import Annotated

from litestar import get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter

from minutehand.api import problems
from minutehand.api.auth import Principal
from minutehand.api.context import Context
from minutehand.api.problems import COMMON, CONFLICT, FORBIDDEN, INVALID, NOT_FOUND, ApiProblem
from minutehand.api.schemas import (BucketOut, CountsOut, DistributionOut, FleetStatsOut, FleetTeamOut, NameStatsOut,
                                    OtherStatsOut, StatsOut, TeamIn, TeamTokenOut, text_problem)
from minutehand.store.records import STATS_BOUNDS_S, Tally, quantile_bound
from minutehand.store.store import Store

SECURITY = [{"bearer": []}]
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


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store

    @post("/v1/teams", operation_id="createTeam", status_code=201, security=SECURITY, tags=["teams"], request_max_body_size=4096,
          opt={"admin_only": True},                  # a team's token is refused before its body is read
          summary="Create a team (admin)", description="Returns the team's token, shown this once.",
          responses=problems.responses(*COMMON, FORBIDDEN, CONFLICT, INVALID))
    async def create_team(data: JSONBody[TeamIn], principal: NamedDependency[Principal]) -> TeamTokenOut:
        principal.require_admin()
        team = data
        if reason := text_problem("name", team.name):
            raise ApiProblem(INVALID, reason)
        token = await ctx.db(store.create_team, team.name, quota=int(team.quota), weight=int(team.weight))
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

    return [create_team, rotate_token, team_stats, fleet_stats]
