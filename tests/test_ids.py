"""Job ids: [ms since 2025-01-01 : 40][sequence : 13][shard : 10], made in SQL."""
import datetime as dt

from minutehand.store.citus import shard_of


def test_id_fields_do_not_overlap_and_order_by_time(db):
    rows = db.execute("""SELECT mh_new_id(s), s, clock_timestamp() FROM generate_series(0, 255) s""").fetchall()
    epoch = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    for job_id, shard, made_at in rows:
        assert job_id > 0
        assert job_id & 1023 == shard == shard_of(job_id)               # the shard, read without a lookup
        ms = job_id >> 23
        assert abs(ms - (made_at - epoch) / dt.timedelta(milliseconds=1)) < 1000
    ids = [r[0] for r in rows]
    assert len(set(ids)) == len(ids)
    # the time part never decreases along creation order
    assert [i >> 23 for i in ids] == sorted(i >> 23 for i in ids)


def test_mh_id_at_bounds_the_ids_made_after_it(db):
    t, job_id = db.execute("SELECT clock_timestamp(), mh_new_id(7)").fetchone()
    assert db.execute("SELECT mh_id_at(%s) <= %s", (t, job_id)).fetchone()[0]
    assert db.execute("SELECT mh_id_at(%s + interval '1 second') > %s", (t, job_id)).fetchone()[0]
