"""Who is calling, as both HTTP apps know it: a team, or the admin (a
Principal), and the token cache that maps a token's hash to its team.

The API reads a bearer token into a Principal (app/minutehand/api/auth.py);
the admin UI a signed-in session (app/minutehand/admin/access.py). A team
acts on its own jobs only; the admin on every team's.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from minutehand.web.problems import FORBIDDEN, INVALID, NOT_FOUND, ApiProblem


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
# What TokenCache.get answers for a hash it does not hold (None is a cached bad token).
NOT_CACHED = object()


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
        """The cached team (or None for a bad token), or NOT_CACHED."""
        with self._lock:
            hit = self._entries.get(token_hash)
            if hit is None:
                return NOT_CACHED
            if hit[0] < time.monotonic():
                del self._entries[token_hash]
                return NOT_CACHED
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
