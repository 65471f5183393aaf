-- Retention of finished jobs (sql/functions/retention.sql). Both tables are
-- distributed by shard on Citus, colocated with jobs.

-- How far the walk over a shard's jobs has come: every job with a smaller
-- id was visited once, and was removed or filed in retention_checks.
CREATE TABLE retention_marks (
    shard     smallint NOT NULL PRIMARY KEY,
    walked_to bigint   NOT NULL
);

-- Jobs the walk passed that could not be removed yet (not finished, their
-- team keeps jobs longer than the shortest retention, or their idempotency
-- key still names them): looked at again at check_at, the earliest time
-- they could be removed. Few: far-future, retrying and long-kept jobs.
CREATE TABLE retention_checks (
    shard    smallint    NOT NULL,
    job_id   bigint      NOT NULL,
    check_at timestamptz NOT NULL,
    PRIMARY KEY (shard, job_id)
);
CREATE INDEX retention_checks_due ON retention_checks (shard, check_at);
