"""Submitting inside the caller's own transaction (app/minutehand/client/tx.py)
on a real database: psycopg sync and async, SQLAlchemy Session, Connection
and AsyncSession. A commit gives the job, a rollback none; a procedure's
refusal is the client's exception class for it, as over HTTP."""
from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from minutehand import client as mh
from minutehand.client import job, task


@dataclass
class Invoice:
    number: int
    total_cents: int


send_invoice = task("send_invoice", Invoice)


def names(db_dsn: str) -> dict[str, int]:
    with psycopg.connect(db_dsn) as c:
        return dict(c.execute("SELECT name, count(*) FROM minutehand.jobs GROUP BY name").fetchall())


def payload(db_dsn: str, job_id: int):
    with psycopg.connect(db_dsn) as c:
        return c.execute("SELECT payload FROM minutehand.jobs WHERE id = %s", (job_id,)).fetchone()[0]


def sqlalchemy_url(db_dsn: str, driver: str = "psycopg") -> str:
    return db_dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


def test_psycopg_commit_gives_the_job_and_rollback_none(db_dsn, live_store):
    with psycopg.connect(db_dsn) as conn:
        created = mh.submit(conn, "committed", {"a": 1}, team="t", priority=3)
        many = mh.submit_many(conn, [job("committed-many", {"i": i}) for i in range(3)], team="t")
        invoice = send_invoice.submit_in(conn, Invoice(42, 999), team="t")
        conn.commit()
        mh.submit(conn, "rolled-back", team="t")
        mh.submit_many(conn, [job("rolled-back") for _ in range(2)], team="t")
        conn.rollback()
    assert created.created and isinstance(created.job_id, int)
    assert (many.created, many.rejected, [it.idx for it in many.items]) == (3, 0, [0, 1, 2])
    assert names(db_dsn) == {"committed": 1, "committed-many": 3, "send_invoice": 1}
    status = live_store.status(created.job_id)
    assert (status.team, status.priority) == ("t", 3)
    assert payload(db_dsn, created.job_id) == {"a": 1}
    assert payload(db_dsn, invoice.job_id) == {"number": 42, "total_cents": 999}


def test_psycopg_refusals_are_the_clients_exceptions(db_dsn, live_store):
    with psycopg.connect(db_dsn) as conn:
        with pytest.raises(mh.Invalid) as bad:
            mh.submit(conn, "no spaces", team="t")
        assert bad.value.extra["sqlstate"] == "MH400" and "name" in bad.value.detail
        conn.rollback()
        with pytest.raises(mh.NotFound):
            mh.submit(conn, "x", team="nobody")
        conn.rollback()
        with pytest.raises(mh.TooLarge):
            mh.submit(conn, "big", {"blob": "x" * 300_000}, team="t")
        conn.rollback()
        mh.submit(conn, "keyed", {"a": 1}, team="t", idempotency_key="k")
        with pytest.raises(mh.Conflict):
            mh.submit(conn, "keyed", {"a": 2}, team="t", idempotency_key="k")
        conn.rollback()
        out = mh.submit_many(conn, [job("ok"), job("not ok")], team="t")
        assert out.created == 1 and out.items[1].error and out.items[1].job_id is None
        with pytest.raises(ValueError, match="time zone"):
            mh.submit(conn, "naive", team="t", due_at=dt.datetime(2030, 1, 1))
        with pytest.raises(TypeError, match="not a connection"):
            mh.submit(object(), "x", team="t")
        conn.commit()
    assert names(db_dsn) == {"ok": 1}


def test_psycopg_async(db_dsn, live_store):
    async def main():
        async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
            created = await mh.submit_async(conn, "async-committed", team="t")
            await send_invoice.submit_in_async(conn, Invoice(1, 2), team="t")
            await conn.commit()
            await mh.submit_many_async(conn, [job("async-rolled-back")], team="t")
            await conn.rollback()
            with pytest.raises(mh.Invalid):
                await mh.submit_async(conn, "no spaces", team="t")
            await conn.rollback()
            return created

    created = asyncio.run(main())
    assert names(db_dsn) == {"async-committed": 1, "send_invoice": 1}
    assert live_store.status(created.job_id).state == "scheduled"


def test_sqlalchemy_session_and_connection(db_dsn, live_store):
    engine = sqlalchemy.create_engine(sqlalchemy_url(db_dsn))
    try:
        with Session(engine) as session:
            session.execute(sqlalchemy.text("SELECT 1"))
            mh.submit(session, "session-committed", {"a": 1}, team="t")
            session.commit()
            mh.submit_many(session, [job("session-rolled-back")], team="t")
            session.rollback()
            with pytest.raises(mh.NotFound):
                mh.submit(session, "x", team="nobody")
            session.rollback()
        with engine.connect() as conn:
            mh.submit(conn, "connection-rolled-back", team="t")
            conn.rollback()
            with conn.begin():
                mh.submit_many(conn, [job("connection-committed") for _ in range(2)], team="t")
    finally:
        engine.dispose()
    assert names(db_dsn) == {"session-committed": 1, "connection-committed": 2}


def test_sqlalchemy_async_session(db_dsn, live_store):
    async def main():
        engine = create_async_engine(sqlalchemy_url(db_dsn))
        try:
            async with AsyncSession(engine) as session:
                await mh.submit_async(session, "async-session-committed", team="t")
                await session.commit()
                await mh.submit_async(session, "async-session-rolled-back", team="t")
                await session.rollback()
                with pytest.raises(mh.Invalid):
                    await mh.submit_async(session, "bad name", team="t")
                await session.rollback()
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert names(db_dsn) == {"async-session-committed": 1}
