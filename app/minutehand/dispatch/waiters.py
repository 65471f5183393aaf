"""The long-polls waiting at a dispatcher, in queue order, kept by filter
(the job names and teams a waiter takes), so that a round looks only at
the filters that may have jobs due: tens of thousands of idle polls for
other names cost a round nothing. Measured before, with 18,000 polls of
1,000 names, a round walked the whole queue under the dispatcher's lock,
the event loop queued behind it, and a due job reached its worker after
p50 0.2-1.1 s, p99 1.8-4.1 s (ops/bench/README.md, the fleet).
"""
from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

# What a waiter takes: (job names, teams); None for either means any.
Filter = tuple[tuple[str, ...] | None, tuple[str, ...] | None]


@dataclass(eq=False)
class Waiter:
    worker: str
    capacity: int
    filter: Filter
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    state: str = "waiting"               # waiting -> taken (being served) | gone (timed out, or ended)
    expired: bool = False                # its wait ran out while it was being served
    seq: int = 0                         # its place in the queue (Waiters)

    @property
    def named(self) -> bool:
        """Takes only some job names: its planned cells may hold only others."""
        return self.filter[0] is not None


_place = attrgetter("seq")


class Waiters:
    """The queue. Not thread-safe: the dispatcher calls it holding its lock.
    A waiter that stops waiting (timed out, or its worker ended its polls)
    stays, marked gone, until they are half of what is kept: tens of
    thousands of long-polls timing out together must not each sweep it."""

    def __init__(self) -> None:
        self._by_filter: dict[Filter, deque[Waiter]] = {}
        self._by_name: dict[str, set[Filter]] = {}
        self._any_name: set[Filter] = set()
        self._back = 0                       # the next place at the back
        self._front = 0                      # the last place given in front
        self._kept = 0                       # waiters in the queues, gone ones included
        self._gone = 0                       # gone ones still in the queues

    def waiting(self) -> int:
        return self._kept - self._gone

    def append(self, w: Waiter) -> None:
        """At the back of the queue."""
        w.seq = self._back
        self._back += 1
        self._queue(w.filter).append(w)
        self._kept += 1

    def appendleft(self, w: Waiter) -> None:
        """In front of every other."""
        self._front -= 1
        w.seq = self._front
        self._queue(w.filter).appendleft(w)
        self._kept += 1

    def leave(self, w: Waiter) -> None:
        """A waiting one stops waiting (timed out, or ended)."""
        w.state = "gone"
        self._gone += 1
        if self._gone * 2 > self._kept:
            self._sweep()

    def of_worker(self, worker: str) -> list[Waiter]:
        return [w for q in self._by_filter.values() for w in q if w.worker == worker and w.state == "waiting"]

    def clear(self) -> list[Waiter]:
        """Empties the queue; the ones that were waiting."""
        waiting = [w for q in self._by_filter.values() for w in q if w.state == "waiting"]
        self.__init__()
        return waiting

    def filters(self) -> Iterable[Filter]:
        """The filters with waiters (perhaps only gone ones)."""
        return self._by_filter.keys()

    def candidates(self, names: Iterable[str], unknown: bool) -> set[Filter]:
        """The filters that may take rows of these job names: those of any
        name and those naming one of them; every filter when some rows'
        names are unknown."""
        if unknown:
            return set(self._by_filter)
        found = set(self._any_name)
        for n in names:
            found.update(self._by_name.get(n, ()))
        return found

    def take(self, filters: Iterable[Filter], n: int) -> list[Waiter]:
        """The first n waiting waiters of these filters, in queue order,
        marked taken and out of the queue."""
        picked: list[Waiter] = []
        for f in filters:
            k = 0
            for w in self._by_filter.get(f, ()):
                if w.state == "waiting":
                    picked.append(w)
                    k += 1
                    if k == n:
                        break
        picked = heapq.nsmallest(n, picked, key=_place) if len(picked) > n else sorted(picked, key=_place)
        chosen: dict[Filter, int] = {}
        for w in picked:
            w.state = "taken"
            chosen[w.filter] = chosen.get(w.filter, 0) + 1
        # A queue is in queue order, so its taken ones are its first waiting
        # ones: pop up to the last of them (gone ones between go too).
        for f, left in chosen.items():
            q = self._by_filter[f]
            while left:
                w = q.popleft()
                self._kept -= 1
                if w.state == "taken":
                    left -= 1
                else:
                    self._gone -= 1
        return picked

    # -------------------------------------------------------------- inside
    def _queue(self, f: Filter) -> deque[Waiter]:
        q = self._by_filter.get(f)
        if q is None:
            q = self._by_filter[f] = deque()
            if f[0] is None:
                self._any_name.add(f)
            else:
                for name in f[0]:
                    self._by_name.setdefault(name, set()).add(f)
        return q

    def _sweep(self) -> None:
        """Only the waiting ones stay; filters without any are forgotten."""
        for f, q in list(self._by_filter.items()):
            kept = deque(w for w in q if w.state == "waiting")
            if kept:
                self._by_filter[f] = kept
                continue
            del self._by_filter[f]
            if f[0] is None:
                self._any_name.discard(f)
            else:
                for name in f[0]:
                    filters = self._by_name[name]
                    filters.discard(f)
                    if not filters:
                        del self._by_name[name]
        self._kept = sum(len(q) for q in self._by_filter.values())
        self._gone = 0
