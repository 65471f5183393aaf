"""Crashes, failover and chaos with real processes: `minutehand serve` /
`minutehand dispatcher` and `minutehand worker` children on a real
database, killed with SIGKILL or paused with SIGSTOP. No mocks.

- a worker killed mid-job: the job comes back when its claim expires and
  succeeds on another worker, on attempt 2;
- heartbeats keep a 30 s job on a 5 s claim: one attempt, one run;
- a dispatcher killed: the survivor owns every shard within one lease
  period (plus a renewal tick), and every job still succeeds;
- a dispatcher paused past its lease (SIGSTOP) and resumed: it claims
  nothing under its old epochs, nothing is delivered twice;
- chaos: 20,000 jobs (8,000 on Citus), workers killed every ~2 s and a dispatcher once:
  every job succeeds, no job ran more often than it was delivered, every
  guarded side effect happened exactly once;
- a dead worker's open long-poll does not swallow a job: the job goes to
  a live worker on its first attempt.

The handlers (tests/worker_apps.py) record every run in table `runs` and
guarded effects in `side_effects`; here both live in the test's database.
"""
from __future__ import annotations

import bisect
import datetime as dt
import random
import re
import signal
import threading
import time
from collections import Counter

import psycopg
import pytest

from minutehand.store.submit import JobSpec
from tests.fleet import SHARDS, TEAM, ClaimsNeverExpire, Fleet, work
from tests.processes import wait_until
from tests.support import make_store, on_citus

pytestmark = pytest.mark.processes


def wait_or_fail(fleet: Fleet, check, timeout_s: float, what: str):
    """wait_until, with every process's log in the failure."""
    try:
        return wait_until(check, timeout_s, what, every_s=0.1)
    except AssertionError as exc:                   # the same type (ClaimsNeverExpire), more detail
        raise type(exc)(f"{exc}\njobs: {fleet.states()}\n{fleet.logs()}") from None


# ---------------------------------------------------------------- 1. a worker killed mid-job
def test_worker_killed_mid_job_is_run_again_elsewhere(fleet: Fleet):
    server = fleet.server("--claim-lease-s", "3")
    # One slot, busy with the job: A has no long-poll open when it dies, so
    # the attempt count is exact (an open one is dropped when its worker hangs
    # up: test_a_dead_workers_open_long_poll_does_not_swallow_jobs).
    a = fleet.worker([server.url], concurrency=1, label="worker-a")
    [job] = fleet.submit([JobSpec(name="work", payload={"sleep_s": 4})])

    wait_or_fail(fleet, lambda: fleet.runs(job), 30, "worker A to start the job")
    assert fleet.runs(job) == [(1, a.pid)]
    killed_at = time.monotonic()
    a.kill()
    b = fleet.worker([server.url], label="worker-b")

    wait_or_fail(fleet, lambda: fleet.done_or_stuck(1), 40, "the job to succeed on worker B")
    took = time.monotonic() - killed_at
    row = fleet.one("SELECT state::text, attempts, claimed_by, last_error FROM jobs WHERE id = %s", job)
    runs = fleet.runs(job)
    print(f"\njob back and done {took:.1f} s after the kill; runs {runs}; {row}")
    assert row[0] == "succeeded" and row[1] == 2, fleet.logs()
    assert runs == [(1, a.pid), (2, b.pid)], fleet.logs()
    assert (row[2] or "").endswith(f":{b.pid}"), row          # claimed_by: worker B's id (host:pid)


def test_a_dead_workers_open_long_poll_does_not_swallow_jobs(fleet: Fleet):
    """A worker killed while its long-poll is open: a job due right after
    must go to a live worker on its first attempt, not to the dead poll
    (which would cost it an attempt and a claim period)."""
    server = fleet.server("--claim-lease-s", "3")
    a = fleet.worker([server.url], concurrency=1, label="worker-a")
    wait_or_fail(fleet, lambda: "worker_started" in a.output(), 30, "worker A to start")
    time.sleep(1.0)                                   # A's first long-poll is open
    a.kill()
    [job] = fleet.submit([JobSpec(name="work")])
    b = fleet.worker([server.url], label="worker-b")

    wait_or_fail(fleet, lambda: fleet.all_succeeded(1), 30, "the job to succeed on worker B")
    attempts, last_error = fleet.one("SELECT attempts, last_error FROM jobs WHERE id = %s", job)
    print(f"\nattempts {attempts}, runs {fleet.runs(job)}, last error {last_error!r}")
    assert (attempts, fleet.runs(job)) == (1, [(1, b.pid)]), last_error


# ---------------------------------------------------------------- 2. heartbeats
def test_heartbeats_keep_a_30s_job_alive_on_a_5s_claim(fleet: Fleet):
    """Slow-ish (~35 s): a 30 s job on a 5 s claim, renewed by heartbeat."""
    server = fleet.server("--claim-lease-s", "5")
    w = fleet.worker([server.url])
    [job] = fleet.submit([JobSpec(name="work", payload={"sleep_s": 30})])

    wait_or_fail(fleet, lambda: fleet.runs(job), 30, "the job to start")
    claimed_at, first_expiry = fleet.one("SELECT claimed_at, claim_expires_at FROM jobs WHERE id = %s", job)
    assert first_expiry <= claimed_at + dt.timedelta(seconds=5.5)
    # The claim keeps moving forward while the handler sleeps, never more than a claim ahead.
    expiries, states = [], set()
    for _ in range(25):
        time.sleep(1)
        state, expires, now = fleet.one("SELECT state::text, claim_expires_at, now() FROM jobs WHERE id = %s", job)
        if state not in ("claimed", "running"):
            break
        states.add(state)
        assert expires > now, f"the claim lapsed while the job ran\n{fleet.logs()}"
        expiries.append(expires)
    assert len(expiries) >= 20 and expiries[-1] >= claimed_at + dt.timedelta(seconds=20), (expiries, fleet.logs())
    assert states == {"running"}, (states, fleet.logs())      # the worker reported the start

    wait_or_fail(fleet, lambda: fleet.all_succeeded(1), 30, "the job to succeed")
    state, attempts, last_error = fleet.one("SELECT state::text, attempts, last_error FROM jobs WHERE id = %s", job)
    assert (state, attempts, last_error) == ("succeeded", 1, None), fleet.logs()
    assert fleet.runs(job) == [(1, w.pid)], fleet.logs()


# ---------------------------------------------------------------- 3. a dispatcher killed
def test_dispatcher_killed_its_shards_are_taken_over_within_a_lease(fleet: Fleet):
    lease_s = 3.0
    flags = ("--shard-lease-s", str(lease_s), "--claim-lease-s", "5")
    d1 = fleet.server(*flags, role="dispatcher", name="d1")
    d2 = fleet.server(*flags, role="dispatcher", name="d2")
    workers = [fleet.worker([d1.url, d2.url], label=f"worker-{i}") for i in range(2)]
    wait_or_fail(fleet, lambda: fleet.split("d1", "d2"), 20, "d1 and d2 to split the shards")
    print(f"\nbefore the kill: {fleet.owners()}")

    n = 3000
    fleet.submit(work(n, sleep_s=0.01))
    wait_or_fail(fleet, lambda: fleet.states().get("succeeded", 0) >= n // 4, 60, "a quarter of the jobs done")
    in_flight = fleet.states()

    d1.kill()
    killed = time.monotonic()
    wait_or_fail(fleet, lambda: fleet.owners().get("d2") == SHARDS, lease_s * 3, "d2 to own every shard")
    takeover = time.monotonic() - killed
    print(f"jobs at the kill: {in_flight}; d2 owns all {SHARDS} shards {takeover:.2f} s after the SIGKILL of d1")
    assert takeover <= lease_s * 1.2 + 1.0, f"takeover took {takeover:.2f} s\n{fleet.logs()}"

    wait_or_fail(fleet, lambda: fleet.done_or_stuck(n), 60, "every job to succeed")
    assert not fleet.overdelivered(), (fleet.overdelivered(), fleet.logs())
    assert all(w.alive() for w in workers), fleet.logs()


# ---------------------------------------------------------------- 3b. quotas through a backlog of minutes
QUOTAS = {"big": 20, "s5": 5, "s10": 10}
CONTENDED_S = 2.5       # lending stops within two membership renewals, and lent jobs end (0.3 s)


def test_quotas_hold_through_a_backlog_of_minutes_with_three_dispatchers_one_killed_and_restarted(fleet: Fleet):
    """Three teams with quotas 20, 5 and 10 and a backlog due over the last
    six minutes, on 24 slots (fewer than the quotas add up to), three
    dispatchers: one is SIGKILLed, and later started again. Whenever a team
    has waited CONTENDED_S with due work and fewer running than its quota,
    no other team runs more than its quota + 2 (three dispatchers, each
    rounding its share up); inside a handover window (from a lease period
    before any shard is seen to change hands until the moved jobs have
    ended: the kill, the start, or a dispatcher on a loaded machine late to
    renew, its lease lapsing: a new epoch), more only by the team's jobs
    running on the shards that moved.
    Every job succeeds once.

    What ran when is counted afterwards from the database's claim and end
    times of every attempt, at the database time of each sample: a count
    read while jobs turn over is not an instant (on Citus each shard group
    is read in its own snapshot, and a read behind a loaded machine spans
    several 0.3 s jobs), and would count a job that ended and the one that
    took its slot both."""
    for team, quota in QUOTAS.items():
        fleet.store.create_team(team, quota=quota)
    # The backlog, due minute by minute over the last six, before any dispatcher
    # looks: a shard's first look starts at the sweep line, 30 minutes back.
    now = dt.datetime.now(dt.timezone.utc)
    past = make_store(fleet.dsn, clock=now)
    try:
        for minutes_ago in range(6, 0, -1):
            past.clock = now - dt.timedelta(minutes=minutes_ago)
            for team, n in (("big", 200), ("s5", 40), ("s10", 80)):
                items = past.submit_many(team, [JobSpec(name="work", payload={"sleep_s": 0.3})] * n)
                assert not [i.error for i in items if i.error]
    finally:
        past.close()
    total = 6 * (200 + 40 + 80)
    lease_s = 2.0
    flags = ("--shard-lease-s", str(lease_s), "--claim-lease-s", "5")
    servers = [fleet.server(*flags, role="dispatcher", name=f"q{i}") for i in range(3)]
    urls = [d.url for d in servers]
    for i in range(3):
        fleet.worker(urls, concurrency=8, label=f"worker-{i}")

    sample = """SELECT t.name, count(*) FILTER (WHERE j.state IN ('scheduled', 'retrying'))
                  FROM jobs j JOIN teams t ON t.id = j.team_id WHERE t.name = ANY (%s) GROUP BY t.name"""
    # Every attempt's claim and end: the last one's in the job, earlier ones' in its history.
    attempts = """SELECT t.name, j.claimed_at, j.finished_at FROM jobs j JOIN teams t ON t.id = j.team_id
                     WHERE t.name = ANY (%(teams)s) AND j.claimed_at IS NOT NULL
                  UNION ALL
                  SELECT t.name, a.claimed_at, a.ended_at FROM job_attempts a
                    JOIN jobs j ON j.shard = a.shard AND j.id = a.job_id JOIN teams t ON t.id = j.team_id
                   WHERE t.name = ANY (%(teams)s) AND a.claimed_at IS NOT NULL"""
    per_shard = """SELECT j.shard, t.name, count(*) FROM jobs j JOIN teams t ON t.id = j.team_id
                    WHERE j.state IN ('claimed', 'running') GROUP BY 1, 2"""
    # A lease that lapsed and was taken again, even by the same dispatcher,
    # has a new epoch: its claims were refused meanwhile, its view read anew.
    owners = "SELECT shard, (CASE WHEN lease_expires_at > now() THEN owner END, epoch) FROM shards"
    said = "SELECT name, due, running_teams, running, waiting FROM dispatchers WHERE expires_at > now() ORDER BY name"
    window_s = lease_s + 2 * lease_s / 5 + 1.0          # the shards move, the moved jobs end
    # (from, to, the shards that moved, each team's jobs running on them just before)
    windows: list[tuple[float, float, set[int], Counter]] = []
    samples, checked, peak = [], 0, dict.fromkeys(QUOTAS, 0)
    patience_s = 240.0 * (3 if on_citus(fleet.db) else 1)
    started = time.monotonic()
    killed = restarted = settled = None
    restart: threading.Thread | None = None
    held, running_then = dict(fleet.db.execute(owners).fetchall()), []
    while True:
        at = time.monotonic() - started
        db_at = fleet.db.execute("SELECT clock_timestamp()").fetchone()[0]
        waiting = dict(fleet.db.execute(sample, (list(QUOTAS),)).fetchall())
        if not any(waiting.values()):
            break
        samples.append((at, db_at, waiting, fleet.db.execute(said).fetchall()))
        now_held = dict(fleet.db.execute(owners).fetchall())
        moved = {s for s, o in now_held.items() if o != held.get(s)}
        if moved:
            moved_running = Counter()
            for shard, team, n in running_then:
                moved_running[team] += n if shard in moved else 0
            windows.append((at - lease_s, at + window_s, moved, moved_running))
            held = now_held
        running_then = fleet.db.execute(per_shard).fetchall()
        if killed is None and at > 3:
            servers[0].kill()
            killed = at
        if restart is None and killed is not None and at > killed + window_s + 1:
            restarted = at
            restart = threading.Thread(target=lambda: servers.append(
                fleet.server(*flags, role="dispatcher", name="q0b", port=servers[0].port)))
            restart.start()
        if restart is not None and settled is None and fleet.split("q0b", "q1", "q2"):
            settled = at
        assert at < patience_s, f"the backlog still waits: {fleet.states()}\n{fleet.logs()}"
        time.sleep(0.1)
    wait_or_fail(fleet, lambda: fleet.done_or_stuck(total), patience_s, f"all {total} jobs to succeed")
    assert restart is not None, "the backlog drained before the restart"
    restart.join(60)
    assert settled is not None, "the backlog drained before the restarted dispatcher took its shards"
    starts: dict[str, list[dt.datetime]] = {team: [] for team in QUOTAS}
    ends: dict[str, list[dt.datetime]] = {team: [] for team in QUOTAS}
    for team, claimed_at, ended_at in fleet.db.execute(attempts, {"teams": list(QUOTAS)}):
        starts[team].append(claimed_at)
        ends[team].append(ended_at)
    for team in QUOTAS:
        starts[team].sort()
        ends[team].sort()
    waited_since: dict[str, float] = {}
    for at, db_at, waiting, _ in samples:
        counts = {team: (bisect.bisect_right(starts[team], db_at) - bisect.bisect_right(ends[team], db_at),
                         waiting.get(team, 0)) for team in QUOTAS}
        for team, (running, waits) in counts.items():
            if waits and running < QUOTAS[team]:
                waited_since.setdefault(team, at)
            else:
                waited_since.pop(team, None)
        contended = {t for t, since in waited_since.items() if at - since >= CONTENDED_S}
        for team, (running, _) in counts.items():
            if not contended - {team}:
                continue
            bound = QUOTAS[team] + 2 + sum(moved_running[team] for since, until, _, moved_running in windows
                                           if since <= at <= until)
            checked += 1
            peak[team] = max(peak[team], running)
            assert running <= bound, (
                f"{team} ran {running} (bound {bound}) {at:.1f} s in while {contended} waited; handovers "
                f"{[(round(a, 1), sorted(m)) for a, _, m, _ in windows]}\nsamples then (waiting; what each "
                f"dispatcher said: name, due, running teams, running, waiting):\n"
                + "\n".join(f"{a:.1f} {w} {d}" for a, _, w, d in samples if abs(a - at) < 2))
    print(f"\n{checked} contended samples; peaks {peak} (quotas {QUOTAS}); q0 killed {killed:.1f} s in, "
          f"started again {restarted:.1f} s in, its shards settled {settled:.1f} s in; "
          f"{len(windows)} handovers seen")
    assert checked > 50, samples
    assert not fleet.overdelivered(), fleet.overdelivered()


# ---------------------------------------------------------------- 4. a dispatcher paused, then resumed
class LeaseHistory:
    """Every (owner, epoch) each shard's lease had, and when (database time)
    it was first seen; sampled every 20 ms in a thread."""

    def __init__(self, dsn: str):
        self.seen: dict[tuple[int, str | None, int], dt.datetime] = {}
        self._stop = threading.Event()
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = self._conn.execute(
                "SELECT mh_now(), shard, CASE WHEN lease_expires_at > mh_now() THEN owner END, epoch FROM shards"
            ).fetchall()
            for now, shard, owner, epoch in rows:
                self.seen.setdefault((shard, owner, epoch), now)
            self._stop.wait(0.02)

    def first_held(self, shard: int, owner: str, above_epoch: int) -> dt.datetime | None:
        """When `owner` was first seen holding `shard` with an epoch above `above_epoch`."""
        times = [t for (s, o, e), t in self.seen.items() if s == shard and o == owner and e > above_epoch]
        return min(times, default=None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


def test_paused_dispatcher_claims_nothing_under_its_old_epoch(fleet: Fleet):
    lease_s = 3.0
    flags = ("--shard-lease-s", str(lease_s), "--claim-lease-s", "10")
    a = fleet.server(*flags, role="dispatcher", name="a")
    b = fleet.server(*flags, role="dispatcher", name="b")
    # One worker per dispatcher: the pid in `runs` tells which dispatcher delivered a job.
    wa = fleet.worker([a.url], concurrency=5, label="worker-a")
    wb = fleet.worker([b.url], concurrency=5, label="worker-b")
    wait_or_fail(fleet, lambda: fleet.split("a", "b"), 20, "a and b to split the shards")
    history = LeaseHistory(fleet.dsn)
    try:
        a.signal(signal.SIGSTOP)
        log_at_pause = len(a.output())
        old = dict(fleet.db.execute("SELECT shard, epoch FROM shards").fetchall())
        owned_by_a = {s for s, o in fleet.db.execute("SELECT shard, owner FROM shards").fetchall() if o == "a"}
        paused = time.monotonic()
        wait_or_fail(fleet, lambda: fleet.owners().get("b") == SHARDS, lease_s * 3, "b to take every shard")
        print(f"\nb took a's {len(owned_by_a)} shards {time.monotonic() - paused:.2f} s after SIGSTOP")
        epochs = dict(fleet.db.execute("SELECT shard, epoch FROM shards").fetchall())
        assert all(epochs[s] > old[s] for s in owned_by_a), "takeover must raise the fencing epoch"

        n = 600
        ids = fleet.submit(work(n, sleep_s=0.05))
        time.sleep(1.0)                               # b is dispatching them; a wakes to stale leases
        a.signal(signal.SIGCONT)
        resumed = time.monotonic()
        wait_or_fail(fleet, lambda: fleet.done_or_stuck(n), 90, "every job to succeed")
        print(f"all {n} done {time.monotonic() - resumed:.1f} s after SIGCONT; shards now {fleet.owners()}")
    finally:
        history.stop()

    rows = fleet.db.execute(
        """SELECT j.id, j.shard, j.attempts, j.claimed_at, array_agg(r.pid ORDER BY r.at)
             FROM jobs j LEFT JOIN runs r ON r.job_id = j.id GROUP BY j.shard, j.id""").fetchall()
    assert len(rows) == n and {r[0] for r in rows} == set(ids)
    twice = [r for r in rows if r[2] != 1 or len(r[4]) != 1]
    assert not twice, f"delivered more than once or not at all: {twice[:10]}\n{fleet.logs()}"

    # Every job a delivered (run by its worker) was claimed under a lease a
    # took after its pause, with a new epoch; never under the old one.
    by_a = [r for r in rows if r[4] == [wa.pid]]
    stale = []
    for job_id, shard, _, claimed_at, _ in by_a:
        since = history.first_held(shard, "a", old[shard])
        if since is None or claimed_at < since - dt.timedelta(seconds=0.1):
            stale.append((job_id, shard, claimed_at, since))
    print(f"a delivered {len(by_a)} jobs after rejoining, b {sum(r[4] == [wb.pid] for r in rows)}")
    assert not stale, f"a claimed under a stale lease: {stale[:10]}\n{fleet.logs()}"
    assert by_a, f"a never dispatched again after rejoining\n{fleet.logs()}"

    # What a wrote after its pause: refused claims (stale epochs), shards lost, or its shards taken again
    # under new epochs (its first renewal came before any claim, and the split gave it the same shards).
    after = [ln for ln in a.output()[log_at_pause:].splitlines() if "refused" in ln or "shards:" in ln]
    print("a's log after the pause:", *after[:8], sep="\n  ")
    assert any(re.search(r"claims refused on \d+ shards|shards: \d+ owned \(\+\d+ -[1-9]|leases lapsed", ln)
               for ln in after), \
        f"a's log shows neither refused claims nor lost shards after its pause\n{fleet.logs()}"


# ---------------------------------------------------------------- 5. chaos
def test_chaos_thousands_of_jobs_with_workers_and_a_dispatcher_killed(fleet: Fleet):
    # What must hold is that the jobs keep finishing through the kills, not how
    # fast: a busy machine (or a one-box Citus cluster, every statement
    # through the coordinator) takes several times a quiet one's time. So
    # the test fails when no job has finished for STALL_S, and only a run
    # past a generous ceiling fails on time alone. On Citus 8,000 jobs see
    # the same faults (a worker killed every ~2 s throughout, the dispatcher
    # at 6 s) in less than half the time.
    n, stall_s, ceiling_s = (8_000 if on_citus(fleet.db) else 20_000), 120.0, 1800.0
    rng = random.Random()
    flags = ("--shard-lease-s", "3", "--claim-lease-s", "5")
    dispatchers = [fleet.server(*flags, role="dispatcher", name=f"d{i}") for i in range(2)]
    urls = [d.url for d in dispatchers]
    workers = [fleet.worker(urls, concurrency=10, label=f"worker-{i}") for i in range(4)]
    wait_or_fail(fleet, lambda: fleet.split("d0", "d1"), 20, "the dispatchers to split the shards")

    started = time.monotonic()
    # Half guarded (exactly-once effect, idempotency key); enough attempts that
    # a job caught in several kills in a row is not set aside as dead.
    specs = [JobSpec(name="work", payload={"guarded": True, "i": i}, idempotency_key=f"chaos-{i}",
                     max_attempts=20) if i % 2 else JobSpec(name="work", payload={"i": i}, max_attempts=20)
             for i in range(n)]
    submit_errors: list[BaseException] = []

    def submit_all() -> None:
        try:
            fleet.submit(specs)
        except BaseException as exc:                # noqa: BLE001 - raised in the test below
            submit_errors.append(exc)

    submitter = threading.Thread(target=submit_all, daemon=True)
    submitter.start()

    def chaos_logs() -> str:
        return f"{worker_kills} workers and {dispatcher_kills} dispatcher killed\n" + fleet.logs(30, live_only=True)

    worker_kills = dispatcher_kills = last_done = 0
    progressed = started
    next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
    dispatcher_kill_at = time.monotonic() + 6.0
    try:
        while True:
            if submit_errors:
                raise submit_errors[0]
            states = fleet.states()
            done = states.get("succeeded", 0)
            if done == n and not submitter.is_alive():
                break
            now = time.monotonic()
            if done > last_done:
                last_done, progressed = done, now
            assert now - progressed < stall_s, f"no job finished for {stall_s} s: {states}\n{chaos_logs()}"
            assert now - started < ceiling_s, f"not done after {ceiling_s} s: {states}\n{chaos_logs()}"
            assert not (states.keys() - {"scheduled", "claimed", "running", "retrying", "succeeded"}), \
                f"{states}\n{chaos_logs()}"
            if stale := fleet.stale_claims():
                raise ClaimsNeverExpire(f"{stale} expired claims never returned: {states}\n{chaos_logs()}")
            if now >= dispatcher_kill_at and not dispatcher_kills:
                victim = rng.randrange(len(dispatchers))
                old = dispatchers[victim]
                old.kill()
                dispatcher_kills += 1
                # Back on the same port (the workers know that URL), under a new name.
                dispatchers[victim] = fleet.server(*flags, role="dispatcher", name=f"d{victim}-again",
                                                   port=old.port)
            if now >= next_kill and n - done > 1000:
                i = rng.randrange(len(workers))
                workers[i].kill()
                worker_kills += 1
                workers[i] = fleet.worker(urls, concurrency=10, label=f"worker-{i}-{worker_kills}")
                next_kill = now + rng.uniform(1.5, 2.5)
            time.sleep(0.5)
    finally:
        submitter.join(60)
    elapsed = time.monotonic() - started
    print(f"\n{n} jobs succeeded in {elapsed:.1f} s; {worker_kills} workers and "
          f"{dispatcher_kills} dispatcher SIGKILLed")

    assert fleet.states() == {"succeeded": n}
    assert not fleet.overdelivered(), (fleet.overdelivered(), chaos_logs())
    effects = fleet.db.execute(
        """SELECT j.id, count(s.job_id) FROM jobs j LEFT JOIN side_effects s ON s.job_id = j.id
            WHERE (j.payload->>'guarded')::boolean IS NOT DISTINCT FROM true
            GROUP BY j.id HAVING count(s.job_id) <> 1 LIMIT 20""").fetchall()
    assert not effects, f"guarded jobs without exactly one side effect: {effects}"
    guarded, unguarded_effects = fleet.one(
        """SELECT (SELECT count(*) FROM jobs WHERE payload ? 'guarded'),
                  (SELECT count(*) FROM side_effects s JOIN jobs j ON j.id = s.job_id
                    WHERE NOT j.payload ? 'guarded')""")
    assert (guarded, unguarded_effects) == (n // 2, 0)
    # (The runs count apart: Citus pushes no subquery of the select list down beside aggregates.)
    stats = (*fleet.one("SELECT count(*) FILTER (WHERE attempts > 1), max(attempts) FROM jobs"),
             fleet.one("SELECT count(*) FROM runs")[0])
    print(f"jobs delivered more than once: {stats[0]}, most attempts {stats[1]}, runs {stats[2]}")
    # The counters kept through all of it equal a recount of the jobs.
    counted = fleet.store.team_stats(TEAM, window_s=3600)
    assert (counted.total.submitted, counted.total.started, counted.total.succeeded,
            counted.total.dead, counted.total.cancelled) == (n, n, n, 0, 0)
    assert sum(counted.total.lateness_hist) == sum(counted.total.runtime_hist) == n
    assert counted.running == 0
    assert fleet.one("SELECT count(*) FROM team_running WHERE running <> 0")[0] == 0
