"""Threads for sync handlers, started as needed up to the concurrency.
Daemon threads, so that a handler still stuck after the grace period does
not keep the process from exiting."""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

from minutehand.worker.job import error_text


class HandlerThreads:
    def __init__(self, size: int):
        self.size = size
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.busy = 0
        self.lock = threading.Lock()

    def run(self, fn: Callable, arg: Any) -> asyncio.Future:
        """fn(arg) in a thread; the future (of the running loop) gets its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.lock:
            self.busy += 1
            if self.busy > len(self.threads) and len(self.threads) < self.size:
                t = threading.Thread(target=self._serve, name=f"minutehand-handler-{len(self.threads)}",
                                     daemon=True)
                self.threads.append(t)
                t.start()
        self.queue.put((loop, fut, fn, arg))
        return fut

    def _serve(self) -> None:
        while (item := self.queue.get()) is not None:
            loop, fut, fn, arg = item
            try:
                result, error = fn(arg), None
            except Exception as exc:             # handed to the awaiting task: the job fails
                result, error = None, exc
            except BaseException as exc:         # sys.exit() in a handler fails its job, not the worker
                result, error = None, RuntimeError(f"the handler raised {error_text(exc)}")
            with self.lock:
                self.busy -= 1
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:
                pass                              # the loop is gone: the worker has stopped

    def close(self) -> None:
        """Each idle thread ends; a busy one ends when its handler returns."""
        for _ in self.threads:
            self.queue.put(None)


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
