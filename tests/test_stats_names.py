"""The counters' reads are bounded by the name cap, not by the names a team
used: one team submits 60,000 distinct job names (through submit_jobs, then
starts and completions counted by mh_add_stats, the outcome path's own
call; some of it rolled up into hour rows). team_stats keeps the team's
first mh_stats_names() names apart and the rest as one `(other)` row per
minute and stripe, so an uncached /metrics, the team's statistics and the
admin overview each finish well within BOUND_S (with a row per name they
took 12-52 s, 7-26 s and 0.6-1.4 s on a 2-core box; figures:
ops/bench/stats_names.py), the label cap holds and every count adds up.
The counter upsert reaches the names by their keys (EXPLAIN)."""
from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import time
from collections.abc import Iterator

import psycopg
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from minutehand.api.metrics import OTHER
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.support import AUTO_EXPLAIN_ON_CITUS, T0, make_store, pin

pytestmark = pytest.mark.bench

NAMES = 60_000
CAP = 50                               # mh_stats_names()
BATCH = 10_000
BOUND_S = 3.0                          # a generous bound; the target on a quiet machine is under 1 s
ADMIN = "admin-token"
MIN = dt.timedelta(minutes=1)
LATER = T0 + dt.timedelta(hours=3)     # the clock of the reads: T0's minute rows are hour rows by then
AUTO_EXPLAIN = ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                "SET auto_explain.log_level = 'notice'", "SET auto_explain.log_format = 'json'")


def wide_deltas(kind: str) -> str:
    """mh_add_stats' argument for one event of every name of team `wide`, as
    the submission (stripes 0..15) and outcome procedures (16..31) build it."""
    counts = {"start": "0, 1, 0, 0, 0, 0, 0.5, NULL", "complete": "0, 0, 1, 0, 0, 0, NULL, 2.0",
              "submit": "1, 0, 0, 0, 0, 0, NULL, NULL"}[kind]
    stripe = "g %% 16" if kind == "submit" else "16 + g %% 16"
    return f"""ARRAY(SELECT ROW({stripe}, (SELECT id FROM teams WHERE name = 'wide'), 'n' || lpad(g::text, 5, '0'),
                              {counts})::stats_delta
                      FROM generate_series(0, {NAMES - 1}) g)"""


@pytest.fixture(scope="module")
def wide_dsn(pg_server, template_db) -> Iterator[str]:
    """Team `wide` with 60,000 job names counted over three minutes at T0
    (submitted through submit_jobs, then started, then completed), rolled
    up into T0's hour, and submitted again in LATER's minute; team `t` with
    two names; the clock at LATER."""
    name = f"mh_stats_names_{os.getpid()}_{secrets.token_hex(3)}"
    with pg_server.janitor(name, template_dbname=template_db):
        dsn = pg_server.dsn(name)
        started = time.perf_counter()
        store = make_store(dsn, clock=T0)
        try:
            store.create_team("wide")
            store.create_team("t")
            for i in range(0, NAMES, BATCH):
                store.submit_many("wide", [JobSpec(f"n{k:05}", due_at=T0 + dt.timedelta(days=2))
                                           for k in range(i, i + BATCH)])
            store.submit_many("t", [JobSpec("a")] * 3 + [JobSpec("b")] * 2)
        finally:
            store.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            for minute, kind in ((T0 + MIN, "start"), (T0 + 2 * MIN, "complete"), (LATER, "submit")):
                pin(c, minute)
                if minute == LATER:
                    assert c.execute("SELECT roll_up_stats()").fetchone()[0] > 0
                c.execute(f"SELECT mh_add_stats(%s, {wide_deltas(kind)})", (minute,))
            c.execute("VACUUM ANALYZE team_stats, team_stats_names")
        print(f"\nsetup: {time.perf_counter() - started:.1f} s")
        yield dsn


@pytest.fixture
def store(wide_dsn) -> Iterator[Store]:
    s = make_store(wide_dsn, clock=LATER)
    yield s
    s.close()


def timed(label: str, call):
    started = time.perf_counter()
    result = call()
    took = time.perf_counter() - started
    print(f"{label}: {took:.3f} s")
    return result, took


def bound(pg_server) -> float:
    # a one-box Citus cluster answers 2.5-4x slower (ops/citus/README.md)
    return BOUND_S * (3 if pg_server.citus else 1)


def test_the_team_keeps_its_first_names_apart_and_counts_the_rest_as_one(wide_dsn):
    with psycopg.connect(wide_dsn, autocommit=True) as c:
        assert c.execute("SELECT mh_stats_names(), mh_stats_other()").fetchone() == (CAP, OTHER)
        assert c.execute("SELECT count(*) FROM team_stats_names n JOIN teams t ON t.id = n.team_id"
                         " WHERE t.name = 'wide'").fetchone()[0] == CAP
        # at most the cap and (other) per minute (or hour) and stripe
        widest = c.execute("""SELECT max(n) FROM (SELECT count(*) n FROM team_stats s JOIN teams t ON t.id = s.team_id
                                                   WHERE t.name = 'wide' GROUP BY s.minute, s.stripe) x""").fetchone()
        assert widest[0] <= CAP + 1
        # nothing lost: every event of every name is counted once
        sums = c.execute("""SELECT sum(submitted), sum(started), sum(succeeded) FROM team_stats s
                              JOIN teams t ON t.id = s.team_id WHERE t.name = 'wide'""").fetchone()
        assert sums == (2 * NAMES, NAMES, NAMES)


def test_an_uncached_scrape_the_teams_stats_and_the_overview_are_bounded_by_the_cap(store, pg_server):
    limit = bound(pg_server)
    settings = Settings(metrics_read_s=0, admin_token=ADMIN, api_submit_workers=0)
    with TestClient(build(settings, store, dispatch=False, head=migrate.head()).app) as client:
        r, took = timed("/metrics, uncached", lambda: client.get("/metrics"))
        assert r.status_code == 200, r.text
        assert took < limit
        samples = {f.name: f.samples for f in text_string_to_metric_families(r.text)}
        submitted = {(s.labels["team"], s.labels["name"]): s.value for s in samples["minutehand_jobs_submitted"]
                     if s.name.endswith("_total")}
        wide = {name: v for (team, name), v in submitted.items() if team == "wide"}
        assert len(wide) == CAP + 1 and OTHER in wide                 # the label cap holds
        assert sum(wide.values()) == 2 * NAMES
        assert {name: v for (team, name), v in submitted.items() if team == "t"} == {"a": 3, "b": 2}

        auth = {"Authorization": f"Bearer {ADMIN}"}
        for window_s in (3600, 86400, 30 * 86400):
            r, took = timed(f"the team's stats, {window_s} s", lambda: client.get(
                f"/v1/teams/wide/stats?window_s={window_s}", headers=auth))
            assert r.status_code == 200, r.text
            assert took < limit
            body = r.json()
            names = {n["name"]: n["counts"]["submitted"] for n in body["names"]}
            assert len(names) == CAP and set(names) == {f"n{k:05}" for k in range(CAP)}   # first come
            assert body["other"]["names"] == 1                        # the rest, counted as one
            total = NAMES if window_s == 3600 else 2 * NAMES
            assert body["total"]["submitted"] == total == sum(names.values()) + body["other"]["counts"]["submitted"]
        r, took = timed("the fleet's stats", lambda: client.get("/v1/stats", headers=auth))
        assert r.status_code == 200 and took < limit
        assert {t["team"]: t["counts"]["succeeded"] for t in r.json()["teams"]} == {"wide": NAMES, "t": 0}

    for team in (None, "wide"):
        overview, took = timed(f"the admin overview ({team or 'fleet'})", lambda: store.admin_overview(team))
        assert took < limit
        assert sum(m.submitted for m in overview.minutes) == NAMES      # the last hour: LATER's minute


def test_the_counter_upsert_reaches_the_names_by_their_keys(wide_dsn, pg_server):
    """A batch of 1,000 outcomes of known names and names past the cap, with
    the names of 300 more teams registered (a fleet's size): team_stats_names
    is probed through its primary key, never read whole, and team_stats only
    written."""
    if pg_server.citus:
        pytest.skip(AUTO_EXPLAIN_ON_CITUS)
    plans: list[dict] = []
    with psycopg.connect(wide_dsn, autocommit=True) as c, c.transaction(force_rollback=True):
        pin(c, LATER)
        c.execute("INSERT INTO teams (name) SELECT 'team-' || g FROM generate_series(1, 300) g")
        c.execute("""INSERT INTO team_stats_names (team_id, name, slot)
                     SELECT t.id, 'job-' || n, n FROM teams t, generate_series(1, 50) n WHERE t.name LIKE 'team-%'""")
        c.execute("ANALYZE team_stats_names")
        for stmt in AUTO_EXPLAIN:
            c.execute(stmt)
        c.add_notice_handler(lambda d: plans.append(json.loads(d.message_primary.split("plan:", 1)[1]))
                             if "plan:" in (d.message_primary or "") else None)
        c.execute("""SELECT mh_add_stats(%s, ARRAY(
                         SELECT ROW(16 + g %% 16, (SELECT id FROM teams WHERE name = 'wide'),
                                    'n' || lpad((g * 997 %% 60000)::text, 5, '0'), 0, 0, 1, 0, 0, 0, NULL, 1.0
                                    )::stats_delta FROM generate_series(1, 1000) g))""", (LATER,))
    nodes = [n for p in plans for n in plan_nodes(p["Plan"])]
    names = [n for n in nodes if n.get("Relation Name") == "team_stats_names"]
    # probes of the batch's names, and of whether the team has room: never read whole
    assert names and {n["Node Type"] for n in names} <= {"Index Only Scan", "Index Scan"}, names
    assert {n["Index Name"] for n in names} == {"team_stats_names_pkey", "team_stats_names_team_id_slot_key"}
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in names) <= 1000 + 1 < 300 * 50
    # team_stats is only written: its conflicts found by the unique index
    assert {n["Node Type"] for n in nodes if n.get("Relation Name") == "team_stats"} == {"ModifyTable"}


def plan_nodes(plan: dict) -> Iterator[dict]:
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))
