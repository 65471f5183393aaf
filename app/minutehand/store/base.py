"""What every part of the store (Store, app/minutehand/store/store.py)
builds on: the connection pool, a connection with the clock applied,
statements run and retried, several in one round trip (in one transaction,
or each alone), the database's clock and the Citus shards' layout. psycopg 3
through a connection pool, autocommit (each procedure call is its own
transaction unless the caller says otherwise). Its statements:
sql/queries/base.sql."""
from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, Self, TypeVar

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.rows import RowFactory, dict_row
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from minutehand import metrics
from minutehand.store import citus, errors, schema
from minutehand.store.queries import q


log = logging.getLogger(__name__)
T = TypeVar("T")

# A transaction the database aborted to break a deadlock or a serialization
# conflict wrote nothing: it is tried again this many times in all.
TRIES = 3

# Lists go to the database in binary: psycopg's text form of an array costs
# 2-4 us an element in Python (ids, lease tokens, names), the binary one
# ~0.4, and the procedures take thousands of elements a second.
ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_dumper(list, ListBinaryDumper)

# The connection of a transaction the current thread's store calls join
# (Store.audited: an admin action and its audit entry commit together).
_JOINED: ContextVar[psycopg.Connection | None] = ContextVar("minutehand_store_joined", default=None)


def _jsonb(value: Any) -> Jsonb:
    """A jsonb parameter. JSON text already encoded (bytes: the API hands a
    request's payload through without decoding it) is sent as it is."""
    if isinstance(value, bytes):
        return Jsonb(value, dumps=_as_is)
    return Jsonb(value)


def _cursor(conn: psycopg.Connection, rows: Sequence[RowFactory | None] | None, i: int) -> psycopg.Cursor:
    """A cursor for the i-th statement: its own row factory in `rows`, or the connection's (dicts)."""
    factory = rows[i] if rows else None
    return conn.cursor(row_factory=factory) if factory else conn.cursor()


def _as_is(value: bytes) -> bytes:
    return value


class StoreBase:
    """The pool and the plumbing every part of Store uses; a part subclasses it."""

    def __init__(self, database_url: str, *, min_size: int = 1, max_size: int = 8,
                 clock: dt.datetime | None = None, pool_options: dict[str, Any] | None = None,
                 pool_name: str = "store"):
        """pool_options: more ConnectionPool arguments (timeout, reconnect_timeout, ...).
        Every connection starts with search_path=minutehand (pool.conninfo says so too).
        pool_name: the `pool` label of its metrics (minutehand.metrics)."""
        self.pool = ConnectionPool(schema.conninfo(database_url), min_size=min_size, max_size=max_size, open=True,
                                   kwargs={"autocommit": True, "row_factory": dict_row, "context": ADAPTERS},
                                   **(pool_options or {}))
        self._db_seconds = metrics.DB_SECONDS.labels(pool_name)
        self._unwatch = metrics.POOLS.watch(pool_name, self.pool.get_stats)
        # A pinned clock (tests): every checkout sets it on its session, and
        # once it has been pinned, unpinning (None) is applied the same way.
        self.clock = clock
        self._clock_used = clock is not None
        # {logical shard: Citus shard} on a distributed database, {} on plain
        # PostgreSQL; read on first use (_citus_groups).
        self._shard_groups: dict[int, int] | None = None

    def close(self) -> None:
        self._unwatch()
        self.pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, clock applied; procedure refusals become StoreErrors.
        Inside Store.audited: that transaction's connection."""
        joined = _JOINED.get()
        with nullcontext(joined) if joined is not None else self._pooled() as conn:
            try:
                yield conn
            except psycopg.Error as exc:
                error = errors.translate(exc)
                if error is exc:
                    raise
                raise error from exc

    @contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection]:
        with self.pool.connection() as conn, metrics.timed(self._db_seconds):
            self._apply_clock(conn)
            yield conn

    def _apply_clock(self, conn: psycopg.Connection) -> None:
        if self.clock is not None:
            self._clock_used = True
        if self._clock_used:
            conn.execute(q("set_clock"), {"now": self.clock})

    def _all(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            with self.connection() as conn:
                return conn.execute(q(name), params).fetchall()
        return self.retrying(run)

    def _one(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        rows = self._all(name, params)
        return rows[0] if rows else None

    @staticmethod
    def retrying(transaction: Callable[[], T]) -> T:
        """Run a whole transaction again when the database aborted it to break
        a deadlock or a serialization conflict (it wrote nothing), up to TRIES
        times in all, after a short random pause; then Contention, which says
        so, rather than an error that reads like the database being away.
        Inside Store.audited the whole audited transaction is what is retried."""
        if _JOINED.get() is not None:
            return transaction()
        for attempt in range(1, TRIES + 1):
            try:
                return transaction()
            except psycopg.OperationalError as exc:
                if not (exc.sqlstate or "").startswith("40"):     # class 40: transaction rollback
                    raise
                reason = exc.diag.message_primary or str(exc)
                if attempt == TRIES:
                    raise errors.Contention(
                        f"the database aborted the transaction {TRIES} times ({reason}); nothing was "
                        "written: retry the request") from exc
                log.info("transaction aborted (%s); trying again", reason)
                time.sleep(random.uniform(0.005, 0.05) * attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def in_one_transaction(conn: psycopg.Connection, sql: Sequence[str], params: Sequence[dict[str, Any]],
                           rows: Sequence[RowFactory | None] | None = None) -> list[list[Any]] | psycopg.Error:
        """The statements, each with its own params, in ONE transaction sent in
        one round trip: one commit for all of them. Their rows (dicts, or as
        each one's row factory in `rows` makes them), or the error if the
        server or the driver refused any of them (then nothing was written;
        the caller may run them each alone to learn which). A lost
        connection raises."""
        cursors = []
        try:
            with conn.pipeline(), conn.transaction():
                for i, (statement, p) in enumerate(zip(sql, params)):
                    cursors.append(_cursor(conn, rows, i))
                    cursors[-1].execute(statement, p)
        except psycopg.Error as exc:
            if conn.broken:
                raise
            return exc
        return [cur.fetchall() for cur in cursors]

    @staticmethod
    def each_alone(conn: psycopg.Connection, sql: str | Sequence[str], params: Sequence[dict[str, Any]],
                   rows: Sequence[RowFactory | None] | None = None) -> list[list[Any] | Exception]:
        """The statement (or each item's own) once per item, all sent in ONE
        round trip, each its own transaction: a Sync follows each, so no transaction holds rows of
        more than one shard (on Citus, a single-shard transaction each).
        psycopg's public Pipeline.sync() would wait for each result in turn
        (a round trip per statement), so the Sync is queued with its
        _enqueue_sync (pinned down by tests/test_pipeline.py).

        The rows of each item (as in_one_transaction's), or the error that item alone met: a value the
        driver cannot send, or a statement the server refused (each is its
        own transaction, so the others committed, and their rows are read
        all the same — a claim's rows must never be dropped). psycopg reports
        only some of several server errors, so every failed item carries the
        first one. A lost connection raises."""
        cursors: list[psycopg.Cursor | Exception] = []
        first: psycopg.Error | None = None       # the first error the server sent back
        try:
            with conn.pipeline() as pipe:
                for i, p in enumerate(params):
                    cur = _cursor(conn, rows, i)
                    try:
                        cur.execute(sql if isinstance(sql, str) else sql[i], p)
                    except psycopg.Error as exc:
                        if conn.broken:
                            raise
                        if exc.sqlstate is None:          # this item's values could not be sent
                            cursors.append(errors.translate(exc))
                            continue
                        first = first or exc              # an earlier item's; this one was sent
                    cursors.append(cur)
                    pipe._enqueue_sync()
        except psycopg.Error as exc:
            if conn.broken:
                raise
            first = first or exc
        results: list[list[Any] | Exception] = []
        for cur in cursors:
            if isinstance(cur, Exception):
                results.append(cur)
                continue
            try:
                results.append(cur.fetchall())
            except psycopg.Error as exc:               # this item failed; the server's reason is
                results.append(errors.translate(first or exc))   # known for the first such one only
        return results

    def _pipelined(self, name: str, params: Sequence[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """The statement once per item, in one round trip, each its own
        transaction (each_alone); the first row of each. An error is raised
        (after every item ran)."""
        return [r[0] if r else None for r in self._each_or_raise(name, params)]

    def _each_answered(self, name: str, params: Sequence[dict[str, Any]], what: str
                       ) -> list[list[dict[str, Any]] | None]:
        """The statement once per item in one round trip, each its own
        transaction (each_alone; on Citus, items of one Citus shard each):
        every item's rows, None for an item whose part of the cluster could
        not be reached (errors.unreachable; logged, naming `what`), so one
        worker node away does not stop the others' work. Any other error,
        or every item unreachable, is raised (after every item ran)."""
        if not params:
            return []
        with self.connection() as conn:
            results = self.each_alone(conn, q(name), params)
        away = [r for r in results if isinstance(r, Exception) and errors.unreachable(r)]
        for r in results:
            if isinstance(r, Exception) and (not errors.unreachable(r) or len(away) == len(results)):
                raise r
        if away:
            log.warning("%s: %d of %d parts could not be reached, the others went on: %s",
                        what, len(away), len(results), str(away[0]).splitlines()[0])
        return [None if isinstance(r, Exception) else r for r in results]

    def _all_reachable(self, name: str, shards: list[int], params: Callable[[list[int], bool], dict[str, Any]],
                       what: str) -> tuple[list[dict[str, Any]], list[int]]:
        """The rows of one statement over these shards (params(shards,
        False)), and the shards it read: all of them. On Citus, if a worker
        node could not be reached, one statement per Citus shard instead
        (params(part, True): True asks for a statement routed to that part's
        node alone), each its own transaction; then the shards read are
        those of the parts that answered (_each_answered)."""
        try:
            return self._all(name, params(shards, False)), shards
        except psycopg.Error as exc:
            if not errors.unreachable(exc) or not self._citus_groups():
                raise
        parts = self._by_citus_shard(shards)
        answered = self._each_answered(name, [params(part, True) for part in parts], what)
        return ([r for rows in answered if rows is not None for r in rows],
                [s for part, rows in zip(parts, answered) if rows is not None for s in part])

    def _each_or_raise(self, name: str, params: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """The statement once per item in one round trip, each its own
        transaction (each_alone); every item's rows. An error is raised
        (after every item ran)."""
        if not params:
            return []
        with self.connection() as conn:
            results = self.each_alone(conn, q(name), params)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def _citus_groups(self) -> dict[int, int]:
        """{logical shard: the Citus shard holding it} on a distributed
        database, {} otherwise (citus.shard_groups), read once."""
        if self._shard_groups is None:
            with self.connection() as conn:
                self._shard_groups = citus.shard_groups(conn)
        return self._shard_groups

    def _by_citus_shard(self, shards: Iterable[int]) -> list[list[int]]:
        """These logical shards in order, one list per Citus shard holding
        them (on plain PostgreSQL, one list): a statement naming one list is
        a router statement committed on one worker."""
        groups = self._citus_groups()
        parts: dict[int, list[int]] = {}
        for s in sorted(shards):
            parts.setdefault(groups.get(s, -1), []).append(s)
        return [parts[k] for k in sorted(parts)]

    def _all_at_now(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows of a read that reckons with the clock, given the database's
        clock as `now`, read first on the same connection: on Citus the read
        runs on workers, whose mh_now() is neither the coordinator's nor
        pinned by its session (tests, drills)."""
        def run() -> list[dict[str, Any]]:
            with self.connection() as conn:
                return conn.execute(q(name), {**params, "now": self._now_on(conn)}).fetchall()
        return self.retrying(run)

    @staticmethod
    def _now_on(conn: psycopg.Connection) -> dt.datetime:
        return conn.execute(q("db_now")).fetchone()["now"]

    def _db_now(self) -> dt.datetime:
        return self._one("db_now", {})["now"]

    def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None: not migrated)."""
        return self._one("schema_revision", {})["revision"]
