-- ---------------------------------------------------------------- the local demo (minutehand dev)
-- And the drain of minutehand.testing (app/minutehand/store/dev.py): reads
-- for a small local instance or a test database, never the service's.

-- name: due_unclaimed
-- How many of a team's jobs of these names are due and not claimed, counted
-- up to cap: the rows of the wheel's minute level joined to their records
-- (claims delete wheel rows; rows of cancelled jobs are left out by state).
-- Bounded by cap, whatever the backlog. `now`: the database's clock as
-- the store read it (on Citus this read runs on the workers).
SELECT count(*) AS n FROM (
    SELECT 1 FROM due_minutes w
      JOIN jobs j ON j.shard = w.shard AND j.id = w.job_id
     WHERE w.run_at <= %(now)s::timestamptz AND j.state IN ('scheduled', 'retrying')
       AND j.team_id = (SELECT id FROM teams WHERE name = %(team)s) AND j.name = ANY (%(names)s)
     LIMIT %(cap)s) s

-- name: unstarted_jobs
-- Every unstarted job of a team with these names, wherever it waits on the
-- wheel; soon: due by `now` (the database's clock as the store read it) or
-- within soon_s seconds. Reads the whole wheel: for a small local instance only.
WITH w AS (SELECT shard, job_id FROM due_minutes
           UNION ALL SELECT shard, job_id FROM due_hours
           UNION ALL SELECT shard, job_id FROM due_far)
SELECT j.id, j.run_at <= %(now)s::timestamptz + make_interval(secs => %(soon_s)s) AS soon
  FROM w JOIN jobs j ON j.shard = w.shard AND j.id = w.job_id
 WHERE j.state IN ('scheduled', 'retrying')
   AND j.team_id = (SELECT id FROM teams WHERE name = %(team)s) AND j.name = ANY (%(names)s)

-- name: outstanding_jobs
-- Jobs of these names (and teams; NULL: any) that are claimed or running, or
-- waiting and due (a retry also when due by retry_horizon): what a test's
-- drain (minutehand.testing) still waits for. Reads the jobs table whole
-- (no index serves it): for test databases only. `now`: the database's
-- clock as the store read it (on Citus this read runs on the workers).
SELECT j.id FROM jobs j
 WHERE j.name = ANY (%(names)s)
   AND (%(teams)s::text[] IS NULL OR j.team_id IN (SELECT t.id FROM teams t WHERE t.name = ANY (%(teams)s)))
   AND (j.state IN ('claimed', 'running')
        OR (j.state IN ('scheduled', 'retrying') AND j.run_at <= %(now)s::timestamptz)
        OR (j.state = 'retrying' AND j.run_at <= %(retry_horizon)s::timestamptz))
 ORDER BY j.id
 LIMIT 10000
