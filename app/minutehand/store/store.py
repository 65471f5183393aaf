"""The store: one class owns every database operation. Each method binds
parameters to a named statement of sql/queries.sql; the logic is in the
procedures. psycopg 3 through a connection pool, autocommit (each procedure
call is its own transaction unless the caller says otherwise)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import random
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, TypeVar

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.rows import dict_row
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from minutehand import metrics
from minutehand.store import citus, errors, repeat, schema
from minutehand.store.queries import q
from minutehand.store.records import (AdminSession, Admitted, AuditEntry, AuditNote, DispatcherSeen, FleetView,
                                     MinuteCounts, Overview, ShardLease, WorkerSeen, BatchItem, ClaimRequest, Complete,
                                     DeadJob, DeadName, DeadPage, DeadSettled, EdgeCell, Fail, FlexDefault, FleetStats,
                                     FleetTeam, Heartbeat, JobAttempt, JobDeath, JobEvent, JobGone, JobPage, JobRecord, JobSpec,
                                     JobStatus, JobSummary, Maintenance, MetricsRead, Outcome,
                                     PendingDelivery, PlannedClaim, Release, Report, Repeat, Retained, SeriesControl,
                                     SeriesDetail, SeriesPage, SeriesRun, SeriesSummary, Start, Submitted, Tally,
                                     TeamPage, TeamSettings, TeamStats, TeamTerms, Webhook, WebhookDelivery)


log = logging.getLogger(__name__)
T = TypeVar("T")

# Claims per transaction: few commits a round, and the team_running rows a
# claim locks held no longer than that many statements take.
CLAIMS_PER_COMMIT = 32
# A transaction the database aborted to break a deadlock or a serialization
# conflict wrote nothing: it is tried again this many times in all.
TRIES = 3
# update_team: leave the team's retention as it is (None sets it back to the server's).
KEEP = object()
# CPU one batch may spend finding the first fire times of its cron series.
FIRE_TIME_BUDGET_S = 1.0

# Lists go to the database in binary: psycopg's text form of an array costs
# 2-4 us an element in Python (ids, lease tokens, names), the binary one
# ~0.4, and the procedures take thousands of elements a second.
ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_dumper(list, ListBinaryDumper)

# A series' first run: its due time and its deadline (misfire skip), as
# computed before the transaction; (None, None): the procedure decides.
FirstRun = tuple[dt.datetime | None, dt.datetime | None]

# update_team: a limit left as it is (None clears one).
KEEP: Any = object()

# The connection of a transaction the current thread's store calls join
# (Store.audited: an admin action and its audit entry commit together).
_JOINED: ContextVar[psycopg.Connection | None] = ContextVar("minutehand_store_joined", default=None)

_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
             for f in dataclasses.fields(JobSpec)}


def _jsonb(value: Any) -> Jsonb:
    """A jsonb parameter. JSON text already encoded (bytes: the API hands a
    request's payload through without decoding it) is sent as it is."""
    if isinstance(value, bytes):
        return Jsonb(value, dumps=_as_is)
    return Jsonb(value)


def _as_is(value: bytes) -> bytes:
    return value


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _tally(row: dict[str, Any]) -> Tally:
    """A Tally from a row of the stats queries (NULL counts: none)."""
    if row.get("submitted") is None:
        return Tally()
    return Tally(row["submitted"], row["started"], row["succeeded"], row["failed"], row["dead"], row["cancelled"],
                 tuple(row["lateness_hist"]), tuple(row["runtime_hist"]))


def _needs_now(job: JobSpec) -> bool:
    """Whether a series' first run is computed here, from the database's
    clock: a cron's first fire time, or the deadline under misfire skip."""
    return job.repeat is not None and (job.repeat.cron is not None or job.repeat.misfire == "skip")


def _batch_params(team: str, jobs: Sequence[JobSpec]) -> dict[str, Any]:
    """submit_jobs' parameters: one array per field, NULL where every item has the default."""
    def column(field: str, adapt=None) -> list | None:
        values = [getattr(j, field) for j in jobs]
        if all(v == _DEFAULTS[field] for v in values):
            return None                      # NULL array: the procedure's defaults, nothing to send
        return [adapt(v) for v in values] if adapt else values

    return {
        "team": team, "names": [j.name for j in jobs],
        "due_ats": column("due_at"), "payloads": column("payload", _jsonb),
        "priorities": column("priority"), "max_attempts": column("max_attempts"),
        "flex_s": column("flex_s"), "stricts": column("strict"), "keys": column("idempotency_key"),
        "backoff_base_s": column("backoff_base_s"), "backoff_cap_s": column("backoff_cap_s"),
    }


@dataclasses.dataclass(slots=True)
class _ClaimUnit:
    """One claim statement and the requests (indexes) it answers; `many`:
    over several shards, its rows naming theirs."""
    sql: str
    params: dict[str, Any]
    requests: list[int]
    shard: int                  # its first
    many: bool = False


def _claim_commits(units: list[_ClaimUnit], citus_shards: dict[int, int]) -> Iterator[list[_ClaimUnit]]:
    """The units (in shard order) as transactions: a statement over many
    shards alone (it locks their rows in shard order itself), single-shard
    ones up to CLAIMS_PER_COMMIT together, in shard order, each transaction's
    of one Citus shard where citus_shards says which holds a shard."""
    units = sorted(units, key=lambda u: citus_shards.get(u.shard, 0))     # stable: shard order within
    chunk: list[_ClaimUnit] = []
    for unit in units:
        if unit.many or len(chunk) == CLAIMS_PER_COMMIT or \
                (chunk and citus_shards.get(unit.shard, 0) != citus_shards.get(chunk[-1].shard, 0)):
            if chunk:
                yield chunk
            chunk = []
        if unit.many:
            yield [unit]
        else:
            chunk.append(unit)
    if chunk:
        yield chunk


class Store:
    def __init__(self, database_url: str, *, min_size: int = 1, max_size: int = 8,
                 clock: dt.datetime | None = None, pool_options: dict[str, Any] | None = None,
                 pool_name: str = "store"):
        """pool_options: more ConnectionPool arguments (timeout, reconnect_timeout, ...).
        Every connection starts with search_path=minutehand (pool.conninfo says so too).
        pool_name: the `pool` label of its metrics (minutehand.metrics)."""
        self.pool = ConnectionPool(schema.conninfo(database_url), min_size=min_size, max_size=max_size, open=True,
                                   kwargs={"autocommit": True, "row_factory": dict_row, "context": ADAPTERS},
                                   **(pool_options or {}))
        self._db_seconds = metrics.DB_SECONDS.labels(pool_name)
        self._unwatch = metrics.POOLS.watch(pool_name, self.pool.get_stats)
        # A pinned clock (tests): every checkout sets it on its session, and
        # once it has been pinned, unpinning (None) is applied the same way.
        self.clock = clock
        self._clock_used = clock is not None
        # {logical shard: Citus shard} on a distributed database, {} on plain
        # PostgreSQL; read on first use (_citus_groups).
        self._shard_groups: dict[int, int] | None = None

    def close(self) -> None:
        self._unwatch()
        self.pool.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, clock applied; procedure refusals become StoreErrors.
        Inside Store.audited: that transaction's connection."""
        joined = _JOINED.get()
        with nullcontext(joined) if joined is not None else self._pooled() as conn:
            try:
                yield conn
            except psycopg.Error as exc:
                error = errors.translate(exc)
                if error is exc:
                    raise
                raise error from exc

    @contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection]:
        with self.pool.connection() as conn, metrics.timed(self._db_seconds):
            self._apply_clock(conn)
            yield conn

    def _apply_clock(self, conn: psycopg.Connection) -> None:
        if self.clock is not None:
            self._clock_used = True
        if self._clock_used:
            conn.execute(q("set_clock"), {"now": self.clock})

    def _all(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            with self.connection() as conn:
                return conn.execute(q(name), params).fetchall()
        return self.retrying(run)

    def _one(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        rows = self._all(name, params)
        return rows[0] if rows else None

    @staticmethod
    def retrying(transaction: Callable[[], T]) -> T:
        """Run a whole transaction again when the database aborted it to break
        a deadlock or a serialization conflict (it wrote nothing), up to TRIES
        times in all, after a short random pause; then Contention, which says
        so, rather than an error that reads like the database being away.
        Inside Store.audited the whole audited transaction is what is retried."""
        if _JOINED.get() is not None:
            return transaction()
        for attempt in range(1, TRIES + 1):
            try:
                return transaction()
            except psycopg.OperationalError as exc:
                if not (exc.sqlstate or "").startswith("40"):     # class 40: transaction rollback
                    raise
                reason = exc.diag.message_primary or str(exc)
                if attempt == TRIES:
                    raise errors.Contention(
                        f"the database aborted the transaction {TRIES} times ({reason}); nothing was "
                        "written: retry the request") from exc
                log.info("transaction aborted (%s); trying again", reason)
                time.sleep(random.uniform(0.005, 0.05) * attempt)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ teams
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

    # ------------------------------------------------------------ reading
    def list_jobs(self, team: str, *, state: str | None = None, name: str | None = None,
                  due_before: dt.datetime | None = None, due_after: dt.datetime | None = None,
                  before_id: int | None = None, limit: int = 50, scan: int = 2000) -> JobPage:
        """A team's jobs with id < before_id, newest first, filtered; one page.

        Keyset on the team's (team_id, id DESC) index, never OFFSET. A page
        reads at most `scan` of the team's jobs: when the filters match
        fewer than `limit` of them, the page is short and next_cursor says
        where to go on, so a rare filter never walks a team's whole history
        in one request. next_cursor None: nothing older."""
        rows = self._all("list_jobs", {"team": team, "state": state, "name": name, "due_before": due_before,
                                       "due_after": due_after, "before": before_id, "limit": limit,
                                       "scan": scan})
        jobs = [JobSummary(**{k: r[k] for k in JobSummary.__dataclass_fields__}) for r in rows
                if r["job_id"] is not None]
        head = rows[0]
        if len(jobs) == limit:
            cursor = jobs[-1].job_id
        elif head["scanned"] == scan:
            cursor = head["scanned_to"]
        else:
            cursor = None
        return JobPage(jobs, cursor)

    # The longest window the counters answer for, and how many job names a
    # team's answer lists one by one (the rest are added up as "other").
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

    def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None: not migrated)."""
        return self._one("schema_revision", {})["revision"]

    # ------------------------------------------------------------ submission
    def submit(self, team: str, job: JobSpec) -> Submitted:
        metrics.SUBMIT_BATCH.observe(1)
        if job.repeat is not None:
            return self.submit_series(team, job)
        row = self._one("submit_job", {"team": team, "name": job.name, "due_at": job.due_at,
                                       "payload": _jsonb(job.payload), "priority": job.priority,
                                       "max_attempts": job.max_attempts, "flex_s": job.flex_s,
                                       "strict": job.strict, "idempotency_key": job.idempotency_key,
                                       "backoff_base_s": job.backoff_base_s,
                                       "backoff_cap_s": job.backoff_cap_s})
        return Submitted(**row)

    def submit_many(self, team: str, jobs: Sequence[JobSpec]) -> list[BatchItem]:
        """One call for the whole batch: valid items are written together, invalid
        ones reported. Items in input order (idx = position).

        Repeating items (repeat set) are written in the same transaction, each
        through submit_series under a savepoint, so a refused one is reported
        (error) and written nowhere while the others commit together."""
        metrics.SUBMIT_BATCH.observe(len(jobs))
        if all(j.repeat is None for j in jobs):
            rows = self._all("submit_jobs", _batch_params(team, jobs))
            return sorted((BatchItem(**r) for r in rows), key=lambda item: item.idx)
        now = self._db_now() if any(_needs_now(j) for j in jobs) else None
        first_runs: dict[int, FirstRun | errors.StoreError] = {}
        spent_until = time.thread_time() + FIRE_TIME_BUDGET_S
        for i, job in enumerate(jobs):
            if job.repeat is None:
                continue
            if time.thread_time() > spent_until:
                first_runs[i] = errors.InvalidInput(
                    f"the request's repeat specs took over {FIRE_TIME_BUDGET_S} s of CPU to evaluate; this "
                    "one and those after it were not: send fewer repeating jobs per request")
            else:
                first_runs[i] = self._first_run(job, now)
        return self.retrying(lambda: self._submit_mixed(team, jobs, first_runs))

    def _submit_mixed(self, team: str, jobs: Sequence[JobSpec],
                      first_runs: dict[int, FirstRun | errors.StoreError]) -> list[BatchItem]:
        plain = [i for i, j in enumerate(jobs) if j.repeat is None]
        items: list[BatchItem] = []
        with self.connection() as conn, conn.transaction():
            if plain:
                rows = conn.execute(q("submit_jobs"), _batch_params(team, [jobs[i] for i in plain])).fetchall()
                items += [BatchItem(**{**r, "idx": plain[r["idx"]]}) for r in rows]
            for i, job in enumerate(jobs):
                if job.repeat is None:
                    continue
                try:
                    if isinstance(first_runs[i], errors.StoreError):
                        raise first_runs[i]
                    with conn.transaction():
                        s = self._submit_series(conn, team, job, first_runs[i])
                    items.append(BatchItem(i, s.job_id, s.run_at, s.created, None, s.series_id))
                except (psycopg.Error, errors.StoreError) as exc:
                    error = errors.translate(exc) if isinstance(exc, psycopg.Error) else exc
                    if not isinstance(error, errors.StoreError) or isinstance(error, errors.NotFound):
                        raise                 # the whole call fails, as submit_jobs would (unknown team)
                    items.append(BatchItem(i, None, None, False, error.message))
        return sorted(items, key=lambda item: item.idx)

    def submit_series(self, team: str, job: JobSpec) -> Submitted:
        """A repeating job (job.repeat set): its series and first run, in one
        transaction. The first fire time of a cron spec is found first, with
        APScheduler in the spec's zone, from the database's clock, outside any
        transaction; every_s starts at the due time (or now). Submitted.series_id
        names the series."""
        first = self._first_run(job, self._db_now() if _needs_now(job) else None)
        if isinstance(first, errors.StoreError):
            raise first

        def run() -> Submitted:
            with self.connection() as conn:
                return self._submit_series(conn, team, job, first)
        return self.retrying(run)

    def _db_now(self) -> dt.datetime:
        return self._one("db_now", {})["now"]

    @staticmethod
    def _first_run(job: JobSpec, now: dt.datetime | None) -> FirstRun | errors.StoreError:
        """The first run's due time and deadline (FirstRun), or the refusal.
        (None, None) for an every_s series that is never dropped: the
        procedure takes the due time, or its now. Searched only up to the
        submission horizon, so an expression that never fires costs
        microseconds, not a search to year 9999."""
        r = job.repeat
        if not _needs_now(job):
            return None, None
        if reason := repeat.problem(r):
            return errors.InvalidInput(reason)
        try:
            return repeat.first_run(r, job.due_at, now)
        except ValueError as exc:
            return errors.InvalidInput(str(exc))

    @staticmethod
    def _submit_series(conn: psycopg.Connection, team: str, job: JobSpec, first: FirstRun) -> Submitted:
        r = job.repeat
        assert r is not None
        row = conn.execute(q("submit_series"), {
            "team": team, "name": job.name, "due_at": job.due_at, "payload": _jsonb(job.payload),
            "priority": job.priority, "max_attempts": job.max_attempts, "flex_s": job.flex_s,
            "strict": job.strict, "idempotency_key": job.idempotency_key,
            "backoff_base_s": job.backoff_base_s, "backoff_cap_s": job.backoff_cap_s,
            "every_s": r.every_s, "cron": r.cron, "timezone": r.timezone, "first_due_at": first[0],
            "misfire": r.misfire, "deadline": first[1],
        }).fetchone()
        return Submitted(**row)

    # ------------------------------------------------------------ the chain of repeating jobs
    def continue_series(self, shards: Sequence[int], limit: int = 1000) -> int:
        """Create the next run of up to `limit` marked series of these shards
        (sql/functions/chain.sql); returns how many runs were created. Fire
        times are computed here, between the read and the write, in no
        transaction; each shard's runs are created in its own transaction,
        all in one round trip."""
        rows = self._all("series_to_chain", {"shards": list(shards), "limit": limit})
        by_shard: dict[int, list[tuple]] = {}
        for r in rows:
            spec = Repeat(r["every_s"], r["cron"], r["timezone"], r["misfire"])
            try:
                due, deadline = repeat.next_run(spec, r["first_due_at"], r["chain_after"], r["now"])
            except ValueError:            # a zone the server no longer knows: looked at again in a day
                log.exception("series %s: its next fire time cannot be computed", r["series_id"])
                due, deadline = None, None
            by_shard.setdefault(r["shard"], []).append((r["series_id"], r["chain_after"], due, deadline))
        if not by_shard:
            return 0
        params = [{"shard": shard, "series": [i[0] for i in items], "after": [i[1] for i in items],
                   "due": [i[2] for i in items], "deadline": [i[3] for i in items]}
                  for shard, items in by_shard.items()]
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

    # ------------------------------------------------------------ dispatch
    @staticmethod
    def in_one_transaction(conn: psycopg.Connection, sql: Sequence[str], params: Sequence[dict[str, Any]]
                           ) -> list[list[dict[str, Any]]] | None:
        """The statements, each with its own params, in ONE transaction sent in
        one round trip: one commit for all of them. Their rows, or None if the
        server or the driver refused any of them (then nothing was written;
        the caller may run them each alone to learn which). A lost
        connection raises."""
        cursors = []
        try:
            with conn.pipeline(), conn.transaction():
                for statement, p in zip(sql, params):
                    cursors.append(conn.cursor())
                    cursors[-1].execute(statement, p)
        except psycopg.Error:
            if conn.broken:
                raise
            return None
        return [cur.fetchall() for cur in cursors]

    @staticmethod
    def each_alone(conn: psycopg.Connection, sql: str | Sequence[str], params: Sequence[dict[str, Any]]
                   ) -> list[list[dict[str, Any]] | Exception]:
        """The statement (or each item's own) once per item, all sent in ONE
        round trip, each its own transaction: a Sync follows each, so no transaction holds rows of
        more than one shard (on Citus, a single-shard transaction each).
        psycopg's public Pipeline.sync() would wait for each result in turn
        (a round trip per statement), so the Sync is queued with its
        _enqueue_sync (pinned down by tests/test_pipeline.py).

        The rows of each item, or the error that item alone met: a value the
        driver cannot send, or a statement the server refused (each is its
        own transaction, so the others committed, and their rows are read
        all the same — a claim's rows must never be dropped). psycopg reports
        only some of several server errors, so every failed item carries the
        first one. A lost connection raises."""
        cursors: list[psycopg.Cursor | Exception] = []
        first: psycopg.Error | None = None       # the first error the server sent back
        try:
            with conn.pipeline() as pipe:
                for i, p in enumerate(params):
                    cur = conn.cursor()
                    try:
                        cur.execute(sql if isinstance(sql, str) else sql[i], p)
                    except psycopg.Error as exc:
                        if conn.broken:
                            raise
                        if exc.sqlstate is None:          # this item's values could not be sent
                            cursors.append(errors.translate(exc))
                            continue
                        first = first or exc              # an earlier item's; this one was sent
                    cursors.append(cur)
                    pipe._enqueue_sync()
        except psycopg.Error as exc:
            if conn.broken:
                raise
            first = first or exc
        results: list[list[dict[str, Any]] | Exception] = []
        for cur in cursors:
            if isinstance(cur, Exception):
                results.append(cur)
                continue
            try:
                results.append(cur.fetchall())
            except psycopg.Error as exc:               # this item failed; the server's reason is
                results.append(errors.translate(first or exc))   # known for the first such one only
        return results

    def _pipelined(self, name: str, params: Sequence[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """The statement once per item, in one round trip, each its own
        transaction (each_alone); the first row of each. An error is raised
        (after every item ran)."""
        return [r[0] if r else None for r in self._each_or_raise(name, params)]

    def take_leases(self, shards: Sequence[int], owner: str, ttl_s: float) -> dict[int, int]:
        """Take or renew shard leases; {shard: epoch} for those now held.
        One call (take_shard_leases) per Citus shard, all in one round trip,
        each its own transaction (on plain PostgreSQL, one call)."""
        params = [{"shards": part, "owner": owner, "ttl_s": ttl_s} for part in self._by_citus_shard(shards)]
        held = {r["shard"]: r["epoch"] for rows in self._each_or_raise("take_shard_leases", params) for r in rows}
        return {s: held[s] for s in shards if s in held}

    def release_leases(self, leases: dict[int, int], owner: str) -> None:
        """Give shards ({shard: epoch}) up at once."""
        self._each_or_raise("release_shard_leases", [
            {"shards": part, "owner": owner, "epochs": [leases[s] for s in part]}
            for part in self._by_citus_shard(leases)])

    def _by_citus_shard(self, shards: Iterable[int]) -> list[list[int]]:
        """These logical shards in order, one list per Citus shard holding
        them (on plain PostgreSQL, one list): a statement naming one list is
        a router statement committed on one worker."""
        groups = self._citus_groups()
        parts: dict[int, list[int]] = {}
        for s in sorted(shards):
            parts.setdefault(groups.get(s, -1), []).append(s)
        return [parts[k] for k in sorted(parts)]

    def _each_or_raise(self, name: str, params: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """The statement once per item in one round trip, each its own
        transaction (each_alone); every item's rows. An error is raised
        (after every item ran)."""
        if not params:
            return []
        with self.connection() as conn:
            results = self.each_alone(conn, q(name), params)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def due_edges(self, shards: Sequence[int], since: dict[int, dt.datetime] | None = None, cap: int | None = None
                  ) -> dict[int, tuple[list[EdgeCell], dt.datetime | None]]:
        """Per shard, in one statement (due_edges): its cells due now (for the
        shards in `since`, only the rows that came due by the clock since
        then; each counted up to `cap` rows, None: all), and the next run
        time in its current and next buckets (None: none)."""
        since = since or {}
        shards = list(shards)
        edges: dict[int, tuple[list[EdgeCell], dt.datetime | None]] = {s: ([], None) for s in shards}
        rows = self._all("due_edges", {"shards": shards, "since": [since.get(s) for s in shards], "cap": cap})
        for r in rows:
            shard, next_at = r.pop("shard"), r.pop("next_at")
            if r["team_id"] is None:               # the row that says when more comes due
                edges[shard] = (edges[shard][0], next_at)
            else:
                edges[shard][0].append(EdgeCell(**r))
        return edges

    def team_terms(self) -> list[TeamTerms]:
        with self.connection() as conn:
            return [TeamTerms(**r) for r in conn.execute(q("team_terms")).fetchall()]

    def teams_running(self, shards: Sequence[int]) -> dict[int, int]:
        """Jobs claimed and not finished, per team id, on these shards."""
        with self.connection() as conn:
            return {r["team_id"]: r["running"]
                    for r in conn.execute(q("teams_running"), {"shards": list(shards)}).fetchall()}

    def claim(self, requests: Sequence[ClaimRequest | PlannedClaim], owner: str, lease_s: float,
              synchronous_commit: bool = True) -> tuple[list[list[dict[str, Any]] | Exception], dict[int, str]]:
        """Claims for workers, one result per request. Per request, the rows
        claimed (claim_due, or claim_planned for a PlannedClaim: payload and
        replay as JSON text; due_at and run_at None where no client could
        read them), or the error that request alone met (a stale lease:
        StaleLease); and {shard: why} for the shards whose lease was stale.

        On plain PostgreSQL a worker's planned claims from one bucket go as
        one statement over all their shards (claim_planned_shards), its own
        transaction. Otherwise (on Citus, where a row-locking statement names
        one shard, and for ClaimRequests) a statement per request, in
        transactions of up to CLAIMS_PER_COMMIT statements in shard order (on
        Citus, all of one Citus shard: a transaction on one worker commits in
        one phase). So a round of many shards waits for a few commits, not
        one each, while the team_running rows they lock, which outcome
        batches wait for, are held only as long as one such transaction. If
        a transaction fails, its statements run each alone, so the others
        still claim. No commit waits for its WAL flush unless
        synchronous_commit (see Settings.claim_synchronous_commit)."""
        results: list[list[dict[str, Any]] | Exception] = [[] for _ in requests]
        sync = [] if synchronous_commit else [(q("commit_without_flush"), {})]
        groups = self._citus_groups()
        with self.connection() as conn:
            units = self._claim_units(requests, owner, lease_s, together=not groups)
            for chunk in _claim_commits(units, groups):
                sql, args = [u.sql for u in chunk], [u.params for u in chunk]
                together = self.in_one_transaction(conn, [s for s, _ in sync] + sql, [p for _, p in sync] + args)
                # One of them failed: each alone, so it fails alone.
                got = together[len(sync):] if together is not None else self.each_alone(conn, sql, args)
                for unit, rows in zip(chunk, got):
                    if isinstance(rows, Exception) or not unit.many:
                        for i in unit.requests:
                            results[i] = rows
                        continue
                    by_shard: dict[int, list[dict[str, Any]]] = {}      # (one pass: hundreds of shards)
                    for row in rows:
                        by_shard.setdefault(row["shard"], []).append(row)
                    for i in unit.requests:
                        results[i] = by_shard.get(requests[i].shard, [])
        refused: dict[int, str] = {}
        for i, (r, rows) in enumerate(zip(requests, results)):
            if not isinstance(rows, Exception) and rows and rows[0]["refused"] is not None:
                refused[r.shard] = rows[0]["refused"]
                results[i] = errors.StaleLease(rows[0]["refused"])
        return results, refused

    def _citus_groups(self) -> dict[int, int]:
        """{logical shard: the Citus shard holding it} on a distributed
        database, {} otherwise (citus.shard_groups), read once."""
        if self._shard_groups is None:
            with self.connection() as conn:
                self._shard_groups = citus.shard_groups(conn)
        return self._shard_groups

    @staticmethod
    def _claim_units(requests: Sequence[ClaimRequest | PlannedClaim], owner: str, lease_s: float, together: bool
                     ) -> list[_ClaimUnit]:
        """The statements for these requests, in shard order: with
        `together`, a worker's PlannedClaims of one bucket (and names) as one
        claim_planned_shards; every other request as its own statement."""
        units: list[_ClaimUnit] = []
        groups: dict[tuple, _ClaimUnit] = {}
        for i in sorted(range(len(requests)), key=lambda i: requests[i].shard):
            r = requests[i]
            if isinstance(r, PlannedClaim) and together:
                key = (r.worker, r.bucket, None if r.names is None else tuple(r.names))
                unit = groups.get(key)
                if unit is None or r.shard in unit.params["shards"]:
                    unit = groups[key] = _ClaimUnit(q("claim_planned_shards"), {
                        "owner": owner, "lease_s": lease_s, "worker": r.worker, "bucket": r.bucket,
                        "names": r.names, "shards": [], "epochs": [], "cell_shards": [], "stricts": [],
                        "priorities": [], "teams": [], "limits": []}, [], r.shard, many=True)
                    units.append(unit)
                p = unit.params
                p["shards"].append(r.shard)
                p["epochs"].append(r.epoch)
                p["cell_shards"] += [r.shard] * len(r.limits)
                p["stricts"] += r.stricts
                p["priorities"] += r.priorities
                p["teams"] += r.teams
                p["limits"] += r.limits
                unit.requests.append(i)
            elif isinstance(r, PlannedClaim):
                units.append(_ClaimUnit(q("claim_planned"), {
                    "shard": r.shard, "owner": owner, "epoch": r.epoch, "lease_s": lease_s, "worker": r.worker,
                    "bucket": r.bucket, "stricts": r.stricts, "priorities": r.priorities, "teams": r.teams,
                    "limits": r.limits, "names": r.names}, [i], r.shard))
            else:
                units.append(_ClaimUnit(q("claim_due"), {
                    "shard": r.shard, "limit": r.limit, "owner": owner, "epoch": r.epoch, "lease_s": lease_s,
                    "worker": r.worker, "names": r.names, "teams": r.teams}, [i], r.shard))
        return units

    # ------------------------------------------------------------ outcomes
    def start(self, items: Sequence[Start]) -> list[Outcome]:
        return self._outcomes("start_many", items, {})

    def heartbeat(self, items: Sequence[Heartbeat], extend_s: float) -> list[Outcome]:
        return self._outcomes("heartbeat_many", items, {"extend_s": extend_s})

    def complete(self, items: Sequence[Complete]) -> list[Outcome]:
        return self._outcomes("complete_many", items,
                              {"results": [_jsonb(i.result) if i.result is not None else None for i in items]})

    def fail(self, items: Sequence[Fail]) -> list[Outcome]:
        return self._outcomes("fail_many", items, {"errors": [i.error for i in items],
                                                    "retryable": [i.retryable for i in items]})

    def release(self, items: Sequence[Release]) -> list[Outcome]:
        return self._outcomes("release_many", items, {})

    def outcome_calls(self, job_ids: Sequence[int]) -> list[list[int]]:
        """The positions of an outcome batch's items, one list per procedure
        call. On plain PostgreSQL one call: one statement over every shard is
        the cheapest there. On Citus one per Citus shard (the procedures name
        the batch's shards in every statement): each call is then router
        statements on one worker with a one-phase commit, where one call over
        many shards is a two-phase commit on every worker, and batches of
        different dispatchers queue on each other's shard locks."""
        groups = self._citus_groups()
        if not groups:
            return [list(range(len(job_ids)))]
        calls: dict[int, list[int]] = {}
        for at, job_id in enumerate(job_ids):
            calls.setdefault(groups.get(citus.shard_of(job_id), -1), []).append(at)
        return [calls[k] for k in sorted(calls)]

    def _outcomes(self, name: str, items: Sequence[Report], extra: dict[str, Any]) -> list[Outcome]:
        params = {"ids": [i.job_id for i in items], "tokens": [i.lease_token for i in items], **extra}
        calls = self.outcome_calls(params["ids"])
        if len(calls) == 1:
            return [Outcome(**r) for r in self._all(name, params)]
        # One call per Citus shard, all sent in one round trip, each its own transaction.
        per_call = [{k: [v[at] for at in positions] if isinstance(v, list) else v for k, v in params.items()}
                    for positions in calls]
        with self.connection() as conn:
            results = self.each_alone(conn, q(name), per_call)
        outcomes: list[Outcome | None] = [None] * len(items)
        failed: Exception | None = None
        for positions, rows in zip(calls, results):
            if isinstance(rows, Exception):
                failed = failed or rows
                continue
            for at, r in zip(positions, rows):
                outcomes[at] = Outcome(**r)
        if failed is not None:
            if all(o is None for o in outcomes):
                raise failed
            raise errors.OutcomesPartlyWritten(outcomes, failed)
        return outcomes

    def cancel(self, job_id: int, team: str | None) -> Outcome:
        """Cancel a job that has not started, as `team`; team None (an
        administrator) acts through the job's own team."""
        if team is None:
            row = self._one("job_team", {"job_id": job_id})
            if row is None:
                return Outcome(job_id, False, None, "no such job")
            team = row["team"]
        return Outcome(**self._one("cancel", {"job_id": job_id, "team": team}))

    # ------------------------------------------------------------ dead jobs
    def requeue(self, job_id: int, team: str | None, max_attempts: int | None = None) -> Outcome:
        """Put a dead job back on the wheel, due now, with a new attempt budget
        (None: its own), as `team` (None: the administrator, through the job's
        own team). Refused (ok False, state None if there is no such job) when
        it is not dead; raises InvalidInput for a bad budget."""
        team = self._team_of(job_id, team)
        if team is None:
            return Outcome(job_id, False, None, "no such job")
        return Outcome(**self._one("requeue_job", {"job_id": job_id, "team": team, "max_attempts": max_attempts}))

    def discard(self, job_id: int, team: str | None) -> Outcome:
        """Set a dead job aside for good (state discarded); refused as requeue."""
        team = self._team_of(job_id, team)
        if team is None:
            return Outcome(job_id, False, None, "no such job")
        return Outcome(**self._one("discard_job", {"job_id": job_id, "team": team}))

    def requeue_dead(self, team: str, name: str, *, max_attempts: int | None = None,
                     limit: int = 10_000) -> DeadSettled:
        """Requeue the team's dead jobs of this name, at most `limit`."""
        row = self._one("requeue_dead", {"team": team, "name": name, "max_attempts": max_attempts, "limit": limit})
        return DeadSettled(row["settled"], row["more"])

    def discard_dead(self, team: str, name: str, *, limit: int = 10_000) -> DeadSettled:
        row = self._one("discard_dead", {"team": team, "name": name, "limit": limit})
        return DeadSettled(row["settled"], row["more"])

    def events(self, team: str, *, after: tuple[str, int] | None = None, limit: int = 100) -> list[JobEvent]:
        """The team's events after the position `after` ((xid, id) of the last
        one read; None: the oldest kept), oldest first."""
        xid, event_id = after or ("0", 0)
        return [JobEvent(**r) for r in self._all("team_events", {"team": team, "xid": xid, "after": event_id,
                                                                 "limit": limit})]

    def purge_events(self, shards: Sequence[int]) -> int:
        """Drop events (and delivery attempts) past their retention."""
        purged = sum(r["purged"] for r in self._pipelined("purge_events", [{"shard": s} for s in shards]))
        return purged + self._one("purge_deliveries", {})["purged"]

    def _team_of(self, job_id: int, team: str | None) -> str | None:
        if team is not None:
            return team
        row = self._one("job_team", {"job_id": job_id})
        return row["team"] if row else None

    # ------------------------------------------------------------ the admin UI's reads
    # A keyset that starts before every job id (ids are positive: mh_new_id).
    _BEFORE_ALL_IDS = -1

    def job_record(self, job_id: int, team: str | None, *, cap: int, deaths: int = 20
                   ) -> tuple[JobRecord, list[JobDeath]] | None:
        """The whole record of a job of `team` (None: any team), payload and
        result cut to `cap` characters of pretty JSON, and the `deaths`
        latest times it became dead; None if there is no such job of the team."""
        def run() -> tuple[JobRecord, list[JobDeath]] | None:
            with self.connection() as conn, conn.transaction():
                # (the clock read first: on Citus admin_job runs on a worker, see _all_at_now)
                row = conn.execute(q("admin_job"), {"job_id": job_id, "team": team, "cap": cap,
                                                    "now": self._now_on(conn)}).fetchone()
                if row is None:
                    return None
                found = conn.execute(q("admin_job_events"), {"job_id": job_id, "limit": deaths}).fetchall()
            return JobRecord(**row), [JobDeath(**r) for r in found]
        return self.retrying(run)

    def job_attempts(self, job_id: int, limit: int = 50) -> list[JobAttempt]:
        """A job's attempts that ended without success, newest first (the
        caller has checked the job is the reader's)."""
        return [JobAttempt(**r) for r in self._all("admin_job_attempts", {"job_id": job_id, "limit": limit})]

    def _in_index_order(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """A read planned with its values and no bitmap scan, so that it stops
        at its LIMIT (sql/queries.sql, admin_index_order, says why)."""
        def run() -> list[dict[str, Any]]:
            with self.connection() as conn, conn.transaction():
                conn.execute(q("admin_index_order"))
                return conn.execute(q(name), params, prepare=False).fetchall()
        return self.retrying(run)

    def _team_id(self, team: str) -> int | None:
        row = self._one("admin_team_id", {"team": team})
        return row["id"] if row else None

    def dead_jobs(self, team: str, *, name: str | None = None, after: tuple[str, int] | None = None,
                  limit: int = 50) -> DeadPage:
        """One page of the team's dead jobs (of one name, or every name), by
        (name, id) after the keyset `after` (with a name, only its id counts),
        each with its last error."""
        team_id = self._team_id(team)
        if team_id is None:
            return DeadPage([], None)
        after_name, after_id = after or ("", self._BEFORE_ALL_IDS)
        params = {"team_id": team_id, "after_id": after_id, "limit": limit + 1}
        if name is None:
            rows = self._in_index_order("admin_dead_jobs", {**params, "after_name": after_name})
        else:
            rows = self._in_index_order("admin_dead_jobs_of_name", {**params, "name": name})
        jobs = [DeadJob(**r) for r in rows[:limit]]
        return DeadPage(jobs, (jobs[-1].name, jobs[-1].job_id) if len(rows) > limit else None)

    def dead_names(self, team: str, *, names: int = 50, cap: int = 1000) -> list[DeadName]:
        """The first `names` names the team has dead jobs of, each counted up to `cap`."""
        team_id = self._team_id(team)
        if team_id is None:
            return []
        return [DeadName(**r) for r in self._in_index_order("admin_dead_names", {"team_id": team_id, "names": names,
                                                                                  "cap": cap})]

    def series_team(self, series_id: int) -> str | None:
        """The team a series belongs to (None: no such series)."""
        row = self._one("admin_series_team", {"series_id": series_id})
        return row["team"] if row else None

    # ------------------------------------------------------------ webhooks
    def set_webhook(self, team: str, url: str, secret: str) -> Webhook:
        """Set the team's webhook; raises NotFound (no such team)."""
        if self._one("set_webhook", {"team": team, "url": url, "secret": secret}) is None:
            raise errors.NotFound(f"no such team {team!r}")
        return self.webhook(team)

    def webhook(self, team: str) -> Webhook | None:
        row = self._one("webhook", {"team": team})
        return Webhook(**row) if row else None

    def delete_webhook(self, team: str) -> bool:
        return self._one("delete_webhook", {"team": team}) is not None

    def webhook_deliveries(self, team: str, *, limit: int = 50) -> list[WebhookDelivery]:
        return [WebhookDelivery(**r) for r in self._all("webhook_deliveries", {"team": team, "limit": limit})]

    def webhooks_due(self, *, batch: int, limit: int) -> list[PendingDelivery]:
        """Webhooks with events to deliver and not backing off, each with its next batch of events."""
        return [PendingDelivery(**r) for r in self._all("webhooks_due", {"batch": batch, "limit": limit})]

    def record_delivery(self, pending: PendingDelivery, *, status: int | None, error: str | None,
                        duration_ms: int, ok: bool, retry_s: float) -> bool:
        """Record an attempt; on success move the position past its events.
        False: the position had moved meanwhile (nothing moved)."""
        first, last = pending.events[0], pending.events[-1]
        return self._one("record_delivery", {
            "team_id": pending.team_id, "url": pending.url, "from_xid": pending.from_xid,
            "from_id": pending.from_id, "xid": last["xid"], "id": last["id"], "events": len(pending.events),
            "first": first["id"], "attempt": pending.failures + 1, "status": status, "error": error,
            "duration_ms": duration_ms, "ok": ok, "retry_s": retry_s})["current"]

    def status(self, job_id: int, team: str | None = None) -> JobStatus | None:
        rows = self._all_at_now("job_status", {"job_id": job_id, "team": team})
        return JobStatus(**rows[0]) if rows else None

    def _all_at_now(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows of a read that reckons with the clock, given the database's
        clock as `now`, read first on the same connection: on Citus the read
        runs on workers, whose mh_now() is neither the coordinator's nor
        pinned by its session (tests, drills)."""
        def run() -> list[dict[str, Any]]:
            with self.connection() as conn:
                return conn.execute(q(name), {**params, "now": self._now_on(conn)}).fetchall()
        return self.retrying(run)

    @staticmethod
    def _now_on(conn: psycopg.Connection) -> dt.datetime:
        return conn.execute(q("db_now")).fetchone()["now"]

    # ------------------------------------------------------------ maintenance
    def expire_claims(self, shards: Sequence[int]) -> tuple[int, int]:
        """(returned, dead) over the shards: the due reminders whose jobs all
        left their claim dropped and the shards with a claim past its expiry
        found (a statement each, over all the shards), then expire_claims on
        each of those in its own transaction (a transaction over several
        shards' claimed jobs could lock them in another order than an outcome
        batch does), all of them in one round trip."""
        with self.connection() as conn:
            # (the clock read first: Citus evaluates no mh_now() in a distributed DELETE's COALESCE)
            args = {"shards": list(shards), "now": conn.execute(q("db_now")).fetchone()["now"]}
            conn.execute(q("drop_finished_claim_checks"), args)
            due = [r["shard"] for r in conn.execute(q("shards_with_expired_claims"), args).fetchall()]
        if not due:
            return 0, 0
        rows = self._pipelined("expire_claims", [{"shard": s} for s in due])
        return sum(r["returned"] for r in rows), sum(r["dead"] for r in rows)

    def cascade(self) -> tuple[int, int]:
        row = self._one("cascade_wheel", {})
        return row["from_far"], row["from_hours"]

    def sweep(self) -> tuple[int, int]:
        row = self._one("sweep_passed", {})
        return row["buckets"], row["carried"]

    def retain(self, shards: Sequence[int], default_s: int, limit: int = 500) -> Retained:
        """One retention pass over each shard (retain_jobs), in one round trip:
        finished jobs past their team's retention (default_s: the server's)
        are removed, at most `limit` filed ones and `limit` walked ones per shard."""
        rows = self._pipelined("retain_jobs", [{"shard": s, "default_s": default_s, "limit": limit} for s in shards])
        return Retained(sum(r["removed"] for r in rows), sum(r["deferred"] for r in rows),
                        sum(r["walked"] for r in rows), sum(1 for r in rows if r["walked"] >= limit))

    def job_gone(self, job_id: int, team: str | None, default_s: int) -> JobGone:
        """For an id status found no job for: was it made before the
        retention cut of `team` (None: the shortest of any team)?"""
        return JobGone(**self._one("job_gone", {"job_id": job_id, "team": team, "default_s": default_s}))

    def purge_keys(self, shards: Sequence[int]) -> int:
        return sum(r["purged"] for r in self._pipelined("purge_idempotency_keys", [{"shard": s} for s in shards]))

    def roll_up_stats(self) -> int:
        """Fold old minute rows of the counters into hour rows; how many were folded."""
        return self._one("roll_up_stats", {})["rolled"]

    def purge_stats(self) -> int:
        return self._one("purge_stats", {})["purged"]

    def purge_load(self) -> int:
        """Drop the planned load of minutes more than an hour back (bounded per call)."""
        return self._one("purge_load", {})["purged"]

    # ------------------------------------------------------------ default flex windows
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

    # ------------------------------------------------------------ dispatchers
    def dispatcher_members(self, name: str, ttl_s: float) -> list[str]:
        """Renew this dispatcher's membership; the live members' names, sorted."""
        return [r["name"] for r in self._all("dispatcher_members", {"name": name, "ttl_s": ttl_s})]

    def leave_dispatchers(self, name: str) -> None:
        self._one("leave_dispatchers", {"name": name})

    def take_duty(self, duty: str, owner: str, ttl_s: float) -> bool:
        return self._one("take_duty_lease", {"duty": duty, "owner": owner, "ttl_s": ttl_s})["held"]

    def shard_owners(self) -> dict[int, tuple[str | None, int]]:
        """{shard: (current lease holder or None, epoch)}."""
        return {r["shard"]: (r["owner"], r["epoch"]) for r in self._all_at_now("shard_owners", {})}

    def create_worker_token(self, name: str) -> str:
        """Create (or rotate) a worker credential; returns its token (only the hash is stored)."""
        token = "mhw_" + secrets.token_urlsafe(24)
        self._one("set_worker_token", {"name": name, "token_hash": hash_token(token)})
        return token

    def worker_for_token(self, token_hash: str) -> str | None:
        row = self._one("worker_by_token", {"token_hash": token_hash})
        return row["name"] if row else None

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

    # ------------------------------------------------------------ the local demo
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

    def maintain(self) -> Maintenance:
        return Maintenance(**self._one("maintain", {}))

    # ------------------------------------------------------------ the admin UI (app/minutehand/admin/)
    def create_admin_session(self, id_hash: str, team: str | None, token_hash: str, csrf: str,
                             ttl_s: float) -> None:
        """A signed-in browser (team None: the admin); up to 100 expired ones are dropped first."""
        def run() -> None:
            with self.connection() as conn, conn.transaction():
                conn.execute(q("admin_sessions_purge"), {"limit": 100})
                conn.execute(q("admin_session_create"), {"id_hash": id_hash, "team": team, "token_hash": token_hash,
                                                         "csrf": csrf, "ttl_s": ttl_s})
        self.retrying(run)

    def admin_session(self, id_hash: str) -> AdminSession | None:
        """The live session of this id hash (None: none, expired, or its team's token rotated since)."""
        row = self._one("admin_session", {"id_hash": id_hash})
        return AdminSession(row["team"], row["token_hash"], row["csrf"]) if row else None

    def end_admin_session(self, id_hash: str) -> None:
        self._one("admin_session_end", {"id_hash": id_hash})

    def audited(self, note: AuditNote, action: Callable[[], T]) -> T:
        """action() (store calls) and its audit entry in one transaction: both
        commit or neither does. A refusal (StoreError) rolls the action back
        and is recorded on its own, ok false, then raised again."""
        def run() -> T:
            with self.connection() as conn, conn.transaction():
                joined = _JOINED.set(conn)
                try:
                    result = action()
                finally:
                    _JOINED.reset(joined)
                conn.execute(q("admin_audit_add"), self._audit_params(note, ok=True))
            return result
        try:
            return self.retrying(run)
        except errors.StoreError as exc:
            self._one("admin_audit_add", self._audit_params(note, ok=False, refusal=exc.message))
            raise

    def audit(self, note: AuditNote, *, ok: bool = True) -> int:
        """Record an action with no effect in the database of its own; the entry's id."""
        return self._one("admin_audit_add", self._audit_params(note, ok=ok))["id"]

    @staticmethod
    def _audit_params(note: AuditNote, *, ok: bool, refusal: str | None = None) -> dict[str, Any]:
        detail = dict(note.detail or {})
        if refusal is not None:
            detail["refused"] = refusal
        return {"actor": note.actor, "token_ref": note.token_ref, "team": note.team, "action": note.action,
                "target": note.target, "ok": ok, "detail": Jsonb(detail) if detail else None}

    def audit_page(self, team: str | None, *, before: int | None = None, limit: int = 50
                   ) -> tuple[list[AuditEntry], int | None]:
        """Audit entries with id < before, newest first (team None: every
        entry; else the entries concerning that team); one page and the
        cursor of the next (None: no more)."""
        params = {"before": before, "limit": limit + 1}
        if team is None:
            rows = self._all("admin_audit_page", params)
        else:
            found = self._one("admin_team_id", {"team": team})
            rows = self._all("admin_audit_team_page", {**params, "team": team, "team_id": found["id"]}) if found else []
        entries = [AuditEntry(**r) for r in rows[:limit]]
        return entries, (entries[-1].id if len(rows) > limit else None)

    def admin_overview(self, team: str | None) -> Overview:
        """The overview of the fleet (team None) or of one team, in one
        snapshot; reads counters, team_running and load_minutes, never jobs."""
        with self.connection() as conn, conn.transaction():
            conn.execute(q("no_parallel_workers"))
            clock = conn.execute(q("metrics_clock")).fetchone()
            now = conn.execute(q("admin_now")).fetchone()["now"]
            minutes = [MinuteCounts(r["minute"], r["submitted"], r["started"], r["succeeded"], r["failed"], r["dead"],
                                    tuple(r["lateness_hist"]))
                       for r in conn.execute(q("admin_minutes" if team is None else "admin_team_minutes"),
                                             {"team": team})]
            running = [(r["team"], r["running"], r["quota"]) for r in conn.execute(q("metrics_running"))
                       if team is None or r["team"] == team]
            if team is not None:
                return Overview(now, minutes, running, [], None)
            planned = [(r["minute"], r["jobs"]) for r in conn.execute(q("admin_planned_minutes"))]
            depth = {k: int(v) for k, v in conn.execute(q("metrics_due_depth"), clock).fetchone().items()}
            return Overview(now, minutes, sorted(running), planned, depth)

    def admin_fleet(self, *, workers: int = 200, per_shard: int = 4, per_claim: int = 100) -> FleetView:
        """Shard leases, dispatchers, and the workers holding jobs now (from
        the latest claims: see admin_workers)."""
        with self.connection() as conn:
            now = self._now_on(conn)        # (on Citus the shards' reads run on workers: see _all_at_now)
            return FleetView(
                [ShardLease(**r) for r in conn.execute(q("admin_shards"), {"now": now})],
                [DispatcherSeen(**r) for r in conn.execute(q("admin_dispatchers"))],
                [WorkerSeen(**r) for r in conn.execute(q("admin_workers"), {"limit": workers, "per_shard": per_shard,
                                                                          "per_claim": per_claim, "now": now})])

