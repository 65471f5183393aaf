"""The counters of team_stats read: a team's statistics and the fleet's,
and what /metrics reads of the jobs (sql/queries/stats.sql)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from minutehand.store.base import StoreBase
from minutehand.store.queries import q


# Histogram bucket bounds of the statistics, in seconds (mh_stats_bounds()):
# bucket i counts values in (BOUNDS[i-1], BOUNDS[i]]; the first counts
# values <= 0, the last (no upper bound) those over an hour.
STATS_BOUNDS_S = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def quantile_bound(hist: Sequence[int], q: float) -> float | None:
    """The upper bound (s) of the bucket holding the q-quantile of a
    histogram; None when it is empty or the quantile lies in the last bucket
    (beyond the last bound)."""
    total = sum(hist)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return STATS_BOUNDS_S[i] if i < len(STATS_BOUNDS_S) else None
    return None


@dataclass(frozen=True)
class Tally:
    """Counts of events in a window (team_stats rows added up)."""
    submitted: int = 0        # jobs created (an idempotency replay creates none)
    started: int = 0          # jobs started for the first time (a retry's start is not counted again)
    succeeded: int = 0
    failed: int = 0           # failures that were retried
    dead: int = 0             # jobs set aside: failed or claim expired on the last attempt
    cancelled: int = 0
    lateness_hist: tuple[int, ...] = (0,) * (len(STATS_BOUNDS_S) + 1)   # first start - agreed_at
    runtime_hist: tuple[int, ...] = (0,) * (len(STATS_BOUNDS_S) + 1)    # finished_at - started_at

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.submitted + other.submitted, self.started + other.started,
                     self.succeeded + other.succeeded, self.failed + other.failed, self.dead + other.dead,
                     self.cancelled + other.cancelled,
                     tuple(a + b for a, b in zip(self.lateness_hist, other.lateness_hist)),
                     tuple(a + b for a, b in zip(self.runtime_hist, other.runtime_hist)))

    @property
    def volume(self) -> int:
        return self.submitted + self.started + self.succeeded + self.failed + self.dead + self.cancelled


@dataclass(frozen=True)
class MetricsRead:
    """One read of the jobs for /metrics (Store.metrics_read)."""
    line: dt.datetime                                  # team_stats rows below it no longer change
    below: dict[tuple[str, str], Tally]                # (team, name): added up from the last line to this one
    recent: dict[tuple[str, str], Tally]               # (team, name): added up from this line on
    running: dict[str, tuple[int, int]]                # team: (jobs claimed and not finished, quota)
    depth: dict[str, int]                              # current_minute, next_minute (counted); minutes, hours, far


@dataclass(frozen=True)
class TeamStats:
    """A team's counters over a window, by job name: the names of most
    volume one by one, the rest added up in `other`."""
    team: str
    quota: int
    running: int                   # claimed or running now (team_running)
    window_start: dt.datetime      # the counters cover [window_start, now]
    total: Tally
    names: dict[str, Tally]        # most volume first
    other: Tally | None            # the names beyond the first STATS_NAMES, added up
    other_names: int               # how many names `other` holds (a team's names past its first
                                   # mh_stats_names(), counted together, count as one)


@dataclass(frozen=True)
class FleetTeam:
    team: str
    quota: int
    running: int
    tally: Tally


@dataclass(frozen=True)
class FleetStats:
    window_start: dt.datetime
    teams: list[FleetTeam]         # every team, by name
    total: Tally
    running: int


def _tally(row: dict[str, Any]) -> Tally:
    """A Tally from a row of the stats queries (NULL counts: none)."""
    if row.get("submitted") is None:
        return Tally()
    return Tally(row["submitted"], row["started"], row["succeeded"], row["failed"], row["dead"], row["cancelled"],
                 tuple(row["lateness_hist"]), tuple(row["runtime_hist"]))


class StatsStore(StoreBase):
    """The counters read, a part of Store."""

    # The longest window the counters answer for, and how many job names a
    # team's answer lists one by one (the rest are added up as "other"): all
    # the names the counters keep apart (mh_stats_names()).
    STATS_MAX_WINDOW_S = 30 * 86400
    STATS_NAMES = 50

    def team_stats(self, team: str, *, window_s: int = 86400, names: int = STATS_NAMES) -> TeamStats | None:
        """A team's counters over the last window_s seconds (from team_stats,
        never the jobs): totals, the `names` job names of most volume, the
        rest added up; running now vs quota. None if there is no such team."""
        rows = self._all("team_stats", {"team": team, "window_s": window_s, "names": names})
        if not rows:
            return None
        first = rows[0]
        by_name = {r["name"]: _tally(r) for r in rows if r["name"] is not None}
        other = next((r for r in rows if r["name"] is None and r["other_names"]), None)
        total = sum(by_name.values(), _tally(other) if other else Tally())
        names_sorted = dict(sorted(by_name.items(), key=lambda kv: (-kv[1].volume, kv[0])))
        return TeamStats(first["team"], first["quota"], first["running"], first["window_start"], total,
                         names_sorted, _tally(other) if other else None, other["other_names"] if other else 0)

    def fleet_stats(self, *, window_s: int = 86400) -> FleetStats:
        """Every team's counters over the last window_s seconds, and the sums."""
        rows = self._all("fleet_stats", {"window_s": window_s})
        teams = [FleetTeam(r["team"], r["quota"], r["running"], _tally(r)) for r in rows]
        start = rows[0]["window_start"] if rows else self._one("fleet_window", {"window_s": window_s})["t"]
        return FleetStats(start, teams, sum((t.tally for t in teams), Tally()), sum(t.running for t in teams))

    # ------------------------------------------------------------ metrics (app/minutehand/api/metrics.py)
    def metrics_read(self, counted_to: dt.datetime | None) -> MetricsRead:
        """What /metrics reads of the jobs, in one transaction with no
        parallel workers (a scrape's few small reads must not take the
        workers, or the shared memory, of the hot path): the line below
        which team_stats rows no longer change (metrics_clock);
        team_stats added up per (team, job name) from counted_to (None: the
        first row) to the line, and from the line on; running and quota per
        team; the depth of the wheel (metrics_due_depth)."""
        def totals(conn: psycopg.Connection, since: dt.datetime | None,
                   until: dt.datetime | None) -> dict[tuple[str, str], Tally]:
            return {(r["team"], r["name"]): _tally(r)
                    for r in conn.execute(q("metrics_job_totals"), {"since": since, "until": until})}

        with self.connection() as conn, conn.transaction():
            conn.execute(q("no_parallel_workers"))
            clock = conn.execute(q("metrics_clock")).fetchone()
            line = clock["line"]
            if counted_to is not None and line <= counted_to:      # (a clock set back: tests)
                line, below = counted_to, {}
            else:
                below = totals(conn, counted_to, line)
            return MetricsRead(line, below, totals(conn, line, None),
                               {r["team"]: (r["running"], r["quota"]) for r in conn.execute(q("metrics_running"))},
                               {k: int(v) for k, v in conn.execute(q("metrics_due_depth"), clock).fetchone().items()})
