"""Exactly-once side effects inside an at-least-once job.

minutehand runs a job at least once: after a crash, or a claim that expired
while the handler was still busy, it runs again. When the job's side effect
is a write into a PostgreSQL database, `once` makes that write happen once:

    @worker.job("charge")
    def charge(job):
        with psycopg.connect(BILLING_DSN) as conn:
            return job.once(conn, "charge", lambda c: c.execute(
                "INSERT INTO charges (account, cents) VALUES (%s, %s) RETURNING id",
                (job.payload["account"], job.payload["cents"])).fetchone()[0])

How: in one transaction on `conn`, the key is inserted into
`minutehand_effects` (created on first use, in the database the effect
writes into), `fn(conn)` runs only if the key was new, and its result is
stored with the key. The key and the effect commit together or not at all,
so a worker killed at any instant (even SIGKILL) leaves either both or
neither: the next run finds the key and gets the stored result back without
calling fn, or finds no key and does the effect for the first time. A
concurrent run with the same key waits on the first one's row lock, then
sees its committed key.

Only what fn writes through `conn` is covered; an email sent or an HTTP
call made from fn is not (it may happen again if the process dies before
the commit). Keys live 24 hours, like the scheduler's idempotency keys: an
older row counts as absent and is overwritten. fn's result must be
JSON-able (it is stored as jsonb). If `conn` is already inside a
transaction, the key joins it (a savepoint) and commits when the caller
commits.
"""
from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

T = TypeVar("T")

TTL = "24 hours"

CREATE = """CREATE TABLE IF NOT EXISTS minutehand_effects (
    key        text PRIMARY KEY,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
)"""

# A row comes back only when the key is ours to run: new, or older than the TTL.
CLAIM = f"""INSERT INTO minutehand_effects AS e (key, result, created_at) VALUES (%s, NULL, now())
ON CONFLICT (key) DO UPDATE SET result = NULL, created_at = now()
 WHERE e.created_at < now() - interval '{TTL}'
RETURNING true"""
STORE = "UPDATE minutehand_effects SET result = %s WHERE key = %s"
STORED = "SELECT result FROM minutehand_effects WHERE key = %s"

# Connections whose database is known to have the table (created and committed).
_ready: weakref.WeakSet = weakref.WeakSet()
_ready_async: weakref.WeakSet = weakref.WeakSet()


def once(conn: psycopg.Connection, key: str, fn: Callable[[psycopg.Connection], T]) -> T | Any:
    """Run fn(conn) once per key (within 24 h), atomically with recording the
    key; return fn's result, or the result stored by the run that did it."""
    _ensure_table(conn)
    with conn.transaction():
        if conn.execute(CLAIM, (key,)).fetchone():
            result = fn(conn)
            conn.execute(STORE, (Jsonb(result), key))
            return result
        return conn.execute(STORED, (key,)).fetchone()[0]


async def once_async(conn: psycopg.AsyncConnection, key: str,
                     fn: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T | Any:
    """`once` for an async connection and an async fn."""
    await _ensure_table_async(conn)
    async with conn.transaction():
        if await (await conn.execute(CLAIM, (key,))).fetchone():
            result = await fn(conn)
            await conn.execute(STORE, (Jsonb(result), key))
            return result
        return (await (await conn.execute(STORED, (key,))).fetchone())[0]


def _ensure_table(conn: psycopg.Connection) -> None:
    if conn in _ready:
        return
    # Remembered only if it commits here: inside the caller's transaction it
    # could still be rolled back with it.
    committed = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    try:
        with conn.transaction():
            conn.execute(CREATE)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        pass                                  # created at the same moment by another session
    if committed:
        _ready.add(conn)


async def _ensure_table_async(conn: psycopg.AsyncConnection) -> None:
    if conn in _ready_async:
        return
    committed = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    try:
        async with conn.transaction():
            await conn.execute(CREATE)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        pass
    if committed:
        _ready_async.add(conn)
