"""A job to submit, as the wire protocol's own type (BatchJobIn: JobIn with
its idempotency key), built from Python values: one shape for the HTTP
client and for the in-transaction helpers (tx.py)."""
from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import msgspec

from minutehand import protocol
from minutehand.protocol.api import BatchJobIn, Repeat

AUTO_KEY_PREFIX = "mh-auto:"


def encode_payload(payload: Any) -> msgspec.Raw | msgspec.UnsetType:
    """Any JSON-able value (dicts, lists, msgspec Structs, dataclasses) as
    its JSON text; None leaves it out (the server's default, {})."""
    if payload is None:
        return msgspec.UNSET
    if isinstance(payload, msgspec.Raw):
        return payload
    return msgspec.Raw(msgspec.json.encode(payload, enc_hook=protocol.enc_hook))


def job(name: str, payload: Any = None, *, due_at: dt.datetime | None = None, priority: int = 0,
        max_attempts: int = 3, flex_s: int | None = None, strict: bool = False, backoff_base_s: float = 1.0,
        backoff_cap_s: float = 3600.0, repeat: Repeat | None = None,
        idempotency_key: str | None = None) -> BatchJobIn:
    """One job of a submission. due_at must carry its time zone (a naive
    time is refused, not guessed); None: now."""
    if due_at is not None and due_at.tzinfo is None:
        raise ValueError("due_at has no time zone: give an aware datetime (e.g. datetime.now(timezone.utc))")
    return BatchJobIn(name=name, due_at=due_at, payload=encode_payload(payload), priority=priority,
                      max_attempts=max_attempts, flex_s=flex_s, strict=strict, backoff_base_s=backoff_base_s,
                      backoff_cap_s=backoff_cap_s, repeat=repeat, idempotency_key=idempotency_key)


def with_key(item: BatchJobIn) -> BatchJobIn:
    """The item with an idempotency key of its own if it had none: a retry
    of a submission whose answer was lost names the job the first attempt
    made instead of making another."""
    if item.idempotency_key is not None:
        return item
    return msgspec.structs.replace(item, idempotency_key=AUTO_KEY_PREFIX + uuid.uuid4().hex)
