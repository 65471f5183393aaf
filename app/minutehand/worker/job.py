"""What a handler receives (`Job`), how it says "do not retry"
(`NonRetryable`), and how a handler's exception is told to the scheduler
(`error_text`)."""
from __future__ import annotations

import datetime as dt
import types
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from minutehand.protocol import JobId

T = TypeVar("T")

MAX_ERROR = 10_000          # longest error text the protocol takes


class NonRetryable(Exception):
    """Raise from a handler when another attempt cannot succeed (bad payload,
    a refusal that will not change): the job is marked dead at once instead
    of being retried."""


@dataclass(frozen=True)
class Job:
    """One run of one job. `team` submitted it; `attempt` counts from 1;
    `payload` is the decoded JSON the submitter sent (for a task's handler,
    the task's payload type, which a handler may say: `job: Job[Invoice]`).
    `idempotency_key` is the submitter's key, if any."""
    # Job[Invoice] holds at runtime too, as list[int] does (not typing.Generic,
    # which changes how the dataclass is built).
    __class_getitem__ = classmethod(types.GenericAlias)

    id: JobId
    team: str
    name: str
    payload: Any
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    due_at: dt.datetime
    run_at: dt.datetime
    claim_expires_at: dt.datetime
    # the claim's token and period: the worker's business, not the handler's
    lease_token: uuid.UUID | None = field(default=None, repr=False, compare=False)
    claim_s: float = field(default=30.0, repr=False, compare=False)

    def effect_key(self, effect: str) -> str:
        """The key a side effect of this job is recorded under: the same on
        every run of the job (and of any job submitted with the same key)."""
        return f"{self.idempotency_key or self.id}:{effect}"

    def once(self, conn, effect: str, fn: Callable[[Any], T]) -> T | Any:
        """Do fn(conn) exactly once for this job, atomically with recording it
        (see app/minutehand/worker/effects.py); the stored result on later runs."""
        from minutehand.worker import effects   # psycopg: imported by those who use it
        return effects.once(conn, self.effect_key(effect), fn)

    async def once_async(self, conn, effect: str, fn: Callable[[Any], Awaitable[T]]) -> T | Any:
        """`once` for a psycopg AsyncConnection and an async fn."""
        from minutehand.worker import effects
        return await effects.once_async(conn, self.effect_key(effect), fn)


def error_text(exc: BaseException) -> str:
    """"ExcType: message", cut to what the protocol takes."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR]
