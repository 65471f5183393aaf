"""Store.each_alone: per-shard statements sent in one round trip, each in a
transaction of its own (it relies on psycopg's private
Pipeline._enqueue_sync, so these tests pin its behaviour down)."""
from __future__ import annotations

import psycopg
import pytest

from minutehand.dispatch.shards import ShardKeeper
from minutehand.store.claim import ClaimRefused, ClaimRequest
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.support import lease_all, make_store


@pytest.fixture
def conn(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as c:
        yield c


def test_each_statement_is_a_transaction_of_its_own(conn):
    rows = Store.each_alone(conn, "SELECT txid_current() AS txid, %(i)s AS i", [{"i": i} for i in range(5)])
    assert [r[0]["i"] for r in rows] == list(range(5))
    assert len({r[0]["txid"] for r in rows}) == 5


def test_one_failing_statement_fails_alone_and_the_others_are_read(db_dsn):
    conn = psycopg.connect(db_dsn, autocommit=True)
    conn.execute("CREATE TABLE t (i int)")
    results = Store.each_alone(conn, "INSERT INTO t VALUES (10 / %(d)s) RETURNING i",
                               [{"d": 1}, {"d": 0}, {"d": 2}, {"d": 5}])
    assert isinstance(results[1], psycopg.errors.DivisionByZero)
    assert [r for i, r in enumerate(results) if i != 1] == [[(10,)], [(5,)], [(2,)]]
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 3     # each committed on its own
    assert conn.execute("SELECT 1").fetchone() == (1,)                    # and the connection is usable
    conn.close()


def test_many_failures_in_one_round_trip_leave_every_good_result_readable(db_dsn):
    """psycopg raises server errors at whatever statement it is sending when a
    result comes back, and reports only some of them: nothing sent after an
    error may be lost, and each failed item is marked as failed."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (i int)")
        results = Store.each_alone(conn, "INSERT INTO t VALUES (10 / (%(i)s %% 2)) RETURNING %(i)s::int",
                                   [{"i": i} for i in range(300)])
        assert [r for r in results[1::2]] == [[(i,)] for i in range(1, 300, 2)]
        assert all(isinstance(r, psycopg.errors.DivisionByZero) for r in results[0::2])
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 150


def test_a_value_that_cannot_be_sent_fails_alone(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        results = Store.each_alone(conn, "SELECT %(s)s::text", [{"s": "a"}, {"s": "b\x00"}, {"s": "c"}])
        assert results[0] == [("a",)] and results[2] == [("c",)]
        assert isinstance(results[1], psycopg.DataError) and "NUL" in str(results[1])


def test_a_stale_shard_is_refused_alone_and_the_others_claim(db_dsn):
    store = make_store(db_dsn, clock=None)
    store.create_team("t")
    store.submit_many("t", [JobSpec(name="x")] * 5000)    # ~20 on every shard
    leases = lease_all(store, owner="d1")
    shards = sorted(leases)[:6]
    stale = {shards[1]: leases[shards[1]] - 1, shards[4]: leases[shards[4]] + 7}
    requests = [ClaimRequest(s, stale.get(s, leases[s]), 100, "w") for s in shards]
    results, refused = store.claim(requests, "d1", 30)
    assert set(refused) == set(stale)
    assert all("does not hold a current lease" in why for why in refused.values())
    for r, answer in zip(requests, results):
        if r.shard in stale:
            assert isinstance(answer, ClaimRefused) and answer.stale and answer.shard == r.shard
        else:
            assert answer and all(job.job_id & 1023 == job.shard == r.shard and job.team == "t" for job in answer)
    store.close()


def test_a_refused_claim_drops_only_the_lease_it_was_made_under():
    """Claims refused as stale drop their shards from the keeper's leases,
    but not a lease the keeper took anew (a new epoch) while they were on
    their way: it is this dispatcher's, and its claims would go on."""
    changes = []
    keeper = ShardKeeper(None, "d1", 2.0, on_change=changes.append)
    keeper.leases = {1: 5, 2: 7, 3: 9}
    keeper.drop({1: 4, 2: 7})             # 1 was taken again (epoch 5) after a claim under epoch 4
    assert keeper.leases == {1: 5, 3: 9} and changes == [{1: 5, 3: 9}]
    keeper.drop({1: 4})
    assert keeper.leases == {1: 5, 3: 9} and len(changes) == 1
