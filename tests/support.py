"""Helpers shared by the tests: a store on a test database with a pinned
clock, a team, and leases on every shard."""
from __future__ import annotations

import datetime as dt

import psycopg

from app.store.store import Store

UTC = dt.timezone.utc
# A fixed instant, 30 s into a minute, for tests that pin the clock.
T0 = dt.datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)


def make_store(dsn: str, clock: dt.datetime | None = T0, max_size: int = 4) -> Store:
    """A store whose every session sees `clock` as mh_now(); set store.clock to advance it."""
    return Store(dsn, max_size=max_size, clock=clock)


def pin(conn: psycopg.Connection, when: dt.datetime | None) -> None:
    """Pin (or with None, unpin) mh_now() on one raw connection."""
    conn.execute("SELECT set_config('minutehand.now', coalesce(%s::text, ''), false)", (when,))


def lease_all(store: Store, owner: str = "d1", ttl_s: float = 3600) -> dict[int, int]:
    """Take every shard for `owner`; {shard: epoch}."""
    return store.take_leases(range(shard_count(store)), owner, ttl_s)


def shard_count(store: Store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT mh_shard_count() AS n").fetchone()["n"]


def claim_all(store: Store, leases: dict[int, int], owner: str = "d1", limit: int = 100,
              lease_s: float = 30) -> list:
    """Claim until nothing more is due; every claimed job."""
    got = []
    while True:
        batch = store.claim(leases, limit, owner, lease_s).jobs
        if not batch:
            return got
        got.extend(batch)
