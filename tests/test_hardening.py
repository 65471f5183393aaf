"""What one team's bad or careless input must not do to another team, the
service or a job, through the interfaces it was found on: SQL, the store
and a running dispatcher (the HTTP limits: tests/test_api_hardening.py).

- a due time before 2000 is refused (a BC date could be stored and not read
  back, and one such row once stalled every team's dispatch), and a row
  that cannot be delivered anyway fails alone while the round's other jobs
  go out;
- cron expressions that never fire cost microseconds (searched to the
  horizon only), time zones without '/' are looked up in a table;
- a claim that fails for one worker's request fails that request alone;
- workers waiting for names with nothing due do not hold up the others;
- rows are locked in one global order, and an aborted transaction is tried
  again, then reported as what it is;
- a takeover's stale lease is a warning, not a failed round;
- /readyz is 503 while the process's dispatcher cannot hand out jobs (it
  holds no shard, or a thread of it is not running), not only /healthz's 200;
- the SQL interface: arrays of one length, cancel for a named team, the
  clock pinned only by minutehand_clock, a grant script for the roles;
- job names are global, so a leased job names its team and a worker may
  take only some teams' jobs;
- a claim that expired on the last attempt says so in the status record.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.settings import Settings
from minutehand.store import errors
from minutehand.store.records import Repeat
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.processes import wait_until
from tests.support import (T0, claim_all, counts, lease_all, lease_until, make_store, on_citus, pin,
                           started_dispatcher, submit_sql)

UTC = dt.timezone.utc
BC = "4713-01-01 00:00:00+00 BC"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pinned_store(db_dsn):
    """This module's own: on the test's fresh database, clock pinned to T0, teams t and u."""
    s = make_store(db_dsn)
    s.create_team("t")
    s.create_team("u")
    yield s
    s.close()


def sqlstate(conn: psycopg.Connection, sql: str, params=()) -> str | None:
    try:
        with conn.transaction():
            conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


# ---------------------------------------------------------------- due times
@pytest.mark.parametrize("due", [BC, "0001-01-01 00:00:00+14", "1999-12-31 23:59:59+00", "infinity"])
def test_a_due_time_before_2000_is_refused_in_sql_and_writes_nothing(db, pinned_store, due):
    pin(db, T0)
    before = counts(db)
    assert sqlstate(db, "SELECT submit_job('t', 'x', %s::timestamptz)", (due,)) == "MH400"
    assert sqlstate(db, "SELECT * FROM submit_jobs('t', ARRAY['x', 'y'], ARRAY[%s::timestamptz, NULL])",
                    (due,)) is None                    # a batch reports it per item
    items = db.execute("SELECT idx, error FROM submit_jobs('t', ARRAY['x'], ARRAY[%s::timestamptz])",
                       (due,)).fetchall()
    assert items[0][1] and ("before 2000" in items[0][1] or "finite" in items[0][1]), items
    with pytest.raises(errors.InvalidInput):
        pinned_store.submit("t", JobSpec(name="x", due_at=dt.datetime(1999, 1, 1, tzinfo=UTC)))
    # a series' first run: every_s from a due time or an explicit first due time
    assert sqlstate(db, "SELECT * FROM submit_series('t', 'x', p_every_s => 60, p_first_due_at => %s)",
                    (due,)) == "MH400"
    assert counts(db) == {**before, "jobs": before["jobs"] + 1, "due_minutes": before["due_minutes"] + 1}


def test_a_past_due_time_in_this_century_still_runs_at_once(db, pinned_store):
    pin(db, T0)
    job_id, run_at, created = submit_sql(db, due_at=dt.datetime(2000, 1, 1, tzinfo=UTC))
    assert created and run_at == T0


def test_a_row_that_cannot_be_delivered_fails_alone_and_the_round_goes_on(db_dsn, db):
    """A job whose times no client can read (written around the procedures)
    is set aside as dead with the reason; every other job claimed in the
    same round reaches its worker, and nothing stays claimed."""
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    s.create_team("u")
    good = [s.submit("u", JobSpec(name="x")).job_id for _ in range(8)]
    bad = s.submit("t", JobSpec(name="x")).job_id
    db.execute("UPDATE jobs SET due_at = %s, run_at = %s WHERE id = %s", (BC, BC, bad))
    db.execute("UPDATE due_minutes SET run_at = %s WHERE job_id = %s", (BC, bad))
    d = started_dispatcher(s)
    state = "SELECT state, last_error FROM jobs WHERE id = %s"
    try:
        # The good ones, and no more: asked for longer, they would come again once their claims ran out.
        got = asyncio.run(lease_until(d, len(good), capacity=50))
        wait_until(lambda: db.execute(state, (bad,)).fetchone()[0] == "dead", 60, "the bad row set aside")
    finally:
        d.stop()
        s.close()
    assert sorted(int(j.job_id) for j in got) == sorted(good)
    row = db.execute(state, (bad,)).fetchone()
    assert row[0] == "dead" and "cannot be delivered" in row[1], row
    assert db.execute("SELECT count(*) FROM jobs WHERE state = 'claimed'").fetchone()[0] == len(good)


# ---------------------------------------------------------------- repeating specs
def test_cron_expressions_that_never_fire_are_refused_quickly(pinned_store, db):
    """Searched to the horizon, not to year 9999 (0.2-0.6 s each before)."""
    before = counts(db)
    started = time.monotonic()
    items = pinned_store.submit_many("t", [JobSpec(name="s", repeat=Repeat(cron="0 0 31 2 *"))] * 40)
    assert time.monotonic() - started < 5
    assert all(i.error and "does not fire within 366 days" in i.error for i in items)
    assert counts(db) == before


def test_fire_times_of_one_request_have_a_cpu_budget(pinned_store, db, monkeypatch):
    monkeypatch.setattr("minutehand.store.submit.FIRE_TIME_BUDGET_S", 0.0)
    before = counts(db)
    items = pinned_store.submit_many("t", [JobSpec(name="plain")] + [JobSpec(name="s", repeat=Repeat(cron="0 3 * * *"))] * 3)
    assert items[0].error is None
    assert all(i.error and "of CPU" in i.error for i in items[1:])
    assert counts(db)["jobs"] == before["jobs"] + 1


def test_zone_names_are_looked_up_not_listed_from_disk(db):
    """Zulu (no '/') used to read every zone file of the server per item."""
    assert db.execute("SELECT mh_repeat_problem(NULL, '0 3 * * *', 'Zulu')").fetchone()[0] is None
    assert "IANA" in db.execute("SELECT mh_repeat_problem(NULL, '0 3 * * *', 'CEST')").fetchone()[0]
    assert "IANA" in db.execute("SELECT mh_repeat_problem(NULL, '0 3 * * *', 'UTC+3')").fetchone()[0]
    started = time.monotonic()
    for _ in range(100):
        db.execute("SELECT mh_repeat_problem(NULL, '0 3 * * *', 'Zulu')")
    assert time.monotonic() - started < 2          # ~115 ms each before: 11 s


# ---------------------------------------------------------------- the dispatcher's waiters
def test_a_claim_that_fails_for_one_request_fails_it_alone(db_dsn):
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    job = s.submit("t", JobSpec(name="x")).job_id
    d = started_dispatcher(s)

    async def both():
        # A value the database cannot take (NUL), past the HTTP checks (with a
        # name that is due: a worker's names none of which is due are not claimed for).
        bad = asyncio.ensure_future(d.lease("evil", 1, ["x\x00", "x"], 5.0))
        await asyncio.sleep(0.05)
        good = asyncio.ensure_future(d.lease("good", 1, ["x"], 5.0))
        return await asyncio.gather(bad, good, return_exceptions=True)
    try:
        bad, good = asyncio.run(both())
    finally:
        d.stop()
        s.close()
    assert isinstance(bad, psycopg.DataError) and "0x00" in str(bad)     # (said by the server: lists go in binary)
    assert [int(j.job_id) for j in good] == [job]


def test_idle_waiters_for_other_names_do_not_hold_up_a_due_job(db_dsn):
    """100 workers wait for a name with nothing due; a worker for a name
    with a due job gets it at once (it took 6 s behind 31 idle waiters and
    14 s behind 500), and the idle ones do not see the shard as drained."""
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    for _ in range(300):                           # rows of another name keep the shards due
        s.submit("t", JobSpec(name="busy", due_at=dt.datetime.now(UTC) - dt.timedelta(seconds=1)))
    d = started_dispatcher(s)
    rounds = []
    claim = s.claim
    s.claim = lambda *a, **kw: rounds.append(time.monotonic()) or claim(*a, **kw)

    async def run():
        idle = [asyncio.ensure_future(d.lease(f"idle{i}", 5, ["nothing"], 6.0)) for i in range(100)]
        await asyncio.sleep(0.5)                   # they have all been tried once
        before = len(rounds)
        await asyncio.sleep(2.0)                   # and do not spin: one look a second at most (a look
        assert len(rounds) - before <= 10, len(rounds) - before    # at 256 shards is 3 round trips)
        job = await asyncio.to_thread(s.submit, "t", JobSpec(name="wanted"))
        started, before = time.monotonic(), len(rounds)
        got = await d.lease("eager", 1, ["wanted"], 10.0)
        took, looked = time.monotonic() - started, len(rounds) - before
        await asyncio.gather(*idle)
        return job, got, took, looked
    try:
        job, got, took, looked = asyncio.run(run())
    finally:
        d.stop()
        s.close()
    print(f"the due job reached its worker in {took:.3f} s, {looked} claim round trips")
    assert [int(j.job_id) for j in got] == [job.job_id]
    # The idle waiters' name is known not to be due: the due job's own claims
    # alone (before: 350 round trips a second).
    assert looked <= 2, looked


def test_a_takeover_is_a_warning_not_a_failed_round(db_dsn, db, caplog):
    s = make_store(db_dsn, clock=None)
    s.create_team("t")
    for _ in range(50):
        s.submit("t", JobSpec(name="x"))
    d = started_dispatcher(s, shard_lease_s=60)    # no renewal (which would learn the new epochs) meanwhile
    try:
        db.execute("UPDATE shards SET epoch = epoch + 1")          # another dispatcher's epochs now
        with caplog.at_level(logging.WARNING, logger="minutehand.dispatch.dispatcher"):
            handed = asyncio.run(d.lease("w", 10, None, 5.0))
    finally:
        d.stop()
        s.close()
    assert any("claims refused" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # Nothing was claimed under the stale epochs; the keeper may lease the
    # shards anew within the wait, and what it then claims is handed out.
    claimed = {r[0] for r in db.execute("SELECT id FROM jobs WHERE state <> 'scheduled'")}
    assert claimed == {int(j.job_id) for j in handed}


def test_ready_only_while_the_dispatcher_holds_shards_and_its_threads_run(db_dsn, db):
    """Another owner holds every shard: the dispatcher starts, can own none,
    and /readyz says so (503) while /healthz says 200; the shards freed, it
    takes them and is ready; its shard keeper stopped, it is not ready again."""
    from litestar.testing import TestClient

    from minutehand.serve import build
    from minutehand.store import migrate
    s = make_store(db_dsn, clock=None)
    squatter = lease_all(s, owner="squatter", ttl_s=3600)
    process = build(Settings(dispatcher_name="d-ready", shard_lease_s=5, api_submit_workers=0), s, s,
                    head=migrate.head())
    try:
        with TestClient(process.app) as client:
            # its keeper has joined (a membership row) and taken what it could: nothing
            deadline = time.monotonic() + 10
            while not db.execute("SELECT 1 FROM dispatchers WHERE name = 'd-ready'").fetchone():
                assert time.monotonic() < deadline, "the dispatcher never joined"
                time.sleep(0.05)
            r = client.get("/readyz")
            assert r.status_code == 503 and r.headers["retry-after"], r.text
            assert "dispatcher d-ready cannot hand out jobs: it holds no shard lease" in r.json()["detail"]
            assert client.get("/healthz").status_code == 200
            s.release_leases(squatter, "squatter")
            deadline = time.monotonic() + 10
            while (r := client.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, r.text
                time.sleep(0.1)
            process.dispatcher.keeper.stop()
            r = client.get("/readyz")
            assert r.status_code == 503 and "its shard-keeper thread is not running" in r.json()["detail"], r.text
            process.dispatcher.stop()
            assert "it is stopping" in client.get("/readyz").json()["detail"]
    finally:
        s.close()


# ---------------------------------------------------------------- teams of a job name
def test_a_leased_job_names_its_team_and_a_worker_may_take_only_some_teams(db_dsn):
    s = make_store(db_dsn, clock=None)
    s.create_team("billing")
    s.create_team("intruder")
    mine = s.submit("billing", JobSpec(name="send_invoice")).job_id
    theirs = s.submit("intruder", JobSpec(name="send_invoice")).job_id
    d = started_dispatcher(s)
    try:
        trusted = asyncio.run(lease_until(d, 1, names=["send_invoice"], teams=["billing"]))
        rest = asyncio.run(lease_until(d, 1, names=["send_invoice"]))
    finally:
        d.stop()
        s.close()
    assert [(int(j.job_id), j.team) for j in trusted] == [(mine, "billing")]
    assert [(int(j.job_id), j.team) for j in rest] == [(theirs, "intruder")]


# ---------------------------------------------------------------- lock order and aborted transactions
def test_a_retried_batch_and_completions_lock_keys_in_one_order(db_dsn, pinned_store):
    """A batch retried with the same keys while their jobs complete: both
    take the key rows in (shard, key) order, so one waits for the other
    instead of deadlocking."""
    keys = [f"k{i}" for i in range(40)]
    pinned_store.submit_many("t", [JobSpec(name="x", idempotency_key=k) for k in keys])
    leases = lease_all(pinned_store)
    claimed = {j.idempotency_key: j for j in claim_all(pinned_store, leases, limit=100)}
    with psycopg.connect(db_dsn) as first, psycopg.connect(db_dsn, autocommit=True) as second:
        pin(first, T0)
        order = [r[0] for r in first.execute(
            "SELECT key FROM idempotency_keys ORDER BY shard, team_id, key").fetchall()]
        head, tail = claimed[order[0]], claimed[order[-1]]
        first.execute("SELECT * FROM complete_many(%s, %s)", ([head.job_id], [head.lease_token]))
        result: dict = {}

        def retry():
            pin(second, T0)
            try:   # the retried batch names the keys newest-first
                result["rows"] = second.execute(
                    "SELECT idx, created, error FROM submit_jobs('t', %s, p_keys => %s)",
                    (["x"] * len(keys), list(reversed(order)))).fetchall()
            except psycopg.Error as exc:
                result["error"] = exc
        t = threading.Thread(target=retry)
        t.start()
        time.sleep(0.5)                              # it waits on the first key
        first.execute("SELECT * FROM complete_many(%s, %s)", ([tail.job_id], [tail.lease_token]))
        first.commit()
        t.join(10)
    assert "error" not in result, result
    assert all(created is False and error is None for _, created, error in result["rows"])


def test_an_aborted_transaction_is_tried_again_then_reported_as_contention(pinned_store):
    tries = []

    def deadlocked():
        tries.append(1)
        with pinned_store.connection() as conn:
            conn.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01', MESSAGE = 'deadlock detected'; END $$")
    with pytest.raises(errors.Contention, match="aborted the transaction 3 times .deadlock detected.; nothing"):
        pinned_store.retrying(deadlocked)
    assert len(tries) == 3

    def once_then_fine():
        tries.append(1)
        if len(tries) == 4:
            deadlocked()
        return "ok"
    assert pinned_store.retrying(once_then_fine) == "ok"


# ---------------------------------------------------------------- the SQL interface
def test_batch_arrays_of_another_length_are_refused(db, pinned_store):
    before = counts(db)
    for sql in ("SELECT * FROM submit_jobs('t', ARRAY['a','b','c'], p_keys => ARRAY['k1'])",
                "SELECT * FROM submit_jobs('t', ARRAY['a'], p_priorities => ARRAY[1, 2])",
                "SELECT * FROM submit_jobs('t', ARRAY['a','b'], p_payloads => ARRAY['{}'::jsonb])"):
        try:
            db.execute(sql)
            raise AssertionError(f"accepted: {sql}")
        except psycopg.Error as exc:
            assert exc.sqlstate == "MH400" and "different length than p_names" in str(exc)
    assert counts(db) == before
    assert len(db.execute("SELECT * FROM submit_jobs('t', ARRAY['a','b'], p_keys => NULL)").fetchall()) == 2


def test_cancel_needs_the_team(db, pinned_store):
    job_id = submit_sql(db)[0]
    try:
        db.execute("SELECT * FROM cancel(%s, NULL)", (job_id,))
        raise AssertionError("cancel without a team was accepted")
    except psycopg.Error as exc:
        assert exc.sqlstate == "MH400"
    assert db.execute("SELECT (cancel(%s, 'u')).reason", (job_id,)).fetchone()[0] == "no such job"
    assert db.execute("SELECT state FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "scheduled"
    assert pinned_store.cancel(job_id, None).ok                 # an administrator: as the job's team


def test_only_minutehand_clock_may_pin_the_clock_and_the_grants_script_sets_up_roles(db_dsn, db):
    """An application role made with sql/grants.sql may submit and read its
    status, but not pin mh_now(), claim, or write the tables itself."""
    role = f"mh_app_{secrets.token_hex(3)}"
    password = secrets.token_hex(8)
    db.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        db.execute((ROOT / "sql" / "grants.sql").read_text())
        db.execute(f"GRANT minutehand_submitter TO {role}")
        db.execute("INSERT INTO teams (name) VALUES ('t')")
        app_dsn = psycopg.conninfo.make_conninfo(db_dsn, user=role, password=password)
        with psycopg.connect(app_dsn, autocommit=True) as app:
            job_id = app.execute("SELECT submit_job('t', 'x', p_payload => %s)", (Jsonb({}),)).fetchone()[0]
            assert app.execute("SELECT (cancel(%s, 't')).ok", (job_id,)).fetchone()[0] is True
            app.execute("SET minutehand.now = '2030-01-01 00:00+00'")
            assert sqlstate(app, "SELECT submit_job('t', 'x')") == "MH403"
            app.execute("RESET minutehand.now")
            assert sqlstate(app, "SELECT * FROM claim_due(0, 1, 'me', 1, 30)") == "42501"   # permission denied
            assert sqlstate(app, "UPDATE jobs SET state = 'succeeded'") == "42501"
        db.execute(f"GRANT minutehand_clock TO {role}")
        with psycopg.connect(app_dsn, autocommit=True) as app:
            app.execute("SET minutehand.now = '2030-01-01 00:00:30+00'")
            run_at = app.execute("SELECT run_at FROM submit_job_detail('t', 'x')").fetchone()[0]
            assert run_at == dt.datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC)
    finally:
        if not on_citus(db):        # REASSIGN OWNED segfaults a Citus 13.2 coordinator (the role owns nothing)
            db.execute(f"REASSIGN OWNED BY {role} TO current_user")
        db.execute(f"DROP OWNED BY {role}")
        db.execute(f"DROP ROLE {role}")


# ---------------------------------------------------------------- dead after an expired claim
def test_a_claim_that_expired_on_the_last_attempt_says_why_the_job_is_dead(pinned_store):
    job = pinned_store.submit("t", JobSpec(name="x", max_attempts=1))
    leases = lease_all(pinned_store)
    assert [j.job_id for j in claim_all(pinned_store, leases, lease_s=30)] == [job.job_id]
    pinned_store.clock = T0 + dt.timedelta(seconds=31)
    assert pinned_store.expire_claims(range(256)) == (0, 1)
    status = pinned_store.status(job.job_id)
    assert status.state == "dead"
    assert "claim expired on attempt 1 of 1" in status.last_error and "may have run" in status.last_error


def test_a_submission_the_database_keeps_aborting_is_503_saying_so(db_dsn, db):
    """Each try is aborted as a deadlock (a test-only trigger raises the real
    error): the store tries 3 times, then the API answers 503 with the
    reason and Retry-After, not "the database cannot be reached"."""
    from litestar.testing import TestClient

    from minutehand.api.app import create_app
    from minutehand.store import migrate
    from minutehand.store.teams import hash_token
    db.execute("INSERT INTO teams (name, token_hash) VALUES ('t', %s)", (hash_token("tok-t"),))
    db.execute("""CREATE FUNCTION abort_as_deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN
                      RAISE EXCEPTION USING ERRCODE = '40P01', MESSAGE = 'deadlock detected';
                  END $$""")
    # On team_stats, which every submission writes after its job: it stays on
    # the coordinator under Citus, which refuses triggers on distributed tables.
    db.execute("CREATE TRIGGER abort_as_deadlock BEFORE INSERT ON team_stats "
               "FOR EACH ROW EXECUTE FUNCTION abort_as_deadlock()")
    before = counts(db)
    s = Store(db_dsn, max_size=2)
    try:
        with TestClient(create_app(Settings(api_submit_workers=0), s, head=migrate.head())) as client:
            r = client.post("/v1/jobs", headers={"Authorization": "Bearer tok-t"}, json={"name": "x"})
    finally:
        s.close()
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] and "aborted the transaction 3 times (deadlock detected)" in r.json()["detail"]
    assert "cannot be reached" not in r.json()["detail"]
    assert counts(db) == before


@pytest.mark.processes
def test_batches_of_cron_expressions_that_never_fire_do_not_starve_anyone(db_dsn, db):
    """8 requests at once, 40 items each of `0 0 31 2 *`, against a real
    `minutehand serve` with a pool of 4: each item is refused at once; another
    team's submission goes through meanwhile, and the dispatcher keeps every
    shard lease (once the pool sat idle in transaction, other teams got 503s
    and the dispatcher, which shared the pool, lost its leases)."""
    import json
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from minutehand.store.teams import hash_token
    from tests.processes import Server
    db.execute("INSERT INTO teams (name, token_hash) VALUES ('t', %s), ('u', %s)",
               (hash_token("tok-t"), hash_token("tok-u")))
    server = Server(db_dsn, "--pool-size", "4", "--shard-lease-s", "5")

    def post(path: str, body: dict, token: str) -> tuple[int, dict]:
        req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
    try:
        batch = {"jobs": [{"name": "never", "repeat": {"cron": "0 0 31 2 *"}}] * 40}
        started = time.monotonic()
        with ThreadPoolExecutor(9) as pool:
            floods = [pool.submit(post, "/v1/jobs/batch", batch, "tok-t") for _ in range(8)]
            other = pool.submit(post, "/v1/jobs", {"name": "meanwhile"}, "tok-u")
            answers = [f.result() for f in floods]
            assert other.result()[0] == 201, other.result()
        took = time.monotonic() - started
        for status, body in answers:
            assert status == 200 and body["rejected"] == 40, body
            assert all("does not fire within 366 days" in i["error"] for i in body["items"])
        assert took < 10, took                         # 8 x 40 x 0.2-0.6 s before: a minute or more
        leased = db.execute("SELECT count(*) FROM shards WHERE lease_expires_at > now()").fetchone()[0]
        assert leased == 256
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1
    finally:
        server.stop()


# ---------------------------------------------------------------- settings
def test_settings_are_read_as_their_declared_types():
    s = Settings.load(["--http-port", "9000", "--data-dir", "/tmp/mh", "--claim-lease-s", "12"],
                      env={"MINUTEHAND_POOL_SIZE": "3", "MINUTEHAND_SHARD_LEASE_S": "2.5"})
    assert (s.http_port, s.data_dir, s.claim_lease_s, s.pool_size, s.shard_lease_s) == \
        (9000, Path("/tmp/mh"), 12.0, 3, 2.5)
    with pytest.raises(SystemExit, match="setting pool_size: 'many' is not a valid value"):
        Settings.load([], env={"MINUTEHAND_POOL_SIZE": "many"})
