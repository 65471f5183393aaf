"""How long a stopping worker waits: polls in flight and running jobs get
until the grace period ends; a second signal (hurry) cuts it short."""
from __future__ import annotations

import asyncio
import math
import time


class Grace:
    def __init__(self, hurry: asyncio.Event):
        self.hurry = hurry
        self.ends = math.inf                # time.monotonic() instant; set when stopping begins
        self.seconds = math.inf

    def begin(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends = time.monotonic() + seconds

    async def wait(self, tasks: list[asyncio.Task]) -> None:
        """Wait for tasks until the grace period ends, or a second signal."""
        pending = {t for t in tasks if not t.done()}
        hurry = asyncio.create_task(self.hurry.wait())
        try:
            while pending and not hurry.done() and (left := self.ends - time.monotonic()) > 0:
                done, _ = await asyncio.wait(pending | {hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
        finally:
            hurry.cancel()
