"""Team routes: create a team and rotate its token (admin), and a team's
recent statistics."""
from __future__ import annotations

from litestar import get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody

from minutehand.api import problems
from minutehand.api.auth import Principal
from minutehand.api.context import Context
from minutehand.api.problems import COMMON, CONFLICT, FORBIDDEN, INVALID, NOT_FOUND, ApiProblem
from minutehand.api.schemas import FailuresOut, StatsOut, TeamIn, TeamTokenOut, text_problem

SECURITY = [{"bearer": []}]
STATS_WINDOW_S = 86400
STATS_CAP = 50_000


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

    @get("/v1/teams/{name:str}/stats", operation_id="teamStats", security=SECURITY, tags=["teams"], summary="A team's recent statistics",
         description="`me` names the caller's own team. Counts by state, running vs quota and failures by job "
                     "name cover the team's jobs created in the last 24 h (at most the newest "
                     f"{STATS_CAP:,}: truncated says so); lateness p50/p99 the starts of the last hour.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def team_stats(principal: NamedDependency[Principal], name: FromPath[str]) -> StatsOut:
        team = principal.own_team(None if name == "me" else name)
        stats = await ctx.db(store.team_stats, team, window_s=STATS_WINDOW_S, cap=STATS_CAP)
        if stats is None:
            raise ApiProblem(NOT_FOUND, f"no such team {team!r}")
        return StatsOut(team=stats.team, window_start=stats.window_start, examined=stats.examined,
                        truncated=stats.truncated, by_state=stats.by_state, running=stats.running,
                        quota=stats.quota, lateness_p50_s=stats.lateness_p50_s, lateness_p99_s=stats.lateness_p99_s,
                        failures=[FailuresOut(f["name"], f["dead"], f["retrying"]) for f in stats.failures])

    return [create_team, rotate_token, team_stats]
