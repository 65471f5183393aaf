"""PostgreSQL restarted under load, as a failover looks to minutehand: a
cluster of the test's own (durable: fsync and synchronous commit on) under
`minutehand serve` and 2 worker processes, with jobs submitted over HTTP
all along, is restarted with `pg_ctl restart -m fast` (sessions ended
cleanly) or `-m immediate` (a crash: WAL replay at start).

Measured and asserted: no job whose submission was acknowledged is lost
(every one succeeds), processing resumes within RESUME_S of the database
being back, and the submissions resume too. Printed: time to resume, jobs
lost, jobs run twice (allowed: at-least-once; a job whose completion was
in flight when the server went down runs again).

The submitter sends each batch with idempotency keys and resends it until
acknowledged: a batch whose answer was lost is not written twice.
The handlers record runs in the session's test database (tests/worker_apps.py),
which keeps running: what they record does not depend on the restarted server.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from minutehand.dev.localpg import LocalCluster
from minutehand.store import migrate
from minutehand.store.claim import ClaimedJob, ClaimRequest, PlannedClaim
from minutehand.store.outcomes import Complete
from minutehand.store.schema import SEARCH_PATH
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.processes import Server, WorkerProcess, local_cluster, logs, wait_until
from tests.worker_apps import RUNS_DDL

pytestmark = pytest.mark.processes

RESUME_S = 15.0             # processing resumes within this long of the database being back
RATE = 100                  # jobs submitted per second (in batches of 10)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with local_cluster("mh-restart-", max_wal_size="256MB") as c:
        yield c


class Submitter:
    """RATE jobs a second over HTTP, in batches of 10 with idempotency keys;
    a batch that fails (503, connection refused) is resent until acknowledged."""

    def __init__(self, url: str, token: str):
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.acknowledged: dict[str, int] = {}           # key -> job id
        self.acked_at: list[float] = []                  # when each batch was acknowledged (monotonic)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.client.close()

    def _run(self) -> None:
        period = 10 / RATE
        next_at = time.monotonic()
        while not self._stop.is_set():
            keys = [f"k-{self._n + i}" for i in range(10)]
            self._n += 10
            body = {"jobs": [{"name": "work", "payload": {"sleep_s": 0.05}, "idempotency_key": k,
                              "max_attempts": 10} for k in keys]}
            while True:                                   # resend until acknowledged, even while stopping
                try:
                    r = self.client.post("/v1/jobs/batch", json=body)
                    if r.status_code == 200:
                        items = r.json()["items"]
                        assert all(i.get("error") is None for i in items), items
                        self.acknowledged.update({k: int(i["job_id"]) for k, i in zip(keys, items)})
                        self.acked_at.append(time.monotonic())
                        break
                    assert r.status_code == 503, r.text
                except httpx.TransportError:
                    pass
                self.failures += 1
                time.sleep(0.2)
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgresql_restart_under_load_loses_nothing(cluster: LocalCluster, db_dsn: str, mode: str):
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE mh")
    url = cluster.dsn("mh")
    migrate.upgrade(url)
    with Store(url) as s:
        team_token = s.create_team("t", quota=100_000)
        worker_token = s.create_worker_token("fleet")
    with psycopg.connect(db_dsn, autocommit=True) as runs_db:
        runs_db.execute(RUNS_DDL)

    server = Server(url)                                  # the default settings: what an operator starts with
    workers = [WorkerProcess("recorder", [server.url], worker_token, concurrency=10, label=f"worker-{i}",
                             env={"MINUTEHAND_TEST_EFFECTS_DSN": db_dsn, "MINUTEHAND_WORKER_GRACE_S": "5"})
               for i in range(2)]
    procs = [server, *workers]
    submitter = Submitter(server.url, team_token)
    db = psycopg.connect(db_dsn, autocommit=True)
    try:
        submitter.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 300, 60, "jobs to flow")

        down_at = time.monotonic()
        cluster.restart(mode)
        back_at = time.monotonic()
        restart_wall = db.execute("SELECT clock_timestamp() - make_interval(secs => %s)",
                                  (time.monotonic() - back_at,)).fetchone()[0]
        # Resumed: a job started after the database was back (its run recorded on the other server).
        wait_until(lambda: db.execute("SELECT count(*) FROM runs WHERE at > %s", (restart_wall,)).fetchone()[0] > 0,
                   RESUME_S + 30, "a job to start after the restart", every_s=0.05)
        resumed_at = time.monotonic()
        wait_until(lambda: any(t > back_at for t in submitter.acked_at), RESUME_S + 30,
                   "a submission to be acknowledged after the restart", every_s=0.05)
        submits_at = min(t for t in submitter.acked_at if t > back_at)
        time.sleep(3)                                     # a few more seconds of load after it
        submitter.stop()

        n = len(submitter.acknowledged)
        ids = sorted(set(submitter.acknowledged.values()))
        with psycopg.connect(url, autocommit=True, options=SEARCH_PATH) as mh:
            def succeeded() -> int:
                return mh.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded' AND id = ANY(%s)",
                                  (ids,)).fetchone()[0]
            try:
                wait_until(lambda: succeeded() == n, 120, f"all {n} acknowledged jobs to succeed", every_s=0.5)
            except AssertionError:
                states = mh.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1").fetchall()
                raise AssertionError(f"{succeeded()} of {n} succeeded; states {states}\n{logs(*procs)}") from None
            total, extra_attempts = mh.execute(
                "SELECT count(*), count(*) FILTER (WHERE attempts > 1) FROM jobs").fetchone()
        runs = dict(db.execute("SELECT job_id, count(*) FROM runs GROUP BY 1").fetchall())
        never = [i for i in ids if i not in runs]
        twice = sum(1 for i in ids if runs.get(i, 0) > 1)
        print(f"\npg_ctl restart -m {mode}: database away {back_at - down_at:.2f} s; jobs started again "
              f"{resumed_at - back_at:.2f} s after it was back, submissions acknowledged again after "
              f"{submits_at - back_at:.2f} s ({submitter.failures} batch sends failed meanwhile); "
              f"{n} jobs acknowledged, lost 0, never run {len(never)}, run twice {twice}, "
              f"with a second attempt {extra_attempts}")
        assert total == n, f"{total} jobs in the database, {n} acknowledged (a resent batch written twice?)"
        assert not never, never[:10]
        assert resumed_at - back_at <= RESUME_S, logs(*procs)
        assert submits_at - back_at <= RESUME_S, logs(*procs)
        assert all(p.alive() for p in procs), logs(*procs)
    finally:
        submitter.stop()
        for p in (*workers, server):
            p.stop()
        db.close()


@pytest.fixture
def unhurried_cluster() -> Iterator[LocalCluster]:
    """A cluster whose WAL writer flushes asynchronous commits only every 10 s
    (the longest it may wait), so that one made just before a crash is lost."""
    with local_cluster("mh-crash-", wal_writer_delay="10s") as c:
        yield c


def _claim_one(s: Store, url: str, job_id: int, shard: int, epoch: int, worker: str, form: str,
               synchronous: bool) -> ClaimedJob:
    """Claim the job as a worker's claim (claim_due) or as the dispatcher's
    planned one (on plain PostgreSQL claim_planned_shards) does."""
    if form == "per-shard":
        request = ClaimRequest(shard, epoch, 10, worker)
    else:
        with psycopg.connect(url, options=SEARCH_PATH) as conn:
            strict, priority, team, run_at = conn.execute(
                "SELECT strict, priority, team_id, run_at FROM due_minutes WHERE job_id = %s", (job_id,)).fetchone()
        request = PlannedClaim(shard, epoch, worker, run_at.replace(second=0, microsecond=0), [strict], [priority],
                               [team], [1])
    results, _ = s.claim([request], "d1", 30, synchronous_commit=synchronous)
    [row] = results[0]
    return row


@pytest.mark.parametrize("form", ["per-shard", "planned"])
@pytest.mark.parametrize("synchronous", [False, True], ids=["claims-async", "claims-synchronous"])
def test_a_crash_right_after_a_claim_commits_loses_no_job(unhurried_cluster: LocalCluster, synchronous: bool,
                                                          form: str):
    """What claim_synchronous_commit risks, shown by a crash (immediate
    shutdown, WAL replayed at start) right after a round of claims commits,
    for both forms of claim. Off: the claim is undone, the job is due
    again, the first claimer's reports are refused, and its second run is
    the one recorded. On: the claim survives and its claimer's report is
    taken. Never lost."""
    with psycopg.connect(unhurried_cluster.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE mh")
    url = unhurried_cluster.dsn("mh")
    migrate.upgrade(url)
    with Store(url) as s:
        s.create_team("t")
        job_id = s.submit("t", JobSpec(name="once")).job_id
        with psycopg.connect(url, options=SEARCH_PATH) as conn:
            shard = conn.execute("SELECT mh_shard_of(%s)", (job_id,)).fetchone()[0]
        epoch = s.take_leases([shard], "d1", 3600)[shard]
        first = _claim_one(s, url, job_id, shard, epoch, "w1", form, synchronous)
        assert first.job_id == job_id
    unhurried_cluster.restart("immediate")
    with Store(url) as s:
        st = s.status(job_id)
        [report] = s.complete([Complete(job_id, first.lease_token, b'"first run"')])
        if synchronous:
            assert (st.state, st.attempts) == ("claimed", 1)
            assert report.ok
        else:
            assert (st.state, st.attempts) == ("scheduled", 0)
            assert not report.ok and report.state == "scheduled"
            second = _claim_one(s, url, job_id, shard, epoch, "w2", form, False)
            assert (second.job_id, second.attempt) == (job_id, 1)
            assert s.complete([Complete(job_id, second.lease_token, b'"second run"')])[0].ok
        st = s.status(job_id)
        assert (st.state, st.attempts, st.result) == ("succeeded", 1, "first run" if synchronous else "second run")
