-- Revision 0007, frozen: the agreed run time of every job, and per-minute
-- counters per team and job name.
ALTER TABLE jobs ADD COLUMN agreed_at timestamptz;
-- run_at is still the agreed time unless the job was retried or its claim
-- expired (both move run_at); for those the earliest time it can have been
-- (exact for strict and zero-flex jobs, a lower bound for flexible ones).
UPDATE jobs SET agreed_at = CASE WHEN attempts > 1 OR (attempts >= 1 AND state IN ('scheduled', 'retrying'))
                                 THEN least(run_at, greatest(due_at, created_at)) ELSE run_at END;
ALTER TABLE jobs ALTER COLUMN agreed_at SET NOT NULL;

CREATE TABLE team_stats (
    minute         timestamptz NOT NULL,
    stripe         smallint    NOT NULL,
    team_id        int         NOT NULL,
    name           text        NOT NULL,
    submitted      bigint      NOT NULL,
    started        bigint      NOT NULL,
    succeeded      bigint      NOT NULL,
    failed         bigint      NOT NULL,
    dead           bigint      NOT NULL,
    cancelled      bigint      NOT NULL,
    lateness_hist  bigint[]    NOT NULL,
    runtime_hist   bigint[]    NOT NULL,
    PRIMARY KEY (team_id, minute, stripe, name)
);
CREATE INDEX team_stats_minute ON team_stats (minute);
CREATE INDEX team_stats_unrolled ON team_stats (minute) WHERE stripe >= 0;
CREATE TYPE stats_delta AS (stripe smallint, team_id int, name text, submitted int, started int, succeeded int,
                            failed int, dead int, cancelled int, lateness_s float8, runtime_s float8);
