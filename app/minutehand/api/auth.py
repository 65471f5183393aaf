"""Bearer tokens -> who is calling: a team, or the admin (a Principal,
app/minutehand/web/auth.py).

Only hashes are compared: a team's token against teams.token_hash (through
the store, remembered for a few seconds in a small in-process cache, so a
busy client costs one lookup per cache period, not one per request), the
admin token against the hash of the admin_token setting.
"""
from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.di import Provide

from minutehand.store.teams import hash_token
from minutehand.web.auth import ADMIN, NOT_CACHED, Principal, TokenCache
from minutehand.web.problems import UNAUTHORIZED, ApiProblem


def authenticator(admin_token: str, cache: TokenCache,
                  lookup: Callable[[str], Awaitable[str | None]]) -> Callable[[Request], Awaitable[Principal]]:
    """The `principal` dependency: reads `Authorization: Bearer <token>`.
    lookup: token hash -> team name, from the database."""
    admin_hash = hash_token(admin_token) if admin_token else None

    async def principal(request: Request) -> Principal:
        token_hash = bearer_hash(request)
        if admin_hash is not None and hmac.compare_digest(token_hash, admin_hash):
            return ADMIN
        team = cache.get(token_hash)
        if team is NOT_CACHED:
            team = await lookup(token_hash)
            cache.put(token_hash, team)
        if team is None:
            raise unauthorized("unknown token: use the token printed when the team was created "
                                "(or last rotated)")
        return Principal(team)

    return principal


def bearer_hash(request: Request) -> str:
    """The hash of the request's bearer token (401 without one)."""
    header = request.headers.get("authorization")
    if not header:
        raise unauthorized("no token: send `Authorization: Bearer <token>`")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("the Authorization header must be `Bearer <token>`")
    return hash_token(token)


def unauthorized(detail: str) -> ApiProblem:
    return ApiProblem(UNAUTHORIZED, detail, headers={"WWW-Authenticate": 'Bearer realm="minutehand"'})


def checked_before_body(name: str, check: Callable[[Request], Awaitable[Any]]) -> tuple[Callable, Provide]:
    """The credential dependency `name` (its value: what `check` returns) and
    a before_request hook that runs the check first for handlers that take
    it and a body: Litestar reads and decodes a typed body before it
    resolves dependencies, and a caller without a credential is answered
    401, not what its body lacks, before its body is read. A handler with
    opt `admin_only` refuses any other credential (403) before the body too."""
    key = f"minutehand.{name}"

    async def before(request: Request) -> None:
        handler = request.route_handler
        if handler.parsed_data_field is not None and name in handler.parsed_fn_signature.parameters:
            credential = request.scope[key] = await check(request)      # type: ignore[literal-required]
            if handler.opt.get("admin_only"):
                credential.require_admin()

    async def dependency(request: Request) -> Any:
        scope = request.scope
        return scope[key] if key in scope else await check(request)    # type: ignore[literal-required]

    return before, Provide(dependency)
