-- Submission inside the caller's own transaction (app/minutehand/client/tx.py),
-- on the caller's connection: its search path is the caller's, so every name
-- is qualified. Payloads come as JSON text.

-- name: client_submit_job
-- One job: its id, assigned run time, and whether it was created.
SELECT job_id, run_at, created
  FROM minutehand.submit_job_detail(%(team)s::text, %(name)s::text, %(due_at)s::timestamptz,
                                    %(payload)s::text::jsonb, %(priority)s::int, %(max_attempts)s::int,
                                    %(flex_s)s::int, %(strict)s::boolean, %(idempotency_key)s::text,
                                    %(backoff_base_s)s::real, %(backoff_cap_s)s::real, %(traceparent)s::text)

-- name: client_submit_jobs
-- Many jobs of one team, as parallel arrays; one row per item.
SELECT idx, job_id, run_at, created, error
  FROM minutehand.submit_jobs(%(team)s::text, %(names)s::text[], %(due_ats)s::timestamptz[],
                              %(payloads)s::text[]::jsonb[], %(priorities)s::int[], %(max_attempts)s::int[],
                              %(flex_s)s::int[], %(stricts)s::boolean[], %(keys)s::text[],
                              %(backoff_base_s)s::real[], %(backoff_cap_s)s::real[], %(traceparents)s::text[])
