-- Reading jobs (app/minutehand/store/jobs.py): one job's status and team, a
-- team's jobs page by page.

-- name: job_status
-- The status record of one job: one primary-key lookup (shard from the id),
-- and for a run of a repeating job one more, of its series (same shard).
-- Lateness: first start - agreed run time once started (final); before the
-- first start, once the agreed time has passed, the lateness so far, by
-- `now`, the database's clock as the store read it (db_now): on Citus this
-- statement runs on a worker, whose mh_now() is not the coordinator's.
SELECT j.id AS job_id, t.name AS team, j.name, j.state, j.priority, j.due_at, j.agreed_at, j.run_at, j.strict,
       j.flex_s, j.attempts, j.max_attempts, j.claimed_by, j.claim_expires_at,
       CASE WHEN j.lateness IS NOT NULL THEN j.lateness
            WHEN j.state IN ('scheduled', 'retrying', 'claimed') AND %(now)s::timestamptz > j.agreed_at
            THEN %(now)s::timestamptz - j.agreed_at END AS lateness,
       j.lateness IS NOT NULL AS lateness_final, j.last_error, j.result,
       j.idempotency_key, j.created_at, j.started_at, j.finished_at, j.cancel_requested_at,
       j.series_id, s.every_s, s.cron, s.timezone, coalesce(s.misfire, 'run_once') AS misfire
  FROM jobs j JOIN teams t ON t.id = j.team_id
  LEFT JOIN series s ON s.shard = j.shard AND s.id = j.series_id
 WHERE j.shard = mh_shard_of(%(job_id)s::bigint) AND j.id = %(job_id)s::bigint
   AND (%(team)s::text IS NULL OR t.name = %(team)s)

-- name: job_team
-- The team a job belongs to (an administrator's cancel acts as it).
SELECT t.name AS team FROM jobs j JOIN teams t ON t.id = j.team_id
 WHERE j.shard = mh_shard_of(%(job_id)s::bigint) AND j.id = %(job_id)s::bigint

-- name: list_jobs
-- One page of a team's jobs, newest first: keyset on (team_id, id DESC),
-- never OFFSET, reading at most `scan` jobs. Always at least one row: the
-- first says how far the read went (scanned, scanned_to); the job columns
-- are NULL when nothing matched.
WITH scanned AS MATERIALIZED (
    SELECT j.id, j.name, j.state, j.priority, j.due_at, j.run_at, j.attempts, j.max_attempts, j.created_at
      FROM jobs j
     WHERE j.team_id = (SELECT t.id FROM teams t WHERE t.name = %(team)s::text)
       AND j.id < coalesce(%(before)s::bigint, 9223372036854775807)
     ORDER BY j.id DESC
     LIMIT %(scan)s::int)
SELECT s.scanned, s.scanned_to, m.id AS job_id, %(team)s::text AS team, m.name, m.state::text AS state,
       m.priority, m.due_at, m.run_at, m.attempts, m.max_attempts, m.created_at
  FROM (SELECT count(*) AS scanned, min(id) AS scanned_to FROM scanned) s
  LEFT JOIN LATERAL (
      SELECT w.* FROM scanned w
       WHERE (%(state)s::job_state IS NULL OR w.state = %(state)s::job_state)
         AND (%(name)s::text IS NULL OR w.name = %(name)s::text)
         AND (%(due_before)s::timestamptz IS NULL OR w.due_at < %(due_before)s::timestamptz)
         AND (%(due_after)s::timestamptz IS NULL OR w.due_at >= %(due_after)s::timestamptz)
       ORDER BY w.id DESC
       LIMIT %(limit)s::int) m ON true
 ORDER BY m.id DESC
