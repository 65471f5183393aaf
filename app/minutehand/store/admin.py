"""What the admin UI (app/minutehand/admin/) reads and writes beyond the
API's own: a job's whole record, a team's dead jobs, its sign-in sessions,
the audit log, the overview and the fleet (sql/queries/admin.sql)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from minutehand.store import errors
from minutehand.store.base import _JOINED, StoreBase, T
from minutehand.store.queries import q


@dataclass(frozen=True)
class JobRecord:
    """The whole record of one job, as the admin UI's job page shows it.
    payload and result: pretty JSON cut to the reader's cap (None: no
    result), with their full size in bytes."""
    job_id: int
    team: str
    name: str
    state: str
    priority: int
    due_at: dt.datetime
    flex_s: int
    strict: bool
    agreed_at: dt.datetime
    run_at: dt.datetime
    deadline: dt.datetime | None
    attempts: int
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    claimed_by: str | None
    claim_expires_at: dt.datetime | None
    idempotency_key: str | None
    series_id: int | None
    lateness: dt.timedelta | None
    lateness_final: bool
    last_error: str | None
    payload: str
    payload_bytes: int
    result: str | None
    result_bytes: int | None
    created_at: dt.datetime
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    requeued_at: dt.datetime | None
    cancel_requested_at: dt.datetime | None = None


@dataclass(frozen=True)
class JobDeath:
    """A time a job became dead (its job_events row): the attempts it had had and the error then."""
    at: dt.datetime
    attempts: int
    max_attempts: int
    error: str | None


@dataclass(frozen=True)
class JobAttempt:
    """An attempt of a job that ended without success (its job_attempts row);
    worker None for an expired claim (its error names the worker)."""
    attempt: int
    ended_at: dt.datetime
    worker: str | None
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None
    outcome: str
    error: str | None


@dataclass(frozen=True)
class DeadJob:
    """A dead job as the admin UI's dead-jobs page lists it."""
    job_id: int
    name: str
    attempts: int
    max_attempts: int
    last_error: str | None
    finished_at: dt.datetime | None
    created_at: dt.datetime
    requeued_at: dt.datetime | None


@dataclass(frozen=True)
class DeadPage:
    jobs: list[DeadJob]
    next_cursor: tuple[str, int] | None   # (name, id) the next page starts after; None: no more


@dataclass(frozen=True)
class DeadName:
    """A name a team has dead jobs of, and how many (counted up to a cap)."""
    name: str
    dead: int


@dataclass(frozen=True)
class AdminSession:
    """A signed-in browser: its team (None: the admin), the hash of the token
    it signed in with, and the CSRF token its forms carry."""
    team: str | None
    token_hash: str
    csrf: str


@dataclass(frozen=True)
class AuditNote:
    """What an admin action records: who (actor: 'admin' or the signed-in
    team; token_ref: the first 12 hex digits of the sha256 of the token it
    signed in with), the team it concerned (None: the whole fleet), what
    (action, target, details)."""
    actor: str
    token_ref: str
    team: str | None
    action: str
    target: str
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One action taken through the admin UI."""
    id: int
    at: dt.datetime
    actor: str                      # 'admin' or the signed-in team
    token_ref: str                  # the first 12 hex digits of the sha256 of the token used
    team: str | None                # the team it concerned (None: the fleet)
    action: str
    target: str
    ok: bool
    detail: dict[str, Any] | None


@dataclass(frozen=True)
class MinuteCounts:
    """One minute of the counters (team_stats), the fleet's or a team's."""
    minute: dt.datetime
    submitted: int
    started: int
    succeeded: int
    failed: int
    dead: int
    lateness_hist: tuple[int, ...]


@dataclass(frozen=True)
class Overview:
    """What the admin UI's overview shows, read without touching the jobs:
    the last hour minute by minute; running vs quota per team; jobs planned
    per run minute from an hour back to a day ahead (load_minutes); the
    wheel's depth (counted in the current and next minute, estimated for
    each level), None for a team's overview."""
    now: dt.datetime
    minutes: list[MinuteCounts]
    running: list[tuple[str, int, int]]             # (team, running, quota)
    planned: list[tuple[dt.datetime, int]]
    depth: dict[str, int] | None


@dataclass(frozen=True)
class ShardLease:
    shard: int
    owner: str | None               # None: free, or its lease expired
    last_owner: str | None
    lease_expires_at: dt.datetime | None
    epoch: int
    hand: dt.datetime | None


@dataclass(frozen=True)
class DispatcherSeen:
    name: str
    expires_at: dt.datetime
    live: bool
    duties: list[str] | None


@dataclass(frozen=True)
class WorkerSeen:
    """A worker holding jobs now: counts from its latest claims (sampled, see admin_workers)."""
    worker: str
    running: int
    claimed: int
    last_seen: dt.datetime
    job_ids: list[int]


@dataclass(frozen=True)
class FleetView:
    shards: list[ShardLease]
    dispatchers: list[DispatcherSeen]
    workers: list[WorkerSeen]


class AdminStore(StoreBase):
    """The admin UI's reads and writes, a part of Store."""

    # ------------------------------------------------------------ a job's record, dead jobs, a series' team
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
        at its LIMIT (sql/queries/admin.sql, admin_index_order, says why)."""
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

    # ------------------------------------------------------------ sessions, the audit log, the overview, the fleet
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
