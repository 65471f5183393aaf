-- Dead jobs put back or set aside, a team's events, its webhook
-- (app/minutehand/store/dead.py; sql/functions/dead.sql).

-- name: requeue_job
-- Put one dead job of a team back on the wheel (sql/functions/dead.sql).
SELECT job_id, ok, state, reason FROM requeue_job(%(job_id)s::bigint, %(team)s::text, %(max_attempts)s::int)

-- name: discard_job
-- Set one dead job of a team aside for good (state discarded).
SELECT job_id, ok, state, reason FROM discard_job(%(job_id)s::bigint, %(team)s::text)

-- name: requeue_dead
-- Requeue a team's dead jobs of one name, shard by shard, at most `limit`.
SELECT requeued AS settled, more FROM requeue_dead(%(team)s::text, %(name)s::text, %(max_attempts)s::int, %(limit)s::int)

-- name: dead_count
-- How many dead jobs of a team and name a requeue of at most `limit` would put back.
SELECT dead_count(%(team)s::text, %(name)s::text, %(limit)s::int, %(max_attempts)s::int) AS count

-- name: discard_dead
-- Discard a team's dead jobs of one name, shard by shard, at most `limit`.
SELECT discarded AS settled, more FROM discard_dead(%(team)s::text, %(name)s::text, %(limit)s::int)

-- name: team_events
-- One page of a team's events after the position (xid, id): keyset on
-- job_events_feed, only events no running transaction can still precede.
SELECT e.id, e.xid::text AS xid, e.kind, e.job_id, e.name, e.attempts, e.max_attempts, e.error, e.at
  FROM mh_events_after((SELECT t.id FROM teams t WHERE t.name = %(team)s::text),
                       %(xid)s::text::xid8, %(after)s::bigint, %(limit)s::int) e

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
-- most `batch` each, as JSON), those with events to deliver only, but not
-- the teams in `busy` (a delivery of theirs is still in flight); the least
-- recently attempted first, so that no team waits behind others' backlogs.
SELECT w.team_id, t.name AS team, w.url, w.secret, w.delivered_xid::text AS from_xid, w.delivered_id AS from_id,
       w.failures, e.events
  FROM webhooks w JOIN teams t ON t.id = w.team_id
 CROSS JOIN LATERAL (
       SELECT json_agg(json_build_object('id', x.id, 'xid', x.xid::text, 'kind', x.kind, 'job_id', x.job_id,
                                         'name', x.name, 'attempts', x.attempts, 'max_attempts', x.max_attempts,
                                         'error', x.error, 'at', x.at) ORDER BY x.xid, x.id) AS events
         FROM mh_events_after(w.team_id, w.delivered_xid, w.delivered_id, %(batch)s::int) x) e
 WHERE (w.next_attempt_at IS NULL OR w.next_attempt_at <= mh_now()) AND e.events IS NOT NULL
   AND w.team_id <> ALL (%(busy)s::int[])
 ORDER BY w.updated_at, w.team_id
 LIMIT %(limit)s::int

-- name: record_delivery
-- A delivery attempt's result; whether the webhook's position was still the one read.
SELECT record_delivery(%(team_id)s::int, %(url)s::text, %(from_xid)s::text::xid8, %(from_id)s::bigint,
                       %(xid)s::text::xid8, %(id)s::bigint, %(events)s::int, %(first)s::bigint,
                       %(attempt)s::int, %(status)s::int, %(error)s::text, %(duration_ms)s::int,
                       %(ok)s::boolean, %(retry_s)s::real) AS current
