"""A Citus cluster grown with jobs flowing: a worker node of the test's own
added with `minutehand citus-add-node --rebalance` while `minutehand serve`
dispatches, a real worker runs the jobs and a submitter keeps submitting.
Nothing is lost, nothing runs twice, and the new node holds shard groups
after (only this test's database knows of it: Citus keeps its node list per
database)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

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
