"""Liveness and readiness: /healthz answers while the process runs; /readyz
only when the database answers, its schema is at the migrations' head and,
in a process with a dispatcher, that dispatcher can hand out jobs (its
threads run and it holds shard leases): a load balancer or an orchestrator
then sends no worker to a dispatcher that would never answer with a job."""
from __future__ import annotations

import psycopg
from litestar import get
from litestar.handlers import HTTPRouteHandler

from minutehand.api import problems
from minutehand.protocol.api import HealthOut, ReadyOut
from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.version import VERSION
from minutehand.web.context import Context
from minutehand.web.problems import INTERNAL, UNAVAILABLE, ApiProblem


def routes(ctx: Context, dispatcher: Dispatcher | None = None) -> list[HTTPRouteHandler]:

    @get("/healthz", operation_id="healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> HealthOut:
        return HealthOut("ok")

    @get("/readyz", operation_id="readyz", tags=["health"],
         summary="The database is reachable and migrated to the head revision, and the dispatcher (if any) "
                 "runs and holds shards",
         responses=problems.responses(UNAVAILABLE, INTERNAL))
    async def readyz() -> ReadyOut:
        try:
            revision = await ctx.db(ctx.store.schema_revision)
        except psycopg.OperationalError as exc:
            ctx.database_unreachable()
            raise ApiProblem(UNAVAILABLE, f"database unreachable: {exc}".strip(),
                             headers={"Retry-After": str(ctx.settings.api_retry_after_s)}) from None
        except psycopg.Error as exc:   # reachable, but not migrated at all (no alembic_version)
            raise ApiProblem(UNAVAILABLE, f"database not ready: {type(exc).__name__}: {exc}".strip(),
                             headers={"Retry-After": str(ctx.settings.api_retry_after_s)}) from None
        if revision != ctx.head:
            raise ApiProblem(UNAVAILABLE, f"schema at revision {revision}, the code expects {ctx.head}: "
                                          "run `minutehand migrate`",
                             headers={"Retry-After": str(ctx.settings.api_retry_after_s)})
        if dispatcher is not None and (reason := dispatcher.unready()):
            raise ApiProblem(UNAVAILABLE, f"dispatcher {dispatcher.name} cannot hand out jobs: {reason}",
                             headers={"Retry-After": str(ctx.settings.api_retry_after_s)})
        return ReadyOut("ready", revision, ctx.head, VERSION)

    return [healthz, readyz]
