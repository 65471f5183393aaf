"""Who is signed in to the admin UI, and what every page does with it.

Sign-in takes the admin token or a team's token (checked as the API checks
bearer tokens: by hash, the admin's against the admin_token setting, a
team's against teams.token_hash). It opens a session: a random id in a
cookie (HttpOnly, SameSite=Strict, Secure when the request came over TLS,
path /admin), only its sha256 in admin_sessions, with the session's CSRF
token. A team's session ends when its token is rotated, the admin's when
the admin_token setting changes.

`guard` runs before every /admin handler (the router's before_request):
no session -> the sign-in page (303; htmx requests get HX-Redirect);
a POST whose form lacks the session's CSRF token -> 403, before the handler
runs, so nothing is changed, and its page is rendered as a stranger's (no
navigation, no sign-out form and so no CSRF token: only a request that
passed the guard is signed in for its page). Handlers marked
opt={"public": True} (sign-in, static files) are let through; the sign-in
form has a CSRF token of its own (a cookie and a form field that must match).

Failed sign-ins (an unknown or no token) are audited, and throttled per
client address (throttle.py: 429 with Retry-After once a client has failed
too often, its token not even looked at).

Pages use: `Who` and `Ctx` (their dependencies: the Signed browser, the
Context it shares with the API), `render` (a template with the common context), `action` (an
audited store call), `admin_only`, `Refused` (see app/minutehand/admin/app.py).
"""
from __future__ import annotations

import hmac
import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from litestar import Request, Response, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.params import SkipValidation
from litestar.response import Redirect, Template

from minutehand.admin.throttle import SignInThrottle
from minutehand.store.admin import AuditNote
from minutehand.store.teams import hash_token
from minutehand.web.auth import Principal
from minutehand.web.context import Context

log = logging.getLogger(__name__)
T = TypeVar("T")

PREFIX = "/admin"
SESSION_COOKIE = "mh_admin"
SIGNIN_COOKIE = "mh_admin_signin"          # the sign-in form's own CSRF token
CSRF_FIELD = "csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WHO = "minutehand_admin_who"              # where guard leaves the Signed of the request (request.state)

# The navigation of every page: (label, path under /admin).
NAV = (("Overview", "/"), ("Jobs", "/jobs"), ("Dead jobs", "/dead"), ("Series", "/series"),
       ("Dispatchers", "/dispatchers"), ("Teams", "/teams"), ("Audit", "/audit"))


@dataclass(frozen=True)
class Signed:
    """The signed-in browser of a request: its principal (the admin, or one
    team: principal.team), its session's CSRF token, and the reference of
    the token it signed in with (first 12 hex digits of its sha256)."""
    principal: Principal
    csrf: str
    token_ref: str
    session: str                           # sha256 of the session id

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def actor(self) -> str:
        return "admin" if self.principal.team is None else self.principal.team

    def note(self, action: str, target: str, *, team: str | None = None, **detail: Any) -> AuditNote:
        """The audit entry of an action by this browser. team: the team it
        concerned (a team's own actions concern itself)."""
        return AuditNote(self.actor, self.token_ref, team if team is not None else self.principal.team,
                         action, target, detail or None)


# How a page handler takes them: `who: Who, ctx: Ctx` (the router provides
# both; taken as they are, not validated field by field).
Who = NamedDependency[SkipValidation[Signed]]
Ctx = NamedDependency[SkipValidation[Context]]
Throttle = NamedDependency[SkipValidation[SignInThrottle]]


class Refused(HTTPException):
    """A page refused (rendered as the error page with this status)."""


def admin_only(who: Signed) -> None:
    """403 for a team's session on a page or action of the admin's."""
    if not who.is_admin:
        raise Refused(status_code=403, detail="this page is for the admin: a team's sign-in sees its own "
                                              "jobs, series, dead jobs, team and audit entries")


def context_of(request: Request) -> Context:
    return request.app.state.ctx


def signed(request: Request) -> Signed:
    """The `who` dependency: the Signed that guard found for this request."""
    return getattr(request.state, _WHO)


def render(request: Request, template: str, *, status_code: int = 200, **context: Any) -> Template:
    """A page: the template with `who` (Signed or None), `csrf` (put it in
    every POST form as a hidden field named csrf), `nav`, `path` (the
    request's path under /admin) and `prefix` ("/admin") added."""
    who: Signed | None = getattr(request.state, _WHO, None)
    path = request.url.path[len(PREFIX):] or "/"
    return Template(template_name=template, status_code=status_code,
                    context={"who": who, "csrf": who.csrf if who else None, "nav": NAV, "path": path,
                             "prefix": PREFIX, **context},
                    headers={"Cache-Control": "no-store"})


async def action(ctx: Context, note: AuditNote, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) (store calls) and its audit entry in one
    transaction (Store.audited); a refusal is audited as refused and raised."""
    return await ctx.db(ctx.store.audited, note, lambda: fn(*args, **kwargs))


# ---------------------------------------------------------------- the guard
def _is_tls(request: Request) -> bool:
    return request.url.scheme == "https"


def _redirect_to_signin(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.headers.get("hx-request"):
        # htmx follows a redirect inside its fragment: have it load the sign-in page whole,
        # and come back to the page the fragment is part of
        current = urlsplit(request.headers.get("hx-current-url", ""))
        target = _safe_next(current.path + (f"?{current.query}" if current.query else ""))
        location = f"{PREFIX}/signin?next={quote(target, safe='')}"
        return Response(content=b"", status_code=204, headers={"HX-Redirect": location})
    return Redirect(f"{PREFIX}/signin?next={quote(target, safe='')}", status_code=303)


def _refused_page(request: Request, detail: str) -> Template:
    return render(request, "error.html", status_code=403, status=403, detail=detail)


async def _session(request: Request, ctx: Context) -> Signed | None:
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id or len(session_id) > 200:
        return None
    id_hash = hash_token(session_id)
    session = await ctx.db(ctx.store.admin_session, id_hash)
    if session is None:
        return None
    if session.team is None:
        # the admin's session lasts as long as the admin token it was opened with
        admin = ctx.settings.admin_token
        if not admin or not hmac.compare_digest(session.token_hash, hash_token(admin)):
            return None
    return Signed(Principal(session.team), session.csrf, session.token_hash[:12], id_hash)


async def guard(request: Request) -> Response | None:
    """The admin router's before_request (see the module's docstring)."""
    if request.route_handler.opt.get("public"):
        return None
    ctx = context_of(request)
    who = await _session(request, ctx)
    if who is None:
        return _redirect_to_signin(request)
    if request.method not in SAFE_METHODS:
        form = await request.form()
        given = form.get(CSRF_FIELD)
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), who.csrf.encode()):
            log.info("admin: %s %s refused: no valid CSRF token", request.method, request.url.path)
            return _refused_page(request, "this form had no valid CSRF token (it may be from an older "
                                          "sign-in): nothing was changed; reload the page and try again")
    setattr(request.state, _WHO, who)
    return None


# ---------------------------------------------------------------- sign-in and sign-out
def _safe_next(target: str | None) -> str:
    """Where to go after sign-in: a path under /admin only (never another site)."""
    if target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and (parts.path == PREFIX or parts.path.startswith(PREFIX + "/")) \
                and "\\" not in target:
            return target
    return PREFIX + "/"


def _signin_page(request: Request, *, status_code: int = 200, error: str | None = None,
                 next_path: str | None = None) -> Template:
    token = secrets.token_urlsafe(24)
    page = render(request, "signin.html", status_code=status_code, error=error, signin_csrf=token,
                  next=_safe_next(next_path))
    page.cookies.append(Cookie(key=SIGNIN_COOKIE, value=token, path=PREFIX, httponly=True, samesite="strict",
                               secure=_is_tls(request), max_age=3600))
    return page


@get("/signin", opt={"public": True}, name="admin.signin")
async def signin_page(request: Request) -> Template:
    return _signin_page(request, next_path=request.query_params.get("next"))


async def _failed_signin(ctx: Context, throttle: SignInThrottle, client: str, token_ref: str, reason: str) -> None:
    """A sign-in refused for its token: it counts against the client, and is
    audited (concerning no team: the admin's audit page shows it)."""
    throttle.failed(client)
    log.info("admin: sign-in from %s refused: %s", client, reason)
    await ctx.db(ctx.store.audit, AuditNote("stranger", token_ref, None, "sign-in", client, {"refused": reason}),
                 ok=False)


@post("/signin", opt={"public": True}, name="admin.signin.post", status_code=303)
async def signin(request: Request, throttle: Throttle) -> Response:
    ctx = context_of(request)
    form = await request.form()
    given, expected = form.get(CSRF_FIELD), request.cookies.get(SIGNIN_COOKIE)
    next_path = form.get("next") if isinstance(form.get("next"), str) else None
    if not isinstance(given, str) or not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        return _signin_page(request, status_code=403, next_path=next_path,
                            error="the sign-in form had expired (or came from elsewhere): sign in again")
    client = request.client.host if request.client else "unknown"
    if wait_s := throttle.wait_s(client):
        retry = math.ceil(wait_s)
        page = _signin_page(request, status_code=429, next_path=next_path,
                            error=f"too many failed sign-ins from this address: try again in {retry} s")
        page.headers["Retry-After"] = str(retry)
        return page
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    if not token:
        await _failed_signin(ctx, throttle, client, "-", "no token")
        return _signin_page(request, status_code=401, next_path=next_path, error="give the admin token or a team's token")
    token_hash = hash_token(token)
    admin = ctx.settings.admin_token
    if admin and hmac.compare_digest(token_hash, hash_token(admin)):
        team = None
    else:
        team = await ctx.lookup_token(token_hash)
        if team is None:
            await _failed_signin(ctx, throttle, client, token_hash[:12], "unknown token")
            return _signin_page(request, status_code=401, next_path=next_path,
                                error="unknown token: give the admin token (MINUTEHAND_ADMIN_TOKEN) or a team's "
                                      "token as printed when the team was created or last rotated")
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    actor = "admin" if team is None else team
    await action(ctx, AuditNote(actor, token_hash[:12], team, "sign-in", actor), ctx.store.create_admin_session,
                 hash_token(session_id), team, token_hash, csrf, ctx.settings.admin_session_s)
    response = Redirect(_safe_next(next_path), status_code=303)
    response.cookies.append(Cookie(key=SESSION_COOKIE, value=session_id, path=PREFIX, httponly=True,
                                   samesite="strict", secure=_is_tls(request),
                                   max_age=int(ctx.settings.admin_session_s)))
    response.cookies.append(Cookie(key=SIGNIN_COOKIE, value="", path=PREFIX, max_age=0, httponly=True,
                                   samesite="strict", secure=_is_tls(request)))
    return response


@post("/signout", name="admin.signout", status_code=303)
async def signout(request: Request) -> Response:
    ctx, who = context_of(request), signed(request)
    await action(ctx, who.note("sign-out", who.actor), ctx.store.end_admin_session, who.session)
    response = Redirect(f"{PREFIX}/signin", status_code=303)
    response.cookies.append(Cookie(key=SESSION_COOKIE, value="", path=PREFIX, max_age=0, httponly=True,
                                   samesite="strict", secure=_is_tls(request)))
    return response


HANDLERS: list = [signin_page, signin, signout]
