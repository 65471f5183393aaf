-- Revision 0010, frozen: admission control. Per-team submission rate limits
-- and pending ceilings (columns of teams), token buckets, and the count of
-- jobs submitted and not finished per team, started from the jobs there are.
ALTER TABLE teams
    ADD COLUMN submit_rate float8 CONSTRAINT teams_submit_rate_check CHECK (submit_rate > 0 AND submit_rate <= 1000000),
    ADD COLUMN submit_burst int CONSTRAINT teams_submit_burst_check CHECK (submit_burst > 0),
    ADD COLUMN max_pending int CONSTRAINT teams_max_pending_check CHECK (max_pending > 0),
    ADD CONSTRAINT teams_submit_limit_check CHECK ((submit_rate IS NULL) = (submit_burst IS NULL));
CREATE TABLE team_buckets (
    team_id      int         PRIMARY KEY,
    tokens       float8      NOT NULL,
    refilled_at  timestamptz NOT NULL
);
CREATE TABLE team_pending (
    team_id  int      NOT NULL,
    stripe   smallint NOT NULL,
    pending  bigint   NOT NULL,
    PRIMARY KEY (team_id, stripe)
);
-- The jobs not finished when the count starts (once: a scan of jobs), on the
-- submission stripes as mh_add_stats would have added them. Jobs submitted
-- while this runs wait for it (the lock below), so none is missed or counted twice.
LOCK TABLE jobs IN SHARE MODE;
INSERT INTO team_pending (team_id, stripe, pending)
SELECT j.team_id, j.shard % 16, count(*)
  FROM jobs j
 WHERE j.state NOT IN ('succeeded', 'dead', 'cancelled')
 GROUP BY j.team_id, j.shard % 16;
