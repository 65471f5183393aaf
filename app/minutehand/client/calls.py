"""Each API call as data (method, path, query, body, answer type), built
and read the same way by the sync and the async client (http.py): only
sending differs between them. What may be sent again is said here too."""
from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from minutehand import protocol
from minutehand.client import errors
from minutehand.protocol.api import (BatchIn, BatchJobIn, BatchOut, CancelledOut, DeadDiscardedOut, DeadRequeuedOut,
                                     EventPageOut, JobCreated, JobIn, JobOut, JobPageOut, SeriesChangeIn,
                                     SeriesControlOut, SeriesOut, SeriesPageOut, SeriesRepeat, SettledOut, StatsOut,
                                     decode_hook)

_encode = msgspec.json.Encoder(enc_hook=protocol.enc_hook).encode
_DECODERS: dict[type, msgspec.json.Decoder] = {}
JOB_FIELDS = JobIn.__struct_fields__


def _decoder(kind: type) -> msgspec.json.Decoder:
    if kind not in _DECODERS:
        _DECODERS[kind] = msgspec.json.Decoder(kind, dec_hook=decode_hook)
    return _DECODERS[kind]


@dataclass(frozen=True)
class Call:
    """resend: the call may be sent again after a request that may have
    reached the server got no answer (reads, and submissions, which carry
    an idempotency key). Any call is sent again when it surely did not
    arrive (no connection), or was refused with 429 Retry-After or 503,
    which write nothing."""
    method: str
    path: str
    answer: type | None
    params: dict[str, Any] = field(default_factory=dict)
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    resend: bool = False


def read(call: Call, status: int, content: bytes, retry_after_s: float | None) -> Any:
    if status >= 400:
        raise errors.from_response(status, content, retry_after_s)
    if call.answer is None:
        return None
    try:
        return _decoder(call.answer).decode(content)
    except msgspec.DecodeError as exc:
        raise errors.ServerError(f"unreadable answer to {call.method} {call.path}: {exc}", status=status) from exc


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (a number, or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def backoff_s(attempt: int, base_s: float = 0.2, cap_s: float = 10.0) -> float:
    return min(cap_s, base_s * 2 ** attempt)


def query(**params: Any) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else str(v)) for k, v in params.items() if v is not None}


# ---------------------------------------------------------------- jobs
def submit(item: BatchJobIn) -> Call:
    body = JobIn(**{f: getattr(item, f) for f in JOB_FIELDS})
    headers = {"Idempotency-Key": item.idempotency_key} if item.idempotency_key is not None else {}
    return Call("POST", "/v1/jobs", JobCreated, body=_encode(body), headers=headers,
                resend=item.idempotency_key is not None)


def submit_batch(items: list[BatchJobIn]) -> Call:
    return Call("POST", "/v1/jobs/batch", BatchOut, body=_encode(BatchIn(jobs=items)),
                resend=all(i.idempotency_key is not None for i in items))


def status(job_id: int) -> Call:
    return Call("GET", f"/v1/jobs/{int(job_id)}", JobOut, resend=True)


def cancel(job_id: int) -> Call:
    return Call("DELETE", f"/v1/jobs/{int(job_id)}", CancelledOut)


def jobs_page(*, state: str | None, name: str | None, due_before, due_after, cursor: str | None,
              limit: int) -> Call:
    return Call("GET", "/v1/jobs", JobPageOut, resend=True,
                params=query(state=state, name=name, due_before=due_before, due_after=due_after, cursor=cursor,
                             limit=limit))


# ---------------------------------------------------------------- series
def get_series(series_id: int | str) -> Call:
    return Call("GET", f"/v1/series/{int(series_id)}", SeriesOut, resend=True)


def series_page(cursor: str | None, limit: int) -> Call:
    return Call("GET", "/v1/series", SeriesPageOut, params=query(cursor=cursor, limit=limit), resend=True)


def series_action(series_id: int | str, action: str) -> Call:
    # pause, resume and cancel leave a series as they found it when said twice
    return Call("POST", f"/v1/series/{int(series_id)}/{action}", SeriesControlOut, resend=True)


def change_series(series_id: int | str, repeat: SeriesRepeat, misfire: str | None) -> Call:
    body = SeriesChangeIn(repeat=repeat, misfire=msgspec.UNSET if misfire is None else misfire)
    return Call("PATCH", f"/v1/series/{int(series_id)}", SeriesControlOut, body=_encode(body))


# ---------------------------------------------------------------- dead jobs, events, stats
def settle(job_id: int, action: str, max_attempts: int | None = None) -> Call:
    return Call("POST", f"/v1/jobs/{int(job_id)}/{action}", SettledOut, params=query(max_attempts=max_attempts))


def settle_name(name: str, action: str, max_attempts: int | None, limit: int) -> Call:
    body: dict[str, Any] = {"name": name, "limit": limit}
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    return Call("POST", f"/v1/dead/{action}", DeadRequeuedOut if action == "requeue" else DeadDiscardedOut,
                body=_encode(body))


def events_page(team: str, after: str | None, limit: int) -> Call:
    return Call("GET", f"/v1/teams/{team}/events", EventPageOut, params=query(after=after, limit=limit), resend=True)


def team_stats(team: str, window_s: int | None) -> Call:
    return Call("GET", f"/v1/teams/{team}/stats", StatsOut, params=query(window_s=window_s), resend=True)


# ---------------------------------------------------------------- batches
def merge(outs: list[tuple[int, BatchOut]]) -> BatchOut:
    """The answers of a batch sent in chunks, as one answer: each item's
    idx is its position in the whole submission (offset: the chunk's)."""
    items = [msgspec.structs.replace(it, idx=it.idx + offset) for offset, out in outs for it in out.items]
    return BatchOut(created=sum(o.created for _, o in outs), existing=sum(o.existing for _, o in outs),
                    rejected=sum(o.rejected for _, o in outs), items=items)
