"""Submit inside your own transaction: the job exists if and only if your
transaction commits. On a psycopg connection (sync or async) or a
SQLAlchemy Session / Connection (sync, or AsyncSession / AsyncConnection),
through the procedures the HTTP API uses (minutehand.submit_job_detail,
minutehand.submit_jobs), with the client's types and exceptions: a
procedure's MH4xx SQLSTATE is raised as the class the API's status maps to
(errors.from_sqlstate). A refusal aborts the transaction, as any failed
statement does.

The driver is never imported here: the connection's own methods are used
(SQLAlchemy's exec_driver_sql, so that its transaction is the one written in).
There is no admission (rate limit, pending ceiling) on this path, as for
any caller of the procedures; a repeating job is submitted over HTTP.
With OpenTelemetry installed (the `otel` extra), the current span's W3C
traceparent goes with each job (client/traces.py), as the HTTP client sends
it in a header: the worker's span of the handler continues that trace.

The statements are in sql/queries/client.sql."""
from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from minutehand.client import errors, traces
from minutehand.client.jobs import job
from minutehand.protocol import JobId
from minutehand.protocol.api import BatchItemOut, BatchJobIn, BatchOut, JobCreated

SQL_FILE = Path(__file__).resolve().parents[3] / "sql" / "queries" / "client.sql"
_HEADER = re.compile(r"^-- name: (\w+)\n(?:--[^\n]*\n)*", re.M)


@cache
def statement(name: str) -> str:
    parts = _HEADER.split(SQL_FILE.read_text())[1:]
    return dict(zip(parts[::2], (p.strip() for p in parts[1::2])))[name]


def _text(raw: msgspec.Raw | msgspec.UnsetType) -> str | None:
    return None if raw is msgspec.UNSET else bytes(raw).decode()


def _one_params(team: str, item: BatchJobIn) -> dict[str, Any]:
    if item.repeat is not None:
        raise ValueError("a repeating job (repeat=...) is submitted over HTTP: Client.create_series")
    return {"team": team, "name": item.name, "due_at": item.due_at, "payload": _text(item.payload),
            "priority": item.priority, "max_attempts": item.max_attempts, "flex_s": item.flex_s,
            "strict": item.strict, "idempotency_key": item.idempotency_key,
            "backoff_base_s": item.backoff_base_s, "backoff_cap_s": item.backoff_cap_s,
            "traceparent": traces.traceparent()}


def _many_params(team: str, items: list[BatchJobIn]) -> dict[str, Any]:
    for item in items:
        if item.repeat is not None:
            _one_params(team, item)              # its refusal
    traceparent = traces.traceparent()
    return {"team": team, "names": [i.name for i in items], "due_ats": [i.due_at for i in items],
            "payloads": [_text(i.payload) for i in items], "priorities": [i.priority for i in items],
            "max_attempts": [i.max_attempts for i in items], "flex_s": [i.flex_s for i in items],
            "stricts": [i.strict for i in items], "keys": [i.idempotency_key for i in items],
            "backoff_base_s": [i.backoff_base_s for i in items], "backoff_cap_s": [i.backoff_cap_s for i in items],
            "traceparents": None if traceparent is None else [traceparent] * len(items)}


def _created(row) -> JobCreated:
    return JobCreated(JobId(row[0]), row[1], row[2])


def _batch(rows) -> BatchOut:
    items = sorted((BatchItemOut(idx=r[0], job_id=JobId(r[1]) if r[1] is not None else None, run_at=r[2],
                                 created=bool(r[3]), error=r[4]) for r in rows), key=lambda i: i.idx)
    created = sum(1 for i in items if i.created)
    rejected = sum(1 for i in items if i.error is not None)
    return BatchOut(created=created, existing=len(items) - created - rejected, rejected=rejected, items=items)


def _refusal(exc: Exception) -> Exception:
    """The client's exception for a procedure's refusal; others unchanged.
    SQLAlchemy wraps the driver's error (.orig)."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    diag = getattr(cause, "diag", None)
    message = getattr(diag, "message_primary", None) or str(cause)
    return errors.from_sqlstate(code, message) or exc


def _kind(conn: Any) -> str:
    """Which kind of connection, by its class's module (no driver imported)."""
    module = type(conn).__module__
    name = type(conn).__name__
    if module.startswith("sqlalchemy"):
        return "sqlalchemy_async" if name.startswith("Async") else "sqlalchemy"
    if module.startswith("psycopg"):
        return "psycopg_async" if name.startswith("Async") else "psycopg"
    raise TypeError(f"not a connection this can submit on: {type(conn).__qualname__} (psycopg Connection or "
                    "AsyncConnection, SQLAlchemy Session, Connection, AsyncSession or AsyncConnection)")


def _sqlalchemy_connection(conn: Any) -> Any:
    """A Session's Connection (in its transaction), or the Connection itself."""
    return conn.connection() if hasattr(conn, "get_bind") else conn


def _run(conn: Any, name: str, params: dict[str, Any]) -> list[tuple]:
    sql = statement(name)
    kind = _kind(conn)
    try:
        if kind == "psycopg":
            return conn.execute(sql, params).fetchall()
        if kind == "sqlalchemy":                  # the driver's own SQL; SQLAlchemy begins its transaction
            return list(_sqlalchemy_connection(conn).exec_driver_sql(sql, params))
    except Exception as exc:
        raise _refusal(exc) from exc
    raise TypeError(f"{type(conn).__qualname__} is async: use submit_async / submit_many_async")


async def _run_async(conn: Any, name: str, params: dict[str, Any]) -> list[tuple]:
    sql = statement(name)
    kind = _kind(conn)
    try:
        if kind == "psycopg_async":
            return await (await conn.execute(sql, params)).fetchall()
        if kind == "sqlalchemy_async":
            connection = await conn.connection() if hasattr(conn, "get_bind") else conn
            return list(await connection.exec_driver_sql(sql, params))
    except Exception as exc:
        raise _refusal(exc) from exc
    raise TypeError(f"{type(conn).__qualname__} is not async: use submit / submit_many")


def submit(conn: Any, name: str, payload: Any = None, *, team: str, **options: Any) -> JobCreated:
    """One job of `team`, in conn's transaction (options: those of minutehand.client.job)."""
    return _created(_run(conn, "client_submit_job", _one_params(team, job(name, payload, **options)))[0])


def submit_many(conn: Any, jobs: Iterable[BatchJobIn], *, team: str) -> BatchOut:
    """Many jobs of `team` (each made by minutehand.client.job), in conn's transaction."""
    return _batch(_run(conn, "client_submit_jobs", _many_params(team, list(jobs))))


async def submit_async(conn: Any, name: str, payload: Any = None, *, team: str, **options: Any) -> JobCreated:
    rows = await _run_async(conn, "client_submit_job", _one_params(team, job(name, payload, **options)))
    return _created(rows[0])


async def submit_many_async(conn: Any, jobs: Iterable[BatchJobIn], *, team: str) -> BatchOut:
    return _batch(await _run_async(conn, "client_submit_jobs", _many_params(team, list(jobs))))
