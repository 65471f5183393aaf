"""Every statement the admin UI's own pages send (overview, dispatchers,
teams, audit, sign-in) stays O(page) with 1,000,000 jobs stored: read from
the plans (EXPLAIN ANALYZE, JSON), not from wall time.

One database for the module: 1,000,000 jobs written by one INSERT ...
SELECT generate_series (a thousand of them running on 50 workers, with
their claim reminders), an hour of counters for 50 teams, a day of planned
load, 100,000 audit entries and 10,000 sessions, then ANALYZE. For each
statement: it never reads jobs but through jobs_pkey, never scans a big
table whole (only index scans, or sequential scans of the small control
tables: shards, teams, dispatchers, duty_leases and the wheel's planner
statistics), and the rows it reads from any one relation are bounded by its
page, the clock or the number of teams and shards, far below the sizes
stored."""
from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest

from minutehand.store.queries import q
from tests.support import T0, pin

pytestmark = pytest.mark.bench

JOBS = 1_000_000
RUNNING = 1_000
AUDIT = 100_000
SESSIONS = 10_000
TEAMS = 50
# Relations small by nature (bounded by shards, teams, dispatchers, the catalog).
SMALL = {"shards", "teams", "dispatchers", "duty_leases", "pg_class", "pg_inherits"}


def plan_nodes(plan: dict) -> Iterator[dict]:
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def analyzed(conn: psycopg.Connection, name: str, params: dict) -> dict:
    """EXPLAIN ANALYZE of a named statement (rolled back: nothing it writes stays)."""
    with conn.transaction(force_rollback=True):
        raw = psycopg.ClientCursor(conn).execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + q(name), params).fetchone()[0]
    doc = json.loads(raw) if isinstance(raw, str) else raw
    return doc[0]["Plan"]


def rows_read(plan: dict) -> dict[str, int]:
    """Rows each relation handed up, over all loops (what was read of it)."""
    read: dict[str, int] = {}
    for node in plan_nodes(plan):
        if "Relation Name" in node and node["Node Type"] != "ModifyTable":
            rel = node["Relation Name"]
            read[rel] = read.get(rel, 0) + int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1)) \
                + int(node.get("Rows Removed by Filter", 0)) * int(node.get("Actual Loops", 1))
    return read


def assert_bounded(plan: dict, bound: int) -> dict[str, int]:
    """jobs only by primary key; big relations only through an index; at most `bound` rows from any."""
    for node in plan_nodes(plan):
        rel = node.get("Relation Name")
        if rel is None or rel in SMALL or node["Node Type"] == "ModifyTable":
            continue
        assert node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), (rel, node["Node Type"])
        if rel == "jobs":
            assert node.get("Index Name") == "jobs_pkey", node.get("Index Name")
    read = rows_read(plan)
    assert all(n <= bound for n in read.values()), (read, [
        (n["Node Type"], n.get("Relation Name"), n.get("Index Name"), n.get("Actual Rows"), n.get("Actual Loops"),
         n.get("Rows Removed by Filter")) for n in plan_nodes(plan)])
    return read


@pytest.fixture(scope="module")
def big(pg_server, template_db) -> Iterator[str]:
    name = f"mh_admin_plans_{os.getpid()}_{secrets.token_hex(3)}"
    with pg_server.janitor(name, template_dbname=template_db):
        dsn = pg_server.dsn(name)
        with psycopg.connect(dsn, autocommit=True) as c:
            pin(c, T0)
            c.execute("INSERT INTO teams (name, quota) SELECT 'team-' || g, 100 FROM generate_series(1, %s) g",
                      (TEAMS,))
            # 1,000,000 jobs, one statement: the first RUNNING run on 50 workers, the rest wait far ahead
            c.execute("""
                INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at,
                                  state, max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at,
                                  agreed_at, claimed_by, claim_expires_at)
                SELECT (g %% 256)::smallint, ((g::bigint) << 10) | (g %% 256), 1 + g %% %(teams)s, 'job-' || g %% 7,
                       '{}', 0, t, 0, false, t,
                       CASE WHEN g <= %(running)s THEN 'running' ELSE 'scheduled' END::job_state, 3, 1, 3600,
                       %(t0)s, %(t0)s, t,
                       CASE WHEN g <= %(running)s THEN 'worker-' || g %% 50 END,
                       CASE WHEN g <= %(running)s THEN %(t0)s + interval '5 minutes' END
                  FROM generate_series(1, %(jobs)s) g,
                       LATERAL (SELECT %(t0)s::timestamptz + interval '4 days' + (g %% 100000) * interval '1 minute') r(t)
            """, {"teams": TEAMS, "running": RUNNING, "jobs": JOBS, "t0": T0})
            # their claim reminders: one per shard and claim of ~4 jobs
            c.execute("""
                INSERT INTO claim_checks (shard, check_at, job_ids)
                SELECT (g %% 256)::smallint, %(t0)s::timestamptz + interval '5 minutes',
                       array_agg(((g::bigint) << 10) | (g %% 256))
                  FROM generate_series(1, %(running)s) g GROUP BY g %% 256""", {"t0": T0, "running": RUNNING})
            # an hour of counters, 50 teams x 4 names x 4 stripes, and older hour rows
            c.execute("""
                INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                        cancelled, lateness_hist, runtime_hist)
                SELECT mh_minute(%(t0)s) - m * interval '1 minute', s, t, 'job-' || n, 10, 9, 8, 1, 0, 0,
                       array_fill(1::bigint, ARRAY[16]), array_fill(1::bigint, ARRAY[16])
                  FROM generate_series(0, 59) m, generate_series(16, 19) s, generate_series(1, %(teams)s) t,
                       generate_series(1, 4) n
                UNION ALL
                SELECT mh_hour(%(t0)s) - h * interval '1 hour', -1, t, 'job-' || n, 600, 540, 480, 60, 0, 0,
                       array_fill(60::bigint, ARRAY[16]), array_fill(60::bigint, ARRAY[16])
                  FROM generate_series(2, 24 * 30) h, generate_series(1, %(teams)s) t, generate_series(1, 4) n
            """, {"t0": T0, "teams": TEAMS})
            c.execute("""
                INSERT INTO load_minutes (minute, team_id, stripe, jobs)
                SELECT mh_minute(%(t0)s) + m * interval '1 minute', t, s, 3
                  FROM generate_series(-60, 3 * 1440) m, generate_series(1, 4) t, generate_series(0, 3) s""",
                      {"t0": T0})
            c.execute("INSERT INTO team_running (shard, team_id, running) "
                      "SELECT s, t, 1 FROM generate_series(0, 255) s, generate_series(1, %s) t", (TEAMS,))
            c.execute("INSERT INTO teams (name) VALUES ('rare')")
            c.execute("INSERT INTO admin_audit (at, actor, token_ref, team_id, action, target, ok) "
                      "SELECT %s, 'rare', 'abcdef012345', %s, 'sign-in', 'rare', true FROM generate_series(1, 3)",
                      (T0, TEAMS + 1))
            c.execute("""
                INSERT INTO admin_audit (at, actor, token_ref, team_id, action, target, ok)
                SELECT %(t0)s, 'admin', 'abcdef012345', 1 + g %% %(teams)s, 'edit team', 'team-' || g %% 50, true
                  FROM generate_series(1, %(n)s) g""", {"t0": T0, "teams": TEAMS, "n": AUDIT})
            c.execute("""
                INSERT INTO admin_sessions (id_hash, team_id, token_hash, csrf, created_at, expires_at)
                SELECT md5(g::text), NULL, 'h', 'c', %(t0)s, %(t0)s + (g - 5000) * interval '1 second'
                  FROM generate_series(1, %(n)s) g""", {"t0": T0, "n": SESSIONS})
            c.execute("UPDATE shards SET owner = 'd-' || shard %% 3, epoch = 7, "
                      "lease_expires_at = %s + interval '30 seconds'", (T0,))
            c.execute("INSERT INTO dispatchers (name, expires_at) SELECT 'd-' || g, %s FROM generate_series(0, 2) g",
                      (T0 + dt.timedelta(seconds=30),))
            c.execute("VACUUM ANALYZE")
        yield dsn


@pytest.fixture
def conn(big) -> Iterator[psycopg.Connection]:
    with psycopg.connect(big, autocommit=True) as c:
        pin(c, T0)
        yield c


def test_the_fixture_holds_a_million_jobs(conn):
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == JOBS
    assert conn.execute("SELECT count(*) FROM admin_audit").fetchone()[0] == AUDIT + 3


@pytest.mark.parametrize("team", [None, "team-7"])
def test_the_overview_reads_an_hour_of_counters_never_the_jobs(conn, team):
    plan = analyzed(conn, "admin_minutes" if team is None else "admin_team_minutes", {"team": team})
    # 50 teams x 4 names x 4 stripes per minute, for 60 minutes (one team: 1/50 of it)
    read = assert_bounded(plan, 60 * 4 * 4 * (TEAMS if team is None else 1))
    assert "jobs" not in read
    planned = analyzed(conn, "admin_planned_minutes", {})
    # the minutes from an hour back to a day ahead, each with its rows of 4 teams x 4 stripes
    assert assert_bounded(planned, (60 + 1440) * 4 * 4)["load_minutes"] <= (60 + 1440) * 4 * 4
    running = analyzed(conn, "metrics_running", {})
    assert "jobs" not in rows_read(running)


def test_the_wheel_depth_is_estimated_not_counted(conn):
    clock = conn.execute(q("metrics_clock")).fetchone()
    plan = analyzed(conn, "metrics_due_depth", {"current_slot": clock[1], "next_slot": clock[2]})
    read = rows_read(plan)
    assert "jobs" not in read and "due_far" not in read
    assert not {r for r in read if r.startswith("due_h")}


def test_the_dispatchers_page_reads_shards_and_the_latest_claims_only(conn):
    plan = analyzed(conn, "admin_workers", {"limit": 200, "per_shard": 4, "per_claim": 100, "now": T0})
    read = assert_bounded(plan, 256 * 4 * 100)
    assert read["jobs"] <= RUNNING                       # the claimed jobs, by primary key
    workers = conn.execute(q("admin_workers"), {"limit": 200, "per_shard": 4, "per_claim": 100, "now": T0}).fetchall()
    assert len(workers) == 50 and sum(w[1] for w in workers) == RUNNING
    for name in ("admin_shards", "admin_dispatchers"):
        assert "jobs" not in rows_read(analyzed(conn, name, {"now": T0}))


@pytest.mark.parametrize("before", [None, AUDIT // 2])
def test_the_audit_page_is_a_keyset_walk_of_one_page(conn, before):
    plan = analyzed(conn, "admin_audit_page", {"before": before, "limit": 51})
    assert assert_bounded(plan, 51)["admin_audit"] <= 51
    # A team with 1/50 of the entries: the primary key walked back, the other
    # teams' entries passed over (at most a page per team), or its own index.
    dense = analyzed(conn, "admin_audit_team_page", {"team": "team-3", "team_id": 3, "before": before, "limit": 51})
    assert assert_bounded(dense, 51 * TEAMS)["admin_audit"] <= 51 * TEAMS
    # A team with a few old entries: its own index, never a walk of everyone's.
    rare = analyzed(conn, "admin_audit_team_page", {"team": "rare", "team_id": TEAMS + 1, "before": before,
                                                    "limit": 51})
    assert assert_bounded(rare, 51)["admin_audit"] <= 51


def test_a_session_is_one_primary_key_lookup_and_the_purge_is_bounded(conn):
    plan = analyzed(conn, "admin_session", {"id_hash": "6512bd43d9caa6e02c990b0a82652dca"})
    assert assert_bounded(plan, 1)["admin_sessions"] <= 1
    purge = analyzed(conn, "admin_sessions_purge", {"limit": 100})
    assert assert_bounded(purge, 200)["admin_sessions"] <= 200    # found by expiry, deleted by key


def test_the_teams_page_reads_one_page_of_teams(conn):
    plan = analyzed(conn, "list_teams", {"after": None, "limit": 51})
    assert "jobs" not in rows_read(plan)
    assert rows_read(plan)["teams"] <= TEAMS + 1
