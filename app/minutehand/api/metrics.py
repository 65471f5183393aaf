"""GET /metrics on every serve and dispatcher process: Prometheus text
format (docs/operations/metrics.md).

Three sources, one exposition:
- the process's own families (minutehand.metrics: batch sizes, shard
  leases, database round trips, pool waits) and prometheus_client's
  process and garbage-collector families, from its default registry;
- the HTTP requests, by route template (not the raw path: a job id in a
  path would make a series per job) and status, counted by Litestar's
  Prometheus middleware into the same registry;
- the jobs, read from the database (DatabaseMetrics below).

Why the job counters are read from the database and not counted in
Python as events pass: every state change is counted in team_stats by the
transaction that makes it (sql/tables/stats.sql) — submissions through
SQL's submit_job inside a caller's own transaction, which no minutehand
process sees; the runs the chain creates; jobs set dead by expire_claims in
the dispatchers' SQL maintenance (a claim that lapsed on its last attempt,
which comes back from the database only as a count); cancellations by a
series' pause or a missed run's drop; outcomes written by another
dispatcher. A counter kept in a process would miss those, and lose or
double what a crash between commit and increment left. Read from the table,
the exposed counts are those of the database, exactly: after a run they
equal a recount of the jobs table (tests/test_metrics.py). They are the
same on every process, fleet-wide: aggregate them with max, never sum.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import prometheus_client
from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.plugins.prometheus import PrometheusConfig
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from minutehand.store.stats import STATS_BOUNDS_S, MetricsRead, Tally
from minutehand.store.store import Store
from minutehand.web.context import Context

log = logging.getLogger(__name__)

# The `name` of a team's job names beyond metrics_names_per_team, added up,
# and the name team_stats counts a team's names past its first
# mh_stats_names() under (sql/functions/stats.sql). Not "other": that is a
# valid job name, whose series would be mixed with it.
OTHER = "(other)"
COUNTS = (("submitted", "Jobs submitted (an idempotency replay creates none)"),
          ("started", "Jobs started for the first time (a retry's start is not counted again)"),
          ("succeeded", "Jobs that succeeded"),
          ("failed", "Failures that were retried"),
          ("dead", "Jobs set aside: failed on the last attempt, not retryable, or their claim expired on the "
                   "last attempt (expire_claims)"),
          ("cancelled", "Jobs cancelled before they started"))


def requests_middleware():
    """Litestar's Prometheus middleware: minutehand_requests_total and
    minutehand_request_duration_seconds by method, route template (`path`)
    and status (`status_code`). Buckets up to a minute: a worker's lease
    request long-polls for up to wait_s."""
    return PrometheusConfig(app_name="minutehand", prefix="minutehand", group_path=True,
                            buckets=[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                                     60]).middleware


def _histogram(name: str, doc: str, by_team: dict[str, tuple[int, ...]]) -> HistogramMetricFamily:
    """A histogram of team_stats' buckets (each counts (bound[i-1], bound[i]];
    the last one everything above an hour), cumulative as Prometheus wants
    them. team_stats keeps no sum of the values, so there is no _sum."""
    family = HistogramMetricFamily(name, doc, labels=["team"])
    for team, hist in sorted(by_team.items()):
        running, buckets = 0, []
        for bound, n in zip((*STATS_BOUNDS_S, math.inf), hist):
            running += n
            buckets.append(("+Inf" if bound == math.inf else repr(bound), running))
        family.add_metric([team], buckets, None)
    return family


class DatabaseMetrics(Collector):
    """The jobs as the database counts them, read at most every read_s
    seconds (concurrent scrapes share one read):

    - minutehand_jobs_{submitted,started,succeeded,failed,dead,cancelled}_total
      {team, name}: team_stats added up since the first event. team_stats
      keeps minute rows, folds them into hour rows and, past retention, into
      one row per team and name (purge_stats), so the whole table adds up to
      every event ever counted; never read whole more than once: rows below
      a line two hours back (metrics_clock says why they no longer
      change) are added up once and then only extended, the rows above it
      (a bounded number: two to three hours of minute rows) read each time.
      The roll-up keeps a row on its side of the line; the purge moves rows
      35 days old, long below the line of a process that read since.
    - minutehand_job_start_lag_seconds, minutehand_job_run_seconds {team}:
      team_stats' histograms, the same rows.
    - minutehand_team_running, minutehand_team_quota {team}.
    - minutehand_due_jobs {bucket} (exact: the current and the next minute
      bucket, two partitions) and minutehand_due_jobs_estimated {level}
      (each whole level of the wheel, from the planner's statistics): never a
      read of the pending set (metrics_due_depth).

    Bounded labels: a team's first names_per_team job names (by volume when
    first read) keep a `name` of their own for the life of the process; the
    rest are added up as `(other)`, which only grows, so every series stays a
    counter. Teams need no bound: only an administrator creates them. Nor
    does a read: team_stats keeps a team's names past its first
    mh_stats_names() as one, `(other)` too, so a read adds up at most that
    many names per team, whatever names it used."""

    def __init__(self, store: Store, *, names_per_team: int, read_s: float):
        self.store = store
        self.names_per_team = names_per_team
        self.read_s = read_s
        self._lock = threading.Lock()
        self._line = None                          # below it: added up in _below
        self._below: dict[tuple[str, str], Tally] = {}
        self._named: dict[str, set[str]] = defaultdict(set)   # per team: the names with a label of their own
        self._families: list[Any] = []
        self._read_at = -math.inf

    def refresh(self) -> None:
        """Read the database if the last read is older than read_s (blocking: call from a thread)."""
        with self._lock:
            if time.monotonic() - self._read_at < self.read_s:
                return
            started = time.perf_counter()
            try:
                families = list(self._read())
                ok = 1
            except Exception as exc:          # the process's own families are still worth serving
                log.warning("metrics: reading the database failed: %s", exc)
                families, ok = [], 0
            up = GaugeMetricFamily("minutehand_metrics_database_up", "Whether the last read of the job metrics "
                                   "from the database succeeded (0: the minutehand_jobs_* families are left out)",
                                   value=ok)
            took = GaugeMetricFamily("minutehand_metrics_database_read_seconds", "How long the last read of the "
                                     "job metrics from the database took", value=time.perf_counter() - started)
            self._families = [*families, up, took]
            self._read_at = time.monotonic()

    def collect(self) -> Iterator[Any]:
        return iter(self._families)

    def describe(self) -> list:
        return []

    def _totals(self, read: MetricsRead) -> dict[tuple[str, str], Tally]:
        for key, tally in read.below.items():
            self._below[key] = self._below.get(key, Tally()) + tally
        self._line = read.line
        totals = dict(self._below)
        for key, tally in read.recent.items():
            totals[key] = totals.get(key, Tally()) + tally
        return totals

    def _labelled(self, totals: dict[tuple[str, str], Tally]) -> dict[tuple[str, str], Tally]:
        """Per (team, name label): names beyond the cap added up as OTHER."""
        by_team: dict[str, list[tuple[str, Tally]]] = defaultdict(list)
        for (team, name), tally in totals.items():
            by_team[team].append((name, tally))
        out: dict[tuple[str, str], Tally] = {}
        for team, names in by_team.items():
            named = self._named[team]
            for name, _ in sorted((x for x in names if x[0] not in named and x[0] != OTHER),
                                  key=lambda x: (-x[1].volume, x[0])):
                if len(named) >= self.names_per_team:
                    break
                named.add(name)
            for name, tally in names:
                key = (team, name if name in named else OTHER)
                out[key] = out.get(key, Tally()) + tally
        return out

    def _read(self) -> Iterator[Any]:
        read = self.store.metrics_read(self._line)
        labelled = self._labelled(self._totals(read))
        for field, doc in COUNTS:
            family = CounterMetricFamily(f"minutehand_jobs_{field}", doc + " (from the database: the same on "
                                         "every process)", labels=["team", "name"])
            for (team, name), tally in sorted(labelled.items()):
                family.add_metric([team, name], getattr(tally, field))
            yield family
        teams: dict[str, Tally] = {}
        for (team, _), tally in labelled.items():
            teams[team] = teams.get(team, Tally()) + tally
        yield _histogram("minutehand_job_start_lag_seconds", "First start - agreed run time, per job (from the "
                         "database)", {t: x.lateness_hist for t, x in teams.items()})
        yield _histogram("minutehand_job_run_seconds", "Finished - started, per finished job (from the database)",
                         {t: x.runtime_hist for t, x in teams.items()})
        running = GaugeMetricFamily("minutehand_team_running", "Jobs claimed and not finished now", labels=["team"])
        quota = GaugeMetricFamily("minutehand_team_quota", "Most jobs of the team running at once while other "
                                  "teams have due work waiting", labels=["team"])
        for team, (n, q) in sorted(read.running.items()):
            running.add_metric([team], n)
            quota.add_metric([team], q)
        yield from (running, quota)
        depth = read.depth
        due = GaugeMetricFamily("minutehand_due_jobs", "Jobs waiting in the current and the next minute bucket "
                                "of the wheel (counted)", labels=["bucket"])
        for bucket in ("current_minute", "next_minute"):
            due.add_metric([bucket], depth[bucket])
        estimated = GaugeMetricFamily("minutehand_due_jobs_estimated", "Jobs waiting in each level of the wheel "
                                      "(the planner's estimate, as of the last ANALYZE)", labels=["level"])
        for level in ("minutes", "hours", "far"):
            estimated.add_metric([level], depth[level])
        yield from (due, estimated)


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    database = DatabaseMetrics(ctx.store, names_per_team=ctx.settings.metrics_names_per_team,
                               read_s=ctx.settings.metrics_read_s)
    jobs = CollectorRegistry(auto_describe=False)
    jobs.register(database)

    def exposition() -> bytes:
        database.refresh()
        return prometheus_client.generate_latest() + prometheus_client.generate_latest(jobs)

    @get("/metrics", operation_id="metrics", tags=["health"], summary="Prometheus metrics of this process and "
         "of the jobs (docs/operations/metrics.md)", include_in_schema=False)
    async def metrics() -> Response[bytes]:
        return Response(await ctx.db(exposition), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return [metrics]
