"""The dispatcher: hands due jobs of its shards to workers that ask.

Workers long-poll (app/api/workers.py): each request becomes a Waiter with room for
`capacity` jobs, perhaps only of some job names or teams (its filter). One
thread claims for the waiters in turn, from the shards this dispatcher
leases (shards.py), and answers each with what it got.

It never polls empty buckets. For each shard it knows the next run time
among the rows of its current and next minute buckets (next_due), and
sleeps until the earliest, or until:
- a NOTIFY names shards that got rows due now (mh_enqueue in sql/functions/wheel.sql; a
  listener thread marks those shards due),
- the minute turns (every shard's next run time is read again: the wheel
  moved a bucket on), or the shard set changed.
An unfiltered claim that comes back short means the shard is drained for
now: its next run time is read again. A filtered claim that comes back
short says only that nothing of that filter is due there: the shard stays
due for the others, and is skipped for that filter until a wake-up names
the shard, the minute turns, or FILTERED_RECHECK_S passes (rows of the
filter that became due by the clock alone). So a worker whose job names
have nothing due neither spins nor stands in the way of the others.

What a round claimed is never lost: a job that cannot be handed out (its
worker went away, the round failed) is given back at once, the attempt not
counted; a row that cannot be delivered at all (a value no client can
read) fails alone, set aside as dead with the reason.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass

import msgspec
import psycopg

from minutehand.dispatch.outcomes import OutcomeWriter
from minutehand.dispatch.shards import ShardKeeper
from minutehand.futures import settle
from minutehand.protocol import JobId, LeasedJob, Replay
from minutehand.settings import Settings
from minutehand.store import errors
from minutehand.store.records import ClaimRequest, Fail, Release
from minutehand.store.store import Store

log = logging.getLogger(__name__)

CHANNEL = "minutehand_due"
MAX_SHARDS_PER_WAITER = 64      # claims for one waiter in one round trip
MAX_WAITERS_PER_ROUND = 32
FILTERED_RECHECK_S = 1.0        # a shard found empty for a filter is tried again for it after this

# What a waiter takes: (job names, teams); None for either means any.
Filter = tuple[tuple[str, ...] | None, tuple[str, ...] | None]


@dataclass(eq=False)
class Waiter:
    worker: str
    capacity: int
    filter: Filter
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    state: str = "waiting"               # waiting -> taken (being served) | gone (timed out)
    expired: bool = False                # its wait ran out while it was being served

    @property
    def filtered(self) -> bool:
        return self.filter != (None, None)


def _key(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(sorted(set(values))) if values is not None else None


class Dispatcher:
    """A Service (minutehand.lifecycle): start() begins its threads and its
    shard keeper, stop() answers every waiting worker, then stops them. The
    outcome writer is given, started before the dispatcher and stopped after
    it (app/serve.py). Building one needs no database (the app's OpenAPI
    schema is built from it)."""

    def __init__(self, settings: Settings, store: Store, writer: OutcomeWriter):
        self.settings = settings
        self.store = store
        self.name = settings.dispatcher_name or f"{socket.gethostname()}:{os.getpid()}"
        self.claim_s = settings.claim_lease_s
        self.writer = writer
        self.keeper = ShardKeeper(store, self.name, settings.shard_lease_s, self._leases_changed)
        self._cond = threading.Condition()
        self._waiters: deque[Waiter] = deque()
        self._leases: dict[int, int] = {}
        self._due: dict[int, float] = {}          # shard -> next run time known (epoch s); absent: none soon
        self._recheck: set[int] = set()          # shards whose next run time must be read again
        self._generation = 0                      # bumped by every event that may make jobs claimable
        self._marked: dict[int, int] = {}         # shard -> generation a NOTIFY last marked it due at
        self._woken_at: dict[int, float] = {}     # shard -> when a NOTIFY last marked it due
        self._refreshed_at = 0.0                  # when every shard's next run time was last read
        self._empty: dict[Filter, dict[int, float]] = {}   # filter -> {shard: when a claim for it came up short}
        self._next_refresh = 0.0
        self._cursor = 0
        self._taken: list[Waiter] = []           # the waiters being served (put back if the round fails)
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._dispatch, name="dispatch", daemon=True),
                         threading.Thread(target=self._listen, name="listen", daemon=True)]

    # ------------------------------------------------------------ life
    def start(self) -> None:
        for t in self._threads:
            t.start()
        self.keeper.start()
        log.info("dispatcher %s started", self.name)

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            gone = list(self._waiters)
            self._waiters.clear()
            self._cond.notify_all()
        settle((w.future, w.loop, [], None) for w in gone)
        for t in self._threads:
            t.join(timeout=10)
        self.keeper.stop()
        log.info("dispatcher %s stopped", self.name)

    def owned_shards(self) -> list[int]:
        """The shards this dispatcher leases now (its maintenance works on these)."""
        return sorted(self._leases)

    # ------------------------------------------------------------ workers ask
    async def lease(self, worker: str, capacity: int, names: list[str] | None, wait_s: float,
                    gone: Awaitable[object] | None = None, teams: list[str] | None = None) -> list[LeasedJob]:
        """Up to `capacity` jobs for this worker, of these job names and teams
        (None: any), waiting up to wait_s for them. `gone` completes if the
        worker hangs up first: then nothing is claimed for it, or what was
        claimed is given back at once. A claim that fails for this worker's
        request alone raises here, and fails no other worker's."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(worker, min(capacity, self.settings.dispatch_batch), (_key(names), _key(teams)),
                        loop.create_future(), loop)
        with self._cond:
            if self._stopping.is_set():
                return []
            self._waiters.append(waiter)
            self._cond.notify()
        watch = asyncio.ensure_future(gone) if gone is not None else None
        try:
            done, _ = await asyncio.wait([waiter.future, *([watch] if watch else [])], timeout=wait_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if watch is not None:
                watch.cancel()
        if waiter.future.done():
            return waiter.future.result()
        with self._cond:
            if waiter.state == "waiting":         # timed out, or the worker left: nothing claimed for it
                waiter.state = "gone"
                self._waiters.remove(waiter)
                return []
            # Being served right now: the answer is moments away (jobs, or
            # none: then the round answers at once rather than queueing it again).
            waiter.expired = True
        if watch is not None and watch in done:   # the worker left: what is claimed for it goes back
            waiter.future.cancel()
            return []
        return await waiter.future

    # ------------------------------------------------------------ events
    def _leases_changed(self, leases: dict[int, int]) -> None:
        with self._cond:
            gained = leases.keys() - self._leases.keys()
            self._leases = leases
            self._due = {s: t for s, t in self._due.items() if s in leases}
            self._due.update({s: 0.0 for s in gained})
            self._generation += 1
            self._cond.notify()

    def _mark_due(self, shards: set[int] | None) -> None:
        """Shards (None: all) got rows due now."""
        with self._cond:
            self._generation += 1
            woken = time.time()
            for s in (self._leases if shards is None else shards & self._leases.keys()):
                self._due[s] = 0.0
                self._marked[s] = self._generation
                self._woken_at[s] = woken
            self._cond.notify()

    def _empty_for(self, filter_: Filter, shard: int, now: float) -> bool:
        """Whether a claim of this filter found the shard empty since anything
        could have made its rows due: a wake-up, the minute turning, the
        shard's next run time coming (called holding the lock)."""
        since = self._empty.get(filter_, {}).get(shard)
        return (since is not None and now - since < FILTERED_RECHECK_S
                and since >= self._woken_at.get(shard, 0.0) and since >= self._refreshed_at
                and not since < self._due.get(shard, 0.0) <= now)

    def _drop(self, refused: dict[int, str]) -> None:
        log.warning("claims refused on %d shards (another dispatcher owns them now): %s",
                    len(refused), next(iter(refused.values())))
        self.keeper.drop(list(refused))

    # ------------------------------------------------------------ the claim loop
    def _dispatch(self) -> None:
        while not self._stopping.is_set():
            try:
                self._refresh()
                if waiters := self._ready_waiters():
                    self._serve(waiters)
            except psycopg.OperationalError as exc:
                log.warning("dispatch: database unreachable (%s); retrying", exc)
                self._requeue_taken()
                self._stopping.wait(1.0)
            except Exception:
                log.exception("dispatch round failed")
                self._requeue_taken()
                self._stopping.wait(1.0)

    def _refresh(self) -> None:
        """Read next run times again: every owned shard once a minute (just
        after the minute turns), and the shards whose claims came up short."""
        now = time.time()
        with self._cond:
            if now >= self._next_refresh:
                shards = set(self._leases)
                self._next_refresh = (math.floor(now / 60) + 1) * 60 + 0.2
                self._refreshed_at = now
                self._empty.clear()
            else:
                shards = self._recheck & self._leases.keys()
            self._recheck.clear()
            asked_at = self._generation
        if not shards:
            return
        times = self.store.next_due_many(sorted(shards))
        with self._cond:
            for s, t in times.items():
                # A wake-up that came while the query ran is newer than its answer.
                if s not in self._leases or self._marked.get(s, -1) > asked_at:
                    continue
                if t is None:
                    self._due.pop(s, None)
                else:
                    self._due[s] = t.timestamp()
            self._generation += 1

    def _ready_waiters(self) -> list[Waiter]:
        """The waiters there may be jobs for (at most MAX_WAITERS_PER_ROUND,
        in queue order), marked taken: those with a due shard their filter
        has not found empty. None after sleeping until something changes."""
        with self._cond:
            now = time.time()
            due = {s for s, t in self._due.items() if t <= now}
            if due:
                open_for: dict[Filter, bool] = {}
                ready = []
                for w in self._waiters:
                    if w.filter not in open_for:
                        open_for[w.filter] = any(not self._empty_for(w.filter, s, now) for s in due)
                    if open_for[w.filter]:
                        ready.append(w)
                        if len(ready) == MAX_WAITERS_PER_ROUND:
                            break
                if ready:
                    for w in ready:
                        self._waiters.remove(w)
                        w.state = "taken"
                    self._taken = ready
                    return ready
            if self._recheck:
                return []
            wake = min([t for t in self._due.values() if t > now] + [self._next_refresh])
            if due and self._waiters:             # filters that found due shards empty look again
                lapse = [m + FILTERED_RECHECK_S for f in {w.filter for w in self._waiters}
                         for s, m in self._empty.get(f, {}).items() if s in due and m + FILTERED_RECHECK_S > now]
                if lapse:
                    wake = min(wake, min(lapse))
            self._cond.wait(max(0.0, wake - now))
            if time.time() >= wake - 0.001:
                self._generation += 1             # a run time came, or the minute turned
            return []

    def _requeue_taken(self) -> None:
        """After a failed round: the waiters being served wait again."""
        expired = []
        with self._cond:
            for w in reversed(self._taken):
                if w.state == "taken" and w.expired:
                    w.state = "done"
                    expired.append(w)
                elif w.state == "taken":
                    w.state = "waiting"
                    self._waiters.appendleft(w)
            self._taken = []
        settle((w.future, w.loop, [], None) for w in expired)

    def _serve(self, waiters: list[Waiter]) -> None:
        """Claim for several waiters at once, each from shards of its own, in
        one round trip per pass: first one shard each (a shard usually
        holds enough), then a few more each for those still short. Waiters
        with the same filter share the due shards; each filter skips the
        shards it found empty."""
        with self._cond:
            now = time.time()
            shards = [s for s, t in self._due.items() if t <= now and s in self._leases]
            leases = dict(self._leases)
            generation = self._generation
            if shards:
                self._cursor = (self._cursor + 1) % len(shards)
                shards = shards[self._cursor:] + shards[:self._cursor]     # every shard gets its turn first
            queues = {f: deque(s for s in shards if not self._empty_for(f, s, now))
                      for f in {w.filter for w in waiters}}       # shards that may still hold due rows
        got: dict[int, list[dict]] = {id(w): [] for w in waiters}
        failed: dict[int, Exception] = {}
        drained: set[int] = set()                 # unfiltered claims came up short: nothing due there
        empty: dict[Filter, set[int]] = {}        # filtered claims came up short
        per_waiter = 1                            # grows while shards come up short (sparse rows)
        try:
            while True:
                requests, whose = [], []
                for w in waiters:
                    queue = queues[w.filter]
                    left = 0 if id(w) in failed else w.capacity - len(got[id(w)])
                    picks = [queue.popleft() for _ in range(min(per_waiter, left, len(queue)))]
                    if not picks:
                        continue
                    each, extra = divmod(left, len(picks))
                    names, teams = w.filter
                    for k, s in enumerate(picks):
                        requests.append(ClaimRequest(s, leases[s], each + (1 if k < extra else 0), w.worker,
                                                     list(names) if names is not None else None,
                                                     list(teams) if teams is not None else None))
                        whose.append(w)
                if not requests:
                    break
                per_waiter = min(per_waiter * 4, MAX_SHARDS_PER_WAITER)
                results, refused = self.store.claim(requests, self.name, self.claim_s)
                if refused:
                    self._drop(refused)
                for r, w, rows in zip(requests, whose, results):
                    if isinstance(rows, errors.StaleLease):
                        continue
                    if isinstance(rows, Exception):   # this worker's request alone
                        log.warning("claim for worker %s failed: %s", w.worker, rows)
                        failed.setdefault(id(w), rows)
                        continue
                    got[id(w)].extend(rows)
                    if len(rows) < r.limit:
                        (empty.setdefault(w.filter, set()) if w.filtered else drained).add(r.shard)
                    else:
                        queues[w.filter].append(r.shard)   # may hold more, for the next one
            answers = [(w, self._deliverable(got[id(w)])) for w in waiters]
        except BaseException:
            # Claimed, committed, and not handed out: back at once, attempts not counted.
            self.writer.later([Release(r["job_id"], r["lease_token"]) for rows in got.values() for r in rows])
            raise
        with self._cond:
            for s in drained:
                if self._marked.get(s, -1) <= generation:   # no wake-up for it since this round began
                    self._due.pop(s, None)        # until its next run time is read again
                    self._recheck.add(s)
            for f, found_empty in empty.items():
                marks = self._empty.setdefault(f, {})
                for s in found_empty:
                    if self._marked.get(s, -1) <= generation:
                        marks[s] = now
                        # Due for others still; its next run time, read again, may be the
                        # moment rows of this filter become due (its mark then lapses).
                        self._recheck.add(s)
            settled = []
            for w, jobs in answers:
                if jobs or w.expired or id(w) in failed:
                    w.state = "done"
                    settled.append((w.future, w.loop, jobs, None if jobs else failed.get(id(w))))
                else:                             # waits on, behind the others; tried again after the next event
                    w.state = "waiting"
                    self._waiters.append(w)
            self._taken = []
        settle(settled, on_gone=self._give_back)

    def _deliverable(self, rows: list[dict]) -> list[LeasedJob]:
        """The claimed rows as jobs for a worker. A row that cannot be sent
        (a time no client can read) fails alone: dead at once, with the reason."""
        jobs, undeliverable = [], []
        for row in rows:
            try:
                jobs.append(_leased(row, self.claim_s))
            except (TypeError, ValueError) as exc:
                log.error("job %s cannot be delivered, set aside as dead: %s", row["job_id"], exc)
                undeliverable.append(Fail(row["job_id"], row["lease_token"],
                                          f"the job cannot be delivered to a worker: {exc}", retryable=False))
        self.writer.later(undeliverable)
        return jobs

    def _give_back(self, jobs: list[LeasedJob]) -> None:
        """The request went away before its jobs reached it."""
        if jobs:
            log.info("worker request gone: giving back %d jobs", len(jobs))
            self.writer.later([Release(j.job_id, j.lease_token) for j in jobs])

    # ------------------------------------------------------------ wake-ups
    def _listen(self) -> None:
        """LISTEN for due-now rows; reconnects after a failure (and then looks
        at every shard, having perhaps missed wake-ups meanwhile)."""
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self.store.pool.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._mark_due(None)
                    while not self._stopping.is_set():
                        # Wake at the first one, with whatever else has arrived by then.
                        got = list(conn.notifies(timeout=1.0, stop_after=1))
                        if got:
                            got += conn.notifies(timeout=0.001)
                        shards = {int(s) for n in got for s in n.payload.split(",") if s.isdigit()}
                        if shards:
                            self._mark_due(shards)
            except Exception as exc:
                if not self._stopping.is_set():
                    log.warning("listen: %s; reconnecting", exc)
                    self._stopping.wait(1.0)


def _leased(row: dict, claim_s: float) -> LeasedJob:
    for column in ("due_at", "run_at"):
        if row[column] is None:                 # claim_due: a time no client can read
            raise ValueError(f"its {column} is outside the years 1 to 9999 that a client can read")
    replay = Replay(msgspec.Raw(row["replay"].encode())) if row["replay"] is not None else None
    return LeasedJob(job_id=JobId(row["job_id"]), team=row["team"], name=row["name"],
                     payload=msgspec.Raw(row["payload"].encode()),
                     attempt=row["attempt"], max_attempts=row["max_attempts"],
                     idempotency_key=row["idempotency_key"], lease_token=row["lease_token"],
                     claim_expires_at=row["claim_expires_at"], claim_s=claim_s, due_at=row["due_at"],
                     run_at=row["run_at"], replay=replay)
