"""The hot statements touch O(1) partitions, whatever the size of the pending set.

One database per module, filled once: the whole ring (480 minute partitions, 96
hour partitions, due_far) with jobs in many minute buckets and hour slots, and
1,000,000 far-future jobs written set-based straight into jobs and due_far.
Then the plans are read, not guessed:

* the claim (claim_due, with auto_explain logging every nested statement, and
  the claim statement of mh_claim_sql itself under EXPLAIN EXECUTE) names only
  the two minute partitions of the hand's bucket and the current one; the
  dispatcher's planned claim (claim_planned) only its bucket's, and its
  summary of a shard (due_edge) only the hand's, current and next;
* the status read (named query job_status) is one Index Scan on jobs_pkey;
* a submit touches exactly one partition of the wheel, and so does a cancel
  taking the job's row off it (one index probe; a due row carried forward
  since: the claim window's partitions at most).

Every probe runs in a transaction that is rolled back, so the tests share the
fixture without disturbing each other. Plans are also cross-checked against
pg_locks: what a statement locks is what it can touch.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import threading
from collections.abc import Iterator

import psycopg
import pytest

from minutehand.store.queries import q
from minutehand.store.submit import JobSpec
from tests.support import AUTO_EXPLAIN_ON_CITUS, T0, make_store, pin

FAR_JOBS = 1_000_000
TEAM = "explainers"
MIN = dt.timedelta(minutes=1)
CUR = T0.replace(second=0)            # the current minute bucket at T0
PREV = CUR - MIN                      # the bucket the hand sits on in steady state

AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_level = 'notice'",
    "SET auto_explain.log_format = 'json'",
)


# ---------------------------------------------------------------- plan helpers

def plan_nodes(plan: dict) -> Iterator[dict]:
    """Every node of a JSON plan (the "Plan" object), depth first."""
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.get("Plans", [])))


def relations(plan: dict) -> set[str]:
    """Names of every relation a plan reads or writes."""
    return {n["Relation Name"] for n in plan_nodes(plan) if "Relation Name" in n}


def due_relations(plan: dict) -> set[str]:
    return {r for r in relations(plan) if r.startswith("due_")}


def nodes_on(plan: dict, relation: str) -> list[dict]:
    return [n for n in plan_nodes(plan) if n.get("Relation Name") == relation]


def explain_json(conn: psycopg.Connection, sql: str, params=None) -> dict:
    """The top "Plan" of `sql`, an EXPLAIN (FORMAT JSON ...) statement."""
    # client-side binding: EXPLAIN EXECUTE takes no protocol-level parameters
    raw = psycopg.ClientCursor(conn).execute(sql, params).fetchone()[0]
    doc = json.loads(raw) if isinstance(raw, str) else raw
    return doc[0]["Plan"]


def assert_no_scan_beyond(plan: dict, *small: str) -> None:
    """Outside the `small` relations (the partitions a statement is meant to read), the plan
    only writes rows or reaches them through an index (jobs through its primary key)."""
    for node in plan_nodes(plan):
        rel = node.get("Relation Name")
        if rel is None or rel in small or node["Node Type"] == "ModifyTable":
            continue
        # (a Tid Scan deletes rows the same statement found through an index)
        assert node["Node Type"] in ("Index Scan", "Index Only Scan", "Tid Scan"), (rel, node["Node Type"])
        if rel == "jobs":
            assert node["Index Name"] == "jobs_pkey", node["Index Name"]


class AutoExplain:
    """auto_explain on one connection, plans collected from the NOTICEs it sends."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.plans: list[dict] = []      # {"Query Text": ..., "Plan": ...}
        self.recording = False
        conn.add_notice_handler(self._notice)
        for stmt in AUTO_EXPLAIN:
            conn.execute(stmt)

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        msg = diag.message_primary or ""
        if self.recording and "plan:" in msg:
            self.plans.append(json.loads(msg.split("plan:", 1)[1]))

    def __enter__(self) -> AutoExplain:
        self.plans.clear()
        self.recording = True
        return self

    def __exit__(self, *exc) -> None:
        self.recording = False

    def due_relations(self) -> set[str]:
        return set().union(*(due_relations(p["Plan"]) for p in self.plans))

    def all_relations(self) -> set[str]:
        return set().union(*(relations(p["Plan"]) for p in self.plans))

    def nodes_on(self, relation: str) -> list[dict]:
        return [n for p in self.plans for n in nodes_on(p["Plan"], relation)]


def locked_due_relations(conn: psycopg.Connection) -> set[str]:
    """due_* tables and partitions this session holds a lock on (in its open transaction)."""
    rows = conn.execute(
        """SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
            WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
              AND c.relkind IN ('r', 'p') AND c.relname LIKE 'due\\_%'""").fetchall()
    return {r[0] for r in rows}


def minute_part(conn: psycopg.Connection, t: dt.datetime) -> str:
    return conn.execute("SELECT mh_minute_part(mh_minute_slot(%s::timestamptz))", (t,)).fetchone()[0]


def hour_part(conn: psycopg.Connection, t: dt.datetime) -> str:
    return conn.execute("SELECT mh_hour_part(mh_hour_slot(%s::timestamptz))", (t,)).fetchone()[0]


# ---------------------------------------------------------------- the big database

def _insert_far_jobs(dsn: str) -> None:
    """1,000,000 far-future jobs, set-based: jobs and due_far filled at once from two sessions."""
    far_rows = """
        SELECT (g %% 256)::smallint AS shard, ((g::bigint) << 10) | (g %% 256) AS id,
               %(t0)s::timestamptz + interval '4 days' + (g %% 100000) * interval '1 minute' AS run_at
          FROM generate_series(1, %(n)s) g"""
    statements = [
        f"""INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at,
                              state, max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at,
                              agreed_at)
            SELECT f.shard, f.id, t.id, 'far', '{{}}', 0, f.run_at, 0, false, f.run_at,
                   'scheduled', 3, 1, 3600, %(t0)s, %(t0)s, f.run_at
              FROM ({far_rows}) f CROSS JOIN (SELECT id FROM teams WHERE name = %(team)s) t""",
        f"""INSERT INTO due_far (shard, strict, priority, run_at, job_id, team_id)
            SELECT f.shard, false, 0, f.run_at, f.id, t.id
              FROM ({far_rows}) f CROSS JOIN (SELECT id FROM teams WHERE name = %(team)s) t""",
    ]
    errors: list[BaseException] = []

    def run(sql: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql, {"t0": T0, "n": FAR_JOBS, "team": TEAM})
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in statements]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.fixture(scope="module", autouse=True)
def _not_on_citus(pg_server):
    """These plans come from auto_explain of nested statements (tests/test_citus.py asserts the router plans on Citus)."""
    if pg_server.citus:
        pytest.skip(AUTO_EXPLAIN_ON_CITUS)


@pytest.fixture(scope="module")
def big_dsn(pg_server, template_db) -> Iterator[str]:
    name = f"mh_explain_{os.getpid()}_{secrets.token_hex(3)}"
    with pg_server.janitor(name, template_dbname=template_db):
        dsn = pg_server.dsn(name)
        store = make_store(dsn, clock=PREV + dt.timedelta(seconds=5))
        try:
            store.create_team(TEAM)
            with store.connection() as c:   # a realistic number of teams, each with the job names it counts apart
                c.execute("INSERT INTO teams (name) SELECT 'team-' || g FROM generate_series(1, 300) g")
                c.execute("""INSERT INTO team_stats_names (team_id, name, slot)
                             SELECT t.id, 'job-' || n, n FROM teams t, generate_series(1, 50) n
                              WHERE t.name LIKE 'team-%'""")
            # The previous minute: jobs submitted then, due then (the hand's bucket).
            store.submit_many(TEAM, [JobSpec(name="prev", due_at=PREV + dt.timedelta(seconds=5))] * 2560)
            store.clock = T0
            near = (
                # due now and overdue: the current bucket
                [JobSpec(name="now", due_at=T0 - dt.timedelta(seconds=s % 30)) for s in range(2560)]
                # every minute of the next six hours and more: many minute buckets
                + [JobSpec(name="soon", due_at=T0 + m * MIN) for m in range(1, 420) for _ in range(12)]
                # hour slots
                + [JobSpec(name="later", due_at=T0 + dt.timedelta(hours=h, minutes=m))
                   for h in range(8, 71) for m in range(0, 60, 3)]
            )
            for i in range(0, len(near), 10_000):
                store.submit_many(TEAM, near[i:i + 10_000])
        finally:
            store.close()
        _insert_far_jobs(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Steady state: every shard's hand one minute behind now.
            conn.execute("UPDATE shards SET hand = %s", (PREV,))
            conn.execute("ANALYZE")
        yield dsn


@pytest.fixture
def conn(big_dsn) -> Iterator[psycopg.Connection]:
    with psycopg.connect(big_dsn, autocommit=True) as c:
        pin(c, T0)
        yield c


@pytest.fixture(scope="module")
def layout(big_dsn) -> dict:
    """Facts about the filled database the tests check against."""
    with psycopg.connect(big_dsn, autocommit=True) as c:
        prev, cur = minute_part(c, PREV), minute_part(c, CUR)
        # The shard with the most claimable rows in both buckets.
        shard, n_prev, n_cur = c.execute(f"""
            SELECT p.shard, p.n, k.n
              FROM (SELECT shard, count(*) n FROM {prev} WHERE run_at <= %(t)s GROUP BY shard) p
              JOIN (SELECT shard, count(*) n FROM {cur} WHERE run_at <= %(t)s GROUP BY shard) k USING (shard)
             ORDER BY p.n + k.n DESC, p.shard LIMIT 1""", {"t": T0}).fetchone()
        counts = c.execute("""SELECT (SELECT count(*) FROM due_far), (SELECT count(*) FROM due_hours),
                                     (SELECT count(*) FROM due_minutes),
                                     (SELECT count(DISTINCT tableoid) FROM due_minutes),
                                     (SELECT count(DISTINCT tableoid) FROM due_hours),
                                     (SELECT count(*) FROM due_minutes WHERE shard = %s)""",
                           (shard,)).fetchone()
        far_id = c.execute("SELECT job_id FROM due_far ORDER BY run_at DESC LIMIT 1").fetchone()[0]
        near_id = c.execute(f"SELECT job_id FROM {cur} LIMIT 1").fetchone()[0]
    return {"prev": prev, "cur": cur, "shard": shard, "n_prev": n_prev, "n_cur": n_cur,
            "far": counts[0], "hours": counts[1], "minutes": counts[2], "minute_parts": counts[3],
            "hour_parts": counts[4], "shard_minute_rows": counts[5], "far_id": far_id, "near_id": near_id}


def test_fixture_has_the_whole_wheel_populated(layout):
    """The premise: a big pending set spread over many partitions at every level."""
    assert layout["far"] >= FAR_JOBS
    assert layout["minute_parts"] >= 400          # rows in most of the 480 minute partitions
    assert layout["hour_parts"] >= 60             # and in most hour slots
    assert layout["hours"] >= 1000
    assert layout["prev"] != layout["cur"]
    assert layout["n_prev"] > 0 and layout["n_cur"] > 0
    # the chosen shard also has rows in buckets the claim must not touch
    assert layout["shard_minute_rows"] > layout["n_prev"] + layout["n_cur"]


# ---------------------------------------------------------------- (a) the claim

def _lease(conn: psycopg.Connection, shard: int, owner: str) -> int:
    epoch = conn.execute("SELECT take_shard_lease(%s, %s, 3600)", (shard, owner)).fetchone()[0]
    assert epoch is not None
    return epoch


def test_claim_due_plans_touch_only_the_hand_and_current_minute_partitions(conn, layout):
    shard = layout["shard"]
    with conn.transaction(force_rollback=True):
        epoch = _lease(conn, shard, "explain-a")
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute("SELECT job_id FROM claim_due(%s, 10000, 'explain-a', %s, 30)",
                                (shard, epoch)).fetchall()
        assert len(rows) == layout["n_prev"] + layout["n_cur"]
        assert ae.plans, "auto_explain sent no plans"
        # the claim statement ran once per bucket, each naming its partition
        claim_plans = [p for p in ae.plans
                       if "WITH picked AS" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert [due_relations(p["Plan"]) for p in claim_plans] == [{layout["prev"]}, {layout["cur"]}]
        # and nothing anywhere in the call touched any other part of the wheel
        assert ae.due_relations() == {layout["prev"], layout["cur"]}
        # the job records are reached by primary key, never scanned
        assert ae.nodes_on("jobs")
        for p in claim_plans:
            assert_no_scan_beyond(p["Plan"], *due_relations(p["Plan"]))
        # what the call locked agrees with what its plans say
        assert locked_due_relations(conn) == {layout["prev"], layout["cur"]}


@pytest.mark.parametrize("by", ["names", "teams", "names and teams"])
def test_claim_by_job_names_or_teams_touches_the_same_two_partitions(conn, layout, by):
    """A worker that handles only some job names, or some teams' jobs: each
    candidate due row is joined to its job by primary key; still only the
    hand's and the current bucket's partitions, and jobs never scanned."""
    shard = layout["shard"]
    with conn.transaction(force_rollback=True):
        names = [r[0] for r in conn.execute(
            "SELECT DISTINCT name FROM jobs WHERE shard = %s AND state = 'scheduled' LIMIT 5", (shard,))]
        teams = [r[0] for r in conn.execute("SELECT name FROM teams")]
        epoch = _lease(conn, shard, "explain-n")
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute("SELECT job_id FROM claim_due(%s, 10000, 'explain-n', %s, 30, 'w', %s, %s)",
                                (shard, epoch, names if "names" in by else None,
                                 teams if "teams" in by else None)).fetchall()
        assert len(rows) == layout["n_prev"] + layout["n_cur"]
        claim_plans = [p for p in ae.plans
                       if "WITH picked AS" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert [due_relations(p["Plan"]) for p in claim_plans] == [{layout["prev"]}, {layout["cur"]}]
        assert ae.due_relations() == {layout["prev"], layout["cur"]}
        for p in claim_plans:
            assert_no_scan_beyond(p["Plan"], *due_relations(p["Plan"]))
            assert {n["Index Name"] for n in nodes_on(p["Plan"], "jobs")} == {"jobs_pkey"}
        assert locked_due_relations(conn) == {layout["prev"], layout["cur"]}


def test_claim_statement_itself_names_one_partition(conn, layout):
    shard = layout["shard"]
    sql = conn.execute("SELECT mh_claim_sql(mh_minute_slot(%s::timestamptz))", (T0,)).fetchone()[0]
    conn.execute(f"PREPARE mh_claim_probe (int, timestamptz, int) AS {sql}")
    try:
        for mode in ("auto", "force_generic_plan", "force_custom_plan"):
            with conn.transaction(force_rollback=True):
                conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mh_claim_probe (%s, %s, 10000)",
                                    (shard, T0))
                # it takes rows off one minute partition and nothing else: the
                # job records are updated by a separate static statement
                assert due_relations(plan) == {layout["cur"]}, mode
                assert relations(plan) == {layout["cur"]}, mode
                assert_no_scan_beyond(plan, layout["cur"])
                assert locked_due_relations(conn) == {layout["cur"]}, mode
            with conn.transaction(force_rollback=True):
                with psycopg.ClientCursor(conn) as cur:
                    ids = cur.execute("EXECUTE mh_claim_probe (%s, %s, 10000)", (shard, T0)).fetchone()[0]
                assert len(ids) == layout["n_cur"], mode
    finally:
        conn.execute("DEALLOCATE mh_claim_probe")


def test_claim_of_an_empty_shard_still_touches_only_two_partitions(conn, layout):
    """Nothing due: the claim looks at its two buckets and stops; no search for the next job."""
    with conn.transaction(force_rollback=True):
        empty = conn.execute(f"""
            SELECT s FROM generate_series(0, mh_shard_count() - 1) s
             WHERE NOT EXISTS (SELECT 1 FROM {layout['prev']} WHERE shard = s)
               AND NOT EXISTS (SELECT 1 FROM {layout['cur']} WHERE shard = s)
             LIMIT 1""").fetchone()
        if empty is None:
            conn.execute(f"DELETE FROM {layout['prev']} WHERE shard = %s", (layout["shard"],))
            conn.execute(f"DELETE FROM {layout['cur']} WHERE shard = %s", (layout["shard"],))
            shard = layout["shard"]
        else:
            shard = empty[0]
        epoch = _lease(conn, shard, "explain-e")
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute("SELECT job_id FROM claim_due(%s, 100, 'explain-e', %s, 30)",
                                (shard, epoch)).fetchall()
        assert rows == []
        assert ae.due_relations() == {layout["prev"], layout["cur"]}


def test_due_edge_reads_only_the_hand_current_and_next_buckets(conn, layout):
    """The dispatcher's summary of a shard: its due rows counted in the
    hand's and the current bucket, the next run time from the current and
    the next one; nothing else of the wheel."""
    nxt = minute_part(conn, CUR + MIN)
    with conn.transaction(force_rollback=True):
        shard = layout["shard"]
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute("SELECT * FROM due_edge(%s)", (shard,)).fetchall()
        assert sum(r[4] for r in rows[:-1]) == layout["n_prev"] + layout["n_cur"]
        assert ae.due_relations() <= {layout["prev"], layout["cur"], nxt}
        counts = [p for p in ae.plans if "count(*)" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert counts
        for p in counts:     # counted from the claim index, one shard's range of it
            assert_no_scan_beyond(p["Plan"], *due_relations(p["Plan"]))
            assert "Seq Scan" not in {n["Node Type"] for n in plan_nodes(p["Plan"])}
        assert locked_due_relations(conn) - {layout["prev"], layout["cur"], nxt} == set()


def test_a_capped_read_of_a_backlog_reads_per_cell_not_per_row(conn, layout):
    """Behind a backlog (20,000 rows due on four shards, in 48 cells of
    class and team) a read capped at 10 rows a cell reads about that many
    entries of the claim index a cell, plus one descent to find each cell;
    the whole count reads every row."""
    shards = [1, 2, 3, 4]

    def index_entries(cap: int | None) -> tuple[int, int]:
        """(rows the read returned in all, index entries its scans of the current bucket returned)."""
        with AutoExplain(conn) as ae:
            due = conn.execute("SELECT sum(due) FROM due_edges(%s, %s, %s)",
                               (shards, [None] * len(shards), cap)).fetchone()[0]
        read = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in ae.nodes_on(layout["cur"])
                   if "Index" in n["Node Type"])
        return due, read

    with conn.transaction(force_rollback=True):
        conn.execute("UPDATE shards SET hand = %s WHERE shard = ANY (%s)", (PREV, shards))
        conn.execute("DELETE FROM due_minutes WHERE shard = ANY (%s)", (shards,))
        conn.execute("""INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
                        SELECT mh_minute_slot(%(cur)s), 1 + i %% 4, (i / 4) %% 2 = 0, (i / 8) %% 2 * 5,
                               %(cur)s + (i %% 30) * interval '1 second', -i, 1 + (i / 16) %% 3
                          FROM generate_series(1, 20000) i""", {"cur": CUR})
        cells = conn.execute("SELECT count(*) FROM (SELECT DISTINCT shard, strict, priority, team_id "
                             "FROM due_minutes WHERE shard = ANY (%s)) c", (shards,)).fetchone()[0]
        whole, whole_read = index_entries(None)
        capped, capped_read = index_entries(10)
    assert cells == 4 * 2 * 2 * 3                  # shards x strict or not x priorities x teams
    assert whole == 20_000 and whole_read >= 20_000
    assert capped == 10 * cells
    assert capped_read <= cells * (10 + 4), (cells, capped_read)


def test_the_edges_of_all_shards_read_together_touch_four_buckets(conn, layout):
    """due_edges, the dispatcher's summary of every shard in one statement:
    with the hands a minute behind (or two, just after the minute turned),
    it reads the buckets from two minutes back to the next one, nothing else
    of the wheel, each from the claim index, whatever the shard count."""
    shards = list(range(256))
    near = {minute_part(conn, CUR + k * MIN) for k in (-2, -1, 0, 1)}
    with conn.transaction(force_rollback=True):
        conn.execute("UPDATE shards SET hand = %s", (PREV,))
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute("SELECT * FROM due_edges(%s, %s)", (shards, [None] * len(shards))).fetchall()
        due = conn.execute(f"""SELECT (SELECT count(*) FROM {layout['prev']} WHERE run_at <= %(t)s)
                                    + (SELECT count(*) FROM {layout['cur']} WHERE run_at <= %(t)s)""",
                           {"t": T0}).fetchone()[0]
        assert sum(r[5] for r in rows if r[4] is not None) == due > 0
        assert len([r for r in rows if r[4] is None]) == len(shards)
        assert layout["cur"] in ae.due_relations() <= near
        counts = [p for p in ae.plans if "count(*)" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert counts
        for p in counts:      # each shard's range of the claim index (a bucket none reads may plan otherwise)
            ran = [n for n in plan_nodes(p["Plan"]) if n.get("Actual Loops", 0) > 0]
            assert "Seq Scan" not in {n["Node Type"] for n in ran if n.get("Relation Name") != "shards"}
        assert locked_due_relations(conn) - near == set()


def test_planned_claim_probes_its_cells_in_one_partition(conn, layout):
    """claim_planned: one bucket's partition, an index probe per cell, the
    job records by primary key."""
    shard = layout["shard"]
    with conn.transaction(force_rollback=True):
        cells = conn.execute(f"""SELECT strict, priority, team_id, count(*)::int FROM {layout['cur']}
                                  WHERE shard = %s GROUP BY 1, 2, 3""", (shard,)).fetchall()
        epoch = _lease(conn, shard, "explain-p")
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute(
                "SELECT job_id FROM claim_planned(%s, 'explain-p', %s, 30, 'w', %s, %s, %s::smallint[], %s, %s)",
                (shard, epoch, CUR, [c[0] for c in cells], [c[1] for c in cells], [c[2] for c in cells],
                 [c[3] for c in cells])).fetchall()
        assert len(rows) == layout["n_cur"]
        claim_plans = [p for p in ae.plans
                       if "WITH picked AS" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert [due_relations(p["Plan"]) for p in claim_plans] == [{layout["cur"]}]
        assert "Seq Scan" not in {n["Node Type"] for n in nodes_on(claim_plans[0]["Plan"], layout["cur"])}
        assert_no_scan_beyond(claim_plans[0]["Plan"], layout["cur"])
        assert ae.due_relations() == {layout["cur"]}
        reads = [n for n in ae.nodes_on("jobs") if n["Node Type"] != "ModifyTable"]
        assert reads and {n.get("Index Name") for n in reads} == {"jobs_pkey"}
        assert locked_due_relations(conn) == {layout["cur"]}


def test_planned_claim_over_many_shards_probes_its_cells_in_one_partition(conn, layout):
    """claim_planned_shards (plain PostgreSQL's round): every shard's cells
    of one bucket in one statement on that bucket's partition alone, an
    index probe per cell; the jobs, reminders and running counts by key."""
    with conn.transaction(force_rollback=True):
        cells = conn.execute(f"""SELECT shard, strict, priority, team_id, count(*)::int FROM {layout['cur']}
                                  WHERE shard < 64 GROUP BY 1, 2, 3, 4 ORDER BY 1""").fetchall()
        shards = sorted({c[0] for c in cells})
        epochs = [_lease(conn, s, "explain-s") for s in shards]
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute(
                "SELECT shard, job_id FROM claim_planned_shards('explain-s', 30, 'w', %s, %s, %s, %s, %s,"
                " %s::smallint[], %s, %s)",
                (CUR, shards, epochs, [c[0] for c in cells], [c[1] for c in cells], [c[2] for c in cells],
                 [c[3] for c in cells], [c[4] for c in cells])).fetchall()
        assert len(rows) == sum(c[4] for c in cells) and {r[0] for r in rows} == set(shards)
        claim_plans = [p for p in ae.plans
                       if "WITH picked AS" in p["Query Text"] and "format(" not in p["Query Text"]]
        assert [due_relations(p["Plan"]) for p in claim_plans] == [{layout["cur"]}]
        assert "Seq Scan" not in {n["Node Type"] for n in nodes_on(claim_plans[0]["Plan"], layout["cur"])}
        assert_no_scan_beyond(claim_plans[0]["Plan"], layout["cur"])
        assert ae.due_relations() == {layout["cur"]}
        for table, index in (("jobs", "jobs_pkey"), ("team_running", "team_running_pkey")):
            reads = [n for n in ae.nodes_on(table) if n["Node Type"] != "ModifyTable"]
            assert {n.get("Index Name") for n in reads} <= {index}, table
        assert locked_due_relations(conn) == {layout["cur"]}
        assert conn.execute("SELECT count(*) FROM claim_checks WHERE check_at > %s", (T0,)).fetchone()[0] == len(shards)


# ---------------------------------------------------------------- (b) the status read

@pytest.mark.parametrize("which", ["far_id", "near_id"])
@pytest.mark.parametrize("team", [None, TEAM])
def test_job_status_is_one_primary_key_lookup(conn, layout, which, team):
    job_id = layout[which]
    plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("job_status"),
                        {"job_id": job_id, "team": team, "now": T0})
    assert relations(plan) <= {"jobs", "teams", "series"}
    assert_series_by_primary_key(plan, rows=0, index=False)   # runs once: no series row
    jobs_nodes = nodes_on(plan, "jobs")
    assert len(jobs_nodes) == 1
    node = jobs_nodes[0]
    assert node["Node Type"] == "Index Scan"
    assert node["Index Name"] == "jobs_pkey"
    cond = node["Index Cond"]
    assert "shard" in cond and "id" in cond
    assert node["Actual Rows"] == 1 and node["Actual Loops"] == 1
    assert plan["Actual Rows"] == 1
    # the row found is the one asked for
    row = conn.execute(q("job_status"), {"job_id": job_id, "team": team, "now": T0}).fetchone()
    assert row[0] == job_id


def assert_series_by_primary_key(plan: dict, rows: int, *, index: bool = True) -> None:
    """The status read reaches a run's series (if any) at most once, through
    series_pkey (index=False: a nearly empty series table may be read whole)."""
    for node in nodes_on(plan, "series"):
        if index:
            assert (node["Node Type"], node.get("Index Name")) == ("Index Scan", "series_pkey"), node
        assert node["Actual Loops"] <= 1 and node["Actual Rows"] == rows, node


def _fill_series(conn: psycopg.Connection) -> None:
    """20,000 series (inside the caller's rolled-back transaction), analyzed."""
    conn.execute("""INSERT INTO series (shard, id, team_id, name, payload, priority, max_attempts,
                                        backoff_base_s, backoff_cap_s, flex_s, strict, every_s,
                                        first_due_at, last_job_id, last_due_at, created_at, updated_at)
                    SELECT g % 256, g, 1, 'filler', '{}', 0, 3, 1, 3600, 0, false, 60, now(), g, now(), now(), now()
                      FROM generate_series(1, 20000) g""")
    conn.execute("ANALYZE series")


def test_job_status_reaches_a_series_by_its_primary_key(conn, layout):
    """With many series stored, the status of a series run adds one series_pkey
    lookup, and that of a job that runs once finds no series row the same way."""
    with conn.transaction(force_rollback=True):
        _fill_series(conn)
        job_id = conn.execute("SELECT job_id FROM submit_series(%s, 'tick', p_every_s => 60)",
                              (TEAM,)).fetchone()[0]
        for which, rows in ((job_id, 1), (layout["far_id"], 0)):
            plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("job_status"),
                                {"job_id": which, "team": None, "now": T0})
            assert relations(plan) <= {"jobs", "teams", "series"}
            assert_series_by_primary_key(plan, rows=rows)
            [node] = nodes_on(plan, "jobs")
            assert (node["Index Name"], node["Actual Rows"], node["Actual Loops"]) == ("jobs_pkey", 1, 1)
            assert plan["Actual Rows"] == 1


def test_job_status_generic_plan_is_one_primary_key_lookup(conn, layout):
    """What a driver's prepared statement gets after a few executions (plan_cache_mode auto
    switches to the generic plan): still one lookup on jobs_pkey."""
    text = q("job_status").replace("%(job_id)s", "$1").replace("%(team)s", "$2").replace("%(now)s", "$3")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE mh_status_probe (bigint, text, timestamptz) AS {text}")
    try:
        for team in (None, TEAM):
            plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mh_status_probe (%s, %s, %s)",
                                (layout["far_id"], team, T0))
            [node] = nodes_on(plan, "jobs")
            assert (node["Node Type"], node["Index Name"]) == ("Index Scan", "jobs_pkey")
            assert node["Actual Rows"] == 1 and node["Actual Loops"] == 1
            assert plan["Actual Rows"] == 1
    finally:
        conn.execute("DEALLOCATE mh_status_probe")
        conn.execute("RESET plan_cache_mode")


# ---------------------------------------------------------------- (c) submit and cancel

@pytest.mark.parametrize("ahead,level", [
    (dt.timedelta(0), "minute"),
    (-dt.timedelta(hours=2), "minute"),           # overdue: the current bucket
    (dt.timedelta(hours=3, minutes=17), "minute"),
    (dt.timedelta(hours=30), "hour"),
    (dt.timedelta(days=10), "far"),
])
def test_submit_job_touches_one_due_partition(conn, ahead, level):
    due = T0 + ahead
    if level == "minute":
        expected_leaf, parent = minute_part(conn, max(due, T0)), "due_minutes"
    elif level == "hour":
        expected_leaf, parent = hour_part(conn, due), "due_hours"
    else:
        expected_leaf, parent = "due_far", "due_far"
    with conn.transaction(force_rollback=True):
        ae = AutoExplain(conn)
        with ae:
            job_id = conn.execute("SELECT submit_job(%s, 'probe', %s)", (TEAM, due)).fetchone()[0]
        # the plans name one level of the wheel (an INSERT names the partitioned parent) ...
        assert ae.due_relations() == {parent}
        # ... and the one row went to one leaf: the only partition locked
        assert locked_due_relations(conn) - {"due_minutes", "due_hours"} == {expected_leaf}
        where = conn.execute(
            """SELECT tableoid::regclass::text FROM due_minutes WHERE job_id = %(id)s
               UNION ALL SELECT tableoid::regclass::text FROM due_hours WHERE job_id = %(id)s
               UNION ALL SELECT 'due_far' FROM due_far WHERE job_id = %(id)s""", {"id": job_id}).fetchall()
        assert where == [(expected_leaf,)]
        # the job record: one insert by primary key
        assert {n["Node Type"] for n in ae.nodes_on("jobs")} <= {"ModifyTable"}


def test_submit_jobs_batch_touches_only_the_partitions_of_its_items(conn):
    """A batch of 200 jobs all due in one minute: one partition, not the ring."""
    due = T0 + dt.timedelta(hours=2, seconds=10)
    with conn.transaction(force_rollback=True):
        ae = AutoExplain(conn)
        with ae:
            rows = conn.execute(q("submit_jobs"), {
                "team": TEAM, "names": ["batch"] * 200, "due_ats": [due] * 200, "payloads": None,
                "priorities": None, "max_attempts": None, "flex_s": None, "stricts": None,
                "keys": None, "backoff_base_s": None, "backoff_cap_s": None, "traceparents": None, "shards": None}).fetchall()
        assert len(rows) == 200 and all(r[4] is None for r in rows)
        assert ae.due_relations() <= {"due_minutes", "due_hours", "due_far"}
        # (the empty INSERTs into the other levels lock only their parent or due_far itself)
        assert locked_due_relations(conn) - {"due_minutes", "due_hours", "due_far"} == {minute_part(conn, due)}
        # due_far is indexed and large: the batch never scanned it
        assert all(n["Node Type"] == "ModifyTable" for n in ae.nodes_on("due_far"))


def test_submit_jobs_batch_calls_no_function_once_per_job(conn):
    """The helpers a batch applies to each job (ids, wheel slots, the checks of
    each item, a traceparent's) are inlined into its statements, not called
    per row: a SQL function declared more immutable than its body is never
    inlined, and then costs a function call per job (counted here by
    track_functions)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL track_functions = 'all'")
        conn.execute(q("submit_jobs"), {
            "team": TEAM, "names": ["batch"] * 200, "due_ats": [T0 + dt.timedelta(seconds=i) for i in range(200)],
            "payloads": [json.dumps({"n": i}) for i in range(200)], "priorities": None, "max_attempts": None,
            "flex_s": None, "stricts": None, "keys": None, "backoff_base_s": None, "backoff_cap_s": None,
            "traceparents": [f"00-{i + 1:032x}-{i + 1:016x}-01" for i in range(200)], "shards": None}).fetchall()
        assert conn.execute("SELECT count(traceparent) FROM jobs WHERE name = 'batch'").fetchone()[0] == 200
        calls = conn.execute("""SELECT p.proname, pg_stat_get_xact_function_calls(p.oid) FROM pg_proc p
                                 WHERE p.pronamespace = 'minutehand'::regnamespace
                                   AND pg_stat_get_xact_function_calls(p.oid) >= 100""").fetchall()
    assert calls == []


def _unwheel_deletes(ae: AutoExplain) -> list[dict]:
    """The plans of the statements that took the row off the wheel."""
    return [p["Plan"] for p in ae.plans
            if p["Query Text"].lstrip().startswith("DELETE") and due_relations(p["Plan"])]


@pytest.mark.parametrize("ahead,level", [
    (dt.timedelta(0), "minute"),                  # due now: its bucket
    (dt.timedelta(hours=3, minutes=17), "minute"),
    (dt.timedelta(hours=30), "hour"),
    (dt.timedelta(days=10), "far"),
])
def test_cancel_takes_its_row_off_one_partition_by_one_probe(conn, ahead, level):
    """A cancel finds its job's row where its run time says, in one
    partition, through an index to that one row (the job id in the key),
    however many rows share its run time there."""
    due = T0 + ahead
    leaf = {"minute": minute_part(conn, due), "hour": hour_part(conn, due), "far": "due_far"}[level]
    with conn.transaction(force_rollback=True):
        # neighbours with the same run time, on every shard
        conn.execute("SELECT count(*) FROM submit_jobs(%s, array_fill('probe'::text, ARRAY[2000]), "
                     "array_fill(%s::timestamptz, ARRAY[2000]), p_stricts => array_fill(true, ARRAY[2000]))",
                     (TEAM, due))
        job_id = conn.execute("SELECT submit_job(%s, 'probe', %s, p_strict => true)", (TEAM, due)).fetchone()[0]
        conn.execute(f"ANALYZE {leaf}")
        ae = AutoExplain(conn)
        with ae:
            assert conn.execute("SELECT ok FROM cancel(%s, %s)", (job_id, TEAM)).fetchone()[0]
        [delete] = _unwheel_deletes(ae)
        assert due_relations(delete) - {"due_minutes"} == {leaf}
        assert_no_scan_beyond(delete)
        [probe] = [n for n in nodes_on(delete, leaf) if n["Node Type"] != "ModifyTable"]
        assert "job_id" in probe["Index Cond"] and probe["Actual Rows"] == 1, probe
        assert probe.get("Rows Removed by Filter", 0) == 0, probe
        assert ae.due_relations() - {"due_minutes"} == {leaf}
        assert conn.execute("""SELECT (SELECT count(*) FROM due_minutes WHERE job_id = %(id)s)
                                    + (SELECT count(*) FROM due_hours WHERE job_id = %(id)s)
                                    + (SELECT count(*) FROM due_far WHERE job_id = %(id)s)""",
                            {"id": job_id}).fetchone()[0] == 0
    # ANALYZE writes its estimates in place, outside the transaction: read the
    # partition again without the rolled-back neighbours (the module's other
    # tests assert the estimates).
    conn.execute(f"ANALYZE {leaf}")


def test_cancel_of_a_row_carried_forward_reads_the_claim_window_at_most(conn, layout):
    """A due row not in its own bucket (the sweep carried it into a later one):
    its bucket, then the buckets claims read (mh_sweep_after back from now),
    each through the claim index; never the rest of the ring."""
    old = minute_part(conn, T0 - dt.timedelta(minutes=50))
    with conn.transaction(force_rollback=True):
        pin(conn, T0 - dt.timedelta(minutes=50))
        conn.execute("SELECT count(*) FROM submit_jobs(%s, array_fill('probe'::text, ARRAY[2000]))", (TEAM,))
        job_id = conn.execute("SELECT submit_job(%s, 'probe', NULL)", (TEAM,)).fetchone()[0]
        pin(conn, T0)
        conn.execute("UPDATE due_minutes SET slot = mh_minute_slot(%s) WHERE job_id = %s", (T0, job_id))
        conn.execute(f"ANALYZE {old}")
        window = {minute_part(conn, CUR - k * MIN) for k in range(31)}
        ae = AutoExplain(conn)
        with ae:
            assert conn.execute("SELECT ok FROM cancel(%s, %s)", (job_id, TEAM)).fetchone()[0]
        own, carried = _unwheel_deletes(ae)
        assert due_relations(own) - {"due_minutes"} == {old}
        assert due_relations(carried) - {"due_minutes"} == window
        assert_no_scan_beyond(own)
        assert_no_scan_beyond(carried, *(window - {layout["cur"], layout["prev"]}))   # (those empty: read or not)
        assert sum(n["Actual Rows"] for n in plan_nodes(carried) if n["Node Type"] == "Index Scan") == 1
        assert conn.execute("SELECT count(*) FROM due_minutes WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    conn.execute(f"ANALYZE {old}")                   # (as above: without the rolled-back rows)


# ---------------------------------------------------------------- (d) outcomes and expiry

def _claimed(conn: psycopg.Connection, layout: dict, owner: str) -> list[tuple]:
    """Claim the chosen shard's due jobs (inside the caller's rolled-back transaction),
    with a day's worth of other teams' idempotency keys and other claims' reminders
    around them, analysed, so the planner sees tables of production size."""
    conn.execute("""INSERT INTO idempotency_keys (shard, team_id, key, job_id, request_hash, created_at, expires_at)
                    SELECT g %% 256, -1, 'k' || g, g, 'h', %(t)s, %(t)s + interval '1 day'
                      FROM generate_series(1, 50000) g""", {"t": T0})
    conn.execute("""INSERT INTO claim_checks (shard, check_at, job_ids)
                    SELECT g %% 256, %(t)s + g * interval '1 second', ARRAY[g::bigint]
                      FROM generate_series(1, 50000) g""", {"t": T0})
    # a counter row per shard and team, as a fleet that has run every team's jobs has
    conn.execute("""INSERT INTO team_running (shard, team_id, running)
                    SELECT s, t.id, 0 FROM teams t, generate_series(0, 255) s ON CONFLICT DO NOTHING""")
    conn.execute("ANALYZE idempotency_keys, claim_checks, team_running")
    epoch = _lease(conn, layout["shard"], owner)
    return conn.execute("SELECT job_id, lease_token FROM claim_due(%s, 100, %s, %s, 30)",
                        (layout["shard"], owner, epoch)).fetchall()


@pytest.mark.parametrize("call", [
    "SELECT count(*) FROM start_many(%s::bigint[], %s::uuid[])",
    "SELECT count(*) FROM heartbeat_many(%s::bigint[], %s::uuid[], 60)",
    "SELECT count(*) FROM complete_many(%s::bigint[], %s::uuid[], NULL)",
    "SELECT count(*) FROM fail_many(%s::bigint[], %s::uuid[], NULL, NULL)",
    "SELECT count(*) FROM release_many(%s::bigint[], %s::uuid[])",
])
def test_outcome_batches_reach_jobs_and_keys_only_by_primary_key(conn, layout, call):
    """A batch of outcomes touches its own job rows (and their idempotency keys) by
    primary key, and no part of the wheel beyond where a retry is put."""
    with conn.transaction(force_rollback=True):
        claimed = _claimed(conn, layout, "explain-o")
        assert claimed
        ids, tokens = [c[0] for c in claimed], [c[1] for c in claimed]
        ae = AutoExplain(conn)
        with ae:
            assert conn.execute(call, (ids, tokens)).fetchone()[0] == len(ids)
        assert ae.nodes_on("jobs")
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"])
            for node in plan_nodes(p["Plan"]):
                if node.get("Relation Name") == "idempotency_keys" and node["Node Type"] != "ModifyTable":
                    assert node["Index Name"] == "idempotency_keys_pkey"
                # the job rows are locked in the input's (shard, id) order: a nested loop over it
                if node["Node Type"] == "ModifyTable" and node.get("Relation Name") == "jobs" \
                        and "FROM input i" in p["Query Text"]:
                    loop = node["Plans"][0]
                    assert loop["Node Type"] == "Nested Loop", loop
                    outer = loop
                    while outer["Node Type"] == "Nested Loop":
                        outer = outer["Plans"][0]
                    assert (outer.get("Alias") or "").startswith("i"), loop   # the input, outermost
        # a retry is placed by mh_enqueue: the wheel is only written
        assert {n["Node Type"] for p in ae.plans for n in plan_nodes(p["Plan"])
                if (n.get("Relation Name") or "").startswith("due_")} <= {"ModifyTable"}


def test_expire_claims_reads_reminders_not_jobs(conn, layout):
    """expire_claims finds overdue claims through claim_checks' index and reaches
    the jobs by primary key: no scan of the jobs or of the wheel."""
    with conn.transaction(force_rollback=True):
        assert _claimed(conn, layout, "explain-x")
        pin(conn, T0 + dt.timedelta(minutes=5))
        ae = AutoExplain(conn)
        with ae:
            returned = conn.execute("SELECT returned FROM expire_claims(%s)", (layout["shard"],)).fetchone()[0]
        assert returned == layout["n_prev"] + layout["n_cur"]
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"])
        # the jobs are visited in id order, the order outcome batches lock them in:
        # a nested loop over the sorted ids, each reached by primary key
        update = next(p for p in ae.plans if "FROM unnest(v_ids)" in p["Query Text"])
        loops = [n for n in plan_nodes(update["Plan"]) if n["Node Type"] == "Nested Loop"]
        assert loops and loops[0]["Plans"][0]["Node Type"] == "Function Scan", update["Plan"]
        assert {n.get("Index Name") for n in nodes_on(update["Plan"], "jobs")
                if n["Node Type"] != "ModifyTable"} == {"jobs_pkey"}
        # the returned jobs are placed by mh_enqueue_many: the wheel is only written
        assert {n["Node Type"] for p in ae.plans for n in plan_nodes(p["Plan"])
                if (n.get("Relation Name") or "").startswith("due_")} <= {"ModifyTable"}
        assert locked_due_relations(conn) - {"due_minutes", "due_hours", "due_far"} == {
            layout["prev"], layout["cur"], minute_part(conn, T0 + dt.timedelta(minutes=5))}
    pin(conn, T0)


def test_finished_reminders_are_dropped_by_index_over_many_shards(conn, layout):
    """drop_finished_claim_checks (the expiry duty's first step, over all of a
    dispatcher's shards): claim_checks by its index, each reminder's jobs by
    primary key; the jobs of a live claim keep their reminder."""
    with conn.transaction(force_rollback=True):
        claimed = _claimed(conn, layout, "explain-f")
        assert claimed
        conn.execute("INSERT INTO claim_checks SELECT shard, %s, ARRAY[id] FROM jobs WHERE state = 'scheduled' LIMIT 50",
                     (T0,))
        args = {"shards": list(range(256)), "now": T0 + dt.timedelta(minutes=5)}
        plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("drop_finished_claim_checks"), args)
        assert_no_scan_beyond(plan, "claim_checks")
        # the reminders through their index (an index scan, or a bitmap over it)
        assert {n["Node Type"] for n in nodes_on(plan, "claim_checks")} <= {"ModifyTable", "Index Scan",
                                                                              "Bitmap Heap Scan"}
        assert "claim_checks_due" in {n.get("Index Name") for n in plan_nodes(plan)}
        assert {n.get("Index Name") for n in nodes_on(plan, "jobs")} == {"jobs_pkey"}
        left = conn.execute("SELECT count(*) FROM claim_checks WHERE check_at <= %(now)s", args).fetchone()[0]
        assert left >= 1                     # the live claim's reminder stays for expire_claims
        assert conn.execute("SELECT count(*) FROM claim_checks c WHERE check_at = %s", (T0,)).fetchone()[0] == 0
        # Even where the planner finds one scan of every job cheaper than a
        # probe per reminder's job (thousands of reminders due and random reads
        # priced dear here; an estimate of many reminders in a real run), it
        # can only probe: the jobs come from each reminder's list.
        conn.execute("INSERT INTO claim_checks SELECT shard, %s, ARRAY[id] FROM jobs WHERE state = 'scheduled' "
                     "LIMIT 3000", (T0,))
        conn.execute("ANALYZE claim_checks")
        conn.execute("SET LOCAL random_page_cost = 40")
        dear = explain_json(conn, "EXPLAIN (FORMAT JSON) " + q("drop_finished_claim_checks"), args)
        assert {n.get("Index Name") for n in nodes_on(dear, "jobs")} == {"jobs_pkey"}, json.dumps(dear, indent=1)


def test_retention_walks_jobs_by_primary_key_and_never_reads_the_wheel(conn, layout):
    """A retention pass over a shard of a million-job table reads its filed jobs
    through retention_checks' keys and walks the jobs along jobs_pkey from its
    mark, each reached by primary key; the wheel is never read."""
    with conn.transaction(force_rollback=True):
        # finished jobs of the shard, besides its waiting ones
        conn.execute("""UPDATE jobs SET state = 'succeeded', finished_at = %s
                         WHERE shard = %s AND id IN (SELECT id FROM jobs WHERE shard = %s ORDER BY id LIMIT 50)""",
                     (T0 - dt.timedelta(days=30), layout["shard"], layout["shard"]))
        # the keys of a day: far more rows than a pass visits
        conn.execute("""INSERT INTO idempotency_keys (shard, team_id, key, job_id, request_hash, created_at, expires_at)
                        SELECT g %% 256, 1, 'k' || g, g, 'h', %s, %s FROM generate_series(1, 50000) g""",
                     (T0, T0 + dt.timedelta(days=1)))
        # the failed attempts of 50,000 jobs: their history goes with them, by its key
        conn.execute("""INSERT INTO job_attempts (shard, job_id, attempt, ended_at, outcome)
                        SELECT shard, id, 1, %s, 'retrying' FROM jobs LIMIT 50000""", (T0,))
        conn.execute("""UPDATE jobs SET attempts = 2 WHERE shard = %s
                           AND id IN (SELECT id FROM jobs WHERE shard = %s ORDER BY id LIMIT 50)""",
                     (layout["shard"], layout["shard"]))
        conn.execute("ANALYZE retention_checks, retention_marks, idempotency_keys, job_attempts")
        ae = AutoExplain(conn)
        with ae:
            removed, deferred, walked = conn.execute("SELECT * FROM retain_jobs(%s, 604800, 1000)",
                                                     (layout["shard"],)).fetchone()
        assert removed == 50 and walked == 1000 and deferred == walked - removed
        assert ae.nodes_on("jobs")
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"], "teams", "retention_marks", "retention_checks", "idempotency_keys")
            # a keyed job's key: probed by its primary key (an index scan or a bitmap over it)
            assert {n["Node Type"] for n in nodes_on(p["Plan"], "idempotency_keys")} <= {
                "Index Scan", "Bitmap Heap Scan", "ModifyTable"}
            assert {n["Index Name"] for n in plan_nodes(p["Plan"])
                    if (n.get("Index Name") or "").startswith("idempotency_keys")} <= {"idempotency_keys_pkey"}
        assert not any((r or "").startswith("due_") for r in ae.all_relations())
        assert {n["Node Type"] for p in ae.plans for n in nodes_on(p["Plan"], "job_attempts")} <= {
            "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "ModifyTable"}


# ---------------------------------------------------------------- (e) statistics
def _fill_stats(conn: psycopg.Connection) -> None:
    """A day of counters for 300 teams (minute rows for the last two hours,
    hour rows before), analysed: the size the reads and upserts meet."""
    conn.execute("""INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                            cancelled, lateness_hist, runtime_hist)
                    SELECT %(t)s::timestamptz - m * interval '1 minute', s, t.id, 'job-' || n, 1, 1, 1, 0, 0, 0,
                           array_fill(0::bigint, ARRAY[16]), array_fill(0::bigint, ARRAY[16])
                      FROM teams t, generate_series(1, 120, 7) m, generate_series(0, 31, 5) s, generate_series(1, 3) n""",
                 {"t": T0})
    conn.execute("""INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                            cancelled, lateness_hist, runtime_hist)
                    SELECT mh_hour(%(t)s::timestamptz) - h * interval '1 hour', -1, t.id, 'job-' || n, 1, 1, 1, 0, 0, 0,
                           array_fill(0::bigint, ARRAY[16]), array_fill(0::bigint, ARRAY[16])
                      FROM teams t, generate_series(3, 24) h, generate_series(1, 3) n""", {"t": T0})
    conn.execute("""INSERT INTO team_running (shard, team_id, running)
                    SELECT s, t.id, 0 FROM teams t, generate_series(0, 255) s ON CONFLICT DO NOTHING""")
    # Every row in ANALYZE's sample: from a random sample of team_running
    # the planner's choice between probing it and reading it whole flips
    # from run to run (its cost is close to the probes' at this size).
    conn.execute("SET LOCAL default_statistics_target = 1000")
    conn.execute("ANALYZE team_stats, team_running")


@pytest.mark.parametrize("call", [
    "SELECT count(*) FROM start_many(%s::bigint[], %s::uuid[])",
    "SELECT count(*) FROM complete_many(%s::bigint[], %s::uuid[], NULL)",
    "SELECT count(*) FROM fail_many(%s::bigint[], %s::uuid[], NULL, ARRAY[false])",
])
def test_counter_upserts_reach_their_rows_by_primary_key(conn, layout, call):
    """The counters of an outcome batch: one upsert into team_stats and one
    into team_running, each reaching its rows through the primary key (a
    conflict is found by the unique index; team_running is probed, not read)."""
    with conn.transaction(force_rollback=True):
        _fill_stats(conn)
        claimed = _claimed(conn, layout, "explain-s")
        ids, tokens = [c[0] for c in claimed], [c[1] for c in claimed]
        if "complete_many" in call or "fail_many" in call:
            conn.execute("SELECT count(*) FROM start_many(%s::bigint[], %s::uuid[])", (ids, tokens))
        ae = AutoExplain(conn)
        with ae:
            conn.execute(call, (ids, tokens))
        stats = [p for p in ae.plans if "INSERT INTO team_stats" in p["Query Text"]]
        assert len(stats) == 1, [p["Query Text"][:80] for p in ae.plans]
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"])
            assert "jobs" not in relations(p["Plan"]) or "team_stats" not in relations(p["Plan"])
        running = [p for p in ae.plans if "INSERT INTO team_running" in p["Query Text"]]
        assert len(running) == (0 if "start_many" in call else 1)
        for p in running:
            assert {n.get("Index Name") for n in nodes_on(p["Plan"], "team_running")
                    if n["Node Type"] != "ModifyTable"} == {"team_running_pkey"}


def test_team_stats_read_uses_its_keys_and_never_jobs(conn):
    with conn.transaction(force_rollback=True):
        _fill_stats(conn)
        team = conn.execute("SELECT name FROM teams ORDER BY id DESC LIMIT 1").fetchone()[0]
        for window_s in (600, 86400):
            plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("team_stats"),
                                {"team": team, "window_s": window_s, "names": 50})
            assert relations(plan) == {"teams", "team_stats", "team_running"}, relations(plan)
            # the team's rows of the window through the primary key (an index scan or a bitmap over it)
            assert {n["Node Type"] for n in nodes_on(plan, "team_stats")} <= {"Index Scan", "Bitmap Heap Scan"}
            assert {n.get("Index Name") for n in plan_nodes(plan)} >= {"team_stats_pkey", "team_running_pkey"}
            assert {n["Node Type"] for n in nodes_on(plan, "team_running")} == {"Index Scan"}
            # one team's rows of the window, not the table
            read = sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in nodes_on(plan, "team_stats"))
            own = conn.execute("SELECT count(*) FROM team_stats WHERE team_id = (SELECT id FROM teams WHERE name = %s)"
                               " AND minute >= mh_stats_since(%s, %s)", (team, T0, window_s)).fetchone()[0]
            assert 0 < read == own < 500, (read, own)
        plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("fleet_stats"), {"window_s": 600})
        assert "jobs" not in relations(plan)
        # the window's rows through the time index (an index scan, or a bitmap over that index)
        assert {n["Node Type"] for n in nodes_on(plan, "team_stats")} <= {"Index Scan", "Bitmap Heap Scan"}
        assert "team_stats_minute" in {n.get("Index Name") for n in plan_nodes(plan)}


def test_admission_reaches_its_rows_by_their_keys(conn):
    """mh_admit for a team with a rate limit and a ceiling, among 300 teams
    with pending counts and buckets: its (at most 32) pending rows through
    the primary key; teams and team_buckets, a row per team, may be read
    whole (a few pages: the planner's choice), nothing else."""
    with conn.transaction(force_rollback=True):
        conn.execute("""INSERT INTO team_pending (team_id, stripe, pending)
                        SELECT t.id, s, 10 FROM teams t, generate_series(0, 31) s
                        ON CONFLICT DO NOTHING""")             # (the fixture's own jobs are counted)
        conn.execute("INSERT INTO team_buckets (team_id, tokens, refilled_at) SELECT t.id, 100, %s FROM teams t", (T0,))
        conn.execute("UPDATE teams SET submit_rate = 100, submit_burst = 100, max_pending = 1000000 WHERE name = %s",
                     (TEAM,))
        conn.execute("ANALYZE teams, team_pending, team_buckets")
        ae = AutoExplain(conn)
        with ae:
            assert conn.execute("SELECT admitted FROM mh_admit(%s, 10, 1, 0)", (TEAM,)).fetchone()[0] == 10
        assert ae.all_relations() == {"teams", "team_pending", "team_buckets"}, ae.all_relations()
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"], "teams", "team_buckets", "team_pending")
        # the team's rows through the primary key (an index scan or a bitmap over it)
        reads = [n for n in ae.nodes_on("team_pending") if n["Node Type"] != "ModifyTable"]
        assert {n["Node Type"] for n in reads} <= {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}, reads
        assert "team_pending_pkey" in {n.get("Index Name") for p in ae.plans for n in plan_nodes(p["Plan"])}
        assert sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in reads) == 32


def test_the_metrics_depth_counts_two_minute_partitions_and_reads_no_level(conn, layout):
    """/metrics' depth of the wheel (metrics_due_depth): the current and the
    next minute bucket counted, the other minute partitions removed when the
    plan starts; each level's size from the catalog (pg_class), never read."""
    nxt = minute_part(conn, CUR + MIN)
    with conn.transaction(force_rollback=True):
        conn.execute(q("no_parallel_workers"))
        clock = conn.execute(q("metrics_clock")).fetchone()
        slots = {"current_slot": clock[1], "next_slot": clock[2]}
        plan = explain_json(conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + q("metrics_due_depth"), slots)
        assert due_relations(plan) == {layout["cur"], nxt}, due_relations(plan)
        assert locked_due_relations(conn) - {"due_minutes", layout["cur"], nxt} == set()   # (the parent, and those)
        depth = conn.execute(q("metrics_due_depth"), slots).fetchone()
        assert depth[:2] == conn.execute(f"SELECT (SELECT count(*) FROM {layout['cur']}), "
                                         f"(SELECT count(*) FROM {nxt})").fetchone()
        # the fixture is analysed: the estimates are near the counts
        assert abs(depth[4] - layout["far"]) < 0.05 * layout["far"], (depth, layout["far"])
        assert abs(depth[3] - layout["hours"]) < 0.2 * layout["hours"] + 100, (depth, layout["hours"])


# ---------------------------------------------------------------- the chain of repeating series

def series_indexes(ae: AutoExplain) -> set[str]:
    """The indexes the recorded plans reach series through; none reads it whole."""
    nodes = [n for p in ae.plans for n in plan_nodes(p["Plan"])]
    assert not [n for n in nodes if n.get("Relation Name") == "series" and n["Node Type"] == "Seq Scan"]
    return {n["Index Name"] for n in nodes if n.get("Index Name", "").startswith("series")}


def test_the_chain_reaches_series_by_their_keys(conn, layout):
    """Among 20,000 series, a claim of a series' newest run marks its series
    through series_pkey; the chain reads the marked series through
    series_chain and creates the next run through its keys and one minute
    partition (reading its team's limits from teams, a small table); nothing
    reads jobs but by its primary key."""
    with conn.transaction(force_rollback=True):
        _fill_series(conn)
        series_id, job_id = conn.execute(
            "SELECT series_id, job_id FROM submit_series(%s, 'tick', %s, p_every_s => 60)",
            (TEAM, T0 - dt.timedelta(seconds=5))).fetchone()
        shard = series_id & 1023
        epoch = conn.execute("SELECT take_shard_lease(%s, 'explain-chain', 60)", (shard,)).fetchone()[0]
        ae = AutoExplain(conn)
        with ae:
            claimed = conn.execute("SELECT job_id FROM claim_due(%s, 10000, 'explain-chain', %s, 30)",
                                   (shard, epoch)).fetchall()
            conn.execute("SELECT 1")                 # the last plans' notices arrive with the next answer
        assert (job_id,) in claimed
        assert series_indexes(ae) == {"series_pkey"}
        with ae:
            [row] = conn.execute("SELECT series_id, chain_after FROM series_to_chain(%s, 1000)",
                                 (list(range(256)),)).fetchall()
            conn.execute("SELECT 1")
        assert row[0] == series_id
        assert series_indexes(ae) == {"series_chain"}
        with ae:
            made = conn.execute("SELECT * FROM chain_series(%s, %s, %s, %s, %s)",
                                (shard, [series_id], [row[1]], [T0 + dt.timedelta(seconds=55)], [None])).fetchall()
            conn.execute("SELECT 1")
        assert len(made) == 1
        for p in ae.plans:
            assert_no_scan_beyond(p["Plan"], layout["cur"], "series", "teams")
        assert series_indexes(ae) and series_indexes(ae) <= {"series_pkey", "series_chain"}
        assert ae.due_relations() == {"due_minutes"}           # an INSERT names the parent ...
        where = conn.execute("SELECT tableoid::regclass::text FROM due_minutes WHERE job_id = %s",
                             (made[0][1],)).fetchall()
        assert where == [(minute_part(conn, T0 + dt.timedelta(seconds=55)),)]   # ... and its row to one leaf
