"""What every route of the API and every page of the admin UI needs:
settings, the store, the token cache, admission, and a way to call the
(synchronous) store from async handlers without blocking the event loop,
recovering the pool when the database went away."""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import anyio.to_thread

from minutehand.settings import Settings
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec, Submitted
from minutehand.web.admission import Admission
from minutehand.web.auth import TokenCache

log = logging.getLogger(__name__)
T = TypeVar("T")


class Submitter(Protocol):
    """What sends single submissions, admitted there (the API's SubmitCoalescer)."""

    async def submit(self, team: str, spec: JobSpec) -> Submitted: ...


@dataclass
class Context:
    settings: Settings
    store: Store
    tokens: TokenCache
    head: str                                   # the migrations' head revision
    admission: Admission                        # teams' submission rates and pending ceilings
    submitter: Submitter | None = None          # single submissions, coalesced (and admitted there)
    _checking: threading.Lock = field(default_factory=threading.Lock)

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) in a worker thread (the store is synchronous)."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def database_unreachable(self) -> None:
        """After a request failed to reach the database: test the idle pooled
        connections in the background, so those a restart broke are replaced
        rather than handed to the next requests (one check at a time)."""
        if not self._checking.acquire(blocking=False):
            return

        def check() -> None:
            try:
                self.store.pool.check()
            except Exception:                   # the pool logs what it discards
                log.debug("pool check failed", exc_info=True)
            finally:
                self._checking.release()

        threading.Thread(target=check, name="pool-check", daemon=True).start()

    async def admitted(self, team: str, jobs: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), which writes `jobs` jobs of the team, once admission
        has let all of them in (else its refusal: nothing written), as
        Admission.admitted runs it; in one worker thread."""
        return await anyio.to_thread.run_sync(self.admission.admitted, team, jobs, functools.partial(fn, *args))

    async def submit(self, team: str, spec: JobSpec) -> Submitted:
        """One job (no repeat), admitted first."""
        if self.submitter is not None:
            return await self.submitter.submit(team, spec)
        return await self.admitted(team, 1, self.store.submit, team, spec)

    async def lookup_token(self, token_hash: str) -> str | None:
        return await self.db(self.store.team_for_token, token_hash)
