"""Admission control: whether a team may submit jobs now, decided before
anything is written. Two limits, set per team by the admin (through the
API or the admin UI): a submission rate (a token bucket: submit_rate jobs
a second, submit_burst at once) and a ceiling of jobs submitted and not
finished (max_pending, or the server's max_pending_per_team). A batch
counts its jobs; a series its first run.

The decision is the database's (mh_admit, sql/functions/admission.sql): the
bucket is one row per team, so every server process draws on the same
tokens, and the pending count is kept by the transactions that create and
finish jobs. A team with neither limit costs no call: whether it has one is
remembered for admission_cache_s (a limit set through another process
applies within that time; through this one, at once).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from minutehand.settings import Settings
from minutehand.store import errors
from minutehand.store.store import Store
from minutehand.store.teams import Admitted


class Admission:
    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.default_ceiling = settings.max_pending_per_team
        self.cache_s = settings.admission_cache_s
        self.clock = clock
        self._limited: dict[str, tuple[bool, float]] = {}     # team -> (has a limit, until)

    def limited(self, team: str) -> bool:
        """Whether the team's submissions are checked (an unknown team is not:
        its submission answers 404 as before)."""
        if self.default_ceiling:
            return True
        now = self.clock()
        known = self._limited.get(team)
        if known is not None and known[1] > now:
            return known[0]
        settings = self.store.team(team)
        limited = settings is not None and (settings.submit_rate is not None or settings.max_pending is not None)
        self._limited[team] = (limited, now + self.cache_s)
        return limited

    def forget(self, team: str) -> None:
        """The team's limits changed: read them again at its next submission."""
        self._limited.pop(team, None)

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
        return errors.PendingCeiling(
            f"team {team!r} has {a.pending:,} jobs pending (submitted and not finished), and its ceiling is "
            f"{a.ceiling:,}: {jobs} more would pass it. Submit again when jobs have finished", a.pending, a.ceiling)
    if a.limited_by == "burst":
        return errors.PayloadTooLarge(
            f"{jobs} at once are more than team {team!r} may ever submit at once (its submission rate limit "
            f"lets in at most {a.burst:,} at once): split the batch")
    return errors.RateLimited(
        f"team {team!r} may submit {a.rate:g} jobs a second, up to {a.burst:,} at once: {jobs} refused, "
        f"nothing written. Retry after {a.retry_after_s:.2f} s", a.retry_after_s)
