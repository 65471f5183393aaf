-- Revision 0015, frozen: attempts that ended without success, one row each.
CREATE TABLE job_attempts (
    shard      smallint    NOT NULL,
    job_id     bigint      NOT NULL,
    attempt    int         NOT NULL,
    ended_at   timestamptz NOT NULL,
    worker     text,
    claimed_at timestamptz,
    started_at timestamptz,
    outcome    job_state   NOT NULL,
    error      text,
    PRIMARY KEY (shard, job_id, attempt, ended_at)
);
