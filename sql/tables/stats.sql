-- Counters per team and job name, kept in the transactions of the events
-- they count (submission, start, outcome, expiry, cancel), so they are exact
-- at any volume without reading jobs. One row per (minute, stripe, team,
-- name): a batch adds to its rows with one upsert. The name is one of the
-- team's first mh_stats_names() job names (team_stats_names), or '(other)'
-- for all its later names together, so every read is bounded by that cap
-- whatever names a team uses. Stripes keep concurrent
-- writers of one team and name apart:
--     0..15   submissions (shard % 16): a submit inside a caller's long
--             transaction holds only a submission row
--     16..31  starts and outcomes (16 + shard % 16)
--     -1      an hour row: maintenance (roll_up_stats) folds minute rows
--             older than an hour into one row per hour (minute = hour start)
--     -2      everything purged (minute -infinity): purge_stats adds what
--             it drops past retention here, so the whole table adds up to
--             the counts since the first event
-- Histograms count events per bucket of mh_stats_bounds(): lateness of
-- first starts (start - agreed_at), run time of finished jobs (finished_at -
-- started_at). Kept mh_stats_keep() (35 days).
CREATE TABLE team_stats (
    minute         timestamptz NOT NULL,
    stripe         smallint    NOT NULL,
    team_id        int         NOT NULL,
    name           text        NOT NULL,
    submitted      bigint      NOT NULL,
    started        bigint      NOT NULL,
    succeeded      bigint      NOT NULL,
    failed         bigint      NOT NULL,    -- failures that were retried
    dead           bigint      NOT NULL,
    cancelled      bigint      NOT NULL,
    lateness_hist  bigint[]    NOT NULL,
    runtime_hist   bigint[]    NOT NULL,
    PRIMARY KEY (team_id, minute, stripe, name)
);
-- The fleet view and retention read by time.
CREATE INDEX team_stats_minute ON team_stats (minute);
-- Minute rows only: what the roll-up has left to fold, found without
-- reading the hour rows.
CREATE INDEX team_stats_unrolled ON team_stats (minute) WHERE stripe >= 0;

-- The job names a team's counters keep apart: its first mh_stats_names(),
-- first come, registered by mh_add_stats as they are first counted, each in
-- the next slot (1, 2, ...: whether a team has room is one probe of its last
-- slot). A row is never removed: a name keeps its counters for good.
CREATE TABLE team_stats_names (
    team_id  int      NOT NULL,
    name     text     NOT NULL,
    slot     smallint NOT NULL,
    PRIMARY KEY (team_id, name),
    UNIQUE (team_id, slot)
);

-- One event of a batch, as the procedures hand it to mh_add_stats.
CREATE TYPE stats_delta AS (stripe smallint, team_id int, name text, submitted int, started int, succeeded int,
                            failed int, dead int, cancelled int, lateness_s float8, runtime_s float8);
