"""Single submissions that arrive together reach the database together.

Each POST /v1/jobs waits on a future; a few worker threads take whatever has
queued up (at most max_batch, without waiting for more) and send it as one
Store.submit_many per team: one procedure call and one commit for many
requests, instead of one each. Nothing waits to fill a batch, so a lone
request goes out at once; under load, batches grow by themselves.

submit_jobs and submit_job validate alike (one implementation, in SQL), but
submit_jobs reports a refusal as text, without its kind (400/409/413). An
item it refused was written nowhere, so that item alone is sent again
through Store.submit, whose refusal carries its SQLSTATE: the caller gets
the same status and reason as if it had come alone. A batch call that fails
as a whole for a reason other than the database being away (one item's
value PostgreSQL cannot hold) is likewise retried item by item. Items with the same
idempotency key in one batch are matched by the procedure itself (the
second names the first's job).

Each team's share of a batch is admitted first
(app/minutehand/web/admission.py): the jobs its rate limit and pending
ceiling let in now go on, in the order they arrived; each of the others
gets its own refusal (429) and is written nowhere. Those let in are written
as Admission.written says (a team with a ceiling: checked again in their
transaction); should that check refuse them all (other submissions of the
team committed meanwhile), each goes alone, so those that still fit are
written and each other gets its 429.
"""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import psycopg

from minutehand.futures import BatchThreads, settle
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec, Submitted
from minutehand.web.admission import Admission


@dataclass
class _Pending:
    team: str
    spec: JobSpec
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class SubmitCoalescer:
    def __init__(self, store: Store, admission: Admission, workers: int = 4, max_batch: int = 1000):
        self.store = store
        self.admission = admission
        self._threads = BatchThreads("submit", workers, self._send, max_batch)

    async def submit(self, team: str, spec: JobSpec) -> Submitted:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._threads.put(_Pending(team, spec, future, loop))
        return await future

    # A Service (minutehand.lifecycle): the submit threads run from start() to stop().
    def start(self) -> None:
        self._threads.start()

    def stop(self) -> None:
        self._threads.stop()

    # ------------------------------------------------------------ workers
    def _send(self, batch: list[_Pending]) -> None:
        by_team: dict[str, list[_Pending]] = {}
        for p in batch:
            by_team.setdefault(p.team, []).append(p)
        for team, group in by_team.items():
            try:
                admitted, refusal = self.admission.admit_some(team, len(group))
            except Exception as exc:              # the database is away, an unknown team: the group's fate
                self._settle(group, [(None, exc)] * len(group))
                continue
            outcomes = self._submit(team, group[:admitted]) if admitted else []
            self._settle(group, outcomes + [(None, refusal)] * (len(group) - admitted))

    def _submit(self, team: str, group: list[_Pending]) -> list[tuple[Any, BaseException | None]]:
        """(result, exception) per item of the group, in order."""
        try:
            items = self.admission.written(team, len(group),
                                           functools.partial(self.store.submit_many, team, [p.spec for p in group]))
        except psycopg.OperationalError as exc:   # the database is away: every item shares that fate
            return [(None, exc)] * len(group)
        except Exception as exc:
            if len(group) == 1:
                return [(None, exc)]
            # One item's value the database cannot hold (a number out of range,
            # a NUL character) fails the whole call: it must not fail the
            # other requests, so each goes alone.
            items = [None] * len(group)
        outcomes: list[tuple[Any, BaseException | None]] = []
        for p, item in zip(group, items):
            if item is not None and item.error is None:
                outcomes.append((Submitted(item.job_id, item.run_at, item.created), None))
                continue
            try:                                  # refused, written nowhere: again alone, for its kind
                outcomes.append((self.admission.written(team, 1, functools.partial(self.store.submit, team, p.spec)),
                                 None))
            except Exception as exc:
                outcomes.append((None, exc))
        return outcomes

    @staticmethod
    def _settle(group: list[_Pending], outcomes: list[tuple[Any, BaseException | None]]) -> None:
        settle((p.future, p.loop, result, exc) for p, (result, exc) in zip(group, outcomes))
