-- Submission (app/minutehand/store/submit.py): one job, a batch, a repeating
-- job with its first run (sql/functions/submit.sql, series.sql).

-- name: submit_job
-- One job: its id, assigned run time, and whether it was created.
SELECT job_id, run_at, created
  FROM submit_job_detail(%(team)s::text, %(name)s::text, %(due_at)s::timestamptz, %(payload)s::jsonb,
                         %(priority)s::int, %(max_attempts)s::int, %(flex_s)s::int, %(strict)s::boolean,
                         %(idempotency_key)s::text, %(backoff_base_s)s::real, %(backoff_cap_s)s::real,
                         %(traceparent)s::text)

-- name: submit_jobs
-- Many jobs of one team, as parallel arrays; one row per item. `shards`:
-- where the keyless ones may go (NULL: the procedure's choice).
SELECT idx, job_id, run_at, created, error
  FROM submit_jobs(%(team)s::text, %(names)s::text[], %(due_ats)s::timestamptz[], %(payloads)s::jsonb[],
                   %(priorities)s::int[], %(max_attempts)s::int[], %(flex_s)s::int[], %(stricts)s::boolean[],
                   %(keys)s::text[], %(backoff_base_s)s::real[], %(backoff_cap_s)s::real[],
                   %(traceparents)s::text[], %(shards)s::smallint[])

-- name: key_shards
-- The shard of each idempotency key of a team (mh_key_shard), in order: the
-- store sends a batch's keyed jobs to their Citus shards, one call each.
SELECT mh_key_shard(mh_team_id(%(team)s::text), u.key) AS shard
  FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS u(key, o)
 ORDER BY u.o

-- name: submit_series
-- A repeating job: its series and first run; the series id, the run's id and run time, whether created.
SELECT series_id, job_id, run_at, created
  FROM submit_series(%(team)s::text, %(name)s::text, %(due_at)s::timestamptz, %(payload)s::jsonb,
                     %(priority)s::int, %(max_attempts)s::int, %(flex_s)s::int, %(strict)s::boolean,
                     %(idempotency_key)s::text, %(backoff_base_s)s::real, %(backoff_cap_s)s::real,
                     %(every_s)s::int, %(cron)s::text, %(timezone)s::text, %(first_due_at)s::timestamptz,
                     %(misfire)s::text, %(deadline)s::timestamptz, %(traceparent)s::text)
