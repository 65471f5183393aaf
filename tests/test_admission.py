"""Admission control: a team's submission rate (a token bucket in the
database, on the pinned clock mh_now()) and its ceiling of pending jobs.
Over either, a submission (single, batch, coalesced single, series) is
refused 429 and writes nothing, while other teams go on; the admin sets and
clears the limits (validated, 4xx), a team cannot; the pending count is kept
exact by every way a job is created or finishes.

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u', no limits)."""
from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from litestar.testing import TestClient

from minutehand.api.coalesce import SubmitCoalescer, _Pending
from minutehand.cli import main as cli
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import errors, migrate
from minutehand.store.outcomes import Complete, Fail, Release
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from minutehand.web.admission import Admission
from tests.support import T0, claim, counts, lease_all, submit_sql

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

ADMIN = "admin-secret-token"
TOKENS = {"t": "tok-team-t", "u": "tok-team-u"}
T = {"Authorization": f"Bearer {TOKENS['t']}"}
U = {"Authorization": f"Bearer {TOKENS['u']}"}
A = {"Authorization": f"Bearer {ADMIN}"}
JOB = {"name": "job", "payload": {"n": 1}}


@pytest.fixture(scope="module")
def client_module(module_store):
    # No memory of "no limit": a limit set in SQL by a test applies at once.
    settings = Settings(admin_token=ADMIN, admission_cache_s=0)
    with TestClient(build(settings, module_store, dispatch=False, head=migrate.head()).app) as c:
        yield c


@pytest.fixture
def conn(pinned_conn):
    for team, token in TOKENS.items():
        pinned_conn.execute("UPDATE teams SET token_hash = %s WHERE name = %s", (hash_token(token), team))
    return pinned_conn


@pytest.fixture
def client(conn, pinned_store, client_module):
    return client_module


def limit(conn, team: str = "t", *, rate: float | None = None, burst: int | None = None,
          max_pending: int | None = None) -> None:
    conn.execute("UPDATE teams SET submit_rate = %s, submit_burst = %s, max_pending = %s WHERE name = %s",
                 (rate, burst, max_pending, team))


def team_jobs(conn, team: str) -> int:
    return conn.execute("SELECT count(*) FROM jobs j JOIN teams t ON t.id = j.team_id WHERE t.name = %s",
                        (team,)).fetchone()[0]


def pending(conn, team: str) -> int:
    return conn.execute("SELECT coalesce(sum(p.pending), 0) FROM team_pending p JOIN teams t ON t.id = p.team_id "
                        "WHERE t.name = %s", (team,)).fetchone()[0]


def unfinished(conn, team: str) -> int:
    return conn.execute("SELECT count(*) FROM jobs j JOIN teams t ON t.id = j.team_id WHERE t.name = %s "
                        "AND j.state NOT IN ('succeeded', 'dead', 'cancelled')", (team,)).fetchone()[0]


def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status and body["type"] == f"/problems/{slug}", body
    assert detail.lower() in body["detail"].lower(), body
    return body


def batch(n: int) -> dict:
    return {"jobs": [{"name": "job", "payload": {"i": i}} for i in range(n)]}


# ---------------------------------------------------------------- the rate
def test_over_its_rate_a_team_gets_429_with_retry_after_and_nothing_is_written(client, conn):
    limit(conn, rate=0.5, burst=2)
    assert [client.post("/v1/jobs", json=JOB, headers=T).status_code for _ in range(2)] == [201, 201]
    before = counts(conn)
    r = client.post("/v1/jobs", json=JOB, headers=T)
    body = assert_problem(r, 429, "rate-limited", "0.5 jobs a second, up to 2 at once")
    assert r.headers["Retry-After"] == "2"         # one token at 0.5/s
    assert body["retry_after_s"] == 2
    assert counts(conn) == before and team_jobs(conn, "t") == 2
    # Another team is not held back by t's limit.
    assert [client.post("/v1/jobs", json=JOB, headers=U).status_code for _ in range(5)] == [201] * 5
    assert team_jobs(conn, "u") == 5


def test_tokens_refill_with_time_up_to_the_burst(client, conn, pinned_store):
    limit(conn, rate=2, burst=3)
    assert [client.post("/v1/jobs", json=JOB, headers=T).status_code for _ in range(4)] == [201, 201, 201, 429]
    pinned_store.clock = T0 + dt.timedelta(seconds=0.4)     # 0.8 token: not yet one
    r = client.post("/v1/jobs", json=JOB, headers=T)
    assert_problem(r, 429, "rate-limited")
    assert r.headers["Retry-After"] == "1"
    pinned_store.clock = T0 + dt.timedelta(seconds=1)       # 2 tokens
    assert [client.post("/v1/jobs", json=JOB, headers=T).status_code for _ in range(3)] == [201, 201, 429]
    pinned_store.clock = T0 + dt.timedelta(hours=1)         # refilled to the burst, no further
    assert [client.post("/v1/jobs", json=JOB, headers=T).status_code for _ in range(4)] == [201, 201, 201, 429]
    assert team_jobs(conn, "t") == 8


def test_the_bucket_is_written_without_waiting_for_a_wal_flush(conn):
    """Tokens are not worth a flush: the call's own transaction commits with
    synchronous_commit off (a crash may forget the last tokens taken)."""
    limit(conn, rate=1, burst=5)
    conn.execute("SET synchronous_commit = on")
    try:
        with conn.transaction():
            assert conn.execute("SELECT admitted FROM mh_admit('t', 2, 2, 0)").fetchone()[0] == 2
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"      # that transaction's alone
    finally:
        conn.execute("RESET synchronous_commit")
    assert conn.execute("SELECT tokens FROM team_buckets").fetchone()[0] == 3


def test_a_refusal_takes_no_tokens(client, conn, pinned_store):
    limit(conn, rate=1, burst=4)
    assert client.post("/v1/jobs/batch", json=batch(3), headers=T).status_code == 200
    for _ in range(3):                               # refused again and again: the bucket is not drained
        assert_problem(client.post("/v1/jobs/batch", json=batch(2), headers=T), 429, "rate-limited")
    pinned_store.clock = T0 + dt.timedelta(seconds=1)
    assert client.post("/v1/jobs/batch", json=batch(2), headers=T).status_code == 200
    assert team_jobs(conn, "t") == 5


def test_a_batch_counts_its_jobs_all_or_none(client, conn):
    limit(conn, rate=1, burst=5)
    r = client.post("/v1/jobs/batch", json=batch(3), headers=T)
    assert r.status_code == 200 and r.json()["created"] == 3
    before = counts(conn)
    r = client.post("/v1/jobs/batch", json=batch(3), headers=T)
    body = assert_problem(r, 429, "rate-limited", "3 jobs refused, nothing written")
    assert r.headers["Retry-After"] == "1" and body["retry_after_s"] == 1     # 2 left, 3 needed, 1/s
    assert counts(conn) == before
    r = client.post("/v1/jobs/batch", json=batch(2), headers=T)
    assert r.status_code == 200 and r.json()["created"] == 2
    assert team_jobs(conn, "t") == 5


def test_items_refused_by_their_shape_do_not_count(client, conn):
    limit(conn, rate=1, burst=2)
    body = {"jobs": [{"name": "job"}, {"name": 5}, {"nope": 1}, {"name": "job"}]}
    r = client.post("/v1/jobs/batch", json=body, headers=T)
    assert r.status_code == 200 and (r.json()["created"], r.json()["rejected"]) == (2, 2)


def test_a_batch_larger_than_the_burst_can_never_pass_and_says_so(client, conn, pinned_store):
    limit(conn, rate=100, burst=10)
    before = counts(conn)
    r = client.post("/v1/jobs/batch", json=batch(11), headers=T)
    assert_problem(r, 413, "too-large", "at most 10 at once")
    assert "Retry-After" not in r.headers
    assert counts(conn) == before


def test_a_series_counts_as_one_submission(client, conn):
    limit(conn, rate=1, burst=1)
    series = {"name": "tick", "repeat": {"every_s": 60}}
    assert client.post("/v1/jobs", json=series, headers=T).status_code == 201
    before = counts(conn), conn.execute("SELECT count(*) FROM series").fetchone()[0]
    r = client.post("/v1/jobs", json=series, headers=T)
    assert_problem(r, 429, "rate-limited")
    assert (counts(conn), conn.execute("SELECT count(*) FROM series").fetchone()[0]) == before


def test_concurrent_single_submissions_admit_exactly_the_burst(client, conn):
    """Requests that arrive together are coalesced into batch calls; each
    refused one gets its own 429, the others their 201."""
    limit(conn, rate=0.001, burst=7)
    statuses: list[int] = []
    go = threading.Barrier(20)

    def one() -> None:
        go.wait()
        statuses.append(client.post("/v1/jobs", json=JOB, headers=T).status_code)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(statuses) == [201] * 7 + [429] * 13
    assert team_jobs(conn, "t") == 7


def test_a_coalesced_batch_admits_what_fits_and_refuses_each_other_item_alone(conn, pinned_store):
    """One coalesced send: t's five requests against a burst of 3, u's two
    (no limit). t's first three and u's two are written; t's last two each
    get RateLimited; nothing else fails."""
    limit(conn, rate=1, burst=3)
    coalescer = SubmitCoalescer(pinned_store, Admission(pinned_store, Settings(admission_cache_s=0)))

    async def send() -> list:
        loop = asyncio.get_running_loop()
        group = [_Pending(team, JobSpec(name="job", payload={"i": i}), loop.create_future(), loop)
                 for i, team in enumerate(["t", "u", "t", "t", "t", "u", "t"])]
        await loop.run_in_executor(None, coalescer._send, group)
        return await asyncio.gather(*(p.future for p in group), return_exceptions=True)

    results = asyncio.run(send())
    kinds = [type(r).__name__ for r in results]
    assert kinds == ["Submitted", "Submitted", "Submitted", "Submitted", "RateLimited", "Submitted", "RateLimited"]
    assert results[4].retry_after_s == pytest.approx(1.0)
    assert (team_jobs(conn, "t"), team_jobs(conn, "u")) == (3, 2)


# ---------------------------------------------------------------- the pending ceiling
def test_a_submission_past_the_pending_ceiling_is_refused_with_the_count_and_the_ceiling(client, conn):
    limit(conn, max_pending=3)
    assert client.post("/v1/jobs/batch", json=batch(2), headers=T).status_code == 200
    before = counts(conn)
    r = client.post("/v1/jobs/batch", json=batch(2), headers=T)
    body = assert_problem(r, 429, "pending-ceiling", "has 2 jobs pending")
    assert "ceiling is 3" in body["detail"] and (body["pending"], body["ceiling"]) == (2, 3)
    assert "Retry-After" not in r.headers
    assert counts(conn) == before
    assert client.post("/v1/jobs", json=JOB, headers=T).status_code == 201
    body = assert_problem(client.post("/v1/jobs", json=JOB, headers=T), 429, "pending-ceiling", "has 3 jobs pending")
    assert client.post("/v1/jobs/batch", json=batch(4), headers=U).status_code == 200     # u has no ceiling


def test_finished_jobs_make_room_under_the_ceiling(client, conn, pinned_store):
    limit(conn, max_pending=2)
    ids = [client.post("/v1/jobs", json=JOB, headers=T).json()["job_id"] for _ in range(2)]
    assert_problem(client.post("/v1/jobs", json=JOB, headers=T), 429, "pending-ceiling")
    assert client.delete(f"/v1/jobs/{ids[0]}", headers=T).status_code == 200
    assert client.post("/v1/jobs", json=JOB, headers=T).status_code == 201
    assert_problem(client.post("/v1/jobs", json=JOB, headers=T), 429, "pending-ceiling")
    jobs = claim(pinned_store, lease_all(pinned_store), 10).jobs
    pinned_store.complete([Complete(jobs[0].job_id, jobs[0].lease_token)])
    assert client.post("/v1/jobs", json=JOB, headers=T).status_code == 201


def test_the_servers_ceiling_holds_every_team_without_its_own(conn, pinned_store):
    admission = Admission(pinned_store, Settings(max_pending_per_team=3))
    admission.admit_all("u", 3)
    submit_sql(conn, "u")
    submit_sql(conn, "u")
    with pytest.raises(errors.PendingCeiling) as refused:
        admission.admit_all("u", 2)
    assert (refused.value.pending, refused.value.ceiling) == (2, 3)
    assert admission.admit_some("u", 5)[0] == 1                # what fits, and the others' refusal
    limit(conn, "u", max_pending=10)                           # a team's own ceiling comes first
    admission.admit_all("u", 8)


def test_the_pending_count_follows_every_way_a_job_is_created_or_finishes(conn, pinned_store):
    for _ in range(3):
        submit_sql(conn, "t")                                  # SQL callers count too
    pinned_store.submit_many("t", [JobSpec(name="b", payload={}, max_attempts=1) for _ in range(4)])
    assert pending(conn, "t") == unfinished(conn, "t") == 7
    jobs = sorted(claim(pinned_store, lease_all(pinned_store), 10).jobs, key=lambda j: j.max_attempts)
    assert len(jobs) == 7 and pending(conn, "t") == 7          # claimed is not finished
    pinned_store.complete([Complete(jobs[0].job_id, jobs[0].lease_token)])
    pinned_store.fail([Fail(jobs[1].job_id, jobs[1].lease_token, "boom", retryable=False)])     # dead
    pinned_store.fail([Fail(jobs[-1].job_id, jobs[-1].lease_token, "again")])                   # retried
    assert pinned_store.cancel(jobs[2].job_id, "t").ok        # claimed: cancel requested of its worker ...
    assert pinned_store.release([Release(jobs[2].job_id, jobs[2].lease_token)])[0].state == "cancelled"   # ... given back
    states = conn.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1 ORDER BY 1").fetchall()
    assert states == [("cancelled", 1), ("claimed", 3), ("dead", 1), ("retrying", 1), ("succeeded", 1)]
    assert pending(conn, "t") == unfinished(conn, "t") == 4
    assert pending(conn, "u") == 0


# ---------------------------------------------------------------- setting the limits
def test_admin_sets_and_clears_the_limits(client, conn):
    r = client.patch("/v1/teams/t", json={"submit_rate": 2.5}, headers=A)
    assert r.status_code == 200, r.text
    assert (r.json()["submit_rate"], r.json()["submit_burst"], r.json()["max_pending"]) == (2.5, 3, None)
    r = client.patch("/v1/teams/t", json={"submit_burst": 40, "max_pending": 1000}, headers=A)
    assert (r.json()["submit_rate"], r.json()["submit_burst"], r.json()["max_pending"]) == (2.5, 40, 1000)
    r = client.patch("/v1/teams/t", json={"submit_rate": 10}, headers=A)         # the burst is kept
    assert (r.json()["submit_rate"], r.json()["submit_burst"]) == (10, 40)
    assert client.get("/v1/teams/t", headers=T).json()["submit_burst"] == 40     # the team reads its own
    r = client.patch("/v1/teams/t", json={"submit_rate": None, "max_pending": None}, headers=A)
    assert (r.json()["submit_rate"], r.json()["submit_burst"], r.json()["max_pending"]) == (None, None, None)
    assert [client.post("/v1/jobs", json=JOB, headers=T).status_code for _ in range(3)] == [201] * 3


def test_a_limit_set_applies_at_once_on_this_process(conn, pinned_store):
    settings = Settings(admin_token=ADMIN)                     # the default memory of "no limit"
    with TestClient(build(settings, pinned_store, dispatch=False, head=migrate.head()).app) as c:
        assert c.post("/v1/jobs", json=JOB, headers=T).status_code == 201        # t remembered unlimited
        assert c.patch("/v1/teams/t", json={"submit_rate": 1, "submit_burst": 1}, headers=A).status_code == 200
        assert c.post("/v1/jobs", json=JOB, headers=T).status_code == 201
        assert_problem(c.post("/v1/jobs", json=JOB, headers=T), 429, "rate-limited")


def test_a_team_is_created_with_limits_or_the_servers_defaults(conn, pinned_store):
    settings = Settings(admin_token=ADMIN, default_team_submit_rate=50.0)
    with TestClient(build(settings, pinned_store, dispatch=False, head=migrate.head()).app) as c:
        for name, body in [("v", {}), ("w", {"submit_rate": 2, "submit_burst": 9, "max_pending": 5}),
                           ("x", {"submit_rate": None})]:
            assert c.post("/v1/teams", json={"name": name, **body}, headers=A).status_code == 201
    rows = conn.execute("SELECT name, submit_rate, submit_burst, max_pending FROM teams WHERE name IN ('v', 'w', 'x') "
                        "ORDER BY name").fetchall()
    assert rows == [("v", 50.0, 50, None), ("w", 2.0, 9, 5), ("x", None, None, None)]


LIMITS = "SELECT submit_rate, submit_burst, max_pending FROM teams WHERE name = 't'"


@pytest.mark.parametrize("body, status, detail", [
    ({"submit_rate": 0}, 422, "submit_rate"),
    ({"submit_rate": -1}, 422, "submit_rate"),
    ({"submit_rate": 2_000_000}, 422, "submit_rate"),
    ({"submit_rate": "fast"}, 422, "submit_rate"),
    ({"submit_rate": 1, "submit_burst": 0}, 422, "submit_burst must be a whole number from 1"),
    ({"submit_rate": 1, "submit_burst": 1.5}, 422, "submit_burst"),
    ({"submit_burst": 10}, 422, "submit_burst goes with a submit_rate"),
    ({"submit_rate": 1, "submit_burst": None}, 422, "submit_burst goes with a submit_rate"),
    ({"max_pending": 0}, 422, "max_pending must be a whole number from 1"),
    ({"max_pending": 2**31}, 422, "max_pending"),
    ({}, 422, "give at least one of"),
])
def test_bad_limits_are_refused_and_change_nothing(client, conn, body, status, detail):
    limit(conn, max_pending=7)
    before = conn.execute(LIMITS).fetchone()
    r = client.patch("/v1/teams/t", json=body, headers=A)
    assert_problem(r, status, "invalid-input", detail)
    assert conn.execute(LIMITS).fetchone() == before


def test_creation_refuses_bad_limits_and_creates_nothing(client, conn):
    for body in ({"submit_rate": 0}, {"submit_burst": 3}, {"max_pending": -1}):
        assert_problem(client.post("/v1/teams", json={"name": "v", **body}, headers=A), 422, "invalid-input")
    assert conn.execute("SELECT count(*) FROM teams WHERE name = 'v'").fetchone()[0] == 0


def test_a_team_cannot_set_its_own_limits(client, conn):
    limit(conn, rate=1, burst=1, max_pending=5)
    before = conn.execute(LIMITS).fetchone()
    for body in ({"submit_rate": None}, {"max_pending": None}, {"submit_rate": 1000, "submit_burst": 1000}):
        assert_problem(client.patch("/v1/teams/t", json=body, headers=T), 403, "forbidden")
    assert conn.execute(LIMITS).fetchone() == before


def test_cli_sets_and_clears_the_limits(conn, module_dsn, capsys):
    cli.main(["team", "set", "t", "--submit-rate", "0.5", "--max-pending-jobs", "100", "--database-url", module_dsn])
    assert "submit rate 0.5/s, burst 1, max pending 100" in capsys.readouterr().out
    assert conn.execute(LIMITS).fetchone() == (0.5, 1, 100)
    cli.main(["team", "set", "t", "--submit-burst", "20", "--database-url", module_dsn])
    assert conn.execute(LIMITS).fetchone() == (0.5, 20, 100)
    cli.main(["team", "set", "t", "--submit-rate", "none", "--max-pending-jobs", "none", "--database-url", module_dsn])
    assert conn.execute(LIMITS).fetchone() == (None, None, None)
    with pytest.raises(SystemExit, match="submit_burst goes with a submit_rate"):
        cli.main(["team", "set", "t", "--submit-burst", "20", "--database-url", module_dsn])
    with pytest.raises(SystemExit):
        cli.main(["team", "set", "t", "--submit-rate", "0", "--database-url", module_dsn])
    assert "is not above 0" in capsys.readouterr().err
    assert conn.execute(LIMITS).fetchone() == (None, None, None)


def test_the_limits_and_refusals_are_in_the_schema(client):
    schema = client.get("/schema/openapi.json").json()
    team_out = schema["components"]["schemas"]["TeamOut"]["properties"]
    assert {"submit_rate", "submit_burst", "max_pending"} <= set(team_out)
    assert "429" in schema["paths"]["/v1/jobs"]["post"]["responses"]
    assert "429" in schema["paths"]["/v1/jobs/batch"]["post"]["responses"]
