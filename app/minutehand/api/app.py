"""The HTTP app: wiring only. create_app(settings, store, ...) -> Litestar,
from components it is given (the process is built in app/minutehand/serve.py).

Routes live in jobs.py, teams.py, series.py, dead.py (dead jobs and the
events feed), webhooks.py and health.py; authentication in auth.py;
errors in problems.py; bodies and responses in minutehand.protocol.api. What the admin
UI shares with them (the Context, the Principal, the kinds of problem) is
in app/minutehand/web/, the rules in app/minutehand/rules.py. The OpenAPI
schema is served at /schema/openapi.json (and browsable at /schema/swagger,
from the package's own files: explorer.py).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from litestar import Litestar, Request, Response, Router, get, route
from litestar.enums import HttpMethod
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, Link, SecurityScheme
from litestar.template.config import TemplateConfig
from litestar.types import BeforeMessageSendHookHandler

from minutehand import protocol
from minutehand.api import dead, explorer, health, jobs, metrics, problems, series, teams, traces, webhooks, windows
from minutehand.api import workers as worker_routes
from minutehand.api.auth import authenticator, checked_before_body
from minutehand.api.bodies import JobIdSchema, StrictBody
from minutehand.api.coalesce import SubmitCoalescer
from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.lifecycle import Service
from minutehand.protocol import JobId
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.version import VERSION
from minutehand.web.admission import Admission
from minutehand.web.auth import TokenCache
from minutehand.web.context import Context


def create_app(settings: Settings, store: Store, *, head: str | None = None, submit_api: bool = True,
               dispatcher: Dispatcher | None = None, submitter: SubmitCoalescer | None = None,
               lifecycle: Service | None = None,
               ui: Callable[[Context], tuple[Router, TemplateConfig, BeforeMessageSendHookHandler]] | None = None
               ) -> Litestar:
    """submit_api: the teams' routes (jobs, teams), single submissions sent
    through `submitter` if given; dispatcher: serve the worker protocol
    (app/minutehand/api/workers.py) from it. lifecycle: the process's background
    components (app/minutehand/serve.py builds them), started when the app starts and
    stopped when it stops; the app starts nothing of its own. ui: the admin
    UI (minutehand.admin.app.admin_ui: its router, templates and the hook
    that sets its responses' headers), mounted with the teams' routes."""
    admission = submitter.admission if submitter is not None else Admission(store, settings)
    ctx = Context(settings=settings, store=store, tokens=TokenCache(settings.api_token_cache_s),
                  head=head or migrate.head(), admission=admission, submitter=submitter if submit_api else None)
    on_startup, on_shutdown = ([lifecycle.start], [lifecycle.stop]) if lifecycle is not None else ([], [])

    @get("/problems/{slug:str}", include_in_schema=False)
    async def problem_type(slug: FromPath[str]) -> dict[str, Any]:
        return problems.problem_page(slug)

    check_first, principal = checked_before_body(
        "principal", authenticator(settings.admin_token, ctx.tokens, ctx.lookup_token))
    handlers: list = [*health.routes(ctx, dispatcher), *metrics.routes(ctx), problem_type, explorer.assets()]
    if submit_api:
        handlers += [*jobs.routes(ctx), *teams.routes(ctx), *series.routes(ctx), *windows.routes(ctx),
                     *dead.routes(ctx), *webhooks.routes(ctx)]
    handlers = with_options(handlers)
    if dispatcher is not None:
        handlers.append(worker_routes.router(ctx, dispatcher))
    templates, before_send = None, []
    if ui is not None and submit_api:
        admin_router, templates, headers = ui(ctx)
        handlers.append(admin_router)
        before_send.append(headers)

    app = Litestar(
        route_handlers=handlers,
        dto=StrictBody, return_dto=None,
        type_encoders={JobId: protocol.enc_hook},  # a job id is a decimal string in JSON          # bodies: msgspec decodes them (bodies.py)
        dependencies={"principal": principal}, before_request=check_first,
        plugins=[problems.plugin(settings.api_retry_after_s, ctx.database_unreachable), JobIdSchema(),
                 *traces.plugins()],         # a span per request, with OpenTelemetry's ASGI instrumentation
        openapi_config=OpenAPIConfig(
            title="minutehand", version=VERSION,
            description="Submit, inspect, cancel and list jobs; read, list, pause, resume, cancel and change "
                        "repeating series; every call carries a team's bearer token "
                        "(or the admin token). Errors are RFC 9457 problem+json.",
            components=Components(security_schemes={
                "bearer": SecurityScheme(type="http", scheme="bearer",
                                         description="a team's token (`minutehand team create NAME`) "
                                                     "or the admin token"),
                "worker": SecurityScheme(type="http", scheme="bearer",
                                         description="a worker (fleet) token (`minutehand worker-token "
                                                     "create NAME`)")}),
            render_plugins=[explorer.plugin()],
        ),
        request_max_body_size=settings.api_max_body_bytes,
        middleware=[metrics.requests_middleware()],
        on_startup=on_startup, on_shutdown=on_shutdown,
        template_config=templates, before_send=before_send,
        debug=False,
    )
    app.state.ctx = ctx
    app.state.dispatcher = dispatcher
    if submit_api:
        _link_created_jobs(app)
    return app


def with_options(handlers: list) -> list:
    """The handlers, each path served by more than one of them preceded by
    an OPTIONS handler that lists all their methods. Litestar makes its own
    with a path's first handler and keeps it as more are added, so its Allow
    lists only the first method; registered first, this one is kept instead."""
    paths = Counter(path for h in handlers if isinstance(h, HTTPRouteHandler) for path in h.paths)
    return [*(_allow(path) for path, n in paths.items() if n > 1), *handlers]


def _allow(path: str) -> HTTPRouteHandler:
    @route(path, http_method=[HttpMethod.OPTIONS], include_in_schema=False, status_code=204,
           sync_to_thread=False)
    def allow(request: Request) -> Response[None]:
        methods = {m for r in request.app.routes if r.path == path for m in getattr(r, "methods", ())}
        return Response(None, status_code=204, headers={"Allow": ", ".join(sorted(methods | {"OPTIONS"}))})

    return allow


# OpenAPI links (for stateful clients and tests): a created job's id leads
# to its status and its cancellation. Litestar has no handler option for them.
JOB_LINKS = {"getJob": "GetCreatedJob", "cancelJob": "CancelCreatedJob"}


def _link_created_jobs(app: Litestar) -> None:
    for status in ("200", "201"):
        response = app.openapi_schema.paths["/v1/jobs"].post.responses[status]
        response.links = {name: Link(operation_id=op, parameters={"job_id": "$response.body#/job_id"})
                          for op, name in JOB_LINKS.items()}
