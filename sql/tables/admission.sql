-- Admission control (sql/functions/admission.sql): what a submission through
-- the API is checked against before anything is written. The limits are
-- columns of teams; these tables hold what changes with every submission.

-- A team's token bucket: tokens left at refilled_at. Refilled at the team's
-- submit_rate up to its submit_burst when next read, so an idle team costs
-- nothing; a team without a rate limit has no row. Taken in a short
-- transaction of its own, never inside the submission's, so the row is
-- locked for one statement and not for a commit of jobs.
CREATE TABLE team_buckets (
    team_id      int         PRIMARY KEY,
    tokens       float8      NOT NULL,
    refilled_at  timestamptz NOT NULL
);

-- Jobs submitted and not yet finished (waiting, claimed, running or due
-- for a retry), per team and stripe: what the pending ceiling is checked
-- against, read as the sum of a team's rows (at most 32). Kept by
-- mh_add_stats from the same events and stripes as team_stats (submissions
-- add on stripes 0..15, succeeded, dead and cancelled subtract on 16..31),
-- in their transactions, so it is exact and a submitter never waits for a
-- finisher's row.
CREATE TABLE team_pending (
    team_id  int      NOT NULL,
    stripe   smallint NOT NULL,
    pending  bigint   NOT NULL,
    PRIMARY KEY (team_id, stripe)
);
