"""/metrics (docs/operations/metrics.md): after a small end-to-end run (a real `minutehand
serve` and a real worker process), every family is exposed with its labels and
the job counters equal a recount of the jobs table; a `minutehand dispatcher`
serves /metrics too; the name cap folds a team's extra job names into
"(other)" and keeps every series a counter; the counters survive the roll-up
and the purge of team_stats; a worker serves its own on worker_metrics_port;
the Grafana dashboard names only families that exist."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import signal
import urllib.request
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from minutehand.api.metrics import OTHER, DatabaseMetrics
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.submit import JobSpec
from tests.processes import Server, WorkerProcess, free_port, logs, wait_until
from tests.support import T0, make_store
from tests.worker_apps import RUNS_DDL

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "ops" / "grafana" / "minutehand.json"
COUNTERS = ("submitted", "started", "succeeded", "failed", "dead", "cancelled")

# Every family a serve process exposes (prometheus_client's own process_*
# and python_* aside), with the labels of its samples (le aside).
SERVE_FAMILIES = {
    **{f"minutehand_jobs_{c}": {"team", "name"} for c in COUNTERS},
    "minutehand_job_start_lag_seconds": {"team"},
    "minutehand_job_run_seconds": {"team"},
    "minutehand_team_running": {"team"},
    "minutehand_team_quota": {"team"},
    "minutehand_due_jobs": {"bucket"},
    "minutehand_due_jobs_estimated": {"level"},
    "minutehand_metrics_database_up": set(),
    "minutehand_metrics_database_read_seconds": set(),
    "minutehand_claim_batch_jobs": set(),
    "minutehand_outcome_batch_reports": {"kind"},
    "minutehand_submit_batch_jobs": set(),
    "minutehand_shard_leases": set(),
    "minutehand_shard_takeovers": set(),
    "minutehand_stale_claims_refused": set(),
    "minutehand_shards_set_aside": set(),
    "minutehand_db_seconds": {"pool"},
    "minutehand_db_pool_wait_seconds": {"pool"},
    "minutehand_db_pool_requests": {"pool"},
    "minutehand_db_pool_timeouts": {"pool"},
    "minutehand_db_pool_waiting": {"pool"},
    "minutehand_db_pool_connections": {"pool", "state"},
    "minutehand_requests": {"method", "path", "status_code", "app_name"},
    "minutehand_request_duration_seconds": {"method", "path", "status_code", "app_name"},
}
WORKER_FAMILIES = {"minutehand_worker_jobs": {"name", "outcome"}, "minutehand_worker_job_seconds": {"name"},
                   "minutehand_worker_jobs_running": set()}


def scrape(url: str) -> dict[str, list]:
    """{family name: its samples} of a /metrics answer."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain"), resp.headers
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def values(samples: list, suffix: str = "") -> dict[tuple, float]:
    """{sorted label items (le aside unless asked): value} of samples named family + suffix."""
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name.endswith(suffix)}


def counters(families: dict[str, list]) -> dict[tuple[str, str], tuple[int, ...]]:
    """{(team, name): (submitted, started, succeeded, failed, dead, cancelled)} as exposed."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * len(COUNTERS))
    for i, c in enumerate(COUNTERS):
        for s in families[f"minutehand_jobs_{c}"]:
            if s.name.endswith("_total"):
                out[s.labels["team"], s.labels["name"]][i] = int(s.value)
    return {k: tuple(v) for k, v in out.items()}


def recount(conn, failed: dict[tuple[str, str], int]) -> dict[tuple[str, str], tuple[int, ...]]:
    """The same numbers from the jobs table (failed: the retried failures, from the run's record)."""
    rows = conn.execute("""
        SELECT t.name, j.name, count(*), count(j.started_at), count(*) FILTER (WHERE j.state = 'succeeded'),
               count(*) FILTER (WHERE j.state = 'dead'), count(*) FILTER (WHERE j.state = 'cancelled')
          FROM jobs j JOIN teams t ON t.id = j.team_id GROUP BY 1, 2""").fetchall()
    return {(team, name): (submitted, started, succeeded, failed.get((team, name), 0), dead, cancelled)
            for team, name, submitted, started, succeeded, dead, cancelled in rows}


def post(url: str, path: str, body, token: str, method: str = "POST") -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


# ---------------------------------------------------------------- end to end
@pytest.fixture
def run(db_dsn, live_store, token):
    """A serve process and a worker (metrics on a port) run: one job whose
    claim lapses on its last attempt (the worker is stopped while it runs
    it: dead by expire_claims, in the dispatcher's SQL maintenance); 5 jobs
    that succeed, 2 that fail once and then succeed, one that fails for good
    (dead); one cancelled, one waiting 10 days ahead; one submitted through
    SQL's submit_job in a transaction of the caller's, which no process
    sees (no handler takes its name: it stays due)."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(RUNS_DDL)
    team_token = live_store.rotate_token("t")
    server = Server(db_dsn, "--claim-lease-s", "2", "--shard-lease-s", "5", "--metrics-read-s", "0")
    worker_port = free_port()
    worker = WorkerProcess("recorder", [server.url], token,
                           env={"MINUTEHAND_TEST_EFFECTS_DSN": db_dsn,
                                "MINUTEHAND_WORKER_METRICS_PORT": str(worker_port)})
    try:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            def state(job_id):
                return c.execute("SELECT state FROM minutehand.jobs WHERE id = %s", (job_id,)).fetchone()[0]

            lapsing = post(server.url, "/v1/jobs", {"name": "other", "payload": {"sleep_s": 4}, "max_attempts": 1},
                           team_token)["job_id"]
            wait_until(lambda: state(lapsing) == "running", 30, f"the job to start\n{logs(server, worker)}")
            worker.signal(signal.SIGSTOP)
            try:
                wait_until(lambda: state(lapsing) == "dead", 30, f"its claim to lapse\n{logs(server, worker)}")
            finally:
                worker.signal(signal.SIGCONT)
            later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=10)).isoformat()
            cancelled = post(server.url, "/v1/jobs", {"name": "work", "due_at": later}, team_token)["job_id"]
            post(server.url, f"/v1/jobs/{cancelled}", None, team_token, method="DELETE")
            post(server.url, "/v1/jobs", {"name": "work", "due_at": later}, team_token)
            post(server.url, "/v1/jobs/batch", {"jobs": [{"name": "work"}] * 5}, team_token)
            post(server.url, "/v1/jobs/batch", {"jobs": [{"name": "work", "payload": {"fail_until": 2},
                                                          "backoff_base_s": 0.05}] * 2}, team_token)
            post(server.url, "/v1/jobs", {"name": "other", "payload": {"never": True}}, team_token)
            with psycopg.connect(db_dsn) as caller, caller.transaction():
                caller.execute("SELECT minutehand.submit_job('t', 'by-sql')")
            finished = "SELECT count(*) FROM minutehand.jobs WHERE state IN ('succeeded', 'dead')"
            wait_until(lambda: c.execute(finished).fetchone()[0] == 9, 60,
                       f"the jobs to finish\n{logs(server, worker)}", every_s=0.2)
            c.execute("ANALYZE minutehand.due_far")
            failed = {("t", r[0]): r[1] for r in c.execute("""
                SELECT j.name, count(*) FROM runs r JOIN minutehand.jobs j ON j.id = r.job_id
                 WHERE (j.payload->>'fail_until')::int > r.attempt GROUP BY 1""")}
            expected = recount(c, failed)
        # the lapsed job's handler ends after the worker resumes: its outcome is not counted as done
        wait_until(lambda: sum(v for k, v in worker_jobs(worker_port).items() if k[0] == "other") == 2, 20,
                   f"the worker to finish its jobs\n{logs(server, worker)}")
        yield server, worker, worker_port, expected
    finally:
        worker.stop()
        server.stop()


def worker_jobs(port: int) -> dict[tuple[str, str], float]:
    got = scrape(f"http://127.0.0.1:{port}/metrics")
    return {(dict(k)["name"], dict(k)["outcome"]): v
            for k, v in values(got.get("minutehand_worker_jobs", []), "_total").items()}


@pytest.mark.processes
def test_after_a_run_every_family_is_exposed_and_the_job_counters_equal_a_recount(run):
    server, worker, worker_port, expected = run
    families = scrape(server.url + "/metrics")
    for name, labels in SERVE_FAMILIES.items():
        assert name in families, f"{name} missing; exposed: {sorted(families)}"
        for s in families[name]:
            assert set(s.labels) - {"le"} == labels, (name, s)
    assert counters(families) == expected
    assert expected[("t", "work")] == (9, 7, 7, 2, 0, 1)          # the cancelled and the later one never started
    assert expected[("t", "other")] == (2, 2, 0, 0, 2, 0)
    assert expected[("t", "by-sql")] == (1, 0, 0, 0, 0, 0)
    # The histograms count what the counters count: started jobs by their lag,
    # finished ones by their run time (the +Inf bucket: every one).
    assert values(families["minutehand_job_start_lag_seconds"], "_bucket")[(("le", "+Inf"), ("team", "t"))] == 9
    assert values(families["minutehand_job_run_seconds"], "_bucket")[(("le", "+Inf"), ("team", "t"))] == 9
    assert values(families["minutehand_team_running"]) == {(("team", "t"),): 0}
    assert values(families["minutehand_team_quota"]) == {(("team", "t"),): 1000}
    assert values(families["minutehand_due_jobs"]).keys() == {(("bucket", "current_minute"),),
                                                              (("bucket", "next_minute"),)}
    assert values(families["minutehand_due_jobs_estimated"])[(("level", "far"),)] >= 1     # analysed
    assert values(families["minutehand_metrics_database_up"]) == {(): 1}
    # The process's own: batches, leases, the database, the requests by route template.
    assert values(families["minutehand_shard_leases"]) == {(): 256}
    assert values(families["minutehand_shard_takeovers"], "_total") == {(): 256}
    assert values(families["minutehand_stale_claims_refused"], "_total") == {(): 0}
    assert values(families["minutehand_shards_set_aside"], "_total") == {(): 0}
    assert values(families["minutehand_claim_batch_jobs"], "_sum")[()] >= 11    # every claim, retries too
    kinds = {dict(k)["kind"] for k in values(families["minutehand_outcome_batch_reports"], "_count")}
    assert {"start", "complete", "fail"} <= kinds
    assert values(families["minutehand_submit_batch_jobs"], "_sum")[()] == 11   # by-sql is the database's
    pools = {dict(k)["pool"] for k in values(families["minutehand_db_seconds"], "_count")}
    assert pools == {"api", "dispatcher"}
    requests = values(families["minutehand_requests"], "_total")
    paths = {(dict(k)["method"], dict(k)["path"], dict(k)["status_code"]) for k in requests}
    assert {("POST", "/v1/jobs", "201"), ("POST", "/v1/jobs/batch", "200"), ("DELETE", "/v1/jobs/{job_id}", "200"),
            ("POST", "/v1/worker/lease", "200")} <= paths, paths
    assert not [p for _, p, _ in paths if re.search(r"/\d", p)], paths      # templates, never a job id

    # The worker's own, on its port: what it ran, by name and outcome.
    got = scrape(f"http://127.0.0.1:{worker_port}/metrics")
    for name, labels in WORKER_FAMILIES.items():
        assert name in got, sorted(got)
        for s in got[name]:
            assert set(s.labels) - {"le"} == labels, (name, s)
    jobs = worker_jobs(worker_port)
    lapsed = {k: v for k, v in jobs.items() if k[0] == "other" and k[1] in ("dropped", "refused")}
    assert sum(lapsed.values()) == 1, jobs          # dropped, or refused: whichever it met first
    assert {k: v for k, v in jobs.items() if k not in lapsed} == {("work", "succeeded"): 7, ("work", "failed"): 2,
                                                                  ("other", "failed"): 1}, jobs

    # Every expression of the dashboard names families that exist.
    exposed = {s.name for samples in (*families.values(), *got.values()) for s in samples}
    for panel, expr in dashboard_exprs():
        for name in re.findall(r"\bminutehand_\w+", expr):
            assert name in exposed, f"dashboard panel {panel!r}: {name} is not exposed ({expr})"


@pytest.mark.processes
def test_a_dispatcher_alone_serves_metrics(db_dsn, live_store):
    live_store.submit_many("t", [JobSpec("later", due_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2))])
    server = Server(db_dsn, "--metrics-read-s", "0", role="dispatcher")
    try:
        families = wait_until(lambda: (f := scrape(server.url + "/metrics"))
                              and values(f["minutehand_shard_leases"]).get(()) == 256 and f, 20, "the leases")
        assert counters(families)[("t", "later")] == (1, 0, 0, 0, 0, 0)
        assert "minutehand_requests" in families and "minutehand_db_pool_waiting" in families
    finally:
        server.stop()


# ---------------------------------------------------------------- labels and the database's counters
def test_names_beyond_the_cap_are_counted_as_other_and_every_series_stays_a_counter(db_dsn, live_store):
    live_store.submit_many("t", [JobSpec("a")] * 5 + [JobSpec("b")] * 4 + [JobSpec("c")] * 3 + [JobSpec("d")] * 2)
    settings = Settings(metrics_names_per_team=2, metrics_read_s=0)
    with TestClient(build(settings, live_store, dispatch=False, head=migrate.head()).app) as client:
        def submitted() -> dict[str, float]:
            r = client.get("/metrics")
            assert r.status_code == 200, r.text
            samples = {f.name: f.samples for f in text_string_to_metric_families(r.text)}
            return {s.labels["name"]: s.value for s in samples["minutehand_jobs_submitted"]
                    if s.name.endswith("_total") and s.labels["team"] == "t"}

        assert submitted() == {"a": 5, "b": 4, OTHER: 5}           # the two of most volume when first read
        # Later volume moves nothing: "c" overtakes them, a new name comes: both counted as other.
        live_store.submit_many("t", [JobSpec("c")] * 10 + [JobSpec("e")])
        assert submitted() == {"a": 5, "b": 4, OTHER: 16}
        live_store.submit("t", JobSpec("a"))
        assert submitted() == {"a": 6, "b": 4, OTHER: 16}


@pytest.fixture
def store(db_dsn):
    """A store with its clock pinned at T0, and team t."""
    s = make_store(db_dsn, clock=T0)
    s.create_team("t")
    yield s
    s.close()


def test_the_counters_survive_the_roll_up_and_the_purge_of_their_rows(store):
    store.submit_many("t", [JobSpec("x")] * 3)
    metrics = DatabaseMetrics(store, names_per_team=50, read_s=0)

    def submitted() -> float:
        metrics.refresh()
        family = next(f for f in metrics.collect() if f.name == "minutehand_jobs_submitted")
        return {s.labels["name"]: s.value for s in family.samples}["x"]

    assert submitted() == 3
    store.clock = T0 + dt.timedelta(hours=5)           # its minute rows are below the line now
    store.submit("t", JobSpec("x"))
    assert submitted() == 4
    assert store.roll_up_stats() >= 1                  # the minute rows of T0 into their hour
    assert submitted() == 4
    store.clock = T0 + dt.timedelta(days=1)            # a process reads on: every row is below the line now
    assert submitted() == 4
    store.clock = T0 + dt.timedelta(days=40)
    assert store.purge_stats() == 2                    # both hours, past retention
    assert submitted() == 4
    # A process started now reads the same: what the purge dropped is kept in one row.
    fresh = DatabaseMetrics(store, names_per_team=50, read_s=0)
    fresh.refresh()
    family = next(f for f in fresh.collect() if f.name == "minutehand_jobs_submitted")
    assert [s.value for s in family.samples] == [4]
    assert store.team_stats("t", window_s=86400).total.submitted == 0     # no window reaches that row


def test_the_due_index_depth_counts_the_current_and_next_bucket_and_estimates_the_levels(store, db_dsn):
    store.submit_many("t", [JobSpec("now")] * 3 + [JobSpec("next", due_at=T0 + dt.timedelta(seconds=60))] * 2
                      + [JobSpec("soon", due_at=T0 + dt.timedelta(hours=3))] * 4
                      + [JobSpec("hours", due_at=T0 + dt.timedelta(hours=30))] * 5
                      + [JobSpec("far", due_at=T0 + dt.timedelta(days=10))] * 6)
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("ANALYZE minutehand.due_minutes, minutehand.due_hours, minutehand.due_far")
    metrics = DatabaseMetrics(store, names_per_team=50, read_s=0)
    metrics.refresh()
    families = {f.name: f for f in metrics.collect()}
    assert {s.labels["bucket"]: s.value for s in families["minutehand_due_jobs"].samples} == \
        {"current_minute": 3, "next_minute": 2}
    assert {s.labels["level"]: s.value for s in families["minutehand_due_jobs_estimated"].samples} == \
        {"minutes": 9, "hours": 5, "far": 6}


@pytest.mark.parametrize("flag", ["--metrics-names-per-team", "--metrics-read-s"])
def test_a_negative_metrics_setting_is_refused_with_its_name(flag):
    with pytest.raises(SystemExit, match=flag[2:].replace("-", "_")):
        Settings.load([flag, "-1"], env={})


def test_a_worker_metrics_port_out_of_range_is_refused():
    from minutehand.worker import Worker
    from minutehand.worker.settings import WorkerSettings

    with pytest.raises(SystemExit, match="setting worker_metrics_port: 70000 is not a whole number from 0 to 65535"):
        WorkerSettings.load(["--worker-metrics-port", "70000"], env={})
    worker = Worker(metrics_port=70000)          # given to the library itself
    worker.job("x")(lambda job: None)
    with pytest.raises(ValueError, match="metrics port 70000"):
        asyncio.run(worker.run_async(WorkerSettings()))


def test_a_failed_read_of_the_database_says_so_and_leaves_the_job_families_out(db_dsn):
    store = make_store(db_dsn)
    metrics = DatabaseMetrics(store, names_per_team=50, read_s=0)
    store.close()                                       # every read now fails
    metrics.refresh()
    names = {f.name: f for f in metrics.collect()}
    assert "minutehand_jobs_submitted" not in names
    assert names["minutehand_metrics_database_up"].samples[0].value == 0


# ---------------------------------------------------------------- the dashboard
def dashboard_exprs() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))
    walk(board["panels"])
    return out


def test_the_dashboard_has_panels_for_the_families():
    exprs = " ".join(e for _, e in dashboard_exprs())
    for family in ("minutehand_jobs_submitted_total", "minutehand_jobs_dead_total", "minutehand_team_running",
                   "minutehand_due_jobs", "minutehand_job_start_lag_seconds_bucket", "minutehand_db_seconds_bucket",
                   "minutehand_requests_total", "minutehand_claim_batch_jobs_bucket"):
        assert family in exprs, family
