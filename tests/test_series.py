"""Repeating jobs against a real PostgreSQL: a series stored with its first
run (sql/functions/series.sql), through SQL (submit_series), the Store and the
HTTP API. The clock is pinned (mh_now() in the database, and the Store's
clock from which fire times are computed), so first-run times are exact:
every_s starts at the due time or now, cron fires first at or after the start
in its IANA zone, DST included. Every refusal writes nothing; an
Idempotency-Key names the series' first run; batch items with repeat are
written with the rest of their batch.

The tests share one clone of the migrated template, emptied before each
(marked reused_db, tests/fixtures/databases.py)."""
from __future__ import annotations

import asyncio
import datetime as dt
import time

import psycopg
import pytest
from litestar.testing import AsyncTestClient, TestClient
from psycopg.types.json import Jsonb

from minutehand.api.app import create_app
from minutehand.settings import Settings
from minutehand.store import errors, migrate
from minutehand.store import repeat as repeats
from minutehand.store.records import Repeat
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import T0, due_rows, minute_part, pin

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

UTC = dt.timezone.utc
H = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
ADMIN = "admin-secret-token"
T = {"Authorization": "Bearer tok-team-t"}
U = {"Authorization": "Bearer tok-team-u"}
TABLES = ("series", "jobs", "due_minutes", "due_hours", "due_far", "idempotency_keys")
COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)


def counts(conn) -> dict[str, int]:
    return dict(zip(TABLES, conn.execute(COUNTS).fetchone()))


def at(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)


def series_row(conn, series_id: int) -> dict:
    return conn.execute("SELECT to_jsonb(s) FROM series s WHERE id = %s", (series_id,)).fetchone()[0]


def job_row(conn, job_id: int) -> dict:
    return conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()[0]


def assert_one_series_with_its_run(conn, series_id: int, job_id: int, due: dt.datetime) -> dict:
    """Exactly one series and one job, linked, on one shard; the job due (and on the wheel) at `due`."""
    assert conn.execute("SELECT count(*) FROM series").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    s, j = series_row(conn, series_id), job_row(conn, job_id)
    assert int(j["series_id"]) == series_id and int(s["last_job_id"]) == job_id
    assert s["shard"] == j["shard"] == series_id & 1023 == job_id & 1023
    assert at(j["due_at"]) == at(j["run_at"]) == at(s["first_due_at"]) == at(s["last_due_at"]) == due
    assert j["state"] == "scheduled" and j["attempts"] == 0
    assert [r[1] for r in due_rows(conn, job_id)] == [due]
    return s


@pytest.fixture
def client(db_dsn, module_conn, module_store):
    """The API on the module's store, whose clock is pinned to T0; teams 't' and 'u'."""
    module_conn.execute("UPDATE teams SET token_hash = CASE name WHEN 't' THEN %s WHEN 'u' THEN %s END",
                        (hash_token("tok-team-t"), hash_token("tok-team-u")))
    module_store.clock = T0
    with TestClient(create_app(Settings(admin_token=ADMIN), module_store, head=migrate.head())) as c:
        yield c


# ---------------------------------------------------------------- HTTP: accepted
def test_every_s_makes_one_series_and_its_first_run_at_the_due_time(client, pinned_conn):
    due = T0 + 2 * H
    r = client.post("/v1/jobs", headers=T, json={"name": "report", "due_at": due.isoformat(),
                                                  "payload": {"k": 1}, "priority": 7, "max_attempts": 5,
                                                  "flex_s": 0, "repeat": {"every_s": 3600}})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] is True and at(body["run_at"]) == due
    series_id, job_id = int(body["series_id"]), int(body["job_id"])
    s = assert_one_series_with_its_run(pinned_conn, series_id, job_id, due)
    assert (s["name"], s["payload"], s["priority"], s["max_attempts"], s["strict"]) == ("report", {"k": 1}, 7, 5, False)
    assert (s["every_s"], s["cron"], s["timezone"], s["cancelled_at"]) == (3600, None, None, None)
    j = job_row(pinned_conn, job_id)
    assert (j["name"], j["payload"], j["priority"], j["max_attempts"]) == ("report", {"k": 1}, 7, 5)


def test_every_s_without_a_due_time_runs_first_now(client, pinned_conn):
    r = client.post("/v1/jobs", headers=T, json={"name": "tick", "repeat": {"every_s": 60}})
    assert r.status_code == 201, r.text
    assert at(r.json()["run_at"]) == T0
    assert_one_series_with_its_run(pinned_conn, int(r.json()["series_id"]), int(r.json()["job_id"]), T0)
    assert due_rows(pinned_conn, int(r.json()["job_id"])) == [(minute_part(pinned_conn, T0), T0)]


def test_cron_in_a_zone_runs_first_at_its_next_fire_time(client, pinned_conn):
    # T0 is 2030-01-01 12:00:30 UTC; 03:00 in Berlin (CET, +01:00) next is 2030-01-02 02:00 UTC.
    r = client.post("/v1/jobs", headers=T, json={"name": "nightly",
                                                  "repeat": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}})
    assert r.status_code == 201, r.text
    first = dt.datetime(2030, 1, 2, 2, 0, tzinfo=UTC)
    assert at(r.json()["run_at"]) == first
    s = assert_one_series_with_its_run(pinned_conn, int(r.json()["series_id"]), int(r.json()["job_id"]), first)
    assert (s["every_s"], s["cron"], s["timezone"]) == (None, "0 3 * * *", "Europe/Berlin")


def test_cron_without_a_zone_is_utc_and_a_due_time_is_its_start(client, pinned_conn):
    r = client.post("/v1/jobs", headers=T, json={"name": "a", "due_at": "2030-01-05T00:00:00+00:00",
                                                  "repeat": {"cron": "*/15 3 * * *"}})
    assert r.status_code == 201, r.text
    assert at(r.json()["run_at"]) == dt.datetime(2030, 1, 5, 3, 0, tzinfo=UTC)
    assert series_row(pinned_conn, int(r.json()["series_id"]))["timezone"] == "UTC"
    # a start in the past: the first fire time from now on (not a missed one)
    r = client.post("/v1/jobs", headers=T, json={"name": "b", "due_at": "2029-06-01T00:00:00+00:00",
                                                  "repeat": {"cron": "0 * * * *"}})
    assert r.status_code == 201, r.text
    assert at(r.json()["run_at"]) == dt.datetime(2030, 1, 1, 13, 0, tzinfo=UTC)


def test_a_flexible_series_run_is_spread_inside_its_window(client, pinned_conn):
    due = T0 + H
    r = client.post("/v1/jobs", headers=T, json={"name": "f", "due_at": due.isoformat(), "flex_s": 600,
                                                  "repeat": {"every_s": 86400}})
    assert r.status_code == 201, r.text
    run_at = at(r.json()["run_at"])
    assert due <= run_at <= due + dt.timedelta(seconds=600)
    j = job_row(pinned_conn, int(r.json()["job_id"]))
    assert at(j["due_at"]) == due and at(j["run_at"]) == run_at and j["flex_s"] == 600


def test_status_shows_the_series_and_its_repeat_spec(client):
    r = client.post("/v1/jobs", headers=T, json={"name": "n", "repeat": {"cron": "30 6 * * 1-5",
                                                                         "timezone": "America/New_York"}})
    job_id, series_id = r.json()["job_id"], r.json()["series_id"]
    s = client.get(f"/v1/jobs/{job_id}", headers=T).json()
    assert s["series_id"] == series_id
    assert s["repeat"] == {"every_s": None, "cron": "30 6 * * 1-5", "timezone": "America/New_York",
                           "misfire": "run_once"}
    assert at(s["due_at"]) == dt.datetime(2030, 1, 1, 11, 30, tzinfo=UTC) + DAY   # Wed 06:30 EST
    every = client.post("/v1/jobs", headers=T, json={"name": "e", "repeat": {"every_s": 90}}).json()
    assert client.get(f"/v1/jobs/{every['job_id']}", headers=T).json()["repeat"] == \
        {"every_s": 90, "cron": None, "timezone": None, "misfire": "run_once"}
    plain = client.post("/v1/jobs", headers=T, json={"name": "once"}).json()
    assert plain["series_id"] is None
    s = client.get(f"/v1/jobs/{plain['job_id']}", headers=T).json()
    assert s["series_id"] is None and s["repeat"] is None
    assert_problem(client.get(f"/v1/jobs/{job_id}", headers=U), 404, "not-found")   # another team's


# ---------------------------------------------------------------- DST
@pytest.mark.parametrize("now, cron, zone, first", [
    # the night clocks go forward (Berlin, 2030-03-31 02:00 CET -> 03:00 CEST): 03:00 is CEST
    (dt.datetime(2030, 3, 30, 12, 0, tzinfo=UTC), "0 3 * * *", "Europe/Berlin",
     dt.datetime(2030, 3, 31, 1, 0, tzinfo=UTC)),
    # the evening before it, still CET
    (dt.datetime(2030, 3, 29, 12, 0, tzinfo=UTC), "0 3 * * *", "Europe/Berlin",
     dt.datetime(2030, 3, 30, 2, 0, tzinfo=UTC)),
    # clocks go back (2030-10-27 03:00 CEST -> 02:00 CET): 03:00 is CET
    (dt.datetime(2030, 10, 26, 12, 0, tzinfo=UTC), "0 3 * * *", "Europe/Berlin",
     dt.datetime(2030, 10, 27, 2, 0, tzinfo=UTC)),
    # 02:30 happens twice that night: the first one (CEST)
    (dt.datetime(2030, 10, 26, 12, 0, tzinfo=UTC), "30 2 * * *", "Europe/Berlin",
     dt.datetime(2030, 10, 27, 0, 30, tzinfo=UTC)),
    # 02:30 does not exist the spring night: APScheduler runs it an hour later, 03:30 CEST
    (dt.datetime(2030, 3, 30, 12, 0, tzinfo=UTC), "30 2 * * *", "Europe/Berlin",
     dt.datetime(2030, 3, 31, 1, 30, tzinfo=UTC)),
    # New York springs forward 2030-03-10: 09:00 EDT
    (dt.datetime(2030, 3, 9, 20, 0, tzinfo=UTC), "0 9 * * *", "America/New_York",
     dt.datetime(2030, 3, 10, 13, 0, tzinfo=UTC)),
    # southern hemisphere: Sydney leaves daylight time 2030-04-07; 09:00 AEST
    (dt.datetime(2030, 4, 6, 12, 0, tzinfo=UTC), "0 9 * * *", "Australia/Sydney",
     dt.datetime(2030, 4, 6, 23, 0, tzinfo=UTC)),
])
def test_cron_across_daylight_saving_gives_the_right_utc_instant(pinned_conn, pinned_store, now, cron, zone, first):
    pinned_store.clock = now
    pin(pinned_conn, now)
    got = pinned_store.submit("t", JobSpec(name="dst", repeat=Repeat(cron=cron, timezone=zone)))
    assert got.created and got.run_at == first
    assert_one_series_with_its_run(pinned_conn, got.series_id, got.job_id, first)


def test_dst_through_the_api(client, module_store, pinned_conn):
    module_store.clock = dt.datetime(2030, 3, 30, 12, 0, tzinfo=UTC)
    r = client.post("/v1/jobs", headers=T, json={"name": "d", "repeat": {"cron": "0 3 * * *",
                                                                         "timezone": "Europe/Berlin"}})
    assert r.status_code == 201 and r.json()["run_at"] == "2030-03-31T01:00:00Z", r.text


# ---------------------------------------------------------------- HTTP: refused
def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == f"/problems/{slug}" and detail.lower() in body["detail"].lower(), body
    return body


@pytest.mark.parametrize("repeat, detail", [
    ({}, "exactly one of every_s or cron"),
    ({"every_s": 60, "cron": "* * * * *"}, "exactly one"),
    ({"every_s": 0}, "between 1 and 31622400"),
    ({"every_s": 31622401}, "between 1 and 31622400"),
    ({"every_s": 60, "timezone": "UTC"}, "goes with cron"),
    ({"cron": "0 3 * *"}, "not a 5-field crontab"),
    ({"cron": "61 * * * *"}, "not a 5-field crontab"),
    ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "IANA time zone"),
    ({"cron": "0 3 * * *", "timezone": "CEST"}, "IANA time zone"),
    # zones a host has that are not IANA names: another zone on each host, or none on another
    ({"cron": "0 3 * * *", "timezone": "localtime"}, "not an IANA time zone name"),
    ({"cron": "0 3 * * *", "timezone": "Factory"}, "not an IANA time zone name"),
    ({"cron": "0 3 * * *", "timezone": "posix/Europe/Berlin"}, "not an IANA time zone name"),
    ({"cron": "0 3 * * *", "timezone": "right/UTC"}, "not an IANA time zone name"),
    ({"cron": "0 3 * * *", "timezone": ""}, "not an IANA time zone name"),
    # whitespace around a cron expression, or other than one space between its fields
    ({"cron": "0 3 * * *\n"}, "has whitespace around it"),
    ({"cron": " 0 3 * * *"}, "has whitespace around it"),
    ({"cron": "0 3\t* * *", "timezone": "UTC"}, "apart by single spaces"),
    ({"cron": "0  3 * * *"}, "apart by single spaces"),
    ({"cron": "0 0 31 2 *"}, "does not fire within 366 days"),   # never: searched to the horizon only
    ({"cron": "0 0 29 2 *"}, "does not fire within 366 days"),   # the next 29 February is in 2032
    ({"every_s": 60, "misfire": "later"}, "Invalid enum value 'later' - at `$.repeat.misfire`"),
    ({"every_s": "60"}, "expected `int`, got `str`"),
    ({"every_s": 60, "day": 1}, "unknown field `day`"),
])
def test_invalid_repeat_is_422_and_writes_nothing(client, pinned_conn, repeat, detail):
    before = counts(pinned_conn)
    assert_problem(client.post("/v1/jobs", headers=T, json={"name": "a", "repeat": repeat}), 422,
                   "invalid-input", detail)
    assert counts(pinned_conn) == before


@pytest.mark.parametrize("body, status, slug, detail", [
    ({"name": "bad name", "repeat": {"every_s": 60}}, 422, "invalid-input", "name must be"),
    ({"name": "a", "priority": 101, "repeat": {"cron": "* * * * *"}}, 422, "invalid-input", "priority"),
    ({"name": "a", "strict": True, "flex_s": 5, "repeat": {"every_s": 60}}, 422, "invalid-input", "strict"),
    ({"name": "a", "due_at": "2031-06-01T00:00:00Z", "repeat": {"every_s": 60}}, 422, "invalid-input", "ahead"),
    ({"name": "a", "payload": {"b": "x" * 270_000}, "repeat": {"every_s": 60}}, 413, "too-large", "over the limit"),
])
def test_invalid_job_fields_with_repeat_are_refused_like_a_job(client, pinned_conn, body, status, slug, detail):
    before = counts(pinned_conn)
    assert_problem(client.post("/v1/jobs", headers=T, json=body), status, slug, detail)
    assert counts(pinned_conn) == before


def test_unknown_team_with_repeat_is_404(client, pinned_conn):
    before = counts(pinned_conn)
    assert_problem(client.post("/v1/jobs?team=nobody", headers={"Authorization": f"Bearer {ADMIN}"},
                               json={"name": "x", "repeat": {"every_s": 60}}), 404, "not-found", "unknown team")
    assert counts(pinned_conn) == before


# ---------------------------------------------------------------- idempotency
def test_idempotency_key_names_the_series_first_run(client, pinned_conn, module_store):
    h = {**T, "Idempotency-Key": "daily-report"}
    body = {"name": "report", "repeat": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}}
    first = client.post("/v1/jobs", headers=h, json=body)
    assert first.status_code == 201, first.text
    # a retry after the first fire time has passed still names the same series: the key
    # compares the request as sent, not the first run computed from the clock (02:00 UTC)
    module_store.clock = dt.datetime(2030, 1, 2, 3, 0, tzinfo=UTC)
    again = client.post("/v1/jobs", headers=h, json=body)
    assert again.status_code == 200, again.text
    assert again.json() == {**first.json(), "created": False}
    assert counts(pinned_conn)["series"] == 1 and counts(pinned_conn)["jobs"] == 1
    k = pinned_conn.execute("SELECT job_id, shard FROM idempotency_keys WHERE key = 'daily-report'").fetchone()
    assert k == (int(first.json()["job_id"]), int(first.json()["series_id"]) & 1023)
    assert job_row(pinned_conn, k[0])["idempotency_key"] == "daily-report"
    assert series_row(pinned_conn, int(first.json()["series_id"]))["idempotency_key"] == "daily-report"
    before = counts(pinned_conn)
    for other in ({**body, "repeat": {"cron": "0 4 * * *", "timezone": "Europe/Berlin"}},   # another spec
                  {**body, "repeat": {"cron": "0 3 * * *"}},                               # another zone
                  {"name": "report"},                                                      # no repeat
                  {**body, "payload": {"v": 2}}):                                          # another body
        assert_problem(client.post("/v1/jobs", headers=h, json=other), 409, "conflict",
                       "was used for a different request")
    assert counts(pinned_conn) == before


def test_a_key_used_for_a_job_conflicts_with_a_series(client, pinned_conn):
    h = {**T, "Idempotency-Key": "k"}
    assert client.post("/v1/jobs", headers=h, json={"name": "x"}).status_code == 201
    before = counts(pinned_conn)
    assert_problem(client.post("/v1/jobs", headers=h, json={"name": "x", "repeat": {"every_s": 60}}), 409,
                   "conflict")
    assert counts(pinned_conn) == before


def test_a_series_key_from_another_team_is_its_own(client, pinned_conn):
    body = {"name": "x", "repeat": {"every_s": 60}}
    mine = client.post("/v1/jobs", headers={**T, "Idempotency-Key": "k"}, json=body).json()
    theirs = client.post("/v1/jobs", headers={**U, "Idempotency-Key": "k"}, json=body)
    assert theirs.status_code == 201 and theirs.json()["series_id"] != mine["series_id"]


def test_twenty_concurrent_series_submissions_of_one_key_make_one_series(db_dsn, module_conn, module_store):
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token("tok-team-t"),))
    module_store.clock = T0
    app = create_app(Settings(admin_token=ADMIN), module_store, head=migrate.head())

    async def race():
        async with AsyncTestClient(app) as c:
            return await asyncio.gather(*(
                c.post("/v1/jobs", headers={**T, "Idempotency-Key": "once"},
                       json={"name": "race", "repeat": {"cron": "*/5 * * * *"}})
                for _ in range(20)))

    responses = asyncio.run(race())
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201], [r.text for r in responses]
    assert len({(r.json()["job_id"], r.json()["series_id"]) for r in responses}) == 1
    assert counts(module_conn)["series"] == 1 and counts(module_conn)["jobs"] == 1


# ---------------------------------------------------------------- batch
def test_batch_items_with_repeat_make_series_with_the_rest(client, pinned_conn):
    jobs = [{"name": "plain"},
            {"name": "every", "repeat": {"every_s": 600}, "due_at": (T0 + H).isoformat()},
            {"name": "cron", "repeat": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}},
            {"name": "bad", "repeat": {"every_s": 0}},
            {"name": "never", "repeat": {"cron": "0 0 31 2 *"}},
            {"name": "bad name", "repeat": {"every_s": 60}},
            {"name": "keyed", "repeat": {"every_s": 60}, "idempotency_key": "s1"},
            {"name": "keyed", "repeat": {"every_s": 60}, "idempotency_key": "s1"},
            {"name": "keyed", "repeat": {"every_s": 120}, "idempotency_key": "s1"},
            {"name": "plain-keyed", "idempotency_key": "p1"},
            {"name": "series-on-a-job-key", "repeat": {"every_s": 60}, "idempotency_key": "p1"}]
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": jobs})
    assert r.status_code == 200, r.text
    body = r.json()
    items = body["items"]
    assert [i["idx"] for i in items] == list(range(len(jobs)))
    assert [i["error"] is None for i in items] == [True, True, True, False, False, False, True, True, False,
                                                  True, False]
    assert "between 1 and" in items[3]["error"] and "does not fire within" in items[4]["error"]
    assert "name must be" in items[5]["error"]
    assert "different request" in items[8]["error"] and "different request" in items[10]["error"]
    assert items[0]["series_id"] is None and items[9]["series_id"] is None
    assert at(items[1]["run_at"]) == T0 + H and at(items[2]["run_at"]) == dt.datetime(2030, 1, 2, 2, tzinfo=UTC)
    assert items[6]["created"] is True and items[7]["created"] is False
    assert (items[7]["job_id"], items[7]["series_id"]) == (items[6]["job_id"], items[6]["series_id"])
    assert (body["created"], body["existing"], body["rejected"]) == (5, 1, 5)
    assert counts(pinned_conn)["series"] == 3 and counts(pinned_conn)["jobs"] == 5
    linked = pinned_conn.execute("SELECT count(*) FROM jobs j JOIN series s ON s.shard = j.shard AND s.id = j.series_id"
                          " AND s.last_job_id = j.id").fetchone()[0]
    assert linked == 3
    for i in (1, 2, 6):
        assert job_row(pinned_conn, int(items[i]["job_id"]))["series_id"] == int(items[i]["series_id"])


def test_an_item_that_cannot_be_stored_is_refused_alone_beside_a_series(client, pinned_conn):
    before = counts(pinned_conn)
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": [
        {"name": "s", "repeat": {"every_s": 60}}, {"name": "a\u0000b"}]})
    assert r.status_code == 200, r.text
    first, second = r.json()["items"]
    assert first["created"] and first["series_id"] is not None
    assert not second["created"] and "cannot be stored" in second["error"]
    after = counts(pinned_conn)
    assert after["jobs"] == before["jobs"] + 1 and after["series"] == before["series"] + 1


def test_a_batch_of_only_series_for_an_unknown_team_is_404(client, pinned_conn):
    before = counts(pinned_conn)
    r = client.post("/v1/jobs/batch?team=nobody", headers={"Authorization": f"Bearer {ADMIN}"},
                    json={"jobs": [{"name": "s", "repeat": {"every_s": 60}}]})
    assert_problem(r, 404, "not-found", "unknown team")
    assert counts(pinned_conn) == before


# ---------------------------------------------------------------- store and SQL
def test_store_submit_routes_a_repeat_to_its_series(pinned_conn, pinned_store):
    got = pinned_store.submit("t", JobSpec(name="s", due_at=T0 + H, repeat=Repeat(every_s=30)))
    assert got.created and got.run_at == T0 + H and got.series_id is not None
    assert_one_series_with_its_run(pinned_conn, got.series_id, got.job_id, T0 + H)
    status = pinned_store.status(got.job_id)
    assert status.series_id == got.series_id and status.repeat == Repeat(every_s=30)
    with pytest.raises(errors.InvalidInput, match="does not fire within 366 days"):
        pinned_store.submit("t", JobSpec(name="s", repeat=Repeat(cron="0 0 30 2 *")))


def submit_series_sql(conn, **kw):
    args = {"p_team": "t", "p_name": "s", **{f"p_{k}": v for k, v in kw.items()}}
    named = ", ".join(f"{k} => %({k})s" for k in args)
    return conn.execute(f"SELECT series_id, job_id, run_at, created FROM submit_series({named})", args).fetchone()


def test_sql_submission_of_a_series_rolls_back_with_the_callers_transaction(db_dsn, pinned_conn):
    with psycopg.connect(db_dsn) as other:
        pin(other, T0)
        series_id, job_id, run_at, created = submit_series_sql(other, every_s=3600, payload=Jsonb({"a": 1}),
                                                               idempotency_key="tx")
        assert created and run_at == T0
        assert other.execute("SELECT count(*) FROM series").fetchone()[0] == 1
        other.rollback()
        assert counts(pinned_conn) == dict.fromkeys(TABLES, 0)
        pin(other, T0)                                   # the rollback undid the pin too
        kept = submit_series_sql(other, cron="0 3 * * *", timezone="Europe/Berlin",
                                 first_due_at=dt.datetime(2030, 1, 2, 2, tzinfo=UTC), idempotency_key="tx")
        other.commit()
    assert_one_series_with_its_run(pinned_conn, kept[0], kept[1], dt.datetime(2030, 1, 2, 2, tzinfo=UTC))
    assert counts(pinned_conn)["idempotency_keys"] == 1


@pytest.mark.parametrize("kw, sqlstate, msg", [
    ({"cron": "0 3 * * *"}, "MH400", "needs its first due time"),
    ({}, "MH400", "exactly one of every_s or cron"),
    ({"every_s": 60, "cron": "* * * * *"}, "MH400", "exactly one"),
    ({"every_s": -1}, "MH400", "every_s must be between"),
    ({"every_s": 60, "timezone": "UTC"}, "MH400", "goes with cron"),
    ({"cron": "0 3 * *", "first_due_at": T0 + H}, "MH400", "not a 5-field crontab"),
    ({"cron": "0 3 * * * *", "first_due_at": T0 + H}, "MH400", "not a 5-field crontab"),
    ({"cron": "0 3 * * *", "timezone": "Mars/Olympus", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "UTC+3", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "CEST", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "../etc/passwd", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "localtime", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "Factory", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "posix/Europe/Berlin", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *", "timezone": "right/UTC", "first_due_at": T0 + H}, "MH400", "IANA"),
    ({"cron": "0 3 * * *\n", "first_due_at": T0 + H}, "MH400", "not a 5-field crontab"),
    ({"cron": " 0 3 * * *", "first_due_at": T0 + H}, "MH400", "not a 5-field crontab"),
    ({"cron": "0  3 * * *", "first_due_at": T0 + H}, "MH400", "not a 5-field crontab"),
    ({"every_s": 60, "payload": Jsonb(None, dumps=lambda _: '{"n": [1, {"x": 1e400}]}')}, "MH400", "beyond a double"),
    ({"every_s": 60, "due_at": T0 + DAY, "first_due_at": T0 + H}, "MH400", "cannot be due before"),
    ({"every_s": 60, "first_due_at": T0 + 400 * DAY}, "MH400", "more than"),
    ({"every_s": 60, "first_due_at": dt.datetime.max.replace(tzinfo=UTC)}, "MH400", "more than"),
    ({"every_s": 60, "due_at": T0 + 400 * DAY}, "MH400", "ahead"),
    ({"every_s": 60, "max_attempts": 0}, "MH400", "max_attempts"),
    ({"every_s": 60, "payload": Jsonb({"b": "x" * 300_000})}, "MH413", "over the limit"),
    ({"every_s": 60, "team": "nobody"}, "MH404", "unknown team"),
])
def test_sql_refusals_write_nothing(pinned_conn, kw, sqlstate, msg):
    before = counts(pinned_conn)
    with pytest.raises(psycopg.Error) as err:
        submit_series_sql(pinned_conn, **kw)
    assert err.value.sqlstate == sqlstate and msg in err.value.diag.message_primary
    assert counts(pinned_conn) == before


def test_sql_zones_by_iana_name(pinned_conn):
    for zone in ("UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5", "EST5EDT", "Japan"):
        assert submit_series_sql(pinned_conn, cron="0 3 * * *", timezone=zone, first_due_at=T0 + H)[3] is True, zone


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "59 23 31 11 *"])
def test_a_cron_that_never_fires_is_refused_in_milliseconds(client, pinned_conn, cron):
    """Its search stops at the horizon: under 50 ms of CPU for the search,
    and the request refused (422) writing nothing."""
    spent = time.thread_time()
    with pytest.raises(ValueError, match="does not fire within 366 days"):
        repeats.first_due(Repeat(cron=cron), None, T0)
    assert time.thread_time() - spent < 0.05
    before = counts(pinned_conn)
    assert_problem(client.post("/v1/jobs", headers=T, json={"name": "a", "repeat": {"cron": cron}}), 422,
                   "invalid-input", "does not fire within 366 days")
    assert counts(pinned_conn) == before
