"""Workers the end-to-end tests run as real processes
(`minutehand worker tests.worker_apps:<name>`).

Each handler records every run it starts in the test database (table
`runs`), so a test can compare runs with deliveries (the job's attempts).
The database is MINUTEHAND_TEST_EFFECTS_DSN (set by the test).
Payload fields steer them:
  sleep_s     how long the handler takes
  fail_until  fail on attempts below this one (then succeed)
  guarded     do the side effect through job.once (exactly once)
"""
from __future__ import annotations

import os
import threading
import time

import psycopg

from minutehand.worker import Job, NonRetryable, Worker

_local = threading.local()

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS side_effects (job_id bigint, key text, at timestamptz DEFAULT clock_timestamp());
"""


def _conn() -> psycopg.Connection:
    """One connection per handler thread."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["MINUTEHAND_TEST_EFFECTS_DSN"], autocommit=True)
    return conn


def _record_run(job: Job) -> None:
    _conn().execute("INSERT INTO runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
                    (job.id, job.attempt, os.getpid()))


def _handle(job: Job):
    _record_run(job)
    p = job.payload if isinstance(job.payload, dict) else {}
    if p.get("sleep_s"):
        time.sleep(p["sleep_s"])
    if job.attempt < p.get("fail_until", 0):
        raise RuntimeError(f"failing on attempt {job.attempt}")
    if p.get("never"):
        raise NonRetryable("this job cannot succeed")
    if p.get("guarded"):
        def effect(c: psycopg.Connection) -> dict:
            c.execute("INSERT INTO side_effects (job_id, key) VALUES (%s, %s)", (job.id, job.effect_key("effect")))
            return {"done": True}

        # On the thread's connection, in a transaction of its own: a new
        # connection per job (a backend fork each) capped chaos runs at ~150 jobs/s.
        job.once(_conn(), "effect", effect)
    return {"ran": job.id % 1000, "attempt": job.attempt}


recorder = Worker()
recorder.job("work")(_handle)
recorder.job("other")(_handle)

# Holds its reports 2.5 s before sending them, so that a test can kill it
# between a keyed job's recorded result and its completion.
slow_reports = Worker(flush_s=2.5)
slow_reports.job("work")(_handle)

noop = Worker()


@noop.job("noop")
def _noop(job: Job):
    return None


# Returns at once on the worker's event loop: no handler thread per job, so
# thousands of jobs a second cost the worker little (tests/test_sustained.py).
idle = Worker()


@idle.job("idle")
async def _idle(job: Job):
    return None
