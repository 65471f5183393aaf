"""Helpers shared by the tests: a store on a test database with a pinned
clock, a team, and leases on every shard."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
import pytest
from psycopg.types.json import Jsonb

from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.lifecycle import Services
from minutehand.serve import dispatcher_parts
from minutehand.settings import Settings
from minutehand.store.claim import ClaimRefused, ClaimRequest
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from minutehand.worker import Worker

UTC = dt.timezone.utc
# A fixed instant, 30 s into a minute, for tests that pin the clock.
T0 = dt.datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)


# Empty every table of the schema (whatever tables later revisions add), then
# put back the per-shard and wheel state of a fresh migration.
RESET = """
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c
              WHERE c.relnamespace = 'minutehand'::regnamespace AND c.relkind IN ('r', 'p')
                AND NOT c.relispartition AND c.relname NOT IN ('alembic_version', 'shards', 'wheel', 'timezone_names')
    LOOP
        EXECUTE format('DELETE FROM %I', t);
    END LOOP;
END $$;
UPDATE shards SET owner = NULL, epoch = 0, lease_expires_at = NULL, hand = NULL;
UPDATE wheel SET swept_until = NULL;
INSERT INTO teams (name) VALUES ('t'), ('u');
DISCARD TEMP;
"""


def make_store(dsn: str, clock: dt.datetime | None = T0, max_size: int = 4) -> Store:
    """A store whose every session sees `clock` as mh_now(); set store.clock to advance it."""
    return Store(dsn, max_size=max_size, clock=clock)


def pin(conn: psycopg.Connection, when: dt.datetime | None) -> None:
    """Pin (or with None, unpin) mh_now() on one raw connection."""
    conn.execute("SELECT set_config('minutehand.now', coalesce(%s::text, ''), false)", (when,))


def lease_all(store: Store, owner: str = "d1", ttl_s: float = 3600) -> dict[int, int]:
    """Take every shard for `owner`; {shard: epoch}."""
    return store.take_leases(range(shard_count(store)), owner, ttl_s)


def shard_count(store: Store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT mh_shard_count() AS n").fetchone()["n"]


@dataclass(frozen=True)
class Claimed:
    """A job as claim_due hands it out, its JSON decoded."""
    job_id: int
    team: str
    name: str
    payload: Any
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    lease_token: Any
    claim_expires_at: dt.datetime
    due_at: dt.datetime | None
    run_at: dt.datetime | None
    replay: Any


class Claims(NamedTuple):
    jobs: list[Claimed]
    refused: dict[int, str]   # shard -> why its claim was refused (stale lease)


def claim(store: Store, leases: dict[int, int], limit: int, owner: str = "d1", lease_s: float = 30,
          worker: str | None = None, names: list[str] | None = None, teams: list[str] | None = None) -> Claims:
    """Store.claim for every leased shard ({shard: epoch}), in one round trip:
    the jobs claimed, and the shards refused. Any other error is raised."""
    results, refused = store.claim([ClaimRequest(shard, epoch, limit, worker, names, teams)
                                    for shard, epoch in leases.items()], owner, lease_s)
    jobs = []
    for answer in results:
        if isinstance(answer, ClaimRefused):
            if answer.stale:
                continue
            raise answer.error
        for j in answer:
            jobs.append(Claimed(j.job_id, j.team, j.name, json.loads(j.payload), j.attempt, j.max_attempts,
                                j.idempotency_key, j.lease_token, j.claim_expires_at, j.due_at, j.run_at,
                                None if j.replay is None else json.loads(j.replay)))
    return Claims(jobs, refused)


def claim_all(store: Store, leases: dict[int, int], owner: str = "d1", limit: int = 100,
              lease_s: float = 30) -> list:
    """Claim until nothing more is due; every claimed job."""
    got = []
    while True:
        batch = claim(store, leases, limit, owner, lease_s).jobs
        if not batch:
            return got
        got.extend(batch)


# ---------------------------------------------------------------- what a test writes and where it lands
# Every table a submission writes: refusal tests compare their counts before and after.
TABLES = ("jobs", "due_minutes", "due_hours", "due_far", "idempotency_keys")
COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)


def counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(zip(TABLES, conn.execute(COUNTS, prepare=True).fetchone()))


def submit_sql(conn, team="t", name="job", due_at=None, payload=None, **kw):
    """submit_job_detail with named arguments; (job_id, run_at, created)."""
    args = {"p_team": team, "p_name": name, "p_due_at": due_at,
            "p_payload": Jsonb(payload if payload is not None else {})}
    args.update({f"p_{k}": v for k, v in kw.items()})
    named = ", ".join(f"{k} => %({k})s" for k in args)
    return conn.execute(f"SELECT job_id, run_at, created FROM submit_job_detail({named})", args).fetchone()


def submit_store(store, team="t", name="job", due_at=None, payload=None, **kw):
    r = store.submit(team, JobSpec(name=name, due_at=due_at, payload=payload if payload is not None else {}, **kw))
    return r.job_id, r.run_at, r.created


def due_rows(conn: psycopg.Connection, job_id: int) -> list[tuple[str, dt.datetime]]:
    """(partition or table, run_at) of every wheel row of the job."""
    rows = conn.execute(
        """SELECT tableoid::regclass::text, run_at FROM due_minutes WHERE job_id = %(id)s
           UNION ALL SELECT tableoid::regclass::text, run_at FROM due_hours WHERE job_id = %(id)s
           UNION ALL SELECT 'due_far', run_at FROM due_far WHERE job_id = %(id)s""",
        {"id": job_id}).fetchall()
    return [(table_of(conn, name), run_at) for name, run_at in rows]


# Why plan tests that log nested statements' plans skip on Citus.
AUTO_EXPLAIN_ON_CITUS = ("auto_explain of nested statements fails on Citus 13.2 (\"cache lookup failed for "
                         "type\"): on Citus the router plans are asserted by tests/test_citus.py instead")


def skip_on_citus(conn: psycopg.Connection, reason: str) -> None:
    """Skip the test, saying why, when the database is distributed over Citus."""
    if on_citus(conn):
        pytest.skip(reason)


NOT_CITUS = "needs a Citus coordinator: MINUTEHAND_TEST_DSN and MINUTEHAND_TEST_CITUS_WORKERS (tests/fixtures/citus.py)"


def skip_unless_citus(conn: psycopg.Connection) -> None:
    """Skip the test, saying why, unless the database is distributed over Citus."""
    if not on_citus(conn):
        pytest.skip(NOT_CITUS)


def on_citus(conn: psycopg.Connection) -> bool:
    """Whether the database is distributed over a Citus cluster."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").fetchone()[0]


def table_of(conn: psycopg.Connection, name: str) -> str:
    """The table (or partition) a row's tableoid names, as the schema names
    it. On Citus, tableoid names the shard's own table on its worker
    (due_m240_102008): Citus says whose shard that is."""
    shard_id = name.rpartition("_")[2]
    if not shard_id.isdigit() or not on_citus(conn):
        return name
    row = conn.execute("SELECT logicalrelid::regclass::text FROM pg_dist_shard WHERE shardid = %s",
                       (int(shard_id),)).fetchone()
    return row[0] if row else name


def router_plan(plan: dict) -> dict:
    """The plan a node ran for an EXPLAIN (FORMAT JSON) plan: the plan itself
    on plain PostgreSQL; on Citus, where the coordinator shows a Custom Scan,
    the remote plan of its one task (a router query: asserted), with the
    shard suffixes dropped from relation and index names (jobs_102016 ->
    jobs), so a test reads it as it reads a plain plan."""
    job = plan.get("Distributed Query", {}).get("Job")
    if job is None:
        return plan
    assert job["Task Count"] == 1, f"not a router plan: {job['Task Count']} tasks"
    remote = job["Tasks"][0]["Remote Plan"][0][0]["Plan"]
    stack = [remote]
    while stack:
        node = stack.pop()
        for key in ("Relation Name", "Index Name"):
            if key in node:
                name, _, suffix = node[key].rpartition("_")
                node[key] = name if suffix.isdigit() and name else node[key]
        stack.extend(node.get("Plans", []))
    return remote


def minute_part(conn: psycopg.Connection, t: dt.datetime) -> str:
    return conn.execute("SELECT mh_minute_part(mh_minute_slot(%s))", (t,)).fetchone()[0]


def json_text(value) -> bytes:
    """A job result as a worker reports it: JSON text."""
    return json.dumps(value).encode()


# ---------------------------------------------------------------- a dispatcher in this process
class StartedDispatcher:
    """A dispatcher with what runs with it in a process (its outcome writer
    and maintenance), started; stop() stops them all."""

    def __init__(self, dispatcher: Dispatcher, parts: Services):
        self.dispatcher, self.parts = dispatcher, parts

    def __getattr__(self, name: str):
        return getattr(self.dispatcher, name)

    def stop(self) -> None:
        self.parts.stop()


def started_dispatcher(store: Store, leases: int = 256, **settings) -> Dispatcher:
    """Started, once it holds `leases` shard leases. Its claims last 10
    minutes unless the test says otherwise: the tests lease jobs and never
    complete them, and on a loaded Citus cluster leasing thousands took longer
    than the default 30 s, after which its own maintenance gave the first
    ones out again (at least once, as it should)."""
    dispatcher, parts = dispatcher_parts(
        Settings(**{"dispatcher_name": f"d-{secrets.token_hex(3)}", "shard_lease_s": 5, "claim_lease_s": 600,
                    **settings}), store)
    parts.start()
    d = StartedDispatcher(dispatcher, parts)
    deadline = time.monotonic() + 60
    while len(d._leases) < leases:
        assert time.monotonic() < deadline, "the dispatcher took no shard leases"
        time.sleep(0.05)
    return d


async def lease_until(d: Dispatcher, want: int, capacity: int = 100, names: list[str] | None = None,
                      teams: list[str] | None = None) -> list:
    """Lease until `want` jobs came, or 120 s passed: a ceiling that only a
    failure reaches (a loaded Citus cluster took over 20 s for 25,600)."""
    got: list = []
    deadline = time.monotonic() + 120
    while len(got) < want and time.monotonic() < deadline:
        got += await d.lease("w", capacity, names, 1.0, teams=teams)
    return got


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run a worker in a thread of this process; stop and join it on exit."""
    errors: list[BaseException] = []

    def main():
        try:
            worker.run()
        except BaseException as exc:              # noqa: BLE001 - re-raised in the test
            errors.append(exc)

    t = threading.Thread(target=main, daemon=True)
    t.start()
    try:
        yield worker
    finally:
        worker.stop()
        t.join(30)
        assert not t.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]
