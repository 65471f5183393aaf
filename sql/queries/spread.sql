-- Default flex windows (app/minutehand/store/spread.py; sql/functions/spread.sql).

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
