"""The schema on a Citus cluster (tests/fixtures/citus.py says how the suite
runs on one): distribution is idempotent, every table is placed, the hot
procedures stay single-shard, and no statement of ours takes the shape that
crashes a Citus 13.2 coordinator. On plain PostgreSQL the Citus-only tests
skip, saying why; the crash-shape test runs on both."""
from __future__ import annotations

import psycopg
import pytest

from minutehand.store import citus
from minutehand.store.queries import q
from tests.support import T0, due_rows, skip_unless_citus


@pytest.fixture
def citus_db(db):
    skip_unless_citus(db)
    return db


def layout(conn: psycopg.Connection) -> list[tuple]:
    """Everything Citus' metadata says about our tables and functions."""
    tables = conn.execute("""SELECT logicalrelid::regclass::text, partmethod::text, colocationid,
                                    (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid)
                               FROM pg_dist_partition p ORDER BY 1""").fetchall()
    functions = conn.execute("""SELECT objid::regprocedure::text, distribution_argument_index, colocationid
                                  FROM pg_dist_object WHERE classid = 'pg_proc'::regclass ORDER BY 1""").fetchall()
    return tables + functions


def test_distributing_twice_changes_nothing(citus_db, db_dsn):
    before = layout(citus_db)
    again = citus.distribute(db_dsn, 8)
    assert (again.distributed, again.reference, again.functions) == ([], [], [])
    assert "nothing changed" in str(again)
    assert layout(citus_db) == before


def test_every_table_is_placed_and_the_distributed_ones_are_colocated_with_jobs(citus_db):
    assert citus.unknown_tables(citus_db) == []
    kinds = dict(citus_db.execute(
        """SELECT logicalrelid::regclass::text, partmethod::text FROM pg_dist_partition
            WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = logicalrelid)""").fetchall())
    assert {t for t, k in kinds.items() if k == "h"} == set(citus.DISTRIBUTED)
    assert {t for t, k in kinds.items() if k == "n"} == set(citus.REFERENCE)
    assert not set(kinds) & set(citus.LOCAL)
    groups = {g for (g,) in citus_db.execute(
        "SELECT DISTINCT colocationid FROM pg_dist_partition WHERE partmethod = 'h'").fetchall()}
    assert len(groups) == 1
    # one shard of jobs and its wheel rows, keys and series live on one worker
    nodes = citus_db.execute(
        """SELECT count(DISTINCT nodeport) FROM citus_shards
            WHERE shardid IN (SELECT get_shard_id_for_distribution_column(t, 7::smallint)
                                FROM unnest(%s::regclass[]) t)""",
        ([f"minutehand.{t}" for t in ("jobs", "due_far", "idempotency_keys", "series", "team_running")],)).fetchone()[0]
    assert nodes == 1


def test_the_workers_plan_our_statements_with_jit_off(citus_db):
    """Statements Citus pushes down are planned in its sessions on the
    workers: their database has JIT off, as our own connections do."""
    got = citus_db.execute("SELECT nodeport, result FROM run_command_on_workers('SHOW jit')").fetchall()
    assert got and {r for _, r in got} == {"off"}, got


def test_a_migration_after_distribution_leaves_it_distributed(citus_db, db_dsn):
    from minutehand.store import migrate

    before = layout(citus_db)
    migrate.upgrade(db_dsn)
    assert layout(citus_db) == before
    assert citus.distribute(db_dsn, 8).functions == []


# The shape that crashes a Citus 13.2.2 coordinator (signal 11): an UPDATE of a
# distributed table whose WHERE folds to false for one shard, such as
# `UPDATE jobs SET state = 'dead' WHERE shard = 1 AND false`. Our procedures
# reach their UPDATEs with empty inputs through constant-folded plans only if
# they do not return early; each is called here with nothing to do, and the
# coordinator must still answer afterwards (on plain PostgreSQL: the same calls).
EMPTY_CALLS = (
    "SELECT * FROM start_many('{}'::bigint[], '{}'::uuid[])",
    "SELECT * FROM heartbeat_many('{}'::bigint[], '{}'::uuid[], 30)",
    "SELECT * FROM complete_many('{}'::bigint[], '{}'::uuid[], '{}'::jsonb[])",
    "SELECT * FROM fail_many('{}'::bigint[], '{}'::uuid[], '{}'::text[])",
    "SELECT * FROM release_many('{}'::bigint[], '{}'::uuid[])",
    "SELECT * FROM record_results('{}'::bigint[], '{}'::jsonb[])",
    "SELECT * FROM expire_claims(1)",
    "SELECT * FROM purge_idempotency_keys(1)",
    "SELECT * FROM mh_not_running('{}'::smallint[], '{}'::int[])",
    "SELECT * FROM cascade_wheel()",
    "SELECT * FROM sweep_passed()",
    "SELECT * FROM maintain()",
)


@pytest.mark.parametrize("call", EMPTY_CALLS)
def test_no_procedure_with_nothing_to_do_crashes_the_coordinator(db, db_dsn, call):
    db.execute(call).fetchall()
    with psycopg.connect(db_dsn, autocommit=True) as fresh:      # the server is still up
        assert fresh.execute("SELECT 1").fetchone() == (1,)


# ---------------------------------------------------------------- router plans: one shard, one task
def task_count(conn: psycopg.Connection, statement: str, params: dict | None = None) -> int:
    """Citus' tasks for a statement: 1 is a router plan (one shard, one worker)."""
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()[0][0]["Plan"]
    assert plan["Node Type"] == "Custom Scan", plan
    return plan["Distributed Query"]["Job"]["Task Count"]


def test_hot_statements_are_router_plans(citus_db):
    from minutehand.store.queries import q

    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    job_id = db.execute("SELECT submit_job('t', 'probe', NULL)").fetchone()[0]
    shard, slot = db.execute("SELECT shard, slot FROM due_minutes WHERE job_id = %s", (job_id,)).fetchone()
    at = {"shard": str(shard)}
    # the claim: the DELETE of one bucket of one shard, and its cell form
    claim = db.execute("SELECT mh_claim_sql(%s)", (slot,)).fetchone()[0]
    assert task_count(db, claim.replace("$1", at["shard"]).replace("$2", "now()").replace("$3", "10")) == 1
    cells = db.execute("SELECT mh_claim_cells_sql(%s, false)", (slot,)).fetchone()[0]
    cells = (cells.replace("$1", at["shard"]).replace("$2", "'{f}'::boolean[]").replace("$3", "'{0}'::smallint[]")
             .replace("$4", "'{1}'::int[]").replace("$5", "'{10}'::int[]").replace("$6", "now()"))
    assert task_count(db, cells) == 1
    # next due: the dispatcher's summary of one bucket of one shard
    part = db.execute("SELECT mh_minute_part(%s)", (slot,)).fetchone()[0]
    assert task_count(db, f"SELECT min(run_at) FROM {part} WHERE shard = {shard} AND run_at > now()") == 1
    # status: the job by (shard, id), with its team and series
    assert task_count(db, q("job_status"), {"job_id": job_id, "team": None, "now": T0}) == 1
    # submit: the job row and its wheel row
    assert task_count(db, f"""INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
                              VALUES ({slot}, {shard}, false, 0, now(), 1, 1)""") == 1
    assert task_count(db, f"UPDATE jobs SET updated_at = now() WHERE shard = {shard} AND id = {job_id}") == 1


# ---------------------------------------------------------------- one shard, one worker, one-phase commit
def remote_commands(conn: psycopg.Connection, call: str, params: tuple = ()) -> list[tuple[str, str]]:
    """(server, command) of every command the call sent to a worker (citus.log_remote_commands)."""
    seen: list[tuple[str, str]] = []

    def notice(d) -> None:
        if (d.message_primary or "").startswith("issuing "):
            seen.append(((d.message_detail or "").split(" connectionId")[0], d.message_primary[len("issuing "):]))

    conn.add_notice_handler(notice)
    try:
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        conn.execute(call, params).fetchall()
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("RESET citus.log_remote_commands")
        conn.remove_notice_handler(notice)
    return seen


def assert_one_worker_one_phase(commands: list[tuple[str, str]]) -> None:
    assert len({server for server, _ in commands}) == 1, commands
    assert not [c for _, c in commands if c.startswith(("PREPARE TRANSACTION", "COMMIT PREPARED"))], commands
    assert commands[-1][1] == "COMMIT", commands


def test_a_submit_and_a_claim_of_one_shard_run_on_one_worker_with_a_one_phase_commit(citus_db):
    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    sent = remote_commands(db, "SELECT submit_job('t', 'probe', NULL, '{}', p_idempotency_key => 'k1')")
    assert_one_worker_one_phase(sent)
    job_id = db.execute("SELECT id FROM jobs").fetchone()[0]
    shard = db.execute("SELECT mh_shard_of(%s)", (job_id,)).fetchone()[0]
    epoch = db.execute("SELECT take_shard_lease(%s, 'd1', 600)", (shard,)).fetchone()[0]
    sent = remote_commands(db, "SELECT job_id, refused FROM claim_due(%s, 10, 'd1', %s, 30)", (shard, epoch))
    assert_one_worker_one_phase(sent)
    assert db.execute("SELECT state FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "claimed"


@pytest.mark.parametrize("ahead", ["0", "3 hours", "30 hours", "10 days"])
def test_a_cancel_takes_its_row_off_the_wheel_on_one_worker_with_a_one_phase_commit(citus_db, ahead):
    """Wherever the row waits (minute, hour, far level), the cancel's reads
    and deletes are router statements on its shard's worker."""
    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    job_id = db.execute("SELECT submit_job('t', 'probe', now() + %s::interval)", (ahead,)).fetchone()[0]
    assert len(due_rows(db, job_id)) == 1
    sent = remote_commands(db, "SELECT * FROM cancel(%s, 't')", (job_id,))
    assert_one_worker_one_phase(sent)
    assert due_rows(db, job_id) == []
    assert db.execute("SELECT state FROM jobs WHERE id = %s", (job_id,)).fetchone()[0] == "cancelled"


def test_shard_leases_are_renewed_with_one_single_shard_transaction_per_citus_shard(citus_db, db_dsn):
    """A dispatcher renews all its leases every fifth of a lease period: one
    take_shard_leases call per Citus shard, each on one worker with a
    one-phase commit, not a distributed transaction per logical shard."""
    from tests.support import make_store

    db = citus_db
    groups: dict[int, list[int]] = {}
    for s, group in db.execute("SELECT s, get_shard_id_for_distribution_column('minutehand.shards', s::smallint) "
                               "FROM generate_series(0, 255) s").fetchall():
        groups.setdefault(group, []).append(s)
    assert len(groups) > 1
    for shards in groups.values():
        sent = remote_commands(db, "SELECT * FROM take_shard_leases(%s, 'd1', 600)", (shards,))
        assert_one_worker_one_phase(sent)
    epochs = dict(db.execute("SELECT shard, epoch FROM shards").fetchall())
    for shards in groups.values():
        sent = remote_commands(db, "SELECT release_shard_leases(%s, 'd1', %s)", (shards, [epochs[s] for s in shards]))
        assert_one_worker_one_phase(sent)
    assert db.execute("SELECT count(*) FROM shards WHERE owner IS NOT NULL").fetchone()[0] == 0
    with make_store(db_dsn, clock=None) as store:
        held = store.take_leases(range(256), "d2", 600)
        assert sorted(held) == list(range(256)) and store.take_leases(range(256), "d2", 600) == held
        assert store.take_leases(range(256), "d3", 600) == {}


def test_claims_with_nothing_due_do_not_crash_the_coordinator(db, db_dsn):
    """The claim's UPDATE is not sent with an empty set of ids (`id = ANY (NULL)` folds to false)."""
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    epoch = db.execute("SELECT take_shard_lease(3, 'd1', 600)").fetchone()[0]
    assert db.execute("SELECT * FROM claim_due(3, 10, 'd1', %s, 30)", (epoch,)).fetchall() == []
    team = db.execute("SELECT id FROM teams WHERE name = 't'").fetchone()[0]
    assert db.execute("SELECT * FROM claim_planned(3, 'd1', %s, 30, 'w', mh_minute(mh_now()), '{f}', '{0}', %s, '{10}')",
                      (epoch, [team])).fetchall() == []
    assert db.execute("SELECT * FROM mh_take_claimed(3, NULL, 'w', 30, mh_now())").fetchall() == []
    with psycopg.connect(db_dsn, autocommit=True) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)


# ---------------------------------------------------------------- outcome batches: one call per Citus shard
OUTCOME_CALLS = {
    "start": "SELECT * FROM start_many(%s, %s)",
    "heartbeat": "SELECT * FROM heartbeat_many(%s, %s, 60)",
    "complete": "SELECT * FROM complete_many(%s, %s, NULL)",
    "fail": "SELECT * FROM fail_many(%s, %s, NULL)",                     # retried: attempts left
    "fail_dead": "SELECT * FROM fail_many(%s, %s, NULL, %s)",           # not retryable: dead
    "release": "SELECT * FROM release_many(%s, %s)",
}


def claimed_on_many_shards(db: psycopg.Connection, jobs: int = 24) -> dict[int, object]:
    """{job id: lease token} of jobs claimed on many shards, several per Citus shard."""
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    members: dict[int, list[int]] = {}
    for shard, group in citus_shard_of(db).items():
        members.setdefault(group, []).append(shard)
    for shards in members.values():          # (a call's keyless jobs go to one Citus shard)
        db.execute("SELECT submit_jobs('t', array_fill('probe'::text, ARRAY[%s]), p_shards => %s::smallint[])",
                    (jobs // len(members), shards))
    tokens = {}
    for (shard,) in db.execute("SELECT DISTINCT shard FROM jobs ORDER BY 1").fetchall():
        epoch = db.execute("SELECT take_shard_lease(%s, 'd1', 600)", (shard,)).fetchone()[0]
        for job_id, token in db.execute("SELECT job_id, lease_token FROM claim_due(%s, 100, 'd1', %s, 30)",
                                        (shard, epoch)).fetchall():
            tokens[job_id] = token
    return tokens


def shard_tables(command: str) -> set[str]:
    """The Citus shard ids a command sent to a worker names (jobs_102016 -> 102016)."""
    import re
    return set(re.findall(r"minutehand\.\w+?_(\d{6,})\b", command))


@pytest.mark.parametrize("kind", OUTCOME_CALLS)
def test_an_outcome_batch_over_many_shards_is_one_single_shard_transaction_per_citus_shard(citus_db, db_dsn, kind):
    """The store splits the batch by Citus shard (Store.outcome_calls); each call
    runs on one worker, each statement on one shard (a router statement: the
    command names one shard's tables), with a one-phase commit."""
    from tests.support import make_store

    db = citus_db
    tokens = claimed_on_many_shards(db)
    ids = list(tokens)
    with make_store(db_dsn, clock=None) as store:
        calls = store.outcome_calls(ids)
    groups = dict(db.execute("SELECT s, get_shard_id_for_distribution_column('minutehand.jobs', s::smallint) "
                             "FROM generate_series(0, 1023) s").fetchall())
    assert len(calls) > 1
    for positions in calls:
        assert len({groups[ids[at] & 1023] for at in positions}) == 1
        part = [ids[at] for at in positions]
        args = (part, [tokens[i] for i in part]) + (([False] * len(part),) if kind == "fail_dead" else ())
        sent = remote_commands(db, OUTCOME_CALLS[kind], args)
        assert_one_worker_one_phase(sent)
        # every distributed write went to the same Citus shard group: the shard
        # ids named all belong to this call's colocated shards
        named = set().union(*(shard_tables(c) for _, c in sent))
        colocated = {str(r[0]) for r in db.execute(
            """SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_shard j ON j.shardid = %s
                WHERE s.shardminvalue = j.shardminvalue
                  AND s.logicalrelid IN (SELECT logicalrelid FROM pg_dist_partition WHERE partmethod = 'h')""",
            (groups[part[0] & 1023],)).fetchall()}
        assert named and named <= colocated, (named, colocated)
    want = {"start": "running", "heartbeat": "claimed", "complete": "succeeded", "fail": "retrying",
            "fail_dead": "dead", "release": "scheduled"}[kind]
    assert db.execute("SELECT count(*) FILTER (WHERE state = %s), count(*) FROM jobs WHERE id = ANY (%s)",
                      (want, ids)).fetchone() == (len(ids), len(ids))


def test_the_store_answers_an_outcome_batch_over_many_shards_in_input_order(citus_db, db_dsn):
    """Split by Citus shard and sent in one round trip, the answers still come
    back in input order, refusals included (a stale token, an unknown job)."""
    from minutehand.store.outcomes import Complete, Start
    from tests.support import make_store

    db = citus_db
    tokens = claimed_on_many_shards(db)
    ids = sorted(tokens, key=lambda i: -i)          # not in shard order
    with make_store(db_dsn, clock=None) as store:
        started = store.start([Start(i, tokens[i]) for i in ids[:5]])
        assert [(o.job_id, o.ok, o.state) for o in started] == [(i, True, "running") for i in ids[:5]]
        items = [Complete(i, tokens[i], b'{"n": %d}' % n) for n, i in enumerate(ids)]
        items.insert(3, Complete(ids[0], tokens[ids[1]], None))        # a token of another job
        items.append(Complete(12345, tokens[ids[0]], None))            # no such job
        got = store.complete(items)
    assert [o.job_id for o in got] == [i.job_id for i in items]
    assert [o.ok for o in got] == [True] * 3 + [False] + [True] * (len(ids) - 3) + [False]
    assert got[-1].reason == "no such job"
    assert db.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded' AND result ? 'n'").fetchone()[0] == len(ids)
    assert db.execute("SELECT sum(running) FROM team_running").fetchone()[0] == 0


def test_a_request_whose_shard_call_fails_does_not_fail_the_requests_of_other_shards(citus_db, db_dsn):
    """The outcome writer's batch goes as one call per Citus shard: when one
    call fails (a result jsonb cannot hold), the calls of other shards have
    committed, and a request whose reports were all written gets its answers
    (OutcomesPartlyWritten); the request with the bad value gets the error."""
    import asyncio

    from minutehand.dispatch.outcomes import OutcomeWriter, _Pending
    from minutehand.store.outcomes import Complete
    from tests.support import make_store

    db = citus_db
    tokens = claimed_on_many_shards(db)
    with make_store(db_dsn, clock=None) as store:
        calls = store.outcome_calls(list(tokens))
        ids = list(tokens)
        good = [ids[at] for at in calls[0]]
        bad = ids[calls[1][0]]
        writer = OutcomeWriter(store, extend_s=30)

        async def one_batch():
            # Both requests in one batch, as the writing thread groups what queued up.
            loop = asyncio.get_running_loop()
            requests = [_Pending([Complete(i, tokens[i], b'{"ok": 1}') for i in good], None, loop.create_future(), loop),
                        _Pending([Complete(bad, tokens[bad], b'"\\u0000"')], None, loop.create_future(), loop)]
            await loop.run_in_executor(None, writer._write, Complete, None, requests)
            return await asyncio.gather(*(r.future for r in requests), return_exceptions=True)
        answered, failed = asyncio.run(one_batch())
    assert isinstance(failed, Exception)
    assert [(o.job_id, o.ok) for o in answered] == [(i, True) for i in good]
    assert db.execute("SELECT count(*) FROM jobs WHERE id = ANY (%s) AND state = 'succeeded'", (good,)).fetchone()[0] \
        == len(good)
    assert db.execute("SELECT state FROM jobs WHERE id = %s", (bad,)).fetchone()[0] == "claimed"


# ---------------------------------------------------------------- submits and duties: one worker each
def citus_shard_of(db: psycopg.Connection) -> dict[int, int]:
    """{logical shard: the Citus shard of jobs holding it}."""
    return dict(db.execute("SELECT s, get_shard_id_for_distribution_column('minutehand.jobs', s::smallint) "
                           "FROM generate_series(0, mh_shard_count() - 1) s").fetchall())


@pytest.mark.parametrize("jobs", [1, 16, 17, 200])
def test_a_batch_without_keys_is_written_on_one_worker(citus_db, jobs):
    """submit_jobs places a call's keyless jobs on the shards of one Citus
    shard: up to 16 jobs (the common small batches, a single HTTP submit)
    as router statements with a one-phase commit; more through COPY, which
    Citus commits in two phases, still on that one worker. Some due now,
    some later this hour, some days ahead: every wheel level."""
    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    dues = [f"now() + interval '{(0, 600, 86400 * 3)[i % 3]} seconds'" for i in range(jobs)]
    sent = remote_commands(db, f"SELECT * FROM submit_jobs('t', array_fill('probe'::text, ARRAY[{jobs}]), "
                               f"ARRAY[{', '.join(dues)}])")
    if jobs <= 16:
        assert_one_worker_one_phase(sent)
    else:
        assert len({server for server, _ in sent}) == 1, sent
    groups = citus_shard_of(db)
    placed = db.execute("SELECT shard, count(*) FROM jobs GROUP BY 1").fetchall()
    assert sum(n for _, n in placed) == jobs and len({groups[s] for s, _ in placed}) == 1
    assert db.execute("""SELECT (SELECT count(*) FROM due_minutes) + (SELECT count(*) FROM due_hours)
                              + (SELECT count(*) FROM due_far)""").fetchone()[0] == jobs


def test_keyless_batches_spread_over_every_citus_shard(citus_db):
    """Each call goes to one Citus shard, drawn at random: over many calls
    every Citus shard gets its share, and within each, many logical shards."""
    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    for _ in range(200):
        db.execute("SELECT * FROM submit_jobs('t', ARRAY['probe'])").fetchall()
    groups = citus_shard_of(db)
    per_group: dict[int, int] = {}
    for shard, n in db.execute("SELECT shard, count(*) FROM jobs GROUP BY 1").fetchall():
        per_group[groups[shard]] = per_group.get(groups[shard], 0) + n
    share = 200 / len(set(groups.values()))
    assert set(per_group) == set(groups.values()), per_group
    assert all(0.4 * share <= n <= 1.6 * share for n in per_group.values()), per_group
    assert db.execute("SELECT count(DISTINCT shard) FROM jobs").fetchone()[0] > 100


def test_the_store_sends_a_keyed_batch_as_one_call_per_citus_shard(citus_db, db_dsn):
    """Keyed jobs live on their key's shard: the store groups a batch by the
    Citus shard of each key (the keyless items go with the first group, up to SPREAD_ROWS of them), and
    every call is a transaction on one worker with a one-phase commit. A
    repeat of the batch names the same jobs."""
    from minutehand.store.submit import JobSpec
    from tests.support import make_store

    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    jobs = [JobSpec("probe", idempotency_key=f"k{i}" if i % 3 else None) for i in range(12)]
    with make_store(db_dsn, clock=None) as store:
        calls = store._submit_calls("t", jobs)
        assert len(calls) > 1 and sorted(at for positions, _ in calls for at in positions) == list(range(12))
        for positions, shards in calls:
            part = [jobs[at] for at in positions]
            keys = [j.idempotency_key for j in part]
            sent = remote_commands(
                db, "SELECT * FROM submit_jobs('t', %s, p_keys => %s, p_shards => %s::smallint[])",
                (["probe"] * len(part), keys if any(keys) else None, shards))
            assert_one_worker_one_phase(sent)
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 12
        jobs = [JobSpec("probe", idempotency_key=f"s{i}" if i % 3 else None) for i in range(12)]
        first = store.submit_many("t", jobs)
        again = store.submit_many("t", jobs)
    assert [i.idx for i in first] == list(range(12)) and all(i.created and i.error is None for i in first)
    keyed = [at for at, j in enumerate(jobs) if j.idempotency_key]
    assert [again[at].job_id for at in keyed] == [first[at].job_id for at in keyed]
    assert not any(again[at].created for at in keyed)
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 12 + 12 + (12 - len(keyed))


def test_the_store_spreads_a_large_keyless_batch_one_citus_shard_per_slice(citus_db, db_dsn):
    """A batch's keyless jobs go to one Citus shard per SPREAD_ROWS of them
    (a call each, on one worker): a small batch stays on one, a large one
    covers the Citus shards evenly instead of piling on one node, and the
    keyed jobs' Citus shards are filled first."""
    from minutehand.store.submit import SPREAD_ROWS, JobSpec
    from tests.support import make_store

    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    groups = citus_shard_of(db)
    n_groups = len(set(groups.values()))
    with make_store(db_dsn, clock=None) as store:
        assert len(store._submit_calls("t", [JobSpec("probe")] * SPREAD_ROWS)) == 1
        assert len(store._submit_calls("t", [JobSpec("probe")] * (SPREAD_ROWS + 1))) == 2
        keyed = [JobSpec("probe", idempotency_key="k")] + [JobSpec("probe")] * SPREAD_ROWS
        calls = store._submit_calls("t", keyed)
        assert len(calls) == 1 and calls[0][0] == list(range(len(keyed)))
        n = SPREAD_ROWS * n_groups
        items = store.submit_many("t", [JobSpec("probe")] * n)
    assert all(i.created and i.error is None for i in items)
    per_group: dict[int, int] = {}
    for shard, count in db.execute("SELECT shard, count(*) FROM jobs GROUP BY 1").fetchall():
        per_group[groups[shard]] = per_group.get(groups[shard], 0) + count
    assert sorted(per_group.values()) == [SPREAD_ROWS] * n_groups, per_group
    assert db.execute("SELECT count(DISTINCT shard) FROM jobs").fetchone()[0] > 200


def test_expiry_and_retention_run_on_one_worker_with_a_one_phase_commit(citus_db, db_dsn):
    """The claim duties per shard: the finished reminders dropped (one
    statement per Citus shard), an expired claim returned to the wheel, a
    retention pass over a shard: each one worker, one phase."""
    import time

    from tests.support import make_store

    db = citus_db
    db.execute("INSERT INTO teams (name) VALUES ('t')")
    job_id = db.execute("SELECT submit_job('t', 'probe')").fetchone()[0]
    shard = job_id & 1023
    epoch = db.execute("SELECT take_shard_lease(%s, 'd1', 600)", (shard,)).fetchone()[0]
    assert db.execute("SELECT count(*) FROM claim_due(%s, 10, 'd1', %s, 1)", (shard, epoch)).fetchone()[0] == 1
    time.sleep(2.5)          # the claim (1 s) expired; the job is older than the retention walk's cut (2 s)
    with make_store(db_dsn, clock=None) as store:
        parts = store._by_citus_shard(range(256))
    now = db.execute("SELECT mh_now()").fetchone()[0]
    for part in parts:
        sent = remote_commands(db, q("drop_finished_claim_checks"), {"shards": part, "now": now})
        assert len({server for server, _ in sent}) <= 1 and not [
            c for _, c in sent if c.startswith(("PREPARE TRANSACTION", "COMMIT PREPARED"))], sent
    sent = remote_commands(db, "SELECT * FROM expire_claims(%s)", (shard,))
    assert_one_worker_one_phase(sent)
    assert db.execute("SELECT state, attempts FROM jobs WHERE id = %s", (job_id,)).fetchone() == ("scheduled", 1)
    assert db.execute("SELECT count(*) FROM job_attempts WHERE job_id = %s", (job_id,)).fetchone()[0] == 1
    sent = remote_commands(db, "SELECT * FROM retain_jobs(%s, 1, 500)", (shard,))
    assert_one_worker_one_phase(sent)
    assert db.execute("SELECT count(*) FROM retention_checks WHERE job_id = %s", (job_id,)).fetchone()[0] == 1
