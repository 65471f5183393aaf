"""Outcomes from workers reach the database in batches: every start,
heartbeat, keyed result recorded, completion, failure and give-back that
arrives while the previous batch is being written goes into the next one,
one procedure call per kind and one transaction each, so the commit rate
does not cap throughput. Nothing waits to fill a batch: a lone outcome is
written at once.

Each request waits on a future for its own reports' answers (ok, or why
refused), matched by position.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from minutehand import metrics
from minutehand.futures import BatchThreads, settle
from minutehand.store import errors
from minutehand.store.outcomes import Complete, Fail, Heartbeat, Record, Release, Report, Start
from minutehand.store.records import Outcome
from minutehand.store.store import Store

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    reports: Sequence[Report]            # all of one kind
    extend_s: float | None
    future: asyncio.Future | None       # None: nobody waits (written by the dispatcher itself)
    loop: asyncio.AbstractEventLoop | None


class OutcomeWriter:
    def __init__(self, store: Store, *, extend_s: float, threads: int = 2, max_items: int = 5000):
        self.store = store
        self.extend_s = extend_s
        self._threads = BatchThreads("outcomes", threads, self._send, max_items, size=lambda p: len(p.reports))

    async def write(self, reports: Sequence[Report], extend_s: float | None = None) -> list[Outcome]:
        """Write reports of one kind; their answers, in order. extend_s:
        heartbeats extend claims to now + extend_s (default: the claim period)."""
        if not reports:
            return []
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._threads.put(_Pending(reports, extend_s, future, loop))
        return await future

    def later(self, reports: Sequence[Report]) -> None:
        """Write reports without waiting for the answer (jobs given back, or
        failed, by the dispatcher itself)."""
        if reports:
            self._threads.put(_Pending(reports, None, None, None))

    # A Service (minutehand.lifecycle): the writing threads run from start() to
    # stop(), which writes what is queued first.
    def start(self) -> None:
        self._threads.start()

    def stop(self) -> None:
        self._threads.stop()

    def _send(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[type, float | None], list[_Pending]] = {}
        for p in batch:
            kind = type(p.reports[0])
            key = (kind, (p.extend_s or self.extend_s) if kind is Heartbeat else None)
            groups.setdefault(key, []).append(p)
        for (kind, extend_s), group in groups.items():
            self._write(kind, extend_s, group)

    def _write(self, kind: type, extend_s: float | None, group: list[_Pending]) -> None:
        items = [r for p in group for r in p.reports]
        try:
            outcomes = self._call(kind, items, extend_s)
            metrics.OUTCOME_BATCH.labels(kind.__name__.lower()).observe(len(items))
        except errors.OutcomesPartlyWritten as exc:
            self._settle_partly(kind, extend_s, group, exc)
            return
        except psycopg.OperationalError as exc:   # the database is away: every request shares that fate
            log.warning("writing %d %s outcomes failed: %s", len(items), kind.__name__, exc)
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
            log.warning("writing %d %s outcomes failed: %s", len(items), kind.__name__, exc)
            settle((p.future, p.loop, None, exc) for p in group if p.future is not None)
            return
        answers, at = [], 0
        for p in group:
            if p.future is not None:
                answers.append((p.future, p.loop, outcomes[at:at + len(p.reports)], None))
            at += len(p.reports)
        settle(answers)

    def _settle_partly(self, kind: type, extend_s: float | None, group: list[_Pending],
                       partly: errors.OutcomesPartlyWritten) -> None:
        """The batch went as several calls (one per Citus shard) and some
        failed, writing nothing of theirs: each request gets the answers
        written, and its unanswered reports are sent again on their own (a
        value the database cannot hold fails only its own request)."""
        answers, at = [], 0
        for p in group:
            got = list(partly.outcomes[at:at + len(p.reports)])
            at += len(p.reports)
            missing = [i for i, o in enumerate(got) if o is None]
            if missing and len(group) == 1 and len(missing) == len(got):
                answers.append((p.future, p.loop, None, partly.cause))
                continue
            if missing:
                try:
                    again = self._call(kind, [p.reports[i] for i in missing], extend_s)
                except errors.OutcomesPartlyWritten as exc:
                    again = exc.outcomes
                    log.warning("writing %s outcomes failed: %s", kind.__name__, exc.cause)
                except Exception as exc:
                    log.warning("writing %d %s outcomes failed: %s", len(missing), kind.__name__, exc)
                    answers.append((p.future, p.loop, None, exc))
                    continue
                for i, o in zip(missing, again):
                    got[i] = o
                if any(o is None for o in got):
                    answers.append((p.future, p.loop, None, partly.cause))
                    continue
            answers.append((p.future, p.loop, got, None))
        settle(a for a in answers if a[0] is not None)

    def _call(self, kind: type, items: list, extend_s: float | None) -> list[Outcome]:
        """The procedure call for each kind of report."""
        if kind is Heartbeat:
            return self.store.heartbeat(items, extend_s)
        writers = {Start: self.store.start, Complete: self.store.complete, Fail: self.store.fail,
                   Release: self.store.release, Record: self.store.record}
        return writers[kind](items)
