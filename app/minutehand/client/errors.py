"""Refusals as exceptions, one class per kind of problem, the same whether
the HTTP API answered with problem+json (RFC 9457) or a procedure raised an
MH4xx SQLSTATE inside the caller's transaction: `except NotFound` holds for
both ways of submitting.

Each carries the problem's fields: type, title, status, detail, and the
members beyond them in `extra` (job_id and state of a refused cancel,
retry_after_s of a rate limit, pending and ceiling of a pending ceiling,
max_items of a batch too large, errors of a 422)."""
from __future__ import annotations

from typing import Any

import msgspec


class MinutehandError(Exception):
    """A refusal by the scheduler. retry_after_s: what Retry-After said, if anything."""
    status = 500

    def __init__(self, detail: str, *, type: str = "", title: str = "", status: int | None = None,
                 extra: dict[str, Any] | None = None, retry_after_s: float | None = None):
        super().__init__(detail)
        self.detail = detail
        self.type = type
        self.title = title
        if status is not None:
            self.status = status
        self.extra = extra or {}
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.status} {self.title or type(self).__name__}: {self.detail}"


class Malformed(MinutehandError):
    """400: the request could not be read (not JSON, a bad parameter)."""
    status = 400


class Unauthorized(MinutehandError):
    """401: no token, or one the server does not know."""
    status = 401


class Forbidden(MinutehandError):
    """403: the token may not do this (another team's, not an admin's)."""
    status = 403


class NotFound(MinutehandError):
    """404: no such job, series or team (for this token)."""
    status = 404


class Conflict(MinutehandError):
    """409: the request is at odds with the state: an idempotency key used for
    another request, a series already cancelled."""
    status = 409


class NotCancellable(Conflict):
    """409: the job has started or finished; extra['state'] says which."""


class NotDead(Conflict):
    """409: requeue or discard of a job that is not dead."""


class TooLarge(MinutehandError):
    """413: a payload or a batch over the limit."""
    status = 413


class Invalid(MinutehandError):
    """422 (HTTP) or MH400 (SQL): values the scheduler refuses, with the reason."""
    status = 422


class Overloaded(MinutehandError):
    """429: over one of the team's admission limits; nothing was written."""
    status = 429


class RateLimited(Overloaded):
    """429: over the team's submission rate; tokens are there after retry_after_s."""


class PendingCeiling(Overloaded):
    """429: the team has its ceiling of pending jobs."""


class Unavailable(MinutehandError):
    """503 (the database away or contended), or no answer at all after the
    retries: nothing was written by a refused call."""
    status = 503


class ServerError(MinutehandError):
    """500 or another status with no class of its own."""


_BY_SLUG: dict[str, type[MinutehandError]] = {
    "malformed-request": Malformed, "unauthorized": Unauthorized, "forbidden": Forbidden, "not-found": NotFound,
    "conflict": Conflict, "not-cancellable": NotCancellable, "not-dead": NotDead, "stale-claim": Conflict,
    "not-releasable": Conflict, "too-large": TooLarge, "invalid-input": Invalid, "rate-limited": RateLimited,
    "pending-ceiling": PendingCeiling, "unavailable": Unavailable, "internal-error": ServerError,
}
_BY_STATUS: dict[int, type[MinutehandError]] = {
    400: Malformed, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    422: Invalid, 429: Overloaded, 503: Unavailable,
}
# The procedures' SQLSTATEs (sql/functions/submit.sql), as the API maps them.
_BY_SQLSTATE: dict[str, type[MinutehandError]] = {
    "MH400": Invalid, "MH403": Forbidden, "MH404": NotFound, "MH409": Conflict, "MH413": TooLarge,
}
_TITLES = {Invalid: "Invalid input", NotFound: "Not found", Conflict: "Conflict", TooLarge: "Request too large",
           Forbidden: "Forbidden"}


def from_response(status: int, body: bytes, retry_after_s: float | None = None) -> MinutehandError:
    """The exception of an HTTP refusal: by the problem's type, else by status."""
    try:
        problem = msgspec.json.decode(body)
    except msgspec.DecodeError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"detail": body.decode(errors="replace")[:2000] or f"HTTP {status}"}
    kind_uri = str(problem.get("type") or "")
    cls = _BY_SLUG.get(kind_uri.rpartition("/")[2]) or _BY_STATUS.get(status, ServerError)
    extra = {k: v for k, v in problem.items() if k not in ("type", "title", "status", "detail")}
    return cls(str(problem.get("detail") or f"HTTP {status}"), type=kind_uri, title=str(problem.get("title") or ""),
               status=status, extra=extra, retry_after_s=retry_after_s)


def from_sqlstate(sqlstate: str | None, message: str) -> MinutehandError | None:
    """The exception of a procedure's refusal; None for an SQLSTATE not ours."""
    cls = _BY_SQLSTATE.get(sqlstate or "")
    if cls is None:
        return None
    return cls(message, type=f"/problems/{next(s for s, c in _BY_SLUG.items() if c is cls)}",
               title=_TITLES[cls], extra={"sqlstate": sqlstate})
