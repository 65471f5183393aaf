-- Revision 0024, frozen: the type submit_jobs hands its keyless jobs to
-- mh_write_jobs in (worked out first, then written from an array).
CREATE TYPE new_job AS (shard smallint, id bigint, name text, payload jsonb, priority int, due_at timestamptz,
                        flex_s int, strict boolean, run_at timestamptz, max_attempts int, backoff_base_s real,
                        backoff_cap_s real, traceparent text);
