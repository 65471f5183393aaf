-- Repeating jobs. A series is a chain of ordinary jobs: each run is a row
-- of `jobs` whose series_id names the series, on the series' own shard, so
-- (shard, series_id, due_at), the unique index jobs_series_run, stops any
-- run from being created twice. Submission creates the first run; the claim
-- of the newest run marks the series (chain_after) and the dispatcher that
-- owns the shard creates the next run (sql/functions/chain.sql), advancing
-- the columns marked "chain" below. Citus-ready like jobs: distributed by
-- shard, colocated with the runs.
CREATE TABLE series (
    shard            smallint    NOT NULL,
    id               bigint      NOT NULL,   -- mh_new_id(shard): the shard is readable from it
    team_id          int         NOT NULL,
    -- what every run is made of
    name             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         smallint    NOT NULL,
    max_attempts     int         NOT NULL,
    backoff_base_s   real        NOT NULL,
    backoff_cap_s    real        NOT NULL,
    flex_s           int         NOT NULL,
    strict           boolean     NOT NULL,
    -- the repeat spec: every every_s seconds, or a 5-field crontab in an IANA zone
    every_s          int,
    cron             text,
    timezone         text,
    -- the key the series was submitted with; it names the first run only
    -- (later runs carry no key: a stored result must not be replayed to them)
    idempotency_key  text,
    first_due_at     timestamptz NOT NULL,   -- the first run's due time
    -- chain: the newest run created and its due time (run N+1 follows it)
    last_job_id      bigint      NOT NULL,
    last_due_at      timestamptz NOT NULL,
    cancelled_at     timestamptz,            -- chain: set, no further run is created
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- after an outage: run_once (the run that waited runs once, the fire
    -- times missed meanwhile are folded into it) or skip (a run whose next
    -- fire time passed before it was claimed is dropped)
    misfire          text        NOT NULL DEFAULT 'run_once' CHECK (misfire IN ('run_once', 'skip')),
    paused_at        timestamptz,            -- set: no further run is created until resumed
    -- chain: set, the series needs its next run, at the first fire time
    -- after this (the claimed run's due time; now, on resume or a new spec)
    chain_after      timestamptz,
    -- chain: set, the next run, due then, was held back by the team's
    -- pending ceiling; it is created once there is room (chain_after is
    -- then when the chain looks again)
    held_due_at      timestamptz,
    PRIMARY KEY (shard, id),
    CHECK ((every_s IS NULL) <> (cron IS NULL)),
    CHECK ((cron IS NULL) = (timezone IS NULL))
);

-- The series waiting for their next run, per shard: few at any moment.
CREATE INDEX series_chain ON series (shard, chain_after) WHERE chain_after IS NOT NULL;
-- A team's series, newest first (keyset pagination on id).
CREATE INDEX series_team ON series (team_id, id DESC);

-- Time zone names PostgreSQL knows, copied from pg_timezone_names (that
-- view reads every zone file on each call: ~100 ms). Every migrate fills it
-- again (sql/refresh.sql), so a tzdata update reaches it.
CREATE TABLE timezone_names (name text PRIMARY KEY);
