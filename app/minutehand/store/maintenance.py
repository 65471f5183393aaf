"""What the maintenance duties call: claims past their expiry returned, the
wheel cascaded and its passed minutes swept, finished jobs removed after
their retention, and what is past its retention purged (idempotency keys,
counters, planned load, events); and every duty once (maintain)
(sql/queries/maintenance.sql)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from minutehand.store.base import StoreBase
from minutehand.store.queries import q


@dataclass(frozen=True)
class Maintenance:
    from_far: int
    from_hours: int
    swept_buckets: int
    carried: int
    claims_returned: int
    claims_dead: int
    keys_purged: int
    stats_rolled: int
    stats_purged: int
    load_purged: int
    events_purged: int


@dataclass(frozen=True)
class Retained:
    """One retention pass over some shards: jobs removed, jobs filed to be
    looked at again later, jobs the walk visited, and the shards whose walk
    took a full batch (a backlog: another pass would find more)."""
    removed: int
    deferred: int
    walked: int
    backlog: int


@dataclass(frozen=True)
class JobGone:
    """Why a job id has no row: the time the id was made, the retention that
    applies (seconds), and whether the id is older than that retention (a
    finished job of that id would have been removed: expired, or never
    existed), or younger (no such job)."""
    made_at: dt.datetime
    retention_s: int
    expired: bool


class MaintenanceStore(StoreBase):
    """The maintenance duties, a part of Store."""

    def expire_claims(self, shards: Sequence[int], away: set[int] | None = None) -> tuple[int, int]:
        """(returned, dead) over the shards: the shards with a claim reminder
        due found (one statement; none: nothing more to do, as when idle),
        on those the due reminders whose jobs all left their claim dropped
        (one statement per Citus shard, each its own transaction on one
        worker; on plain PostgreSQL one), the shards with a claim still past
        its expiry found again, then expire_claims on each of those in its
        own transaction (a transaction over several shards' claimed jobs
        could lock them in another order than an outcome batch does), all
        of them in one round trip. The shards of a Citus shard that could
        not be reached (errors.unreachable) are left out, and added to
        `away`."""
        with self.connection() as conn:
            # (the clock read first: Citus evaluates no mh_now() in a distributed DELETE's COALESCE)
            now = conn.execute(q("db_now")).fetchone()["now"]
        found, read = self._all_reachable("shards_with_expired_claims", list(shards),
                                          lambda part, routed: {"shards": part, "now": now}, "claim expiry")
        if away is not None:
            away.update(set(shards) - set(read))
        if not found:
            return 0, 0
        parts = self._by_citus_shard(r["shard"] for r in found)
        answered = self._each_answered("drop_finished_claim_checks",
                                       [{"shards": part, "now": now} for part in parts], "claim expiry")
        reached = [s for part, got in zip(parts, answered) if got is not None for s in part]
        if away is not None:
            away.update(s for part, got in zip(parts, answered) if got is None for s in part)
        with self.connection() as conn:
            due = [r["shard"] for r in conn.execute(q("shards_with_expired_claims"),
                                                    {"shards": reached, "now": now}).fetchall()]
        rows = [r[0] for r in self._each_answered("expire_claims", [{"shard": s} for s in due], "claim expiry")
                if r is not None]
        return sum(r["returned"] for r in rows), sum(r["dead"] for r in rows)

    def cascade(self) -> tuple[int, int]:
        row = self._one("cascade_wheel", {})
        return row["from_far"], row["from_hours"]

    def sweep(self) -> tuple[int, int]:
        row = self._one("sweep_passed", {})
        return row["buckets"], row["carried"]

    def retain(self, shards: Sequence[int], default_s: int, limit: int = 500) -> Retained:
        """One retention pass over each shard with work (retain_jobs), in one
        round trip: finished jobs past their team's retention (default_s:
        the server's) are removed, at most `limit` filed ones and `limit`
        walked ones per shard. The shards with work are found first, in one
        statement (shards_with_retention_work): an idle pass calls nothing
        more. On Citus, the shards of a worker node away wait."""
        with self.connection() as conn:
            at = conn.execute(q("retention_cut"), {"default_s": default_s}).fetchone()
        found, read = self._all_reachable("shards_with_retention_work", list(shards),
                                          lambda part, routed: {"shards": part, **at}, "retention")
        marked = {r["shard"] for r in found if not r["work"]}
        work = sorted({r["shard"] for r in found if r["work"]} | (set(read) - marked))
        rows = [r[0] for r in self._each_answered(
            "retain_jobs", [{"shard": s, "default_s": default_s, "limit": limit} for s in work], "retention")
            if r is not None]
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

    def purge_events(self, shards: Sequence[int]) -> int:
        """Drop events (and delivery attempts) past their retention."""
        purged = sum(r["purged"] for r in self._pipelined("purge_events", [{"shard": s} for s in shards]))
        return purged + self._one("purge_deliveries", {})["purged"]

    def maintain(self) -> Maintenance:
        return Maintenance(**self._one("maintain", {}))
