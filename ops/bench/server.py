"""The PostgreSQL server a benchmark runs against: the one given by --dsn, or
a fresh local cluster, durable (fsync and synchronous_commit on), removed
afterwards."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from minutehand.dev.localpg import LocalCluster
from minutehand.store import migrate, schema


def add_server_arguments(parser) -> None:
    """--dsn, and a Citus coordinator's --citus-workers and --citus-shard-count."""
    parser.add_argument("--dsn", help="a PostgreSQL server (superuser); default: a fresh durable local cluster")
    parser.add_argument("--citus-workers", default="",
                        help="host:port,... of the Citus workers when --dsn names a Citus coordinator")
    parser.add_argument("--citus-shard-count", type=int, default=16)


@contextmanager
def bench_server(dsn: str | None, prefix: str) -> Iterator[str]:
    """A superuser DSN for the benchmark."""
    if dsn is not None:
        yield dsn
        return
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o755)                    # when root, the server runs as `postgres` and must reach it
    cluster = LocalCluster(tmp / "pgdata")
    try:
        cluster.ensure_started()
        yield cluster.dsn()
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def url_of(dsn: str, dbname: str) -> str:
    """The same server URL with another database."""
    return urlsplit(dsn)._replace(path="/" + dbname).geturl()


def recreate(dsn: str, dbname: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    return url_of(dsn, dbname)


def citus_nodes(citus_workers: str) -> list[tuple[str, int]]:
    """host:port,... as (host, port) pairs."""
    return [(h, int(p)) for h, _, p in (w.rpartition(":") for w in citus_workers.split(",") if w)]


def minutehand_database(dsn: str, dbname: str, citus_workers: str = "", citus_shard_count: int = 16) -> str:
    """The database `dbname` made anew and migrated; its URL (with our schema
    on the search path, so raw SQL finds our objects). With citus_workers
    (host:port,...; `dsn` a Citus coordinator) it is made on every node and
    distributed, as `minutehand migrate --citus` does."""
    workers = citus_nodes(citus_workers)
    if workers:
        citus_database(dsn, dbname, workers)
    url = schema.url(url_of(dsn, dbname) if workers else recreate(dsn, dbname))
    migrate.upgrade(url)
    if workers:
        from minutehand.store import citus
        print(citus.distribute(url, citus_shard_count), flush=True)
    return url


def citus_database(dsn: str, dbname: str, workers: list[tuple[str, int]]) -> None:
    """The database `dbname` made anew on the Citus coordinator `dsn` and on
    each worker (host, port; same user), with the extension on every node and
    the workers registered (Citus keeps its metadata per database, and does
    not create databases on the workers)."""
    coordinator = urlsplit(dsn)
    nodes = [(h, p) for h, p in workers] + [(coordinator.hostname, coordinator.port or 5432)]
    for host, port in nodes:
        with psycopg.connect(dsn, host=host, port=port, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{dbname}"')
        with psycopg.connect(dsn, host=host, port=port, dbname=dbname, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION citus")
    with psycopg.connect(dsn, dbname=dbname, autocommit=True) as conn:
        conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (coordinator.hostname, coordinator.port or 5432))
        for host, port in workers:
            conn.execute("SELECT citus_add_node(%s, %s)", (host, port))
