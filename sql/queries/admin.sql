-- The admin UI's statements (app/minutehand/store/admin.py).

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
       j.created_at, j.claimed_at, j.started_at, j.finished_at, j.updated_at, j.requeued_at,
       j.cancel_requested_at
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
-- through team_stats_unrolled; O(teams x names x stripes x 60), never the jobs
-- (names: at most mh_stats_names() + 1 per team, whatever names it uses).
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
-- ahead: a range of its primary key, every team's rows of a minute summed
-- (a row per team and stripe that planned a job in it).
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
