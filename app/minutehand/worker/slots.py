"""Free handler slots: never more handlers running than the concurrency. A
poll reserves some before it asks and gives back what the dispatcher did
not fill; a handler gives its slot back on return."""
from __future__ import annotations

import asyncio


class Slots:
    def __init__(self, n: int):
        self.free = n
        self.closed = False
        self._waiters: list[asyncio.Future] = []

    async def take(self, want: int) -> int:
        """Wait for at least one free slot; reserve up to `want`. 0: closed."""
        while self.free == 0 and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        return 0 if self.closed else self.try_take(want)

    def try_take(self, want: int) -> int:
        got = min(self.free, want)
        self.free -= got
        return got

    def give(self, n: int) -> None:
        if n:
            self.free += n
            self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
