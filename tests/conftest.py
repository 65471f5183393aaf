"""Test harness: one PostgreSQL server per session, one migrated template database
per session, and a fresh clone of the template for each test that asks for
`db_dsn` or `db`.

By default the server is a throwaway minutehand.dev.localpg cluster (fsync off) in a temp dir.
Set MINUTEHAND_TEST_DSN=postgresql://USER[:PASSWORD]@HOST:PORT[/DB] to use an
already-running server instead; USER must be able to create databases.
"""

from __future__ import annotations

import getpass
import itertools
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from pytest_postgresql.janitor import DatabaseJanitor

from minutehand.dev.localpg import LocalCluster
from minutehand.store.schema import SEARCH_PATH

# In every database name we create: unique per session and per xdist worker (each is
# its own process), and random too, so runs from several machines can share a server.
RUN_ID = f"{os.getpid()}_{secrets.token_hex(3)}"
_test_db_numbers = itertools.count()


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str
    password: str | None = None
    maintenance_dbname: str = "postgres"  # where CREATE/DROP DATABASE is issued from

    def dsn(self, dbname: str = "postgres", search_path: bool = True) -> str:
        """A URL of the database; its sessions find our objects unqualified
        (search_path=minutehand, as the store's own connections), unless
        search_path is False (a user's session: the server's default path)."""
        host = f"[{self.host}]" if ":" in self.host else quote(self.host, safe="")  # IPv6 / socket dir
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        url = f"postgresql://{auth}@{host}:{self.port}/{quote(dbname, safe='')}"
        return url + "?options=" + quote(SEARCH_PATH, safe="") if search_path else url

    def janitor(self, dbname: str, **kwargs) -> DatabaseJanitor:
        return DatabaseJanitor(
            user=self.user, password=self.password, host=self.host, port=self.port,
            dbname=dbname, maintenance_dbname=self.maintenance_dbname, **kwargs,
        )


def _memory_dir() -> str | None:
    """/dev/shm if it has room, else None (the default temp dir).

    Cloning the template creates ~1,300 files: 0.1-1 s each time on a busy disk,
    ~0.05 s on tmpfs. The cluster runs with fsync off and is thrown away anyway.
    (Docker's default /dev/shm is 64 MB: too small, so the size check.)
    """
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    roomy = st.f_bavail * st.f_frsize >= 4 << 30
    return "/dev/shm" if roomy and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    if url := os.environ.get("MINUTEHAND_TEST_DSN"):
        p = conninfo_to_dict(url)
        yield PgServer(
            host=p.get("host") or "localhost",
            port=int(p.get("port") or 5432),
            user=p.get("user") or getpass.getuser(),
            password=p.get("password"),
            maintenance_dbname=p.get("dbname") or "postgres",
        )
        return
    tmp = Path(tempfile.mkdtemp(prefix="mh-pg-", dir=_memory_dir()))
    tmp.chmod(0o755)  # when root, the server runs as `postgres` and must reach tmp/pgdata
    # Small max_wal_size: each clone writes the template to WAL, which may sit in RAM.
    cluster = LocalCluster(tmp / "pgdata", fsync=False, settings={"max_wal_size": "256MB"})
    try:
        cluster.ensure_started()
        yield PgServer(cluster.host, cluster.port, cluster.user)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _migrate(dsn: str) -> None:
    # Imported here so that a missing or broken store only fails tests that need a schema.
    from minutehand.store.migrate import upgrade

    upgrade(dsn)


@pytest.fixture(scope="session")
def template_db(pg_server: PgServer) -> Iterator[str]:
    """Name of a database holding the migrated schema, cloned by `db_dsn`."""
    name = f"mh_tmpl_{RUN_ID}"
    with pg_server.janitor(name, as_template=True) as janitor:  # dropped on exit
        janitor.load(lambda **_: _migrate(pg_server.dsn(name)))
        yield name


@pytest.fixture
def db_dsn(pg_server: PgServer, template_db: str) -> Iterator[str]:
    """postgresql:// URL of a fresh database with the schema, dropped after the test."""
    name = f"mh_test_{RUN_ID}_{next(_test_db_numbers)}"
    with pg_server.janitor(name, template_dbname=template_db):
        yield pg_server.dsn(name)


@pytest.fixture
def db(db_dsn: str) -> Iterator[psycopg.Connection]:
    """Autocommit psycopg connection to the test's fresh database."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        yield conn
