"""Outcomes from workers reach the database in batches: every heartbeat,
completion, failure and give-back that arrives while the previous batch is
being written goes into the next one, one procedure call per kind and one
transaction each, so the commit rate does not cap throughput. Nothing
waits to fill a batch: a lone outcome is written at once.

Each request waits on a future for its own items' answers (ok, or why
refused), matched by position.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import psycopg

from minutehand.futures import BatchThreads, settle
from minutehand.store.records import Outcome
from minutehand.store.store import Store

log = logging.getLogger(__name__)

KINDS = ("heartbeat", "complete", "fail", "release")


@dataclass
class _Pending:
    kind: str
    items: list[tuple]
    extend_s: float | None
    future: asyncio.Future | None       # None: nobody waits (written by the dispatcher itself)
    loop: asyncio.AbstractEventLoop | None


class OutcomeWriter:
    def __init__(self, store: Store, *, extend_s: float, threads: int = 2, max_items: int = 5000):
        self.store = store
        self.extend_s = extend_s
        self._threads = BatchThreads("outcomes", threads, self._send, max_items, size=lambda p: len(p.items))

    async def write(self, kind: str, items: list[tuple], extend_s: float | None = None) -> list[Outcome]:
        """items per kind: heartbeat/release (id, token); complete (id, token,
        result); fail (id, token, error, retryable)."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._threads.put(_Pending(kind, items, extend_s, future, loop))
        return await future

    def later(self, kind: str, items: list[tuple]) -> None:
        """Write outcomes without waiting for the answer (jobs given back, or
        failed, by the dispatcher itself)."""
        if items:
            self._threads.put(_Pending(kind, items, None, None, None))

    # A Service (minutehand.lifecycle): the writing threads run from start() to
    # stop(), which writes what is queued first.
    def start(self) -> None:
        self._threads.start()

    def stop(self) -> None:
        self._threads.stop()

    def _send(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[str, float | None], list[_Pending]] = {}
        for p in batch:
            key = (p.kind, (p.extend_s or self.extend_s) if p.kind == "heartbeat" else None)
            groups.setdefault(key, []).append(p)
        for (kind, extend_s), group in groups.items():
            self._write(kind, extend_s, group)

    def _write(self, kind: str, extend_s: float | None, group: list[_Pending]) -> None:
        items = [i for p in group for i in p.items]
        try:
            outcomes = self._call(kind, extend_s, items)
        except psycopg.OperationalError as exc:   # the database is away: every request shares that fate
            log.warning("writing %d %s outcomes failed: %s", len(items), kind, exc)
            settle((p.future, p.loop, None, exc) for p in group if p.future is not None)
            return
        except Exception as exc:
            if len(group) > 1:
                # One request's value the database cannot hold (a result with
                # a NUL character) fails the whole call: it must not fail the
                # other requests, so each goes alone.
                for p in group:
                    self._write(kind, extend_s, [p])
                return
            log.warning("writing %d %s outcomes failed: %s", len(items), kind, exc)
            settle((p.future, p.loop, None, exc) for p in group if p.future is not None)
            return
        answers, at = [], 0
        for p in group:
            if p.future is not None:
                answers.append((p.future, p.loop, outcomes[at:at + len(p.items)], None))
            at += len(p.items)
        settle(answers)

    def _call(self, kind: str, extend_s: float | None, items: list[tuple]) -> list[Outcome]:
        if kind == "heartbeat":
            return self.store.heartbeat(items, extend_s)
        return getattr(self.store, kind)(items)
