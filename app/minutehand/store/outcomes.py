"""Outcomes: what is reported of claimed jobs (start, heartbeat, complete,
fail, release), each kind written by its own procedure in batches; keyed
jobs' results recorded under their keys; and a cancel
(sql/queries/outcomes.sql)."""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minutehand.store import citus, errors
from minutehand.store.base import StoreBase, _jsonb
from minutehand.store.queries import q
from minutehand.store.records import Outcome


# What a worker (or the dispatcher) reports about a claimed job, one record
# per kind: each names the job and the lease token of the claim it acts on.
@dataclass(frozen=True, slots=True)
class Start:
    """The worker began running the job (claimed → running)."""
    job_id: int
    lease_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The job still runs: extend its claim to now + extend_s."""
    job_id: int
    lease_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class Complete:
    """The job succeeded; result is its JSON text (None: no result)."""
    job_id: int
    lease_token: uuid.UUID
    result: bytes | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The job failed: retried after backoff while attempts remain and
    retryable, else dead."""
    job_id: int
    lease_token: uuid.UUID
    error: str
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Release:
    """Give back a claimed job that was not started: due again at once,
    the attempt not counted. A job whose start was reported is refused,
    with a reason beginning STARTED."""
    job_id: int
    lease_token: uuid.UUID


# How release_many's refusal of a started job begins (sql/functions/outcomes.sql):
# the worker protocol answers it as a refusal of its own kind.
STARTED = "job has started"


@dataclass(frozen=True, slots=True)
class Record:
    """A keyed job's handler returned: its result (JSON text; None: no
    result) recorded under the job's idempotency key, whatever its claim."""
    job_id: int
    result: bytes | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The answer to a Record: the result the key holds (JSON text: the
    first recorded), or refused (nothing to record it under) and why."""
    job_id: int
    ok: bool
    result: str | None
    reason: str | None


Report = Start | Heartbeat | Complete | Fail | Release | Record


class OutcomeStore(StoreBase):
    """Outcomes and cancel, a part of Store."""

    def start(self, items: Sequence[Start]) -> list[Outcome]:
        return self._outcomes("start_many", _held(items))

    def heartbeat(self, items: Sequence[Heartbeat], extend_s: float) -> list[Outcome]:
        return self._outcomes("heartbeat_many", {**_held(items), "extend_s": extend_s})

    def complete(self, items: Sequence[Complete]) -> list[Outcome]:
        return self._outcomes("complete_many", {**_held(items), "results": _results(items)})

    def fail(self, items: Sequence[Fail]) -> list[Outcome]:
        return self._outcomes("fail_many", {**_held(items), "errors": [i.error for i in items],
                                            "retryable": [i.retryable for i in items]})

    def release(self, items: Sequence[Release]) -> list[Outcome]:
        return self._outcomes("release_many", _held(items))

    def record(self, items: Sequence[Record]) -> list[Recorded]:
        return self._outcomes("record_results", {"ids": [i.job_id for i in items], "results": _results(items)},
                              answer=Recorded)

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

    def _outcomes(self, name: str, params: dict[str, Any], answer: type = Outcome) -> list[Any]:
        """params: parallel lists, one item each ("ids" first), and values for all."""
        calls = self.outcome_calls(params["ids"])
        if len(calls) == 1:
            return [answer(**r) for r in self._all(name, params)]
        # One call per Citus shard, all sent in one round trip, each its own transaction.
        per_call = [{k: [v[at] for at in positions] if isinstance(v, list) else v for k, v in params.items()}
                    for positions in calls]
        with self.connection() as conn:
            results = self.each_alone(conn, q(name), per_call)
        outcomes: list[Any] = [None] * len(params["ids"])
        failed: Exception | None = None
        for positions, rows in zip(calls, results):
            if isinstance(rows, Exception):
                failed = failed or rows
                continue
            for at, r in zip(positions, rows):
                outcomes[at] = answer(**r)
        if failed is not None:
            if all(o is None for o in outcomes):
                raise failed
            raise errors.OutcomesPartlyWritten(outcomes, failed)
        return outcomes

    def cancel(self, job_id: int, team: str | None) -> Outcome:
        """Cancel a job that has not started, as `team`; team None (an
        administrator) acts through the job's own team. A claimed job is not
        cancelled at once: ok with state 'claimed', the cancel is requested
        (its worker's answer decides: sql/functions/outcomes.sql)."""
        if team is None:
            row = self._one("job_team", {"job_id": job_id})
            if row is None:
                return Outcome(job_id, False, None, "no such job")
            team = row["team"]
        return Outcome(**self._one("cancel", {"job_id": job_id, "team": team}))


def _held(items: Sequence[Report]) -> dict[str, list]:
    """The parameters every report on a claim has: the jobs and their lease tokens."""
    return {"ids": [i.job_id for i in items], "tokens": [i.lease_token for i in items]}


def _results(items: Sequence[Complete | Record]) -> list:
    return [_jsonb(i.result) if i.result is not None else None for i in items]
