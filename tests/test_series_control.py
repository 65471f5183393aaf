"""Controlling a repeating series against a real PostgreSQL: reading it
(spec, state, waiting run, next fire times, newest runs), listing a team's
series, and pausing, resuming, cancelling and changing one, through SQL
(sql/functions/series.sql), the Store, the HTTP API and the CLI.

A series' waiting run (its newest) is cancelled by pause, cancel and change
while it has not started (scheduled, or claimed with its start not
reported), as cancel() cancels a job; a started run is left to finish.
Every refusal writes nothing. The clock is pinned (support.T0).

The tests share one clone of the migrated template, emptied before each
(marked reused_db, tests/fixtures/databases.py)."""
from __future__ import annotations

import concurrent.futures
import datetime as dt
import json

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.api.app import create_app
from minutehand.cli import main as cli
from minutehand.settings import Settings
from minutehand.store import errors, migrate, repeat
from minutehand.store.outcomes import Release, Start
from minutehand.store.queries import q
from minutehand.store.records import Repeat
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import T0, claim as claim_shards, pin, router_plan

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

UTC = dt.timezone.utc
S = dt.timedelta(seconds=1)
H = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
ADMIN = "admin-secret-token"
T = {"Authorization": "Bearer tok-team-t"}
U = {"Authorization": "Bearer tok-team-u"}
A = {"Authorization": f"Bearer {ADMIN}"}
# Everything a control call could write.
SNAPSHOT = """SELECT (SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.id), '[]') FROM series s),
                     (SELECT coalesce(jsonb_agg(to_jsonb(j) ORDER BY j.id), '[]') FROM jobs j),
                     (SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.shard, r.team_id), '[]') FROM team_running r),
                     (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x), '[]') FROM team_stats x)"""


def snapshot(conn) -> tuple:
    return conn.execute(SNAPSHOT).fetchone()


def at(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)


def series_row(conn, series_id: int) -> dict:
    return conn.execute("SELECT to_jsonb(s) FROM series s WHERE id = %s", (series_id,)).fetchone()[0]


def job_row(conn, job_id: int) -> dict:
    return conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()[0]


def cancelled_count(conn) -> int:
    return conn.execute("SELECT coalesce(sum(cancelled), 0) FROM team_stats").fetchone()[0]


def running(conn) -> int:
    return conn.execute("SELECT coalesce(sum(running), 0) FROM team_running").fetchone()[0]


def new_series(store, team="t", name="tick", due_at=None, **repeat_kw):
    """A series of `team` (default: every 60 s, first run due at T0 - 10 s, claimable now)."""
    repeat_kw = repeat_kw or {"every_s": 60}
    due = due_at if due_at is not None or "cron" in repeat_kw else T0 - 10 * S
    return store.submit(team, JobSpec(name, due_at=due, repeat=Repeat(**repeat_kw)))


def claim_run(store, job_id: int):
    got = [c for c in claim_shards(store, store.take_leases([job_id & 1023], "d1", 3600), 100).jobs
           if c.job_id == job_id]
    assert len(got) == 1, f"run {job_id} was not claimable"
    return got[0]


def start_run(store, job_id: int) -> None:
    c = claim_run(store, job_id)
    assert store.start([Start(job_id, c.lease_token)])[0].ok


def add_run(conn, series_id: int, due: dt.datetime, state: str = "scheduled", error: str | None = None) -> int:
    """A later run of the series, as the chain would write it (its newest: last_job_id)."""
    job_id = conn.execute(
        """WITH s AS (SELECT * FROM series WHERE id = %(s)s), n AS (SELECT mh_new_id(s.shard) AS id FROM s)
           INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                             max_attempts, backoff_base_s, backoff_cap_s, series_id, created_at, updated_at,
                             agreed_at, last_error, started_at, finished_at)
           SELECT s.shard, n.id, s.team_id, s.name, s.payload, s.priority, %(due)s, s.flex_s, s.strict, %(due)s,
                  %(state)s::job_state, s.max_attempts, s.backoff_base_s, s.backoff_cap_s, s.id, %(due)s, %(due)s,
                  %(due)s, %(error)s,
                  CASE WHEN %(state)s IN ('succeeded', 'dead') THEN %(due)s::timestamptz END,
                  CASE WHEN %(state)s IN ('succeeded', 'dead') THEN %(due)s::timestamptz + interval '2 s' END
             FROM s, n RETURNING id""",
        {"s": series_id, "due": due, "state": state, "error": error}).fetchone()[0]
    conn.execute("UPDATE series SET last_job_id = %s, last_due_at = %s WHERE id = %s", (job_id, due, series_id))
    return job_id


@pytest.fixture
def store(pinned_store, pinned_conn):
    return pinned_store


@pytest.fixture
def client(db_dsn, module_conn, module_store):
    """The API on the module's store, clock pinned to T0; teams 't' and 'u' with tokens."""
    module_conn.execute("UPDATE teams SET token_hash = CASE name WHEN 't' THEN %s WHEN 'u' THEN %s END",
                        (hash_token("tok-team-t"), hash_token("tok-team-u")))
    pin(module_conn, T0)
    module_store.clock = T0
    with TestClient(create_app(Settings(admin_token=ADMIN), module_store, head=migrate.head())) as c:
        yield c


def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == f"/problems/{slug}" and detail.lower() in body["detail"].lower(), body
    return body


# ---------------------------------------------------------------- pause
def test_pause_cancels_the_waiting_run_and_stops_the_chain(store, pinned_conn):
    sub = new_series(store)
    pinned_conn.execute("UPDATE series SET chain_after = %s WHERE id = %s", (T0, sub.series_id))
    got = store.pause_series("t", sub.series_id)
    assert (got.series_id, got.state, got.changed, got.cancelled_run) == (sub.series_id, "paused", True, sub.job_id)
    s, j = series_row(pinned_conn, sub.series_id), job_row(pinned_conn, sub.job_id)
    assert at(s["paused_at"]) == T0 and s["chain_after"] is None and s["cancelled_at"] is None
    assert j["state"] == "cancelled" and at(j["finished_at"]) == T0
    assert cancelled_count(pinned_conn) == 1
    # again: nothing changes
    before = snapshot(pinned_conn)
    again = store.pause_series("t", sub.series_id)
    assert (again.state, again.changed, again.cancelled_run) == ("paused", False, None)
    assert snapshot(pinned_conn) == before


@pytest.mark.parametrize("answer", ["release", "start"])
def test_pause_asks_the_worker_of_a_claimed_run_to_cancel_it(store, pinned_conn, answer):
    """A claimed run may be running already (its start not reported yet):
    the pause requests its cancel, and its worker's answer decides."""
    sub = new_series(store)
    c = claim_run(store, sub.job_id)
    assert running(pinned_conn) == 1
    got = store.pause_series("t", sub.series_id)
    assert (got.state, got.changed, got.cancelled_run) == ("paused", True, None)
    j = job_row(pinned_conn, sub.job_id)
    assert (j["state"], at(j["cancel_requested_at"]), j["lease_token"]) == ("claimed", T0, str(c.lease_token))
    if answer == "release":                  # given back unstarted: cancelled, not run later
        assert store.release([Release(sub.job_id, c.lease_token)])[0].state == "cancelled"
        assert (running(pinned_conn), cancelled_count(pinned_conn)) == (0, 1)
    else:                                    # it had started: it runs on
        assert store.start([Start(sub.job_id, c.lease_token)])[0].state == "running"
        assert (running(pinned_conn), cancelled_count(pinned_conn)) == (1, 0)


@pytest.mark.parametrize("op", ["pause", "cancel", "change"])
def test_a_started_run_is_left_to_finish(store, pinned_conn, op):
    sub = new_series(store)
    start_run(store, sub.job_id)
    before = job_row(pinned_conn, sub.job_id)
    if op == "change":
        got = store.change_series("t", sub.series_id, Repeat(every_s=300))
    else:
        got = getattr(store, f"{op}_series")("t", sub.series_id)
    assert got.changed and got.cancelled_run is None
    assert job_row(pinned_conn, sub.job_id) == before           # still running, untouched
    assert running(pinned_conn) == 1 and cancelled_count(pinned_conn) == 0


def test_a_finished_or_retrying_run_is_not_cancelled(store, pinned_conn):
    sub = new_series(store)
    pinned_conn.execute("UPDATE jobs SET state = 'retrying' WHERE id = %s", (sub.job_id,))
    assert store.pause_series("t", sub.series_id).cancelled_run is None
    assert job_row(pinned_conn, sub.job_id)["state"] == "retrying"


def test_a_claim_and_a_control_call_on_one_series_take_turns(store, pinned_conn, db_dsn):
    """A claim locks the run, then marks the series, skipping a series row
    a control call holds; a control call holds the series, then waits for
    the run. So they take turns, never deadlock: here the claim goes first,
    and the pause that waited for it asks the claimed run's worker to cancel it."""
    sub = new_series(store)
    shard = sub.job_id & 1023
    (epoch,) = [e for e in store.take_leases([shard], "d1", 3600).values()]
    with psycopg.connect(db_dsn) as other:
        pin(other, T0)
        claimed = other.execute("SELECT job_id FROM claim_due(%s, 10, 'd1', %s, 30)", (shard, epoch)).fetchall()
        assert claimed == [(sub.job_id,)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            paused = pool.submit(store.pause_series, "t", sub.series_id)
            with pytest.raises(concurrent.futures.TimeoutError):
                paused.result(timeout=0.5)               # waits for the claim's lock on the run
            other.commit()
            got = paused.result(timeout=10)
    assert (got.state, got.cancelled_run) == ("paused", None)
    j = job_row(pinned_conn, sub.job_id)
    assert j["state"] == "claimed" and j["cancel_requested_at"] is not None    # asked of its worker
    assert series_row(pinned_conn, sub.series_id)["chain_after"] is None      # the pause cleared the mark


# ---------------------------------------------------------------- resume
def test_resume_sets_the_chain_to_now(store, pinned_conn):
    sub = new_series(store)
    store.pause_series("t", sub.series_id)
    later = T0 + 3 * H
    store.clock = later
    got = store.resume_series("t", sub.series_id)
    assert (got.state, got.changed, got.cancelled_run) == ("active", True, None)
    s = series_row(pinned_conn, sub.series_id)
    assert s["paused_at"] is None and at(s["chain_after"]) == later and at(s["updated_at"]) == later
    # an active series: nothing changes
    before = snapshot(pinned_conn)
    assert store.resume_series("t", sub.series_id).changed is False
    assert snapshot(pinned_conn) == before


def test_a_cancelled_series_cannot_be_resumed(store, pinned_conn):
    sub = new_series(store)
    store.cancel_series("t", sub.series_id)
    before = snapshot(pinned_conn)
    with pytest.raises(errors.Conflict, match="cannot be resumed"):
        store.resume_series("t", sub.series_id)
    assert snapshot(pinned_conn) == before


# ---------------------------------------------------------------- cancel
def test_cancel_is_idempotent(store, pinned_conn):
    sub = new_series(store)
    store.pause_series("t", sub.series_id)
    store.clock = T0 + H
    first = store.cancel_series("t", sub.series_id)
    assert (first.state, first.changed, first.cancelled_run) == ("cancelled", True, None)   # pause cancelled it
    s = series_row(pinned_conn, sub.series_id)
    assert at(s["cancelled_at"]) == T0 + H and s["chain_after"] is None
    before = snapshot(pinned_conn)
    store.clock = T0 + 2 * H
    again = store.cancel_series("t", sub.series_id)
    assert (again.state, again.changed, again.cancelled_run) == ("cancelled", False, None)
    assert snapshot(pinned_conn) == before
    assert store.pause_series("t", sub.series_id).state == "cancelled"
    assert snapshot(pinned_conn) == before


def test_cancel_cancels_the_waiting_run(store, pinned_conn):
    sub = new_series(store)
    got = store.cancel_series("t", sub.series_id)
    assert got.cancelled_run == sub.job_id
    assert job_row(pinned_conn, sub.job_id)["state"] == "cancelled"


@pytest.mark.parametrize("op", ["pause", "cancel", "change"])
def test_the_run_a_control_call_cancels_leaves_the_wheel(store, pinned_conn, op):
    sub = new_series(store)
    on_wheel = "SELECT count(*) FROM due_minutes WHERE job_id = %s"
    assert pinned_conn.execute(on_wheel, (sub.job_id,)).fetchone()[0] == 1
    call = {"pause": lambda: store.pause_series("t", sub.series_id),
            "cancel": lambda: store.cancel_series("t", sub.series_id),
            "change": lambda: store.change_series("t", sub.series_id, Repeat(every_s=120))}[op]
    assert call().cancelled_run == sub.job_id
    assert pinned_conn.execute(on_wheel, (sub.job_id,)).fetchone()[0] == 0


# ---------------------------------------------------------------- change
def test_change_sets_the_spec_cancels_the_waiting_run_and_chains_from_now(store, pinned_conn):
    sub = new_series(store)
    got = store.change_series("t", sub.series_id, Repeat(cron="0 3 * * *", timezone="Europe/Berlin"), "skip")
    assert (got.state, got.changed, got.cancelled_run) == ("active", True, sub.job_id)
    s = series_row(pinned_conn, sub.series_id)
    assert (s["every_s"], s["cron"], s["timezone"], s["misfire"]) == (None, "0 3 * * *", "Europe/Berlin", "skip")
    assert at(s["chain_after"]) == T0
    assert job_row(pinned_conn, sub.job_id)["state"] == "cancelled"
    # misfire omitted: kept; cron without a zone: UTC
    store.change_series("t", sub.series_id, Repeat(cron="*/5 * * * *"))
    s = series_row(pinned_conn, sub.series_id)
    assert (s["cron"], s["timezone"], s["misfire"]) == ("*/5 * * * *", "UTC", "skip")


def test_a_paused_series_keeps_its_new_spec_for_its_resume(store, pinned_conn):
    sub = new_series(store)
    store.pause_series("t", sub.series_id)
    got = store.change_series("t", sub.series_id, Repeat(every_s=7200))
    assert (got.state, got.cancelled_run) == ("paused", None)
    s = series_row(pinned_conn, sub.series_id)
    assert s["every_s"] == 7200 and s["chain_after"] is None and s["paused_at"] is not None


@pytest.mark.parametrize("args, sqlstate, msg", [
    ((0, None, None, None), "MH400", "between 1 and 31622400"),
    ((None, None, None, None), "MH400", "exactly one of every_s or cron"),
    ((60, "* * * * *", None, None), "MH400", "exactly one"),
    ((60, None, "UTC", None), "MH400", "goes with cron"),
    ((None, "0 3 * *", None, None), "MH400", "5-field"),
    ((None, "0 3 * * *", "CEST", None), "MH400", "IANA"),
    ((60, None, None, "sometimes"), "MH400", "run_once or skip"),
])
def test_sql_change_validates_and_writes_nothing(store, pinned_conn, args, sqlstate, msg):
    sub = new_series(store)
    before = snapshot(pinned_conn)
    with pytest.raises(psycopg.Error, match=msg) as e:
        pinned_conn.execute("SELECT * FROM change_series('t', %s, %s, %s, %s, %s)", (sub.series_id, *args))
    assert e.value.sqlstate == sqlstate
    assert snapshot(pinned_conn) == before


def test_a_cancelled_series_cannot_be_changed(store, pinned_conn):
    sub = new_series(store)
    store.cancel_series("t", sub.series_id)
    before = snapshot(pinned_conn)
    with pytest.raises(errors.Conflict, match="cannot be changed"):
        store.change_series("t", sub.series_id, Repeat(every_s=60))
    assert snapshot(pinned_conn) == before


def test_store_change_refuses_a_cron_that_never_fires_before_sql(store, pinned_conn):
    sub = new_series(store)
    before = snapshot(pinned_conn)
    for spec, msg in ((Repeat(cron="0 0 31 2 *"), "does not fire within 366 days"),
                      (Repeat(cron="61 * * * *"), "not a 5-field"),
                      (Repeat(cron="0 3 * * *", timezone="Mars/Olympus"), "IANA")):
        with pytest.raises(errors.InvalidInput, match=msg):
            store.change_series("t", sub.series_id, spec)
    assert snapshot(pinned_conn) == before


@pytest.mark.parametrize("call", ["series_detail('{team}', {id})", "pause_series('{team}', {id})",
                                  "resume_series('{team}', {id})", "cancel_series('{team}', {id})",
                                  "change_series('{team}', {id}, 60)"])
def test_sql_another_teams_series_is_no_such_series(store, pinned_conn, call):
    sub = new_series(store)
    before = snapshot(pinned_conn)
    for team, series_id, msg in (("u", sub.series_id, "no such series"), ("t", sub.series_id + 1024, "no such series"),
                                 ("nobody", sub.series_id, "unknown team")):
        with pytest.raises(psycopg.Error, match=msg) as e:
            pinned_conn.execute(f"SELECT * FROM {call.format(team=team, id=series_id)}")
        assert e.value.sqlstate == "MH404"
    assert snapshot(pinned_conn) == before


# ---------------------------------------------------------------- reading
def test_detail_shows_the_spec_state_and_newest_runs_first(store, pinned_conn):
    sub = new_series(store)
    first = sub.job_id
    pinned_conn.execute("UPDATE jobs SET state = 'succeeded', started_at = %s, finished_at = %s WHERE id = %s",
                        (T0, T0 + S, first))
    second = add_run(pinned_conn, sub.series_id, T0 + 50 * S, "dead", error="boom")
    third = add_run(pinned_conn, sub.series_id, T0 + 110 * S)
    d = store.series("t", sub.series_id)
    assert (d.series_id, d.team, d.name, d.state, d.every_s, d.misfire) == (sub.series_id, "t", "tick", "active",
                                                                            60, "run_once")
    assert (d.last_job_id, d.last_job_state, d.last_due_at) == (third, "scheduled", T0 + 110 * S)
    assert d.now == T0
    assert [r.job_id for r in d.runs] == [third, second, first]
    assert (d.runs[1].state, d.runs[1].last_error, d.runs[1].attempts) == ("dead", "boom", 0)
    assert d.runs[2].started_at == T0 and d.runs[2].finished_at == T0 + S
    assert [r.job_id for r in store.series_runs("t", sub.series_id, limit=2)] == [third, second]
    assert store.series_runs("u", sub.series_id) == []
    with pytest.raises(errors.NotFound, match="no such series"):
        store.series("u", sub.series_id)


def test_list_pages_newest_first(store, pinned_conn):
    ids = [new_series(store, name=f"s{i}").series_id for i in range(5)]
    new_series(store, team="u")
    store.pause_series("t", ids[1])
    page = store.list_series("t", limit=2)
    assert [s.series_id for s in page.series] == sorted(ids, reverse=True)[:2]
    seen = [s.series_id for s in page.series]
    while page.next_cursor is not None:
        page = store.list_series("t", after=page.next_cursor, limit=2)
        seen += [s.series_id for s in page.series]
    assert seen == sorted(ids, reverse=True)
    states = {s.series_id: s.state for s in store.list_series("t").series}
    assert states[ids[1]] == "paused" and list(states.values()).count("active") == 4


# ---------------------------------------------------------------- fire times
@pytest.mark.parametrize("spec, after, anchor, expected", [
    (Repeat(every_s=3600), T0, T0 - 30 * S, [T0 - 30 * S + H * k for k in range(1, 4)]),
    (Repeat(every_s=3600), T0, T0 + 10 * H, [T0 + 10 * H, T0 + 11 * H, T0 + 12 * H]),
    (Repeat(cron="0 3 * * *", timezone="Europe/Berlin"), dt.datetime(2030, 3, 29, 12, tzinfo=UTC), None,
     [dt.datetime(2030, 3, 30, 2, tzinfo=UTC), dt.datetime(2030, 3, 31, 1, tzinfo=UTC),
      dt.datetime(2030, 4, 1, 1, tzinfo=UTC)]),
    (Repeat(cron="0 * * * *"), dt.datetime(2030, 1, 1, 13, tzinfo=UTC), None,     # strictly after
     [dt.datetime(2030, 1, 1, 14 + k, tzinfo=UTC) for k in range(3)]),
    # clocks go back in Berlin (2030-10-27 03:00 CEST -> 02:00 CET): 02:30 is
    # two instants, and APScheduler fires at both; never an earlier one again
    (Repeat(cron="30 2 * * *", timezone="Europe/Berlin"), dt.datetime(2030, 10, 26, 12, tzinfo=UTC), None,
     [dt.datetime(2030, 10, 27, 0, 30, tzinfo=UTC), dt.datetime(2030, 10, 27, 1, 30, tzinfo=UTC),
      dt.datetime(2030, 10, 28, 1, 30, tzinfo=UTC)]),
    (Repeat(cron="*/30 * * * *", timezone="Europe/Berlin"), dt.datetime(2030, 10, 27, 0, 40, tzinfo=UTC), None,
     [dt.datetime(2030, 10, 27, 1, 0, tzinfo=UTC), dt.datetime(2030, 10, 27, 1, 30, tzinfo=UTC),
      dt.datetime(2030, 10, 27, 2, 0, tzinfo=UTC)]),
    # 02:30 does not exist the spring night: an hour later, 03:30 CEST
    (Repeat(cron="30 2 * * *", timezone="Europe/Berlin"), dt.datetime(2030, 3, 30, 12, tzinfo=UTC), None,
     [dt.datetime(2030, 3, 31, 1, 30, tzinfo=UTC), dt.datetime(2030, 4, 1, 0, 30, tzinfo=UTC),
      dt.datetime(2030, 4, 2, 0, 30, tzinfo=UTC)]),
])
def test_fire_times(spec, after, anchor, expected):
    assert repeat.fire_times(spec, after, 3, after, anchor=anchor) == expected


def test_fire_times_stop_at_the_horizon_quickly():
    import time
    began = time.process_time()
    assert repeat.fire_times(Repeat(cron="0 0 31 2 *"), T0, 5, T0) == []
    assert repeat.fire_times(Repeat(cron="0 0 29 2 *"), T0, 5, T0) == []          # 2032 is past the horizon
    assert repeat.fire_times(Repeat(every_s=200 * 86400), T0, 5, T0, anchor=T0) == [T0 + 200 * DAY]
    assert time.process_time() - began < 0.5


# ---------------------------------------------------------------- HTTP
def test_http_get_a_series(client, pinned_conn):
    r = client.post("/v1/jobs", headers=T, json={"name": "nightly", "payload": {"k": 1},
                                                  "repeat": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}})
    series_id, job_id = r.json()["series_id"], r.json()["job_id"]
    r = client.get(f"/v1/series/{series_id}", headers=T)
    assert r.status_code == 200, r.text
    b = r.json()
    assert (b["series_id"], b["team"], b["name"], b["payload"], b["state"], b["misfire"]) == \
        (series_id, "t", "nightly", {"k": 1}, "active", "run_once")
    assert b["repeat"] == {"every_s": None, "cron": "0 3 * * *", "timezone": "Europe/Berlin"}
    assert b["waiting_run"] == {"job_id": job_id, "state": "scheduled", "due_at": "2030-01-02T02:00:00Z",
                                "run_at": "2030-01-02T02:00:00Z"}
    assert b["next_fire_times"] == [f"2030-01-0{d}T02:00:00Z" for d in range(2, 7)]
    assert [run["job_id"] for run in b["last_runs"]] == [job_id]
    # admin names the team
    assert client.get(f"/v1/series/{series_id}?team=t", headers=A).json()["series_id"] == series_id
    assert_problem(client.get(f"/v1/series/{series_id}", headers=A), 422, "invalid-input", "?team=")
    # cancelled: no next fire times
    assert client.post(f"/v1/series/{series_id}/cancel", headers=T).json() == \
        {"series_id": series_id, "state": "cancelled", "changed": True, "cancelled_run": job_id}
    b = client.get(f"/v1/series/{series_id}", headers=T).json()
    assert b["state"] == "cancelled" and b["next_fire_times"] == [] and b["waiting_run"]["state"] == "cancelled"


def test_http_pause_resume_cancel_change(client, pinned_conn):
    r = client.post("/v1/jobs", headers=T, json={"name": "e", "due_at": (T0 + H).isoformat(),
                                                  "repeat": {"every_s": 600}})
    sid, job_id = r.json()["series_id"], r.json()["job_id"]
    assert client.post(f"/v1/series/{sid}/pause", headers=T).json() == \
        {"series_id": sid, "state": "paused", "changed": True, "cancelled_run": job_id}
    assert client.post(f"/v1/series/{sid}/pause", headers=T).json()["changed"] is False
    r = client.patch(f"/v1/series/{sid}", headers=T, json={"repeat": {"every_s": 900}, "misfire": "skip"})
    assert r.status_code == 200 and r.json()["state"] == "paused", r.text
    assert client.post(f"/v1/series/{sid}/resume", headers=T).json() == \
        {"series_id": sid, "state": "active", "changed": True, "cancelled_run": None}
    s = series_row(pinned_conn, int(sid))
    assert (s["every_s"], s["misfire"], at(s["chain_after"])) == (900, "skip", T0)
    assert client.post(f"/v1/series/{sid}/cancel", headers=T).json()["state"] == "cancelled"
    assert client.post(f"/v1/series/{sid}/cancel", headers=T).json()["changed"] is False
    assert_problem(client.post(f"/v1/series/{sid}/resume", headers=T), 409, "conflict", "cannot be resumed")
    assert_problem(client.patch(f"/v1/series/{sid}", headers=T, json={"repeat": {"every_s": 60}}), 409,
                   "conflict", "cannot be changed")


def test_http_list_pages(client):
    ids = [client.post("/v1/jobs", headers=T, json={"name": f"s{i}", "repeat": {"every_s": 60}}).json()["series_id"]
           for i in range(5)]
    client.post("/v1/jobs", headers=U, json={"name": "other", "repeat": {"every_s": 60}})
    seen, cursor = [], None
    while True:
        r = client.get("/v1/series", headers=T, params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        seen += [s["series_id"] for s in r.json()["series"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, key=int, reverse=True)
    first = client.get("/v1/series", headers=T).json()["series"][0]
    assert first["repeat"]["every_s"] == 60 and first["state"] == "active" and first["name"] == "s4"


ROUTES = [("GET", "/v1/series/{id}", None), ("POST", "/v1/series/{id}/pause", None),
          ("POST", "/v1/series/{id}/resume", None), ("POST", "/v1/series/{id}/cancel", None),
          ("PATCH", "/v1/series/{id}", {"repeat": {"every_s": 60}})]


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_http_another_teams_or_an_unknown_series_is_404_and_writes_nothing(client, pinned_conn, method, path, body):
    sid = client.post("/v1/jobs", headers=T, json={"name": "mine", "repeat": {"every_s": 60}}).json()["series_id"]
    before = snapshot(pinned_conn)
    for headers, which, params in ((U, sid, {}), (T, str(int(sid) + 1024), {}), (A, sid, {"team": "u"}),
                                   (T, sid, {"team": "u"})):
        r = client.request(method, path.format(id=which), headers=headers, json=body, params=params)
        assert_problem(r, 404, "not-found")
    assert snapshot(pinned_conn) == before


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_http_bad_ids_are_4xx_and_write_nothing(client, pinned_conn, method, path, body):
    client.post("/v1/jobs", headers=T, json={"name": "mine", "repeat": {"every_s": 60}})
    before = snapshot(pinned_conn)
    for bad in ("abc", "12x", "1.5"):                                     # no such route
        assert_problem(client.request(method, path.format(id=bad), headers=T, json=body), 404, "not-found")
    assert_problem(client.request(method, path.format(id="99999999999999999999"), headers=T, json=body),
                   400, "malformed-request")
    r = client.request(method, path.format(id="1"), json=body)                # no token
    assert_problem(r, 401, "unauthorized")
    assert snapshot(pinned_conn) == before


@pytest.mark.parametrize("body, status, slug, detail", [
    ({"repeat": {"cron": "0 0 31 2 *"}}, 422, "invalid-input", "does not fire within 366 days"),
    ({"repeat": {"cron": "61 * * * *"}}, 422, "invalid-input", "not a 5-field"),
    ({"repeat": {"cron": "0 3 * * *", "timezone": "Mars/Olympus"}}, 422, "invalid-input", "IANA"),
    ({"repeat": {"cron": "0 3 * * *", "timezone": "CEST"}}, 422, "invalid-input", "IANA"),
    ({"repeat": {"cron": "0 3 * * *", "timezone": "localtime"}}, 422, "invalid-input", "not an IANA time zone"),
    ({"repeat": {"cron": "0 3 * * *", "timezone": "posix/Europe/Berlin"}}, 422, "invalid-input", "not an IANA"),
    ({"repeat": {"cron": "0 3 * * *\n"}}, 422, "invalid-input", "has whitespace around it"),
    ({"repeat": {"every_s": 0}}, 422, "invalid-input", "between 1 and"),
    ({"repeat": {"every_s": "60"}}, 422, "invalid-input", "expected `int`"),
    ({"repeat": {"every_s": 60, "cron": "* * * * *"}}, 422, "invalid-input", "exactly one"),
    ({"repeat": {}}, 422, "invalid-input", "exactly one"),
    ({"repeat": {"every_s": 60}, "misfire": "sometimes"}, 422, "invalid-input", "misfire"),
    ({"repeat": {"every_s": 60}, "misfire": None}, 422, "invalid-input", "misfire"),
    ({"repeat": {"every_s": 60}, "extra": 1}, 422, "invalid-input", "unknown field `extra`"),
    ({"repeat": {"every_s": 60, "day": 1}}, 422, "invalid-input", "unknown field `day`"),
    ({"repeat": {"every_s": 60, "misfire": "skip"}}, 422, "invalid-input", "unknown field `misfire`"),  # top level
    ({"misfire": "skip"}, 422, "invalid-input", "repeat"),
    ([], 422, "invalid-input", "expected `object`"),
])
def test_http_bad_change_bodies_are_refused_and_write_nothing(client, pinned_conn, body, status, slug, detail):
    sid = client.post("/v1/jobs", headers=T, json={"name": "mine", "repeat": {"every_s": 60}}).json()["series_id"]
    before = snapshot(pinned_conn)
    assert_problem(client.patch(f"/v1/series/{sid}", headers=T, json=body), status, slug, detail)
    assert snapshot(pinned_conn) == before


def test_http_change_bodies_not_json_or_too_big_write_nothing(client, pinned_conn):
    sid = client.post("/v1/jobs", headers=T, json={"name": "mine", "repeat": {"every_s": 60}}).json()["series_id"]
    before = snapshot(pinned_conn)
    headers = {**T, "Content-Type": "application/json"}
    assert_problem(client.patch(f"/v1/series/{sid}", headers=headers, content=b"{not json"), 400,
                   "malformed-request", "not valid JSON")
    assert_problem(client.patch(f"/v1/series/{sid}", headers=headers, content=b""), 400, "malformed-request")
    big = json.dumps({"repeat": {"cron": "0 3 * * *", "timezone": "x" * 5000}}).encode()
    assert_problem(client.patch(f"/v1/series/{sid}", headers=headers, content=big), 413, "too-large")
    assert snapshot(pinned_conn) == before


@pytest.mark.parametrize("params, detail", [
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "x"}, "limit"),
    ({"cursor": "abc"}, "cursor"), ({"cursor": "99999999999999999999"}, "cursor"),
])
def test_http_bad_list_parameters_are_4xx(client, params, detail):
    r = client.get("/v1/series", headers=T, params=params)
    assert r.status_code in (400, 422), r.text
    assert detail in r.json()["detail"]


def test_http_routes_are_in_the_schema(client):
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert {"/v1/series", "/v1/series/{series_id}", "/v1/series/{series_id}/pause", "/v1/series/{series_id}/resume",
            "/v1/series/{series_id}/cancel"} <= set(paths)
    ops = {op["operationId"]: op for p in paths.values() for op in p.values() if isinstance(op, dict)
           and "operationId" in op}
    for name in ("getSeries", "listSeries", "pauseSeries", "resumeSeries", "cancelSeries", "changeSeries"):
        assert ops[name]["tags"] == ["series"] and ops[name]["security"] == [{"bearer": []}]


# ---------------------------------------------------------------- CLI
def test_cli_list_show_pause_resume_cancel(store, pinned_conn, module_dsn, capsys):
    sub = new_series(store, name="clied")
    sid = str(sub.series_id)

    def run(*argv: str) -> str:
        cli.main(["series", *argv, "--team", "t", "--database-url", module_dsn])
        return capsys.readouterr().out

    assert sid in run("list") and "clied" in run("list")
    assert "active" in run("show", sid)
    assert "paused" in run("pause", sid)
    assert series_row(pinned_conn, sub.series_id)["paused_at"] is not None
    assert "active" in run("resume", sid)
    assert "cancelled" in run("cancel", sid)
    with pytest.raises(SystemExit, match="no such series"):
        cli.main(["series", "show", sid, "--team", "u", "--database-url", module_dsn])


# ---------------------------------------------------------------- plans
def explain(conn, sql: str, params: dict) -> dict:
    raw = psycopg.ClientCursor(conn).execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0]
    doc = json.loads(raw) if isinstance(raw, str) else raw
    return router_plan(doc[0]["Plan"])


def nodes(plan: dict):
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def test_last_runs_read_one_shard_through_jobs_series_run(store, pinned_conn):
    """Among 60,000 runs of 300 series on every shard, a series' newest runs
    are read backwards through jobs_series_run on the series' shard: no scan
    of jobs, no other index, only the rows returned."""
    sub = new_series(store)
    with pinned_conn.transaction(force_rollback=True):
        pinned_conn.execute(
            """INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                                 max_attempts, backoff_base_s, backoff_cap_s, series_id, created_at, updated_at,
                                 agreed_at)
               SELECT s %% 256, ((s * 200 + g)::bigint * 1024 + s %% 256) + (1::bigint << 40), 1, 'filler', '{}', 0,
                      %(t)s + make_interval(mins => g), 0, false, %(t)s, 'succeeded', 3, 1, 3600,
                      1000000 + s, %(t)s, %(t)s, %(t)s
                 FROM generate_series(0, 299) s, generate_series(1, 200) g""", {"t": T0})
        for k in range(30):
            add_run(pinned_conn, sub.series_id, T0 + (k + 1) * 60 * S, "succeeded")
        pinned_conn.execute("ANALYZE jobs")
        plan = explain(pinned_conn, q("series_runs"), {"team": "t", "series_id": sub.series_id, "limit": 10})
        on_jobs = [n for n in nodes(plan) if n.get("Relation Name") == "jobs"]
        assert len(on_jobs) == 1, on_jobs
        [node] = on_jobs
        assert node["Node Type"] == "Index Scan" and node["Index Name"] == "jobs_series_run", node
        assert node["Scan Direction"] == "Backward"
        assert "shard" in node["Index Cond"] and "series_id" in node["Index Cond"]
        assert node["Actual Rows"] <= 10 and node["Actual Loops"] == 1
        assert plan["Actual Rows"] == 10
