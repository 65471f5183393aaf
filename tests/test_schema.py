"""The schema has one definition: a database made from the current files
(sql/tables/, the fresh path of `minutehand migrate`) and one migrated from
empty through every revision are the same, object by object, function
bodies, defaults, indexes, constraints, partitions and rights included; a
database taken head -> previous -> head is the same again. Every function
is defined once in sql/. A user's session with the server's default
search_path calls minutehand.submit_job beside a table of its own named jobs."""
from __future__ import annotations

import contextlib
import os
import secrets
from collections import Counter

import psycopg
import pytest

from minutehand.store import migrate, sqlfiles

# Each query: (kind, name, definition) rows over schema minutehand.
CATALOG = {
    "relation": """
        SELECT c.relkind::text, c.relname,
               concat_ws(' ', c.reloptions::text, pg_get_expr(c.relpartbound, c.oid), pg_get_partkeydef(c.oid),
                         (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                           WHERE i.inhrelid = c.oid), c.relacl::text, c.relpersistence::text)
          FROM pg_class c WHERE c.relnamespace = 'minutehand'::regnamespace""",
    "column": """  -- the position among live columns: a revision undone and redone keeps the order
        SELECT c.relname, (row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum))::text || ' ' || a.attname,
               concat_ws(' ', format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated,
                         pg_get_expr(d.adbin, d.adrelid), a.attcollation)
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'minutehand'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped""",
    "index": """
        SELECT c.relname, i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
         WHERE c.relnamespace = 'minutehand'::regnamespace""",
    "constraint": """
        SELECT coalesce(c.relname, t.typname), k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k LEFT JOIN pg_class c ON c.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
         WHERE k.connamespace = 'minutehand'::regnamespace""",
    "function": """
        SELECT p.proname, p.oid::regprocedure::text,
               concat_ws(' ', pg_get_functiondef(p.oid), p.proacl::text, pg_get_userbyid(p.proowner))
          FROM pg_proc p WHERE p.pronamespace = 'minutehand'::regnamespace""",
    "type": """
        SELECT t.typtype::text, t.typname,
               concat_ws(' ', (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e
                                WHERE e.enumtypid = t.oid), t.typacl::text)
          FROM pg_type t WHERE t.typnamespace = 'minutehand'::regnamespace""",
    "sequence": """
        SELECT s.seqrelid::regclass::text, '',
               concat_ws(' ', s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmax, s.seqmin, s.seqcache,
                         s.seqcycle)
          FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
         WHERE c.relnamespace = 'minutehand'::regnamespace""",
    "schema": """
        SELECT n.nspname, pg_get_userbyid(n.nspowner), n.nspacl::text FROM pg_namespace n
         WHERE n.nspname = 'minutehand'""",
    "data": """
        SELECT 'shards', count(*)::text, string_agg(DISTINCT concat_ws(' ', owner, epoch, hand), ',') FROM shards
        UNION ALL SELECT 'wheel', count(*)::text, string_agg(concat_ws(' ', id, swept_until, cascaded_until), ',')
          FROM wheel
        UNION ALL SELECT 'timezone_names', (count(*) > 300)::text, '' FROM timezone_names
        UNION ALL SELECT 'alembic_version', version_num, '' FROM alembic_version""",
}


def catalog(dsn: str) -> dict[str, set[tuple[str, str, str]]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {kind: set(c.execute(sql).fetchall()) for kind, sql in CATALOG.items()}


def assert_same(a: dict, b: dict) -> None:
    for kind in CATALOG:
        only_a, only_b = sorted(a[kind] - b[kind]), sorted(b[kind] - a[kind])
        assert (only_a, only_b) == ([], []), f"{kind} differs:\n  first only: {only_a[:5]}\n  second only: {only_b[:5]}"


@pytest.fixture
def new_db(pg_server):
    """A function making empty databases, dropped afterwards."""
    with contextlib.ExitStack() as stack:
        def make() -> str:
            name = f"mh_schema_{os.getpid()}_{secrets.token_hex(4)}"
            stack.enter_context(pg_server.janitor(name))
            return pg_server.dsn(name)
        yield make


def test_the_current_files_and_the_revisions_make_the_same_schema(new_db):
    fresh, migrated = new_db(), new_db()
    migrate.upgrade(fresh)
    migrate.upgrade(migrated, through_revisions=True)
    a, b = catalog(fresh), catalog(migrated)
    assert len(a["relation"]) > 600 and len(a["function"]) > 70
    assert_same(a, b)


def test_head_to_previous_to_head_is_a_fresh_database_again(new_db):
    fresh, cycled = new_db(), new_db()
    migrate.upgrade(fresh)
    migrate.upgrade(cycled)
    migrate.downgrade(cycled, "-1")
    migrate.upgrade(cycled)
    assert_same(catalog(fresh), catalog(cycled))


def test_every_function_is_defined_once_in_sql_and_only_in_sql_functions():
    defined: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for path in sorted(sqlfiles.SQL_DIR.rglob("*.sql")):
        rel = str(path.relative_to(sqlfiles.SQL_DIR))
        for stmt in sqlfiles.statements(path.read_text()):
            if (name := sqlfiles.function_name(stmt)) is not None:
                defined[name] += 1
                where.setdefault(name, []).append(rel)
    twice = {n: where[n] for n, k in defined.items() if k > 1}
    assert twice == {}
    assert {f for files in where.values() for f in files} == set(sqlfiles.FUNCTION_FILES)
    # every file of sql/functions/ is applied, and sql/tables/ likewise
    assert set(sqlfiles.FUNCTION_FILES) == {str(p.relative_to(sqlfiles.SQL_DIR))
                                           for p in (sqlfiles.SQL_DIR / "functions").glob("*.sql")}
    assert set(sqlfiles.TABLE_FILES) == {str(p.relative_to(sqlfiles.SQL_DIR))
                                        for p in (sqlfiles.SQL_DIR / "tables").glob("*.sql")}
    assert len(sqlfiles.function_definitions()) == len(defined)


def test_the_database_holds_exactly_the_functions_of_the_files(db):
    names = {name for _, name, _ in sqlfiles.function_definitions()}
    assert {r[0] for r in db.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'minutehand'::regnamespace")} == names
    assert db.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'minutehand'::regnamespace"
                      ).fetchone()[0] == len(names)


def test_name_resolution_every_plpgsql_and_client_function_pins_its_path_helpers_do_not(db):
    """PL/pgSQL functions and the ones clients call pin search_path; the SQL
    helpers that are inlined into hot statements have no SET (it would keep
    the planner from inlining them)."""
    rows = db.execute("""SELECT p.proname, l.lanname, p.proconfig, p.prosecdef FROM pg_proc p
                           JOIN pg_language l ON l.oid = p.prolang
                          WHERE p.pronamespace = 'minutehand'::regnamespace""").fetchall()
    client = {"submit_job", "start", "heartbeat", "complete", "fail", "leave_dispatchers"}
    more = {"take_shard_leases": ["lock_timeout=1s"]}       # gives up on a shard group being moved (Citus)
    for name, lang, config, definer in rows:
        if lang == "plpgsql" or name in client or definer:
            assert config == ["search_path=minutehand, pg_temp", *more.get(name, [])], name
        else:
            assert config is None, name
    for helper in ("mh_now", "mh_shard_of", "mh_minute_slot", "mh_batch_items"):
        assert dict((r[0], r[2]) for r in rows)[helper] is None


def test_a_session_with_the_default_search_path_submits_beside_its_own_jobs_table(db_dsn, pg_server):
    """Another service's session: no search_path of ours, a table of its own
    named public.jobs, and only the role minutehand_submitter."""
    user_dsn = db_dsn.split("?")[0]
    role = f"svc_{secrets.token_hex(4)}"
    with psycopg.connect(user_dsn, autocommit=True) as c:
        assert c.execute("SHOW search_path").fetchone()[0] == '"$user", public'
        c.execute("CREATE TABLE public.jobs (id int, note text)")
        c.execute("INSERT INTO public.jobs VALUES (1, 'mine')")
        c.execute("INSERT INTO minutehand.teams (name) VALUES ('billing')")
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"GRANT minutehand_submitter TO {role}")
        c.execute(f"GRANT ALL ON public.jobs TO {role}")
        try:
            for as_role in (False, True):
                c.execute("BEGIN")
                if as_role:
                    c.execute(f"SET LOCAL ROLE {role}")
                job_id = c.execute("SELECT minutehand.submit_job('billing', 'send_invoice', p_payload => '{}')"
                                   ).fetchone()[0]
                row = c.execute("SELECT * FROM minutehand.cancel(%s, 'billing')", (job_id,)).fetchone()
                assert row[:3] == (job_id, True, "cancelled")
                items = c.execute("SELECT job_id, error FROM minutehand.submit_jobs('billing', ARRAY['a', 'b'])"
                                  ).fetchall()
                assert [e for _, e in items] == [None, None]
                assert c.execute("SELECT note FROM jobs").fetchall() == [("mine",)]     # the user's own table
                c.execute("COMMIT")
            c.execute("BEGIN")
            c.execute(f"SET LOCAL ROLE {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):     # the procedures only, no table
                c.execute("SELECT count(*) FROM minutehand.jobs")
            c.execute("ROLLBACK")
            assert c.execute("SELECT count(*) FROM minutehand.jobs j JOIN minutehand.teams t ON t.id = j.team_id"
                             " WHERE t.name = 'billing'").fetchone()[0] == 6
        finally:
            c.execute("ROLLBACK") if c.info.transaction_status else None
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE {role}")


def test_our_connections_start_in_our_schema_with_jit_off(db_dsn):
    """The store's connections: our search path, and JIT compilation off (a
    statement of ours runs in milliseconds; compiling a plan whose estimate
    overshot took hundreds), unless the URL's own options say otherwise."""
    from minutehand.store.schema import conninfo
    user_dsn = db_dsn.split("?")[0]
    with psycopg.connect(conninfo(user_dsn)) as c:
        assert c.execute("SHOW search_path").fetchone()[0] == "minutehand"
        assert c.execute("SHOW jit").fetchone()[0] == "off"
    with psycopg.connect(conninfo(user_dsn + "?options=-c%20jit%3Don")) as c:
        assert c.execute("SHOW jit").fetchone()[0] == "on"
