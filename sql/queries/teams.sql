-- Teams: their settings, admission (sql/functions/admission.sql) and
-- tokens, and the workers' tokens (app/minutehand/store/teams.py).

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

-- name: hold_pending
-- The pending ceiling checked again in the transaction that writes the jobs,
-- under the team's lock until it commits (sql/functions/admission.sql).
SELECT admitted, pending, ceiling FROM mh_hold_pending(%(team)s::text, %(jobs)s::int, %(default_ceiling)s::int)

-- name: team_exists
-- Whether a team of this name exists.
SELECT EXISTS (SELECT 1 FROM teams WHERE name = %(name)s) AS exists

-- name: team_by_token
-- The team whose bearer token has this hash (API authentication).
SELECT name FROM teams WHERE token_hash = %(token_hash)s

-- name: set_team_token
-- Replace a team's token hash (rotation); no row if there is no such team.
UPDATE teams SET token_hash = %(token_hash)s WHERE name = %(name)s RETURNING id

-- name: set_worker_token
-- Create a worker credential, or replace its token's hash (rotation).
-- (The time as a value, not now() in DO UPDATE: Citus evaluates nothing over a row there.)
INSERT INTO worker_tokens (name, token_hash, created_at) VALUES (%(name)s, %(token_hash)s, now())
ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, created_at = excluded.created_at
RETURNING name

-- name: worker_by_token
-- The worker credential whose token has this hash.
SELECT name FROM worker_tokens WHERE token_hash = %(token_hash)s
