"""Migrations against a real PostgreSQL, each test on its own empty database
(made with the session's pg_server, not the migrated template): upgrade
creates the schema, upgrading again is a no-op, and downgrading the latest
revision removes every table, function and type it made, after which an
upgrade works again."""
from __future__ import annotations

import os
import secrets

import psycopg
import pytest
from alembic.script import ScriptDirectory

from minutehand.store import migrate

# Everything in the schemas a migration could write to (not the system ones):
# relations of every kind (tables, partitions, indexes, sequences, views),
# functions, types (enums, composites, row and array types) and schemas.
OBJECTS = """
SELECT format('%s %s.%s', CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                                         WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                                         WHEN 'm' THEN 'view' WHEN 'c' THEN 'composite' ELSE c.relkind::text END,
              n.nspname, c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN (SELECT nspname FROM user_ns)
UNION ALL
SELECT format('function %s.%s(%s)', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname IN (SELECT nspname FROM user_ns)
UNION ALL
SELECT format('type %s.%s', n.nspname, t.typname)
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname IN (SELECT nspname FROM user_ns)
UNION ALL
SELECT format('schema %s', nspname) FROM user_ns WHERE nspname <> 'public'
"""
USER_NS = """
WITH user_ns AS (SELECT nspname FROM pg_namespace
                  WHERE nspname NOT IN ('pg_catalog', 'information_schema')
                    AND nspname NOT LIKE 'pg\\_toast%' AND nspname NOT LIKE 'pg\\_temp%')
"""


def objects(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {r[0] for r in c.execute(USER_NS + OBJECTS)}


def alembic_own(names: set[str]) -> set[str]:
    """Alembic's bookkeeping (the version table, its index and row types) stays after a downgrade."""
    return {n for n in names if "alembic_version" in n}


def latest_revision():
    script = ScriptDirectory.from_config(migrate._config("postgresql://"))
    return script.get_revision(migrate.head())


def all_revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(migrate._config("postgresql://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


@pytest.fixture
def empty_dsn(pg_server):
    """A new, empty database (not cloned from the migrated template), dropped afterwards."""
    name = f"mh_migr_{os.getpid()}_{secrets.token_hex(4)}"
    with pg_server.janitor(name):
        yield pg_server.dsn(name)


def smoke(dsn: str) -> None:
    """The schema works: a team, a job submitted onto the wheel."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET minutehand.now = '2030-01-01 12:00:30+00'")
        c.execute("INSERT INTO teams (name) VALUES ('smoke') ON CONFLICT DO NOTHING")
        job_id = c.execute("SELECT submit_job('smoke', 'check', NULL, '{}')").fetchone()[0]
        assert c.execute("SELECT state FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "scheduled"
        assert c.execute("SELECT count(*) FROM due_minutes WHERE job_id = %s", (job_id,)).fetchone()[0] == 1


def test_upgrade_on_an_empty_database_creates_the_schema(empty_dsn):
    assert objects(empty_dsn) == set()
    assert migrate.current(empty_dsn) is None
    migrate.upgrade(empty_dsn)
    assert migrate.current(empty_dsn) == migrate.head()
    made = objects(empty_dsn)
    for name in ("table public.jobs", "table public.teams", "table public.idempotency_keys",
                 "table public.shards", "table public.wheel", "table public.due_minutes",
                 "table public.due_hours", "table public.due_far", "type public.job_state",
                 "type public.outcome", "type public.due_row", "sequence public.job_id_seq"):
        assert name in made, name
    for fn in ("submit_job", "submit_job_detail", "submit_jobs", "claim_due", "start", "heartbeat", "complete",
               "fail", "cancel", "expire_claims", "cascade_wheel", "sweep_passed", "purge_idempotency_keys",
               "maintain", "mh_now"):
        assert any(o.startswith(f"function public.{fn}(") for o in made), fn
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        parts = dict(c.execute("""SELECT p.relname, count(*) FROM pg_inherits i
                                    JOIN pg_class p ON p.oid = i.inhparent GROUP BY 1"""))
        assert parts["due_minutes"] == c.execute("SELECT mh_minute_slots()").fetchone()[0] == 480
        assert parts["due_hours"] == c.execute("SELECT mh_hour_slots()").fetchone()[0] == 96
        assert c.execute("SELECT count(*) FROM shards").fetchone()[0] == 256
        assert c.execute("SELECT count(*) FROM wheel").fetchone()[0] == 1
    smoke(empty_dsn)


def test_upgrade_again_is_a_no_op(empty_dsn):
    migrate.upgrade(empty_dsn)
    smoke(empty_dsn)
    revision, before = migrate.current(empty_dsn), objects(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        rows_before = c.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM teams),"
                                " (SELECT count(*) FROM due_minutes)").fetchone()
    migrate.upgrade(empty_dsn)
    migrate.upgrade(empty_dsn, "head")
    assert migrate.current(empty_dsn) == revision == migrate.head()
    assert objects(empty_dsn) == before
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM teams),"
                         " (SELECT count(*) FROM due_minutes)").fetchone() == rows_before == (1, 1, 1)


def test_downgrade_of_the_latest_revision_removes_what_it_made(empty_dsn):
    latest = latest_revision()
    if latest.down_revision is not None:
        migrate.upgrade(empty_dsn, latest.down_revision)
    before = objects(empty_dsn)
    migrate.upgrade(empty_dsn)
    made = objects(empty_dsn) - before
    assert made
    smoke(empty_dsn)                                   # with data in its tables, too
    migrate.downgrade(empty_dsn, "-1")
    assert migrate.current(empty_dsn) == latest.down_revision
    after = objects(empty_dsn)
    left_over = (after - before) - alembic_own(after)
    assert left_over == set(), f"downgrade left {sorted(left_over)}"
    assert before - after == set(), "downgrade removed what an earlier revision made"


@pytest.mark.parametrize("revision", all_revisions())
def test_each_revision_downgrades_to_nothing_of_its_own_and_upgrades_again(empty_dsn, revision):
    """Not only the latest: each revision, applied on top of the one before,
    is undone completely by its downgrade and applies again after it."""
    down = ScriptDirectory.from_config(migrate._config("postgresql://")).get_revision(revision).down_revision
    if down is not None:
        migrate.upgrade(empty_dsn, down)
    before = objects(empty_dsn)
    migrate.upgrade(empty_dsn, revision)
    made = objects(empty_dsn)
    assert made - before
    smoke(empty_dsn)
    migrate.downgrade(empty_dsn, down or "base")
    assert migrate.current(empty_dsn) == down
    after = objects(empty_dsn)
    assert (after - before) - alembic_own(after) == set(), f"downgrade of {revision} left {sorted(after - before)}"
    assert before - after == set(), f"downgrade of {revision} removed what an earlier revision made"
    migrate.upgrade(empty_dsn, revision)
    assert objects(empty_dsn) == made


def test_series_survive_a_later_upgrade_and_go_with_their_downgrade(empty_dsn):
    """Revision 0002: submit_series works on its schema; downgrading to 0001
    removes the series table and its procedures, and the runs it made stay as
    ordinary jobs."""
    migrate.upgrade(empty_dsn, "0002")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("SET minutehand.now = '2030-01-01 12:00:30+00'")
        c.execute("INSERT INTO teams (name) VALUES ('smoke')")
        series_id, job_id = c.execute("SELECT series_id, job_id FROM submit_series('smoke', 'tick', p_every_s => 60)"
                                      ).fetchone()
        assert c.execute("SELECT series_id FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == series_id
    migrate.downgrade(empty_dsn, "0001")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT to_regclass('series'), to_regproc('submit_series')").fetchone() == (None, None)
        assert c.execute("SELECT state::text FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "scheduled"
    migrate.upgrade(empty_dsn)
    assert migrate.current(empty_dsn) == migrate.head()


def test_upgrade_after_downgrade_works_again(empty_dsn):
    migrate.upgrade(empty_dsn)
    first = objects(empty_dsn)
    smoke(empty_dsn)
    migrate.downgrade(empty_dsn, "-1")
    migrate.upgrade(empty_dsn)
    assert migrate.current(empty_dsn) == migrate.head()
    assert objects(empty_dsn) == first
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # the smoke job stays when only a later revision was undone; undoing the first empties everything
        kept = 0 if latest_revision().down_revision is None else 1
        assert c.execute("SELECT count(*) FROM jobs").fetchone()[0] == kept
    smoke(empty_dsn)
