"""Teams: their settings, their admission (a submission rate and a ceiling
of pending jobs) and their tokens; and the workers' tokens
(sql/queries/teams.sql)."""
from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from minutehand.store import errors
from minutehand.store.base import _JOINED, StoreBase, T
from minutehand.store.queries import q


# update_team: a limit or the retention left as it is (None clears a limit,
# or sets the retention back to the server's).
KEEP: Any = object()


@dataclass(frozen=True)
class TeamSettings:
    """A team as an administrator sees it (never its token). submit_rate and
    submit_burst: its token bucket (None: no rate limit); max_pending: its
    pending ceiling (None: the server's max_pending_per_team)."""
    name: str
    quota: int
    weight: int
    created_at: dt.datetime
    submit_rate: float | None = None
    submit_burst: int | None = None
    max_pending: int | None = None
    retention_s: int | None = None     # its finished jobs are kept this long (None: the server's setting)


@dataclass(frozen=True)
class Admitted:
    """How many of a submission's jobs a team may write now (mh_admit).
    limited_by: 'pending', 'rate' or 'burst' when fewer than asked, else
    None; retry_after_s under 'rate'; pending and ceiling when the team has
    a ceiling; rate and burst: its token bucket (None: no rate limit)."""
    admitted: int
    limited_by: str | None
    retry_after_s: float | None
    pending: int | None
    ceiling: int | None
    rate: float | None
    burst: int | None


@dataclass(frozen=True)
class TeamPage:
    teams: list[TeamSettings]
    next_cursor: str | None  # the last name: pass as after= for the next page; None: no more


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def pending_ceiling(team: str, refused: int, pending: int, ceiling: int) -> errors.PendingCeiling:
    """The refusal of `refused` jobs that would take the team past its ceiling."""
    jobs = f"{refused:,} job{'s' if refused != 1 else ''}"
    return errors.PendingCeiling(
        f"team {team!r} has {pending:,} jobs pending (submitted and not finished), and its ceiling is "
        f"{ceiling:,}: {jobs} more would pass it. Submit again when jobs have finished", pending, ceiling)


class TeamStore(StoreBase):
    """Teams and workers' tokens, a part of Store."""

    # Why teams refused a value, by the constraint it broke.
    TEAM_CHECKS = {
        "teams_name_check": "a team name must be 1 to 63 characters: lowercase letters, digits, _ . -, starting "
                            "with a letter or digit",
        "teams_quota_check": f"quota must be a whole number from 1 to {2**31 - 1}",
        "teams_weight_check": f"weight must be a whole number from 1 to {2**31 - 1}",
        "teams_submit_rate_check": "submit_rate must be a number of jobs per second above 0, at most 1,000,000 "
                                   "(null: no rate limit)",
        "teams_submit_burst_check": f"submit_burst must be a whole number from 1 to {2**31 - 1}",
        "teams_max_pending_check": f"max_pending must be a whole number from 1 to {2**31 - 1} (null: the "
                                   "server's max_pending_per_team)",
        "teams_submit_limit_check": "submit_burst goes with a submit_rate: set a rate too (or clear both: "
                                    "submit_rate null)",
        "teams_retention_s_check": "retention_s must be a whole number of seconds from 1 to 315360000 (null: the "
                                   "server's job_retention_s)",
    }

    def _team_refusal(self, exc: psycopg.Error) -> errors.InvalidInput:
        # On Citus the check fails in a placement of the reference table on
        # a node, and the error that comes back names the constraint only in
        # its message ('... violates check constraint "teams_quota_check"').
        constraint = exc.diag.constraint_name
        if constraint is None and (named := re.search(r'check constraint "([^"]+)"', exc.diag.message_primary or "")):
            constraint = named.group(1)
        return errors.InvalidInput(self.TEAM_CHECKS.get(
            constraint, f"quota, weight, submit_burst and max_pending must be whole numbers from 1 to {2**31 - 1}"))

    def create_team(self, name: str, *, quota: int = 1000, weight: int = 1, submit_rate: float | None = None,
                    submit_burst: int | None = None, max_pending: int | None = None,
                    retention_s: int | None = None) -> str:
        """Create a team; returns its bearer token (only its hash is stored).
        submit_rate None: no rate limit; a rate without a burst gets one
        second's worth. max_pending None: the server's setting applies.
        retention_s None: its finished jobs are kept as the server's setting says."""
        token = "mh_" + secrets.token_urlsafe(24)
        try:
            row = self._one("create_team", {"name": name, "quota": quota, "weight": weight,
                                            "token_hash": hash_token(token), "submit_rate": submit_rate,
                                            "submit_burst": submit_burst, "max_pending": max_pending,
                                            "retention_s": retention_s})
        except (psycopg.errors.CheckViolation, psycopg.errors.NumericValueOutOfRange) as exc:
            raise self._team_refusal(exc) from None
        if row is None:
            raise errors.Conflict(f"team {name!r} already exists")
        return token

    def update_team(self, name: str, *, quota: int | None = None, weight: int | None = None,
                    submit_rate: float | None | object = KEEP, submit_burst: int | None | object = KEEP,
                    max_pending: int | None | object = KEEP, retention_s: int | None | object = KEEP
                    ) -> TeamSettings:
        """Set a team's quota and/or weight (None keeps it), its admission
        limits and its retention (KEEP keeps one, None clears it: no limit,
        or the server's setting), in one statement; raises NotFound, or
        InvalidInput for a value the columns refuse. A rate set without a
        burst keeps the burst the team had, or gets one second's worth; a
        rate cleared clears the burst."""
        kept = {"submit_rate": submit_rate, "submit_burst": submit_burst, "max_pending": max_pending,
                "retention_s": retention_s}
        if quota is None and weight is None and all(v is KEEP for v in kept.values()):
            raise errors.InvalidInput("give a quota, a weight, an admission limit or a retention")
        params = {"name": name, "quota": quota, "weight": weight,
                  "set_rate": submit_rate is not KEEP, "set_burst": submit_burst is not KEEP,
                  "set_max_pending": max_pending is not KEEP, "set_retention": retention_s is not KEEP,
                  **{k: (None if v is KEEP else v) for k, v in kept.items()}}
        try:
            row = self._one("update_team", params)
        except (psycopg.errors.CheckViolation, psycopg.errors.NumericValueOutOfRange) as exc:
            raise self._team_refusal(exc) from None
        if row is None:
            raise errors.NotFound(f"no such team {name!r}")
        return TeamSettings(**row)

    def admit(self, team: str, jobs: int, *, at_least: int, default_ceiling: int = 0) -> Admitted:
        """How many of `jobs` the team may submit now, at least `at_least` or
        none, their tokens taken (sql/functions/admission.sql); default_ceiling:
        the pending ceiling of a team without its own (0: none). Raises
        NotFound for an unknown team."""
        row = self._one("admit", {"team": team, "jobs": jobs, "at_least": at_least,
                                  "default_ceiling": default_ceiling})
        return Admitted(**row)

    def under_ceiling(self, team: str, jobs: int, write: Callable[[], T], *, default_ceiling: int = 0) -> T:
        """write() (store calls that write up to `jobs` jobs of the team) in one
        transaction that first checks the team's pending ceiling again, under
        the team's lock, held until the jobs are committed (mh_hold_pending):
        concurrent writers of the team take turns, so together they cannot
        pass it. PendingCeiling (nothing written) if the jobs would pass it;
        default_ceiling: the ceiling of a team without its own (0: none)."""
        def run() -> T:
            with self.connection() as conn, conn.transaction():
                held = conn.execute(q("hold_pending"), {"team": team, "jobs": jobs,
                                                        "default_ceiling": default_ceiling}).fetchone()
                if held["admitted"] < jobs:
                    raise pending_ceiling(team, jobs - held["admitted"], held["pending"], held["ceiling"])
                joined = _JOINED.set(conn)
                try:
                    return write()
                finally:
                    _JOINED.reset(joined)
        return self.retrying(run)

    def team(self, name: str) -> TeamSettings | None:
        row = self._one("team", {"name": name})
        return TeamSettings(**row) if row else None

    def list_teams(self, *, after: str | None = None, limit: int = 100) -> TeamPage:
        """Teams by name after `after`; one page of at most `limit`."""
        rows = self._all("list_teams", {"after": after, "limit": limit + 1})
        teams = [TeamSettings(**r) for r in rows[:limit]]
        return TeamPage(teams, teams[-1].name if len(rows) > limit else None)

    def team_exists(self, name: str) -> bool:
        return self._one("team_exists", {"name": name})["exists"]

    def team_for_token(self, token_hash: str) -> str | None:
        """The name of the team whose token has this hash (see hash_token), or None."""
        row = self._one("team_by_token", {"token_hash": token_hash})
        return row["name"] if row else None

    def rotate_token(self, team: str) -> str:
        """A new token for the team (the old one stops working); raises NotFound."""
        token = "mh_" + secrets.token_urlsafe(24)
        if self._one("set_team_token", {"name": team, "token_hash": hash_token(token)}) is None:
            raise errors.NotFound(f"no such team {team!r}")
        return token

    # ------------------------------------------------------------ workers' tokens
    def create_worker_token(self, name: str) -> str:
        """Create (or rotate) a worker credential; returns its token (only the hash is stored)."""
        token = "mhw_" + secrets.token_urlsafe(24)
        self._one("set_worker_token", {"name": name, "token_hash": hash_token(token)})
        return token

    def worker_for_token(self, token_hash: str) -> str | None:
        row = self._one("worker_by_token", {"token_hash": token_hash})
        return row["name"] if row else None
