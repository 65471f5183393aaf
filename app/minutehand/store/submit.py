"""Submission: one job, a batch, a repeating job with its first run
(sql/queries/submit.sql)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from minutehand import metrics
from minutehand.store import errors, repeat
from minutehand.store.base import StoreBase, _jsonb
from minutehand.store.queries import q
from minutehand.store.records import Repeat


# CPU one batch may spend finding the first fire times of its cron series.
FIRE_TIME_BUDGET_S = 1.0
# On Citus a batch's keyless jobs go to one Citus shard per this many (one
# worker node each, one call each): a small batch commits on one node, a
# large one is spread like single submissions, not piled on one node.
SPREAD_ROWS = 256

# A series' first run: its due time and its deadline (misfire skip), as
# computed before the transaction; (None, None): the procedure decides.
FirstRun = tuple[dt.datetime | None, dt.datetime | None]


@dataclass(frozen=True)
class JobSpec:
    """One job to submit (defaults as in submit_job). payload: any JSON value,
    or its JSON text already encoded, as bytes. With repeat: a series, stored
    with its first run (submit_series); due_at is then the first run's due
    time (every_s) or the earliest start (cron). traceparent: the W3C trace
    context it is submitted under, kept with the job (with a series, with
    its first run) so that the handler's span continues that trace; the
    procedures ignore one that is not valid."""
    name: str
    due_at: dt.datetime | None = None
    payload: Any = field(default_factory=dict)
    priority: int = 0
    max_attempts: int = 3
    flex_s: int | None = None      # None: the default window of the name (0 unless a rule sets one)
    strict: bool = False
    idempotency_key: str | None = None
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 3600.0
    repeat: Repeat | None = None
    traceparent: str | None = None


@dataclass(frozen=True)
class Submitted:
    job_id: int
    run_at: dt.datetime
    created: bool            # False: the idempotency key named an earlier job
    series_id: int | None = None   # a repeating job: its series (job_id is the first run)


@dataclass(frozen=True)
class BatchItem:
    idx: int
    job_id: int | None
    run_at: dt.datetime | None
    created: bool
    error: str | None
    series_id: int | None = None


_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
             for f in dataclasses.fields(JobSpec)}


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
        "traceparents": column("traceparent"), "shards": None,
    }


class SubmitStore(StoreBase):
    """Submission, a part of Store."""

    def submit(self, team: str, job: JobSpec) -> Submitted:
        metrics.SUBMIT_BATCH.observe(1)
        if job.repeat is not None:
            return self.submit_series(team, job)
        row = self._one("submit_job", {"team": team, "name": job.name, "due_at": job.due_at,
                                       "payload": _jsonb(job.payload), "priority": job.priority,
                                       "max_attempts": job.max_attempts, "flex_s": job.flex_s,
                                       "strict": job.strict, "idempotency_key": job.idempotency_key,
                                       "backoff_base_s": job.backoff_base_s,
                                       "backoff_cap_s": job.backoff_cap_s, "traceparent": job.traceparent})
        return Submitted(**row)

    def submit_many(self, team: str, jobs: Sequence[JobSpec]) -> list[BatchItem]:
        """One call for the whole batch: valid items are written together, invalid
        ones reported. Items in input order (idx = position).

        Repeating items (repeat set) are written in the same transaction, each
        through submit_series under a savepoint, so a refused one is reported
        (error) and written nowhere while the others commit together."""
        metrics.SUBMIT_BATCH.observe(len(jobs))
        if all(j.repeat is None for j in jobs):
            return self._submit_plain(team, jobs)
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

    def _submit_plain(self, team: str, jobs: Sequence[JobSpec]) -> list[BatchItem]:
        """Jobs without repeat, in one submit_jobs call per Citus shard they
        go to (on plain PostgreSQL, one call): the keyed ones on their
        key's, the keyless ones with the first of those (or a random one).
        Each call is then one transaction on one worker node; all are sent
        in one round trip. If some calls fail and others commit, the items
        of a failed call are answered with its error, written nowhere."""
        calls = self._submit_calls(team, jobs)
        if len(calls) == 1:
            rows = self._all("submit_jobs", {**_batch_params(team, jobs), "shards": calls[0][1]})
            return sorted((BatchItem(**r) for r in rows), key=lambda item: item.idx)
        with self.connection() as conn:
            results = self.each_alone(conn, q("submit_jobs"), [
                {**_batch_params(team, [jobs[at] for at in positions]), "shards": shards}
                for positions, shards in calls])
        if all(isinstance(r, Exception) for r in results):
            raise results[0]
        items: list[BatchItem] = []
        for (positions, _), rows in zip(calls, results):
            if isinstance(rows, Exception):
                reason = rows.message if isinstance(rows, errors.StoreError) else str(rows)
                items += [BatchItem(at, None, None, False, f"not written ({reason}): submit it again")
                          for at in positions]
            else:
                items += [BatchItem(**{**r, "idx": positions[r["idx"]]}) for r in rows]
        return sorted(items, key=lambda item: item.idx)

    def _submit_calls(self, team: str, jobs: Sequence[JobSpec]) -> list[tuple[list[int], list[int] | None]]:
        """(positions, the logical shards of one Citus shard) per call; on
        plain PostgreSQL one call over every shard (None). The keyless jobs
        go in slices to one Citus shard per SPREAD_ROWS of them: first those
        the keyed ones go to, then others at random."""
        groups = self._citus_groups()
        if not groups:
            return [(list(range(len(jobs))), None)]
        members: dict[int, list[int]] = {}
        for shard, group in groups.items():
            members.setdefault(group, []).append(shard)
        keyed = [at for at, j in enumerate(jobs) if j.idempotency_key is not None]
        calls: dict[int, list[int]] = {}
        if keyed:
            rows = self._all("key_shards", {"team": team, "keys": [jobs[at].idempotency_key for at in keyed]})
            for at, r in zip(keyed, rows):
                calls.setdefault(groups[r["shard"]], []).append(at)
        keyless = [at for at, j in enumerate(jobs) if j.idempotency_key is None]
        if keyless:
            spread = min(len(members), -(-len(keyless) // SPREAD_ROWS))
            targets = list(calls) + random.sample(sorted(members.keys() - calls.keys()), max(0, spread - len(calls)))
            size = -(-len(keyless) // spread)       # in order: the calls commit in it (first names first)
            for i, target in enumerate(targets[:spread]):
                calls.setdefault(target, []).extend(keyless[i * size:(i + 1) * size])
        return [(sorted(positions), members[group]) for group, positions in calls.items()]

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
            "misfire": r.misfire, "deadline": first[1], "traceparent": job.traceparent,
        }).fetchone()
        return Submitted(**row)
