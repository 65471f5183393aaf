-- What is reported of claimed jobs, and a cancel (app/minutehand/store/outcomes.py;
-- sql/functions/outcomes.sql).

-- name: start_many
-- Mark claimed jobs as started (records lateness).
SELECT job_id, ok, state, reason FROM start_many(%(ids)s::bigint[], %(tokens)s::uuid[])

-- name: heartbeat_many
-- Extend the claims of running jobs.
SELECT job_id, ok, state, reason FROM heartbeat_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(extend_s)s::real)

-- name: complete_many
-- Close jobs as succeeded, storing results (and under idempotency keys).
SELECT job_id, ok, state, reason FROM complete_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[])

-- name: record_results
-- Record keyed jobs' results under their idempotency keys, whatever their claims (the first stays).
SELECT job_id, ok, result, reason FROM record_results(%(ids)s::bigint[], %(results)s::jsonb[])

-- name: fail_many
-- Report failures: retry after backoff, or dead.
SELECT job_id, ok, state, reason FROM fail_many(%(ids)s::bigint[], %(tokens)s::uuid[], %(errors)s::text[], %(retryable)s::boolean[])

-- name: cancel
-- Cancel a job that has not started (a claimed one: requested of its worker); team NULL acts for every team.
SELECT job_id, ok, state, reason FROM cancel(%(job_id)s::bigint, %(team)s::text)

-- name: release_many
-- Give back claimed jobs that were not started (due again at once, the attempt not counted).
SELECT job_id, ok, state, reason FROM release_many(%(ids)s::bigint[], %(tokens)s::uuid[])
