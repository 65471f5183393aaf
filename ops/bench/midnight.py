"""Midnight benchmark: dispatch fairness when a spike comes due at once.

50 teams with unequal weights, quotas and sizes submit jobs all due at one
instant, "midnight" (70% flexible with a 1 h window, 30% strict), before
it arrives. Worker processes (`minutehand worker`, a handler that sleeps a
fixed time: ops/bench/sleep_worker.py) have a fixed capacity well below the
spike, served by one `minutehand serve` process, on a fresh durable cluster
(fsync and synchronous_commit on). The run lasts --seconds after midnight;
every figure is computed afterwards from the jobs table.

    python -m ops.bench.midnight                   # 200,000 jobs, 100 slots x 200 ms = 500 jobs/s
    python -m ops.bench.midnight --quick           # ~1-2 min: 30,000 jobs, 40 s
    python -m ops.bench.midnight --jobs 1000000    # the full-size midnight (~30 min at 500 jobs/s)
    python -m ops.bench.midnight --jobs 1000000 --concurrency 150   # the same on 300 slots, ~10 min
    python -m ops.bench.midnight --processes 2 --concurrency 100 --job-ms 100 --seconds 300
    python -m ops.bench.midnight --dsn URL         # a server of yours (database mh_bench_midnight is recreated)

Figures:
- contention: from midnight until no due job has waited more than 1 s
  (the backlog's first emptying), or the run's end;
- per team, share of starts (claims) during contention, observed and
  expected, and their ratio. Expected: what the team was owed while it
  waited, second by second: the second's starts go to the first class
  with work waiting (or coming due) in it, in the dispatcher's order (an
  older minute bucket first; in a bucket, strict before flexible), shared
  by weight among the teams with work in that class, none given more than
  it has there nor, while another team waits, more than its quota allows
  (quota / mean time a job holds its slot); the rest goes to the next
  class, then what only quotas refused is lent out (see `owed`);
- max deviation: the largest |observed / expected - 1| among teams with
  at least --min-starts starts in contention (a team of a few jobs is
  judged by its start lag: for it a share is noise, and a second in which
  one of its jobs waited counts whole); misplaced: the share of the
  contention's starts that went to another team than owed, second by
  second (half the sum of |observed - expected| starts);
- start lag (claim time - assigned run time) p50/p99/max of strict jobs,
  of flexible jobs, and of the small teams' jobs (teams with < 100 jobs);
  jobs due in the run but never claimed count with lag = run end - run
  time (a figure marked >= holds such);
- per team, the most jobs it had claimed or running at once during
  contention (from claimed_at .. finished_at), vs its quota. Outcomes
  are written in batches, so a job counts until its finish is written,
  as the dispatcher sees it: the sum over teams can pass the slots;
- starts/s during contention, vs the nominal capacity (slots / job time);
- the floor of any PostgreSQL queue on the server (pgbench,
  ops/bench/floor/run.sh; short runs, for context; --no-floor skips it).
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from minutehand.store import schema
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from ops.bench.api import _free_port, start_server, stop_server
from ops.bench.e2e import start_workers, stop_all
from ops.bench.server import bench_server, minutehand_database
from ops.bench.store import recreate

FLOOR = Path(__file__).with_name("floor") / "run.sh"
JOB = "midnight.sleep"
FLEX_S = 3600
STRICT_SHARE = 0.3
SMALL = 100                       # a team with fewer jobs is "small"
ROUNDS = 10                       # teams submit in interleaved rounds, as concurrent submitters would
ASSUMED_SUBMIT_PER_S = 5000       # to place midnight after the submission (measured 6,600-10,400 on 2 cores)


@dataclass(frozen=True)
class Team:
    name: str
    weight: int
    quota: int
    jobs: int


def teams_for(jobs: int, slots: int) -> list[Team]:
    """The 50 teams. Big teams weigh 5-10 and hold most jobs; t06 holds many
    jobs at weight 1 (a greedy team); ten mid teams weigh 2; 26 weigh 1;
    eight tiny teams hold tens of jobs each. Quotas are fractions of the
    slots: each below them, together well above."""
    tiny = [20 + 10 * i for i in range(8)]                   # 20 .. 90 jobs
    rest = max(0, jobs - sum(tiny))
    # (name, weight, quota as a fraction of the slots, fraction of the rest)
    layout = [("t01", 10, .20, .25), ("t02", 8, .18, .15), ("t03", 6, .15, .10), ("t04", 5, .12, .08),
              ("t05", 5, .12, .02), ("t06", 1, .08, .15)]
    layout += [(f"t{i:02d}", 2, .06, .015) for i in range(7, 17)]
    layout += [(f"t{i:02d}", 1, .04, .10 / 26) for i in range(17, 43)]
    out = [Team(n, w, max(2, round(q * slots)), int(f * rest)) for n, w, q, f in layout]
    out[0] = Team(out[0].name, out[0].weight, out[0].quota, out[0].jobs + rest - sum(t.jobs for t in out))
    out += [Team(f"t{43 + i}", 1, max(2, round(.04 * slots)), n) for i, n in enumerate(tiny)]
    return out


def specs(n: int, midnight: dt.datetime, job_ms: int, strict_from: int) -> list[JobSpec]:
    """n jobs of a team; every (1 / STRICT_SHARE)-th is strict, counting from strict_from."""
    out = []
    for i in range(strict_from, strict_from + n):
        strict = math.floor((i + 1) * STRICT_SHARE) > math.floor(i * STRICT_SHARE)
        out.append(JobSpec(name=JOB, due_at=midnight, strict=strict, flex_s=0 if strict else FLEX_S,
                           payload={"ms": job_ms}))
    return out


def submit(url: str, teams: list[Team], midnight: dt.datetime, job_ms: int) -> float:
    """Every team's jobs in ROUNDS interleaved rounds (a share of each team per
    round, teams in a new order each round: on the current code, ties in the
    claim's order go by insertion), three connections at a time; returns the
    seconds it took."""
    t0 = time.monotonic()
    rng = random.Random(0)
    with Store(url, max_size=3) as store, ThreadPoolExecutor(3) as pool:
        for r in range(ROUNDS):
            calls = []
            for t in rng.sample(teams, len(teams)):
                lo, hi = t.jobs * r // ROUNDS, t.jobs * (r + 1) // ROUNDS
                for b in range(lo, hi, 10_000):
                    calls.append((t.name, specs(min(hi, b + 10_000) - b, midnight, job_ms, b)))
            for items in pool.map(lambda c: store.submit_many(*c), calls):
                bad = [i.error for i in items if i.error is not None]
                if bad:
                    raise SystemExit(f"submission refused: {bad[0]}")
    return time.monotonic() - t0


def floor_figure(dsn: str, seconds: int, rows: int) -> int | None:
    """The floor's claim figure (rows/s), in a recreated database mh_floor; short runs."""
    url = recreate(dsn, "mh_floor")
    out = subprocess.run(["bash", str(FLOOR), url, str(seconds), str(rows)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    figures = {k: int(v) for k, v in (line.split("=") for line in out.split() if "=" in line)}
    return figures.get("floor_claim_delete_batch100_rows_per_s")


# ---------------------------------------------------------------- figures
def fill(total: float, weights: dict, caps: dict) -> dict:
    """`total` shared by weight, none given above its cap; what a capped one
    cannot take goes to the others, by weight."""
    got = {t: 0.0 for t in weights}
    open_ = {t for t in weights if caps[t] > 1e-9}
    left = total
    while left > 1e-9 and open_:
        wsum = sum(weights[t] for t in open_)
        full = {t for t in open_ if got[t] + left * weights[t] / wsum >= caps[t] - 1e-9}
        if not full:
            for t in open_:
                got[t] += left * weights[t] / wsum
            break
        for t in full:
            left -= caps[t] - got[t]
            got[t] = caps[t]
        open_ -= full
    return got


def owed(weights: dict[int, float], quota_per_s: dict[int, float], arrive: dict[tuple, list[int]],
         start: dict[tuple, list[int]], seconds: int) -> tuple[dict[int, float], float]:
    """What each team was owed while it waited, summed over the seconds of
    contention, and the starts that went to another team than owed.

    arrive and start count, per (team, class) and second, the jobs coming
    due and the jobs started; a class is (minute bucket of the run time,
    flexible), in the order the dispatcher serves them: an older bucket
    first, in a bucket strict before flexible. Each second's starts go to
    the first class with work waiting, shared by weight among the teams
    with work in it, none given more than it has there, nor more than its
    quota allows while others wait; what is left goes to the next class;
    what only quotas refused is then lent out the same way (borrowing idle
    capacity). (A share of the whole contention alone would say nothing:
    once the backlog empties, every team has had all its due jobs started,
    in whatever order.)"""
    classes = sorted({c for _, c in arrive})
    expected = {t: 0.0 for t in weights}
    misplaced = 0.0
    waiting = {key: 0 for key in arrive}
    for k in range(seconds):
        have = {key: waiting[key] + arrive[key][k] for key in arrive}
        left = float(sum(v[k] for v in start.values()))
        room = dict(quota_per_s)
        share = {t: 0.0 for t in weights}
        for capped in (True, False):
            for c in classes:
                if left <= 1e-9:
                    break
                in_c = {t: have[(t, c)] for t in weights if have.get((t, c), 0) > 1e-9}
                got = fill(left, {t: weights[t] for t in in_c},
                           {t: min(n, room[t]) if capped else n for t, n in in_c.items()})
                for t, x in got.items():
                    have[(t, c)] -= x
                    room[t] -= x
                    share[t] += x
                    left -= x
        for key in arrive:
            waiting[key] = waiting[key] + arrive[key][k] - start[key][k]
        for t in weights:
            expected[t] += share[t]
            misplaced += abs(sum(start[(t, c)][k] for c in classes if (t, c) in start) - share[t]) / 2
    return expected, misplaced


def contention_end(conn, midnight: dt.datetime, end: dt.datetime) -> dt.datetime:
    """The first instant after midnight when no due job had waited more than
    1 s: the start of the first gap in the union of the intervals [run_at +
    1 s, claimed_at) of the jobs that waited longer (or the run's end)."""
    row = conn.execute(
        """WITH iv AS (
               SELECT run_at + interval '1 s' AS s, least(coalesce(claimed_at, %(end)s), %(end)s) AS e
                 FROM jobs
                WHERE run_at <= %(end)s - interval '1 s'
                  AND coalesce(claimed_at, 'infinity') > run_at + interval '1 s'),
           o AS (SELECT s, e, max(e) OVER (ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
                   FROM iv)
           SELECT min(before) FILTER (WHERE s > before), max(e), min(s) FROM o""", {"end": end}).fetchone()
    gap, last, first = row
    if first is None or first > midnight + dt.timedelta(seconds=1.5):
        return midnight                       # nothing waited: no contention at all
    return gap if gap is not None else min(last, end)


def pct(conn, where: str, params: dict) -> dict:
    return conn.cursor(row_factory=dict_row).execute(
        f"""SELECT count(*) AS n, count(*) FILTER (WHERE claimed_at IS NULL OR claimed_at > %(end)s) AS unclaimed,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99, max(lag) AS max
              FROM (SELECT j.claimed_at, extract(epoch FROM least(coalesce(j.claimed_at, %(end)s), %(end)s) - j.run_at) AS lag
                      FROM jobs j WHERE j.run_at <= %(end)s AND ({where})) x""", params).fetchone()


def figures(url: str, midnight: dt.datetime, end: dt.datetime, min_starts: int) -> dict:
    with psycopg.connect(schema.conninfo(url)) as conn:
        teams = {r[0]: dict(name=r[1], weight=r[2], quota=r[3]) for r in
                 conn.execute("SELECT id, name, weight, quota FROM teams ORDER BY name")}
        for tid, n, strict in conn.execute("SELECT team_id, count(*), count(*) FILTER (WHERE strict) FROM jobs GROUP BY 1"):
            teams[tid].update(jobs=n, strict=strict)
        c_end = contention_end(conn, midnight, end)
        p = {"m": midnight, "end": end, "c_end": c_end}
        hold = conn.execute("SELECT avg(extract(epoch FROM finished_at - claimed_at))::float8 FROM jobs "
                            "WHERE claimed_at BETWEEN %(m)s AND %(end)s AND finished_at IS NOT NULL", p).fetchone()[0]
        # Per team, class (minute bucket, flexible) and second after midnight:
        # jobs coming due, and jobs started.
        cls = ("floor(extract(epoch FROM date_trunc('minute', run_at) - date_trunc('minute', %(m)s)) / 60)::int, "
               "NOT strict")
        due = conn.execute(f"SELECT team_id, {cls}, floor(extract(epoch FROM run_at - %(m)s))::int, count(*) "
                           "FROM jobs WHERE run_at < %(c_end)s GROUP BY 1, 2, 3, 4", p).fetchall()
        began = conn.execute(f"SELECT team_id, {cls}, floor(extract(epoch FROM claimed_at - %(m)s))::int, count(*) "
                             "FROM jobs WHERE claimed_at < %(c_end)s GROUP BY 1, 2, 3, 4", p).fetchall()
        # Claimed or running at once, per team: +1 at each claim, -1 at each finish.
        peaks = dict(conn.execute(
            """WITH ev AS (
                   SELECT team_id, claimed_at AS t, 1 AS d FROM jobs WHERE claimed_at <= %(end)s
                   UNION ALL
                   SELECT team_id, finished_at, -1 FROM jobs WHERE claimed_at <= %(end)s AND finished_at IS NOT NULL),
               run AS (SELECT team_id, t, sum(d) OVER (PARTITION BY team_id ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS n
                         FROM ev)
               SELECT team_id, max(n) FROM run WHERE t < %(c_end)s GROUP BY 1""", p).fetchall())
        all_peak = conn.execute(
            """WITH ev AS (SELECT claimed_at AS t, 1 AS d FROM jobs WHERE claimed_at <= %(end)s
                           UNION ALL SELECT finished_at, -1 FROM jobs WHERE claimed_at <= %(end)s AND finished_at IS NOT NULL)
               SELECT max(n) FROM (SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS n FROM ev) x""",
            p).fetchone()[0]
        small = [tid for tid, t in teams.items() if t.get("jobs", 0) < SMALL]
        lags = {"strict": pct(conn, "j.strict", p), "flexible": pct(conn, "NOT j.strict", p),
                f"small teams (< {SMALL} jobs)": pct(conn, "j.team_id = ANY(%(small)s)", {**p, "small": small})}
        starts_run = conn.execute("SELECT count(*) FROM jobs WHERE claimed_at <= %(end)s", p).fetchone()[0]
        reclaimed = conn.execute("SELECT count(*) FROM jobs WHERE attempts > 1", p).fetchone()[0]

    seconds = max(0, math.ceil((c_end - midnight).total_seconds()))
    arrive: dict[tuple, list[int]] = {}
    start: dict[tuple, list[int]] = {}
    for tid, bucket, flexible, k, n in due:
        arrive.setdefault((tid, (bucket, flexible)), [0] * (seconds + 1))[max(0, k)] += n
    for tid, bucket, flexible, k, n in began:
        start.setdefault((tid, (bucket, flexible)), [0] * (seconds + 1))[max(0, k)] += n
    for key in arrive:
        start.setdefault(key, [0] * (seconds + 1))
    expected, misplaced = owed({t: teams[t]["weight"] for t in teams},
                               {t: teams[t]["quota"] / (hold or 1) for t in teams}, arrive, start, seconds)
    observed = {tid: sum(sum(v[:seconds]) for (t, _), v in start.items() if t == tid) for tid in teams}
    total = sum(observed.values()) or 1
    rows = []
    for tid, t in teams.items():
        obs, exp = observed[tid] / total, expected[tid] / total
        rows.append({**t, "starts": observed[tid], "expected_starts": expected[tid], "obs": obs, "exp": exp,
                     "ratio": obs / exp if exp > 0 else None, "peak": peaks.get(tid, 0)})
    judged = [r for r in rows if r["starts"] >= min_starts and r["ratio"] is not None]
    return {"teams": rows, "contention_s": (c_end - midnight).total_seconds(), "contention_starts": total,
            "max_dev": max((abs(r["ratio"] - 1) for r in judged), default=0.0), "judged": len(judged),
            "worst": max(judged, key=lambda r: abs(r["ratio"] - 1))["name"] if judged else None,
            "misplaced": misplaced / total, "hold_s": hold, "lags": lags,
            "all_peak": all_peak, "starts_run": starts_run, "reclaimed": reclaimed}


# ---------------------------------------------------------------- run
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="a PostgreSQL server (superuser); default: a fresh durable local cluster")
    ap.add_argument("--jobs", type=int, default=None, help="jobs due at midnight (default 200,000; full size 1,000,000)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="how long the run lasts after midnight (default: 1.2x the strict jobs' expected drain)")
    ap.add_argument("--processes", type=int, default=2, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=50, help="jobs each worker process runs at once")
    ap.add_argument("--job-ms", type=int, default=200, help="how long each job sleeps")
    ap.add_argument("--lead", type=float, default=10.0, help="least seconds between the submission's end and midnight")
    ap.add_argument("--min-starts", type=int, default=50,
                    help="teams with fewer starts in contention are left out of max deviation")
    ap.add_argument("--no-floor", action="store_true", help="skip the pgbench floor")
    ap.add_argument("--quick", action="store_true", help="~1-2 min: 30,000 jobs, 40 s, midnight on a second, short floor")
    args = ap.parse_args()
    if args.jobs is None:
        args.jobs = 30_000 if args.quick else 200_000
    slots = args.processes * args.concurrency
    capacity = slots * 1000 / args.job_ms
    if args.seconds is None:
        # Strict jobs drain at the capacity less the flexible ones coming due meanwhile.
        drain = args.jobs * STRICT_SHARE / max(1.0, 0.9 * capacity - args.jobs * (1 - STRICT_SHARE) / FLEX_S)
        args.seconds = 40.0 if args.quick else float(10 * math.ceil(1.2 * drain / 10))
    with bench_server(args.dsn, "mh-bench-midnight-") as dsn:
        run(dsn, args, slots, capacity)


def run(dsn: str, args, slots: int, capacity: float) -> None:
    fl = None
    if not args.no_floor:
        fl = floor_figure(dsn, 2 if args.quick else 5, 300_000 if args.quick else 600_000)
    url = minutehand_database(dsn, "mh_bench_midnight")
    teams = teams_for(args.jobs, slots)
    with Store(url) as store:
        for t in teams:
            store.create_team(t.name, quota=t.quota, weight=t.weight)
        token = store.create_worker_token("midnight")
    print_teams(teams, slots)

    port = _free_port()
    server = start_server(url, port, "", 2)
    workers = []
    try:
        now = dt.datetime.now(dt.timezone.utc)
        ready = now + dt.timedelta(seconds=args.jobs / ASSUMED_SUBMIT_PER_S + args.lead)
        unit = 1 if args.quick else 60                          # a real midnight is a minute boundary
        midnight = dt.datetime.fromtimestamp(math.ceil(ready.timestamp() / unit) * unit, dt.timezone.utc)
        print(f"midnight = {midnight:%H:%M:%S} UTC; submitting {args.jobs:,} jobs", flush=True)
        took = submit(url, teams, midnight, args.job_ms)
        left = (midnight - dt.datetime.now(dt.timezone.utc)).total_seconds()
        print(f"submitted in {took:.1f} s ({args.jobs / took:,.0f} jobs/s); midnight in {left:.1f} s", flush=True)
        if left < 1:
            raise SystemExit("the submission ended after midnight: the spike did not come due at once; raise --lead")
        # Started after the submission, which their start-up would slow; ready well before midnight.
        workers = start_workers(port, token, args.processes, args.concurrency, app="ops.bench.sleep_worker:worker")
        with psycopg.connect(schema.conninfo(url), autocommit=True) as c:
            c.execute("ANALYZE jobs")
            c.execute("ANALYZE due_minutes")
        end = midnight + dt.timedelta(seconds=args.seconds)
        while (wait := (end - dt.datetime.now(dt.timezone.utc)).total_seconds()) > 0:
            time.sleep(min(wait, 10))
    finally:
        stop_all(workers)
        stop_server(server)
    print(f"run over at midnight + {args.seconds:.0f} s; reading the figures from the jobs table", flush=True)
    f = figures(url, midnight, end, args.min_starts)
    report(args, f, fl, slots, capacity)


def print_teams(teams: list[Team], slots: int) -> None:
    """The teams, those alike on one line (the figures list each)."""
    print(f"{len(teams)} teams: {sum(t.jobs for t in teams):,} jobs, weights sum {sum(t.weight for t in teams)}, "
          f"quotas sum {sum(t.quota for t in teams)} (worker slots {slots})")
    print("teams      weight  quota  jobs each")
    groups: list[list[Team]] = []
    for t in teams:
        if groups and (groups[-1][0].weight, groups[-1][0].quota) == (t.weight, t.quota) and (
                groups[-1][0].jobs == t.jobs or max(groups[-1][0].jobs, t.jobs) < SMALL):
            groups[-1].append(t)
        else:
            groups.append([t])
    for g in groups:
        names = g[0].name if len(g) == 1 else f"{g[0].name}-{g[-1].name}"
        jobs = f"{g[0].jobs:,}" if len({t.jobs for t in g}) == 1 else ", ".join(str(t.jobs) for t in g)
        print(f"{names:<10} {g[0].weight:>6} {g[0].quota:>6}  {jobs}")
    print(flush=True)


def report(args, f: dict, fl: int | None, slots: int, capacity: float) -> None:
    print()
    print(f"{args.jobs:,} jobs due at midnight ({STRICT_SHARE:.0%} strict, the rest flexible over {FLEX_S} s); "
          f"{args.processes} workers x {args.concurrency} slots, jobs of {args.job_ms} ms: "
          f"capacity {capacity:,.0f} jobs/s; run {args.seconds:.0f} s after midnight")
    print(f"contention: {f['contention_s']:.1f} s, {f['contention_starts']:,} starts; "
          f"a job held its slot {f['hold_s'] or 0:.3f} s on average (claim to finish)")
    print()
    print("team  weight  quota     jobs   strict  starts  observed  expected  obs/exp  max running  over quota")
    for r in sorted(f["teams"], key=lambda r: r["name"]):
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        over = "OVER" if r["peak"] > r["quota"] else ""
        print(f"{r['name']:<5} {r['weight']:>6} {r['quota']:>6} {r.get('jobs', 0):>8,} {r.get('strict', 0):>8,} "
              f"{r['starts']:>7,} {r['obs']:>8.2%} {r['exp']:>9.2%} {ratio:>8} {r['peak']:>12} {over:>11}")
    over = [r for r in f["teams"] if r["peak"] > r["quota"]]
    print()
    rows = [("contention (backlog > 1 s old)", f"{f['contention_s']:.1f} s"),
            ("starts/s during contention",
             f"{f['contention_starts'] / max(f['contention_s'], 1e-9):,.0f} ({f['contention_starts'] / max(f['contention_s'], 1e-9) / capacity:.2f}x nominal capacity {capacity:,.0f})"),
            (f"fair share: max |obs/exp - 1| ({f['judged']} teams with >= {args.min_starts} starts)",
             f"{f['max_dev']:.2f} (team {f['worst']})"),
            ("fair share: starts that went to the wrong team", f"{f['misplaced']:.1%}"),
            ("teams over quota during contention", f"{len(over)} of {len(f['teams'])}"
             + (f" (worst {max(over, key=lambda r: r['peak'] / r['quota'])['name']}: "
                f"{max(r['peak'] / r['quota'] for r in over):.1f}x)" if over else "")),
            ("most running at once, all teams", f"{f['all_peak']} (worker slots {slots})")]
    for name, lag in f["lags"].items():
        ge = ">=" if lag["unclaimed"] else ""
        rows.append((f"start lag, {name}",
                     f"p50 {lag['p50'] or 0:.2f} s, p99 {ge}{lag['p99'] or 0:.2f} s, max {ge}{lag['max'] or 0:.2f} s "
                     f"({lag['n']:,} due in the run, {lag['unclaimed']:,} never claimed)"))
    if fl is not None:
        rows.append(("floor: claim+delete in batches of 100 (pgbench, short)", f"{fl:,} rows/s"))
    rows.append(("claimed in the run / re-claimed after expiry", f"{f['starts_run']:,} / {f['reclaimed']:,}"))
    width = max(len(n) for n, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
