"""Default flex windows: the window a job of a name gets when its
submission gives none, a team's or the operator's (sql/queries/spread.sql)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from minutehand.store.base import StoreBase


@dataclass(frozen=True)
class FlexDefault:
    """A default flex window: of a job name (job_name), or of cron series on
    round minutes (job_name None); a team's (team) or the operator's, for
    every team (team None)."""
    team: str | None
    job_name: str | None
    flex_s: int
    updated_at: dt.datetime


class SpreadStore(StoreBase):
    """Default flex windows, a part of Store."""

    def set_flex_default(self, team: str | None, job_name: str | None, flex_s: int) -> FlexDefault:
        """Set the default window of a job name (None: of cron series on round
        minutes) for a team (None: the operator's, for every team). Raises
        InvalidInput or NotFound (no such team)."""
        return FlexDefault(**self._one("set_flex_default", {"team": team, "job_name": job_name, "flex_s": flex_s}))

    def delete_flex_default(self, team: str | None, job_name: str | None) -> bool:
        """Remove one; False if there was none. Raises NotFound (no such team)."""
        return self._one("delete_flex_default", {"team": team, "job_name": job_name})["deleted"]

    def flex_defaults(self, team: str | None, *, after: str | None = None,
                      limit: int = 1000) -> tuple[list[FlexDefault], str | None]:
        """A team's (None: the operator's) default windows, the round-cron
        rule first, then by job name after `after`; one page and the cursor
        of the next (None: no more). Raises NotFound (no such team)."""
        rows = [FlexDefault(**r) for r in self._all("flex_defaults", {"team": team, "after": after,
                                                                         "limit": limit + 1})]
        # the round-cron rule sorts first, as job name '' (a cursor of '' goes on after it)
        return rows[:limit], ((rows[limit - 1].job_name or "") if len(rows) > limit else None)
