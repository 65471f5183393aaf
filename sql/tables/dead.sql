-- Dead jobs: how they are found again, and how their submitters hear of
-- them (sql/functions/dead.sql).

-- Every dead job, by team and name: the dead letters a requeue or discard
-- of a whole (team, name) walks, shard by shard, instead of reading jobs.
-- Written in the transaction that makes a job dead (fail_many,
-- expire_claims), deleted in the one that requeues or discards it, so a row
-- is here exactly while its job is dead. `jobs` gets no index on state:
-- any index naming state, even a partial one WHERE state = 'dead', makes
-- every update that changes state non-HOT (README, "Dead jobs").
CREATE TABLE dead_jobs (
    shard    smallint NOT NULL,
    team_id  int      NOT NULL,
    name     text     NOT NULL,
    job_id   bigint   NOT NULL,
    PRIMARY KEY (shard, team_id, name, job_id)
);
-- The admin UI's dead-jobs page: a team's dead jobs by name, one page at a
-- time, without probing every shard. Written only when a job becomes dead
-- and when it leaves that state, never on submit.
CREATE INDEX dead_jobs_by_team ON dead_jobs (team_id, name, job_id);

-- Terminal failures reported to their submitter: one row per job that
-- became dead, written by the transaction that made it so. A team reads
-- its events in the order of the writing transactions (xid, then id),
-- only those of transactions older than every one still running
-- (pg_snapshot_xmin), so an event committed late can never land behind a
-- cursor a reader already holds. Kept mh_events_keep(), purged per shard.
CREATE TABLE job_events (
    shard         smallint    NOT NULL,
    id            bigint      NOT NULL,                   -- mh_new_id(shard): time-ordered, unique
    team_id       int         NOT NULL,
    xid           xid8        NOT NULL,                   -- the transaction that wrote it
    kind          text        NOT NULL CHECK (kind IN ('dead')),
    job_id        bigint      NOT NULL,
    name          text        NOT NULL,
    attempts      int         NOT NULL,
    max_attempts  int         NOT NULL,
    error         text,
    at            timestamptz NOT NULL,
    PRIMARY KEY (shard, id)
);
-- A team's feed, and its webhook's position in it: keyset on (xid, id).
CREATE INDEX job_events_feed ON job_events (team_id, xid, id);
-- Retention, one shard at a time.
CREATE INDEX job_events_age ON job_events (shard, at);
-- A job's own events (the admin UI's job page shows each time it became
-- dead): written once per death, never on submit.
CREATE INDEX job_events_job ON job_events (shard, job_id);

-- A team's webhook (a reference table on Citus: one row per team): where its
-- events are POSTed, the secret they are signed with, and how far delivery
-- got — the (xid, id) of the last event a 2xx acknowledged, moved only
-- after that answer, so a deliverer killed mid-request sends the batch again.
-- failures and next_attempt_at: the backoff of the batch now failing.
CREATE TABLE webhooks (
    team_id          int         PRIMARY KEY,
    url              text        NOT NULL,
    secret           text        NOT NULL,
    delivered_xid    xid8        NOT NULL DEFAULT '0',
    delivered_id     bigint      NOT NULL DEFAULT 0,
    failures         int         NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    updated_at       timestamptz NOT NULL
);

-- Each delivery attempt, for the team to see (GET .../webhook/deliveries):
-- the events it carried, the answer (status code) or the error, the attempt
-- number of its batch. Kept as long as events.
CREATE TABLE webhook_deliveries (
    team_id      int         NOT NULL,
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    at           timestamptz NOT NULL,
    url          text        NOT NULL,
    events       int         NOT NULL,
    first_event  bigint      NOT NULL,
    last_event   bigint      NOT NULL,
    attempt      int         NOT NULL,
    status_code  int,
    error        text,
    duration_ms  int         NOT NULL,
    PRIMARY KEY (team_id, id)
);
CREATE INDEX webhook_deliveries_age ON webhook_deliveries (at);
