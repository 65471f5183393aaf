-- Named statements the Python store sends, looked up by name
-- (app/minutehand/store/queries.py). Each calls a procedure of sql/functions/: the logic
-- lives there, these only bind parameters. `-- name: X` starts one; the
-- next line says what it does.

-- name: set_clock
-- Pin this session's clock (tests); NULL unpins it.
SELECT set_config('minutehand.now', coalesce(%(now)s::text, ''), false)

-- name: submit_job
-- One job: its id, assigned run time, and whether it was created.
SELECT job_id, run_at, created
  FROM submit_job_detail(%(team)s::text, %(name)s::text, %(due_at)s::timestamptz, %(payload)s::jsonb,
                         %(priority)s::int, %(max_attempts)s::int, %(flex_s)s::int, %(strict)s::boolean,
                         %(idempotency_key)s::text, %(backoff_base_s)s::real, %(backoff_cap_s)s::real)

-- name: submit_jobs
-- Many jobs of one team, as parallel arrays; one row per item.
SELECT idx, job_id, run_at, created, error
  FROM submit_jobs(%(team)s::text, %(names)s::text[], %(due_ats)s::timestamptz[], %(payloads)s::jsonb[],
                   %(priorities)s::int[], %(max_attempts)s::int[], %(flex_s)s::int[], %(stricts)s::boolean[],
                   %(keys)s::text[], %(backoff_base_s)s::real[], %(backoff_cap_s)s::real[])

-- name: take_shard_leases
-- Take or renew some shards' leases; (shard, epoch) of those now held.
SELECT shard, epoch FROM take_shard_leases(%(shards)s::int[], %(owner)s::text, %(ttl_s)s::real)

-- name: release_shard_leases
-- Give some shards up at once (their epochs in the same order).
SELECT release_shard_leases(%(shards)s::int[], %(owner)s::text, %(epochs)s::bigint[]) AS released

-- name: commit_without_flush
-- This transaction's commit does not wait for its WAL to reach the disk.
SELECT set_config('synchronous_commit', 'off', true)

-- name: due_edges
-- What some shards have due now (since: per shard, only what came due by
-- the clock since then; NULL: all), per shard, bucket, class and team (cap:
-- counted up to that many rows a cell; NULL: all), and
-- for each shard one row (team_id NULL) saying when it next has more. A run
-- time before year 1 (a row written around the procedures) reads as year 1:
-- due, so the claim reaches that job and fails it alone, and the reader can
-- load it.
SELECT shard, bucket, strict, priority, team_id, due,
       CASE WHEN oldest < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz ELSE oldest END
           AS oldest,
       CASE WHEN next_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz ELSE next_at END
           AS next_at
  FROM due_edges(%(shards)s::int[], %(since)s::timestamptz[], %(cap)s::int)

-- name: team_terms
-- Every team's quota and weight, for sharing capacity between them.
SELECT id, name, quota, weight FROM teams

-- name: teams_running
-- Jobs claimed and not finished, per team, on some shards.
SELECT team_id, sum(running)::int AS running FROM team_running WHERE shard = ANY (%(shards)s::int[])
 GROUP BY team_id HAVING sum(running) > 0

-- name: start_many
-- Mark claimed jobs as started (records lateness).
SELECT job_id, ok, state, reason FROM start_many(%(ids)s::bigint[], %(tokens)s::uuid[])

-- name: heartbeat_many
-- Extend the claims of running jobs.
SELECT job_id, ok, state, reason FROM heartbeat_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(extend_s)s::real)

-- name: complete_many
-- Close jobs as succeeded, storing results (and under idempotency keys).
SELECT job_id, ok, state, reason FROM complete_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[])

-- name: fail_many
-- Report failures: retry after backoff, or dead.
SELECT job_id, ok, state, reason FROM fail_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[], %(retryable)s::boolean[])

-- name: cancel
-- Cancel a job that has not started; team NULL acts for every team.
SELECT job_id, ok, state, reason FROM cancel(%(job_id)s::bigint, %(team)s::text)

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
       j.idempotency_key, j.created_at, j.started_at, j.finished_at,
       j.series_id, s.every_s, s.cron, s.timezone, coalesce(s.misfire, 'run_once') AS misfire
  FROM jobs j JOIN teams t ON t.id = j.team_id
  LEFT JOIN series s ON s.shard = j.shard AND s.id = j.series_id
 WHERE j.shard = mh_shard_of(%(job_id)s::bigint) AND j.id = %(job_id)s::bigint
   AND (%(team)s::text IS NULL OR t.name = %(team)s)

-- name: job_team
-- The team a job belongs to (an administrator's cancel acts as it).
SELECT t.name AS team FROM jobs j JOIN teams t ON t.id = j.team_id
 WHERE j.shard = mh_shard_of(%(job_id)s::bigint) AND j.id = %(job_id)s::bigint

-- name: create_team
-- A new team with its token's hash; no row if the name is taken. A rate
-- without a burst gets one second's worth (at least 1).
INSERT INTO teams (name, quota, weight, token_hash, submit_rate, submit_burst, max_pending, retention_s)
VALUES (%(name)s, %(quota)s, %(weight)s, %(token_hash)s, %(submit_rate)s::float8,
        coalesce(%(submit_burst)s::int, CASE WHEN %(submit_rate)s::float8 IS NOT NULL
                                             THEN greatest(ceil(%(submit_rate)s::float8), 1)::int END),
        %(max_pending)s::int, %(retention_s)s::int)
ON CONFLICT (name) DO NOTHING
RETURNING id

-- name: update_team
-- Set a team's quota and/or weight (NULL keeps the value), and its admission
-- limits and retention where set_* is true (to the value given, NULL
-- included), one statement; no row if there is no such team. A rate set
-- without a burst keeps the team's burst, or gets one second's worth (at
-- least 1); a rate cleared clears the burst. The dispatcher rereads teams
-- periodically.
UPDATE teams SET quota = coalesce(%(quota)s::int, quota), weight = coalesce(%(weight)s::int, weight),
       submit_rate = CASE WHEN %(set_rate)s THEN %(submit_rate)s::float8 ELSE submit_rate END,
       submit_burst = CASE WHEN %(set_burst)s THEN %(submit_burst)s::int
                           WHEN NOT %(set_rate)s THEN submit_burst
                           WHEN %(submit_rate)s::float8 IS NULL THEN NULL
                           ELSE coalesce(submit_burst, greatest(ceil(%(submit_rate)s::float8), 1)::int) END,
       max_pending = CASE WHEN %(set_max_pending)s THEN %(max_pending)s::int ELSE max_pending END,
       retention_s = CASE WHEN %(set_retention)s::boolean THEN %(retention_s)s::int ELSE retention_s END
 WHERE name = %(name)s::text
RETURNING name, quota, weight, created_at, submit_rate, submit_burst, max_pending, retention_s

-- name: team
-- A team's settings; no row if there is no such team.
SELECT name, quota, weight, created_at, submit_rate, submit_burst, max_pending, retention_s
  FROM teams WHERE name = %(name)s::text

-- name: list_teams
-- One page of teams by name, after `after` (NULL: from the first): keyset on
-- the name's unique index, never OFFSET.
SELECT name, quota, weight, created_at, submit_rate, submit_burst, max_pending, retention_s FROM teams
 WHERE %(after)s::text IS NULL OR name > %(after)s::text
 ORDER BY name
 LIMIT %(limit)s::int

-- name: admit
-- How many of a submission's jobs the team may write now (sql/functions/admission.sql).
SELECT admitted, limited_by, retry_after_s, pending, ceiling, rate, burst
  FROM mh_admit(%(team)s::text, %(jobs)s::int, %(at_least)s::int, %(default_ceiling)s::int)

-- name: team_exists
-- Whether a team of this name exists.
SELECT EXISTS (SELECT 1 FROM teams WHERE name = %(name)s) AS exists

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
DELETE FROM claim_checks c
 WHERE c.shard = ANY (%(shards)s::int[]) AND c.check_at <= %(now)s::timestamptz
   AND NOT EXISTS (SELECT 1 FROM unnest(c.job_ids) AS u(id)
                     JOIN jobs j ON j.shard = c.shard AND j.id = u.id
                    WHERE j.state IN ('claimed', 'running'))

-- name: shards_with_expired_claims
-- Which of these shards have claims past their expiry (a reminder in
-- claim_checks due by now), in one statement (claim_checks_due, a range per
-- shard), so the duty that returns them runs expire_claims only where it
-- finds work. `now`: the database's clock as the store read it (mh_now()):
-- on Citus this runs on the workers, which a clock pinned in the session
-- does not reach.
SELECT DISTINCT c.shard::int AS shard
  FROM claim_checks c
 WHERE c.shard = ANY (%(shards)s::int[]) AND c.check_at <= %(now)s::timestamptz

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

-- name: team_by_token
-- The team whose bearer token has this hash (API authentication).
SELECT name FROM teams WHERE token_hash = %(token_hash)s

-- name: set_team_token
-- Replace a team's token hash (rotation); no row if there is no such team.
UPDATE teams SET token_hash = %(token_hash)s WHERE name = %(name)s RETURNING id

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

-- name: team_stats
-- A team's counters since mh_stats_since(now, window_s), by job name: the
-- `names` names of most volume one by one, the rest added up in one row
-- (name NULL, other_names: how many). Reads team_stats rows of the team
-- only, through its primary key; running now from team_running, one probe
-- per shard. No row: no such team; one row with name NULL and other_names
-- 0: nothing counted in the window.
WITH team AS (SELECT t.id, t.name, t.quota FROM teams t WHERE t.name = %(team)s::text),
since AS (SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t),
by_name AS (
    SELECT s.name, sum(s.submitted) AS submitted, sum(s.started) AS started, sum(s.succeeded) AS succeeded,
           sum(s.failed) AS failed, sum(s.dead) AS dead, sum(s.cancelled) AS cancelled,
           mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist,
           mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
      FROM team_stats s
     WHERE s.team_id = (SELECT id FROM team) AND s.minute >= (SELECT t FROM since)
     GROUP BY s.name),
ranked AS (
    SELECT b.*, row_number() OVER (ORDER BY b.submitted + b.started + b.succeeded + b.failed + b.dead + b.cancelled
                                            DESC, b.name) <= %(names)s::int AS shown
      FROM by_name b),
folded AS (
    SELECT CASE WHEN r.shown THEN r.name END AS name, count(*) FILTER (WHERE NOT r.shown) AS other_names,
           sum(r.submitted)::bigint AS submitted, sum(r.started)::bigint AS started,
           sum(r.succeeded)::bigint AS succeeded, sum(r.failed)::bigint AS failed, sum(r.dead)::bigint AS dead,
           sum(r.cancelled)::bigint AS cancelled,
           mh_hist_sum(array_agg(r.lateness_hist)) AS lateness_hist, mh_hist_sum(array_agg(r.runtime_hist)) AS runtime_hist
      FROM ranked r
     GROUP BY 1),
-- Its own uncorrelated CTE: Citus refuses a subquery correlated with `team`.
running AS (
    SELECT coalesce(sum(r.running), 0)::bigint AS n
      FROM generate_series(0, mh_shard_count() - 1) g(shard)
      JOIN team_running r ON r.shard = g.shard AND r.team_id = (SELECT id FROM team))
SELECT team.name AS team, team.quota, (SELECT t FROM since) AS window_start, (SELECT n FROM running) AS running,
       f.name, coalesce(f.other_names, 0) AS other_names, f.submitted, f.started, f.succeeded, f.failed, f.dead,
       f.cancelled, f.lateness_hist, f.runtime_hist
  FROM team
  LEFT JOIN folded f ON true

-- name: fleet_stats
-- Every team's counters since mh_stats_since(now, window_s) (admin): the
-- rows of the window through team_stats_minute, added up per team; running
-- now per team from team_running (read whole: a row per shard and team).
WITH since AS (SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t),
counted AS (
    SELECT s.team_id, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
           sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
           sum(s.cancelled)::bigint AS cancelled,
           mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist,
           mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
      FROM team_stats s
     WHERE s.minute >= (SELECT t FROM since)
     GROUP BY s.team_id),
running AS (SELECT r.team_id, sum(r.running)::bigint AS running FROM team_running r GROUP BY r.team_id)
SELECT t.name AS team, t.quota, (SELECT t FROM since) AS window_start, coalesce(r.running, 0) AS running,
       c.submitted, c.started, c.succeeded, c.failed, c.dead, c.cancelled, c.lateness_hist, c.runtime_hist
  FROM teams t
  LEFT JOIN counted c ON c.team_id = t.id
  LEFT JOIN running r ON r.team_id = t.id
 ORDER BY t.name

-- name: fleet_window
-- Where a stats window of window_s seconds starts (a fleet with no team).
SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t

-- name: roll_up_stats
-- Fold minute rows of team_stats older than the hour before this one into hour rows.
SELECT roll_up_stats() AS rolled

-- name: purge_stats
-- Drop team_stats rows past their retention.
SELECT purge_stats() AS purged

-- name: purge_load
-- Drop the planned load of minutes more than an hour back (bounded).
SELECT purge_load() AS purged

-- name: set_flex_default
-- Set a default flex window (team NULL: the operator's; job name NULL: round-cron series).
SELECT team, job_name, flex_s, updated_at
  FROM set_flex_default(%(team)s::text, %(job_name)s::text, %(flex_s)s::int)

-- name: delete_flex_default
-- Remove a default flex window; whether there was one.
SELECT delete_flex_default(%(team)s::text, %(job_name)s::text) AS deleted

-- name: flex_defaults
-- One page of the default flex windows of a team (NULL: the operator's), the round-cron rule first.
SELECT team, job_name, flex_s, updated_at
  FROM flex_defaults_of(%(team)s::text, %(after)s::text, %(limit)s::int)

-- name: schema_revision
-- The Alembic revision the database is at (readiness).
SELECT (SELECT version_num FROM alembic_version LIMIT 1) AS revision

-- ---------------------------------------------------------------- dispatch (revision 0003)

-- name: claim_due
-- Claim up to limit due jobs of one shard for one worker, of the given names
-- and teams (NULL: any); a stale lease is one row with `refused` set. The
-- payload and a replayed result come as JSON text: the dispatcher hands them
-- on as they are.
SELECT * FROM claim_due(%(shard)s::int, %(limit)s::int, %(owner)s::text, %(epoch)s::bigint,
                        %(lease_s)s::real, %(worker)s::text, %(names)s::text[], %(teams)s::text[])

-- name: claim_planned
-- The dispatcher's planned claim from one bucket of one shard: per cell
-- (strict, priority, team id) up to its limit, of these job names (NULL:
-- any); rows as claim_due's, with the cell each came from.
SELECT * FROM claim_planned(%(shard)s::int, %(owner)s::text, %(epoch)s::bigint, %(lease_s)s::real,
                            %(worker)s::text, %(bucket)s::timestamptz, %(stricts)s::boolean[],
                            %(priorities)s::smallint[], %(teams)s::int[], %(limits)s::int[], %(names)s::text[])

-- name: claim_planned_shards
-- claim_planned for many shards of one bucket in one statement (plain
-- PostgreSQL): each cell names its shard; each shard its epoch. Rows as
-- claim_planned's, with their shard.
SELECT * FROM claim_planned_shards(%(owner)s::text, %(lease_s)s::real, %(worker)s::text, %(bucket)s::timestamptz,
                                   %(shards)s::int[], %(epochs)s::bigint[], %(cell_shards)s::int[],
                                   %(stricts)s::boolean[], %(priorities)s::smallint[], %(teams)s::int[],
                                   %(limits)s::int[], %(names)s::text[])

-- name: release_many
-- Give back claimed jobs that were not started (due again at once, the attempt not counted).
SELECT job_id, ok, state, reason FROM release_many(%(ids)s::bigint[], %(tokens)s::uuid[])

-- name: dispatcher_members
-- Renew this dispatcher's membership; the names of the live ones, sorted.
SELECT name FROM dispatcher_members(%(name)s::text, %(ttl_s)s::real) AS name

-- name: leave_dispatchers
-- A dispatcher stopping cleanly leaves at once.
SELECT leave_dispatchers(%(name)s::text)

-- name: take_duty_lease
-- Take or renew the lease on a global duty; whether this owner holds it.
SELECT take_duty_lease(%(duty)s::text, %(owner)s::text, %(ttl_s)s::real) AS held

-- name: shard_owners
-- Every shard's lease holder (NULL when free or expired by `now`, the
-- database's clock as the store read it: on Citus this read runs on the
-- workers) and epoch.
SELECT shard, CASE WHEN lease_expires_at > %(now)s::timestamptz THEN owner END AS owner, epoch FROM shards ORDER BY shard

-- name: set_worker_token
-- Create a worker credential, or replace its token's hash (rotation).
-- (The time as a value, not now() in DO UPDATE: Citus evaluates nothing over a row there.)
INSERT INTO worker_tokens (name, token_hash, created_at) VALUES (%(name)s, %(token_hash)s, now())
ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, created_at = excluded.created_at
RETURNING name

-- name: worker_by_token
-- The worker credential whose token has this hash.
SELECT name FROM worker_tokens WHERE token_hash = %(token_hash)s

-- ---------------------------------------------------------------- series
-- Repeating jobs (sql/functions/series.sql).

-- name: db_now
-- The database's clock (mh_now(): pinned in tests), from which fire times are computed.
SELECT mh_now() AS now

-- name: submit_series
-- A repeating job: its series and first run; the series id, the run's id and run time, whether created.
SELECT series_id, job_id, run_at, created
  FROM submit_series(%(team)s::text, %(name)s::text, %(due_at)s::timestamptz, %(payload)s::jsonb,
                     %(priority)s::int, %(max_attempts)s::int, %(flex_s)s::int, %(strict)s::boolean,
                     %(idempotency_key)s::text, %(backoff_base_s)s::real, %(backoff_cap_s)s::real,
                     %(every_s)s::int, %(cron)s::text, %(timezone)s::text, %(first_due_at)s::timestamptz,
                     %(misfire)s::text, %(deadline)s::timestamptz)

-- name: series_to_chain
-- The series of these shards marked for their next run, with their specs and the database's clock.
SELECT * FROM series_to_chain(%(shards)s::int[], %(limit)s::int)

-- name: chain_series
-- Their next runs, as computed, on one shard: the runs created.
SELECT * FROM chain_series(%(shard)s::int, %(series)s::bigint[], %(after)s::timestamptz[],
                           %(due)s::timestamptz[], %(deadline)s::timestamptz[])

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

-- ---------------------------------------------------------------- the local demo (minutehand dev)

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

-- name: requeue_job
-- Put one dead job of a team back on the wheel (sql/functions/dead.sql).
SELECT job_id, ok, state, reason FROM requeue_job(%(job_id)s::bigint, %(team)s::text, %(max_attempts)s::int)

-- name: discard_job
-- Set one dead job of a team aside for good (state discarded).
SELECT job_id, ok, state, reason FROM discard_job(%(job_id)s::bigint, %(team)s::text)

-- name: requeue_dead
-- Requeue a team's dead jobs of one name, shard by shard, at most `limit`.
SELECT requeued AS settled, more FROM requeue_dead(%(team)s::text, %(name)s::text, %(max_attempts)s::int, %(limit)s::int)

-- name: discard_dead
-- Discard a team's dead jobs of one name, shard by shard, at most `limit`.
SELECT discarded AS settled, more FROM discard_dead(%(team)s::text, %(name)s::text, %(limit)s::int)

-- name: team_events
-- One page of a team's events after the position (xid, id): keyset on
-- job_events_feed, only events no running transaction can still precede.
SELECT e.id, e.xid::text AS xid, e.kind, e.job_id, e.name, e.attempts, e.max_attempts, e.error, e.at
  FROM mh_events_after((SELECT t.id FROM teams t WHERE t.name = %(team)s::text),
                       %(xid)s::text::xid8, %(after)s::bigint, %(limit)s::int) e

-- name: purge_events
-- Drop one shard's events past their retention.
SELECT purge_events(%(shard)s::int) AS purged

-- name: purge_deliveries
-- Drop webhook delivery attempts past their retention.
SELECT purge_deliveries() AS purged

-- name: set_webhook
-- Set a team's webhook URL and secret (its delivery position kept, or, for
-- a new one, the start of the retained events); no row if no such team.
INSERT INTO webhooks AS w (team_id, url, secret, updated_at)
SELECT t.id, %(url)s::text, %(secret)s::text, mh_now() FROM teams t WHERE t.name = %(team)s::text
ON CONFLICT (team_id) DO UPDATE SET url = excluded.url, secret = excluded.secret, failures = 0,
                                    next_attempt_at = NULL, updated_at = excluded.updated_at
RETURNING w.url, w.updated_at

-- name: webhook
-- A team's webhook and its delivery state; no row if it has none.
SELECT w.url, w.failures, w.next_attempt_at, w.updated_at
  FROM webhooks w JOIN teams t ON t.id = w.team_id WHERE t.name = %(team)s::text

-- name: delete_webhook
-- Remove a team's webhook; whether it had one.
DELETE FROM webhooks w USING teams t WHERE t.id = w.team_id AND t.name = %(team)s::text RETURNING w.team_id

-- name: webhook_deliveries
-- A team's newest delivery attempts, newest first.
SELECT d.at, d.url, d.events, d.first_event, d.last_event, d.attempt, d.status_code, d.error, d.duration_ms
  FROM webhook_deliveries d JOIN teams t ON t.id = d.team_id
 WHERE t.name = %(team)s::text
 ORDER BY d.id DESC
 LIMIT %(limit)s::int

-- name: webhooks_due
-- Webhooks not backing off, with their team, position and next events (at
-- most `batch` each, as JSON), those with events to deliver only; the
-- least recently attempted first, so that no team waits behind others'
-- backlogs.
SELECT w.team_id, t.name AS team, w.url, w.secret, w.delivered_xid::text AS from_xid, w.delivered_id AS from_id,
       w.failures, e.events
  FROM webhooks w JOIN teams t ON t.id = w.team_id
 CROSS JOIN LATERAL (
       SELECT json_agg(json_build_object('id', x.id, 'xid', x.xid::text, 'kind', x.kind, 'job_id', x.job_id,
                                         'name', x.name, 'attempts', x.attempts, 'max_attempts', x.max_attempts,
                                         'error', x.error, 'at', x.at) ORDER BY x.xid, x.id) AS events
         FROM mh_events_after(w.team_id, w.delivered_xid, w.delivered_id, %(batch)s::int) x) e
 WHERE (w.next_attempt_at IS NULL OR w.next_attempt_at <= mh_now()) AND e.events IS NOT NULL
 ORDER BY w.updated_at, w.team_id
 LIMIT %(limit)s::int

-- name: record_delivery
-- A delivery attempt's result; whether the webhook's position was still the one read.
SELECT record_delivery(%(team_id)s::int, %(url)s::text, %(from_xid)s::text::xid8, %(from_id)s::bigint,
                       %(xid)s::text::xid8, %(id)s::bigint, %(events)s::int, %(first)s::bigint,
                       %(attempt)s::int, %(status)s::int, %(error)s::text, %(duration_ms)s::int,
                       %(ok)s::boolean, %(retry_s)s::real) AS current

-- name: no_parallel_workers
-- In this transaction only: plans without parallel workers.
SET LOCAL max_parallel_workers_per_gather = 0

-- name: metrics_clock
-- Where the Prometheus exposition (app/minutehand/api/metrics.py) divides team_stats
-- into rows it has added up once and rows it reads on every refresh (line):
-- the hour two hours back. On an hour boundary, so a minute row and the hour
-- row roll_up_stats folds it into lie on the same side; purge_stats folds
-- what it drops into a row below it (stripe -2). Rows below it change only
-- by a transaction that began before it (mh_now() is a transaction's start).
-- And the minute slots of now and the next minute, for metrics_due_depth (as
-- parameters there, so the plan names their partitions only: mh_now() is
-- volatile, which no partition pruning takes).
SELECT mh_hour(n) - interval '2 hours' AS line, mh_minute_slot(n) AS current_slot,
       mh_minute_slot(n + interval '1 minute') AS next_slot
  FROM (SELECT mh_now() AS n) now

-- name: metrics_job_totals
-- The counters of team_stats added up per team and job name over the rows
-- with since <= minute < until (NULL: unbounded): every row, whatever its
-- grain (minute, hour, purged). With since set, a range of team_stats_minute.
SELECT t.name AS team, s.name, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
       sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
       sum(s.cancelled)::bigint AS cancelled,
       mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist, mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
  FROM team_stats s JOIN teams t ON t.id = s.team_id
 WHERE s.minute >= coalesce(%(since)s::timestamptz, '-infinity')
   AND s.minute < coalesce(%(until)s::timestamptz, 'infinity')
 GROUP BY t.name, s.name

-- name: metrics_running
-- Every team's quota and its jobs claimed and not finished now (team_running:
-- a row per shard and team).
SELECT t.name AS team, t.quota, coalesce(r.running, 0)::bigint AS running
  FROM teams t
  LEFT JOIN (SELECT team_id, sum(running) AS running FROM team_running GROUP BY team_id) r ON r.team_id = t.id

-- name: metrics_due_depth
-- How many jobs wait on the wheel: counted exactly in the current and the
-- next minute bucket (their slots from metrics_clock; two partitions, the
-- ones the dispatchers read), and
-- estimated for each whole level from the planner's statistics
-- (pg_class.reltuples as of autovacuum's last ANALYZE of each partition;
-- never analysed or just truncated: 0), so no read of the pending set.
SELECT (SELECT count(*) FROM due_minutes d WHERE d.slot = %(current_slot)s::smallint) AS current_minute,
       (SELECT count(*) FROM due_minutes d WHERE d.slot = %(next_slot)s::smallint) AS next_minute,
       e.minutes, e.hours, e.far
  FROM mh_wheel_estimates() e

-- ---------------------------------------------------------------- the admin UI: jobs, dead jobs, series
-- Its job search is list_jobs (a bounded window of one team's jobs), its
-- series pages series_detail, series_runs and list_series; what follows is
-- only what the API has no statement for. Each reads O(page) rows whatever
-- the number of jobs stored (tests/test_admin_explain.py).

-- name: admin_job
-- The whole record of one job: one primary-key lookup (shard from the id);
-- no row for another team's job (team NULL: any). Payload and result come
-- as pretty JSON cut to `cap` characters, with their full size, so a large
-- one is never decoded whole; lateness as job_status reckons it (by `now`).
SELECT j.id AS job_id, t.name AS team, j.name, j.state::text AS state, j.priority, j.due_at, j.flex_s,
       j.strict, j.agreed_at, j.run_at, j.deadline, j.attempts, j.max_attempts, j.backoff_base_s,
       j.backoff_cap_s, j.claimed_by, j.claim_expires_at, j.idempotency_key, j.series_id,
       CASE WHEN j.lateness IS NOT NULL THEN j.lateness
            WHEN j.state IN ('scheduled', 'retrying', 'claimed') AND %(now)s::timestamptz > j.agreed_at
            THEN %(now)s::timestamptz - j.agreed_at END AS lateness,
       j.lateness IS NOT NULL AS lateness_final, j.last_error,
       left(jsonb_pretty(j.payload), %(cap)s::int) AS payload, octet_length(j.payload::text) AS payload_bytes,
       left(jsonb_pretty(j.result), %(cap)s::int) AS result, octet_length(j.result::text) AS result_bytes,
       j.created_at, j.claimed_at, j.started_at, j.finished_at, j.updated_at, j.requeued_at
  FROM jobs j JOIN teams t ON t.id = j.team_id
 WHERE j.shard = mh_shard_of(%(job_id)s::bigint) AND j.id = %(job_id)s::bigint
   AND (%(team)s::text IS NULL OR t.name = %(team)s::text)

-- name: admin_job_attempts
-- One job's attempts that ended without success (newest first, at most
-- `limit`): job_attempts' primary key, on its shard.
SELECT a.attempt, a.ended_at, a.worker, a.claimed_at, a.started_at, a.outcome::text AS outcome, a.error
  FROM job_attempts a
 WHERE a.shard = mh_shard_of(%(job_id)s::bigint) AND a.job_id = %(job_id)s::bigint
 ORDER BY a.attempt DESC, a.ended_at DESC
 LIMIT %(limit)s::int

-- name: admin_job_events
-- The times one job became dead (newest first, at most `limit`), with the
-- attempts it had had and the error then: job_events_job, on its shard.
SELECT e.at, e.attempts, e.max_attempts, e.error
  FROM job_events e
 WHERE e.shard = mh_shard_of(%(job_id)s::bigint) AND e.job_id = %(job_id)s::bigint
 ORDER BY e.at DESC
 LIMIT %(limit)s::int

-- The three dead-jobs reads take the team's id as a value (admin_team_id),
-- so the planner sees whose letters it reads, and are sent unprepared
-- (Store.dead_jobs, dead_names), so each is planned with its values: how
-- many dead jobs a team has of a name ranges from none to a whole backlog,
-- and a plan made for an average team (a generic plan) could read a
-- backlog whole. And they run with bitmap scans off (admin_index_order): a
-- bitmap scan reads its whole index range before a LIMIT applies, so
-- counting a backlog of 50,000 dead jobs up to 1,000 would read all 50,000;
-- a plain index scan stops at the LIMIT.

-- name: admin_index_order
-- For the rest of this transaction: no bitmap scans (reads stop at their LIMIT).
SELECT set_config('enable_bitmapscan', 'off', true)

-- name: admin_dead_jobs
-- One page of a team's dead jobs of every name, by (name, id) after the
-- keyset (after_name, after_id): the page read from dead_jobs_by_team in
-- its order (the shard is read from the id), then each job's record by its
-- primary key for its last error.
SELECT d.job_id, d.name, j.attempts, j.max_attempts, j.last_error, j.finished_at, j.created_at, j.requeued_at
  FROM (SELECT d.name, d.job_id FROM dead_jobs d
         WHERE d.team_id = %(team_id)s::int
           AND (d.name, d.job_id) > (%(after_name)s::text, %(after_id)s::bigint)
         ORDER BY d.name, d.job_id
         LIMIT %(limit)s::int) d
  JOIN jobs j ON j.shard = mh_shard_of(d.job_id) AND j.id = d.job_id
 ORDER BY d.name, d.job_id

-- name: admin_dead_jobs_of_name
-- The same for one name (a statement of its own: the index range starts
-- and stops at that name).
SELECT d.job_id, d.name, j.attempts, j.max_attempts, j.last_error, j.finished_at, j.created_at, j.requeued_at
  FROM (SELECT d.name, d.job_id FROM dead_jobs d
         WHERE d.team_id = %(team_id)s::int AND d.name = %(name)s::text AND d.job_id > %(after_id)s::bigint
         ORDER BY d.name, d.job_id
         LIMIT %(limit)s::int) d
  JOIN jobs j ON j.shard = mh_shard_of(d.job_id) AND j.id = d.job_id
 ORDER BY d.job_id

-- name: admin_dead_names
-- The names a team has dead jobs of (the first `names` in order), each
-- with its count up to `cap`: a skip scan of dead_jobs_by_team, one probe
-- per name (sql/functions/dead.sql).
SELECT n.name, n.dead FROM dead_names(%(team_id)s::int, %(names)s::int, %(cap)s::int) n

-- name: admin_series_team
-- The team of a series (an administrator acts through it): its primary key.
SELECT t.name AS team FROM series s JOIN teams t ON t.id = s.team_id
 WHERE s.shard = mh_shard_of(%(series_id)s::bigint) AND s.id = %(series_id)s::bigint

-- ---------------------------------------------------------------- the admin UI
-- app/minutehand/admin/: its sessions and audit log (sql/tables/admin.sql) and what its
-- pages read. Every read is bounded by the page, the clock or the number of
-- teams and shards, never by the number of jobs (tests/test_admin_plans.py).

-- name: admin_session_create
-- A browser signed in: the hash of its session id, its team (NULL: the
-- admin; a team that does not exist: no session), the hash of the token it
-- signed in with, its CSRF token; it lasts ttl_s.
INSERT INTO admin_sessions (id_hash, team_id, token_hash, csrf, created_at, expires_at)
SELECT %(id_hash)s::text, t.id, %(token_hash)s::text, %(csrf)s::text, mh_now(),
       mh_now() + make_interval(secs => %(ttl_s)s::float8)
  FROM (SELECT 1) one LEFT JOIN teams t ON t.name = %(team)s::text
 WHERE %(team)s::text IS NULL OR t.id IS NOT NULL

-- name: admin_session
-- A live session: its team (NULL: the admin), the hash of its token, its
-- CSRF token. No row: none, expired, or its team's token was rotated since.
SELECT t.name AS team, s.team_id, s.token_hash, s.csrf
  FROM admin_sessions s LEFT JOIN teams t ON t.id = s.team_id
 WHERE s.id_hash = %(id_hash)s::text AND s.expires_at > mh_now()
   AND (s.team_id IS NULL OR t.token_hash = s.token_hash)

-- name: admin_session_end
-- Sign out: the session is gone.
DELETE FROM admin_sessions WHERE id_hash = %(id_hash)s::text RETURNING id_hash

-- name: admin_sessions_purge
-- Drop up to `limit` expired sessions, the oldest first (at each sign-in):
-- found through admin_sessions_expiry, deleted by key.
DELETE FROM admin_sessions
 WHERE id_hash = ANY (ARRAY(SELECT s.id_hash FROM admin_sessions s WHERE s.expires_at <= mh_now()
                              ORDER BY s.expires_at LIMIT %(limit)s::int))

-- name: admin_audit_add
-- Record one action taken through the admin UI; the entry's id. Its team's
-- id joined, not read by a subquery in VALUES (Citus refuses that).
INSERT INTO admin_audit (at, actor, token_ref, team_id, action, target, ok, detail)
SELECT mh_now(), %(actor)s::text, %(token_ref)s::text, t.id,
       %(action)s::text, %(target)s::text, %(ok)s::boolean, %(detail)s::jsonb
  FROM (SELECT 1) one LEFT JOIN teams t ON t.name = %(team)s::text
RETURNING id

-- name: admin_audit_page
-- Every audit entry with id < before (NULL: from the newest), newest first: keyset on the primary key.
SELECT a.id, a.at, a.actor, a.token_ref, t.name AS team, a.action, a.target, a.ok, a.detail
  FROM admin_audit a LEFT JOIN teams t ON t.id = a.team_id
 WHERE a.id < coalesce(%(before)s::bigint, 9223372036854775807)
 ORDER BY a.id DESC
 LIMIT %(limit)s::int

-- name: admin_team_id
-- A team's id (no row: no such team).
SELECT t.id FROM teams t WHERE t.name = %(team)s::text

-- name: admin_audit_team_page
-- One team's audit entries (by its id, admin_team_id) with id < before,
-- newest first: keyset on admin_audit_team (or on the primary key, filtered,
-- when the team's entries are dense; the planner weighs the two).
SELECT a.id, a.at, a.actor, a.token_ref, %(team)s::text AS team, a.action, a.target, a.ok, a.detail
  FROM admin_audit a
 WHERE a.team_id = %(team_id)s::int
   AND a.id < coalesce(%(before)s::bigint, 9223372036854775807)
 ORDER BY a.id DESC
 LIMIT %(limit)s::int

-- name: admin_now
-- The database's clock (tests pin it).
SELECT mh_now() AS now

-- name: admin_minutes
-- The last hour minute by minute, the whole fleet: the counters of
-- team_stats's minute rows (the roll-up leaves the last hour as minutes),
-- through team_stats_unrolled; O(teams x names x stripes x 60), never the jobs.
SELECT s.minute, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
       sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
       mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist
  FROM team_stats s
 WHERE s.minute >= mh_minute(mh_now()) - interval '59 minutes' AND s.stripe >= 0
 GROUP BY s.minute
 ORDER BY s.minute

-- name: admin_team_minutes
-- The same for one team, through its primary key (team_id, minute, ...).
-- No condition on the stripe: hour rows (stripe -1) lie more than an hour
-- back, and one would steer the plan to team_stats_unrolled, every team's.
SELECT s.minute, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
       sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
       mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist
  FROM team_stats s
 WHERE s.team_id = (SELECT t.id FROM teams t WHERE t.name = %(team)s::text)
   AND s.minute >= mh_minute(mh_now()) - interval '59 minutes'
 GROUP BY s.minute
 ORDER BY s.minute

-- name: admin_planned_minutes
-- Jobs planned per run minute (load_minutes: every job placed adds 1 to its
-- run minute; approximate, never decremented) from an hour back to 24 hours
-- ahead: a range of its primary key, at most 16 stripes per minute.
SELECT l.minute, sum(l.jobs)::bigint AS jobs
  FROM load_minutes l
 WHERE l.minute >= mh_minute(mh_now()) - interval '60 minutes'
   AND l.minute < mh_minute(mh_now()) + interval '24 hours'
 GROUP BY l.minute
 ORDER BY l.minute

-- name: admin_shards
-- Every shard: its lease holder (NULL when free or expired by `now`, the
-- database's clock as the store read it: on Citus this read runs on the
-- workers), the lease's expiry, its fencing epoch and the wheel's hand on
-- it (256 rows).
SELECT s.shard, CASE WHEN s.lease_expires_at > %(now)s::timestamptz THEN s.owner END AS owner, s.owner AS last_owner,
       s.lease_expires_at, s.epoch, s.hand
  FROM shards s
 ORDER BY s.shard

-- name: admin_dispatchers
-- The dispatchers that renewed their membership, and the duties' holders.
SELECT d.name, d.expires_at, d.expires_at > mh_now() AS live,
       (SELECT array_agg(l.duty ORDER BY l.duty) FROM duty_leases l
         WHERE l.owner = d.name AND l.expires_at > mh_now()) AS duties
  FROM dispatchers d
 ORDER BY d.name

-- name: admin_workers
-- Workers seen recently: the jobs of the latest claim reminders
-- (claim_checks, filed by each claim and each renewal) of every shard,
-- at most `per_shard` reminders a shard and `per_claim` jobs a reminder,
-- read by primary key and grouped by the worker that claimed them:
-- bounded by 256 x per_shard x per_claim, never a scan of jobs. `now`: the
-- database's clock as the store read it (on Citus this read runs on the workers).
WITH checks AS (
    SELECT c.shard, c.job_ids[1:%(per_claim)s::int] AS job_ids
      FROM shards s
     CROSS JOIN LATERAL (SELECT k.shard, k.job_ids FROM claim_checks k
                          WHERE k.shard = s.shard AND k.check_at >= %(now)s::timestamptz - interval '10 minutes'
                          ORDER BY k.check_at DESC LIMIT %(per_shard)s::int) c),
claimed AS (SELECT DISTINCT c.shard, u.id FROM checks c CROSS JOIN LATERAL unnest(c.job_ids) u(id))
SELECT j.claimed_by AS worker, count(*) FILTER (WHERE j.state = 'running') AS running,
       count(*) FILTER (WHERE j.state = 'claimed') AS claimed, max(j.updated_at) AS last_seen,
       (array_agg(j.id ORDER BY j.updated_at DESC))[1:5] AS job_ids
  FROM claimed c JOIN jobs j ON j.shard = c.shard AND j.id = c.id
 WHERE j.state IN ('claimed', 'running') AND j.claimed_by IS NOT NULL
 GROUP BY j.claimed_by
 ORDER BY last_seen DESC, worker
 LIMIT %(limit)s::int

