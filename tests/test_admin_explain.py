"""The admin UI's job, dead-job and series pages read O(page) rows whatever
the number of jobs stored: asserted on the plans of their statements over a
database of 1,000,000 jobs, not on wall time.

One database for the module, filled set-based (one INSERT ... SELECT
generate_series per table): 1,000,000 jobs over 40 teams (one holding half
of them; 2,000 more teams have none, so the average team is small), in
every state (dead 2%), created over 30 days and due up to 3 days after
their creation; a dead letter for each dead job and an event for most; one
team's backlog of 50,000 dead jobs of one name; 10,000 series whose runs
are a tenth of the other jobs; vacuumed and analysed. Then, for each
statement a page sends (tests/test_admin_pages.py sends them through the
pages), the plan is read with EXPLAIN ANALYZE (nested statements of the
procedures through auto_explain): jobs reached only through an index (no
Seq Scan, no Sort over jobs), and every node's rows bounded by the page or
the search window, never by the table. The statements the store prepares
also under their generic plan (plan_cache_mode auto switches a driver's
prepared statement to it after a few executions), where the planner does
not see the values; the dead-jobs reads as the store sends them
(unprepared, bitmap scans off: sql/queries/admin.sql says why).
"""
from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from collections.abc import Iterator

import psycopg
import pytest

from minutehand.store.queries import q
from tests.support import T0, pin
from tests.test_explain import AutoExplain, explain_json, nodes_on, plan_nodes, relations

pytestmark = pytest.mark.bench

JOBS = 1_000_000
TEAMS = 40
QUIET_TEAMS = 2000
BIG = "team-1"                  # half the jobs
SMALL = "team-7"
# an incident: one team's backlog of dead jobs of one name (part of JOBS)
BACKLOG, BACKLOG_TEAM, BACKLOG_NAME = 50_000, "team-2", "flaky"
SERIES = 10_000
# the search window and page the admin pages use (app/minutehand/admin/jobs.py)
SCAN = 2000
PAGE = 50

# The state of job g, by g mod 100: mostly finished, some waiting or running, a few dead.
STATE = """CASE WHEN g %% 100 < 70 THEN 'succeeded' WHEN g %% 100 < 82 THEN 'scheduled'
                WHEN g %% 100 < 85 THEN 'running' WHEN g %% 100 < 88 THEN 'retrying'
                WHEN g %% 100 < 90 THEN 'dead' WHEN g %% 100 < 95 THEN 'cancelled'
                WHEN g %% 100 < 97 THEN 'claimed' ELSE 'discarded' END::job_state"""
# Job g: created 30 days before T0 plus 2.5 s per g (ids time-ordered as mh_new_id's), one job in 10 a
# run of series k, on the series' shard; the big team every other job, the rest spread over 39 teams.
JOB_ROWS = f"""
    SELECT g, k, CASE WHEN k IS NULL THEN g %% 256 ELSE k %% 256 END::smallint AS shard,
           CASE WHEN k IS NULL THEN NULL ELSE (k << 10) | (k %% 256) END AS series_id,
           %(t0)s::timestamptz - interval '30 days' + g * interval '2.5 s' AS created_at,
           CASE WHEN g %% 2 = 0 THEN 1 ELSE 2 + (g * 7919) %% {TEAMS - 1} END AS team_no,
           {STATE} AS state
      FROM (SELECT g, CASE WHEN g %% 10 = 0 THEN 1 + (g / 10) %% {SERIES} END::bigint AS k
              FROM generate_series(1::bigint, %(n)s) g) s"""


def _fill(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO teams (name) SELECT 'team-' || g FROM generate_series(1, {TEAMS}) g")
        # and many teams with no job yet: the average team is small, the big one is not
        c.execute(f"INSERT INTO teams (name) SELECT 'quiet-' || g FROM generate_series(1, {QUIET_TEAMS}) g")
        params = {"t0": T0, "n": JOBS - BACKLOG}
        c.execute(f"""
            INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                              attempts, max_attempts, backoff_base_s, backoff_cap_s, claimed_by, series_id,
                              last_error, result, created_at, claimed_at, started_at, finished_at, updated_at,
                              agreed_at)
            SELECT r.shard, mh_id_at(r.created_at) | ((r.g %% 8192) << 10) | r.shard, t.id,
                   'job-' || (r.g %% 23), jsonb_build_object('n', r.g), (r.g %% 3)::smallint,
                   r.created_at + (r.g %% 4320) * interval '1 minute', 0, false,
                   r.created_at + (r.g %% 4320) * interval '1 minute', r.state,
                   CASE WHEN r.state IN ('dead', 'discarded') THEN 3 ELSE r.g %% 2 END, 3, 1, 3600,
                   CASE WHEN r.state NOT IN ('scheduled', 'cancelled') THEN 'worker-' || (r.g %% 50) END,
                   r.series_id,
                   CASE WHEN r.state IN ('dead', 'discarded', 'retrying') THEN 'boom ' || r.g END,
                   CASE WHEN r.state = 'succeeded' THEN '{{"ok": true}}'::jsonb END,
                   r.created_at, r.created_at + interval '1 s', r.created_at + interval '2 s',
                   r.created_at + interval '3 s', r.created_at, r.created_at + (r.g %% 4320) * interval '1 minute'
              FROM ({JOB_ROWS}) r JOIN teams t ON t.name = 'team-' || r.team_no""", params)
        c.execute(f"""
            INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                              attempts, max_attempts, backoff_base_s, backoff_cap_s, claimed_by, last_error,
                              created_at, claimed_at, started_at, finished_at, updated_at, agreed_at)
            SELECT g %% 256, mh_id_at(%(t0)s - interval '1 day' + g * interval '1 s') | (g %% 256), t.id,
                   '{BACKLOG_NAME}', '{{}}', 0, %(t0)s, 0, false, %(t0)s, 'dead', 3, 3, 1, 3600, 'worker-1',
                   'connection refused', %(t0)s, %(t0)s, %(t0)s, %(t0)s, %(t0)s, %(t0)s
              FROM generate_series(1, {BACKLOG}) g JOIN teams t ON t.name = '{BACKLOG_TEAM}'""", {"t0": T0})
        c.execute("""INSERT INTO dead_jobs (shard, team_id, name, job_id)
                     SELECT shard, team_id, name, id FROM jobs WHERE state = 'dead'""")
        c.execute("""INSERT INTO job_events (shard, id, team_id, xid, kind, job_id, name, attempts, max_attempts,
                                             error, at)
                     SELECT shard, id + 1, team_id, '1', 'dead', id, name, attempts, max_attempts, last_error,
                            finished_at
                       FROM jobs WHERE state IN ('dead', 'discarded') AND id % 5 <> 0""")
        c.execute(f"""
            INSERT INTO series (shard, id, team_id, name, payload, priority, max_attempts, backoff_base_s,
                                backoff_cap_s, flex_s, strict, every_s, first_due_at, last_job_id, last_due_at,
                                created_at, updated_at)
            SELECT k %% 256, (k << 10) | (k %% 256), t.id, 'tick', '{{}}', 0, 3, 1, 3600, 0, false, 60,
                   %(t0)s, 0, %(t0)s, %(t0)s, %(t0)s
              FROM generate_series(1, {SERIES}) k
              JOIN teams t ON t.name = CASE WHEN k %% 2 = 0 THEN '{BIG}' ELSE 'team-' || (2 + k %% {TEAMS - 1}) END""",
                  {"t0": T0})
        # as autovacuum leaves tables that were written in bulk: visibility map set, statistics fresh
        c.execute("VACUUM ANALYZE")


@pytest.fixture(scope="module")
def big_dsn(pg_server, template_db) -> Iterator[str]:
    name = f"mh_admin_explain_{os.getpid()}_{secrets.token_hex(3)}"
    with pg_server.janitor(name, template_dbname=template_db):
        dsn = pg_server.dsn(name)
        _fill(dsn)
        yield dsn


@pytest.fixture
def conn(big_dsn) -> Iterator[psycopg.Connection]:
    with psycopg.connect(big_dsn, autocommit=True) as c:
        pin(c, T0)
        yield c


def analyze(conn: psycopg.Connection, name: str, params: dict, *, generic: bool = False) -> dict:
    """The plan of a named statement, run; generic: as a prepared statement's
    generic plan (what plan_cache_mode auto switches to after a few executions
    of a driver's prepared statement), its parameters typed by their casts."""
    if not generic:
        return explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q(name), params)
    text, types = q(name), {}
    for param, cast in re.findall(r"%\((\w+)\)s::(\w+)", text):
        types.setdefault(param, cast)
    for i, param in enumerate(types, 1):
        text = re.sub(rf"%\({param}\)s", f"${i}", text)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE mh_admin_probe ({', '.join(types.values())}) AS {text}")
    try:
        args = ", ".join(f"%({p})s" for p in types)
        return explain_json(conn, f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mh_admin_probe ({args})", params)
    finally:
        conn.execute("DEALLOCATE mh_admin_probe")
        conn.execute("RESET plan_cache_mode")


def analyze_in_index_order(conn: psycopg.Connection, name: str, params: dict) -> dict:
    """The plan of a dead-jobs read as Store sends it: unprepared, bitmap scans off."""
    with conn.transaction():
        conn.execute(q("admin_index_order"))
        return analyze(conn, name, params)


def assert_bounded(plan: dict, limit: int, *, sorts: bool = False) -> None:
    """No node of the plan reads a table whole or sorts a scan of jobs (it
    may sort the rows of a bounded window; sorts: any rows, themselves
    bounded), and none yields more than `limit` rows (per loop)."""
    for node in plan_nodes(plan):
        # (teams, a small reference table, may be read whole)
        if node.get("Relation Name") != "teams":
            assert node["Node Type"] != "Seq Scan", node
        assert node.get("Actual Rows", 0) <= limit, (node["Node Type"], node.get("Relation Name"),
                                                      node["Actual Rows"])
        if node["Node Type"] == "Sort" and not sorts:
            assert not any(c.get("Relation Name") in ("jobs", "dead_jobs") for c in node.get("Plans", [])), node


def id_at(conn: psycopg.Connection, t: dt.datetime) -> int:
    return conn.execute("SELECT mh_id_at(%s)", (t,)).fetchone()[0]


def one_id(conn: psycopg.Connection, where: str, team: str = BIG) -> int:
    """A job of the team picked through jobs_team_recent (the fixture's own reads are bounded too)."""
    return conn.execute(f"""SELECT id FROM (SELECT id, state, series_id FROM jobs
                                             WHERE team_id = (SELECT id FROM teams WHERE name = %s)
                                             ORDER BY id DESC LIMIT 5000) j WHERE {where} LIMIT 1""",
                        (team,)).fetchone()[0]


def test_the_fixture_holds_a_million_jobs_over_many_teams_and_states(conn):
    n, teams, states, dead, letters, events, runs = conn.execute("""
        SELECT count(*), count(DISTINCT team_id), count(DISTINCT state), count(*) FILTER (WHERE state = 'dead'),
               (SELECT count(*) FROM dead_jobs), (SELECT count(*) FROM job_events),
               count(*) FILTER (WHERE series_id IS NOT NULL)
          FROM jobs""").fetchone()
    assert n == JOBS and teams == TEAMS and states == 8
    assert dead == letters == (JOBS - BACKLOG) // 50 + BACKLOG
    assert events > BACKLOG and runs == (JOBS - BACKLOG) // 10


# ---------------------------------------------------------------- the jobs page: search

def list_jobs_params(**kw) -> dict:
    return {"team": BIG, "state": None, "name": None, "due_before": None, "due_after": None, "before": None,
            "limit": PAGE + 1, "scan": SCAN, **kw}


@pytest.mark.parametrize("filters", [
    {},
    {"state": "dead"},                                   # rare: the window is read whole, and no further
    {"name": "job-4", "state": "scheduled"},
    {"due_after": T0 - dt.timedelta(days=2), "due_before": T0 - dt.timedelta(days=1)},
    {"name": "no-such-name"},                            # nothing matches
], ids=["none", "state", "name+state", "due-range", "no-match"])
@pytest.mark.parametrize("where", ["newest", "cursor"])
def test_job_search_reads_one_window_of_the_teams_index(conn, filters, where):
    before = id_at(conn, T0 - dt.timedelta(days=4)) if where == "cursor" else None
    plan = analyze(conn, "list_jobs", list_jobs_params(before=before, **filters))
    assert_bounded(plan, SCAN)
    [scan] = nodes_on(plan, "jobs")
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "jobs_team_recent")
    assert scan["Actual Rows"] == SCAN and scan["Actual Loops"] == 1
    assert "id <" in scan["Index Cond"]


def test_job_search_of_a_small_team_reads_only_its_own_jobs(conn):
    plan = analyze(conn, "list_jobs", list_jobs_params(team=SMALL, state="succeeded"))
    assert_bounded(plan, SCAN)
    [scan] = nodes_on(plan, "jobs")
    assert scan["Index Name"] == "jobs_team_recent"


def test_job_search_generic_plan_reads_the_same_window(conn):
    """A driver's prepared statement after a few executions: still one bounded read of jobs_team_recent."""
    plan = analyze(conn, "list_jobs", list_jobs_params(state="dead"), generic=True)
    assert_bounded(plan, SCAN)
    [scan] = nodes_on(plan, "jobs")
    assert (scan["Node Type"], scan["Index Name"], scan["Actual Rows"]) == ("Index Scan", "jobs_team_recent", SCAN)


# ---------------------------------------------------------------- the job page

@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("team", [None, BIG, SMALL])
def test_job_record_is_one_primary_key_lookup(conn, team, generic):
    job_id = one_id(conn, "state = 'dead'")
    plan = analyze(conn, "admin_job", {"job_id": job_id, "team": team, "cap": 4096, "now": T0},
                   generic=generic)
    assert relations(plan) <= {"jobs", "teams"}
    [node] = nodes_on(plan, "jobs")
    assert (node["Node Type"], node["Index Name"], node["Actual Rows"]) == ("Index Scan", "jobs_pkey", 1)
    assert plan["Actual Rows"] == (0 if team == SMALL else 1)         # another team's job: no row


def test_a_jobs_deaths_are_read_through_their_own_index(conn):
    job_id = one_id(conn, "state = 'dead' AND id %% 5 <> 0")
    plan = analyze(conn, "admin_job_events", {"job_id": job_id, "limit": 20})
    assert_bounded(plan, 20)
    [node] = nodes_on(plan, "job_events")
    assert node["Index Name"] == "job_events_job" and node["Actual Rows"] == 1


def test_a_jobs_ended_attempts_are_read_through_their_key(conn):
    """With an attempt history for every dead or retried job of the million
    (written in this test's transaction, rolled back after)."""
    job_id = one_id(conn, "state = 'dead' AND id %% 5 <> 0")
    with conn.transaction(force_rollback=True):
        conn.execute("""INSERT INTO job_attempts (shard, job_id, attempt, ended_at, outcome, error)
                        SELECT j.shard, j.id, a, now(), 'retrying', 'boom' FROM jobs j, generate_series(1, 3) a
                         WHERE j.state IN ('dead', 'retrying')""")
        conn.execute("ANALYZE job_attempts")
        plan = analyze(conn, "admin_job_attempts", {"job_id": job_id, "limit": 50})
    assert_bounded(plan, 50)
    assert relations(plan) == {"job_attempts"}
    [node] = nodes_on(plan, "job_attempts")
    assert node["Node Type"] in ("Index Scan", "Index Only Scan") and node["Actual Rows"] == 3


# ---------------------------------------------------------------- the dead-jobs page
# (as Store sends them: unprepared, each planned with its values, bitmap scans off)

def team_id_of(conn: psycopg.Connection, team: str) -> int:
    return conn.execute(q("admin_team_id"), {"team": team}).fetchone()[0]


def index_reads(plan: dict, relation: str) -> list[dict]:
    """The index nodes that read `relation`: index scans on it, and the
    bitmap index scans under a bitmap heap scan of it."""
    found = []
    for node in nodes_on(plan, relation):
        if node["Node Type"] == "Bitmap Heap Scan":
            found += [n for n in plan_nodes(node) if n["Node Type"] == "Bitmap Index Scan"]
        else:
            found.append(node)
    return found


@pytest.mark.parametrize("after", [("", -1), ("job-5", 0), ("job-22", T0 - dt.timedelta(days=15))])
def test_dead_jobs_page_reads_one_page_of_its_index(conn, after):
    if isinstance(after[1], dt.datetime):
        after = (after[0], id_at(conn, after[1]))
    plan = analyze_in_index_order(conn, "admin_dead_jobs", {"team_id": team_id_of(conn, BIG),
                                                            "after_name": after[0], "after_id": after[1],
                                                            "limit": PAGE + 1})
    assert_bounded(plan, PAGE + 1)
    [letters] = nodes_on(plan, "dead_jobs")
    assert letters["Index Name"] == "dead_jobs_by_team" and letters["Actual Rows"] == PAGE + 1
    [record] = nodes_on(plan, "jobs")
    assert record["Index Name"] == "jobs_pkey" and record["Actual Loops"] == PAGE + 1


def test_dead_jobs_of_one_name_read_one_page_of_its_range(conn):
    """A backlog of 50,000 dead jobs of one name: one page of the index, in its order."""
    params = {"team_id": team_id_of(conn, BACKLOG_TEAM), "name": BACKLOG_NAME,
              "after_id": id_at(conn, T0 - dt.timedelta(hours=12)), "limit": PAGE + 1}
    plan = analyze_in_index_order(conn, "admin_dead_jobs_of_name", params)
    assert_bounded(plan, PAGE + 1)
    [letters] = nodes_on(plan, "dead_jobs")
    assert letters["Index Name"] == "dead_jobs_by_team" and letters["Actual Rows"] == PAGE + 1
    assert "name" in letters["Index Cond"] and "job_id" in letters["Index Cond"]


def test_dead_jobs_of_an_ordinary_name_read_only_that_names_range(conn):
    """A name with a few hundred dead jobs: the planner may read its range whole
    (and sort it), never more than the range."""
    team_id = team_id_of(conn, BIG)
    params = {"team_id": team_id, "name": "job-4", "after_id": -1, "limit": PAGE + 1}
    in_range = conn.execute("SELECT count(*) FROM dead_jobs WHERE team_id = %s AND name = 'job-4'",
                            (team_id,)).fetchone()[0]
    assert PAGE < in_range < 1000
    plan = analyze_in_index_order(conn, "admin_dead_jobs_of_name", params)
    assert_bounded(plan, in_range, sorts=True)
    reads = index_reads(plan, "dead_jobs")
    assert reads and all(n["Index Name"] == "dead_jobs_by_team" and "name" in n["Index Cond"] for n in reads)
    assert plan["Actual Rows"] == PAGE + 1


@pytest.mark.parametrize("team", [BIG, BACKLOG_TEAM])
def test_dead_names_skip_through_the_index_one_probe_per_name(conn, team):
    params = {"team_id": team_id_of(conn, team), "names": 50, "cap": 1000}
    explain = AutoExplain(conn)      # (a procedure: the plans of its statements)
    with conn.transaction(), explain:
        conn.execute(q("admin_index_order"))
        rows = conn.execute(q("admin_dead_names"), params).fetchall()
    assert explain.plans
    reads = []
    for p in explain.plans:
        assert_bounded(p["Plan"], 1000)
        reads += index_reads(p["Plan"], "dead_jobs")
    assert reads and {n["Index Name"] for n in reads} == {"dead_jobs_by_team"}
    # the skip scan probes once per name (and once past the last); each count stops at the cap
    assert 0 < len(rows) <= 24 and all(0 < r[1] <= 1000 for r in rows)
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in reads)
    assert read <= 25 + 24 * 1000, read
    if team == BACKLOG_TEAM:
        assert dict(rows)[BACKLOG_NAME] == 1000          # 50,000 dead: counted to the cap, no further


@pytest.mark.parametrize("generic", [False, True])
def test_the_bulk_requeues_shard_walk_keeps_to_the_primary_key(conn, generic):
    """requeue_dead / discard_dead read a shard's letters of a team and name
    (sql/functions/dead.sql): beside dead_jobs_by_team, still through the
    primary key, which names the shard (the other index would read every
    shard's letters of the name to find one shard's)."""
    params = {"team_id": team_id_of(conn, BACKLOG_TEAM), "name": BACKLOG_NAME, "shard": 7, "limit": 100}
    text = ("SELECT d.job_id FROM dead_jobs d WHERE d.shard = %(shard)s::int AND d.team_id = %(team_id)s::int "
            "AND d.name = %(name)s::text ORDER BY d.job_id LIMIT %(limit)s::int")
    if generic:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE mh_shard_walk (int, int, text, int) AS " + re.sub(
            r"%\((\w+)\)s", lambda m: "$" + str(["shard", "team_id", "name", "limit"].index(m.group(1)) + 1), text))
        try:
            plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mh_shard_walk "
                                      "(%(shard)s, %(team_id)s, %(name)s, %(limit)s)", params)
        finally:
            conn.execute("DEALLOCATE mh_shard_walk")
            conn.execute("RESET plan_cache_mode")
    else:
        plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + text, params)
    reads = index_reads(plan, "dead_jobs")
    assert reads and all(n["Index Name"] == "dead_jobs_pkey" and "shard" in n["Index Cond"] for n in reads), reads
    assert plan["Actual Rows"] == 100


# ---------------------------------------------------------------- the series pages (procedures: auto_explain)

def series_id_of(conn: psycopg.Connection, team: str = BIG) -> int:
    return conn.execute("""SELECT id FROM series WHERE team_id = (SELECT id FROM teams WHERE name = %s)
                            ORDER BY team_id, id DESC LIMIT 1""", (team,)).fetchone()[0]


def test_series_list_and_detail_read_by_their_keys(conn):
    series_id = series_id_of(conn)
    explain = AutoExplain(conn)
    with explain:
        conn.execute(q("list_series"), {"team": BIG, "after": None, "limit": PAGE + 1}).fetchall()
        conn.execute(q("series_detail"), {"team": BIG, "series_id": series_id}).fetchall()
    assert explain.plans
    for p in explain.plans:
        assert_bounded(p["Plan"], PAGE + 1)
    assert {n["Index Name"] for n in explain.nodes_on("series")} <= {"series_team", "series_pkey"}
    assert {n["Index Name"] for n in explain.nodes_on("jobs")} <= {"jobs_pkey"}


@pytest.mark.parametrize("generic", [False, True])
def test_series_runs_read_the_newest_runs_backwards(conn, generic):
    series_id = series_id_of(conn)
    plan = analyze(conn, "series_runs", {"team": BIG, "series_id": series_id, "limit": 5},   # of its 9 or 10
                   generic=generic)
    assert_bounded(plan, 5)
    [runs] = nodes_on(plan, "jobs")
    assert runs["Index Name"] == "jobs_series_run" and runs["Actual Rows"] == 5


def test_series_team_is_one_primary_key_lookup(conn):
    plan = analyze(conn, "admin_series_team", {"series_id": series_id_of(conn)})
    [node] = nodes_on(plan, "series")
    assert (node["Index Name"], node["Actual Rows"]) == ("series_pkey", 1)


# ---------------------------------------------------------------- the actions (rolled back)

@pytest.mark.parametrize("action", ["cancel", "requeue_job", "discard_job", "pause_series", "resume_series",
                                    "cancel_series"])
def test_actions_reach_their_rows_by_primary_key(conn, action):
    if action.endswith("_series"):
        params = {"team": BIG, "series_id": series_id_of(conn)}
    else:
        state = "scheduled" if action == "cancel" else "dead"
        params = {"team": BIG, "job_id": one_id(conn, f"state = '{state}' AND series_id IS NULL"),
                  "max_attempts": None}
    explain = AutoExplain(conn)
    with conn.transaction(force_rollback=True), explain:
        conn.execute(q(action), params).fetchall()
    assert explain.plans
    for p in explain.plans:
        for node in plan_nodes(p["Plan"]):
            assert node["Node Type"] != "Seq Scan" or node["Relation Name"] not in ("jobs", "dead_jobs", "series"), \
                (p["Query Text"], node)
            assert node.get("Actual Rows", 0) <= 256, (p["Query Text"], node)
    # jobs by their primary key, or by (team_id, id) on the team's index: one row either way
    for p in explain.plans:
        for node in nodes_on(p["Plan"], "jobs"):
            if node["Node Type"] == "ModifyTable":
                continue
            assert node["Index Name"] in ("jobs_pkey", "jobs_team_recent"), (p["Query Text"], node)
            assert "(id = " in node["Index Cond"] and node["Actual Rows"] <= 1, (p["Query Text"], node)
