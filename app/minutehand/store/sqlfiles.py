"""Where the SQL lives: the sql/ folder of the repository, installed as the
package minutehand.sql; the single source of truth for the schema, the
procedures and the named statements.

    sql/tables/*.sql     the current tables, types and indexes (a fresh database)
    sql/functions/*.sql  every function, once; applied by every migrate that ends at head
    sql/refresh.sql      data copied from the server at each such migrate
    sql/grants.sql       roles and rights, after the functions
    sql/queries/*.sql    the named statements the store sends, a file for each part of it

Table changes to existing databases are the frozen revisions in migrations/versions/.
"""
from __future__ import annotations

import re

import psycopg

from minutehand import packaged
from minutehand.store.schema import SCHEMA

SQL_DIR = packaged.folder("minutehand.sql")

# In the order they are applied: later files build on earlier ones (SQL
# function bodies are checked against the functions and tables that exist).
TABLE_FILES = ("tables/jobs.sql", "tables/wheel.sql", "tables/series.sql", "tables/dispatch.sql",
               "tables/stats.sql", "tables/spread.sql", "tables/admission.sql", "tables/dead.sql",
               "tables/retention.sql", "tables/admin.sql")
FUNCTION_FILES = ("functions/clock.sql", "functions/ids.sql", "functions/wheel.sql", "functions/stats.sql",
                  "functions/admission.sql", "functions/spread.sql", "functions/submit.sql", "functions/series.sql",
                  "functions/chain.sql", "functions/claim.sql", "functions/outcomes.sql", "functions/dead.sql",
                  "functions/dispatch.sql", "functions/maintenance.sql", "functions/retention.sql")

# Two migrates at once wait for each other (in the same transaction as their work).
MIGRATE_LOCK = 0x6d696e7574656861     # "minuteha"

# What can hide a ';' that does not end a statement: dollar-quoted bodies,
# quoted strings and identifiers, comments.
_TOKEN = re.compile(r"\$([A-Za-z_]*)\$.*?\$\1\$|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/|;", re.S)
_FUNCTION = re.compile(r"^(?:\s+|--[^\n]*\n)*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(", re.I)
_COMMENTS = re.compile(r"(?:\s+|--[^\n]*(?:\n|$))*")


def read(name: str) -> str:
    return (SQL_DIR / name).read_text()


def query_files() -> list[str]:
    """sql/queries/*.sql, sorted."""
    return sorted(f"queries/{path.name}" for path in (SQL_DIR / "queries").glob("*.sql"))


def statements(text: str) -> list[str]:
    """The statements of a SQL file, each without its ';' (comments alone are no statement)."""
    out, start = [], 0
    for m in _TOKEN.finditer(text):
        if m.group(0) == ";":
            out.append(text[start:m.start()])
            start = m.end()
    out.append(text[start:])
    return [s for s in out if _COMMENTS.fullmatch(s) is None]


def function_name(statement: str) -> str | None:
    m = _FUNCTION.match(statement)
    return m.group(1) if m else None


def function_definitions() -> list[tuple[str, str, str]]:
    """(file, function name, CREATE statement) of every function in sql/functions/.
    A statement there that defines no function is an error: those files hold functions only."""
    out = []
    for file in FUNCTION_FILES:
        for stmt in statements(read(file)):
            name = function_name(stmt)
            if name is None:
                raise ValueError(f"sql/{file}: a statement that is not CREATE OR REPLACE FUNCTION: {stmt[:80]!r}")
            out.append((file, name, stmt))
    return out


# ---------------------------------------------------------------- applying them (inside the migrate transaction)
def lock(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))


def _search_path(conn: psycopg.Connection, path: str) -> None:
    conn.execute("SELECT set_config('search_path', %s, true)", (path,))


def create_tables(conn: psycopg.Connection) -> None:
    """A fresh database: the schema and the current tables."""
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    _search_path(conn, f"{SCHEMA}, pg_temp")
    for file in TABLE_FILES:
        conn.execute(read(file))


def has_tables(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = to_regnamespace(%s))",
                        (SCHEMA,)).fetchone()[0]


def _our_functions(conn: psycopg.Connection, name: str | None = None) -> list[tuple[int, str]]:
    return conn.execute(
        """SELECT p.oid::int8, p.proname::text FROM pg_proc p
            WHERE p.pronamespace = to_regnamespace(%s) AND (%s::text IS NULL OR p.proname = %s)""",
        (SCHEMA, name, name)).fetchall()


def _drop(conn: psycopg.Connection, functions: list[tuple[int, str]]) -> None:
    # RESTRICT: a column default, trigger or index that uses the function
    # makes the migrate fail here (and roll back) instead of losing it.
    for oid, _ in functions:
        conn.execute(f"DROP FUNCTION {SCHEMA}.{_signature(conn, oid)}")


def _signature(conn: psycopg.Connection, oid: int) -> str:
    return conn.execute("SELECT format('%%I(%%s)', proname, pg_get_function_identity_arguments(oid)) "
                        "FROM pg_proc WHERE oid = %s", (oid,)).fetchone()[0]


def apply_functions(conn: psycopg.Connection) -> None:
    """Every function of sql/functions/ as its file defines it, in schema
    minutehand; then none other. CREATE OR REPLACE keeps a function's
    identity (and what depends on it); a function whose result, parameter
    names or defaults changed cannot be replaced and is dropped first; one
    whose argument types changed is created anew and its old form dropped;
    one the files no longer define is dropped."""
    _search_path(conn, f"{SCHEMA}, pg_temp")
    defined: set[str] = set()
    for file, name, stmt in function_definitions():
        defined.add(name)
        before = _our_functions(conn, name)
        if len(before) > 1:                     # overloads: not ours (one function per name)
            _drop(conn, before)
            before = []
        conn.execute("SAVEPOINT mh_function")
        try:
            conn.execute(stmt)
        except (psycopg.errors.InvalidFunctionDefinition, psycopg.errors.WrongObjectType):
            conn.execute("ROLLBACK TO SAVEPOINT mh_function")
            _drop(conn, before)
            before = []
            try:
                conn.execute(stmt)
            except psycopg.Error as exc:
                raise RuntimeError(f"sql/{file}: {name}: {exc}") from exc
        except psycopg.Error as exc:
            raise RuntimeError(f"sql/{file}: {name}: {exc}") from exc
        conn.execute("RELEASE SAVEPOINT mh_function")
        after = _our_functions(conn, name)
        if {oid for oid, _ in after} - {oid for oid, _ in before}:     # created anew: the old form goes
            _drop(conn, before)
    _drop(conn, [f for f in _our_functions(conn) if f[1] not in defined])


def drop_functions(conn: psycopg.Connection) -> None:
    """Every function of ours (a database below head has none)."""
    _drop(conn, _our_functions(conn))


def apply_after_functions(conn: psycopg.Connection) -> None:
    """Data copied from the server, then the roles and rights."""
    _search_path(conn, f"{SCHEMA}, pg_temp")
    conn.execute(read("refresh.sql"))
    conn.execute(read("grants.sql"))


# ---------------------------------------------------------------- from an Alembic revision
def execute(sql: str, search_path: str | None = None) -> None:
    """Run SQL from an Alembic revision, through the psycopg connection
    itself (SQLAlchemy's text() would read `:name` inside PL/pgSQL bodies as
    bind parameters), a statement at a time: Citus propagates no DDL sent in
    a query of several statements. search_path: where unqualified names go
    (for this transaction)."""
    from alembic import op
    conn = op.get_bind().connection.driver_connection
    if search_path is not None:
        _search_path(conn, search_path)
    for statement in statements(sql):
        conn.execute(statement)
