"""The submitter HTTP API against a real PostgreSQL, through Litestar's test
client: each endpoint's happy path, each refusal (status, problem type,
title, detail, and that nothing was written), idempotency under concurrency,
isolation between teams, authentication, and that the OpenAPI schema it
serves refuses and accepts what the server does (and OPTIONS lists its methods).

The tests of this module share one clone of the migrated template, emptied
before each test (marked reused_db, tests/fixtures/databases.py); teams 't' and 'u' get the tokens below."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import re

import jsonschema_rs
import psycopg
import pytest
from litestar.testing import AsyncTestClient, TestClient

from minutehand.api.app import create_app
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.version import VERSION
from minutehand.store import migrate
from minutehand.store.outcomes import Complete, Fail, Release, Start
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import claim

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

UTC = dt.timezone.utc
ADMIN = "admin-secret-token"
TOKENS = {"t": "tok-team-t", "u": "tok-team-u"}
T = {"Authorization": f"Bearer {TOKENS['t']}"}
U = {"Authorization": f"Bearer {TOKENS['u']}"}
A = {"Authorization": f"Bearer {ADMIN}"}
TABLES = ("jobs", "series", "due_minutes", "due_hours", "due_far", "idempotency_keys", "teams")
COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)
HEAD = migrate.head()


def settings(**kw) -> Settings:
    return Settings(admin_token=ADMIN, **kw)


@pytest.fixture(scope="module")
def api_store(module_dsn):
    s = Store(module_dsn, max_size=8, pool_options={"timeout": 5})
    yield s
    s.close()


@pytest.fixture(scope="module")
def client_module(api_store):
    with TestClient(build(settings(), api_store, dispatch=False, head=HEAD).app) as c:
        yield c


@pytest.fixture
def client(db_dsn, module_conn, client_module):
    module_conn.execute("UPDATE teams SET token_hash = CASE name WHEN 't' THEN %s WHEN 'u' THEN %s END",
                        (hash_token(TOKENS["t"]), hash_token(TOKENS["u"])))
    return client_module


@pytest.fixture
def conn(db_dsn, module_conn):
    return module_conn


def counts(conn) -> dict[str, int]:
    return dict(zip(TABLES, conn.execute(COUNTS).fetchone()))


def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status
    assert body["type"] == f"/problems/{slug}", body
    assert body["title"]
    assert detail.lower() in body["detail"].lower(), body
    return body


def job_state(conn, job_id) -> str | None:
    row = conn.execute("SELECT state::text FROM jobs WHERE id = %s", (int(job_id),)).fetchone()
    return row[0] if row else None


# ---------------------------------------------------------------- submit
def test_submit_returns_id_and_run_time_and_writes_the_job(client, conn):
    due = dt.datetime.now(UTC) + dt.timedelta(hours=2)
    r = client.post("/v1/jobs", headers=T, json={"name": "mail.send", "due_at": due.isoformat(),
                                                  "payload": {"to": "a@b"}, "priority": 5, "strict": True})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] is True and isinstance(body["job_id"], str)
    assert dt.datetime.fromisoformat(body["run_at"]) == due
    row = conn.execute("SELECT name, payload, priority, strict, state::text FROM jobs WHERE id = %s",
                       (int(body["job_id"]),)).fetchone()
    assert row == ("mail.send", {"to": "a@b"}, 5, True, "scheduled")


def test_submit_with_only_a_name_is_due_now(client, conn):
    before = dt.datetime.now(UTC)
    r = client.post("/v1/jobs", headers=T, json={"name": "now"})
    assert r.status_code == 201, r.text
    assert dt.datetime.fromisoformat(r.json()["run_at"]) >= before - dt.timedelta(seconds=1)


def test_http_submissions_without_a_window_get_the_default_of_their_name(client, conn, api_store):
    """Single POSTs (coalesced into one batch call) and batches with no strict item alike."""
    api_store.set_flex_default(None, "nightly", 3600)
    due = (dt.datetime.now(UTC) + dt.timedelta(hours=2)).isoformat()
    single = client.post("/v1/jobs", headers=T, json={"name": "nightly", "due_at": due})
    batch = client.post("/v1/jobs/batch", headers=T, json={"jobs": [{"name": "nightly", "due_at": due}] * 3})
    strict = client.post("/v1/jobs", headers=T, json={"name": "nightly", "due_at": due, "strict": True})
    assert (single.status_code, batch.status_code, strict.status_code) == (201, 200, 201), (single.text, batch.text)
    ids = [int(single.json()["job_id"]), *(int(i["job_id"]) for i in batch.json()["items"])]
    flex = dict(conn.execute("SELECT id, flex_s FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall())
    assert [flex[i] for i in ids] == [3600] * 4
    assert conn.execute("SELECT flex_s FROM jobs WHERE id = %s", (int(strict.json()["job_id"]),)).fetchone()[0] == 0


BIG = "x" * 270_000          # payload over 256 KiB as JSON, body under the 320 KiB request limit


@pytest.mark.parametrize("body, status, slug, detail", [
    (b"", 400, "malformed-request", "not valid JSON"),
    (b"{\"name\": ", 400, "malformed-request", "not valid JSON"),
    (b"[1, 2]", 422, "invalid-input", "expected `object`"),
    ({"name": "a", "colour": "red"}, 422, "invalid-input", "unknown field `colour`"),
    ({"payload": {}}, 422, "invalid-input", "missing required field `name`"),
    ({"name": "a", "priority": "high"}, 422, "invalid-input", "expected `int`"),
    ({"name": "a", "strict": "yes"}, 422, "invalid-input", "expected `bool`"),
    ({"name": "a", "due_at": "2030-01-01T00:00:00"}, 422, "invalid-input", "timezone"),
    ({"name": "a", "due_at": 1900000000}, 422, "invalid-input", "expected `datetime"),
    ({"name": "a", "due_at": "tomorrow"}, 422, "invalid-input", "datetime"),
    ({"name": "a", "due_at": "2099-01-01T00:00:00Z"}, 422, "invalid-input", "ahead"),
    ({"name": "no spaces"}, 422, "invalid-input", "name must be"),
    ({"name": ""}, 422, "invalid-input", "name must be"),
    ({"name": "a", "priority": 101}, 422, "invalid-input", "priority must be between"),
    ({"name": "a", "priority": 2**40}, 422, "invalid-input", "out of range"),
    ({"name": "a", "max_attempts": 0}, 422, "invalid-input", "max_attempts"),
    ({"name": "a", "flex_s": 10, "strict": True}, 422, "invalid-input", "strict job cannot have a flex"),
    ({"name": "a", "backoff_base_s": 5, "backoff_cap_s": 1}, 422, "invalid-input", "backoff cap"),
    ({"name": "a\u0000b"}, 422, "invalid-input", "cannot be stored"),
    ({"name": "a", "payload": {"k": "\u0000"}}, 422, "invalid-input", "cannot be stored"),
    ({"name": "a", "payload": {"blob": BIG}}, 413, "too-large", "over the limit"),
    ({"name": "a", "payload": {"blob": "x" * 400_000}}, 413, "too-large", "larger than this endpoint accepts"),
    ({"name": "a", "repeat": {"every_s": 0}}, 422, "invalid-input", "every_s must be between"),
    ({"name": "a", "repeat": {"cron": "0 0 31 2 *"}}, 422, "invalid-input", "does not fire within"),
    ({"name": "a", "repeat": {"cron": "61 * * * *"}}, 422, "invalid-input", "not a 5-field crontab"),
    ({"name": "a", "repeat": {"cron": "0 3 * * *", "timezone": "Mars/Olympus"}}, 422, "invalid-input",
     "IANA time zone"),
    ({"name": "a", "repeat": {"cron": "0 3 * * *", "every_s": 5}}, 422, "invalid-input", "exactly one"),
    ({"name": "a", "repeat": {"every_s": 5, "timezone": "UTC"}}, 422, "invalid-input", "goes with cron"),
    # numbers no JSON reader holds (beyond a double): jsonb would keep them, no worker could read them
    (b'{"name": "a", "payload": {"x": 1e400}}', 422, "invalid-input", "payload holds the number 1e400"),
    (b'{"name": "a", "payload": [1, -1E+999]}', 422, "invalid-input", "payload holds the number 1E+999"),
    (b'{"name": "a", "payload": ' + b"9" * 400 + b"}", 422, "invalid-input", "beyond what JSON readers can hold"),
    (b'{"name": "a", "payload": {"x": 1e400}, "repeat": {"every_s": 60}}', 422, "invalid-input",
     "payload holds the number 1e400"),
])
def test_submit_refusals_write_nothing(client, conn, body, status, slug, detail):
    before = counts(conn)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/v1/jobs", headers={**T, "Content-Type": "application/json"}, content=content)
    assert_problem(r, status, slug, detail)
    assert counts(conn) == before


def test_idempotency_key_replays_the_first_job_and_refuses_another_body(client, conn):
    h = {**T, "Idempotency-Key": "order-17"}
    first = client.post("/v1/jobs", headers=h, json={"name": "bill", "payload": {"order": 17}})
    again = client.post("/v1/jobs", headers=h, json={"name": "bill", "payload": {"order": 17}})
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert again.json()["job_id"] == first.json()["job_id"] and again.json()["created"] is False
    before = counts(conn)
    other = client.post("/v1/jobs", headers=h, json={"name": "bill", "payload": {"order": 18}})
    assert_problem(other, 409, "conflict", "was used for a different request")
    assert counts(conn) == before
    # another team's use of the same key is its own
    theirs = client.post("/v1/jobs", headers={**U, "Idempotency-Key": "order-17"},
                         json={"name": "bill", "payload": {"order": 17}})
    assert theirs.status_code == 201 and theirs.json()["job_id"] != first.json()["job_id"]


@pytest.mark.parametrize("workers", [4, 0], ids=["coalesced", "one-call-per-request"])
def test_twenty_concurrent_submissions_of_one_key_make_one_job(api_store, db_dsn, module_conn, workers):
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TOKENS["t"]),))
    app = build(settings(api_submit_workers=workers), api_store, dispatch=False, head=HEAD).app

    async def race():
        async with AsyncTestClient(app) as c:
            return await asyncio.gather(*(
                c.post("/v1/jobs", headers={**T, "Idempotency-Key": "once"}, json={"name": "race"})
                for _ in range(20)))

    responses = asyncio.run(race())
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201], [r.text for r in responses]
    assert len({r.json()["job_id"] for r in responses}) == 1
    assert module_conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1


def test_single_submissions_without_coalescing_refuse_alike(api_store, db_dsn, module_conn):
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TOKENS["t"]),))
    with TestClient(create_app(settings(api_submit_workers=0), api_store, head=HEAD)) as c:
        assert c.post("/v1/jobs", headers=T, json={"name": "ok"}).status_code == 201
        assert_problem(c.post("/v1/jobs", headers=T, json={"name": "a", "priority": 500}), 422,
                       "invalid-input", "priority")
        assert_problem(c.post("/v1/jobs", headers=T, json={"name": "a", "payload": {"b": BIG}}), 413,
                       "too-large", "over the limit")


# ---------------------------------------------------------------- batch
def test_batch_writes_valid_items_and_reports_invalid_ones(client, conn):
    jobs = [{"name": "ok.0"}, {"name": "bad name"}, {"name": "ok.2", "payload": {"i": 2}},
            {"name": "ok.3", "priority": 1000}, {"name": "keyed", "idempotency_key": "k1"},
            {"name": "keyed", "idempotency_key": "k1"},
            {"name": "r", "repeat": {"every_s": 60}}, {"name": "r0", "repeat": {"every_s": 0}}]
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": jobs})
    assert r.status_code == 200, r.text
    body = r.json()
    items = body["items"]
    assert [i["idx"] for i in items] == list(range(len(jobs)))
    assert [i["error"] is None for i in items] == [True, False, True, False, True, True, True, False]
    assert "name must be" in items[1]["error"] and "priority" in items[3]["error"]
    assert "every_s must be between" in items[7]["error"]
    assert items[4]["created"] is True and items[5]["created"] is False
    assert items[4]["job_id"] == items[5]["job_id"]
    assert items[6]["series_id"] is not None and items[0]["series_id"] is None   # tests/test_series.py: more
    assert (body["created"], body["existing"], body["rejected"]) == (4, 1, 3)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 4
    assert conn.execute("SELECT count(*) FROM series").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM jobs WHERE name IN ('bad name', 'r0')").fetchone()[0] == 0


def test_numbers_a_double_holds_are_accepted_and_one_beyond_is_refused_alone_in_a_batch(client, conn):
    fine = b'{"name": "a", "payload": {"big": 1.7e308, "tiny": 1e-400, "text": "1e400", "n": 12345678901234567890}}'
    r = client.post("/v1/jobs", headers={**T, "Content-Type": "application/json"}, content=fine)
    assert r.status_code == 201, r.text
    before = counts(conn)
    batch = b'{"jobs": [{"name": "ok"}, {"name": "big", "payload": [2e308]}]}'
    r = client.post("/v1/jobs/batch", headers={**T, "Content-Type": "application/json"}, content=batch)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items[0]["error"] is None and "payload holds the number 2e308" in items[1]["error"]
    assert counts(conn)["jobs"] == before["jobs"] + 1
    assert conn.execute("SELECT count(*) FROM jobs WHERE name = 'big'").fetchone()[0] == 0


def test_batch_over_the_limit_is_413_and_writes_nothing(client, conn):
    before = counts(conn)
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": [{"name": "j"}] * 10_001})
    assert_problem(r, 413, "too-large", "at most 10,000 jobs")
    assert counts(conn) == before


def test_batch_of_ten_thousand_is_accepted(client, conn):
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": [{"name": "j", "payload": {"i": i}}
                                                                for i in range(10_000)]})
    assert r.status_code == 200 and r.json()["created"] == 10_000
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 10_000


@pytest.mark.parametrize("body, detail", [
    ({"jobs": {"name": "a"}}, "expected `array`"),
    ({}, "missing required field `jobs`"),
])
def test_batch_of_the_wrong_shape_is_422_and_writes_nothing(client, conn, body, detail):
    before = counts(conn)
    assert_problem(client.post("/v1/jobs/batch", headers=T, json=body), 422, "invalid-input", detail)
    assert counts(conn) == before


@pytest.mark.parametrize("item, detail", [
    ({"name": "b", "extra": 1}, "unknown field `extra` - at `$.jobs[1]`"),
    ({"name": "b", "due_at": "2030-01-01T00:00:00"}, "timezone"),
    ({"name": "b", "due_at": "2030-01-01T00:00+01:00"}, "invalid rfc3339"),
])
def test_batch_items_of_the_wrong_shape_are_refused_alone_and_written_nowhere(client, conn, item, detail):
    """An item that does not decode is reported in its place (docs/reference/http-api.md: per-item
    errors); the others are submitted (tests/test_api_hardening.py: more)."""
    before = counts(conn)
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": [{"name": "a"}, item]})
    assert r.status_code == 200, r.text
    body = r.json()
    bad = body["items"][1]
    assert detail.lower() in bad["error"].lower(), bad
    assert bad["job_id"] is None and bad["created"] is False
    assert (body["created"], body["existing"], body["rejected"]) == (1, 0, 1)
    assert counts(conn) == {**before, "jobs": before["jobs"] + 1, "due_minutes": before["due_minutes"] + 1}
    assert conn.execute("SELECT count(*) FROM jobs WHERE name = 'b'").fetchone()[0] == 0


# ---------------------------------------------------------------- status, cancel
def test_status_of_a_job(client):
    job_id = client.post("/v1/jobs", headers=T, json={"name": "st", "payload": {"x": 1}}).json()["job_id"]
    r = client.get(f"/v1/jobs/{job_id}", headers=T)
    assert r.status_code == 200, r.text
    s = r.json()
    assert (s["job_id"], s["team"], s["name"], s["state"], s["attempts"], s["max_attempts"]) == \
        (job_id, "t", "st", "scheduled", 0, 3)
    assert s["claimed_by"] is None and s["result"] is None
    # due now: agreed to run at its submission; waiting, its lateness so far (not final)
    assert s["agreed_at"] == s["due_at"] and s["lateness_final"] is False
    assert s["lateness_s"] is None or s["lateness_s"] >= 0
    assert s["series_id"] is None and s["repeat"] is None


def test_status_of_a_running_job_shows_its_claim_and_lateness(client, api_store):
    job_id = int(client.post("/v1/jobs", headers=T, json={"name": "run"}).json()["job_id"])
    leases = api_store.take_leases([job_id & 1023], "d1", 60)
    claimed = claim(api_store, leases, 10, "d1", 30, worker="w7").jobs
    api_store.start([Start(job_id, claimed[0].lease_token)])
    s = client.get(f"/v1/jobs/{job_id}", headers=T).json()
    assert s["state"] == "running" and s["claimed_by"] and s["claim_expires_at"] and s["lateness_s"] >= 0
    assert s["lateness_final"] is True
    api_store.complete([Complete(job_id, claimed[0].lease_token, json.dumps({"ok": True}).encode())])
    s = client.get(f"/v1/jobs/{job_id}", headers=T).json()
    assert s["state"] == "succeeded" and s["result"] == {"ok": True} and s["finished_at"]


@pytest.mark.parametrize("path", ["/v1/jobs/12345", "/v1/jobs/-3", "/v1/jobs/9223372036854775807"])
def test_status_of_an_unknown_job_is_404(client, path):
    assert_problem(client.get(path, headers=T), 404, "not-found", "no job")


def test_status_of_a_job_id_that_is_not_a_number_is_refused(client):
    assert client.get("/v1/jobs/abc", headers=T).status_code in (400, 404)
    assert_problem(client.get("/v1/jobs/99999999999999999999", headers=T), 400, "malformed-request")


def test_cancel_before_start_then_again_is_409_with_the_state(client, conn):
    job_id = client.post("/v1/jobs", headers=T, json={"name": "c"}).json()["job_id"]
    r = client.delete(f"/v1/jobs/{job_id}", headers=T)
    assert r.status_code == 200 and r.json() == {"job_id": job_id, "state": "cancelled"}
    body = assert_problem(client.delete(f"/v1/jobs/{job_id}", headers=T), 409, "not-cancellable",
                          "job is cancelled")
    assert body["state"] == "cancelled" and body["job_id"] == job_id
    assert job_state(conn, job_id) == "cancelled"


def test_cancel_of_a_running_job_is_409_and_leaves_it_alone(client, conn, api_store):
    job_id = int(client.post("/v1/jobs", headers=T, json={"name": "c"}).json()["job_id"])
    leases = api_store.take_leases([job_id & 1023], "d1", 60)
    token = claim(api_store, leases, 10, "d1", 30).jobs[0].lease_token
    api_store.start([Start(job_id, token)])
    body = assert_problem(client.delete(f"/v1/jobs/{job_id}", headers=T), 409, "not-cancellable", "running")
    assert body["state"] == "running" and job_state(conn, job_id) == "running"


def test_cancel_of_a_claimed_job_is_requested_202_and_its_give_back_cancels_it(client, conn, api_store):
    job_id = int(client.post("/v1/jobs", headers=T, json={"name": "c"}).json()["job_id"])
    leases = api_store.take_leases([job_id & 1023], "d1", 60)
    token = claim(api_store, leases, 10, "d1", 30).jobs[0].lease_token
    r = client.delete(f"/v1/jobs/{job_id}", headers=T)
    assert r.status_code == 202 and r.json() == {"job_id": str(job_id), "state": "claimed"}
    s = client.get(f"/v1/jobs/{job_id}", headers=T).json()
    assert s["state"] == "claimed" and s["cancel_requested_at"]
    api_store.release([Release(job_id, token)])                   # its worker did not start it
    assert client.get(f"/v1/jobs/{job_id}", headers=T).json()["state"] == "cancelled"


def test_cancel_of_an_unknown_job_is_404(client):
    assert_problem(client.delete("/v1/jobs/777", headers=T), 404, "not-found", "no job 777")


# ---------------------------------------------------------------- isolation
def test_another_team_cannot_read_cancel_list_or_batch_touch_a_job(client, conn):
    h = {**T, "Idempotency-Key": "shared-key"}
    job_id = client.post("/v1/jobs", headers=h, json={"name": "secret", "payload": {"p": 1}}).json()["job_id"]
    assert_problem(client.get(f"/v1/jobs/{job_id}", headers=U), 404, "not-found")
    assert_problem(client.delete(f"/v1/jobs/{job_id}", headers=U), 404, "not-found")
    assert job_state(conn, job_id) == "scheduled"
    assert client.get("/v1/jobs", headers=U).json()["jobs"] == []
    assert_problem(client.get("/v1/jobs?team=t", headers=U), 404, "not-found", "no such team")
    assert_problem(client.get("/v1/teams/t/stats", headers=U), 404, "not-found", "no such team")
    assert_problem(client.post("/v1/jobs?team=t", headers=U, json={"name": "x"}), 404, "not-found")
    # the same idempotency key from another team, in a batch, names its own new job
    r = client.post("/v1/jobs/batch", headers=U, json={"jobs": [
        {"name": "secret", "payload": {"p": 1}, "idempotency_key": "shared-key"}]})
    item = r.json()["items"][0]
    assert item["created"] is True and item["job_id"] != job_id
    assert conn.execute("SELECT t.name FROM jobs j JOIN teams t ON t.id = j.team_id WHERE j.id = %s",
                        (int(item["job_id"]),)).fetchone()[0] == "u"
    assert client.get(f"/v1/jobs/{job_id}", headers=T).json()["team"] == "t"


def test_admin_reads_cancels_and_submits_for_any_team(client, conn):
    job_id = client.post("/v1/jobs", headers=T, json={"name": "a"}).json()["job_id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=A).json()["team"] == "t"
    assert_problem(client.get(f"/v1/jobs/{job_id}?team=u", headers=A), 404, "not-found")
    assert client.get("/v1/jobs?team=t", headers=A).json()["jobs"][0]["job_id"] == job_id
    assert_problem(client.get("/v1/jobs", headers=A), 422, "invalid-input", "name one with ?team=")
    assert client.delete(f"/v1/jobs/{job_id}", headers=A).status_code == 200
    r = client.post("/v1/jobs?team=u", headers=A, json={"name": "for-u"})
    assert r.status_code == 201
    assert client.get(f"/v1/jobs/{r.json()['job_id']}", headers=U).status_code == 200
    assert_problem(client.post("/v1/jobs?team=nobody", headers=A, json={"name": "x"}), 404, "not-found",
                   "unknown team")


# ---------------------------------------------------------------- listing
def test_list_is_newest_first_with_a_cursor(client):
    ids = [client.post("/v1/jobs", headers=T, json={"name": f"n{i % 2}"}).json()["job_id"] for i in range(7)]
    client.post("/v1/jobs", headers=U, json={"name": "theirs"})
    seen, cursor = [], None
    while True:
        r = client.get("/v1/jobs", headers=T, params={"limit": 3, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    named = client.get("/v1/jobs", headers=T, params={"name": "n1"}).json()
    assert [j["job_id"] for j in named["jobs"]] == [ids[5], ids[3], ids[1]] and named["next_cursor"] is None


def test_list_filters_by_state_and_due_time(client):
    now = dt.datetime.now(UTC)
    soon = client.post("/v1/jobs", headers=T, json={"name": "a", "due_at": (now + dt.timedelta(hours=1)).isoformat()})
    late = client.post("/v1/jobs", headers=T, json={"name": "a", "due_at": (now + dt.timedelta(days=3)).isoformat()})
    gone = client.post("/v1/jobs", headers=T, json={"name": "a"}).json()["job_id"]
    client.delete(f"/v1/jobs/{gone}", headers=T)

    def listed(**params):
        r = client.get("/v1/jobs", headers=T, params=params)
        assert r.status_code == 200, r.text
        return [j["job_id"] for j in r.json()["jobs"]]

    assert listed(state="cancelled") == [gone]
    assert listed(state="scheduled") == [late.json()["job_id"], soon.json()["job_id"]]
    cut = (now + dt.timedelta(days=1)).isoformat()
    assert listed(due_after=cut) == [late.json()["job_id"]]
    assert listed(due_before=cut, state="scheduled") == [soon.json()["job_id"]]


@pytest.mark.parametrize("query, status, slug", [
    ("state=sleeping", 400, "malformed-request"),
    ("limit=0", 400, "malformed-request"),
    ("limit=501", 400, "malformed-request"),
    ("cursor=abc", 400, "malformed-request"),
    ("cursor=99999999999999999999", 400, "malformed-request"),
    ("due_before=2030-01-01T00:00:00", 422, "invalid-input"),
    ("due_before=soon", 400, "malformed-request"),
])
def test_list_refuses_bad_parameters(client, query, status, slug):
    assert_problem(client.get(f"/v1/jobs?{query}", headers=T), status, slug)


def test_list_reads_a_bounded_number_of_jobs_per_page(api_store, db_dsn):
    api_store.submit_many("t", [JobSpec(name="common")] * 30 + [JobSpec(name="rare")]
                          + [JobSpec(name="common")] * 30)
    page = api_store.list_jobs("t", name="rare", limit=10, scan=20)
    assert page.jobs == [] and page.next_cursor is not None       # 20 read, none matched: go on
    page = api_store.list_jobs("t", name="rare", limit=10, scan=20, before_id=page.next_cursor)
    assert [j.name for j in page.jobs] == ["rare"]


# ---------------------------------------------------------------- stats
def test_team_stats(client, api_store):
    for name in ("a", "a", "b"):
        client.post("/v1/jobs", headers=T, json={"name": name, "max_attempts": 1})
    client.post("/v1/jobs", headers=U, json={"name": "other"})
    leases = api_store.take_leases(range(256), "d1", 60)
    claimed = [c for c in claim(api_store, leases, 100, "d1", 30).jobs if c.name in ("a", "b")]
    api_store.start([Start(c.job_id, c.lease_token) for c in claimed])
    a = [c for c in claimed if c.name == "a"]
    api_store.fail([Fail(a[0].job_id, a[0].lease_token, "boom", True)])   # max_attempts 1: dead
    r = client.get("/v1/teams/me/stats", headers=T)
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["team"] == "t" and s["quota"] == 1000 and s["running"] == 2 and s["window_s"] == 86400
    total = s["total"]
    assert (total["submitted"], total["started"], total["succeeded"], total["failed"], total["dead"],
            total["cancelled"]) == (3, 3, 0, 0, 1, 0)
    assert total["lateness"]["count"] == 3 and total["run_time"]["count"] == 1
    assert total["lateness"]["p99_s"] >= total["lateness"]["p50_s"] >= 0
    assert [b["le_s"] for b in total["lateness"]["buckets"]][-2:] == [3600, None]
    names = {n["name"]: n["counts"] for n in s["names"]}
    assert set(names) == {"a", "b"} and s["other"] is None         # team u's job is not seen
    assert (names["a"]["submitted"], names["a"]["dead"], names["b"]["started"]) == (2, 1, 1)
    assert client.get("/v1/teams/t/stats", headers=A).json()["total"]["submitted"] == 3
    assert client.get("/v1/teams/u/stats", headers=A).json()["total"]["submitted"] == 1
    assert_problem(client.get("/v1/teams/u/stats", headers=T), 404, "not-found")     # another team: not seen
    assert_problem(client.get("/v1/teams/me/stats", headers=A), 422, "invalid-input", "admin")
    assert_problem(client.get("/v1/teams/nobody/stats", headers=A), 404, "not-found")


def test_fleet_stats_are_for_the_admin(client):
    client.post("/v1/jobs", headers=T, json={"name": "a"})
    client.post("/v1/jobs/batch", headers=U, json={"jobs": [{"name": "x"}, {"name": "y"}]})
    r = client.get("/v1/stats?window_s=3600", headers=A)
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["window_s"] == 3600 and s["total"]["submitted"] == 3 and s["running"] == 0
    assert {t["team"]: t["counts"]["submitted"] for t in s["teams"]} == {"t": 1, "u": 2}
    assert_problem(client.get("/v1/stats", headers=T), 403, "forbidden", "admin token")


@pytest.mark.parametrize("path", ["/v1/teams/me/stats", "/v1/stats"])
@pytest.mark.parametrize("query", ["window_s=-5", "window_s=0", "window_s=2592001", "window_s=soon",
                                   "window_s=1.5", "window_s="])
def test_stats_refuse_bad_windows(client, path, query):
    headers = A if path == "/v1/stats" else T
    body = assert_problem(client.get(f"{path}?{query}", headers=headers), 400, "malformed-request")
    assert "window_s" in json.dumps(body)


# ---------------------------------------------------------------- auth, teams
@pytest.mark.parametrize("headers, detail", [
    ({}, "no token"),
    ({"Authorization": "Bearer nope"}, "unknown token"),
    ({"Authorization": "Basic dXNlcjpwdw=="}, "Bearer <token>"),
    ({"Authorization": "Bearer"}, "Bearer <token>"),
])
@pytest.mark.parametrize("method, path", [("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"), ("GET", "/v1/jobs/1"),
                                          ("DELETE", "/v1/jobs/1"), ("GET", "/v1/jobs"),
                                          ("GET", "/v1/teams/me/stats"), ("GET", "/v1/stats"), ("POST", "/v1/teams"),
                                          ("POST", "/v1/teams/t/token")])
def test_no_or_bad_token_is_401(client, conn, headers, detail, method, path):
    before = counts(conn)
    r = client.request(method, path, headers=headers, json={"name": "x"})
    assert_problem(r, 401, "unauthorized", detail)
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert counts(conn) == before


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/batch", "/v1/teams"])
@pytest.mark.parametrize("body", [b"{not json", b'{"surprise": 1}', b""])
def test_a_caller_without_a_token_hears_401_whatever_its_body(client, path, body):
    """The token is checked before the body is read and decoded."""
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert_problem(r, 401, "unauthorized", "no token")


def test_admin_creates_a_team_whose_token_works_and_rotates_it(client, conn):
    r = client.post("/v1/teams", headers=A, json={"name": "billing", "quota": 5})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert conn.execute("SELECT token_hash FROM teams WHERE name = 'billing'").fetchone()[0] == hash_token(token)
    bh = {"Authorization": f"Bearer {token}"}
    assert client.post("/v1/jobs", headers=bh, json={"name": "x"}).status_code == 201
    assert client.get("/v1/teams/me/stats", headers=bh).json()["quota"] == 5
    rotated = client.post("/v1/teams/billing/token", headers=A)
    assert rotated.status_code == 200
    assert_problem(client.get("/v1/jobs", headers=bh), 401, "unauthorized")
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {rotated.json()['token']}"}).status_code == 200


@pytest.mark.parametrize("headers, body, status, slug, detail", [
    (T, {"name": "x"}, 403, "forbidden", "admin token"),
    (T, {"name": "Bad Name", "owner": "me"}, 403, "forbidden", "admin token"),   # before the body
    (A, {"name": "t"}, 409, "conflict", "already exists"),
    (A, {"name": "Bad Name"}, 422, "invalid-input", "team name"),
    (A, {"name": "ok", "quota": 0}, 422, "invalid-input", "quota must be a whole number from 1"),
    (A, {"name": "ok", "owner": "me"}, 422, "invalid-input", "unknown field"),
])
def test_team_creation_refusals_write_nothing(client, conn, headers, body, status, slug, detail):
    before = counts(conn)
    assert_problem(client.post("/v1/teams", headers=headers, json=body), status, slug, detail)
    assert counts(conn) == before


def test_token_rotation_refusals(client):
    assert_problem(client.post("/v1/teams/t/token", headers=T), 403, "forbidden")
    assert_problem(client.post("/v1/teams/nobody/token", headers=A), 404, "not-found", "no such team")


# ---------------------------------------------------------------- the schema says what the server enforces
def openapi(client) -> dict:
    return client.get("/schema/openapi.json").json()


def schema_accepts(doc: dict, path: str, method: str, part: str, value) -> bool:
    """Whether the served schema takes `value` as the operation's body (part
    "body") or as its parameter of that name, formats included (as
    schemathesis reads the schema)."""
    operation = doc["paths"][path][method]
    if part == "body":
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
    else:
        schema = next(p["schema"] for p in operation["parameters"] if p["name"] == part)
    return jsonschema_rs.validator_for({**schema, "components": doc["components"]},
                                       validate_formats=True).is_valid(value)


def written(conn) -> tuple:
    """What a refused request must leave as it was."""
    return counts(conn), conn.execute("""SELECT (SELECT count(*) FROM webhooks), (SELECT count(*) FROM flex_defaults),
                                                (SELECT count(*) FROM jobs WHERE state = 'dead')""").fetchone()


def dead_job(store: Store) -> int:
    job_id = store.submit("t", JobSpec(name="d", max_attempts=1)).job_id
    leases = store.take_leases([job_id & 1023], "d1", 60)
    lease = next(c.lease_token for c in claim(store, leases, 10, "d1").jobs if c.job_id == job_id)
    assert store.fail([Fail(job_id, lease, "boom")])[0].state == "dead"
    return job_id


SAMPLE_PATH = {"job_id": "12345", "series_id": "12345", "name": "t", "job_name": "a/b"}
METHODS = {"get", "put", "post", "patch", "delete"}


def test_options_lists_every_method_the_schema_has_for_the_path(client):
    wrong = {}
    for template, operations in openapi(client)["paths"].items():
        allow = ", ".join(sorted({m.upper() for m in operations if m in METHODS} | {"OPTIONS"}))
        r = client.options(re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PATH[m.group(1)], template), headers=T)
        if (r.status_code, r.headers.get("allow")) != (204, allow):
            wrong[template] = (r.status_code, r.headers.get("allow"), allow)
    assert not wrong


def body(value, **kw) -> dict:
    return {"json": value, **kw}


def header(value: str) -> dict:
    return {"json": {"name": "x"}, "headers": {**T, "Idempotency-Key": value}}


# A request; where the schema says what it may hold (path, method, and "body"
# or a parameter with its value as the schema reads it); the server's answer.
# "{dead}" in a URL: a dead job of team t.
JOBS, SERIES, REQUEUE = ("/v1/jobs", "post", "body"), ("/v1/series/{series_id}", "patch", "body"), \
    ("/v1/jobs/{job_id}/requeue", "post", "max_attempts")
REFUSED = [
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {}}), JOBS, 422, "exactly one of every_s or cron"),
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"misfire": "skip"}}), JOBS, 422, "exactly one"),
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"every_s": 60, "cron": "0 3 * * *"}}), JOBS, 422, "exactly one"),
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"every_s": 60, "timezone": "UTC"}}), JOBS, 422, "timezone"),
    ("PATCH", "/v1/series/12345", body({"repeat": {}}), SERIES, 422, "exactly one"),
    ("PATCH", "/v1/teams/t", body({}, headers=A), ("/v1/teams/{name}", "patch", "body"), 422, "at least one"),
    ("POST", "/v1/dead/requeue", body({"name": ""}), ("/v1/dead/requeue", "post", "body"), 422, "name"),
    ("POST", "/v1/dead/requeue", body({"name": "a b"}), ("/v1/dead/requeue", "post", "body"), 422, "name"),
    ("POST", "/v1/dead/discard", body({"name": "a b"}), ("/v1/dead/discard", "post", "body"), 422, "name"),
    ("POST", "/v1/jobs", header(""), ("/v1/jobs", "post", "Idempotency-Key", ""), 422, "Idempotency-Key is empty"),
    ("POST", "/v1/jobs", header("a\tb"), ("/v1/jobs", "post", "Idempotency-Key", "a\tb"), 422, "contains"),
    ("POST", "/v1/jobs/{dead}/requeue?max_attempts=0", {}, (*REQUEUE, 0), 422, "max_attempts"),
    ("POST", "/v1/jobs/{dead}/requeue?max_attempts=101", {}, (*REQUEUE, 101), 422, "max_attempts"),
    ("GET", "/v1/jobs?due_before=0.5", {}, ("/v1/jobs", "get", "due_before", "0.5"), 400, "due_before"),
    ("GET", "/v1/jobs?due_after=1700000000", {}, ("/v1/jobs", "get", "due_after", "1700000000"), 400, "due_after"),
    ("GET", "/v1/jobs?team=T%00", {}, ("/v1/jobs", "get", "team", "T\x00"), 400, "team"),
    ("PUT", "/v1/windows/names/a%20b", body({"flex_s": 60}, headers=A),
     ("/v1/windows/names/{job_name}", "put", "job_name", "a b"), 422, "job name"),
    ("PUT", "/v1/teams/t/webhook", body({"url": "https://example.com/h", "secret": "short"}, headers=A),
     ("/v1/teams/{name}/webhook", "put", "body"), 422, "secret"),
]


def schema_takes(client, kw: dict, where: tuple) -> bool:
    path, method, part, *value = where
    return schema_accepts(openapi(client), path, method, part, value[0] if value else kw["json"])


@pytest.mark.parametrize("method, url, kw, where, status, detail", REFUSED,
                         ids=[f"{r[0]} {r[1]}: {r[-1]}" for r in REFUSED])
def test_what_the_schema_refuses_the_server_refuses_and_writes_nothing(client, conn, api_store, method, url, kw,
                                                                       where, status, detail):
    assert not schema_takes(client, kw, where)
    if "{dead}" in url:
        url = url.replace("{dead}", str(dead_job(api_store)))
    before = written(conn)
    r = client.request(method, url, **{"headers": T, **kw})
    assert_problem(r, status, "invalid-input" if status == 422 else "malformed-request", detail)
    assert written(conn) == before


ACCEPTED = [
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"every_s": 60}}), JOBS, 201),
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"every_s": 60, "cron": None, "timezone": None,
                                                       "misfire": "skip"}}), JOBS, 201),
    ("POST", "/v1/jobs", body({"name": "x", "repeat": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}}), JOBS, 201),
    ("PATCH", "/v1/teams/t", body({"weight": 2}, headers=A), ("/v1/teams/{name}", "patch", "body"), 200),
    ("POST", "/v1/jobs", header("order 17"), ("/v1/jobs", "post", "Idempotency-Key", "order 17"), 201),
    ("POST", "/v1/dead/requeue", body({"name": "a/b:c.d-e_f"}), ("/v1/dead/requeue", "post", "body"), 200),
    ("POST", "/v1/jobs/{dead}/requeue?max_attempts=100", {}, (*REQUEUE, 100), 200),
    ("GET", "/v1/jobs?due_before=2030-01-01T00:00:00%2B01:00", {},
     ("/v1/jobs", "get", "due_before", "2030-01-01T00:00:00+01:00"), 200),
]


@pytest.mark.parametrize("method, url, kw, where, status", ACCEPTED, ids=[f"{r[0]} {r[1]}" for r in ACCEPTED])
def test_what_the_schema_accepts_the_server_accepts(client, api_store, method, url, kw, where, status):
    assert schema_takes(client, kw, where)
    if "{dead}" in url:
        url = url.replace("{dead}", str(dead_job(api_store)))
    r = client.request(method, url, **{"headers": T, **kw})
    assert r.status_code == status, r.text


# ---------------------------------------------------------------- the rest
def test_health_readiness_schema_and_unknown_routes(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "revision": HEAD, "head": HEAD,
                                                    "version": VERSION}
    schema = client.get("/schema/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{job_id}", "/v1/teams", "/v1/teams/{name}/token",
            "/v1/teams/{name}/stats", "/v1/stats", "/healthz", "/readyz"} <= set(schema["paths"])
    stats = schema["components"]["schemas"]["StatsOut"]["properties"]
    assert "truncated" not in stats and "examined" not in stats and {"total", "names", "other"} <= set(stats)
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/JobIn"} and "JobIn" in schema["components"]["schemas"]
    assert "409" in schema["paths"]["/v1/jobs"]["post"]["responses"]
    assert_problem(client.get("/v2/nothing", headers=T), 404, "not-found")
    assert_problem(client.put("/v1/jobs", headers=T), 405, "method-not-allowed")
    assert client.get("/problems/not-found").json()["status"] == 404


def test_sql_submission_in_the_callers_transaction(client, db_dsn):
    """Rolled back: no job (404 over HTTP); committed: the API sees it and a
    dispatcher claims it (tests/test_submit.py covers the SQL side in depth)."""
    with psycopg.connect(db_dsn) as other:
        rolled = other.execute("SELECT submit_job('t', 'tx')").fetchone()[0]
        other.rollback()
        kept = other.execute("SELECT submit_job('t', 'tx', p_payload => '{\"k\": 1}')").fetchone()[0]
        other.commit()
    assert_problem(client.get(f"/v1/jobs/{rolled}", headers=T), 404, "not-found")
    assert client.get(f"/v1/jobs/{kept}", headers=T).json()["state"] == "scheduled"
