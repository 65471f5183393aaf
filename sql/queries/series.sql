-- ---------------------------------------------------------------- series
-- Repeating jobs (app/minutehand/store/series.py; sql/functions/series.sql,
-- chain.sql): the chain of their runs, and their control.

-- name: series_to_chain
-- The series of these shards marked for their next run, with their specs and the database's clock.
SELECT * FROM series_to_chain(%(shards)s::int[], %(limit)s::int)

-- name: chain_series
-- Their next runs, as computed, on one shard, admitted: the runs created.
SELECT * FROM chain_series(%(shard)s::int, %(series)s::bigint[], %(after)s::timestamptz[],
                           %(due)s::timestamptz[], %(deadline)s::timestamptz[], %(default_ceiling)s::int)

-- name: series_detail
-- One series of a team: spec, state, chain columns, its waiting run, and
-- the database's now (fire times are computed from it); MH404 if not the team's.
SELECT * FROM series_detail(%(team)s::text, %(series_id)s::bigint)

-- name: series_runs
-- A series' newest runs, newest first, at most `limit`: read through
-- jobs_series_run (shard, series_id, due_at) backwards, on the series'
-- shard; only the team's (none for another team's series).
SELECT j.id AS job_id, j.due_at, j.agreed_at, j.run_at, j.state::text AS state, j.attempts, j.started_at,
       j.finished_at, j.last_error
  FROM jobs j
 WHERE j.shard = mh_shard_of(%(series_id)s::bigint) AND j.series_id = %(series_id)s::bigint
   AND j.team_id = (SELECT t.id FROM teams t WHERE t.name = %(team)s::text)
 ORDER BY j.due_at DESC
 LIMIT %(limit)s::int

-- name: list_series
-- One page of a team's series, newest first: keyset on series_team.
SELECT * FROM list_series(%(team)s::text, %(after)s::bigint, %(limit)s::int)

-- name: pause_series
-- Pause a series, cancelling its waiting run if it has not started.
SELECT series_id, state, changed, cancelled_run FROM pause_series(%(team)s::text, %(series_id)s::bigint)

-- name: resume_series
-- Resume a paused series: its next run at the first fire time after now.
SELECT series_id, state, changed, NULL::bigint AS cancelled_run
  FROM resume_series(%(team)s::text, %(series_id)s::bigint)

-- name: cancel_series
-- Cancel a series and its waiting run if that has not started.
SELECT series_id, state, changed, cancelled_run FROM cancel_series(%(team)s::text, %(series_id)s::bigint)

-- name: change_series
-- A new repeat spec (and misfire policy) from the next run.
SELECT series_id, state, changed, cancelled_run
  FROM change_series(%(team)s::text, %(series_id)s::bigint, %(every_s)s::int, %(cron)s::text,
                     %(timezone)s::text, %(misfire)s::text)
