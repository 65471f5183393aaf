"""Admission control: whether a team may submit jobs now, decided before
anything is written. Two limits, set per team by the admin (through the
API or the admin UI): a submission rate (a token bucket: submit_rate jobs
a second, submit_burst at once) and a ceiling of jobs submitted and not
finished (max_pending, or the server's max_pending_per_team). A batch
counts its jobs; a series its first run (its later runs are admitted by
the chain: sql/functions/chain.sql); a requeue of dead jobs the jobs it
puts back.

The decision is the database's (mh_admit, sql/functions/admission.sql): the
bucket is one row per team, so every server process draws on the same
tokens, and the pending count is kept by the transactions that create and
finish jobs. The count is read before the tokens are taken (a team at its
ceiling takes none), and for a team with a ceiling read again in the
transaction that writes the jobs, under a lock per team held until they
are committed (written(), Store.under_ceiling): concurrent submissions of
a team cannot pass its ceiling together. A team with neither limit costs
no call: which limits it has is remembered for admission_cache_s (a limit
set through another process applies within that time; through this one,
at once).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from minutehand.settings import Settings
from minutehand.store import errors
from minutehand.store.store import Store
from minutehand.store.teams import Admitted, pending_ceiling

T = TypeVar("T")


class Admission:
    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.default_ceiling = settings.max_pending_per_team
        self.cache_s = settings.admission_cache_s
        self.clock = clock
        self._limits: dict[str, tuple[bool, bool, float]] = {}   # team -> (has a limit, has a ceiling, until)

    def limited(self, team: str) -> bool:
        """Whether the team's submissions are checked (an unknown team is not:
        its submission answers 404 as before)."""
        return self._limits_of(team)[0]

    def _limits_of(self, team: str) -> tuple[bool, bool]:
        """(whether the team has any limit, whether it has a pending ceiling)."""
        if self.default_ceiling:
            return True, True
        now = self.clock()
        known = self._limits.get(team)
        if known is not None and known[2] > now:
            return known[0], known[1]
        settings = self.store.team(team)
        ceiling = settings is not None and settings.max_pending is not None
        limited = ceiling or (settings is not None and settings.submit_rate is not None)
        self._limits[team] = (limited, ceiling, now + self.cache_s)
        return limited, ceiling

    def forget(self, team: str) -> None:
        """The team's limits changed: read them again at its next submission."""
        self._limits.pop(team, None)

    def admitted(self, team: str, jobs: int, write: Callable[[], T]) -> T:
        """write() — which writes up to `jobs` jobs of the team — once all of
        them are admitted (else the refusal, nothing written): admit_all,
        then write() as written() runs it."""
        self.admit_all(team, jobs)
        return self.written(team, jobs, write)

    def written(self, team: str, jobs: int, write: Callable[[], T]) -> T:
        """write(), which writes `jobs` jobs of the team that admission let
        in; for a team with a pending ceiling, in one transaction with the
        ceiling checked again first, under the team's lock until the jobs
        are committed (PendingCeiling if they would pass it now, nothing
        written)."""
        if jobs == 0 or not self._limits_of(team)[1]:
            return write()
        return self.store.under_ceiling(team, jobs, write, default_ceiling=self.default_ceiling)

    def admit_all(self, team: str, jobs: int) -> None:
        """All `jobs` may be written now (their tokens are taken), or a refusal is raised."""
        admitted, refusal = self._admit(team, jobs, jobs)
        if refusal is not None:
            raise refusal

    def admit_some(self, team: str, jobs: int) -> tuple[int, errors.StoreError | None]:
        """How many of `jobs` may be written now (their tokens taken), and the
        refusal the others get (None if all may)."""
        return self._admit(team, jobs, 1)

    def _admit(self, team: str, jobs: int, at_least: int) -> tuple[int, errors.StoreError | None]:
        if jobs == 0 or not self.limited(team):
            return jobs, None
        a = self.store.admit(team, jobs, at_least=at_least, default_ceiling=self.default_ceiling)
        refused = jobs - a.admitted
        return a.admitted, (refusal(team, refused, a) if refused else None)


def refusal(team: str, refused: int, a: Admitted) -> errors.StoreError:
    """Why `refused` jobs of the team were not admitted, for a person to act on."""
    jobs = f"{refused:,} job{'s' if refused != 1 else ''}"
    if a.limited_by == "pending":
        return pending_ceiling(team, refused, a.pending, a.ceiling)
    if a.limited_by == "burst":
        return errors.PayloadTooLarge(
            f"{jobs} at once are more than team {team!r} may ever submit at once (its submission rate limit "
            f"lets in at most {a.burst:,} at once): split the batch (a requeue by name: a smaller limit)")
    return errors.RateLimited(
        f"team {team!r} may submit {a.rate:g} jobs a second, up to {a.burst:,} at once: {jobs} refused, "
        f"nothing written. Retry after {a.retry_after_s:.2f} s", a.retry_after_s)
