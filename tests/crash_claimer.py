"""A process for tests/test_crash.py to kill with SIGKILL at a chosen line.

It opens one session with a pinned clock, starts a transaction with an
explicit BEGIN, does one duty in it, reports on stdout, optionally commits,
and then sleeps until it is killed:

    python tests/crash_claimer.py DSN CLOCK claim OWNER SHARD:EPOCH[,...] LIMIT LEASE_S [--commit]
    python tests/crash_claimer.py DSN CLOCK cascade|sweep [--commit]
    python tests/crash_claimer.py DSN CLOCK submit TEAM COUNT DUE_AT [--commit]

Output lines: "pid <backend pid>", then "claimed <n> <id,id,...>" (claim),
"moved <n>" (cascade, sweep) or "submitted <n> <id,...>" (submit), then
"committed" with --commit, then "sleeping".
"""
from __future__ import annotations

import sys
import time

import psycopg


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> None:
    commit = "--commit" in argv
    args = [a for a in argv if a != "--commit"]
    dsn, clock, duty, rest = args[0], args[1], args[2], args[3:]
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SELECT set_config('minutehand.now', %s, false)", (clock,))
    say(f"pid {conn.execute('SELECT pg_backend_pid()').fetchone()[0]}")
    conn.execute("BEGIN")
    if duty == "claim":
        owner, leases, limit, lease_s = rest[0], rest[1], int(rest[2]), float(rest[3])
        ids: list[int] = []
        for item in leases.split(","):
            shard, epoch = (int(x) for x in item.split(":"))
            rows = conn.execute("SELECT job_id FROM claim_due(%s::int, %s::int, %s::text, %s::bigint, %s::real)",
                                (shard, limit, owner, epoch, lease_s)).fetchall()
            ids.extend(r[0] for r in rows)
        say(f"claimed {len(ids)} {','.join(map(str, ids))}")
    elif duty == "cascade":
        far, hours = conn.execute("SELECT from_far, from_hours FROM cascade_wheel()").fetchone()
        say(f"moved {far + hours}")
    elif duty == "sweep":
        _, carried = conn.execute("SELECT buckets, carried FROM sweep_passed()").fetchone()
        say(f"moved {carried}")
    elif duty == "submit":
        team, count, due_at = rest[0], int(rest[1]), rest[2]
        ids = [conn.execute("SELECT submit_job(%s, %s, %s)", (team, f"crash-{i}", due_at)).fetchone()[0]
               for i in range(count)]
        say(f"submitted {len(ids)} {','.join(map(str, ids))}")
    else:
        raise SystemExit(f"unknown duty {duty!r}")
    if commit:
        conn.execute("COMMIT")
        say("committed")
    say("sleeping")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
