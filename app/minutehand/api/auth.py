"""Bearer tokens -> who is calling: a team, or the admin.

Only hashes are compared: a team's token against teams.token_hash (through
the store, remembered for a few seconds in a small in-process cache, so a
busy client costs one lookup per cache period, not one per request), the
admin token against the hash of the admin_token setting. A team acts on its
own jobs only; the admin on every team's.
"""
from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.di import Provide

from minutehand.api.problems import FORBIDDEN, INVALID, NOT_FOUND, UNAUTHORIZED, ApiProblem
from minutehand.store.store import hash_token


@dataclass(frozen=True)
class Principal:
    team: str | None          # None: the admin

    @property
    def is_admin(self) -> bool:
        return self.team is None

    def own_team(self, team: str | None) -> str:
        """The one team a write, listing or stats request acts for. A team acts
        for itself (naming another team is "no such team", as for its jobs);
        the admin must name one."""
        if self.team is not None:
            if team is not None and team != self.team:
                raise ApiProblem(NOT_FOUND, f"no such team {team!r}")
            return self.team
        if team is None:
            raise ApiProblem(INVALID, "an admin token acts for every team: name one with ?team=NAME")
        return team

    def path_team(self, name: str) -> str:
        """The team a /v1/teams/{name}/... path names: `me` is the token's own
        team (the admin has none), any other name as own_team says."""
        if self.is_admin and name == "me":
            raise ApiProblem(INVALID, "the admin token has no team of its own: name the team")
        return self.own_team(None if name == "me" else name)

    def scope(self, team: str | None) -> str | None:
        """The team filter of a read or cancel by id: a team sees only its own
        jobs; the admin every team's (None), or one team's if it names one."""
        return self.own_team(team) if self.team is not None or team is not None else None

    def require_admin(self) -> None:
        if not self.is_admin:
            raise ApiProblem(FORBIDDEN, "this needs the admin token (MINUTEHAND_ADMIN_TOKEN), not a team's")


ADMIN = Principal(None)
_MISSING = object()


class TokenCache:
    """token hash -> team name (or None: no such token), for ttl_s seconds,
    at most max_entries (least recently used dropped first). Bad tokens are
    remembered too, so guessing costs no database round trip per try."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token_hash: str):
        """The cached team (or None for a bad token), or _MISSING."""
        with self._lock:
            hit = self._entries.get(token_hash)
            if hit is None:
                return _MISSING
            if hit[0] < time.monotonic():
                del self._entries[token_hash]
                return _MISSING
            self._entries.move_to_end(token_hash)
            return hit[1]

    def put(self, token_hash: str, team: str | None) -> None:
        with self._lock:
            self._entries[token_hash] = (time.monotonic() + self.ttl_s, team)
            self._entries.move_to_end(token_hash)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget_team(self, team: str) -> None:
        """Drop a team's entries (its token was rotated in this process)."""
        with self._lock:
            for h in [h for h, (_, t) in self._entries.items() if t == team]:
                del self._entries[h]


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
        if team is _MISSING:
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
