"""Migrations against a real PostgreSQL, each test on its own empty database
(made with the session's pg_server, not the migrated template): upgrade
creates the schema `minutehand` and nothing in public, upgrading again
changes nothing, each revision's downgrade removes exactly its table delta
and the functions (a database below head has none), head -> base leaves
nothing of ours, a database of the layout before revision 0005 (everything
in public) is moved into the schema, the counters of a team's names past
its first 50 are added up by revision 0021, and two migrates at once wait
for each other. tests/test_schema.py compares the fresh path with the revisions."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import psycopg
import pytest
from alembic.script import ScriptDirectory

from minutehand.store import migrate

# Everything in the schemas a migration could write to (not the system ones):
# relations of every kind (tables, partitions, indexes, sequences, views),
# the columns of tables (not of each partition), functions, types (enums,
# composites, row and array types) and schemas.
OBJECTS = """
SELECT format('%s %s.%s', CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                                         WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                                         WHEN 'm' THEN 'view' WHEN 'c' THEN 'composite' ELSE c.relkind::text END,
              n.nspname, c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN (SELECT nspname FROM user_ns)
UNION ALL
SELECT format('column %s.%s.%s', n.nspname, c.relname, a.attname)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname IN (SELECT nspname FROM user_ns) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND a.attnum > 0 AND NOT a.attisdropped
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
    """Alembic's bookkeeping (the version table, its index and row types)."""
    return {n for n in names if "alembic_version" in n}


def functions(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith("function ")}


def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrate._config("postgresql://"))


def latest_revision():
    return script().get_revision(migrate.head())


def all_revisions() -> list[str]:
    """Every revision, oldest first."""
    return [r.revision for r in reversed(list(script().walk_revisions()))]


def up(dsn: str, revision: str = "head") -> None:
    """Through the revisions, as an existing database is upgraded."""
    migrate.upgrade(dsn, revision, through_revisions=True)


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


@pytest.mark.parametrize("path", ["fresh", "revisions"])
def test_upgrade_on_an_empty_database_creates_the_schema(empty_dsn, path):
    assert objects(empty_dsn) == set()
    assert migrate.current(empty_dsn) is None
    migrate.upgrade(empty_dsn, through_revisions=path == "revisions")
    assert migrate.current(empty_dsn) == migrate.head()
    made = objects(empty_dsn)
    for name in ("table minutehand.jobs", "table minutehand.teams", "table minutehand.idempotency_keys",
                 "table minutehand.shards", "table minutehand.wheel", "table minutehand.due_minutes",
                 "table minutehand.due_hours", "table minutehand.due_far", "type minutehand.job_state",
                 "type minutehand.outcome", "type minutehand.due_row", "sequence minutehand.job_id_seq",
                 "table minutehand.alembic_version", "schema minutehand"):
        assert name in made, name
    for fn in ("submit_job", "submit_job_detail", "submit_jobs", "claim_due", "start", "heartbeat", "complete",
               "fail", "cancel", "expire_claims", "cascade_wheel", "sweep_passed", "purge_idempotency_keys",
               "maintain", "mh_now"):
        assert any(o.startswith(f"function minutehand.{fn}(") for o in made), fn
    assert {o for o in made if ".public." in o.replace(" public.", ".public.")} == set(), "nothing of ours in public"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        parts = dict(c.execute("""SELECT p.relname, count(*) FROM pg_inherits i
                                    JOIN pg_class p ON p.oid = i.inhparent GROUP BY 1"""))
        assert parts["due_minutes"] == c.execute("SELECT mh_minute_slots()").fetchone()[0] == 480
        assert parts["due_hours"] == c.execute("SELECT mh_hour_slots()").fetchone()[0] == 96
        assert c.execute("SELECT count(*) FROM shards").fetchone()[0] == 256 == \
            c.execute("SELECT mh_shard_count()").fetchone()[0]
        assert c.execute("SELECT count(*) FROM wheel").fetchone()[0] == 1
        assert c.execute("SELECT count(*) FROM timezone_names WHERE name = 'Europe/Berlin'").fetchone()[0] == 1
        # the partitions are named as the functions name them
        names = {r[0] for r in c.execute("SELECT relname FROM pg_class WHERE relispartition AND relkind = 'r'")}
        assert names == {r[0] for r in c.execute(
            """SELECT mh_minute_part(s) FROM generate_series(0, mh_minute_slots() - 1) s
               UNION ALL SELECT mh_hour_part(s) FROM generate_series(0, mh_hour_slots() - 1) s""")}
    smoke(empty_dsn)


def test_upgrade_again_changes_nothing(empty_dsn):
    """At head, migrate applies the functions again: each keeps its identity
    (CREATE OR REPLACE), and the data stays."""
    migrate.upgrade(empty_dsn)
    smoke(empty_dsn)
    revision, before = migrate.current(empty_dsn), objects(empty_dsn)
    oids = "SELECT p.oid::regprocedure::text, p.oid FROM pg_proc p WHERE p.pronamespace = 'minutehand'::regnamespace"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        rows_before = c.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM teams),"
                                " (SELECT count(*) FROM due_minutes)").fetchone()
        oids_before = dict(c.execute(oids).fetchall())
    migrate.upgrade(empty_dsn)
    migrate.upgrade(empty_dsn, "head")
    assert migrate.current(empty_dsn) == revision == migrate.head()
    assert objects(empty_dsn) == before
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM teams),"
                         " (SELECT count(*) FROM due_minutes)").fetchone() == rows_before == (1, 1, 1)
        assert dict(c.execute(oids).fetchall()) == oids_before
    smoke(empty_dsn)


def test_downgrade_of_the_latest_revision_removes_what_it_made(empty_dsn):
    latest = latest_revision()
    if latest.down_revision is not None:
        up(empty_dsn, latest.down_revision)
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
    is undone completely by its downgrade and applies again after it. Below
    head there are no functions; at head there are."""
    down = script().get_revision(revision).down_revision
    if down is not None:
        up(empty_dsn, down)
    before = objects(empty_dsn)
    assert functions(before) == set()
    up(empty_dsn, revision)
    made = objects(empty_dsn)
    assert made - before - functions(made) - alembic_own(made)
    assert bool(functions(made)) == (revision == migrate.head())
    if revision == migrate.head():
        smoke(empty_dsn)
    migrate.downgrade(empty_dsn, down or "base")
    assert migrate.current(empty_dsn) == down
    after = objects(empty_dsn)
    assert (after - before) - alembic_own(after) == set(), f"downgrade of {revision} left {sorted(after - before)}"
    assert before - after == set(), f"downgrade of {revision} removed what an earlier revision made"
    up(empty_dsn, revision)
    assert objects(empty_dsn) == made


def test_head_to_base_leaves_nothing_of_ours(empty_dsn):
    migrate.upgrade(empty_dsn)
    smoke(empty_dsn)
    migrate.downgrade(empty_dsn, "base")
    assert migrate.current(empty_dsn) is None
    assert objects(empty_dsn) == set()
    migrate.upgrade(empty_dsn)
    smoke(empty_dsn)


def test_series_survive_a_later_upgrade_and_go_with_their_downgrade(empty_dsn):
    """Revision 0002 holds the series table: downgrading below it removes the
    table, and the runs it made stay as ordinary jobs (in public, the layout
    of those revisions)."""
    migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("SET minutehand.now = '2030-01-01 12:00:30+00'")
        c.execute("INSERT INTO teams (name) VALUES ('smoke')")
        series_id, job_id = c.execute("SELECT series_id, job_id FROM submit_series('smoke', 'tick', p_every_s => 60)"
                                      ).fetchone()
        assert c.execute("SELECT series_id FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == series_id
    migrate.downgrade(empty_dsn, "0001")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT to_regclass('public.series'), to_regclass('minutehand.series'),"
                         " to_regproc('minutehand.submit_series')").fetchone() == (None, None, None)
        assert c.execute("SELECT state::text FROM public.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "scheduled"
    migrate.upgrade(empty_dsn)
    assert migrate.current(empty_dsn) == migrate.head()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT state::text FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "scheduled"
    smoke(empty_dsn)


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


def test_a_database_of_the_old_layout_moves_into_the_schema(empty_dsn, pg_server):
    """Before revision 0005 everything was in public, the functions too (the
    database ops/dev reuses): 0005 moves the tables, partitions, sequence and
    types with their data, and drops the old functions by name; a function
    of the user's in public stays."""
    up(empty_dsn, "0004")
    public_dsn = empty_dsn.split("?")[0]
    with psycopg.connect(public_dsn, autocommit=True) as c:
        assert c.execute("SELECT to_regclass('public.alembic_version') IS NOT NULL").fetchone()[0]
        # stand-ins for the old functions (their names; one used a type of ours), and one of the user's
        c.execute("CREATE FUNCTION public.mh_now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT now() $$")
        c.execute("CREATE FUNCTION public.cancel(bigint, text) RETURNS outcome LANGUAGE sql"
                  " AS $$ SELECT NULL::outcome $$")
        c.execute("CREATE FUNCTION public.my_report() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
        c.execute("INSERT INTO teams (name) VALUES ('old')")
        c.execute("""INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at,
                                       state, max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at)
                     SELECT 3, 1027, id, 'old.job', '{}', 0, now(), 0, false, now(), 'scheduled', 3, 1, 3600,
                            now(), now() FROM teams""")
        c.execute("INSERT INTO due_m007 VALUES (7, 3, false, 0, now(), 1027)")
    assert migrate.current(empty_dsn) == "0004"
    migrate.upgrade(empty_dsn)
    assert migrate.current(empty_dsn) == migrate.head()
    left = {o for o in objects(empty_dsn) if " public." in o}
    assert left == {"function public.my_report()"}
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM jobs WHERE name = 'old.job'").fetchone()[0] == 1
        assert c.execute("SELECT job_id FROM due_m007").fetchall() == [(1027,)]
        assert c.execute("SELECT tableoid::regclass::text FROM due_minutes").fetchall() == [("due_m007",)]
    smoke(empty_dsn)


def test_0021_keeps_each_teams_50_names_of_most_volume_and_adds_up_the_rest(empty_dsn):
    """A team with counters of 60 names keeps the 50 of most volume apart;
    the rows of the other ten become one "(other)" row per minute (hour,
    purged row) and stripe, counts and histograms added up; a team of five
    names keeps them all. Then a new name of the full team is counted as
    "(other)", one of the other team's as itself."""
    up(empty_dsn, "0020")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("INSERT INTO teams (name) VALUES ('many'), ('few')")
        c.execute("""
            INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                    cancelled, lateness_hist, runtime_hist)
            SELECT v.m, v.s, t.id, 'n' || lpad(n::text, 2, '0'), n, n, 0, 1, 0, 0, array_fill(n::bigint, ARRAY[16]),
                   array_fill(1::bigint, ARRAY[16])
              FROM teams t, generate_series(1, 60) n,
                   (VALUES ('2030-01-01 12:00+00'::timestamptz, 3::smallint), ('2030-01-01 11:00+00', -1),
                           ('-infinity', -2)) v(m, s)
             WHERE t.name = 'many' OR n <= 5""")
    up(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        kept = dict(c.execute("""SELECT t.name, array_agg(n.name ORDER BY n.name) FROM team_stats_names n
                                   JOIN teams t ON t.id = n.team_id GROUP BY 1""").fetchall())
        assert kept == {"many": [f"n{i:02}" for i in range(11, 61)], "few": [f"n{i:02}" for i in range(1, 6)]}
        other = c.execute("""SELECT s.stripe, s.submitted, s.started, s.failed, s.lateness_hist, s.runtime_hist
                               FROM team_stats s WHERE s.name = '(other)' ORDER BY s.minute""").fetchall()
        assert other == [(stripe, 55, 55, 10, [55] * 16, [10] * 16) for stripe in (-2, -1, 3)]
        assert c.execute("SELECT count(*), sum(submitted) FROM team_stats").fetchone() == (3 * (50 + 1 + 5),
                                                                                          3 * (1830 + 15))
        c.execute("SET minutehand.now = '2030-01-02 12:00:30+00'")
        c.execute("SELECT submit_jobs('many', ARRAY['new']), submit_jobs('few', ARRAY['new'])")
        assert c.execute("""SELECT t.name, s.name FROM team_stats s JOIN teams t ON t.id = s.team_id
                             WHERE s.minute = '2030-01-02 12:00+00' ORDER BY 1""").fetchall() == [
            ("few", "new"), ("many", "(other)")]


def test_0023_a_jobs_traceparent_is_kept_claimed_and_goes_with_the_downgrade(empty_dsn):
    """Revision 0023 adds jobs.traceparent: a job submitted with one is
    claimed with it; downgrading below 0023 drops the column and keeps the
    job, which after the upgrade again has none and is claimed so."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    claim = ("SELECT c.job_id, c.traceparent FROM claim_due(mh_shard_of(%(id)s), 10, 'd1',"
             " take_shard_lease(mh_shard_of(%(id)s), 'd1', 3600), 30) c")
    migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("SET minutehand.now = '2030-01-01 12:00:30+00'")
        c.execute("INSERT INTO teams (name) VALUES ('traced')")
        kept = c.execute("SELECT submit_job('traced', 'a', p_traceparent => %s)", (traceparent,)).fetchone()[0]
        assert c.execute(claim, {"id": kept}).fetchall() == [(kept, traceparent)]
        older = c.execute("SELECT submit_job('traced', 'b', p_traceparent => %s)", (traceparent,)).fetchone()[0]
    migrate.downgrade(empty_dsn, "0022")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = 'minutehand'"
                         " AND table_name = 'jobs' AND column_name = 'traceparent'").fetchone()[0] == 0
        assert c.execute("SELECT state::text FROM minutehand.jobs WHERE id = %s", (older,)).fetchone()[0] == \
            "scheduled"
    migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("SET minutehand.now = '2030-01-01 12:00:30+00'")
        assert c.execute(claim, {"id": older}).fetchall() == [(older, None)]


@pytest.mark.processes
def test_two_migrates_at_once_wait_for_each_other(empty_dsn):
    """Processes (Alembic's context is one per process)."""
    code = "import sys; from minutehand.store import migrate; migrate.upgrade(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, empty_dsn], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert migrate.current(empty_dsn) == migrate.head()
    smoke(empty_dsn)


def test_functions_are_replaced_recreated_or_dropped_and_what_uses_them_stays(empty_dsn):
    """Every migrate at head makes the functions what sql/functions/ says:
    a changed result type is dropped and created again, a function the
    files do not define is dropped, and a column default that calls one of
    ours survives (CREATE OR REPLACE keeps the function it refers to)."""
    migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION mh_shard_count()")
        c.execute("CREATE FUNCTION mh_shard_count() RETURNS bigint LANGUAGE sql AS $$ SELECT 1::bigint $$")
        c.execute("CREATE FUNCTION mh_gone(int) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
        c.execute("CREATE FUNCTION claim_due(int) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")   # an old overload
        c.execute("ALTER TABLE teams ADD COLUMN seen_at timestamptz DEFAULT mh_now()")
    migrate.upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT mh_shard_count(), pg_typeof(mh_shard_count())::text").fetchone() == (256, "integer")
        assert c.execute("SELECT to_regproc('mh_gone')").fetchone()[0] is None
        assert c.execute("SELECT count(*) FROM pg_proc WHERE proname = 'claim_due'").fetchone()[0] == 1
        assert c.execute("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = 'teams'::regclass"
                         " AND adnum = (SELECT attnum FROM pg_attribute WHERE attrelid = 'teams'::regclass"
                         " AND attname = 'seen_at')").fetchone()[0] == "mh_now()"
    smoke(empty_dsn)
