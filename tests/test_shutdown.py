"""SIGTERM, the stop every service manager sends (systemd, Docker,
Kubernetes): each role, a real process with jobs in flight, exits with
status 0 within its grace period and leaves nothing claimed behind.

- a worker running jobs shorter than its grace lets them finish and reports
  them; an idle one waits out its long-poll (at most 10 s) and claimed nothing; a job still running when the
  grace ends is failed (retried elsewhere), not left to claim expiry;
- a dispatcher (`minutehand dispatcher`, and `minutehand serve`) with
  workers long-polling it and jobs running: it answers the polls at once,
  writes what workers report until it stops, gives its shard leases back
  (another dispatcher owns every shard at once, not after the lease
  expires), and every job still finishes on the remaining fleet exactly once.
"""
from __future__ import annotations

import time

import pytest

from minutehand.store.submit import JobSpec
from tests.fleet import SHARDS, Fleet
from tests.processes import Process, wait_until

pytestmark = pytest.mark.processes


def submit(fleet: Fleet, n: int, **payload) -> list[int]:
    return fleet.submit([JobSpec(name="work", payload=dict(payload), max_attempts=5) for _ in range(n)])


def sigterm(proc: Process, limit_s: float) -> float:
    """SIGTERM, then the seconds until it exited; fails past limit_s (then SIGKILLs it)."""
    started = time.monotonic()
    proc.signal(15)
    try:
        proc.proc.wait(limit_s)
    except Exception:
        out = proc.output()
        proc.kill()
        raise AssertionError(f"{proc.label} still running {limit_s} s after SIGTERM\n{out[-6000:]}") from None
    return time.monotonic() - started


# ---------------------------------------------------------------- workers
def test_a_worker_finishes_its_running_jobs_and_exits(fleet: Fleet):
    grace_s = 10.0
    server = fleet.server("--claim-lease-s", "30")
    w = fleet.worker([server.url], grace_s=grace_s, concurrency=4)
    submit(fleet, 4, sleep_s=3)
    wait_until(lambda: fleet.running_pids().get(w.pid) == 4, 30, "the worker to start 4 jobs")
    submit(fleet, 20, sleep_s=3)                    # due now, waiting for a slot: must stay scheduled

    took = sigterm(w, grace_s + 5)
    print(f"\nworker exited {took:.2f} s after SIGTERM (grace {grace_s} s), status {w.proc.returncode}")
    assert w.proc.returncode == 0, fleet.logs()
    assert took < grace_s, fleet.logs()
    assert fleet.held_by(w.pid) == 0, (fleet.states(), fleet.logs())
    assert fleet.states() == {"succeeded": 4, "scheduled": 20}, fleet.logs()
    assert "worker_stopped" in w.output()


def test_an_idle_worker_exits_within_its_long_poll(fleet: Fleet):
    """Its open long-poll is waited for (at most wait_s, 10 s), not cut: jobs
    the dispatcher claims for it meanwhile come back in the answer, and are
    given back at once."""
    server = fleet.server()
    w = fleet.worker([server.url], grace_s=30)
    wait_until(lambda: "worker_started" in w.output(), 30, "the worker to start")
    time.sleep(1.0)                                # its long-poll (wait_s 10) is open
    took = sigterm(w, 35)
    print(f"\nidle worker exited {took:.2f} s after SIGTERM")
    assert w.proc.returncode == 0 and took < 12, fleet.logs()
    # A job submitted now goes to the next worker on its first attempt: the stopped one claimed nothing.
    [job] = submit(fleet, 1)
    w2 = fleet.worker([server.url], grace_s=5)
    wait_until(lambda: fleet.states() == {"succeeded": 1}, 30, "the job to succeed")
    assert fleet.one("SELECT attempts FROM jobs WHERE id = %s", job)[0] == 1
    assert fleet.running_pids() == {w2.pid: 1}


def test_a_job_still_running_at_the_end_of_the_grace_is_failed_not_left_claimed(fleet: Fleet):
    grace_s = 2.0
    server = fleet.server("--claim-lease-s", "60")
    w = fleet.worker([server.url], grace_s=grace_s, concurrency=2)
    [slow, quick] = submit(fleet, 1, sleep_s=60) + submit(fleet, 1, sleep_s=0.5)
    wait_until(lambda: fleet.running_pids().get(w.pid) == 2, 30, "the worker to start both jobs")

    took = sigterm(w, grace_s + 8)
    print(f"\nworker exited {took:.2f} s after SIGTERM (grace {grace_s} s)")
    assert w.proc.returncode == 0 and took < grace_s + 3, fleet.logs()
    assert fleet.held_by(w.pid) == 0, (fleet.states(), fleet.logs())
    state, attempts, error = fleet.one("SELECT state::text, attempts, last_error FROM jobs WHERE id = %s", slow)
    assert state in ("retrying", "scheduled") and attempts == 1, (state, attempts, error, fleet.logs())
    assert "grace period" in error, error
    assert fleet.one("SELECT state::text FROM jobs WHERE id = %s", quick)[0] == "succeeded"


# ---------------------------------------------------------------- dispatchers
@pytest.mark.parametrize("role", ["dispatcher", "serve"])
def test_a_dispatcher_gives_its_shards_back_and_loses_nothing(fleet: Fleet, role: str):
    lease_s = 30.0                                  # long: a takeover within seconds is the give-back, not expiry
    flags = ("--shard-lease-s", str(lease_s), "--claim-lease-s", "20")
    a = fleet.server(*flags, role=role, name="a")
    b = fleet.server(*flags, role="dispatcher", name="b")
    wait_until(lambda: set(fleet.owners()) == {"a", "b"}, 40, "a and b to split the shards")
    # Workers of both (as in production: every worker lists every dispatcher), with polls open on a.
    for i in range(2):
        fleet.worker([a.url, b.url], grace_s=20, concurrency=6, label=f"worker-{i}")
    n = 400
    submit(fleet, n, sleep_s=0.3)
    wait_until(lambda: fleet.states().get("succeeded", 0) >= 40, 60, "jobs to flow")
    running_at_stop = fleet.one("SELECT count(*) FROM jobs WHERE state IN ('claimed', 'running')")[0]

    took = sigterm(a, 15)
    given_back = fleet.owners()
    print(f"\n{role} a exited {took:.2f} s after SIGTERM with {running_at_stop} jobs claimed; shards then: "
          f"{given_back}")
    assert a.proc.returncode == 0, fleet.logs()
    assert took < 10, fleet.logs()
    assert "a" not in given_back, given_back          # given back, not left to expire
    assert fleet.one("SELECT count(*) FROM dispatchers WHERE name = 'a'")[0] == 0
    wait_until(lambda: fleet.owners() == {"b": SHARDS}, 10, "b to own every shard")

    wait_until(lambda: fleet.states() == {"succeeded": n}, 120, f"all {n} jobs to succeed")
    assert not fleet.overdelivered(), (fleet.overdelivered(), fleet.logs())
    late = fleet.one("SELECT count(*) FROM jobs WHERE attempts > 1")[0]
    print(f"jobs that needed a second attempt: {late}")
    assert late == 0, fleet.logs()
