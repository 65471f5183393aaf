"""The admin UI's wiring: admin_ui(ctx) -> the /admin router, the
template config and the security headers' hook, which create_app
(app/minutehand/api/app.py) mounts when it is given them
(app/minutehand/serve.py passes admin_ui). The api and admin packages import
neither the other: what both use is in app/minutehand/web/ (Principal, Context)
and app/minutehand/rules.py.

The contract every page module follows (jobs.py, dead.py, series.py,
overview.py, dispatchers.py, teams.py, audit.py):

- A module lists its Litestar handlers in `HANDLERS`; admin_router
  collects them. Paths are relative to /admin (`@get("/jobs")` serves
  /admin/jobs). Every handler needs a signed-in browser: the router's
  guard (access.guard) sends anyone else to /admin/signin before the
  handler runs.
- Two dependencies, by parameter name: `who: access.Who` (an access.Signed:
  who.principal is a web.auth.Principal, the admin or one team, with
  scope()/own_team()/require_admin() as in the API; who.is_admin;
  who.note(...) builds an audit entry) and `ctx: access.Ctx` (the
  web.context.Context the API has too: ctx.store, ctx.settings,
  `await ctx.db(fn, ...)` runs a store call off the event loop).
- Render with `access.render(request, "page.html", **values)` -> Template;
  pass status_code=4xx to re-render a refused form. Templates extend
  "base.html" and fill `{% block content %}` (`{% block title %}` too); the
  context has `who`, `csrf`, `nav`, `path`, `prefix` ("/admin"); filters
  `utc` (a datetime as UTC to the second, "—" for None) and `num` (1,234).
- Every state-changing form is a POST carrying
  `<input type="hidden" name="csrf" value="{{ csrf }}">`: the guard refuses
  (403, handler not run) a POST without the session's token. Read the
  fields with `await request.form()`.
- A change goes through `await access.action(ctx, who.note(action, target,
  team=TEAM, **detail), store_fn, *args)`: the store calls and the audit
  entry commit in one transaction (Store.audited); a refusal (StoreError)
  is audited as refused, rolled back and raised.
- Refusals: raise access.Refused(status_code=..., detail=...), or let a
  StoreError through (NotFound -> 404, InvalidInput -> 400, Conflict -> 409):
  the router renders error.html with the status. access.admin_only(who)
  refuses a team's session (403).
- Static files: /admin/static/ (htmx.min.js, admin.css, admin.js).
- No script in a template: the Content-Security-Policy runs scripts from
  /admin/static only (no inline <script>, no on...= handler, no eval, so
  none of htmx's hx-on, hx-vars or js: either). A form (or its button)
  that asks before it is sent says so with data-confirm="question?"
  (static/admin.js).
- Every response under /admin, an error page or a static file too, carries
  HEADERS (security_headers, the app's before_send hook).
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import psycopg
from litestar import Request, Router
from litestar.di import Provide
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.exceptions import HTTPException
from litestar.response import Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig
from litestar.types import BeforeMessageSendHookHandler, Message, Scope

from minutehand import packaged
from minutehand.admin import access, audit, dead, dispatchers, jobs, overview, series, teams
from minutehand.admin.throttle import SignInThrottle
from minutehand.store import errors
from minutehand.web.context import Context

log = logging.getLogger(__name__)
HERE = packaged.folder("minutehand.admin")
PAGE_MODULES = (access, overview, jobs, dead, series, dispatchers, teams, audit)
# Every /admin response: never framed by another site (clickjacking), scripts
# only from /admin/static (an injected inline script or handler does not run),
# forms post only here, nothing sniffed, no address leaked to other sites.
# (Styles may be inline: the charts colour their legend in style attributes.)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
           (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin")]
_HEADER_NAMES = {name for name, _ in HEADERS}


async def security_headers(message: Message, scope: Scope) -> None:
    """The app's before_send hook (admin_ui hands it to create_app): HEADERS
    on every response under /admin, whatever made it: a page, an error page,
    the guard's redirect, a static file, the app's own 404 or 405 for an
    address no page has. (A router's response_headers reach none but its
    handlers' own responses.)"""
    if message["type"] == "http.response.start" and (scope["path"] == access.PREFIX
                                                      or scope["path"].startswith(access.PREFIX + "/")):
        kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _HEADER_NAMES]
        message["headers"] = [*kept, *HEADERS]


def _utc(value: dt.datetime | None) -> str:
    """A time as the pages show it: UTC, to the second ("—" for none)."""
    if value is None:
        return "—"
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any) -> str:
    """A count with thousands separators."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def _filters(engine: JinjaTemplateEngine) -> None:
    engine.engine.filters.update(utc=_utc, num=_num)


def template_config() -> TemplateConfig:
    """Jinja2 over app/minutehand/admin/templates, autoescaped; filters `utc` and `num`."""
    return TemplateConfig(directory=HERE / "templates", engine=JinjaTemplateEngine, engine_callback=_filters)


def _error_page(request: Request, status: int, detail: str) -> Template:
    return access.render(request, "error.html", status_code=status, status=status, detail=detail)


def _store_refusal(request: Request, exc: errors.StoreError) -> Template:
    return _error_page(request, exc.status if 400 <= exc.status < 500 else 503, exc.message)


def _http_error(request: Request, exc: HTTPException) -> Template:
    status = exc.status_code
    detail = exc.detail if status < 500 else "the server failed; the error is logged"
    if status == 404 and detail in ("", "Not Found"):
        detail = "no such page"
    elif status == 400 and not isinstance(exc, access.Refused):
        detail = "that address or form was not understood (a number or name out of shape?)"
    return _error_page(request, status, detail)


def _database_away(request: Request, exc: psycopg.OperationalError) -> Template:
    log.warning("admin: database unreachable: %s", exc)
    return _error_page(request, 503, "the database cannot be reached now: try again in a moment")


def _unexpected(request: Request, exc: Exception) -> Template:
    log.error("admin: unexpected error", exc_info=exc)
    return _error_page(request, 500, "the server failed; the error is logged")


def admin_router(ctx: Context) -> Router:
    """Every page under /admin, behind access.guard."""
    handlers: list = [h for module in PAGE_MODULES for h in module.HANDLERS]
    static = create_static_files_router(path="/static", directories=[HERE / "static"], opt={"public": True},
                                        name="admin.static")
    throttle = SignInThrottle()              # this process's failed sign-ins, per client address
    return Router(
        "/admin", route_handlers=[*handlers, static], include_in_schema=False,
        before_request=access.guard,
        dependencies={"who": Provide(access.signed, sync_to_thread=False),
                      "ctx": Provide(lambda: ctx, sync_to_thread=False),
                      "throttle": Provide(lambda: throttle, sync_to_thread=False)},
        exception_handlers={errors.StoreError: _store_refusal, HTTPException: _http_error,
                            psycopg.OperationalError: _database_away, Exception: _unexpected},
        signature_namespace={"Signed": access.Signed, "Context": Context, "SignInThrottle": SignInThrottle},
    )


def admin_ui(ctx: Context) -> tuple[Router, TemplateConfig, BeforeMessageSendHookHandler]:
    """What create_app mounts: the router, the template config and the hook
    that gives every /admin response its HEADERS."""
    return admin_router(ctx), template_config(), security_headers
