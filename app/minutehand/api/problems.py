"""Every error as RFC 9457 problem+json: a `type` naming the kind of problem,
a `title` per kind, and a `detail` a person can act on.

Exceptions become problems in one place (exception_handlers): the store's
refusals (StoreError, whose status each carries), Litestar's own HTTP errors
(unknown route, wrong method, body over the size limit, bad parameters), a
database that cannot be reached (503 with Retry-After), data PostgreSQL
refuses to store (422), and anything unexpected (500, logged, no internals
shown). Handlers raise ApiProblem for refusals of their own (it and the
kinds are in app/minutehand/web/problems.py, which the admin UI shares).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import psycopg
from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.plugins.problem_details import ProblemDetailsConfig, ProblemDetailsPlugin

from minutehand.protocol.api import Problem
from minutehand.protocol.jsontext import MAX_JSON_DEPTH
from minutehand.store import errors
from minutehand.web.problems import (CONFLICT, FORBIDDEN, INTERNAL, INVALID, KINDS, MALFORMED, METHOD, NOT_FOUND,
                                     PENDING_CEILING, RATE_LIMITED, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, ApiProblem,
                                     Kind)

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"


# The store's refusals by class. Invalid input is 422 here (the request was
# well-formed JSON of the right types, but its values are refused), as are
# unknown fields and a due time beyond the horizon.
_BY_STORE_ERROR: list[tuple[type[errors.StoreError], Kind]] = [
    (errors.InvalidInput, INVALID), (errors.NotFound, NOT_FOUND), (errors.Conflict, CONFLICT),
    (errors.PayloadTooLarge, TOO_LARGE), (errors.StaleLease, FORBIDDEN), (errors.Contention, UNAVAILABLE),
    (errors.RateLimited, RATE_LIMITED), (errors.PendingCeiling, PENDING_CEILING),
]


def _store_error(exc: errors.StoreError, retry_after_s: int) -> ApiProblem:
    kind = next((k for cls, k in _BY_STORE_ERROR if isinstance(exc, cls)), INTERNAL)
    if isinstance(exc, errors.RateLimited):
        return rate_limited(exc)
    if isinstance(exc, errors.PendingCeiling):
        return ApiProblem(kind, exc.message, pending=exc.pending, ceiling=exc.ceiling)
    # Contention: the database aborted the transaction each time it was tried.
    headers = {"Retry-After": str(retry_after_s)} if kind is UNAVAILABLE else None
    return ApiProblem(kind, exc.message, headers=headers)


def rate_limited(exc: errors.RateLimited) -> ApiProblem:
    """429 with Retry-After: whole seconds (what HTTP allows), rounded up, so
    a client that waits that long finds the tokens there."""
    wait = max(1, math.ceil(exc.retry_after_s - 1e-9))
    return ApiProblem(RATE_LIMITED, exc.message, headers={"Retry-After": str(wait)}, retry_after_s=wait)


def _http_exception(exc: HTTPException) -> ApiProblem:
    if isinstance(exc, ApiProblem):
        return exc
    status = exc.status_code
    if (problem := _body_problem(exc)) is not None:
        return problem
    if isinstance(exc, ValidationException):
        # Path, query and header parameters Litestar parsed against their types.
        reasons = exc.extra if isinstance(exc.extra, list) else None
        detail = "; ".join(f"{r.get('key', '?')}: {r.get('message', '')}" for r in reasons or []
                           if isinstance(r, dict)) or exc.detail
        return ApiProblem(MALFORMED, detail, errors=reasons)
    if status == 401:
        return ApiProblem(UNAUTHORIZED, exc.detail, headers={"WWW-Authenticate": "Bearer"})
    if status == 404:
        return ApiProblem(NOT_FOUND, "no such resource: see the OpenAPI schema at /schema")
    if status == 405:
        return ApiProblem(METHOD, exc.detail, headers=exc.headers)
    if status == 413:
        return ApiProblem(TOO_LARGE, "request body is larger than this endpoint accepts: "
                                     "send less per request (split a batch)")
    if status >= 500:
        return ApiProblem(INTERNAL, "the server failed; the error is logged")
    kind = next((k for k in KINDS.values() if k.status == status), None)
    if kind is None:
        return ApiProblem(Kind("http-error", status, exc.detail or "HTTP error"), exc.detail)
    return ApiProblem(kind, exc.detail)


def _body_problem(exc: HTTPException) -> ApiProblem | None:
    """A request body that could not be read as its handler's `data` type
    (app/minutehand/api/bodies.py), or None for another error. Litestar answers a
    body its DTO cannot decode with a ClientException raised from the DTO's
    SerializationException, raised from msgspec's error: a ValidationError
    is a well-formed body of the wrong shape or types (422), any other
    DecodeError malformed JSON (400). No body at all leaves `data` missing,
    which Litestar reports as the parameter's ValidationException."""
    if isinstance(exc, ValidationException):
        reasons = exc.extra if isinstance(exc.extra, list) else []
        if any(isinstance(r, dict) and r.get("key") == "data" and r.get("source") == "body" for r in reasons):
            return ApiProblem(MALFORMED, "request body is not valid JSON: it is empty")
        return None
    cause = exc.__cause__
    if not isinstance(cause, SerializationException):
        return None
    cause = cause.__cause__
    if isinstance(cause, msgspec.ValidationError):
        return ApiProblem(INVALID, f"request body: {cause}")
    if isinstance(cause, msgspec.DecodeError):
        return ApiProblem(MALFORMED, f"request body is not valid JSON: {cause}")
    if isinstance(cause, RecursionError):
        return too_deep()
    return None


def _serialization(exc: SerializationException) -> ApiProblem:
    return ApiProblem(MALFORMED, f"request body is not valid JSON: {exc}")


def _data_error(exc: psycopg.DataError) -> ApiProblem:
    # Values of the right JSON type that PostgreSQL cannot hold (a number out
    # of range for its column, a NUL character, ...). Nothing was written.
    reason = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
    return ApiProblem(INVALID, f"a value cannot be stored: {reason}")


def unavailable(retry_after_s: int) -> ApiProblem:
    return ApiProblem(UNAVAILABLE, "the database cannot be reached; retry later (with the same "
                                   "Idempotency-Key, a retried submission cannot create a second job)",
                      headers={"Retry-After": str(retry_after_s)})


def decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """A request body as its Struct: malformed JSON 400, wrong shape 422."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiProblem(INVALID, f"request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiProblem(MALFORMED, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None


def too_deep() -> ApiProblem:
    """JSON nested so deep that reading it ran out of stack (msgspec reads a
    level per frame, hundreds of levels in): refused before any of it is used."""
    return ApiProblem(INVALID, f"request body is nested too deeply to read: payloads and results may be "
                               f"nested at most {MAX_JSON_DEPTH} levels deep (arrays and objects)")


def parameters(names: dict[str, str] | None = None,
               allowed: dict[str, Iterable[str]] | None = None) -> dict[type[Exception], Callable]:
    """A route's exception_handlers for the parameters Litestar validates:
    each reason names the parameter as the client sends it (Litestar uses
    the handler's Python name: job_state for ?state=, a name Litestar keeps
    for itself), and for an enumerated one lists the values it may take."""
    names, allowed = names or {}, {k: ", ".join(v) for k, v in (allowed or {}).items()}

    def handler(request: Request, exc: ValidationException) -> Response:
        reasons = exc.extra if isinstance(exc.extra, list) else []
        for reason in reasons:
            if isinstance(reason, dict) and isinstance(reason.get("key"), str):
                key = reason["key"] = names.get(reason["key"], reason["key"])
                if key in allowed:
                    reason["message"] = f"{reason.get('message', 'invalid value')}: it may be one of {allowed[key]}"
        return _http_exception(exc).to_response(request)

    return {ValidationException: handler}


def plugin(retry_after_s: int, on_db_unreachable: Callable[[], None]) -> ProblemDetailsPlugin:
    """The plugin that turns every exception into a problem response."""

    def db_unreachable(exc: psycopg.OperationalError) -> ApiProblem:
        log.warning("database unreachable: %s", exc)
        on_db_unreachable()
        return unavailable(retry_after_s)

    def internal(exc: Exception) -> ApiProblem:
        log.error("unexpected error", exc_info=exc)
        return ApiProblem(INTERNAL, "the server failed; the error is logged")

    return ProblemDetailsPlugin(ProblemDetailsConfig(exception_to_problem_detail_map={
        errors.StoreError: lambda exc: _store_error(exc, retry_after_s),
        HTTPException: _http_exception,
        SerializationException: _serialization,
        psycopg.OperationalError: db_unreachable,
        psycopg.DataError: _data_error,
        Exception: internal,
    }))


def problem_page(slug: str) -> dict[str, Any]:
    """What a problem type means (its URI resolves to this)."""
    kind = KINDS.get(slug)
    if kind is None:
        raise ApiProblem(NOT_FOUND, f"no problem type {slug!r}")
    return {"type": kind.type, "title": kind.title, "status": kind.status}


def responses(*kinds: Kind) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the problems an endpoint may answer with."""
    by_status: dict[int, list[Kind]] = {}
    for k in kinds:
        by_status.setdefault(k.status, []).append(k)
    return {status: ResponseSpec(data_container=Problem, media_type=PROBLEM_MEDIA_TYPE, generate_examples=False,
                                 description=" or ".join(k.title for k in ks))
            for status, ks in by_status.items()}


# Every authenticated endpoint may answer these.
COMMON = (MALFORMED, UNAUTHORIZED, UNAVAILABLE, INTERNAL)
# Every submission may answer these (app/minutehand/web/admission.py).
ADMISSION = (RATE_LIMITED, PENDING_CEILING)
