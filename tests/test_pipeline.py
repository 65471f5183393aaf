"""Store.each_alone: per-shard statements sent in one round trip, each in a
transaction of its own (it relies on psycopg's private
Pipeline._enqueue_sync, so these tests pin its behaviour down)."""
from __future__ import annotations

import psycopg
import pytest

from app.store.store import Store
from tests.support import lease_all, make_store


@pytest.fixture
def conn(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as c:
        yield c


def test_each_statement_is_a_transaction_of_its_own(conn):
    rows = Store.each_alone(conn, "SELECT txid_current() AS txid, %(i)s AS i", [{"i": i} for i in range(5)])
    assert [r[0]["i"] for r in rows] == list(range(5))
    assert len({r[0]["txid"] for r in rows}) == 5


def test_one_failing_statement_fails_alone_and_the_connection_is_discarded(db_dsn):
    conn = psycopg.connect(db_dsn, autocommit=True)
    conn.execute("CREATE TABLE t (i int)")
    with pytest.raises(psycopg.errors.DivisionByZero):
        Store.each_alone(conn, "INSERT INTO t VALUES (10 / %(d)s) RETURNING i",
                         [{"d": 1}, {"d": 0}, {"d": 2}, {"d": 5}])
    assert conn.closed                          # results left unread: not handed to anyone else
    with psycopg.connect(db_dsn) as check:      # the others committed, each on its own
        assert sorted(r[0] for r in check.execute("SELECT i FROM t")) == [2, 5, 10]


def test_a_stale_shard_is_refused_alone_and_the_others_claim(db_dsn):
    store = make_store(db_dsn, clock=None)
    store.create_team("t")
    from app.store.records import JobSpec
    store.submit_many("t", [JobSpec(name="x")] * 5000)    # ~20 on every shard
    leases = lease_all(store, owner="d1")
    shards = sorted(leases)[:6]
    stale = {shards[1]: leases[shards[1]] - 1, shards[4]: leases[shards[4]] + 7}
    requests = [(s, stale.get(s, leases[s]), 100, "w", None) for s in shards]
    results, refused = store.claim_for_workers(requests, "d1", 30)
    assert set(refused) == set(stale)
    assert all("does not hold a current lease" in why for why in refused.values())
    for (s, *_), rows in zip(requests, results):
        if s in stale:
            assert rows is None
        else:
            assert rows and all(r["job_id"] & 1023 == s for r in rows)
    store.close()
