"""A task: a job name and the type of its payload, declared once in a module
that both the submitter and the worker import.

    # invoices/tasks.py: imports nothing of the worker
    @dataclass
    class Invoice:
        number: int

    send_invoice = task("send_invoice", Invoice)

    # the submitter
    send_invoice.submit(client, Invoice(42), due_at=...)        # over HTTP
    send_invoice.submit_in(conn, Invoice(42), team="billing")   # in your own transaction

    # the worker
    @worker.handles(send_invoice)
    def send(job: Job[Invoice]): ... job.payload.number ...

The payload type is a msgspec Struct, a dataclass, or anything msgspec
converts (a TypedDict, a list[int]). The worker converts the job's JSON
into it before the handler runs; a payload that does not convert cannot
succeed on another attempt, so its job fails at once, not retried, with
the conversion's reason (Worker.handles)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from minutehand.protocol import dec_hook

P = TypeVar("P")


class PayloadError(ValueError):
    """A job's payload is not of its task's type."""


@dataclass(frozen=True)
class Task(Generic[P]):
    name: str
    payload_type: type[P]

    def check(self, payload: P) -> P:
        if not isinstance(payload, self.payload_type if isinstance(self.payload_type, type) else object):
            raise TypeError(f"task {self.name!r} takes a {self.payload_type.__name__} payload, "
                            f"not {type(payload).__name__}")
        return payload

    def decode(self, payload: Any) -> P:
        """The job's payload (decoded JSON) as the task's type."""
        try:
            return msgspec.convert(payload, self.payload_type, dec_hook=dec_hook)
        except msgspec.ValidationError as exc:
            type_name = getattr(self.payload_type, "__name__", str(self.payload_type))
            raise PayloadError(f"the payload of {self.name!r} does not decode as {type_name}: {exc}") from None

    def submit(self, client, payload: P, **options: Any):
        """Over HTTP: a Client (or AsyncClient: await it). Options: those of minutehand.client.job."""
        return client.submit(self.name, self.check(payload), **options)

    def submit_many(self, client, payloads, **options: Any):
        """Many jobs of this task, one per payload, with the same options."""
        from minutehand.client.jobs import job
        return client.submit_many([job(self.name, self.check(p), **options) for p in payloads])

    def submit_in(self, conn, payload: P, *, team: str, **options: Any):
        """In conn's transaction (minutehand.client.tx.submit)."""
        from minutehand.client import tx
        return tx.submit(conn, self.name, self.check(payload), team=team, **options)

    async def submit_in_async(self, conn, payload: P, *, team: str, **options: Any):
        from minutehand.client import tx
        return await tx.submit_async(conn, self.name, self.check(payload), team=team, **options)


def task(name: str, payload_type: type[P]) -> Task[P]:
    return Task(name, payload_type)
