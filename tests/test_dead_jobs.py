"""Dead jobs against a real PostgreSQL: requeue and discard (one job, and
every dead job of a team and name), through SQL inside a caller's
transaction, the Store and HTTP; every refusal changes nothing (the job
row and the row counts of every table it touches are compared before and
after); the dead letters (dead_jobs) and events written by the
transactions that make jobs dead (fail and claim expiry); the team's
events feed over HTTP (keyset paging, only its own team, cursor checks).

The tests of this module share one clone of the migrated template,
emptied before each test."""
from __future__ import annotations

import base64
import datetime as dt

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.errors import InvalidInput, NotFound
from minutehand.store.outcomes import Fail
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import AUTO_EXPLAIN_ON_CITUS, T0, claim as claim_shards, skip_on_citus

pytestmark = pytest.mark.reused_db

S = dt.timedelta(seconds=1)
ADMIN = "admin-secret-token"
TOKENS = {"t": "tok-team-t", "u": "tok-team-u"}
T = {"Authorization": f"Bearer {TOKENS['t']}"}
U = {"Authorization": f"Bearer {TOKENS['u']}"}
A = {"Authorization": f"Bearer {ADMIN}"}
TABLES = ("jobs", "dead_jobs", "job_events", "due_minutes", "due_hours", "due_far", "team_stats", "team_running")
COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)


# ---------------------------------------------------------------- helpers
def claim_of(store: Store, job_id: int):
    leases = store.take_leases([job_id & 1023], "d1", 3600)
    got = [c for c in claim_shards(store, leases, 100, "d1").jobs if c.job_id == job_id]
    assert len(got) == 1, f"job {job_id} was not claimable"
    return got[0]


def dead_job(store: Store, team: str = "t", name: str = "job", error: str = "boom", **kw) -> int:
    """A job of the team that failed on its last attempt."""
    job_id = store.submit(team, JobSpec(name=name, max_attempts=1, **kw)).job_id
    c = claim_of(store, job_id)
    assert store.fail([Fail(job_id, c.lease_token, error)])[0].state == "dead"
    return job_id


def job_row(conn: psycopg.Connection, job_id: int) -> dict | None:
    r = conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()
    return r[0] if r else None


def snapshot(conn: psycopg.Connection, job_id: int) -> tuple:
    return job_row(conn, job_id), conn.execute(COUNTS).fetchone()


def wheel_rows(conn: psycopg.Connection, job_id: int) -> int:
    return conn.execute("""SELECT (SELECT count(*) FROM due_minutes WHERE job_id = %(id)s)
                                + (SELECT count(*) FROM due_hours WHERE job_id = %(id)s)
                                + (SELECT count(*) FROM due_far WHERE job_id = %(id)s)""",
                        {"id": job_id}).fetchone()[0]


def dead_listed(conn: psycopg.Connection, job_id: int) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM dead_jobs WHERE job_id = %s)", (job_id,)).fetchone()[0]


def submitted_count(conn: psycopg.Connection, name: str = "job") -> int:
    return conn.execute("SELECT coalesce(sum(submitted), 0) FROM team_stats WHERE name = %s", (name,)).fetchone()[0]


@pytest.fixture
def store(pinned_store):
    pinned_store.clock = T0
    return pinned_store


@pytest.fixture
def conn(pinned_conn):
    return pinned_conn


# ---------------------------------------------------------------- becoming dead
def test_a_job_that_fails_its_last_attempt_is_listed_and_reported(store, conn):
    job_id = dead_job(store, error="disk full")
    assert dead_listed(conn, job_id)
    events = store.events("t")
    assert [(e.job_id, e.kind, e.name, e.attempts, e.max_attempts, e.error) for e in events] == \
        [(job_id, "dead", "job", 1, 1, "disk full")]
    assert events[0].at == T0


def test_a_retried_failure_is_neither_listed_nor_reported(store, conn):
    job_id = store.submit("t", JobSpec(name="job", max_attempts=2)).job_id
    c = claim_of(store, job_id)
    assert store.fail([Fail(job_id, c.lease_token, "once")])[0].state == "retrying"
    assert not dead_listed(conn, job_id)
    assert store.events("t") == []


def test_a_claim_that_expires_on_the_last_attempt_is_listed_and_reported(store, conn):
    job_id = store.submit("t", JobSpec(name="job", max_attempts=1)).job_id
    claim_of(store, job_id)
    store.clock = T0 + 60 * S
    assert store.expire_claims([job_id & 1023]) == (0, 1)
    assert dead_listed(conn, job_id)
    [event] = store.events("t")
    assert event.job_id == job_id and "claim expired" in event.error


# ---------------------------------------------------------------- requeue one
def test_requeue_puts_a_dead_job_back_due_now_with_a_new_life(store, conn):
    job_id = dead_job(store)
    store.clock = T0 + 600 * S
    outcome = store.requeue(job_id, "t")
    assert (outcome.ok, outcome.state) == (True, "scheduled")
    row = job_row(conn, job_id)
    assert row["state"] == "scheduled" and row["attempts"] == 0 and row["max_attempts"] == 1
    assert row["started_at"] is None and row["finished_at"] is None and row["claimed_at"] is None
    assert dt.datetime.fromisoformat(row["run_at"]) == T0 + 600 * S
    assert dt.datetime.fromisoformat(row["agreed_at"]) == T0 + 600 * S
    assert dt.datetime.fromisoformat(row["requeued_at"]) == T0 + 600 * S
    assert row["last_error"] == "boom"                  # kept until the next failure replaces it
    assert wheel_rows(conn, job_id) == 1 and not dead_listed(conn, job_id)
    assert submitted_count(conn) == 2                   # a new life counts as a submission
    c = claim_of(store, job_id)                         # due now: claimed again, attempt 1
    assert c.attempt == 1


def test_requeue_with_a_new_attempt_budget(store, conn):
    job_id = dead_job(store)
    assert store.requeue(job_id, "t", max_attempts=5).ok
    assert job_row(conn, job_id)["max_attempts"] == 5
    c = claim_of(store, job_id)
    assert store.fail([Fail(job_id, c.lease_token, "again")])[0].state == "retrying"


def test_a_requeued_job_that_dies_again_is_reported_again(store, conn):
    job_id = dead_job(store)
    assert store.requeue(job_id, "t").ok
    c = claim_of(store, job_id)
    assert store.fail([Fail(job_id, c.lease_token, "second")])[0].state == "dead"
    assert [e.error for e in store.events("t")] == ["boom", "second"]
    assert dead_listed(conn, job_id)


def test_requeue_of_a_job_that_is_not_dead_is_refused_and_writes_nothing(store, conn):
    job_id = store.submit("t", JobSpec(name="job")).job_id
    before = snapshot(conn, job_id)
    outcome = store.requeue(job_id, "t")
    assert (outcome.ok, outcome.state) == (False, "scheduled")
    assert "only a dead job can be requeued" in outcome.reason
    assert snapshot(conn, job_id) == before


def test_a_second_requeue_while_the_job_waits_again_is_refused(store, conn):
    job_id = dead_job(store)
    assert store.requeue(job_id, "t").ok
    before = snapshot(conn, job_id)
    outcome = store.requeue(job_id, "t")
    assert (outcome.ok, outcome.state) == (False, "scheduled")
    assert "already requeued" in outcome.reason
    assert snapshot(conn, job_id) == before


def test_requeue_of_another_teams_job_or_an_unknown_id_is_no_such_job(store, conn):
    job_id = dead_job(store, team="t")
    before = snapshot(conn, job_id)
    for jid, team in ((job_id, "u"), (job_id + 1024, "t"), (12345, "t")):
        outcome = store.requeue(jid, team)
        assert (outcome.ok, outcome.state, outcome.reason) == (False, None, "no such job")
    assert snapshot(conn, job_id) == before


@pytest.mark.parametrize("budget", [0, -1, 101])
def test_requeue_with_a_bad_attempt_budget_is_refused_and_writes_nothing(store, conn, budget):
    job_id = dead_job(store)
    before = snapshot(conn, job_id)
    with pytest.raises(InvalidInput, match="max_attempts must be between 1 and 100"):
        store.requeue(job_id, "t", max_attempts=budget)
    assert snapshot(conn, job_id) == before


def test_requeue_in_sql_inside_the_callers_transaction_is_undone_by_its_rollback(store, conn):
    job_id = dead_job(store)
    before = snapshot(conn, job_id)
    class CallersWorkFailed(Exception):
        pass

    with pytest.raises(CallersWorkFailed):
        with conn.transaction():
            row = conn.execute("SELECT ok, state::text FROM requeue_job(%s, 't', 4)", (job_id,)).fetchone()
            assert row == (True, "scheduled")
            assert wheel_rows(conn, job_id) == 1
            raise CallersWorkFailed
    assert snapshot(conn, job_id) == before
    assert conn.execute("SELECT ok FROM requeue_job(%s, 't')", (job_id,)).fetchone() == (True,)
    assert job_row(conn, job_id)["state"] == "scheduled"


def test_requeue_in_sql_needs_the_team(conn, store):
    job_id = dead_job(store)
    for team, sqlstate in ((None, "MH400"), ("nobody", "MH404")):
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT * FROM requeue_job(%s, %s)", (job_id, team))
        assert refused.value.sqlstate == sqlstate


# ---------------------------------------------------------------- discard one
def test_discard_sets_a_dead_job_aside_for_good(store, conn):
    job_id = dead_job(store)
    outcome = store.discard(job_id, "t")
    assert (outcome.ok, outcome.state) == (True, "discarded")
    row = job_row(conn, job_id)
    assert row["state"] == "discarded" and row["last_error"] == "boom"
    assert not dead_listed(conn, job_id) and wheel_rows(conn, job_id) == 0
    assert store.status(job_id, "t").state == "discarded"
    before = snapshot(conn, job_id)
    for act in (lambda: store.discard(job_id, "t"), lambda: store.requeue(job_id, "t")):
        refused = act()
        assert (refused.ok, refused.state) == (False, "discarded")
        assert "job is discarded: only a dead job can be" in refused.reason
    assert snapshot(conn, job_id) == before


def test_discard_refusals_write_nothing(store, conn):
    waiting = store.submit("t", JobSpec(name="job")).job_id
    before = snapshot(conn, waiting)
    assert store.discard(waiting, "t").state == "scheduled"
    assert store.discard(waiting, "u").reason == "no such job"
    assert store.discard(999, "t").reason == "no such job"
    assert snapshot(conn, waiting) == before


def test_the_admin_acts_through_the_jobs_own_team(store, conn):
    job_id = dead_job(store, team="u")
    assert store.requeue(job_id, None, max_attempts=2).ok
    assert job_row(conn, job_id)["max_attempts"] == 2
    assert store.requeue(77, None).reason == "no such job"


# ---------------------------------------------------------------- every dead job of a name
def test_requeue_dead_takes_every_dead_job_of_the_team_and_name_only(store, conn):
    mine = [dead_job(store, name="a") for _ in range(5)]
    other_name = dead_job(store, name="b")
    other_team = dead_job(store, team="u", name="a")
    done = store.requeue_dead("t", "a", max_attempts=3)
    assert (done.count, done.more) == (5, False)
    assert {job_row(conn, j)["state"] for j in mine} == {"scheduled"}
    assert {job_row(conn, j)["max_attempts"] for j in mine} == {3}
    assert all(wheel_rows(conn, j) == 1 for j in mine)
    assert job_row(conn, other_name)["state"] == "dead" and dead_listed(conn, other_name)
    assert job_row(conn, other_team)["state"] == "dead" and dead_listed(conn, other_team)
    assert store.requeue_dead("t", "a").count == 0


def test_requeue_dead_in_pages_says_when_more_remain(store, conn):
    jobs = [dead_job(store, name="a") for _ in range(5)]
    pages = []
    while True:
        done = store.requeue_dead("t", "a", limit=2)
        pages.append((done.count, done.more))
        if not done.more:
            break
    assert pages == [(2, True), (2, True), (1, False)]
    assert {job_row(conn, j)["state"] for j in jobs} == {"scheduled"}


def test_discard_dead_takes_every_dead_job_of_the_name(store, conn):
    jobs = [dead_job(store, name="a") for _ in range(3)]
    waiting = store.submit("t", JobSpec(name="a")).job_id
    done = store.discard_dead("t", "a")
    assert (done.count, done.more) == (3, False)
    assert {job_row(conn, j)["state"] for j in jobs} == {"discarded"}
    assert job_row(conn, waiting)["state"] == "scheduled"
    assert conn.execute("SELECT count(*) FROM dead_jobs").fetchone()[0] == 0


@pytest.mark.parametrize("call, message", [
    (lambda s: s.requeue_dead("t", "a", max_attempts=0), "max_attempts"),
    (lambda s: s.requeue_dead("t", "a", limit=0), "limit"),
    (lambda s: s.discard_dead("t", "a", limit=100_001), "limit"),
    (lambda s: s.requeue_dead("t", "no spaces"), "name must be"),
])
def test_bulk_refusals_write_nothing(store, conn, call, message):
    job_id = dead_job(store, name="a")
    before = snapshot(conn, job_id)
    with pytest.raises(InvalidInput, match=message):
        call(store)
    assert snapshot(conn, job_id) == before


def test_bulk_of_an_unknown_team_is_not_found(store):
    with pytest.raises(NotFound):
        store.requeue_dead("nobody", "a")


def test_bulk_walks_dead_jobs_shard_by_shard_through_its_key(conn):
    """The statement that reads a shard's dead letters probes dead_jobs'
    primary key with the shard, team and name: it reads neither jobs nor
    other teams' or names' letters. (Over letters on every shard, analysed:
    on an empty table the planner may as well take the admin UI's
    dead_jobs_by_team, which reads the same rows there.)"""
    with conn.transaction(force_rollback=True):
        conn.execute("""INSERT INTO dead_jobs (shard, team_id, name, job_id)
                        SELECT g % 256, 1, 'a', g FROM generate_series(1, 20000) g""")
        conn.execute("ANALYZE dead_jobs")
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT d.job_id FROM dead_jobs d WHERE d.shard = 7 AND d.team_id = 1 AND d.name = 'a' "
            "ORDER BY d.job_id LIMIT 100"))
    assert "dead_jobs_pkey" in plan and "jobs " not in plan.replace("dead_jobs", "")
    assert "Index Cond: ((shard = 7) AND (team_id = 1) AND (name = 'a'::text))" in plan


# ---------------------------------------------------------------- over HTTP
@pytest.fixture(scope="module")
def client_module(module_dsn):
    s = Store(module_dsn, max_size=4, pool_options={"timeout": 5})
    # No memory of "no limit": a limit set in SQL by a test applies at once.
    settings = Settings(admin_token=ADMIN, admission_cache_s=0)
    with TestClient(build(settings, s, dispatch=False, head=migrate.head()).app) as c:
        yield c
    s.close()


@pytest.fixture
def client(client_module, conn, store):
    conn.execute("UPDATE teams SET token_hash = CASE name WHEN 't' THEN %s WHEN 'u' THEN %s END",
                 (hash_token(TOKENS["t"]), hash_token(TOKENS["u"])))
    return client_module


def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == f"/problems/{slug}", body
    assert detail.lower() in body["detail"].lower(), body
    return body


def test_http_requeue_and_discard(client, store, conn):
    a, b = dead_job(store), dead_job(store)
    r = client.post(f"/v1/jobs/{a}/requeue?max_attempts=4", headers=T)
    assert r.status_code == 200, r.text
    assert r.json() == {"job_id": str(a), "state": "scheduled"}
    assert job_row(conn, a)["max_attempts"] == 4
    r = client.post(f"/v1/jobs/{b}/discard", headers=T)
    assert r.json() == {"job_id": str(b), "state": "discarded"}
    assert client.get(f"/v1/jobs/{b}", headers=T).json()["state"] == "discarded"


def test_http_requeue_refusals_are_4xx_and_write_nothing(client, store, conn):
    job_id = dead_job(store)
    waiting = store.submit("t", JobSpec(name="job")).job_id
    before = snapshot(conn, job_id), snapshot(conn, waiting)
    assert_problem(client.post(f"/v1/jobs/{job_id}/requeue", headers=U), 404, "not-found", f"no job {job_id}")
    assert_problem(client.post("/v1/jobs/424242/requeue", headers=T), 404, "not-found")
    body = assert_problem(client.post(f"/v1/jobs/{waiting}/requeue", headers=T), 409, "not-dead",
                          "only a dead job can be requeued")
    assert body["state"] == "scheduled" and body["job_id"] == str(waiting)
    for budget in (0, 101):
        assert_problem(client.post(f"/v1/jobs/{job_id}/requeue?max_attempts={budget}", headers=T), 422,
                       "invalid-input", "max_attempts")
    assert_problem(client.post(f"/v1/jobs/{job_id}/requeue?max_attempts=x", headers=T), 400, "malformed-request")
    assert_problem(client.post(f"/v1/jobs/{waiting}/discard", headers=T), 409, "not-dead", "scheduled")
    assert_problem(client.post(f"/v1/jobs/{job_id}/discard", headers=U), 404, "not-found")
    assert (snapshot(conn, job_id), snapshot(conn, waiting)) == before
    assert client.post(f"/v1/jobs/{job_id}/requeue", headers=T).status_code == 200
    assert_problem(client.post(f"/v1/jobs/{job_id}/requeue", headers=T), 409, "not-dead", "already requeued")


def test_http_admin_requeues_any_teams_job(client, store, conn):
    job_id = dead_job(store, team="u")
    assert client.post(f"/v1/jobs/{job_id}/requeue", headers=A).status_code == 200
    other = dead_job(store, team="u")
    assert_problem(client.post(f"/v1/jobs/{other}/discard?team=t", headers=A), 404, "not-found")
    assert client.post(f"/v1/jobs/{other}/discard?team=u", headers=A).json()["state"] == "discarded"


def test_http_bulk_requeue_and_discard(client, store, conn):
    jobs = [dead_job(store, name="a") for _ in range(3)]
    r = client.post("/v1/dead/requeue", json={"name": "a", "limit": 2}, headers=T)
    assert r.json() == {"requeued": 2, "more": True}
    r = client.post("/v1/dead/requeue", json={"name": "a", "max_attempts": 7}, headers=T)
    assert r.json() == {"requeued": 1, "more": False}
    more = [dead_job(store, team="u", name="a") for _ in range(2)]
    assert client.post("/v1/dead/discard", json={"name": "a"}, headers=T).json() == {"discarded": 0, "more": False}
    assert client.post("/v1/dead/discard?team=u", json={"name": "a"}, headers=A).json() == \
        {"discarded": 2, "more": False}
    assert {job_row(conn, j)["state"] for j in jobs} == {"scheduled"}
    assert {job_row(conn, j)["state"] for j in more} == {"discarded"}


@pytest.mark.parametrize("body, status, slug", [
    ({"name": "a", "max_attempts": 0}, 422, "invalid-input"),
    ({"name": "a", "limit": 0}, 422, "invalid-input"),
    ({"name": "bad name"}, 422, "invalid-input"),
    ({"name": "a", "extra": 1}, 422, "invalid-input"),
    ({}, 422, "invalid-input"),
    ({"name": "a", "max_attempts": "3"}, 422, "invalid-input"),
])
def test_http_bulk_refusals_write_nothing(client, store, conn, body, status, slug):
    job_id = dead_job(store, name="a")
    before = snapshot(conn, job_id)
    r = client.post("/v1/dead/requeue", json=body, headers=T)
    assert r.status_code in (400, 422), r.text
    assert snapshot(conn, job_id) == before


def test_http_bulk_needs_a_team_for_the_admin(client):
    assert_problem(client.post("/v1/dead/requeue", json={"name": "a"}, headers=A), 422, "invalid-input", "?team=")
    assert_problem(client.post("/v1/dead/requeue?team=nobody", json={"name": "a"}, headers=A), 404, "not-found")
    assert_problem(client.post("/v1/dead/requeue?team=u", json={"name": "a"}, headers=T), 404, "not-found")


# ---------------------------------------------------------------- requeues are admitted
def limit(conn, *, rate: float | None = None, burst: int | None = None, max_pending: int | None = None) -> None:
    conn.execute("UPDATE teams SET submit_rate = %s, submit_burst = %s, max_pending = %s WHERE name = 't'",
                 (rate, burst, max_pending))


def test_http_requeue_past_the_pending_ceiling_is_429_and_requeues_nothing(client, store, conn):
    job_id = dead_job(store)
    store.submit("t", JobSpec(name="waiting"))
    limit(conn, max_pending=1)
    before = snapshot(conn, job_id)
    body = assert_problem(client.post(f"/v1/jobs/{job_id}/requeue", headers=T), 429, "pending-ceiling",
                          "has 1 jobs pending")
    assert (body["pending"], body["ceiling"]) == (1, 1)
    assert_problem(client.post(f"/v1/jobs/{job_id}/requeue", headers=A), 429, "pending-ceiling")
    assert_problem(client.post("/v1/dead/requeue", json={"name": "job"}, headers=T), 429, "pending-ceiling")
    assert snapshot(conn, job_id) == before and dead_listed(conn, job_id)
    limit(conn, max_pending=2)
    assert client.post("/v1/dead/requeue", json={"name": "job"}, headers=T).json() == {"requeued": 1, "more": False}


def test_http_requeue_over_the_rate_is_429_with_retry_after_and_requeues_nothing(client, store, conn):
    jobs = [dead_job(store) for _ in range(3)]
    limit(conn, rate=0.001, burst=2)                       # two tokens, the next in 1,000 s
    assert client.post(f"/v1/jobs/{jobs[0]}/requeue", headers=T).status_code == 200
    before = [snapshot(conn, j) for j in jobs[1:]]
    r = client.post("/v1/dead/requeue", json={"name": "job"}, headers=T)       # two dead, one token: none
    body = assert_problem(r, 429, "rate-limited", "2 jobs refused, nothing written")
    assert 990 <= int(r.headers["Retry-After"]) == body["retry_after_s"] <= 1000
    assert [snapshot(conn, j) for j in jobs[1:]] == before
    assert client.post("/v1/dead/requeue", json={"name": "job", "limit": 1}, headers=T).json() == \
        {"requeued": 1, "more": True}
    left = next(j for j in jobs[1:] if dead_listed(conn, j))
    r = client.post(f"/v1/jobs/{left}/requeue", headers=T)
    assert_problem(r, 429, "rate-limited")
    assert int(r.headers["Retry-After"]) > 900 and dead_listed(conn, left)


def test_http_requeue_by_name_of_more_than_the_burst_is_413_and_bad_input_422(client, store, conn):
    jobs = [dead_job(store) for _ in range(3)]
    limit(conn, rate=100, burst=2)
    before = [snapshot(conn, j) for j in jobs]
    assert_problem(client.post("/v1/dead/requeue", json={"name": "job"}, headers=T), 413, "too-large",
                   "a smaller limit")
    assert_problem(client.post("/v1/dead/requeue", json={"name": "bad name"}, headers=T), 422, "invalid-input")
    assert_problem(client.post("/v1/dead/requeue", json={"name": "job", "max_attempts": 0}, headers=T), 422,
                   "invalid-input", "max_attempts")
    assert [snapshot(conn, j) for j in jobs] == before
    assert client.post("/v1/dead/requeue", json={"name": "job", "limit": 2}, headers=T).json() == \
        {"requeued": 2, "more": True}
    assert client.post("/v1/dead/requeue", json={"name": "nothing"}, headers=T).json() == \
        {"requeued": 0, "more": False}


# ---------------------------------------------------------------- the events feed
def test_the_feed_pages_by_keyset_in_commit_order(client, store):
    jobs = [dead_job(store, name=f"n{i}") for i in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        r = client.get("/v1/teams/me/events", params={"limit": 2, **({"after": cursor} if cursor else {})},
                       headers=T)
        assert r.status_code == 200, r.text
        page = r.json()
        pages += 1
        if not page["events"]:
            assert page["next_cursor"] == cursor            # nothing new: the same cursor to poll with
            break
        seen += page["events"]
        cursor = page["next_cursor"]
    assert pages == 4
    assert [e["job_id"] for e in seen] == [str(j) for j in jobs]
    assert len({e["event_id"] for e in seen}) == 5
    assert {e["kind"] for e in seen} == {"dead"} and seen[0]["error"] == "boom"
    later = dead_job(store, name="later")
    page = client.get("/v1/teams/me/events", params={"after": cursor}, headers=T).json()
    assert [e["job_id"] for e in page["events"]] == [str(later)]


def test_the_feed_shows_only_the_teams_own_events(client, store):
    mine = dead_job(store, team="t")
    theirs = dead_job(store, team="u")
    assert [e["job_id"] for e in client.get("/v1/teams/me/events", headers=T).json()["events"]] == [str(mine)]
    assert [e["job_id"] for e in client.get("/v1/teams/u/events", headers=U).json()["events"]] == [str(theirs)]
    assert_problem(client.get("/v1/teams/u/events", headers=T), 404, "not-found")
    assert [e["job_id"] for e in client.get("/v1/teams/u/events", headers=A).json()["events"]] == [str(theirs)]
    assert_problem(client.get("/v1/teams/me/events", headers=A), 422, "invalid-input", "name the team")
    assert_problem(client.get("/v1/teams/nobody/events", headers=A), 404, "not-found")


def test_an_event_shows_only_once_no_older_transaction_runs(client, store, module_dsn):
    """An event written by a transaction that has not committed, or by one
    younger than a transaction still running, is not shown yet: no event
    can later appear behind a cursor already handed out."""
    first = dead_job(store)
    with psycopg.connect(module_dsn, autocommit=False) as older:
        older.execute("SELECT pg_current_xact_id()")        # an older transaction, still running
        later = dead_job(store)
        page = client.get("/v1/teams/me/events", headers=T).json()
        assert [e["job_id"] for e in page["events"]] == [str(first)]
        older.rollback()
    page = client.get("/v1/teams/me/events", params={"after": page["next_cursor"]}, headers=T).json()
    assert [e["job_id"] for e in page["events"]] == [str(later)]


@pytest.mark.parametrize("cursor", ["x", "MTIz", base64.urlsafe_b64encode(b"1.-2").decode(),
                                    base64.urlsafe_b64encode(b"99999999999999999999999.1").decode(), "%00"])
def test_a_cursor_this_api_did_not_return_is_422(client, cursor):
    assert_problem(client.get("/v1/teams/me/events", params={"after": cursor}, headers=T), 422, "invalid-input",
                   "not a cursor this API returned")


@pytest.mark.parametrize("limit", ["0", "1001", "x"])
def test_a_bad_feed_limit_is_400(client, limit):
    r = client.get("/v1/teams/me/events", params={"limit": limit}, headers=T)
    assert r.status_code == 400, r.text


def test_events_are_purged_after_their_retention(store, conn):
    job_id = dead_job(store)
    store.clock = T0 + dt.timedelta(days=6)
    assert store.purge_events([job_id & 1023]) == 0
    store.clock = T0 + dt.timedelta(days=7, seconds=1)
    assert store.purge_events(range(256)) == 1
    assert store.events("t") == []
    assert dead_listed(conn, job_id)                    # the job stays dead, and requeueable
    assert store.requeue(job_id, "t").ok


# ---------------------------------------------------------------- the command line
def test_cli_requeues_discards_and_reads_events(store, conn, module_dsn, capsys):
    from minutehand.cli.main import main

    db = ["--database-url", module_dsn]
    a, c1, c2 = dead_job(store, name="a"), dead_job(store, name="c"), dead_job(store, name="c")
    main(["dead", "requeue", str(a), "--max-attempts", "4", *db])
    assert capsys.readouterr().out.strip() == f"job {a}: scheduled"
    assert job_row(conn, a)["max_attempts"] == 4
    with pytest.raises(SystemExit, match="already requeued"):
        main(["dead", "requeue", str(a), *db])
    with pytest.raises(SystemExit, match="no such job"):
        main(["dead", "discard", str(c1), "--team", "u", *db])
    main(["dead", "discard-name", "c", "--team", "t", *db])
    assert capsys.readouterr().out.strip() == "2 dead jobs of t/c discarded"
    assert {job_row(conn, j)["state"] for j in (c1, c2)} == {"discarded"}
    main(["dead", "events", "--team", "t", "--limit", "2", *db])
    lines = capsys.readouterr().out.splitlines()
    assert [f"job {j} " in line for j, line in zip((a, c1), lines)] == [True, True] and len(lines) == 3
    cursor = lines[-1].split("--after ")[1].rstrip(")")
    main(["dead", "events", "--team", "t", "--after", cursor, *db])
    assert f"job {c2} " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not a cursor"):
        main(["dead", "events", "--team", "t", "--after", "nonsense", *db])
    main(["team", "webhook", "t", "--url", "https://example.com/hook", "--secret", "s" * 20, *db])
    assert "s" * 20 in capsys.readouterr().out
    assert store.webhook("t").url == "https://example.com/hook"
    with pytest.raises(SystemExit, match="url must be"):
        main(["team", "webhook", "t", "--url", "ftp://x", *db])
    main(["team", "webhook", "t", "--remove", *db])
    assert store.webhook("t") is None


# ---------------------------------------------------------------- why dead jobs are found through dead_jobs
HOT_JOBS = 200


def updates_of_a_life(conn: psycopg.Connection, partial_index: bool) -> dict[str, tuple[int, int]]:
    """(updates, HOT updates) of jobs in the claim and in the failure that
    makes a job dead, for HOT_JOBS jobs, with or without a partial index
    WHERE state = 'dead' (in a transaction rolled back: nothing stays)."""
    counted = ("SELECT pg_stat_get_xact_tuples_updated('jobs'::regclass), "
               "pg_stat_get_xact_tuples_hot_updated('jobs'::regclass)")
    out = {}
    with conn.transaction(force_rollback=True):
        if partial_index:
            conn.execute("CREATE INDEX jobs_dead_probe ON jobs (team_id, name) WHERE state = 'dead'")
        conn.execute("SELECT count(*) FROM submit_jobs('t', array_fill('job'::text, ARRAY[%s]), "
                     "p_max_attempts => array_fill(1, ARRAY[%s]))", (HOT_JOBS, HOT_JOBS))
        before = conn.execute(counted).fetchone()
        claimed = conn.execute(
            "SELECT c.job_id, c.lease_token FROM generate_series(0, mh_shard_count() - 1) s, "
            "LATERAL claim_due(s, 1000, 'd1', take_shard_lease(s, 'd1', 3600), 30) c").fetchall()
        assert len(claimed) == HOT_JOBS
        after_claim = conn.execute(counted).fetchone()
        conn.execute("SELECT count(*) FROM fail_many(%s, %s, array_fill('boom'::text, ARRAY[%s]))",
                     ([c[0] for c in claimed], [c[1] for c in claimed], HOT_JOBS))
        after_fail = conn.execute(counted).fetchone()
        out["claim"] = (after_claim[0] - before[0], after_claim[1] - before[1])
        out["dead"] = (after_fail[0] - after_claim[0], after_fail[1] - after_claim[1])
    return out


def test_a_partial_index_on_dead_jobs_would_make_every_state_change_non_hot(conn, capsys):
    """Measured, not assumed: PostgreSQL decides HOT by the columns any
    index names, its predicate included. With no index on state, the claim
    and the failure that makes a job dead are HOT; a partial index WHERE
    state = 'dead' makes both non-HOT — every state change, not only the
    one into dead. Hence the dead_jobs table."""
    skip_on_citus(conn, "HOT is PostgreSQL's per-table decision, measured on plain PostgreSQL: on Citus the updates "
                        "happen in the workers' shard tables, which the coordinator's counters do not see")
    without = updates_of_a_life(conn, partial_index=False)
    with_index = updates_of_a_life(conn, partial_index=True)
    with capsys.disabled():
        print(f"\n(updates, HOT) of {HOT_JOBS} jobs: no index on state {without}; "
              f"partial index WHERE state = 'dead' {with_index}")
    assert without["claim"] == (HOT_JOBS, HOT_JOBS)
    # (Measured in one transaction, the claim's versions of a row cannot be
    # pruned before the failure's: a few pages run out of room, ~10%. Apart,
    # as they run, both are HOT.)
    assert without["dead"][0] == HOT_JOBS and without["dead"][1] >= 0.8 * HOT_JOBS
    assert with_index == {"claim": (HOT_JOBS, 0), "dead": (HOT_JOBS, 0)}


def test_the_feed_reads_its_index_from_the_position(conn):
    """A page of the feed is a range scan of job_events_feed from the
    position, whatever the table holds before it or for other teams (the
    statement inside mh_events_after, as auto_explain logs it)."""
    skip_on_citus(conn, AUTO_EXPLAIN_ON_CITUS)
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    with conn.transaction(force_rollback=True):
        for stmt in ("LOAD 'auto_explain'", "SET LOCAL auto_explain.log_min_duration = 0",
                     "SET LOCAL auto_explain.log_nested_statements = on", "SET LOCAL auto_explain.log_level = 'notice'",
                     "SET LOCAL enable_seqscan = off"):
            conn.execute(stmt)
        conn.execute("SELECT * FROM mh_events_after(1, '123'::xid8, 456, 100)").fetchall()
    (plan,) = [p for p in plans if "FROM job_events e" in p]
    assert "job_events_feed" in plan and "Sort" not in plan, plan
    assert "Index Cond: ((team_id = 1) AND (ROW(xid, id) > ROW('123'::xid8, '456'::bigint)) AND (xid < " in plan, plan


# ---------------------------------------------------------------- at the same time
def test_single_and_bulk_requeues_and_discards_at_once_settle_each_job_once(store, conn, module_dsn):
    """Threads requeue every dead job of the name in pages, requeue and
    discard them one by one, all at once: no deadlock, and each job ends
    requeued once (one wheel row, counted once) or discarded."""
    import random
    import threading

    from tests.support import lease_all, make_store

    n = 60
    ids = [b.job_id for b in store.submit_many("t", [JobSpec(name="a", max_attempts=1)] * n)]
    claimed = claim_shards(store, lease_all(store), 1000, "d1").jobs
    assert len(claimed) == n
    assert {o.state for o in store.fail([Fail(c.job_id, c.lease_token, "boom") for c in claimed])} == {"dead"}
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    deadlocks_before = conn.execute(deadlocks).fetchone()[0]
    racers = make_store(module_dsn, max_size=8)
    results: dict[str, list] = {"bulk": [], "single": [], "discard": []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def bulk() -> None:
        while (done := racers.requeue_dead("t", "a", limit=7)).count or done.more:
            results["bulk"].append(done.count)

    def one_by_one(action: str) -> None:
        for job_id in random.sample(ids, len(ids)):
            outcome = racers.requeue(job_id, "t") if action == "single" else racers.discard(job_id, "t")
            if outcome.ok:
                results[action].append(job_id)

    def run(target, *args) -> None:
        try:
            barrier.wait(30)
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=a, daemon=True)
               for a in ((bulk,), (bulk,), (one_by_one, "single"), (one_by_one, "single"), (one_by_one, "discard"))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a racer hung"
    finally:
        racers.close()
    assert not errors, errors
    requeued = sum(results["bulk"]) + len(results["single"])
    assert requeued + len(results["discard"]) == n
    states = dict(conn.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1").fetchall())
    assert states == {k: v for k, v in (("scheduled", requeued), ("discarded", len(results["discard"]))) if v}
    assert conn.execute("SELECT count(*) FROM due_minutes").fetchone()[0] == requeued
    assert submitted_count(conn, "a") == n + requeued
    assert conn.execute("SELECT count(*) FROM dead_jobs").fetchone()[0] == 0
    assert conn.execute(deadlocks).fetchone()[0] == deadlocks_before


def test_the_maintenance_duty_and_maintain_purge_old_events(store, conn):
    from minutehand.maintenance.schedule import MaintenanceSchedule

    old, recent = dead_job(store), None
    store.clock = T0 + dt.timedelta(days=3)
    recent = dead_job(store)
    store.clock = T0 + dt.timedelta(days=7, seconds=1)
    MaintenanceSchedule(store, "d1", lambda: list(range(256))).purge_events()
    assert [e.job_id for e in store.events("t")] == [recent]
    store.clock = T0 + dt.timedelta(days=10, seconds=1)
    assert store.maintain().events_purged == 1
    assert store.events("t") == [] and dead_listed(conn, old) and dead_listed(conn, recent)
