"""Repeating jobs: the chain that creates each series' next run, and a
team's reads and control of its series (sql/queries/series.sql)."""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from minutehand.store import errors, repeat
from minutehand.store.base import StoreBase
from minutehand.store.queries import q
from minutehand.store.records import Repeat


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeriesRun:
    """One run of a series, as its listing shows it."""
    job_id: int
    due_at: dt.datetime
    agreed_at: dt.datetime        # the run time agreed when the run was created
    run_at: dt.datetime
    state: str
    attempts: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str | None


@dataclass(frozen=True)
class SeriesDetail:
    """A series: what each run is made of, its repeat spec and misfire
    policy, its state (active, paused, cancelled), the chain's columns, its
    waiting run (the newest) and its newest runs."""
    series_id: int
    team: str
    name: str
    payload: Any
    priority: int
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    flex_s: int
    strict: bool
    every_s: int | None
    cron: str | None
    timezone: str | None
    misfire: str
    state: str
    first_due_at: dt.datetime
    last_due_at: dt.datetime
    chain_after: dt.datetime | None
    paused_at: dt.datetime | None
    cancelled_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    last_job_id: int
    last_job_state: str | None
    last_job_run_at: dt.datetime | None
    now: dt.datetime               # the database's clock when read
    runs: list[SeriesRun] = field(default_factory=list)   # newest first

    @property
    def repeat(self) -> Repeat:
        return Repeat(self.every_s, self.cron, self.timezone)


@dataclass(frozen=True)
class SeriesSummary:
    """A series as a listing shows it."""
    series_id: int
    name: str
    every_s: int | None
    cron: str | None
    timezone: str | None
    misfire: str
    state: str
    first_due_at: dt.datetime
    last_due_at: dt.datetime
    last_job_id: int
    created_at: dt.datetime


@dataclass(frozen=True)
class SeriesPage:
    series: list[SeriesSummary]
    next_cursor: int | None        # pass as after= for the next (older) page; None: no more


@dataclass(frozen=True)
class SeriesControl:
    """The answer to a pause, resume, cancel or change of a series."""
    series_id: int
    state: str                     # after the call: active, paused or cancelled
    changed: bool                  # False: the series already was so (nothing written)
    cancelled_run: int | None      # the waiting run this call cancelled (None: none had not started)


class SeriesStore(StoreBase):
    """Repeating jobs, a part of Store."""

    # ------------------------------------------------------------ the chain of repeating jobs
    def continue_series(self, shards: Sequence[int], limit: int = 1000, *, default_ceiling: int = 0) -> int:
        """Create the next run of up to `limit` marked series of these shards
        (sql/functions/chain.sql), admitted against their teams' limits
        (default_ceiling: the pending ceiling of a team without its own, 0:
        none); returns how many runs were created. Fire times are computed
        here, between the read and the write, in no transaction; each shard's
        runs are created in its own transaction, all in one round trip. On
        Citus, the shards of a worker node that could not be reached wait."""
        rows, _ = self._all_reachable("series_to_chain", list(shards),
                                      lambda part, routed: {"shards": part, "limit": limit}, "series chain")
        by_shard: dict[int, list[tuple]] = {}
        for r in rows:
            spec = Repeat(r["every_s"], r["cron"], r["timezone"], r["misfire"])
            try:
                if r["held_due_at"] is not None:
                    # The run the pending ceiling held back, due at its own fire time
                    # (skip: dropped at the first fire time after it is created).
                    due = r["held_due_at"]
                    deadline = (repeat.next_fire(spec, r["first_due_at"], max(due, r["now"]), r["now"])
                                if spec.misfire == "skip" else None)
                else:
                    due, deadline = repeat.next_run(spec, r["first_due_at"], r["chain_after"], r["now"])
            except ValueError:            # a zone the server no longer knows: looked at again in a day
                log.exception("series %s: its next fire time cannot be computed", r["series_id"])
                due, deadline = None, None
            by_shard.setdefault(r["shard"], []).append((r["series_id"], r["chain_after"], due, deadline))
        if not by_shard:
            return 0
        # The shard with the run due first goes first: where a team's pending
        # ceiling leaves room for fewer runs than want it, the runs due first
        # get it (within a shard chain_series sees to that).
        never = dt.datetime.max.replace(tzinfo=dt.timezone.utc)

        def first_due(items: list[tuple]) -> dt.datetime:
            return min((i[2] for i in items if i[2] is not None), default=never)

        params = [{"shard": shard, "series": [i[0] for i in items], "after": [i[1] for i in items],
                   "due": [i[2] for i in items], "deadline": [i[3] for i in items],
                   "default_ceiling": default_ceiling}
                  for shard, items in sorted(by_shard.items(), key=lambda kv: first_due(kv[1]))]
        with self.connection() as conn:
            results = self.each_alone(conn, q("chain_series"), params)
        created = 0
        for result in results:
            if isinstance(result, Exception):
                raise result
            created += len(result)
        return created

    # ------------------------------------------------------------ series control
    SERIES_RUNS = 10            # the newest runs a series' detail shows
    SERIES_PAGE_MAX = 1000

    def series(self, team: str, series_id: int, *, runs: int = SERIES_RUNS) -> SeriesDetail:
        """One of the team's series with its `runs` newest runs, newest first,
        read in one transaction; raises NotFound (another team's series too)."""
        def run() -> SeriesDetail:
            with self.connection() as conn, conn.transaction():
                row = conn.execute(q("series_detail"), {"team": team, "series_id": series_id}).fetchone()
                found = conn.execute(q("series_runs"), {"team": team, "series_id": series_id,
                                                         "limit": runs}).fetchall()
            return SeriesDetail(**row, runs=[SeriesRun(**r) for r in found])
        return self.retrying(run)

    def series_runs(self, team: str, series_id: int, *, limit: int = SERIES_RUNS) -> list[SeriesRun]:
        """The series' newest runs, newest first (none for another team's series)."""
        return [SeriesRun(**r) for r in self._all("series_runs", {"team": team, "series_id": series_id,
                                                                   "limit": limit})]

    def list_series(self, team: str, *, after: int | None = None, limit: int = 100) -> SeriesPage:
        """The team's series with id < after, newest first; one page of at most `limit`."""
        rows = self._all("list_series", {"team": team, "after": after, "limit": limit + 1})
        page = [SeriesSummary(**r) for r in rows[:limit]]
        return SeriesPage(page, page[-1].series_id if len(rows) > limit else None)

    def pause_series(self, team: str, series_id: int) -> SeriesControl:
        return self._control("pause_series", {"team": team, "series_id": series_id})

    def resume_series(self, team: str, series_id: int) -> SeriesControl:
        return self._control("resume_series", {"team": team, "series_id": series_id})

    def cancel_series(self, team: str, series_id: int) -> SeriesControl:
        return self._control("cancel_series", {"team": team, "series_id": series_id})

    def change_series(self, team: str, series_id: int, repeat_spec: Repeat, misfire: str | None = None
                      ) -> SeriesControl:
        """A new repeat spec (and misfire policy; None keeps it) from the next
        run. A cron expression is checked with APScheduler first, and must
        fire within the horizon (searched from the database's clock, outside
        any transaction): InvalidInput otherwise, nothing written."""
        if reason := repeat.problem(repeat_spec):
            raise errors.InvalidInput(reason)
        if repeat_spec.cron is not None:
            try:
                repeat.first_due(repeat_spec, None, self._db_now())
            except ValueError as exc:
                raise errors.InvalidInput(str(exc)) from None
        return self._control("change_series", {"team": team, "series_id": series_id,
                                               "every_s": repeat_spec.every_s, "cron": repeat_spec.cron,
                                               "timezone": repeat_spec.timezone, "misfire": misfire})

    def _control(self, name: str, params: dict[str, Any]) -> SeriesControl:
        return SeriesControl(**self._one(name, params))
