"""The processes a test of real processes starts (dispatchers, serve,
workers running tests/worker_apps.py's recorder), and the verdicts it reads
from the database (the `fleet` fixture: tests/fixtures/processes.py)."""
from __future__ import annotations

import psycopg

from minutehand.store.submit import JobSpec
from tests.processes import Process, Server, WorkerProcess, logs
from tests.support import make_store
from tests.worker_apps import RUNS_DDL

SHARDS = 256
TEAM = "t"


class ClaimsNeverExpire(AssertionError):
    """Claims long past their expiry were never returned to the due pool."""


class Fleet:
    """Every process a test starts, stopped (workers first) at its end, and
    the database the test reads its verdicts from."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.db = psycopg.connect(dsn, autocommit=True)
        self.db.execute(RUNS_DDL)
        self.store = make_store(dsn, clock=None)
        self.store.create_team(TEAM, quota=100_000)
        self.token = self.store.create_worker_token("fleet")
        self.procs: list[Process] = []

    # ------------------------------------------------------------ processes
    def server(self, *extra: str, role: str = "serve", name: str | None = None,
               port: int | None = None) -> Server:
        s = Server(self.dsn, *extra, role=role, name=name, port=port)
        self.procs.append(s)
        return s

    def worker(self, urls: list[str], concurrency: int = 10, label: str = "worker",
               grace_s: float = 1.0) -> WorkerProcess:
        w = WorkerProcess("recorder", urls, self.token, concurrency=concurrency, label=label,
                          env={"MINUTEHAND_TEST_EFFECTS_DSN": self.dsn, "MINUTEHAND_WORKER_GRACE_S": str(grace_s)})
        self.procs.append(w)
        return w

    def logs(self, tail: int = 60, live_only: bool = False) -> str:
        """Every process's last lines (live_only: the dispatchers' and the live workers')."""
        return logs(*[p for p in self.procs if not live_only or p.alive() or not isinstance(p, WorkerProcess)],
                    tail=tail)

    def stop(self) -> None:
        for p in sorted(self.procs, key=lambda p: not isinstance(p, WorkerProcess)):
            try:
                p.stop(timeout_s=15)
            except Exception:                       # noqa: BLE001 - stop the others anyway
                p.kill()
        self.store.close()
        self.db.close()

    # ------------------------------------------------------------ jobs
    def submit(self, specs: list[JobSpec], batch: int = 1000) -> list[int]:
        ids = []
        for i in range(0, len(specs), batch):
            items = self.store.submit_many(TEAM, specs[i:i + batch])
            bad = [it.error for it in items if it.error]
            assert not bad, bad[:5]
            ids += [it.job_id for it in items]
        return ids

    def one(self, sql: str, *args):
        return self.db.execute(sql, args).fetchone()

    def states(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1").fetchall())

    def all_succeeded(self, n: int) -> bool:
        return self.states() == {"succeeded": n}

    def runs(self, job_id: int) -> list[tuple[int, int]]:
        """(attempt, pid) of each run of the job, in order."""
        return self.db.execute("SELECT attempt, pid FROM runs WHERE job_id = %s ORDER BY at",
                               (job_id,)).fetchall()

    def running_pids(self) -> dict[int, int]:
        """Runs started so far, per worker pid."""
        return dict(self.db.execute("SELECT pid, count(*) FROM runs GROUP BY 1").fetchall())

    def held_by(self, pid: int) -> int:
        """Jobs claimed or running under this worker process's id (host:pid)."""
        return self.one("SELECT count(*) FROM jobs WHERE state IN ('claimed', 'running') AND claimed_by LIKE %s",
                        f"%:{pid}")[0]

    def owners(self) -> dict[str | None, int]:
        """Shards per current (unexpired) lease holder; None: free or expired."""
        return dict(self.db.execute(
            "SELECT CASE WHEN lease_expires_at > now() THEN owner END, count(*) FROM shards GROUP BY 1"
        ).fetchall())

    def stale_claims(self, grace_s: float = 15.0) -> int:
        """Claims more than grace_s past their expiry: maintenance returns
        expired claims every second, so there should be none."""
        return self.one("SELECT count(*) FROM jobs WHERE state IN ('claimed', 'running') "
                        "AND claim_expires_at < now() - make_interval(secs => %s)", grace_s)[0]

    def done_or_stuck(self, n: int) -> bool:
        """All n jobs succeeded; raises ClaimsNeverExpire if expired claims are not being returned."""
        if stale := self.stale_claims():
            raise ClaimsNeverExpire(f"{stale} claims expired long ago and were never returned to the due pool")
        return self.all_succeeded(n)

    def split(self, *names: str) -> bool:
        """Every shard leased, each of the named dispatchers holding some."""
        o = self.owners()
        return sum(o.get(n, 0) for n in names) == SHARDS and all(o.get(n, 0) > 0 for n in names)

    def overdelivered(self) -> list[tuple]:
        """Jobs that ran more often than they were delivered, or never ran."""
        return self.db.execute(
            """SELECT j.id, j.attempts, count(r.job_id) AS runs FROM jobs j
                 LEFT JOIN runs r ON r.job_id = j.id
                GROUP BY j.id, j.attempts HAVING count(r.job_id) > j.attempts OR count(r.job_id) = 0
                LIMIT 20""").fetchall()


def work(n: int, **payload) -> list[JobSpec]:
    return [JobSpec(name="work", payload=dict(payload)) for _ in range(n)]
