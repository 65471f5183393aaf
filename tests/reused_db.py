"""One database per test module, emptied back to the migrated state before
each test: for modules of many small tests, where a fresh clone per test
would cost more than the test. Import the fixtures into the module:

    from reused_db import RESET, conn, db_dsn, module_conn, module_dsn, module_store, store
"""
from __future__ import annotations

import os
import secrets

import psycopg
import pytest

from support import T0, make_store, pin

# Empty every table of the schema (whatever tables later revisions add), then
# put back the per-shard and wheel state of a fresh migration.
RESET = """
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c
              WHERE c.relnamespace = 'minutehand'::regnamespace AND c.relkind IN ('r', 'p')
                AND NOT c.relispartition AND c.relname NOT IN ('alembic_version', 'shards', 'wheel', 'timezone_names')
    LOOP
        EXECUTE format('DELETE FROM %I', t);
    END LOOP;
END $$;
UPDATE shards SET owner = NULL, epoch = 0, lease_expires_at = NULL, hand = NULL;
UPDATE wheel SET swept_until = NULL;
INSERT INTO teams (name) VALUES ('t'), ('u');
DISCARD TEMP;
"""


@pytest.fixture(scope="module")
def module_dsn(request, pg_server, template_db):
    """One clone of the migrated template for this module."""
    name = f"mh_{request.module.__name__.rsplit('.', 1)[-1]}_{os.getpid()}_{secrets.token_hex(3)}"
    with pg_server.janitor(name, template_dbname=template_db):
        yield pg_server.dsn(name)


@pytest.fixture(scope="module")
def module_conn(module_dsn):
    with psycopg.connect(module_dsn, autocommit=True) as c:
        c.execute("SET max_parallel_workers_per_gather = 0")   # counting 480 partitions: no worker start-up
        yield c


@pytest.fixture(scope="module")
def module_store(module_dsn):
    s = make_store(module_dsn)
    yield s
    s.close()


@pytest.fixture
def db_dsn(module_dsn, module_conn):
    """Overrides conftest's per-test clone: the module's database, emptied back
    to the migrated state plus teams 't' and 'u'."""
    module_conn.execute(RESET)
    return module_dsn


@pytest.fixture
def conn(db_dsn, module_conn):
    """An autocommit connection to the test database, clock pinned to T0."""
    pin(module_conn, T0)
    return module_conn


@pytest.fixture
def store(db_dsn, module_store):
    """A Store on the test database, clock pinned to T0."""
    module_store.clock = T0
    return module_store
