"""The local demo's reads (minutehand dev) and the drain of
minutehand.testing: each may read the whole wheel or jobs table, so for a
small local instance or a test database only (sql/queries/dev.sql)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from minutehand.store.base import StoreBase


class DevStore(StoreBase):
    """The local demo's and the test drain's reads, a part of Store."""

    def due_unclaimed(self, team: str, names: list[str], cap: int) -> int:
        """How many of the team's jobs of these names are due and unclaimed (at most cap)."""
        return self._all_at_now("due_unclaimed", {"team": team, "names": names, "cap": cap})[0]["n"]

    def unstarted_jobs(self, team: str, names: list[str], *, soon_s: float) -> list[dict[str, Any]]:
        """The team's unstarted jobs of these names: id, and soon (due within
        soon_s). Reads the whole wheel: for a small local instance only."""
        return self._all_at_now("unstarted_jobs", {"team": team, "names": names, "soon_s": soon_s})

    def outstanding_jobs(self, names: list[str], teams: list[str] | None,
                         retry_horizon: dt.datetime | None) -> list[int]:
        """Ids of the jobs of these names (and teams) not yet finished that are
        due (retries by retry_horizon) or being run. Reads the whole jobs
        table: for test databases only (minutehand.testing's drain)."""
        rows = self._all_at_now("outstanding_jobs", {"names": names, "teams": teams, "retry_horizon": retry_horizon})
        return [r["id"] for r in rows]
