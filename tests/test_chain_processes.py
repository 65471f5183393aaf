"""The chain of repeating series with real processes on a real database:

- an every_s and a cron series run once per period through a dispatcher
  (its maintenance continues the chain) and the worker library over HTTP,
  on a pinned clock the test moves a period at a time;
- the process creating the next runs is killed with SIGKILL at moments
  spread over its commits, before, between and after them, over 200 trials
  (80 on Citus): no run is ever created twice and none is skipped.
"""
from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
import threading

import psycopg

from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store.records import Repeat
from minutehand.store.submit import JobSpec
from minutehand.worker import Worker
from tests.chain_child import chain_until_killed
from tests.processes import serving, wait_until
from tests.support import T0, claim_all, make_store, on_citus
import pytest

pytestmark = pytest.mark.processes

MIN = dt.timedelta(minutes=1)
ALL = range(256)
WAKE_ALL = "SELECT pg_notify('minutehand_due', string_agg(g::text, ',')) FROM generate_series(0, 255) g"


def runs(store, series_id: int) -> list[tuple]:
    with store.connection() as conn:
        return [tuple(r.values()) for r in conn.execute(
            "SELECT due_at, state::text, attempts FROM jobs WHERE series_id = %s ORDER BY due_at",
            (series_id,)).fetchall()]


def test_series_run_once_per_period_through_a_dispatcher_and_a_worker(db_dsn):
    store = make_store(db_dsn, clock=T0, max_size=8)
    store.create_team("t")
    token = store.create_worker_token("w")
    # Leases far longer than the clock's moves: the test's clock, not the wall's, runs them out.
    settings = Settings(dispatcher_name="d1", shard_lease_s=3600, claim_lease_s=600)
    every = store.submit("t", JobSpec(name="tick", due_at=T0 + MIN, repeat=Repeat(every_s=60))).series_id
    cron = store.submit("t", JobSpec(name="tick", repeat=Repeat(cron="* * * * *",
                                                                timezone="Europe/Berlin"))).series_id
    seen: list[int] = []
    process = build(settings, store, store)
    try:
        with serving(process.app) as url:
            worker = Worker(urls=[url], token=token, wait_s=1, concurrency=4, grace_s=5)
            worker.job("tick")(lambda job: seen.append(job.id))
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            try:
                for k in range(1, 6):
                    store.clock = T0 + k * MIN
                    with store.connection() as conn:
                        conn.execute(WAKE_ALL)            # the dispatcher sleeps by the wall clock
                    wait_until(lambda: [r[1] for r in runs(store, every)][k - 1] == "succeeded"
                               and [r[1] for r in runs(store, cron)][k - 1] == "succeeded"
                               and len(runs(store, every)) == k + 1 and len(runs(store, cron)) == k + 1,
                               timeout_s=30, what=f"period {k}'s runs to succeed and the next to be made")
            finally:
                worker.stop()
                thread.join(30)
        cron_first = dt.datetime(2030, 1, 1, 12, 1, tzinfo=dt.timezone.utc)
        for series_id, first in ((every, T0 + MIN), (cron, cron_first)):
            got = runs(store, series_id)
            assert [r[0] for r in got] == [first + k * MIN for k in range(6)]
            assert [r[1:] for r in got] == [("succeeded", 1)] * 5 + [("scheduled", 0)]
    finally:
        store.close()
    assert len(seen) == len(set(seen)) == 10


# ---------------------------------------------------------------- SIGKILL of the chain's creator
def test_sigkill_of_the_process_creating_the_next_runs_never_doubles_or_skips_a_run(db_dsn):
    series_n = 40
    store = make_store(db_dsn, clock=T0)
    store.create_team("t")
    ids = [store.submit("t", JobSpec(name=f"s{i}", due_at=T0, repeat=Repeat(every_s=60))).series_id
           for i in range(series_n)]
    # Only the series' shards: a claim walks each leased shard's buckets.
    leases = store.take_leases(sorted({i & 1023 for i in ids}), "d1", 30 * 86400)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.chain_child"])
    # The child's 8 commits take about 0.25 s on plain PostgreSQL; on a one-box
    # Citus cluster (every statement through the coordinator) 1-2 s, and the
    # kills must still land before the first and after the last. They are
    # spread evenly over the window (the golden ratio's multiples): on Citus,
    # where a trial takes seconds, fewer trials cover it as well.
    with psycopg.connect(db_dsn) as conn:
        window_s, trials = (2.0, 50) if on_citus(conn) else (0.25, 200)
    made_by_child = []
    try:
        for k in range(trials):
            store.clock = T0 + k * MIN
            claimed = claim_all(store, leases, lease_s=86400)
            assert len(claimed) == series_n, f"trial {k}: {len(claimed)} runs were due"
            ready = ctx.Event()
            child = ctx.Process(target=chain_until_killed, args=(db_dsn, store.clock.isoformat(), 5, ready),
                                daemon=True)
            child.start()
            assert ready.wait(10), "the child did not connect"
            threading.Event().wait(window_s * (k * 0.6180339887 % 1.0))   # its 8 commits take about that long
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            with store.connection() as conn:
                made_by_child.append(conn.execute("SELECT count(*) AS n FROM jobs WHERE due_at = %s",
                                                  (T0 + (k + 1) * MIN,)).fetchone()["n"])
            while store.continue_series(ALL):          # what the next owner of the shards does
                pass
            with store.connection() as conn:
                rows = conn.execute("SELECT series_id, count(*) AS n, min(due_at) AS first, max(due_at) AS last "
                                    "FROM jobs GROUP BY series_id").fetchall()
            assert {r["series_id"] for r in rows} == set(ids)
            assert all((r["n"], r["first"], r["last"]) == (k + 2, T0, T0 + (k + 1) * MIN) for r in rows), (k, rows)
    finally:
        store.close()
    # The kills landed before any commit, between commits, and after the last.
    assert 0 in made_by_child and series_n in made_by_child
    assert any(0 < n < series_n for n in made_by_child)
    print(f"runs the child had committed when killed, over {trials} trials:",
          {n: made_by_child.count(n) for n in sorted(set(made_by_child))})
