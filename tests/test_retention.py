"""Retention of finished jobs (sql/functions/retention.sql): under a pinned
clock, finished jobs (succeeded, dead, cancelled) older than their team's
retention are removed by retain_jobs, unfinished and recent ones stay, a job
finished just before the cut survives, a team's own retention overrides the
server's, a job the walk passed while it waited is removed once it finished,
a keyed job stays while its idempotency key names it, a claim held open in
another connection neither waits for retention nor is touched by it, the
maintenance duty runs it over its shards, and the status of a removed job
answers 404 "expired" (told apart from an id that cannot have been a job),
as does its cancel.

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u')."""
from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.maintenance.schedule import MaintenanceSchedule
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.outcomes import Complete, Fail
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import T0, claim, lease_all, make_store, pin, shard_count

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

DAY = 86400
RETENTION_S = 7 * DAY                  # the server's default
SECOND = dt.timedelta(seconds=1)
MS = dt.timedelta(milliseconds=1)
TOKEN_T = "tok-team-t"
T = {"Authorization": f"Bearer {TOKEN_T}"}
ADMIN = "admin-secret-token"
A = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def store(pinned_store):
    return pinned_store


@pytest.fixture
def leases(store):
    return lease_all(store)


def at(store, when: dt.datetime) -> None:
    store.clock = when


def retain(store, default_s: int = RETENTION_S) -> tuple[int, int]:
    """Passes over every shard until the walk and the filed jobs are done; (removed, deferred)."""
    removed = deferred = 0
    shards = list(range(shard_count(store)))
    while True:
        passed = store.retain(shards, default_s, limit=1000)
        removed += passed.removed
        deferred += passed.deferred
        if not passed.backlog:
            return removed, deferred


def exists(conn, job_id: int) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = %s)", (job_id,)).fetchone()[0]


def state(conn, job_id: int) -> str | None:
    row = conn.execute("SELECT state::text FROM jobs WHERE id = %s", (job_id,)).fetchone()
    return row[0] if row else None


def succeed(store, leases, team: str = "t", n: int = 1, **spec) -> list[int]:
    """n jobs due now, claimed and completed at the store's clock."""
    ids = [store.submit(team, JobSpec(name="job", **spec)).job_id for _ in range(n)]
    got = claim(store, leases, 100).jobs
    assert {j.job_id for j in got} >= set(ids)
    done = store.complete([Complete(j.job_id, j.lease_token) for j in got if j.job_id in ids])
    assert all(o.ok for o in done), done
    return ids


def die(store, leases) -> int:
    job_id = store.submit("t", JobSpec(name="job", max_attempts=1)).job_id
    (job,) = [j for j in claim(store, leases, 100).jobs if j.job_id == job_id]
    assert all(o.ok for o in store.fail([Fail(job_id, job.lease_token, "boom", retryable=False)]))
    return job_id


def cancelled(store) -> int:
    job_id = store.submit("t", JobSpec(name="job", due_at=store.clock + dt.timedelta(hours=1))).job_id
    assert store.cancel(job_id, "t").ok
    return job_id


# ---------------------------------------------------------------- what goes, what stays
def test_finished_jobs_past_the_retention_go_and_every_other_job_stays(store, leases, pinned_conn):
    ok, = succeed(store, leases)
    dead = die(store, leases)
    gone_cancelled = cancelled(store)
    waiting = store.submit("t", JobSpec(name="job", due_at=T0 + dt.timedelta(days=30))).job_id
    claimed = store.submit("t", JobSpec(name="job")).job_id
    assert [j.job_id for j in claim(store, leases, 100, lease_s=DAY).jobs] == [claimed]
    recent = store.submit("t", JobSpec(name="job", due_at=T0 + dt.timedelta(days=4))).job_id
    at(store, T0 + dt.timedelta(days=3))
    assert store.cancel(recent, "t").ok                 # finished on day 3
    assert state(pinned_conn, dead) == "dead" and state(pinned_conn, gone_cancelled) == "cancelled"

    assert [a.outcome for a in store.job_attempts(dead)] == ["dead"]

    at(store, T0 + dt.timedelta(days=7) + SECOND)
    removed, deferred = retain(store)
    assert removed == 3
    for job_id in (ok, dead, gone_cancelled):
        assert not exists(pinned_conn, job_id)
    assert store.job_attempts(dead) == []             # its history goes with it
    assert state(pinned_conn, waiting) == "scheduled"
    assert state(pinned_conn, claimed) == "claimed"
    assert state(pinned_conn, recent) == "cancelled"
    # the three kept were passed by the walk and filed for the earliest time they could go
    filed = dict(pinned_conn.execute("SELECT job_id, check_at FROM retention_checks").fetchall())
    assert filed == {waiting: T0 + dt.timedelta(days=37), claimed: store.clock + dt.timedelta(days=7),
                     recent: T0 + dt.timedelta(days=10)}
    assert deferred == 3

    # a second pass finds nothing new; the recent one goes when its time comes
    assert retain(store) == (0, 0)
    at(store, T0 + dt.timedelta(days=10) + SECOND)
    assert retain(store) == (1, 0)
    assert not exists(pinned_conn, recent)
    assert state(pinned_conn, waiting) == "scheduled" and state(pinned_conn, claimed) == "claimed"


def test_a_job_finished_just_before_the_cut_survives(store, leases, pinned_conn):
    job_id, = succeed(store, leases)
    at(store, T0 + dt.timedelta(seconds=RETENTION_S) - MS)
    assert retain(store) == (0, 1)
    assert exists(pinned_conn, job_id)
    at(store, T0 + dt.timedelta(seconds=RETENTION_S))         # exactly the retention: still kept
    assert retain(store) == (0, 1)
    assert exists(pinned_conn, job_id)
    at(store, T0 + dt.timedelta(seconds=RETENTION_S) + MS)
    assert retain(store) == (1, 0)
    assert not exists(pinned_conn, job_id)


def test_a_team_retention_overrides_the_default(store, leases, pinned_conn):
    store.update_team("u", retention_s=3600)
    store.update_team("t", retention_s=30 * DAY)
    short, = succeed(store, leases, team="u")
    long, = succeed(store, leases, team="t")
    at(store, T0 + dt.timedelta(hours=1) - MS)
    retain(store)
    assert exists(pinned_conn, short) and exists(pinned_conn, long)
    at(store, T0 + dt.timedelta(hours=1) + MS)
    retain(store)
    assert not exists(pinned_conn, short) and exists(pinned_conn, long)
    at(store, T0 + dt.timedelta(days=8))
    retain(store)
    assert exists(pinned_conn, long)                   # past the server's 7 days, within its team's 30
    at(store, T0 + dt.timedelta(days=30) + MS)
    retain(store)
    assert not exists(pinned_conn, long)
    # set back to the server's
    assert store.update_team("t", retention_s=None).retention_s is None
    assert store.team("u").retention_s == 3600


def test_a_job_passed_by_the_walk_while_claimed_goes_once_finished_and_past_its_retention(store, leases, pinned_conn):
    job_id = store.submit("t", JobSpec(name="job", max_attempts=1)).job_id
    assert [j.job_id for j in claim(store, leases, 100).jobs] == [job_id]
    at(store, T0 + dt.timedelta(days=8))
    assert retain(store) == (0, 1)                     # still claimed: filed for day 15
    at(store, T0 + dt.timedelta(days=9))
    assert store.expire_claims(range(shard_count(store))) == (0, 1)     # its last attempt lapsed: dead
    at(store, T0 + dt.timedelta(days=15) + SECOND)     # finished on day 9: goes on day 16
    assert retain(store) == (0, 1)
    assert state(pinned_conn, job_id) == "dead"
    at(store, T0 + dt.timedelta(days=16) + SECOND)
    assert retain(store) == (1, 0)
    assert not exists(pinned_conn, job_id)
    assert pinned_conn.execute("SELECT count(*) FROM retention_checks").fetchone()[0] == 0


def test_a_keyed_job_stays_while_its_key_names_it(store, leases, pinned_conn):
    store.update_team("t", retention_s=60)
    spec = JobSpec(name="job", idempotency_key="k1")
    job_id, = succeed(store, leases, idempotency_key="k1")
    at(store, T0 + dt.timedelta(hours=2))
    retain(store)
    assert exists(pinned_conn, job_id)
    again = store.submit("t", spec)                    # the key answers with its job, still readable
    assert (again.job_id, again.created) == (job_id, False) and again.run_at is not None
    at(store, T0 + dt.timedelta(hours=24) + SECOND)    # the key expired (24 h)
    retain(store)
    assert not exists(pinned_conn, job_id)
    fresh = store.submit("t", spec)                    # the key starts over with a new job
    assert fresh.created and fresh.job_id != job_id


# ---------------------------------------------------------------- beside claims
def test_a_claim_held_open_in_another_connection_is_neither_waited_for_nor_touched(store, leases, pinned_conn,
                                                                                  db_dsn):
    old, = succeed(store, leases)
    waiting = [store.submit("t", JobSpec(name="job")).job_id for _ in range(20)]
    shard = waiting[0] & 1023
    at(store, T0 + dt.timedelta(days=8))
    epoch = lease_all(store)[shard]
    with psycopg.connect(db_dsn) as claimer:              # a transaction, open until the end of the block
        pin(claimer, store.clock)
        claimer.execute("SET search_path = minutehand")
        rows = claimer.execute(
            "SELECT job_id FROM claim_due(%s, 100, 'd1', %s, 3600, 'w1', NULL, NULL)", (shard, epoch)).fetchall()
        held = [r[0] for r in rows]
        assert held and set(held) <= set(waiting)
        # retention runs in another connection while the claim's locks are held: it must not wait
        with psycopg.connect(db_dsn, autocommit=True) as other:
            pin(other, store.clock)
            other.execute("SET search_path = minutehand")
            other.execute("SET lock_timeout = '2s'")
            done = []
            runner = threading.Thread(target=lambda: done.append(
                [other.execute("SELECT removed FROM retain_jobs(%s, %s)", (s, RETENTION_S)).fetchone()[0]
                 for s in range(shard_count(store))]))
            runner.start()
            runner.join(30)
            assert not runner.is_alive() and sum(done[0]) == 1
        claimer.commit()
    assert not exists(pinned_conn, old)
    assert {state(pinned_conn, j) for j in held} == {"claimed"}
    assert all(state(pinned_conn, j) is not None for j in waiting)


def test_an_expired_claim_reminder_of_a_removed_job_is_harmless(store, leases, pinned_conn):
    job_id, = succeed(store, leases)               # its claim left a claim_checks row
    at(store, T0 + dt.timedelta(days=8))
    retain(store)
    assert not exists(pinned_conn, job_id)
    assert store.expire_claims(range(shard_count(store))) == (0, 0)


def test_the_maintenance_duty_retains_over_its_shards(store, leases, pinned_conn):
    job_id, = succeed(store, leases)
    shard = job_id & 1023
    at(store, T0 + dt.timedelta(days=8))
    MaintenanceSchedule(store, "d1", lambda: [s for s in range(256) if s != shard],
                        retention_s=RETENTION_S).retain_jobs()
    assert exists(pinned_conn, job_id)             # not one of its shards
    MaintenanceSchedule(store, "d1", lambda: [shard], retention_s=RETENTION_S).retain_jobs()
    assert not exists(pinned_conn, job_id)


def test_a_pass_calls_retain_jobs_only_where_one_statement_found_work(store, leases, pinned_conn, monkeypatch):
    """An idle pass is one statement (shards_with_retention_work), not a
    call per shard: a shard has work when jobs were filed for now or fell
    behind the walk's cut, or when it has no mark yet (its first walk)."""
    shards = list(range(shard_count(store)))
    store.retain(shards, RETENTION_S)              # every shard's first walk: its mark
    pinned_conn.execute("DELETE FROM retention_marks WHERE shard = 3")
    calls: list[list[int]] = []
    each_alone = store.each_alone

    def counted(conn, sql, params, rows=None):
        if "retain_jobs" in sql:
            calls.append([p["shard"] for p in params])
        return each_alone(conn, sql, params, rows)

    monkeypatch.setattr(store, "each_alone", counted)
    store.retain(shards, RETENTION_S)
    assert calls == [[3]]                           # the shard with no mark: its first walk
    job_id, = succeed(store, leases)
    shard = job_id & 1023
    calls.clear()
    store.retain(shards, RETENTION_S)               # (ids carry the real clock: behind the pinned cut)
    assert calls == [[shard]] and exists(pinned_conn, job_id)      # walked to, filed for later
    calls.clear()
    store.retain(shards, RETENTION_S)
    assert calls == []                              # nothing new anywhere: no call at all
    at(store, T0 + dt.timedelta(days=8))
    assert store.retain(shards, RETENTION_S).removed == 1
    assert calls[-1] == [shard]
    assert not exists(pinned_conn, job_id)


# ---------------------------------------------------------------- status of a removed job
@pytest.fixture(scope="module")
def api_store(module_dsn):
    s = make_store(module_dsn)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client_module(api_store):
    settings = Settings(admin_token=ADMIN, job_retention_s=RETENTION_S)
    with TestClient(build(settings, api_store, dispatch=False, head=migrate.head()).app) as c:
        yield c


@pytest.fixture
def client(pinned_conn, client_module, api_store):
    pinned_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TOKEN_T),))
    api_store.clock = T0
    return client_module


def id_made_at(when: dt.datetime, shard: int = 5) -> int:
    """A job id as mh_new_id makes it at `when` (sequence 0)."""
    return ((int(when.timestamp() * 1000) - 1735689600000) << 23) | shard


def test_status_of_a_removed_job_says_it_expired(store, leases, client, api_store, pinned_conn):
    job_id, = succeed(store, leases)
    assert client.get(f"/v1/jobs/{job_id}", headers=T).json()["state"] == "succeeded"
    at(store, T0 + dt.timedelta(days=8))
    api_store.clock = store.clock
    retain(store)
    assert not exists(pinned_conn, job_id)
    for headers, query in ((T, ""), (A, "")):
        r = client.get(f"/v1/jobs/{job_id}{query}", headers=headers)
        assert r.status_code == 404, r.text
        body = r.json()
        assert body["type"] == "/problems/not-found" and body["expired"] is True, body
        assert f"no job {job_id}: it expired" in body["detail"]
    r = client.delete(f"/v1/jobs/{job_id}", headers=T)       # cancel says the same
    assert r.status_code == 404 and r.json()["expired"] is True, r.text


def test_status_of_an_id_younger_than_the_retention_is_no_such_job(client, api_store):
    api_store.clock = T0
    for job_id in (id_made_at(T0 - dt.timedelta(days=6)),            # would still be kept
                   id_made_at(T0 + dt.timedelta(days=1)),            # made in the future
                   id_made_at(T0 - dt.timedelta(days=30), shard=1000)):   # no such shard
        r = client.get(f"/v1/jobs/{job_id}", headers=T)
        assert r.status_code == 404, r.text
        assert r.json()["expired"] is False and r.json()["detail"] == f"no job {job_id}"
    older = id_made_at(T0 - dt.timedelta(days=8))
    assert client.get(f"/v1/jobs/{older}", headers=T).json()["expired"] is True


def test_status_uses_the_teams_own_retention(client, api_store, store):
    store.update_team("t", retention_s=3600)
    api_store.clock = T0
    job_id = id_made_at(T0 - dt.timedelta(hours=2))
    assert client.get(f"/v1/jobs/{job_id}", headers=T).json()["expired"] is True
    store.update_team("t", retention_s=None)
    assert client.get(f"/v1/jobs/{job_id}", headers=T).json()["expired"] is False


# ---------------------------------------------------------------- a team's retention over HTTP
def retention_of(conn, team: str):
    return conn.execute("SELECT retention_s FROM teams WHERE name = %s", (team,)).fetchone()[0]


def test_admin_sets_and_clears_a_teams_retention(client, pinned_conn):
    r = client.patch("/v1/teams/t", headers=A, json={"retention_s": 86400})
    assert r.status_code == 200, r.text
    assert r.json()["retention_s"] == 86400 and r.json()["quota"] == 1000
    assert retention_of(pinned_conn, "t") == 86400
    assert client.get("/v1/teams/t", headers=A).json()["retention_s"] == 86400
    assert client.patch("/v1/teams/t", headers=A, json={"quota": 9}).json()["retention_s"] == 86400   # kept
    r = client.patch("/v1/teams/t", headers=A, json={"retention_s": None})
    assert r.status_code == 200 and r.json()["retention_s"] is None
    assert retention_of(pinned_conn, "t") is None
    r = client.post("/v1/teams", headers=A, json={"name": "keeper", "retention_s": 120})
    assert r.status_code == 201, r.text
    assert retention_of(pinned_conn, "keeper") == 120


@pytest.mark.parametrize("value", [0, -1, 315_360_001, 2**31, "60", 1.5, True, [60]])
def test_a_bad_retention_is_refused_and_nothing_changes(client, pinned_conn, value):
    before = pinned_conn.execute("SELECT * FROM teams ORDER BY name").fetchall()
    for r in (client.patch("/v1/teams/t", headers=A, json={"retention_s": value, "quota": 5}),
              client.post("/v1/teams", headers=A, json={"name": "bad", "retention_s": value})):
        assert r.status_code in (400, 422), r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "retention_s" in r.json()["detail"]
    assert pinned_conn.execute("SELECT * FROM teams ORDER BY name").fetchall() == before


def test_only_the_admin_sets_a_retention(client, pinned_conn):
    r = client.patch("/v1/teams/t", headers=T, json={"retention_s": 60})
    assert r.status_code == 403, r.text
    assert retention_of(pinned_conn, "t") is None
    assert client.patch("/v1/teams/nobody", headers=A, json={"retention_s": 60}).status_code == 404


# ---------------------------------------------------------------- the setting
def test_the_retention_setting_is_seven_days_unless_set():
    assert Settings().job_retention_s == 7 * DAY
    assert Settings.load(["--job-retention-s", "20"], env={}).job_retention_s == 20


@pytest.mark.parametrize("name, raw", [("job_retention_s", "0"), ("job_retention_s", "-1"),
                                       ("job_retention_s", "315360001"), ("job_retention_s", "1.5"),
                                       ("job_retention_s", "week"), ("retention_batch", "0")])
def test_a_bad_retention_setting_is_refused_with_its_name(name, raw):
    with pytest.raises(SystemExit) as exc:
        Settings.load([], env={f"MINUTEHAND_{name.upper()}": raw})
    assert name in str(exc.value)
