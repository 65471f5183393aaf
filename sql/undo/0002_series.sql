-- Undo revision 0002 (sql/007_series.sql): everything it created, in dependency order.
-- Runs it made stay as ordinary jobs (their series_id then names nothing).
DROP FUNCTION IF EXISTS submit_series, mh_take_key, mh_series_hash, mh_repeat_problem;
DROP TABLE IF EXISTS series;
