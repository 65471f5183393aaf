"""A Citus cluster's worker nodes coming and going with jobs flowing, with
a node of the test's own (only this test's database knows of it: Citus
keeps its node list per database): added with `minutehand citus-add-node
--rebalance` while `minutehand serve` dispatches, a real worker runs the
jobs and a submitter keeps submitting (nothing lost, nothing run twice,
shard groups on the new node after); and, holding shard groups, stopped
for 30 s (its shards wait, the others go on)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from minutehand.store import citus
from minutehand.store.submit import JobSpec
from tests.processes import Server, WorkerProcess, local_cluster, wait_until
from tests.support import skip_unless_citus
from tests.worker_apps import RUNS_DDL

pytestmark = pytest.mark.processes

BACKLOG = 2400             # jobs waiting when the node is added: ~30 s of the worker's work
BATCH = 10                  # then jobs per submission, one every SUBMIT_EVERY_S
SUBMIT_EVERY_S = 0.2
WORK = {"sleep_s": 0.05}


def test_a_node_added_and_rebalanced_while_jobs_flow_loses_nothing_and_runs_nothing_twice(db, db_dsn, live_store,
                                                                                          token):
    skip_unless_citus(db)
    db.execute(RUNS_DDL)
    submitted: list[int] = []
    stop = threading.Event()

    def submitter() -> None:
        while not stop.is_set():
            items = live_store.submit_many("t", [JobSpec(name="work", payload=WORK)] * BATCH)
            assert all(i.error is None for i in items), [i.error for i in items if i.error]
            submitted.extend(i.job_id for i in items)
            time.sleep(SUBMIT_EVERY_S)

    with local_cluster("mh-citus-node-", fsync=False, shared_preload_libraries="citus") as node:
        server = Server(db_dsn, "--claim-lease-s", "30")
        worker = WorkerProcess("recorder", [server.url], token, concurrency=4,
                               env={"MINUTEHAND_TEST_EFFECTS_DSN": db_dsn})
        feeding = threading.Thread(target=submitter, daemon=True)
        try:
            backlog = live_store.submit_many("t", [JobSpec(name="work", payload=WORK)] * BACKLOG)
            submitted.extend(i.job_id for i in backlog)
            feeding.start()
            wait_until(lambda: db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 100, 60,
                       "jobs to be running")
            started, since = time.monotonic(), db.execute("SELECT clock_timestamp()").fetchone()[0]
            added = subprocess.run([sys.executable, "-m", "minutehand.cli.main", "citus-add-node", f"127.0.0.1:{node.port}",
                                    "--rebalance", "--database-url", db_dsn],
                                   capture_output=True, text=True, timeout=600)
            took = time.monotonic() - started
            assert added.returncode == 0, added.stderr
            time.sleep(2.0)                        # jobs submitted onto the moved shards too
            stop.set()
            feeding.join(timeout=30)
            wait_until(lambda: db.execute("SELECT count(DISTINCT job_id) FROM runs WHERE job_id = ANY (%s)",
                                          (submitted,)).fetchone()[0] == len(submitted), 180,
                       "every submitted job to have run")
            wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE id = ANY (%s) AND state = 'succeeded'",
                                          (submitted,)).fetchone()[0] == len(submitted), 60,
                       "every submitted job to have succeeded")
        finally:
            stop.set()
            worker.stop()
            server.stop()
        twice = db.execute("SELECT job_id, count(*) FROM runs GROUP BY job_id HAVING count(*) > 1").fetchall()
        assert twice == []
        assert citus.shard_groups_on(db, "127.0.0.1", node.port) > 0, added.stdout
        # Runs started each second while the shards moved (a backlog waits on every shard): claims of the
        # moving shard group wait for its copy.
        per_second = [n for (n,) in db.execute(
            """SELECT count(r.job_id) FROM generate_series(0, %s) s
                 LEFT JOIN runs r ON r.at >= %s + s * interval '1 second' AND r.at < %s + (s + 1) * interval '1 second'
                GROUP BY s ORDER BY s""", (int(took), since, since))]
        print(f"\n{added.stdout.strip()}; the command took {took:.1f} s; {len(submitted)} jobs, each run once; "
              f"jobs started per second while it ran: {per_second}")


OUTAGE_S = 30               # how long the node is down
SUBMIT_TIMEOUT_S = 10       # a submission answered later than this counts as a hang


def test_a_worker_node_down_for_30_s_holds_up_its_own_shards_only(db, db_dsn, live_store, token):
    """A worker node of the test's own, holding shard groups, stopped at
    once (-m immediate: a crash) for OUTAGE_S while jobs are submitted over
    HTTP and run. Submissions to its shards answer 503 at once, jobs on the
    other nodes' shards keep starting, and after it is back every
    acknowledged job runs exactly once."""
    skip_unless_citus(db)
    db.execute(RUNS_DDL)
    team_token = live_store.create_team("web")
    with local_cluster("mh-citus-down-", shared_preload_libraries="citus") as node:
        added = subprocess.run([sys.executable, "-m", "minutehand.cli.main", "citus-add-node", f"127.0.0.1:{node.port}",
                                "--rebalance", "--database-url", db_dsn], capture_output=True, text=True, timeout=600)
        assert added.returncode == 0, added.stderr
        groups = citus.shard_groups(db)
        on_node = {s for s, g in groups.items() if g in {r[0] for r in db.execute(
            """SELECT p.shardid FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                WHERE n.nodename = '127.0.0.1' AND n.nodeport = %s""", (node.port,))}}
        assert 0 < len(on_node) < len(groups), added.stdout
        server = Server(db_dsn)
        worker = WorkerProcess("recorder", [server.url], token, concurrency=8,
                               env={"MINUTEHAND_TEST_EFFECTS_DSN": db_dsn})
        answers: list[tuple[float, int, float, int | None]] = []     # (when, status, took, job id)
        unexpected: list[str] = []
        stop = threading.Event()

        def submitter() -> None:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {team_token}"},
                              timeout=SUBMIT_TIMEOUT_S * 3) as client:
                while not stop.is_set():
                    started = time.monotonic()
                    r = client.post("/v1/jobs", json={"name": "work", "payload": WORK})
                    took = time.monotonic() - started
                    if r.status_code not in (201, 503) or \
                            r.status_code == 503 and r.json()["type"] != "/problems/unavailable":
                        unexpected.append(r.text)
                    else:
                        answers.append((started, r.status_code, took,
                                        int(r.json()["job_id"]) if r.status_code == 201 else None))
                    time.sleep(0.02)

        feeding = threading.Thread(target=submitter, daemon=True)
        try:
            feeding.start()
            wait_until(lambda: db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 50, 60, "jobs to be running")
            node.stop(mode="immediate")
            down = time.monotonic()
            time.sleep(OUTAGE_S)
            up_from = db.execute("SELECT clock_timestamp() - %s * interval '1 second'", (OUTAGE_S / 2,)).fetchone()[0]
            up = time.monotonic()                  # (it answers before ensure_started returns)
            node.ensure_started()
            time.sleep(3.0)                        # jobs submitted onto its shards again
            stop.set()
            feeding.join(timeout=SUBMIT_TIMEOUT_S * 3)
            acknowledged = [a[3] for a in answers if a[3] is not None]
            wait_until(lambda: db.execute("SELECT count(*) FROM jobs WHERE id = ANY (%s) AND state = 'succeeded'",
                                          (acknowledged,)).fetchone()[0] == len(acknowledged), 180,
                       "every acknowledged job to have succeeded")
        finally:
            stop.set()
            worker.stop()
            server.stop()
        assert not feeding.is_alive()
        assert unexpected == []
        during = [a for a in answers if down + 1 < a[0] < up]
        assert max(a[2] for a in answers) < SUBMIT_TIMEOUT_S, "a submission hung"
        refused = sum(1 for a in during if a[1] == 503)
        taken = [a[3] for a in during if a[1] == 201]
        assert refused > 0 and taken, (refused, len(taken))
        assert [j for j in taken if citus.shard_of(j) in on_node] == []
        # Jobs on the other nodes' shards kept starting in the outage's second half.
        started = [j for (j,) in db.execute("SELECT job_id FROM runs WHERE at >= %s AND at < %s + %s * interval '1 second'",
                                            (up_from, up_from, OUTAGE_S / 2 - 1))]
        assert started and [j for j in started if citus.shard_of(j) in on_node] == []
        twice = db.execute("SELECT job_id, count(*) FROM runs GROUP BY job_id HAVING count(*) > 1").fetchall()
        assert twice == []
        ran = db.execute("SELECT count(DISTINCT job_id) FROM runs WHERE job_id = ANY (%s)", (acknowledged,)).fetchone()[0]
        assert ran == len(acknowledged)
        print(f"\n{len(on_node)} of {len(groups)} shards on the stopped node; during its {OUTAGE_S} s away: "
              f"{len(taken)} submissions taken, {refused} answered 503 (slowest answer "
              f"{max(a[2] for a in during):.2f} s), {len(started)} jobs started in its second half; "
              f"{len(acknowledged)} acknowledged jobs, each run once")
