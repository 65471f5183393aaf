"""The submitter HTTP API: wiring only. create_app(settings, store) -> Litestar.

Routes live in jobs.py, teams.py and health.py; authentication in auth.py;
errors in problems.py; bodies and responses in schemas.py. The OpenAPI
schema is served at /schema/openapi.json (and browsable at /schema).
"""
from __future__ import annotations

from typing import Any

from litestar import Litestar, get
from litestar.params import FromPath
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import Components, Link, SecurityScheme

from minutehand.api import health, jobs, problems, teams
from minutehand.api.auth import TokenCache, authenticator, checked_before_body
from minutehand.api.bodies import StrictBody
from minutehand.api.coalesce import SubmitCoalescer
from minutehand.api.context import Context
from minutehand.dispatch import routes as worker_routes
from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store

VERSION = "1"


def create_app(settings: Settings, store: Store, *, head: str | None = None, submit_api: bool = True,
               dispatcher: Dispatcher | None = None) -> Litestar:
    """submit_api: the teams' routes (jobs, teams); dispatcher: run it with
    the process, and serve the worker protocol (app/dispatch/routes.py)."""
    ctx = Context(settings=settings, store=store, tokens=TokenCache(settings.api_token_cache_s),
                  head=head or migrate.head())

    def start() -> None:
        if submit_api and settings.api_submit_workers > 0:
            ctx.submitter = SubmitCoalescer(store, workers=settings.api_submit_workers)
        if dispatcher is not None:
            dispatcher.start()

    def stop() -> None:
        if dispatcher is not None:
            dispatcher.stop()
        if ctx.submitter is not None:
            ctx.submitter.close()
            ctx.submitter = None

    @get("/problems/{slug:str}", include_in_schema=False)
    async def problem_type(slug: FromPath[str]) -> dict[str, Any]:
        return problems.problem_page(slug)

    check_first, principal = checked_before_body(
        "principal", authenticator(settings.admin_token, ctx.tokens, ctx.lookup_token))
    handlers: list = [*health.routes(ctx), problem_type]
    if submit_api:
        handlers += [*jobs.routes(ctx), *teams.routes(ctx)]
    if dispatcher is not None:
        handlers.append(worker_routes.router(ctx, dispatcher))

    app = Litestar(
        route_handlers=handlers,
        dto=StrictBody, return_dto=None,          # bodies: msgspec decodes them (bodies.py)
        dependencies={"principal": principal}, before_request=check_first,
        plugins=[problems.plugin(settings.api_retry_after_s, ctx.database_unreachable)],
        openapi_config=OpenAPIConfig(
            title="minutehand", version=VERSION,
            description="Submit, inspect, cancel and list jobs; every call carries a team's bearer token "
                        "(or the admin token). Errors are RFC 9457 problem+json.",
            components=Components(security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer",
                                         description="a team's token (`minutehand team create NAME`) "
                                                     "or the admin token"),
                "worker": SecurityScheme(type="http", scheme="bearer",
                                         description="a worker (fleet) token (`minutehand worker-token "
                                                     "create NAME`)")}),
            render_plugins=[SwaggerRenderPlugin()],
        ),
        request_max_body_size=settings.api_max_body_bytes,
        on_startup=[start], on_shutdown=[stop],
        debug=False,
    )
    app.state.ctx = ctx
    app.state.dispatcher = dispatcher
    if submit_api:
        _link_created_jobs(app)
    return app


# OpenAPI links (for stateful clients and tests): a created job's id leads
# to its status and its cancellation. Litestar has no handler option for them.
JOB_LINKS = {"getJob": "GetCreatedJob", "cancelJob": "CancelCreatedJob"}


def _link_created_jobs(app: Litestar) -> None:
    for status in ("200", "201"):
        response = app.openapi_schema.paths["/v1/jobs"].post.responses[status]
        response.links = {name: Link(operation_id=op, parameters={"job_id": "$response.body#/job_id"})
                          for op, name in JOB_LINKS.items()}
