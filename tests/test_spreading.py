"""Spreading agreed at submission: a flexible job's run time is placed once,
in SQL, where its window is least loaded (sql/functions/spread.sql); the
planned load per minute (load_minutes), default windows per team and job
name (flex_defaults) and their HTTP routes, a repeating series' stable
offset, the purge of old load rows, the plans of the load's read and
upsert, and one team's open transaction holding up no other team's
submissions. The clock is pinned to T0 (reused_db module)."""
from __future__ import annotations

import datetime as dt
import json
import time

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.api.app import create_app
from minutehand.settings import Settings
from minutehand.store import errors, migrate
from minutehand.store.records import Repeat
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.support import AUTO_EXPLAIN_ON_CITUS, T0, make_store, pin, skip_on_citus

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

UTC = dt.timezone.utc
MIN = dt.timedelta(minutes=1)
DUE = dt.datetime(2030, 1, 2, 0, 0, tzinfo=UTC)      # midnight after T0 (2030-01-01 12:00:30)
ADMIN = "admin-secret-token"
T = {"Authorization": "Bearer tok-team-t"}
U = {"Authorization": "Bearer tok-team-u"}
A = {"Authorization": f"Bearer {ADMIN}"}


def submit_batches(conn, items: list[tuple[bool, int]], batch: int = 1000) -> float:
    """(strict, flex_s) jobs named "m", due at DUE, through submit_jobs in batches; seconds spent."""
    started = time.perf_counter()
    for i in range(0, len(items), batch):
        part = items[i:i + batch]
        conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s, p_stricts => %s)",
                     (["m"] * len(part), [DUE] * len(part), [f for _, f in part], [s for s, _ in part]))
    return time.perf_counter() - started


def per_minute(conn, strict: bool) -> dict[dt.datetime, int]:
    rows = conn.execute("SELECT date_trunc('minute', run_at), count(*) FROM jobs WHERE strict = %s GROUP BY 1",
                        (strict,)).fetchall()
    return dict(rows)


# ---------------------------------------------------------------- placement at volume
@pytest.mark.parametrize("order", ["strict_first", "interleaved"])
def test_flexible_jobs_fill_the_gaps_around_strict_ones_evenly(pinned_conn, order):
    flexible, strict = 200_000, 20_000
    if order == "strict_first":
        items = [(True, 0)] * strict + [(False, 3600)] * flexible
    else:                                           # one strict job after every ten flexible ones
        items = [(False, 3600) if i % 11 else (True, 0) for i in range(flexible + strict)]
    spent = submit_batches(pinned_conn, items)
    print(f"{order}: {len(items)} jobs in {spent:.1f} s ({len(items) / spent:,.0f} jobs/s)")

    assert pinned_conn.execute("SELECT count(*) FILTER (WHERE strict), count(*) FILTER (WHERE NOT strict) "
                               "FROM jobs").fetchone() == (strict, flexible)
    # every strict job at its due time, minute 0
    assert pinned_conn.execute("SELECT count(*) FROM jobs WHERE strict AND run_at = agreed_at "
                               "AND run_at = %s", (DUE,)).fetchone()[0] == strict
    # no flexible job outside its window
    lo, hi = pinned_conn.execute("SELECT min(run_at), max(run_at) FROM jobs WHERE NOT strict").fetchone()
    assert DUE <= lo and hi <= DUE + dt.timedelta(seconds=3600)
    assert pinned_conn.execute("SELECT count(*) FROM jobs WHERE run_at <> agreed_at OR flex_s <> "
                               "CASE WHEN strict THEN 0 ELSE 3600 END").fetchone()[0] == 0
    flex = per_minute(pinned_conn, strict=False)
    assert set(flex) <= {DUE + k * MIN for k in range(60)}
    mean = flexible / len(flex)
    fullest = max(flex.values())
    assert fullest <= 1.05 * mean, (fullest, mean, sorted(flex.items())[:3])
    # minute 0 already holds the strict jobs: it gets no more flexible ones than the level elsewhere
    level = min(n for m, n in flex.items() if m != DUE)
    assert flex.get(DUE, 0) <= level
    if order == "strict_first":
        assert flex.get(DUE, 0) == 0 and len(flex) == 59
    # the planned load counts every job placed, per minute
    load = dict(pinned_conn.execute("SELECT minute, sum(jobs)::int FROM load_minutes GROUP BY minute").fetchall())
    strict_minutes = per_minute(pinned_conn, strict=True)
    assert load == {m: flex.get(m, 0) + strict_minutes.get(m, 0) for m in set(flex) | set(strict_minutes)}


def test_a_window_partly_past_starts_now_and_placement_never_goes_before_now(pinned_conn):
    due = T0 - dt.timedelta(minutes=30)            # window [due, due + 1 h]: its first half has passed
    rows = pinned_conn.execute(
        "SELECT run_at FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
        (["p"] * 300, [due] * 300, [3600] * 300)).fetchall()
    runs = [r[0] for r in rows]
    assert min(runs) >= T0 and max(runs) <= due + dt.timedelta(hours=1)
    # spread over the minutes left (the whole ones after now), not piled at now
    minutes = {r.replace(second=0, microsecond=0) for r in runs}
    assert len(minutes) >= 25
    # a window wholly past: now
    assert pinned_conn.execute("SELECT run_at FROM submit_jobs('t', ARRAY['p'], ARRAY[%s::timestamptz], "
                               "p_flex_s => ARRAY[60])", (T0 - dt.timedelta(hours=2),)).fetchone()[0] == T0


def test_single_submissions_fill_the_least_loaded_minutes(pinned_conn, pinned_store):
    # a strict crowd at minute 0 and 1 of a 10-minute window; one-by-one flexible submissions avoid them
    pinned_store.submit_many("t", [JobSpec(name="s", due_at=DUE, strict=True)] * 100
                             + [JobSpec(name="s", due_at=DUE + MIN, strict=True)] * 100)
    for _ in range(200):
        pinned_store.submit("t", JobSpec(name="f", due_at=DUE, flex_s=600))
    flex = per_minute(pinned_conn, strict=False)
    assert sum(flex.values()) == 200
    assert flex.get(DUE, 0) + flex.get(DUE + MIN, 0) <= 5
    assert max(flex.values()) <= 40        # 200 over the 8 free minutes: 25 each on average


def test_a_batch_of_jobs_with_different_windows_does_not_pile_onto_one_minute(pinned_conn):
    # every job its own due time (small groups: d choices each, counts kept as the batch places)
    dues = [DUE + dt.timedelta(seconds=i) for i in range(600)]
    pinned_conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                        (["d"] * 600, dues, [1800] * 600))
    flex = per_minute(pinned_conn, strict=False)
    assert max(flex.values()) <= 3 * 600 / len(flex), flex
    assert pinned_conn.execute("SELECT count(*) FROM jobs WHERE run_at < due_at "
                               "OR run_at > due_at + make_interval(secs => flex_s)").fetchone()[0] == 0


def test_the_load_is_written_once_per_minute_and_stripe_per_batch(db_dsn):
    with psycopg.connect(db_dsn) as conn:          # one transaction: its own counts of row writes
        pin(conn, T0)
        conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                     (["w"] * 1000, [DUE] * 1000, [600] * 1000))
        writes = conn.execute("SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables "
                              "WHERE relname = 'load_minutes'").fetchone()[0]
        rows = conn.execute("SELECT count(*), count(DISTINCT stripe), sum(jobs) FROM load_minutes").fetchone()
        assert rows == (10, 1, 1000) and writes == 10
        # a second batch adds to the same rows, once each
        conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                     (["w"] * 1000, [DUE] * 1000, [600] * 1000))
        assert conn.execute("SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables "
                            "WHERE relname = 'load_minutes'").fetchone()[0] == 20
        assert conn.execute("SELECT count(*), sum(jobs), max(jobs) - min(jobs) FROM load_minutes").fetchone() \
            == (10, 2000, 0)
        stripe = conn.execute("SELECT pg_backend_pid() % 16").fetchone()[0]
        assert conn.execute("SELECT DISTINCT stripe FROM load_minutes").fetchone()[0] == stripe
        assert conn.execute("SELECT DISTINCT l.team_id FROM load_minutes l").fetchall() \
            == conn.execute("SELECT id FROM teams WHERE name = 't'").fetchall()


def test_count_load_adds_a_batch_of_run_times(pinned_conn):
    pinned_conn.execute("SELECT mh_count_load(1, %s)", ([DUE, DUE + dt.timedelta(seconds=59), DUE + MIN, None],))
    pinned_conn.execute("SELECT mh_count_load(1, %s)", ([DUE],))
    pinned_conn.execute("SELECT mh_count_load(2, %s)", ([DUE],))
    pinned_conn.execute("SELECT mh_count_load(1, NULL)")
    assert pinned_conn.execute("SELECT minute, team_id, sum(jobs)::int FROM load_minutes GROUP BY 1, 2 ORDER BY 1, 2"
                               ).fetchall() == [(DUE, 1, 3), (DUE, 2, 1), (DUE + MIN, 1, 1)]


def test_purge_drops_the_load_of_minutes_more_than_an_hour_back_in_bounded_batches(pinned_conn, pinned_store):
    pinned_conn.execute("""INSERT INTO load_minutes (minute, team_id, stripe, jobs)
                           SELECT %s::timestamptz - k * interval '1 minute', 1 + s %% 2, s, 1
                             FROM generate_series(0, 179) k, generate_series(0, 3) s""",
                        (T0.replace(second=0),))
    assert pinned_conn.execute("SELECT purge_load(100)").fetchone()[0] == 100
    assert pinned_store.purge_load() == 4 * 120 - 100            # minutes before T0 - 1 h: 60..179 back
    assert pinned_store.purge_load() == 0
    oldest = pinned_conn.execute("SELECT min(minute) FROM load_minutes").fetchone()[0]
    assert oldest == T0.replace(second=0) - 59 * MIN and oldest >= T0 - dt.timedelta(hours=1)
    assert pinned_store.maintain().load_purged == 0


# ---------------------------------------------------------------- repeating series
def test_a_flexible_series_keeps_one_offset_day_after_day(pinned_conn, pinned_store):
    s = pinned_store.submit("t", JobSpec(name="daily", due_at=DUE, flex_s=3600, repeat=Repeat(every_s=86400)))
    offset = pinned_conn.execute("SELECT mh_series_offset(%s, 3600)", (s.series_id,)).fetchone()[0]
    assert s.run_at - DUE == offset and dt.timedelta(0) <= offset <= dt.timedelta(hours=1)
    # the next day (the clock a day on): the same series' run lands on the same offset
    day2 = pinned_conn.execute("SELECT %s::timestamptz + interval '1 day' + mh_series_offset(%s, 3600)",
                               (DUE, s.series_id)).fetchone()[0]
    assert day2 - (DUE + dt.timedelta(days=1)) == s.run_at - DUE
    pinned_store.clock = T0 + dt.timedelta(days=1)
    again = pinned_store.submit("t", JobSpec(name="daily", due_at=DUE + dt.timedelta(days=1), flex_s=3600,
                                             repeat=Repeat(every_s=86400)))
    assert again.run_at - (DUE + dt.timedelta(days=1)) == pinned_conn.execute(
        "SELECT mh_series_offset(%s, 3600)", (again.series_id,)).fetchone()[0]
    # the runs count in the planned load
    assert pinned_conn.execute("SELECT sum(jobs) FROM load_minutes").fetchone()[0] == 2


def test_series_offsets_are_uniform_over_the_window(pinned_conn):
    tenths = pinned_conn.execute(
        """SELECT width_bucket(extract(epoch FROM mh_series_offset(mh_new_id((g % 256)::smallint), 3600)),
                               0, 3600.0001, 10), count(*)
             FROM generate_series(1, 5000) g GROUP BY 1 ORDER BY 1""").fetchall()
    assert [b for b, _ in tenths] == list(range(1, 11))
    assert all(400 <= n <= 600 for _, n in tenths), tenths
    assert pinned_conn.execute("SELECT mh_series_offset(12345, 0), mh_series_offset(12345, NULL)").fetchone() \
        == (dt.timedelta(0), dt.timedelta(0))


# ---------------------------------------------------------------- default windows
def job(conn, job_id: int) -> dict:
    return conn.execute("SELECT to_jsonb(j) FROM jobs j WHERE id = %s", (job_id,)).fetchone()[0]


def test_a_job_without_flex_gets_the_default_of_its_name(pinned_conn, pinned_store):
    pinned_store.set_flex_default(None, "report", 600)          # operator: every team
    pinned_store.set_flex_default("t", "report", 1200)          # team t overrides it
    t_job = pinned_store.submit("t", JobSpec(name="report", due_at=DUE))
    u_job = pinned_store.submit("u", JobSpec(name="report", due_at=DUE))
    other = pinned_store.submit("t", JobSpec(name="other", due_at=DUE))
    assert job(pinned_conn, t_job.job_id)["flex_s"] == 1200
    assert job(pinned_conn, u_job.job_id)["flex_s"] == 600
    assert job(pinned_conn, other.job_id)["flex_s"] == 0 and other.run_at == DUE
    assert DUE <= t_job.run_at <= DUE + dt.timedelta(seconds=1200)
    # explicit flex_s (0 included) and strict win
    zero = pinned_store.submit("t", JobSpec(name="report", due_at=DUE, flex_s=0))
    strict = pinned_store.submit("t", JobSpec(name="report", due_at=DUE, strict=True))
    five = pinned_store.submit("t", JobSpec(name="report", due_at=DUE, flex_s=5))
    assert [job(pinned_conn, j.job_id)["flex_s"] for j in (zero, strict, five)] == [0, 0, 5]
    assert zero.run_at == strict.run_at == DUE
    # batches and SQL callers alike
    items = pinned_store.submit_many("t", [JobSpec(name="report", due_at=DUE), JobSpec(name="report", flex_s=0),
                                           JobSpec(name="report", strict=True),
                                           JobSpec(name="report", due_at=DUE, idempotency_key="k1")])
    assert [job(pinned_conn, i.job_id)["flex_s"] for i in items] == [1200, 0, 0, 1200]
    sql_id = pinned_conn.execute("SELECT submit_job('u', 'report', %s)", (DUE,)).fetchone()[0]
    assert job(pinned_conn, sql_id)["flex_s"] == 600
    # removing the team's rule: the operator's applies again
    assert pinned_store.delete_flex_default("t", "report") is True
    assert pinned_store.delete_flex_default("t", "report") is False
    assert job(pinned_conn, pinned_store.submit("t", JobSpec(name="report", due_at=DUE)).job_id)["flex_s"] == 600


def test_a_batch_with_no_strict_item_gets_the_default_windows_of_its_names(pinned_conn, pinned_store):
    """With no item strict (the store then sends no strictness at all, as a
    coalesced single POST does) and through SQL's submit_jobs without
    p_stricts: every item without a window gets its name's."""
    pinned_store.set_flex_default(None, "nightly", 3600)
    items = pinned_store.submit_many("t", [JobSpec(name="nightly", due_at=DUE), JobSpec(name="nightly"),
                                           JobSpec(name="other", due_at=DUE)])
    assert [job(pinned_conn, i.job_id)["flex_s"] for i in items] == [3600, 3600, 0]
    ids = [r[0] for r in pinned_conn.execute(
        "SELECT job_id FROM submit_jobs('u', ARRAY['nightly', 'nightly'], ARRAY[%s, %s]::timestamptz[]) "
        "ORDER BY idx", (DUE, DUE)).fetchall()]
    assert [job(pinned_conn, i)["flex_s"] for i in ids] == [3600, 3600]
    strict = pinned_conn.execute("SELECT job_id FROM submit_jobs('u', ARRAY['nightly'], p_stricts => ARRAY[true])"
                                 ).fetchone()[0]
    assert job(pinned_conn, strict)["flex_s"] == 0


def test_idempotency_keys_compare_the_flex_window_as_sent(pinned_store):
    pinned_store.set_flex_default("t", "keyed", 900)
    first = pinned_store.submit("t", JobSpec(name="keyed", due_at=DUE, idempotency_key="a"))
    assert first.created
    again = pinned_store.submit("t", JobSpec(name="keyed", due_at=DUE, idempotency_key="a"))
    assert (again.created, again.job_id, again.run_at) == (False, first.job_id, first.run_at)
    # the default changing does not make the same request a different one
    pinned_store.set_flex_default("t", "keyed", 60)
    assert pinned_store.submit("t", JobSpec(name="keyed", due_at=DUE, idempotency_key="a")).job_id == first.job_id
    # sending the window the default gave is a different request
    with pytest.raises(errors.Conflict):
        pinned_store.submit("t", JobSpec(name="keyed", due_at=DUE, flex_s=900, idempotency_key="a"))


def test_round_cron_series_get_the_round_cron_default(pinned_conn, pinned_store):
    pinned_store.set_flex_default(None, None, 300)              # operator's round-cron rule
    pinned_store.set_flex_default("t", None, 1800)              # team t's own
    def series_flex(team: str, name: str, cron: str) -> int:
        s = pinned_store.submit(team, JobSpec(name=name, repeat=Repeat(cron=cron)))
        return pinned_conn.execute("SELECT s.flex_s FROM series s JOIN jobs j ON j.shard = s.shard "
                                   "AND j.series_id = s.id WHERE j.id = %s AND j.flex_s = s.flex_s",
                                   (s.job_id,)).fetchone()[0]
    assert series_flex("t", "nightly", "0 0 * * *") == 1800
    assert series_flex("u", "nightly", "0 0 * * *") == 300
    assert series_flex("t", "odd", "7 0 * * *") == 0
    assert series_flex("t", "quarter", "*/15 * * * *") == 1800
    # a rule for the name wins over the round-cron one; explicit flex and strict win over both
    pinned_store.set_flex_default(None, "named", 60)
    assert series_flex("t", "named", "0 * * * *") == 60
    s = pinned_store.submit("t", JobSpec(name="nightly", flex_s=0, repeat=Repeat(cron="0 0 * * *")))
    assert job(pinned_conn, s.job_id)["flex_s"] == 0
    s = pinned_store.submit("t", JobSpec(name="nightly", strict=True, repeat=Repeat(cron="0 0 * * *")))
    assert job(pinned_conn, s.job_id)["flex_s"] == 0
    # a plain job of a name with no rule is not a cron series: 0
    assert job(pinned_conn, pinned_store.submit("t", JobSpec(name="nightly")).job_id)["flex_s"] == 0


@pytest.mark.parametrize("cron, round_", [
    ("0 0 * * *", True), ("0 * * * *", True), ("*/15 * * * *", True), ("0,30 9-17 * * 1-5", True),
    ("00 3 * * *", True), ("15,45 * * * *", True), ("0/30 * * * *", True), ("  0   0 * * *", True),
    ("7 0 * * *", False), ("* * * * *", False), ("*/5 * * * *", False), ("0,7 * * * *", False),
    ("0-30 * * * *", False), ("150 * * * *", False), (None, False)])
def test_what_round_minutes_means(pinned_conn, cron, round_):
    assert pinned_conn.execute("SELECT mh_round_cron(%s)", (cron,)).fetchone()[0] is round_


def test_bad_default_windows_are_refused_in_sql(pinned_conn, pinned_store):
    with pytest.raises(errors.InvalidInput):
        pinned_store.set_flex_default("t", "x", 86401)
    with pytest.raises(errors.InvalidInput):
        pinned_store.set_flex_default("t", "x", -1)
    with pytest.raises(errors.InvalidInput):
        pinned_store.set_flex_default("t", "bad name", 10)
    with pytest.raises(errors.NotFound):
        pinned_store.set_flex_default("nope", "x", 10)
    assert pinned_conn.execute("SELECT count(*) FROM flex_defaults").fetchone()[0] == 0


# ---------------------------------------------------------------- HTTP
@pytest.fixture
def client(db_dsn, module_conn, module_store):
    module_conn.execute("UPDATE teams SET token_hash = CASE name WHEN 't' THEN %s WHEN 'u' THEN %s END",
                        (hash_token("tok-team-t"), hash_token("tok-team-u")))
    module_store.clock = T0
    with TestClient(create_app(Settings(admin_token=ADMIN), module_store, head=migrate.head())) as c:
        yield c


def rules(conn) -> list[tuple]:
    return conn.execute("SELECT team_id, job_name, flex_s FROM flex_defaults ORDER BY 1, 2").fetchall()


def test_http_a_team_sets_reads_and_removes_its_windows(client, pinned_conn):
    r = client.put("/v1/teams/me/windows/names/report", headers=T, json={"flex_s": 600})
    assert r.status_code == 200, r.text
    assert (r.json()["team"], r.json()["job_name"], r.json()["flex_s"]) == ("t", "report", 600)
    assert client.put("/v1/teams/t/windows/names/a/b:c", headers=T, json={"flex_s": 60}).status_code == 200
    assert client.put("/v1/teams/t/windows/round-cron", headers=T, json={"flex_s": 900.0}).status_code == 200
    page = client.get("/v1/teams/me/windows", headers=T).json()
    assert [(w["job_name"], w["flex_s"]) for w in page["windows"]] == [(None, 900), ("a/b:c", 60), ("report", 600)]
    assert page["next_cursor"] is None
    first = client.get("/v1/teams/t/windows?limit=2", headers=T).json()
    assert [w["job_name"] for w in first["windows"]] == [None, "a/b:c"]
    rest = client.get(f"/v1/teams/t/windows?cursor={first['next_cursor']}", headers=T).json()
    assert [w["job_name"] for w in rest["windows"]] == ["report"]
    # a job without flex_s gets it; GET /v1/jobs/{id} shows the window applied and the agreed run time
    r = client.post("/v1/jobs", headers=T, json={"name": "report", "due_at": DUE.isoformat()})
    assert r.status_code == 201, r.text
    status = client.get(f"/v1/jobs/{r.json()['job_id']}", headers=T).json()
    assert status["flex_s"] == 600 and status["agreed_at"] == r.json()["run_at"]
    assert DUE <= dt.datetime.fromisoformat(status["agreed_at"]) <= DUE + dt.timedelta(seconds=600)
    r = client.post("/v1/jobs", headers=T, json={"name": "report", "due_at": DUE.isoformat(), "flex_s": None})
    assert client.get(f"/v1/jobs/{r.json()['job_id']}", headers=T).json()["flex_s"] == 600
    r = client.post("/v1/jobs", headers=T, json={"name": "report", "due_at": DUE.isoformat(), "flex_s": 0})
    assert client.get(f"/v1/jobs/{r.json()['job_id']}", headers=T).json()["flex_s"] == 0
    r = client.post("/v1/jobs/batch", headers=T, json={"jobs": [{"name": "report", "due_at": DUE.isoformat()},
                                                                {"name": "report", "strict": True}]})
    flexes = [client.get(f"/v1/jobs/{i['job_id']}", headers=T).json()["flex_s"] for i in r.json()["items"]]
    assert flexes == [600, 0]
    # removal
    assert client.delete("/v1/teams/me/windows/names/a%2Fb:c", headers=T).status_code == 204
    assert client.delete("/v1/teams/t/windows/round-cron", headers=T).status_code == 204
    assert client.delete("/v1/teams/t/windows/round-cron", headers=T).status_code == 404
    assert rules(pinned_conn) == [(1, "report", 600)] or [r[1:] for r in rules(pinned_conn)] == [("report", 600)]


def test_http_the_admin_sets_any_teams_and_the_operators_windows(client, pinned_conn):
    assert client.put("/v1/teams/u/windows/names/x", headers=A, json={"flex_s": 10}).status_code == 200
    assert client.put("/v1/windows/names/x", headers=A, json={"flex_s": 20}).status_code == 200
    r = client.put("/v1/windows/round-cron", headers=A, json={"flex_s": 30})
    assert r.status_code == 200 and r.json()["team"] is None and r.json()["job_name"] is None
    assert [(w["job_name"], w["flex_s"]) for w in client.get("/v1/windows", headers=A).json()["windows"]] \
        == [(None, 30), ("x", 20)]
    assert [(w["job_name"], w["flex_s"]) for w in client.get("/v1/teams/u/windows", headers=A).json()["windows"]] \
        == [("x", 10)]
    assert client.delete("/v1/windows/names/x", headers=A).status_code == 204
    assert client.delete("/v1/windows/round-cron", headers=A).status_code == 204
    assert [r[1:] for r in rules(pinned_conn)] == [("x", 10)]


@pytest.mark.parametrize("method, path, headers, body, status", [
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": 86401}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": -1}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": 1.5}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": "60"}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": None}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, {"flex_s": 60, "extra": 1}, 422),
    ("PUT", "/v1/teams/t/windows/names/x", T, [60], 422),
    ("PUT", "/v1/teams/t/windows/names/bad%20name", T, {"flex_s": 60}, 422),
    ("PUT", "/v1/teams/t/windows/names/" + "n" * 201, T, {"flex_s": 60}, 422),
    ("PUT", "/v1/teams/t/windows/round-cron", T, {"flex_s": 86401}, 422),
    ("PUT", "/v1/teams/u/windows/names/x", T, {"flex_s": 60}, 404),        # another team's
    ("PUT", "/v1/teams/nope/windows/names/x", A, {"flex_s": 60}, 404),
    ("PUT", "/v1/teams/me/windows/names/x", A, {"flex_s": 60}, 422),       # the admin has no team
    ("PUT", "/v1/windows/names/x", T, {"flex_s": 60}, 403),                # operator rules: admin only
    ("PUT", "/v1/windows/round-cron", T, {"flex_s": 60}, 403),
    ("PUT", "/v1/windows/round-cron", {}, {"flex_s": 60}, 401),
    ("PUT", "/v1/windows/names/x", A, {"flex_s": 86401}, 422),
    ("DELETE", "/v1/windows/names/x", T, None, 403),
    ("DELETE", "/v1/teams/t/windows/names/x", T, None, 404),               # none to remove
    ("DELETE", "/v1/teams/u/windows/round-cron", T, None, 404),
    ("GET", "/v1/windows", T, None, 403),
    ("GET", "/v1/teams/u/windows", T, None, 404),
    ("GET", "/v1/teams/t/windows?limit=0", T, None, 400),
    ("POST", "/v1/jobs", T, {"name": "j", "flex_s": -1}, 422),
    ("POST", "/v1/jobs", T, {"name": "j", "flex_s": 60, "strict": True}, 422),
])
def test_http_bad_window_requests_are_refused_and_write_nothing(client, pinned_conn, method, path, headers, body,
                                                                 status):
    before = (rules(pinned_conn), pinned_conn.execute("SELECT count(*) FROM jobs").fetchone()[0])
    if body is None:
        r = client.request(method, path, headers=headers)
    else:
        r = client.request(method, path, content=json.dumps(body),
                           headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (rules(pinned_conn), pinned_conn.execute("SELECT count(*) FROM jobs").fetchone()[0]) == before


# ---------------------------------------------------------------- plans
def test_plans_the_counts_read_is_a_bounded_index_scan_and_the_upsert_uses_the_key(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        skip_on_citus(conn, AUTO_EXPLAIN_ON_CITUS)
        conn.execute("SET search_path = minutehand")
        conn.execute("""INSERT INTO load_minutes (minute, team_id, stripe, jobs)
                        SELECT %s::timestamptz + k * interval '1 minute', t, s, 1
                          FROM generate_series(0, 10079) k, generate_series(1, 4) t, generate_series(0, 15) s""",
                     (DUE,))
        conn.execute("ANALYZE load_minutes")
        plans: list[dict] = []

        def notice(diag):
            msg = diag.message_primary or ""
            if "plan:" in msg:
                plans.append(json.loads(msg.split("plan:", 1)[1]))
        conn.add_notice_handler(notice)
        for stmt in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                     "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                     "SET auto_explain.log_level = 'notice'", "SET auto_explain.log_format = 'json'"):
            conn.execute(stmt)
        pin(conn, T0)
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                         (["e"] * 100, [DUE + dt.timedelta(days=1)] * 100, [3600] * 100))

    def nodes(plan):
        stack = [plan]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.get("Plans", []))
    on_load = [(p["Query Text"], n) for p in plans for n in nodes(p["Plan"])
               if n.get("Relation Name") == "load_minutes"]
    reads = [n for q, n in on_load if n["Node Type"] != "ModifyTable"]
    writes = [n for q, n in on_load if n["Node Type"] == "ModifyTable"]
    assert reads and writes, [q for q, _ in on_load]
    for n in reads:                       # the window's minutes through the key, never the table:
        assert n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), n["Node Type"]
        assert n["Actual Rows"] * n["Actual Loops"] <= 60 * 4 * 16     # their rows of every team and stripe
    read_index = [n for p in plans for n in nodes(p["Plan"]) if n.get("Index Name") == "load_minutes_pkey"]
    assert read_index and all("minute" in n.get("Index Cond", "") for n in read_index)
    (upsert,) = writes
    assert upsert["Operation"] == "Insert" and upsert["Conflict Resolution"] == "UPDATE"
    assert upsert["Conflict Arbiter Indexes"] == ["load_minutes_pkey"]


def test_a_batch_of_many_windows_water_fills_each_within_its_own(pinned_conn):
    # 40 windows of 9 jobs each (water-filled groups), interleaved in the batch, and strays in between
    dues = [DUE + dt.timedelta(minutes=7 * (i % 40)) for i in range(360)] + [DUE + dt.timedelta(seconds=17)] * 5
    flexes = [300 + 60 * (i % 40) for i in range(360)] + [120] * 5
    rows = pinned_conn.execute("SELECT idx, run_at FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                               (["g"] * len(dues), dues, flexes)).fetchall()
    assert len(rows) == len(dues)
    for idx, run_at in rows:
        assert dues[idx] <= run_at <= dues[idx] + dt.timedelta(seconds=flexes[idx]), (idx, run_at)
    assert pinned_conn.execute("SELECT sum(jobs) FROM load_minutes").fetchone()[0] == len(dues)
    flex = per_minute(pinned_conn, strict=False)
    assert max(flex.values()) <= 6, sorted(flex.values())[-5:]


def test_the_maintenance_duty_purges_old_load_under_its_lease(pinned_conn, pinned_store):
    from minutehand.maintenance.schedule import MaintenanceSchedule
    pinned_conn.execute("""INSERT INTO load_minutes (minute, team_id, stripe, jobs)
                           SELECT %s::timestamptz - k * interval '1 minute', 1 + s %% 2, s, 1
                             FROM generate_series(0, 999) k, generate_series(0, 15) s""", (T0.replace(second=0),))
    duties = MaintenanceSchedule(pinned_store, "d1", lambda: [])
    duties.purge_load()                      # 16,000 rows, 15,056 old: two bounded calls
    assert pinned_conn.execute("SELECT count(*), min(minute) FROM load_minutes").fetchone() \
        == (60 * 16, T0.replace(second=0) - 59 * MIN)
    # another dispatcher does not run it while d1 holds the lease
    pinned_conn.execute("INSERT INTO load_minutes VALUES (%s, 1, 0, 1)", (T0 - dt.timedelta(hours=3),))
    MaintenanceSchedule(pinned_store, "d2", lambda: []).purge_load()
    assert pinned_conn.execute("SELECT count(*) FROM load_minutes").fetchone()[0] == 60 * 16 + 1


def test_concurrent_batches_place_and_count_without_deadlocks(db_dsn):
    import threading
    failures: list[BaseException] = []

    def submitter(k: int) -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                conn.execute("SET search_path = minutehand")
                pin(conn, T0)
                for _ in range(15):
                    conn.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s, p_stricts => %s)",
                                 (["c"] * 200, [DUE] * 200, [0 if i % 5 == k else 1200 for i in range(200)],
                                  [i % 5 == k for i in range(200)]))
        except BaseException as exc:          # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = minutehand")
        assert conn.execute("SELECT sum(jobs) FROM load_minutes").fetchone()[0] == 4 * 15 * 200
        flex = dict(conn.execute("SELECT date_trunc('minute', run_at), count(*) FROM jobs WHERE NOT strict "
                                 "GROUP BY 1").fetchall())
        # sessions place against what the others committed: close to even, not exact
        assert max(flex.values()) <= 1.5 * sum(flex.values()) / 20, sorted(flex.values())


# ---------------------------------------------------------------- teams apart
def test_an_open_transaction_of_one_team_holds_up_no_other_teams_submissions(db_dsn, module_conn):
    """Team u submits inside its own transaction (the documented use), for
    the minute DUE, and keeps it open; meanwhile team t's submissions for
    that minute, over HTTP and in SQL, strict and flexible, single and
    batched, each go through at once. Every session here has u's stripe of
    the planned load, so a counter row the teams shared would keep t's
    submissions waiting until u commits."""
    import threading

    hold, prompt = 10.0, 3.0
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token("tok-team-t"),))
    store = make_store(db_dsn, max_size=1)             # the API's one session, whose stripe u's shares
    opened: list[psycopg.Connection] = []
    release: threading.Timer | None = None

    def session(stripe: int, autocommit: bool) -> psycopg.Connection:
        """A new session in that stripe (sessions are opened until one is)."""
        for _ in range(500):
            conn = psycopg.connect(db_dsn, autocommit=autocommit)
            pin(conn, T0)
            if conn.execute("SELECT mh_load_stripe()").fetchone()[0] == stripe:
                opened.append(conn)
                return conn
            conn.close()
        raise AssertionError(f"no session in stripe {stripe}")

    try:
        with store.pool.connection() as c:
            stripe = c.execute("SELECT mh_load_stripe() AS stripe").fetchone()["stripe"]
        held = session(stripe, autocommit=False)
        held.execute("SELECT submit_job('u', 'held', %s, p_strict => true)", (DUE,))
        held.execute("SELECT submit_job('u', 'held', %s, p_flex_s => 60)", (DUE,))
        release = threading.Timer(hold, held.commit)
        release.start()
        spent: list[tuple[str, float]] = []

        def timed(label: str, call) -> None:
            started = time.perf_counter()
            call()
            spent.append((label, time.perf_counter() - started))

        due = DUE.isoformat()
        with TestClient(create_app(Settings(admin_token=ADMIN), store, head=migrate.head())) as client:
            def post(path: str, body: dict) -> None:
                r = client.post(path, headers=T, json=body)
                assert r.status_code == (200 if path.endswith("/batch") else 201), r.text

            timed("http strict", lambda: post("/v1/jobs", {"name": "b", "due_at": due, "strict": True}))
            timed("http flexible", lambda: post("/v1/jobs", {"name": "b", "due_at": due, "flex_s": 60}))
            timed("http batch", lambda: post("/v1/jobs/batch", {
                "jobs": [{"name": "b", "due_at": due, "flex_s": 60}] * 20 + [{"name": "b", "due_at": due,
                                                                             "strict": True}]}))
        sql = session(stripe, autocommit=True)
        timed("sql strict", lambda: sql.execute("SELECT submit_job('t', 'b', %s, p_strict => true)", (DUE,)))
        timed("sql flexible", lambda: sql.execute("SELECT submit_job('t', 'b', %s, p_flex_s => 60)", (DUE,)))
        timed("sql batch", lambda: sql.execute("SELECT count(*) FROM submit_jobs('t', %s, %s, p_flex_s => %s)",
                                               (["b"] * 20, [DUE] * 20, [60] * 20)))
        assert [label for label, s in spent if s >= prompt] == [], spent
        # u commits: the planned load of the minute is both teams' jobs (u's 2, t's 23 over HTTP, 22 in SQL)
        release.cancel()
        held.commit()
        assert sql.execute("SELECT count(*) FROM jobs WHERE run_at >= %s AND run_at < %s",
                           (DUE, DUE + MIN)).fetchone()[0] == 2 + 23 + 22
        assert sql.execute("SELECT sum(jobs) FROM load_minutes WHERE minute = %s", (DUE,)).fetchone()[0] == 2 + 23 + 22
    finally:
        if release is not None:
            release.cancel()
        for c in opened:
            c.close()
        store.close()
