"""Which shards this dispatcher owns: membership, a balanced assignment, and
the leases that make it so.

Every lease period / 5 the keeper renews its membership row, reads the live
members, and computes the assignment by rendezvous hashing: each shard goes
to the member with the highest hash(member, shard). Every member computes
the same answer with no coordination; when one joins or leaves, only the
shards whose winner changed move (about S/N), and each member owns about
S/N. It then takes or renews the leases of its shards and releases the
ones that now belong to another member (which takes them on its next tick).

The renewal also carries what the quotas need from the whole fleet: each
member says which teams wait on its shards with quota headroom, which have
due rows there and how many jobs of each run from there, and learns what
the others said (fairness.Fleet): so that a team's quota is divided between
the members where its due work is, and none lends capacity past a quota
while a team with headroom waits anywhere.

A member that stops renewing drops out when its membership row and its
leases expire (both one lease period after its last renewal); the others'
next tick assigns and takes its shards. The fencing epoch in each lease
(sql/functions/claim.sql) refuses the claims of an old owner that wakes up late.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from minutehand import metrics
from minutehand.dispatch.fairness import Fleet
from minutehand.store.claim import MemberSays
from minutehand.store.store import Store

log = logging.getLogger(__name__)


def _weight(member: str, shard: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{member}/{shard}".encode(), digest_size=8).digest(), "big")


def assign(shards: Sequence[int], members: Sequence[str]) -> dict[int, str]:
    """shard -> member, by rendezvous (highest random weight) hashing."""
    if not members:
        return {}
    return {s: max(members, key=lambda m: _weight(m, s)) for s in shards}


class ShardKeeper:
    """Keeps this dispatcher's shard leases; calls on_change(leases) with
    {shard: epoch} whenever the set or an epoch changes. A Service
    (minutehand.lifecycle): renews from start() to stop()."""

    def __init__(self, store: Store, name: str, lease_s: float,
                 on_change: Callable[[dict[int, int]], None],
                 says: Callable[[], MemberSays] = MemberSays,
                 on_fleet: Callable[[Fleet], None] = lambda fleet: None):
        self.store = store
        self.name = name
        self.shards: Sequence[int] = range(0)     # every shard; read at start (building needs no database)
        self.lease_s = lease_s
        self.on_change = on_change
        self.says = says
        self.on_fleet = on_fleet
        self.leases: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-keeper", daemon=True)

    def start(self) -> None:
        self.shards = range(len(self.store.shard_owners()))
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether its thread renews the leases (started, not stopped, not ended)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop renewing, give every shard up and leave, so the others take
        over at once rather than after the leases expire."""
        self._stop.set()
        self._thread.join(timeout=self.lease_s)
        try:
            if self.leases:
                self.store.release_leases(self.leases, self.name)
            self.store.leave_dispatchers(self.name)
        except Exception:
            log.warning("could not release shard leases on stop (they expire by themselves)", exc_info=True)
        self._set({})

    def drop(self, stale: dict[int, int]) -> None:
        """Forget leases whose claims were refused ({shard: the epoch they
        were made under}: another owner took them). A lease renewed since
        under a new epoch (it had lapsed, and this one took it again while
        those claims were on their way) is still this one's."""
        if any(self.leases.get(s) == e for s, e in stale.items()):
            self._set({s: e for s, e in self.leases.items() if stale.get(s) != e})

    def tick(self) -> None:
        members = self.store.dispatcher_members(self.name, self.lease_s, self.says())
        owners = assign(self.shards, list(members))
        counts = Counter(owners.values())
        self.on_fleet(Fleet([(counts[m], says) for m, says in members.items() if m != self.name]))
        mine = [s for s, m in owners.items() if m == self.name]
        others = {s: e for s, e in self.leases.items() if owners.get(s) != self.name}
        if others:
            self.store.release_leases(others, self.name)
        held = self.store.take_leases(mine, self.name, self.lease_s)
        if held != self.leases:
            gained, lost = held.keys() - self.leases.keys(), self.leases.keys() - held.keys()
            if gained or lost:
                log.info("shards: %d owned (+%d -%d), %d members", len(held), len(gained), len(lost), len(members))
            if lapsed := sum(1 for s, e in held.items() if s in self.leases and self.leases[s] != e):
                # Another took them meanwhile (or they lapsed unseen): claims made under the old epochs are refused.
                log.warning("shards: %d leases lapsed and were taken again under new epochs", lapsed)
        self._set(held)

    def _set(self, leases: dict[int, int]) -> None:
        if leases != self.leases:
            metrics.SHARD_TAKEOVERS.inc(len(leases.keys() - self.leases.keys()))
            metrics.SHARD_LEASES.set(len(leases))
            self.leases = leases
            self.on_change(dict(leases))

    def _run(self) -> None:
        interval = self.lease_s / 5
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.warning("shard lease renewal failed; retrying", exc_info=True)
            self._stop.wait(interval)
