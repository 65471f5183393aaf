"""The one lifecycle every background component follows: built without
side effects, then start() (threads or tasks begin, connections are made),
then stop() (what is queued is finished, threads or tasks end).

Two forms, by where a component runs:
- Service: threads (the dispatcher and its parts, maintenance, the API's
  submit threads). start() and stop() are plain calls; stop() blocks until
  the threads are done.
- AsyncService: asyncio tasks (the worker's loops). Both are awaited in the
  event loop that runs the tasks.

Services / AsyncServices start a list in order and stop it in reverse, so a
component stops before what it uses. This module imports nothing of
minutehand: the worker library uses it too.
"""
from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Service(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@runtime_checkable
class AsyncService(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Services:
    """Services started in order and stopped in reverse. A start that fails
    stops those already started, then raises; a stop that fails is logged
    and the others still stop. Itself a Service."""

    def __init__(self, *services: Service):
        self.services = list(services)
        self._started: list[Service] = []

    def start(self) -> None:
        for service in self.services:
            try:
                service.start()
            except BaseException:
                self.stop()
                raise
            self._started.append(service)

    def stop(self) -> None:
        while self._started:
            service = self._started.pop()
            try:
                service.stop()
            except Exception:
                log.exception("stopping %s failed", type(service).__name__)


class AsyncServices:
    """Services's asyncio form. Itself an AsyncService."""

    def __init__(self, *services: AsyncService):
        self.services = list(services)
        self._started: list[AsyncService] = []

    async def start(self) -> None:
        for service in self.services:
            try:
                await service.start()
            except BaseException:
                await self.stop()
                raise
            self._started.append(service)

    async def stop(self) -> None:
        while self._started:
            service = self._started.pop()
            try:
                await service.stop()
            except Exception:
                log.exception("stopping %s failed", type(service).__name__)
