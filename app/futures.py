"""Answering asyncio futures from worker threads: the store is synchronous,
so batches are written by threads, and each request waiting on its
future (in an event loop) is resolved with one wake-up per loop."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

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
