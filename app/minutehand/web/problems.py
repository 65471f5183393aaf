"""The kinds of refusal, and ApiProblem, the exception that carries one.

The API answers it as RFC 9457 problem+json (app/minutehand/api/problems.py);
the admin UI, which meets it through the Principal both apps share, renders
its status and detail as its error page."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.plugins.problem_details import ProblemDetailsException


@dataclass(frozen=True)
class Kind:
    slug: str
    status: int
    title: str

    @property
    def type(self) -> str:
        # A relative URI reference, resolved against the API's own base URL.
        return f"/problems/{self.slug}"


MALFORMED = Kind("malformed-request", 400, "Malformed request")
UNAUTHORIZED = Kind("unauthorized", 401, "Missing or bad token")
FORBIDDEN = Kind("forbidden", 403, "Admin token required")
NOT_FOUND = Kind("not-found", 404, "Not found")
METHOD = Kind("method-not-allowed", 405, "Method not allowed")
TIMEOUT = Kind("request-timeout", 408, "Request not received in time")
CONFLICT = Kind("conflict", 409, "Conflict")
NOT_CANCELLABLE = Kind("not-cancellable", 409, "Job cannot be cancelled")
NOT_DEAD = Kind("not-dead", 409, "Job is not dead")
STALE_CLAIM = Kind("stale-claim", 409, "Lease token is not the job's current claim")
NOT_RELEASABLE = Kind("not-releasable", 409, "Job has started: it cannot be released")
TOO_LARGE = Kind("too-large", 413, "Request too large")
INVALID = Kind("invalid-input", 422, "Invalid input")
RATE_LIMITED = Kind("rate-limited", 429, "Over the team's submission rate")
PENDING_CEILING = Kind("pending-ceiling", 429, "Over the team's ceiling of pending jobs")
HEADERS_TOO_LARGE = Kind("headers-too-large", 431, "Request headers too large")
UNAVAILABLE = Kind("unavailable", 503, "Database unavailable")
INTERNAL = Kind("internal-error", 500, "Internal error")

KINDS = {k.slug: k for k in (MALFORMED, UNAUTHORIZED, FORBIDDEN, NOT_FOUND, METHOD, TIMEOUT, CONFLICT,
                             NOT_CANCELLABLE, NOT_DEAD, STALE_CLAIM, NOT_RELEASABLE, TOO_LARGE, INVALID,
                             RATE_LIMITED, PENDING_CEILING, HEADERS_TOO_LARGE, UNAVAILABLE, INTERNAL)}


class ApiProblem(ProblemDetailsException):
    """A refusal with its kind and a detail; extra members go into the body."""

    def __init__(self, kind: Kind, detail: str, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail=detail, status_code=kind.status, type_=kind.type, title=kind.title,
                         headers=headers, extra={k: v for k, v in extra.items() if v is not None} or None)
        self.kind = kind
