"""The dispatcher: hands due jobs of its shards to workers that ask, in the
order and shares the scheduler promises (fairness.py).

Workers long-poll (app/minutehand/api/workers.py): each request becomes a Waiter with room for
`capacity` jobs, perhaps only of some job names or teams (its filter). One
thread claims for the waiters, from the shards this dispatcher leases
(shards.py), and answers each with what it got.

It knows what each shard has due: per minute bucket, class (strict,
priority) and team, how many rows and the oldest run time (due_edge, its
"edge"). A round pools the waiters' capacity, plans across all its shards
which rows go (fairness.plan: order, quotas with lending, weighted
rotation) and claims exactly those, on plain PostgreSQL one statement per
worker and bucket over all the shards (on Citus one per shard and bucket,
in transactions of up to 32 of one Citus shard's: Store.claim), so a few
commits however many shards the jobs trickled into; it counts down the
edges by what came back. The edges
of all the shards to look at are read in one statement too. An edge is
read again when:
- a NOTIFY names the shard (rows due now were added: mh_enqueue in
  sql/functions/wheel.sql; a listener thread marks those shards), but
  behind a backlog (BACKLOG_ROWS), while rows the last read found there are
  still unclaimed, no sooner than BUSY_REREAD_S after that read. A NOTIFY
  of a bulk submission (mh_enqueue_many) counts its rows due now by shard,
  class and team instead: they are added to the edges as they are, with
  no read (a read in flight then may count them twice, which only makes
  a claim come back short; it cannot miss them, as they committed before
  their NOTIFY came),
- its next run time comes (rows of its current bucket come due by the clock),
- the minute turns (every shard: the wheel moved a bucket on), or the shard
  was just leased,
- a claim came back with fewer rows than the edge promised (cancelled jobs,
  another claimer), or took a cell whose count the read capped (EDGE_CAP_MIN)
  down to nothing.
It sleeps until the earliest of these, never polling empty buckets.

Quotas: a team's quota is shared between the dispatchers where it has due
rows, by their shards, rounded up (fairness.Fleet, from what each said with
its membership renewal: shards.py); each counts the team's jobs running
from its own shards (their team_running rows, read every RUNNING_READ_S and
whenever its shards change) plus what it claimed since. So n dispatchers
together exceed a quota by at most n - 1 (the rounding), except while
shards change hands (docs/guides/teams.md, "Who goes first"). Capacity past
a quota is lent only while no team waits with headroom on any dispatcher:
each says which wait on its shards with its renewal (WAITING_S).

Workers that take only some job names (the worker library names its
handlers) are planned the same way, their claims limited to those names.
The index knows, per shard, the job names its due rows may have, or that
it does not know them (DueIndex.names): a read names, per cell, the names
of the rows it counted (unknown where it counted up to the cap, or past a
few names), replacing the shard's (a read since a time adds
to them), and a bulk submission's wake-up names the names of the rows it
counts (unknown where its payload could not carry them). A names-filtered
waiter is not ready for, and claims nothing from, a shard whose names are
known and none of its own: so a due job reaches a worker of its name in
the next round however many workers wait for names with nothing due. The
names are never fewer than the due rows have (every way a row comes due
is a wake-up, which reads or names, a run time coming or the minute
turning, which read); rows claimed or cancelled since only leave names
that find nothing.
Where a shard's names are unknown, or a planned cell held other names of
the filter's, their teams' headroom is claimed shard by shard in each
shard's own order (claim_due) over growing sets of the other due shards,
so a sparse name is found without a round per shard. A claim of theirs
that comes back short says only that nothing of that filter is due there:
the shard is skipped for that filter until a wake-up names it, the minute
turns, or FILTERED_RECHECK_S passes. So a worker whose job names have
nothing due neither spins nor stands in the way of the others.

What a round claimed is never lost: a job that cannot be handed out (its
worker went away, the round failed) is given back at once, the attempt not
counted; a row that cannot be delivered at all (a value no client can
read) fails alone, set aside as dead with the reason.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable
from dataclasses import dataclass, field

import msgspec
import psycopg

from minutehand import metrics
from minutehand.dispatch import fairness
from minutehand.dispatch.fairness import Budget, Class, DueIndex, Fleet
from minutehand.dispatch.outcomes import OutcomeWriter
from minutehand.dispatch.shards import ShardKeeper
from minutehand.dispatch.waiters import Filter, Waiter, Waiters
from minutehand.futures import settle
from minutehand.protocol import JobId, LeasedJob, Replay
from minutehand.settings import Settings
from minutehand.store.claim import ClaimedJob, ClaimRefused, ClaimRequest, MemberSays, PlannedClaim, TeamTerms
from minutehand.store.outcomes import Fail, Release
from minutehand.store.store import Store

log = logging.getLogger(__name__)

CHANNEL = "minutehand_due"
MAX_SHARDS_PER_TEAM = 64        # a names-filtered waiter's claims per team in one round trip
MAX_WAITERS_PER_ROUND = 32
FILTERED_RECHECK_S = 1.0        # a shard found empty for a filter is tried again for it this long after the round
RUNNING_READ_S = 0.25           # how often the jobs running per team are read (quota headroom)
# A team waits here (and the other dispatchers lend nothing past a quota)
# for WAITING_S after a round's capacity ran out before its headroom, or
# while no worker asks for WAITING_S / 2 and it has due rows and headroom.
WAITING_S = 1.0
TERMS_READ_S = 2.0              # how often teams' quotas and weights are read
# Behind a backlog (more than BACKLOG_ROWS due rows known and not claimed
# yet), a wake-up naming a shard with due rows still known reads its edge
# no sooner than BUSY_REREAD_S after the last whole read: counting every
# shard's due rows again at each submit would cost more than claiming
# them. A row of a new team or class there waits at most that long; below
# the backlog a wake-up reads at once (rotation between teams is exact).
BACKLOG_ROWS = 10_000
BUSY_REREAD_S = 0.5
# A shard whose read or claim could not reach its part of the cluster (on
# Citus: its worker node is away; each try fails at once) is neither read
# nor claimed for this long, then read whole.
ASIDE_S = 5.0
# A read counts each cell's due rows up to a cap (the oldest): enough over
# all the shards for two full waiters of one class and team, at least
# EDGE_CAP_MIN. So behind a backlog (a million rows due at midnight, or
# arrivals outrunning the workers) a read costs per cell, not per waiting
# row; a shard is read again once a capped cell of it is claimed down.
EDGE_CAP_MIN = 32

# A NOTIFY's rows due now, {shard: {cell: [rows, oldest]}}, and the job names
# of each shard's rows it names ({shard: names}; a shard absent: unknown).
Arrived = tuple[dict[int, dict[tuple[Class, int], list[float]]], dict[int, set[str]]]


def _key(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(sorted(set(values))) if values is not None else None


def _class(job: ClaimedJob) -> Class:
    return (job.bucket, job.strict, job.priority)


def _in_turn(jobs: list[ClaimedJob]) -> list[ClaimedJob]:
    """A waiter's jobs in the order they go out: the planned ones in
    rotation (fairness.rotate), then those claimed shard by shard."""
    planned = [j for j in jobs if j.bucket is not None]
    return fairness.rotate(planned, _class, lambda j: j.team) + [j for j in jobs if j.bucket is None]


@dataclass
class _Round:
    """What one dispatch round has asked for and got."""
    got: dict[int, list[ClaimedJob]]                 # per waiter: jobs claimed for it
    requests: list[ClaimRequest | PlannedClaim] = field(default_factory=list)    # not yet sent
    goes_to: list[Waiter] = field(default_factory=list)
    planned: list[dict[tuple[Class, int], int]] = field(default_factory=list)   # rows expected per cell
    asked: dict[int, int] = field(default_factory=lambda: defaultdict(int))      # per waiter: rows asked for
    failed: dict[int, Exception] = field(default_factory=dict)
    recount: set[int] = field(default_factory=set)   # shards whose edge must be read again
    short: dict[Filter, set[int]] = field(default_factory=lambda: defaultdict(set))   # empty for a filter

    def add(self, request: ClaimRequest | PlannedClaim, waiter: Waiter, cells: dict) -> None:
        self.requests.append(request)
        self.goes_to.append(waiter)
        self.planned.append(cells)
        self.asked[id(waiter)] += request.limit if isinstance(request, ClaimRequest) else sum(request.limits)


class Dispatcher:
    """A Service (minutehand.lifecycle): start() begins its threads and its
    shard keeper, stop() answers every waiting worker, then stops them. The
    outcome writer is given, started before the dispatcher and stopped after
    it (app/minutehand/serve.py). Building one needs no database (the app's OpenAPI
    schema is built from it)."""

    def __init__(self, settings: Settings, store: Store, writer: OutcomeWriter):
        self.settings = settings
        self.store = store
        self.name = settings.dispatcher_name or f"{socket.gethostname()}:{os.getpid()}"
        self.claim_s = settings.claim_lease_s
        self.writer = writer
        self.keeper = ShardKeeper(store, self.name, settings.shard_lease_s, self._leases_changed,
                                  self._says, self._fleet_changed)
        self._cond = threading.Condition()
        self._waiters = Waiters()                 # the long-polls waiting, in queue order
        self._leases: dict[int, int] = {}
        self._index = DueIndex()                  # what the shards have due, as last read and counted down
        self._lost: set[int] = set()              # shards given up since (their edges leave the index)
        self._due: dict[int, float] = {}          # shard -> when to read its edge again (epoch s); absent: none soon
        self._generation = 0                      # bumped by every event that may make jobs claimable
        self._marked: dict[int, int] = {}         # shard -> generation a NOTIFY last marked it due at
        self._woken_at: dict[int, float] = {}     # shard -> when a NOTIFY last marked it due
        self._read_at: dict[int, float] = {}      # shard -> when its whole edge was last read
        self._deferred: dict[int, float] = {}     # shard -> when to read it for a wake-up held back (BUSY_REREAD_S)
        self._arrived: list[Arrived] = []         # NOTIFYs' counts (and names), not yet in the index
        self._aside: dict[int, float] = {}        # shard -> until when it is left aside (ASIDE_S)
        self._refreshed_at = 0.0                  # when every shard's edge was last read
        # filter -> {shard: (when the round whose claim for it came up short began, when to try again)}.
        # The wait counts from the round's end: a round of many shards takes seconds on a
        # busy Citus cluster, and counted from its start the wait would be over by then, so
        # waiters whose names have nothing due would take every round from the others.
        self._empty: dict[Filter, dict[int, tuple[float, float]]] = {}
        self._next_refresh = 0.0
        self._taken: list[Waiter] = []           # the waiters being served (put back if the round fails)
        # Quotas and rotation (dispatch thread only).
        self._terms: dict[int, TeamTerms] = {}
        self._team_ids: dict[str, int] = {}
        self._terms_at = -math.inf
        self._running: dict[int, int] = {}       # team -> running on this one's shards, as last read
        self._running_on: set[int] = set()       # the shards it was read for
        self._mine: dict[int, int] = defaultdict(int)    # team -> claimed by this dispatcher since that read
        self.claimed = 0                         # jobs claimed since start (its maintenance chains after claims)
        self._running_at = -math.inf
        self._credit: dict[int, float] = {}      # the rotation's carried fractions, per team
        self._waiting_at: dict[int, float] = {}  # team -> when it last waited here with headroom (under _cond)
        self._idle_since: float | None = None    # since when no worker asks while rows are due
        self._fleet = Fleet()                    # what the other dispatchers said at the last renewal
        self._stopping = threading.Event()
        self._polls_closed = False                # stopping: long-polls are answered at once (under _cond)
        self._threads = [threading.Thread(target=self._dispatch, name="dispatch", daemon=True),
                         threading.Thread(target=self._listen, name="listen", daemon=True)]

    # ------------------------------------------------------------ life
    def start(self) -> None:
        for t in self._threads:
            t.start()
        self.keeper.start()
        log.info("dispatcher %s started", self.name)

    def close_polls(self) -> None:
        """Answer every waiting worker at once (no jobs) and every later
        long-poll too: the first step of a stop, taken as soon as the stop
        signal arrives, so the workers turn to other dispatchers and the HTTP
        server's graceful wait is not spent on polls. Any thread."""
        with self._cond:
            self._polls_closed = True
            gone = self._waiters.clear()
            self._cond.notify_all()
        settle((w.future, w.loop, [], None) for w in gone)

    def end_polls(self, worker: str) -> int:
        """Answer this worker's waiting long-polls at once (no jobs): it is
        stopping, and would otherwise wait for them to time out rather than
        hang up on an answer that may be on its way. A poll being served
        gets its answer as usual, moments away. How many were answered."""
        with self._cond:
            ended = self._waiters.of_worker(worker)
            for w in ended:
                self._waiters.leave(w)
        settle((w.future, w.loop, [], None) for w in ended)
        return len(ended)

    def stop(self) -> None:
        self._stopping.set()
        self.close_polls()
        for t in self._threads:
            t.join(timeout=10)
        self.keeper.stop()
        log.info("dispatcher %s stopped", self.name)

    def unready(self) -> str | None:
        """Why it cannot hand out jobs now (None: it can): stopping, a thread
        of it not running (not started yet, or ended), or no shard leased
        (others hold them all, or the database refuses them). /readyz says it."""
        if self._stopping.is_set():
            return "it is stopping"
        ended = [t.name for t in self._threads if not t.is_alive()] + ([] if self.keeper.running else ["shard-keeper"])
        if ended:
            return f"its {', '.join(ended)} thread{'s are' if len(ended) > 1 else ' is'} not running"
        if not self._leases:
            return "it holds no shard lease (other dispatchers hold them all, or the database refuses them)"
        return None

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
            if self._polls_closed:
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
                self._waiters.leave(waiter)
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
            self._lost |= self._index.of_shard.keys() - leases.keys()
            self._due.update({s: 0.0 for s in gained})
            for s in gained:                      # unread until read (again): its due teams unknown
                self._read_at.pop(s, None)
            self._generation += 1
            self._cond.notify()

    def _mark_due(self, shards: set[int] | None) -> None:
        """Shards (None: all) got rows due now."""
        with self._cond:
            self._generation += 1
            woken = time.time()
            behind = bool(self._index.capped) or sum(self._index.totals.values()) > BACKLOG_ROWS
            for s in (self._leases if shards is None else shards & self._leases.keys()):
                if behind and self._index.of_shard.get(s) and woken - self._read_at.get(s, 0.0) < BUSY_REREAD_S:
                    self._deferred.setdefault(s, self._read_at[s] + BUSY_REREAD_S)
                    continue
                self._due[s] = 0.0
                self._marked[s] = self._generation
                self._woken_at[s] = woken
            self._cond.notify()

    def _add_due(self, counted: list[Arrived]) -> None:
        """Rows due now that NOTIFYs counted, each by shard and cell, with
        their names: added to the index by the dispatch thread's next round,
        with no read."""
        with self._cond:
            self._generation += 1
            woken = time.time()
            self._arrived.extend(counted)
            for cells, _ in counted:
                for s in cells.keys() & self._leases.keys():
                    self._woken_at[s] = woken
            self._cond.notify()

    def _empty_for(self, filter_: Filter, shard: int, now: float) -> bool:
        """Whether a claim of this filter found the shard empty since anything
        could have made its rows due: a wake-up, the minute turning, the
        shard's next run time coming (called holding the lock)."""
        mark = self._empty.get(filter_, {}).get(shard)
        if mark is None:
            return False
        since, until = mark
        return (now < until
                and since >= self._woken_at.get(shard, 0.0) and since >= self._refreshed_at
                and not since < self._due.get(shard, 0.0) <= now)

    def _set_aside(self, shards: set[int], why: str) -> None:
        """Leave these shards aside for ASIDE_S (holding the lock, on the
        dispatch thread: the index is its own): out of the index, not read,
        woken or claimed; then read whole."""
        if not shards:
            return
        until = time.time() + ASIDE_S
        for s in shards:
            self._aside[s] = until
            self._index.remove_shard(s)
            self._due.pop(s, None)
            self._deferred.pop(s, None)
            self._read_at.pop(s, None)
        metrics.SHARDS_ASIDE.inc(len(shards))
        log.warning("%d shards left aside for %.0f s: %s", len(shards), ASIDE_S, why)

    def _drop(self, refused: dict[int, str], epochs: dict[int, int]) -> None:
        """Forget the leases the refused claims were made under (epochs: the
        claims'); one the keeper has taken anew since is kept."""
        log.warning("claims refused on %d shards (another dispatcher owns them now): %s",
                    len(refused), next(iter(refused.values())))
        metrics.STALE_CLAIMS.inc(len(refused))
        self.keeper.drop({s: epochs[s] for s in refused})

    # ------------------------------------------------------------ the claim loop
    def _dispatch(self) -> None:
        while not self._stopping.is_set():
            try:
                self._refresh()
                if waiters := self._ready_waiters():
                    self._serve(waiters)
                elif self._idle_since is not None and time.time() - self._idle_since >= WAITING_S / 2:
                    self._note_idle()
            except psycopg.OperationalError as exc:
                log.warning("dispatch: database unreachable (%s); retrying", exc)
                self._requeue_taken()
                self._stopping.wait(1.0)
            except Exception:
                log.exception("dispatch round failed")
                self._requeue_taken()
                self._stopping.wait(1.0)

    def _refresh(self) -> None:
        """Read edges again: every owned shard once a minute (just after the
        minute turns), and the shards marked since."""
        now = time.time()
        with self._cond:
            for s in self._lost:                  # the index is the dispatch thread's own
                self._index.remove_shard(s)
            self._lost.clear()
            for s in [s for s, t in self._aside.items() if t <= now]:
                del self._aside[s]
                if s in self._leases:
                    self._due[s] = 0.0            # read whole again
            for counted, names in self._arrived:
                for s, cells in counted.items():
                    if s in self._leases and s not in self._aside:
                        self._index.add_to_shard(s, cells, names=names.get(s))
            self._arrived.clear()
            for s in [s for s, t in self._deferred.items() if t <= now]:
                del self._deferred[s]
                if s in self._leases:             # a held-back wake-up: now
                    self._due[s] = 0.0
                    self._marked[s] = self._generation
                    self._woken_at[s] = now
            if now >= self._next_refresh:
                self._due.update(dict.fromkeys(self._leases, 0.0))
                self._next_refresh = (math.floor(now / 60) + 1) * 60 + 0.2
                self._refreshed_at = now
                self._empty.clear()
            for s in self._aside:
                self._due.pop(s, None)
            shards = sorted(s for s, t in self._due.items() if t <= now and s in self._leases)
            # A shard whose next run time came (not marked): only what came due since.
            # (A millisecond early: a float's rounding must not skip a row; one counted twice is
            # only a claim that comes back short, and the shard is read again.)
            since = {s: dt.datetime.fromtimestamp(self._due[s] - 0.001, dt.timezone.utc)
                     for s in shards if self._due[s] > 0}
            # Read from now on: behind a backlog, a wake-up while the read runs
            # is held back from it, not answered by another read right after.
            self._read_at.update((s, now) for s in shards if s not in since and self._index.of_shard.get(s))
            asked_at = self._generation
        if not shards:
            return
        cap = max(EDGE_CAP_MIN, math.ceil(2 * self.settings.dispatch_batch / max(1, len(self._leases))))
        edges = self.store.due_edges(shards, since, cap)
        with self._cond:
            self._set_aside(set(shards) - edges.keys(), "its edge could not be read")
            for s, (cells, next_at) in edges.items():
                if s not in self._leases:
                    continue
                cells_ = {((c.bucket.timestamp(), c.strict, c.priority), c.team_id): [c.due, c.oldest.timestamp()]
                          for c in cells}
                names = None if any(c.names is None for c in cells) else {n for c in cells for n in c.names}
                if s in since:
                    self._index.add_to_shard(s, cells_, cap, names)
                else:
                    self._index.set_shard(s, cells_, cap, names)
                    self._read_at[s] = now
                # A wake-up that came while the query ran is newer than its answer.
                if self._marked.get(s, -1) > asked_at:
                    continue
                if next_at is None:
                    self._due.pop(s, None)
                else:
                    self._due[s] = next_at.timestamp()
            self._generation += 1

    def _ready_waiters(self) -> list[Waiter]:
        """The waiters there may be jobs for (at most MAX_WAITERS_PER_ROUND,
        in queue order), marked taken. None after sleeping until something
        changes."""
        with self._cond:
            now = time.time()
            due = self._index.due_shards()
            if due:
                by_name, unknown = self._index.holders(due)
                open_ = []
                for f in self._waiters.candidates(by_name, bool(unknown)):
                    # A names-filtered waiter looks only where its names may be due.
                    may = due if f[0] is None else unknown + [s for n in f[0] for s in by_name.get(n, ())]
                    if any(not self._empty_for(f, s, now) for s in may):
                        open_.append(f)
                if ready := self._waiters.take(open_, MAX_WAITERS_PER_ROUND):
                    self._taken = ready
                    return ready
            if not due or self._waiters.waiting():
                self._idle_since = None
            elif self._idle_since is None:
                self._idle_since = now
            if self._arrived or any(t <= now for t in self._due.values()) \
                    or any(t <= now for t in self._deferred.values()):
                return []                         # (arrivals join the index at the next _refresh)
            wake = min([t for t in self._due.values() if t > now] + [self._next_refresh]
                       + list(self._deferred.values()) + list(self._aside.values()))
            event = wake
            if self._idle_since is not None:      # to say which teams wait here
                wake = min(wake, now + WAITING_S / 2)
            if due and self._waiters.waiting():   # filters that found due shards empty look again
                lapse = [until for f in self._waiters.filters()
                         for s, (_, until) in self._empty.get(f, {}).items() if s in due and until > now]
                if lapse:
                    wake = min(wake, min(lapse))
            self._cond.wait(max(0.0, wake - now))
            if time.time() >= event - 0.001:
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

    # ------------------------------------------------------------ quotas
    def _says(self) -> MemberSays:
        """What this dispatcher tells the others with its renewal (the shard
        keeper's thread): the teams waiting on its shards with headroom, the
        teams with due rows there (None until it holds shards and has read
        each) and each team's jobs running from there."""
        now = time.time()
        with self._cond:
            for t in [t for t, at in self._waiting_at.items() if now - at > WAITING_S]:
                del self._waiting_at[t]
            read = bool(self._leases) and all(s in self._read_at for s in self._leases)
            running = {t: self._running.get(t, 0) + self._mine.get(t, 0) for t in self._running.keys() | self._mine.keys()}
            return MemberSays(frozenset(self._waiting_at), frozenset(self._index.teams()) if read else None,
                              {t: n for t, n in running.items() if n > 0})

    def _fleet_changed(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def _note_idle(self) -> None:
        """No worker has asked for a while and rows are due: the teams with
        due rows and headroom wait here."""
        budgets = self._budgets()
        with self._cond:
            now = time.time()
            self._waiting_at.update((t, now) for t in self._index.teams() if t in budgets and budgets[t].headroom > 0)

    def _budgets(self) -> dict[int, Budget]:
        """Each team's weight and headroom here: its quota's share here
        (fairness.Fleet), less the team's jobs running from this one's shards
        (as last read, plus what this one claimed since; jobs finished since
        count until the next read)."""
        now = time.monotonic()
        if now - self._terms_at >= TERMS_READ_S:
            self._terms = {t.id: t for t in self.store.team_terms()}
            self._team_ids = {t.name: t.id for t in self._terms.values()}
            self._terms_at = now
        if now - self._running_at >= RUNNING_READ_S or self._running_on != self._leases.keys():
            self._running_on = set(self._leases)
            running = self.store.teams_running(sorted(self._running_on))
            with self._cond:                      # (read by _says too)
                self._running = running
                self._mine.clear()
            self._running_at = now
        fleet, shards = self._fleet, len(self._leases)
        return {t: Budget(terms.weight, fleet.headroom(terms.quota, t, shards,
                                                       self._running.get(t, 0) + self._mine.get(t, 0)))
                for t, terms in self._terms.items()}

    # ------------------------------------------------------------ a round
    def _serve(self, waiters: list[Waiter]) -> None:
        """Claim for the waiters: pooled by filter, each pool's capacity
        planned over every due shard (fairness.plan) and claimed in one
        round trip; then, for workers of some job names still short where
        planned cells held other names, shard by shard (claim_due) within
        each team's headroom. What comes back goes out in rotation order."""
        budgets = self._budgets()
        with self._cond:
            now = time.time()
            leases = dict(self._leases)
            generation = self._generation
            every = self._index.due_shards()
            due = [s for s in every if s in leases]
            # Per filter, the due shards it may take from; None: every one (then
            # planning needs no sum over shards).
            open_for: dict[Filter, set[int] | None] = {}
            for w in waiters:
                if w.filter not in open_for:
                    shut = {s for s in due if self._empty_for(w.filter, s, now)
                            or (w.named and not self._index.may_hold(s, w.filter[0]))}
                    open_for[w.filter] = None if not shut and len(due) == len(every) else set(due) - shut
        if self._index.teams() - budgets.keys():
            self._terms_at = -math.inf            # a team created since the last read
            budgets = self._budgets()
        round_ = _Round({id(w): [] for w in waiters})
        taken: dict = {}                          # what this round's plans hold, per (shard, (class, team))
        short: set[int] = set()                   # teams the capacity ran out for within their headroom
        pools: dict[Filter, list[Waiter]] = defaultdict(list)
        for w in waiters:
            pools[w.filter].append(w)
        for filter_, pool in pools.items():
            self._plan_pool(filter_, pool, open_for[filter_], budgets, leases, taken, round_, short)
        try:
            self._claim(round_, generation)
            # Workers of some names: planned cells that held other names leave them short.
            queues: dict[tuple[Filter, int], deque] = {}
            named = {id(w): self._named_plan(w, round_.got[id(w)],
                                             (due if open_for[w.filter] is None else open_for[w.filter]),
                                             round_.short[w.filter], budgets, queues)
                     for w in waiters if w.named and round_.short[w.filter]
                     and len(round_.got[id(w)]) < w.capacity and id(w) not in round_.failed}
            per_team = 1                          # shards tried per team, growing while they come up short
            while named:
                for w in waiters:
                    if id(w) not in named or id(w) in round_.failed:
                        continue
                    for team, (left, queue) in named[id(w)].items():
                        picks = [queue.popleft() for _ in range(min(per_team, left, len(queue)))]
                        each, extra = divmod(left, len(picks)) if picks else (0, 0)
                        for k, shard in enumerate(picks):
                            round_.add(ClaimRequest(shard, leases[shard], each + (1 if k < extra else 0), w.worker,
                                                    list(w.filter[0]), [self._terms[team].name]), w, {})
                if not round_.requests:
                    break
                per_team = min(per_team * 4, MAX_SHARDS_PER_TEAM)
                for r, w, rows in self._claim(round_, generation):
                    team = named[id(w)][self._team_ids[r.teams[0]]]
                    team[0] -= len(rows)
                    if len(rows) == r.limit:      # may hold more, for the next pass
                        team[1].append(r.shard)
            answers = [(w, self._deliverable(_in_turn(round_.got[id(w)]))) for w in waiters]
        except BaseException:
            # Claimed, committed, and not handed out: back at once, attempts not counted.
            self.writer.later([Release(j.job_id, j.lease_token) for jobs in round_.got.values() for j in jobs])
            raise
        mark = (now, time.time() + FILTERED_RECHECK_S)
        with self._cond:
            self._waiting_at.update(dict.fromkeys(short, now))
            for s in round_.recount:              # the rest of its edge stands until it is read again
                if self._marked.get(s, -1) <= generation and s in self._leases:
                    self._due[s] = 0.0
            for f, found_empty in round_.short.items():
                marks = self._empty.setdefault(f, {})
                for s in found_empty:
                    if self._marked.get(s, -1) <= generation:
                        marks[s] = mark
            settled = []
            for w, jobs in answers:
                if jobs or w.expired or id(w) in round_.failed:
                    w.state = "done"
                    settled.append((w.future, w.loop, jobs, None if jobs else round_.failed.get(id(w))))
                    continue
                w.state = "waiting"               # waits on, behind the others; tried again after the next event
                self._waiters.append(w)
                if not round_.asked[id(w)]:       # nothing its filter may take now: not before an event
                    marks = self._empty.setdefault(w.filter, {})
                    for s in (due if open_for[w.filter] is None else open_for[w.filter]):
                        marks[s] = mark
            self._taken = []
        settle(settled, on_gone=self._give_back)

    def _plan_pool(self, filter_: Filter, pool: list[Waiter], shards: set[int] | None, budgets: dict[int, Budget],
                   leases: dict[int, int], taken: dict, round_: _Round, short: set[int]) -> None:
        """The pool's capacity planned over what is due on these shards (None:
        all), less what the round's other pools took (`taken`, added to, as
        the budgets are counted down); each waiter a run of the takes in
        rotation order, so every answer mixes the teams, and a take is split
        only between two."""
        names, team_names = filter_
        teams = None if team_names is None else {self._team_ids[n] for n in team_names if n in self._team_ids}
        takes = fairness.plan(sum(w.capacity for w in pool), self._index, budgets, self._credit, teams, shards, taken,
                              self._fleet.waiting, short)
        for t in takes:
            budgets[t.team] = budgets[t.team].less(t.n)
        queue = deque(fairness.rotate(takes, lambda t: t.cls, lambda t: t.team))
        for w in pool:
            cells: dict[tuple[int, float], dict[tuple[Class, int], int]] = defaultdict(lambda: defaultdict(int))
            room = w.capacity
            while room and queue:
                t = queue.popleft()
                k = min(room, t.n)
                cells[t.shard, t.cls[0]][t.cls, t.team] += k
                room -= k
                if k < t.n:
                    queue.appendleft(fairness.Take(t.shard, t.cls, t.team, t.n - k))
            for (shard, bucket), wanted in cells.items():
                keys = list(wanted)
                round_.add(PlannedClaim(shard, leases[shard], w.worker, dt.datetime.fromtimestamp(bucket, dt.timezone.utc),
                                        [c[1] for c, _ in keys], [c[2] for c, _ in keys], [team for _, team in keys],
                                        [wanted[k] for k in keys], list(names) if names is not None else None),
                           w, dict(wanted))

    def _claim(self, round_: _Round, generation: int) -> list[tuple[ClaimRequest, Waiter, list[ClaimedJob]]]:
        """The round's pending requests in one round trip; what came back is
        the waiters', the edges are counted down by it. Returns the
        shard-by-shard (claim_due) requests with their rows."""
        requests, goes_to, planned = round_.requests, round_.goes_to, round_.planned
        round_.requests, round_.goes_to, round_.planned = [], [], []
        if not requests:
            return []
        results, refused = self.store.claim(requests, self.name, self.claim_s,
                                            self.settings.claim_synchronous_commit)
        claimed = sum(len(jobs) for jobs in results if isinstance(jobs, list))
        metrics.CLAIM_BATCH.observe(claimed)
        self.claimed += claimed
        if refused:
            self._drop(refused, {r.shard: r.epoch for r in requests})
        walked = []
        with self._cond:
            self._set_aside({rows.shard for rows in results
                             if isinstance(rows, ClaimRefused) and rows.node_away},
                            "its claim could not reach its node")
            for r, w, cells, rows in zip(requests, goes_to, planned, results):
                if isinstance(rows, ClaimRefused):
                    if rows.node_away:            # nothing for this worker from there, for now
                        continue
                    if not rows.stale:            # this worker's request alone
                        log.warning("claim for worker %s failed: %s", w.worker, rows.reason)
                        round_.failed.setdefault(id(w), rows.error)
                    continue
                round_.got[id(w)].extend(rows)
                for row in rows:
                    self._mine[self._team_ids.get(row.team, -1)] += 1
                if isinstance(r, ClaimRequest):   # the edge no longer says what is left there
                    round_.recount.add(r.shard)
                    if len(rows) < r.limit:
                        round_.short[w.filter].add(r.shard)
                    walked.append((r, w, rows))
                    continue
                came: dict[tuple[Class, int], int] = defaultdict(int)
                for row in rows:
                    came[_class(row), row.team_id] += 1
                for key, n in cells.items():
                    # Short without a names filter: none left there.
                    if self._index.take(r.shard, key, came[key], gone=came[key] < n and r.names is None):
                        round_.recount.add(r.shard)   # claimed down to its cap: more may wait
                    if came[key] < n:             # read it again; for these names, nothing here
                        round_.recount.add(r.shard)
                        if r.names is not None:
                            round_.short[w.filter].add(r.shard)
        return walked

    def _named_plan(self, w: Waiter, got: list[ClaimedJob], shards: list[int] | set[int], tried: set[int],
                    budgets: dict[int, Budget], queues: dict[tuple[Filter, int], deque]) -> dict[int, list]:
        """For a names-filtered waiter still short after the planned claims:
        {team: [jobs it may still take, the shards (of these, less those
        tried) holding the team's due rows, the latest woken and the best
        class first]} (the queue
        shared by the waiters of its filter); what it still has room for
        shared among the teams it may take by weight, within their headroom
        (this fallback does not lend)."""
        allowed = None if w.filter[1] is None else {self._team_ids.get(n) for n in w.filter[1]}
        open_ = set(shards) - tried
        where: dict[int, list[tuple[tuple, int]]] = defaultdict(list)
        for (cls, team), on in self._index.cells.items():
            if team in budgets and (allowed is None or team in allowed):
                # Shards a wake-up named most recently first: their new rows are what it has not seen.
                where[team] += [(-self._woken_at.get(s, 0.0), fairness.class_order(cls), s) for s in on if s in open_]
        caps = {t: budgets[t].headroom for t in where if budgets[t].headroom > 0}
        shares = fairness.share(w.capacity - len(got), caps, {t: budgets[t].weight for t in caps}, self._credit)
        plan = {}
        for team, n in shares.items():
            if n > 0:
                queue = queues.setdefault((w.filter, team), deque(dict.fromkeys(s for *_, s in sorted(where[team]))))
                plan[team] = [n, queue]
                budgets[team] = budgets[team].less(n)
        return plan

    def _deliverable(self, claimed: list[ClaimedJob]) -> list[LeasedJob]:
        """The claimed jobs as a worker is sent them. A job that cannot be sent
        (a time no client can read) fails alone: dead at once, with the reason."""
        jobs, undeliverable = [], []
        for job in claimed:
            try:
                jobs.append(_leased(job, self.claim_s))
            except (TypeError, ValueError) as exc:
                log.error("job %s cannot be delivered, set aside as dead: %s", job.job_id, exc)
                undeliverable.append(Fail(job.job_id, job.lease_token,
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
                        shards: set[int] = set()
                        counted = []
                        for n in got:
                            names: dict[int, set[str]] = {}
                            if cells := _parse_wake_up(n.payload, shards, names):
                                counted.append((cells, names))
                        if counted:
                            self._add_due(counted)
                        if shards:
                            self._mark_due(shards)
            except Exception as exc:
                if not self._stopping.is_set():
                    log.warning("listen: %s; reconnecting", exc)
                    self._stopping.wait(1.0)


def _parse_wake_up(payload: str, shards: set[int], names: dict[int, set[str]] | None = None
                   ) -> dict[int, dict[tuple[Class, int], list[float]]]:
    """A NOTIFY's payload (mh_enqueue_many in sql/functions/wheel.sql says
    its items): the shards it names go into `shards`, the job names it gives
    a shard's rows into `names`; the rows due now it counts are returned,
    {shard: {cell: [rows, oldest]}} (a payload counts each cell once)."""
    cells: dict[int, dict[tuple[Class, int], list[float]]] = {}
    bucket = None
    for item in payload.split(","):
        if item.isdigit():
            shards.add(int(item))
        elif "=" in item:
            shard, _, listed = item.partition("=")
            if names is not None:
                names[int(shard)] = set(listed.split("+"))
        elif item.startswith("@"):
            bucket = float(item[1:].split("/")[0])
        elif bucket is not None:
            shard, strict, priority, team, n, oldest_ms = map(int, item.split("/"))
            cells.setdefault(shard, {})[((bucket, strict == 1, priority), team)] = [n, bucket + oldest_ms / 1000]
    return cells


def _leased(job: ClaimedJob, claim_s: float) -> LeasedJob:
    for column, value in (("due_at", job.due_at), ("run_at", job.run_at)):
        if value is None:                       # claim_due: a time no client can read
            raise ValueError(f"its {column} is outside the years 1 to 9999 that a client can read")
    replay = Replay(msgspec.Raw(job.replay.encode())) if job.replay is not None else None
    return LeasedJob(job_id=JobId(job.job_id), team=job.team, name=job.name,
                     payload=msgspec.Raw(job.payload.encode()),
                     attempt=job.attempt, max_attempts=job.max_attempts,
                     idempotency_key=job.idempotency_key, lease_token=job.lease_token,
                     claim_expires_at=job.claim_expires_at, claim_s=claim_s, due_at=job.due_at,
                     run_at=job.run_at, replay=replay, traceparent=job.traceparent)
