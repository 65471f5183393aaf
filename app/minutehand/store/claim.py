"""The dispatcher's side: shard leases, what each shard has due, claims for
workers, and the dispatchers' membership and duty leases
(sql/queries/claim.sql)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import psycopg
from psycopg.rows import RowFactory, RowMaker

from minutehand.store import errors
from minutehand.store.base import StoreBase
from minutehand.store.queries import q


# Claims per transaction: few commits a round, and the team_running rows a
# claim locks held no longer than that many statements take.
CLAIMS_PER_COMMIT = 32


@dataclass(frozen=True)
class ClaimRequest:
    """One claim of the dispatcher's round trip: up to `limit` due jobs of a
    shard it leases (at `epoch`) for a worker, of these job names and teams
    (None: any)."""
    shard: int
    epoch: int
    limit: int
    worker: str
    names: list[str] | None = None
    teams: list[str] | None = None


@dataclass(frozen=True, slots=True)
class PlannedClaim:
    """A claim the dispatcher planned across its shards (claim_planned): from
    one minute bucket of a shard, per cell (strict, priority, team id) up to
    its limit of due rows, of these job names (None: any)."""
    shard: int
    epoch: int
    worker: str
    bucket: dt.datetime
    stricts: list[bool]
    priorities: list[int]
    teams: list[int]
    limits: list[int]
    names: list[str] | None = None


@dataclass(slots=True)
class ClaimedJob:
    """A job a claim leased to a worker: what the worker is sent (payload
    and a replayed result as JSON text, handed on as they are; due_at and
    run_at None where no client could read them), its shard, and, from a
    planned claim, the cell it came from (bucket as Unix time, strict,
    priority, team id) that rotation orders by; and the W3C traceparent it
    was submitted under (None: none), which the worker's span continues."""
    job_id: int
    team: str
    name: str
    payload: str
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    lease_token: uuid.UUID
    claim_expires_at: dt.datetime
    due_at: dt.datetime | None
    run_at: dt.datetime | None
    replay: str | None
    shard: int
    team_id: int | None = None
    strict: bool | None = None
    priority: int | None = None
    bucket: float | None = None
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """What a claim request got instead of jobs: its shard's lease was stale
    (`stale`: the shard is another dispatcher's now), or its statement
    failed (`error`: the store's error, which its worker is told, unless
    `node_away`: its Citus worker node could not be reached, see
    errors.node_away, and the shard is worth trying again later)."""
    shard: int
    reason: str
    stale: bool = False
    error: Exception | None = None

    @property
    def node_away(self) -> bool:
        return errors.node_away(self.error)


# A claim request's answer.
Claimed = list[ClaimedJob] | ClaimRefused
_CLAIMED_FIELDS = [f.name for f in dataclasses.fields(ClaimedJob)]
_SHARD = _CLAIMED_FIELDS.index("shard")


def _claimed_rows(shard: int | None) -> RowFactory:
    """Rows of a claim statement as ClaimedJobs, and the one row a stale
    lease gives as a ClaimRefused; shard: the statement's own (None: each
    row names its shard, as claim_planned_shards' do)."""
    def factory(cursor) -> RowMaker:
        names = [c.name for c in cursor.description]
        refused, n = names.index("refused"), len(names)
        # Each field's column; past the row's end, a column it lacks (None) and the statement's shard.
        fields = itemgetter(*[names.index(f) if f in names else n + 1 if f == "shard" else n
                              for f in _CLAIMED_FIELDS])

        def make(values) -> ClaimedJob | ClaimRefused:
            row = fields((*values, None, shard))
            if values[refused] is not None:
                return ClaimRefused(row[_SHARD], values[refused], stale=True)
            return ClaimedJob(*row)
        return make
    return factory


@dataclass(frozen=True, slots=True)
class EdgeCell:
    """Rows due now in one shard's bucket, of one class and team (due_edge),
    and the job names among them (None: unknown, due_edges says when)."""
    bucket: dt.datetime
    strict: bool
    priority: int
    team_id: int
    due: int
    oldest: dt.datetime
    names: list[str] | None = None


@dataclass(frozen=True, slots=True)
class TeamTerms:
    """What the dispatcher shares capacity by: a team's quota and weight."""
    id: int
    name: str
    quota: int
    weight: int


@dataclass(frozen=True, slots=True)
class MemberSays:
    """What a dispatcher says with its membership renewal, for the quotas:
    the teams waiting on its shards with headroom, the teams with due rows
    there (None: not read yet, so any) and each team's jobs running from
    there."""
    waiting: frozenset[int] = frozenset()
    due: frozenset[int] | None = None
    running: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class _ClaimUnit:
    """One claim statement and the requests (indexes) it answers; `many`:
    over several shards, its rows naming theirs."""
    sql: str
    params: dict[str, Any]
    requests: list[int]
    shard: int                  # its first
    many: bool = False

    @property
    def rows(self) -> RowFactory:
        return _claimed_rows(None if self.many else self.shard)


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


class ClaimStore(StoreBase):
    """The dispatcher's side, a part of Store."""

    def take_leases(self, shards: Sequence[int], owner: str, ttl_s: float) -> dict[int, int]:
        """Take or renew shard leases; {shard: epoch} for those now held.
        One call (take_shard_leases) per Citus shard, all in one round trip,
        each its own transaction (on plain PostgreSQL, one call)."""
        params = [{"shards": part, "owner": owner, "ttl_s": ttl_s} for part in self._by_citus_shard(shards)]
        # A Citus shard whose node is away (or whose rows are locked for a move) is not held now.
        answered = self._each_answered("take_shard_leases", params, "shard leases")
        held = {r["shard"]: r["epoch"] for rows in answered if rows is not None for r in rows}
        return {s: held[s] for s in shards if s in held}

    def release_leases(self, leases: dict[int, int], owner: str) -> None:
        """Give shards ({shard: epoch}) up at once."""
        self._each_answered("release_shard_leases", [
            {"shards": part, "owner": owner, "epochs": [leases[s] for s in part]}
            for part in self._by_citus_shard(leases)], "releasing shard leases")

    def due_edges(self, shards: Sequence[int], since: dict[int, dt.datetime] | None = None, cap: int | None = None
                  ) -> dict[int, tuple[list[EdgeCell], dt.datetime | None]]:
        """Per shard, in one statement (due_edges): its cells due now (for the
        shards in `since`, only the rows that came due by the clock since
        then; each counted up to `cap` rows, None: all), and the next run
        time in its current and next buckets (None: none). On Citus, if a
        worker node could not be reached, one statement per Citus shard
        instead, and the shards of those that failed are left out."""
        since = since or {}
        rows, read = self._all_reachable("due_edges", list(shards), lambda part, routed: {
            "shards": part, "since": [since.get(s) for s in part], "cap": cap, "routed": routed}, "due edges")
        edges: dict[int, tuple[list[EdgeCell], dt.datetime | None]] = {s: ([], None) for s in read}
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
              synchronous_commit: bool = True) -> tuple[list[Claimed], dict[int, str]]:
        """Claims for workers, one answer per request: the jobs it claimed
        (claim_due, or claim_planned for a PlannedClaim, whose jobs carry
        their bucket), or a ClaimRefused (its shard's lease was stale, or its
        statement alone failed); and {shard: why} for the shards whose lease
        was stale.

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
        still claim; if its Citus shard group's node could not be reached
        (errors.node_away), all of them are refused so, at once
        (ClaimRefused.node_away). No commit waits for its WAL flush unless
        synchronous_commit (see Settings.claim_synchronous_commit)."""
        results: list[Claimed] = [[] for _ in requests]
        groups = self._citus_groups()
        sync = [] if synchronous_commit else [q("commit_without_flush")]     # first in each transaction
        with self.connection() as conn:
            units = self._claim_units(requests, owner, lease_s, together=not groups)
            for chunk in _claim_commits(units, groups):
                sql, args, rows = [u.sql for u in chunk], [u.params for u in chunk], [u.rows for u in chunk]
                together = self.in_one_transaction(conn, sync + sql, [{}] * len(sync) + args,
                                                   [None] * len(sync) + rows)
                if not isinstance(together, psycopg.Error):
                    got = together[len(sync):]
                elif errors.node_away(together):      # the whole group's node is away: all of it waits
                    got = [together] * len(chunk)
                else:                                   # one of them failed: each alone, so it fails alone
                    got = self.each_alone(conn, sql, args, rows)
                for unit, answer in zip(chunk, got):
                    if isinstance(answer, Exception):
                        for i in unit.requests:
                            results[i] = ClaimRefused(requests[i].shard, str(answer), error=answer)
                    elif not unit.many:
                        results[unit.requests[0]] = answer
                    else:
                        by_shard: dict[int, list] = {}      # (one pass: hundreds of shards)
                        for row in answer:
                            by_shard.setdefault(row.shard, []).append(row)
                        for i in unit.requests:
                            results[i] = by_shard.get(requests[i].shard, [])
        refused: dict[int, str] = {}
        for i, (r, answer) in enumerate(zip(requests, results)):
            if isinstance(answer, ClaimRefused):
                continue
            if answer and isinstance(answer[0], ClaimRefused):
                results[i] = answer[0]
                refused[r.shard] = answer[0].reason
            elif isinstance(r, PlannedClaim):
                bucket = r.bucket.timestamp()
                for job in answer:
                    job.bucket = bucket
        return results, refused

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

    # ------------------------------------------------------------ dispatchers
    def dispatcher_members(self, name: str, ttl_s: float, says: MemberSays) -> dict[str, MemberSays]:
        """Renew this dispatcher's membership with what it says; the live
        members by name (sorted), each with what it said."""
        teams = sorted(says.running)
        rows = self._all("dispatcher_members", {
            "name": name, "ttl_s": ttl_s, "waiting": sorted(says.waiting),
            "due": None if says.due is None else sorted(says.due),
            "running_teams": teams, "running": [says.running[t] for t in teams]})
        return {r["name"]: MemberSays(frozenset(r["waiting"]), None if r["due"] is None else frozenset(r["due"]),
                                      dict(zip(r["running_teams"], r["running"])))
                for r in rows}

    def leave_dispatchers(self, name: str) -> None:
        self._one("leave_dispatchers", {"name": name})

    def take_duty(self, duty: str, owner: str, ttl_s: float) -> bool:
        return self._one("take_duty_lease", {"duty": duty, "owner": owner, "ttl_s": ttl_s})["held"]

    def shard_owners(self) -> dict[int, tuple[str | None, int]]:
        """{shard: (current lease holder or None, epoch)}."""
        return {r["shard"]: (r["owner"], r["epoch"]) for r in self._all_at_now("shard_owners", {})}
