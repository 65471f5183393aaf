-- The maintenance duties (app/minutehand/store/maintenance.py): claims
-- expired, the wheel cascaded and swept, finished jobs retained, and what is
-- past its retention purged (sql/functions/maintenance.sql, retention.sql).

-- name: drop_finished_claim_checks
-- The reminders due by now whose jobs all left their claim (finished,
-- released, or claimed again, which files a reminder of its own), dropped
-- in one statement over these shards. Under a steady flow of jobs shorter
-- than their claim nearly every reminder is such, and expire_claims (one
-- shard per transaction) is left the shards where a claim lapsed or was
-- renewed. It locks no job. `now` as in shards_with_expired_claims. The
-- jobs come from the reminder's own list (unnest in the subquery's FROM), so
-- the check stays a primary-key probe per job: written as `j.id = ANY
-- (c.job_ids)` it could be planned as an anti join over a scan of all jobs,
-- as it was when the planner took a few hundred due reminders for thousands.
-- On Citus the store sends the shards of one Citus shard per statement,
-- named in the subquery too: without that Citus sends it to every shard.
WITH dropped AS (
    DELETE FROM claim_checks c
     WHERE c.shard = ANY (%(shards)s::int[]) AND c.check_at <= %(now)s::timestamptz
       AND NOT EXISTS (SELECT 1 FROM unnest(c.job_ids) AS u(id)
                         JOIN jobs j ON j.shard = c.shard AND j.id = u.id
                        WHERE j.shard = ANY (%(shards)s::int[]) AND j.state IN ('claimed', 'running'))
    RETURNING 1
)
SELECT count(*) AS dropped FROM dropped

-- name: shards_with_expired_claims
-- Which of these shards have claims past their expiry (a reminder in
-- claim_checks due by now), in one statement (claim_checks_due, a range per
-- shard), so the duty that returns them drops finished reminders and runs
-- expire_claims only where it finds work (idle: this statement alone). `now`: the database's clock as the store read it (mh_now()):
-- on Citus this runs on the workers, which a clock pinned in the session
-- does not reach.
SELECT DISTINCT c.shard::int AS shard
  FROM claim_checks c
 WHERE c.shard = ANY (%(shards)s::int[]) AND c.check_at <= %(now)s::timestamptz

-- name: retention_cut
-- The database's clock, and the id the retention walk stops before then.
SELECT mh_now() AS now, mh_retention_cut(%(default_s)s::int, mh_now()) AS cut

-- name: shards_with_retention_work
-- Which of these shards a retention pass finds work on, in one statement:
-- jobs filed for `now` or earlier (retention_checks), or jobs between the
-- walk's mark and `cut` (retention_cut, read first: on Citus this runs on
-- the workers). A shard with no mark yet is not named here: the pass has
-- its first walk to do there. So an idle pass is this statement, not a
-- call per shard.
SELECT c.shard::int AS shard, true AS work
  FROM retention_checks c
 WHERE c.shard = ANY (%(shards)s::int[]) AND c.check_at <= %(now)s::timestamptz
 GROUP BY c.shard
UNION ALL
SELECT m.shard::int, EXISTS (SELECT 1 FROM jobs j WHERE j.shard = m.shard AND j.id >= m.walked_to
                                                    AND j.id < %(cut)s::bigint)
  FROM retention_marks m
 WHERE m.shard = ANY (%(shards)s::int[])

-- name: expire_claims
-- Return one shard's expired claims to the due pool.
SELECT returned, dead FROM expire_claims(%(shard)s::int)

-- name: cascade_wheel
-- Move far-future jobs down the wheel as the horizon reaches them.
SELECT from_far, from_hours FROM cascade_wheel()

-- name: sweep_passed
-- Carry forward and empty the minute buckets the hand has passed.
SELECT buckets, carried FROM sweep_passed()

-- name: purge_idempotency_keys
-- Drop one shard's expired idempotency keys.
SELECT purge_idempotency_keys(%(shard)s::int) AS purged

-- name: retain_jobs
-- Remove one shard's finished jobs past their retention (one pass).
SELECT removed, deferred, walked FROM retain_jobs(%(shard)s::int, %(default_s)s::int, %(limit)s::int)

-- name: job_gone
-- Why a job id has no row: made before its team's retention cut (expired) or not.
SELECT made_at, retention_s, expired FROM job_gone(%(job_id)s::bigint, %(team)s::text, %(default_s)s::int)

-- name: maintain
-- Every maintenance duty once, over every shard.
SELECT * FROM maintain()

-- name: roll_up_stats
-- Fold minute rows of team_stats older than the hour before this one into hour rows.
SELECT roll_up_stats() AS rolled

-- name: purge_stats
-- Drop team_stats rows past their retention.
SELECT purge_stats() AS purged

-- name: purge_load
-- Drop the planned load of minutes more than an hour back (bounded).
SELECT purge_load() AS purged

-- name: purge_events
-- Drop one shard's events past their retention.
SELECT purge_events(%(shard)s::int) AS purged

-- name: purge_deliveries
-- Drop webhook delivery attempts past their retention.
SELECT purge_deliveries() AS purged
