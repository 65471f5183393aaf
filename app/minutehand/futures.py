"""Requests answered in batches by threads: the store is synchronous, so
what many requests ask for is written by a few threads, each taking all
that has queued up as one batch (BatchThreads), and each request waiting
on its future (in an event loop) is resolved with one wake-up per loop
(settle)."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def settle(answers: Iterable[tuple[asyncio.Future, asyncio.AbstractEventLoop, Any, BaseException | None]],
           on_gone: Callable[[Any], None] | None = None) -> None:
    """Resolve each (future, loop, result, exception). on_gone(result) is
    called (in the loop) for a result whose request went away first."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
    for future, loop, result, exc in answers:
        by_loop.setdefault(loop, []).append(_resolver(future, result, exc, on_gone))
    for loop, resolvers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_run_all, resolvers)
        except RuntimeError:                      # that loop is closed: its requests are gone
            log.debug("event loop closed before its requests were answered")
            if on_gone is not None:
                for r in resolvers:
                    r.gone()


class _resolver:
    __slots__ = ("future", "result", "exc", "on_gone")

    def __init__(self, future, result, exc, on_gone):
        self.future, self.result, self.exc, self.on_gone = future, result, exc, on_gone

    def __call__(self) -> None:
        if self.future.done():                    # the request went away (cancelled)
            self.gone()
        elif self.exc is not None:
            self.future.set_exception(self.exc)
        else:
            self.future.set_result(self.result)

    def gone(self) -> None:
        if self.on_gone is not None and self.exc is None:
            self.on_gone(self.result)


def _run_all(resolvers: list[Callable[[], None]]) -> None:
    for r in resolvers:
        r()


class BatchThreads(Generic[T]):
    """`threads` threads calling handle(batch) with what has been put: each
    waits for one item, then takes whatever else is queued, up to `limit`
    (counted by size(item)), without waiting for more. Nothing waits to
    fill a batch: a lone item goes at once; under load, batches grow.
    A Service (minutehand.lifecycle): the threads run from start() to stop()."""

    def __init__(self, name: str, threads: int, handle: Callable[[list[T]], None], limit: int,
                 size: Callable[[T], int] = lambda _: 1):
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._handle, self._limit, self._size = handle, limit, size
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def put(self, item: T) -> None:
        self._queue.put(item)

    def stop(self) -> None:
        """Finish what is queued, then stop the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, n = [first], self._size(first)
            while n < self._limit:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:                  # closing: this batch first, then stop
                    self._queue.put(None)
                    break
                batch.append(item)
                n += self._size(item)
            self._handle(batch)
