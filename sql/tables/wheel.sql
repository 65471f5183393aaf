-- The hierarchical timing wheel: where a pending job waits until it is due,
-- and the per-shard state of the claim.
--
--   due_minutes  ring of 480 one-minute partitions (slot = epoch minute mod 480)
--                jobs due before mh_minute_end(now): at most 7 h ahead
--   due_hours    ring of 96 one-hour partitions (slot = epoch hour mod 96)
--                jobs due before mh_hour_end(now): 72 h ahead
--   due_far      everything later, one row per job, indexed by run time
--
-- All partitions are created here, once; steady state runs no DDL (on Citus
-- each partition CREATE costs 0.1-0.3 s and blocks writes). Slots are reused
-- as the hand comes round: a passed slot is carried forward and emptied with
-- TRUNCATE, never vacuumed row by row. No DEFAULT partition: a row parked
-- there would block creating the partition that should hold it. Rows are
-- small and hold only what the claim orders by.
--
-- Tables never call our functions (the functions are applied after them),
-- so the sizes are written out: 480 = mh_minute_slots(), 96 =
-- mh_hour_slots(), 256 = mh_shard_count(), partition names as
-- mh_minute_part() and mh_hour_part() spell them (tests/test_migrations.py
-- checks they agree).

-- Per-shard state: the dispatcher lease with its fencing epoch, and the hand
-- of the wheel (the oldest minute bucket that may still hold due rows).
CREATE TABLE shards (
    shard            smallint PRIMARY KEY,
    owner            text,
    epoch            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    hand             timestamptz
);
INSERT INTO shards (shard) SELECT g FROM generate_series(0, 255) g;

-- Global duties (cascade, sweep) serialise on this one row; it also records
-- how far each has gone, so a run after an outage knows to look further.
CREATE TABLE wheel (
    id              int PRIMARY KEY CHECK (id = 1),
    swept_until     timestamptz,              -- minute buckets before this are emptied
    cascaded_until  timestamptz               -- hour slots before this moved to minute buckets
);
INSERT INTO wheel (id) VALUES (1);

CREATE TABLE due_minutes (
    slot     smallint    NOT NULL,
    shard    smallint    NOT NULL,
    strict   boolean     NOT NULL,
    priority smallint    NOT NULL,
    run_at   timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    team_id  int         NOT NULL         -- for rotation and quotas between teams
) PARTITION BY LIST (slot);

CREATE TABLE due_hours (LIKE due_minutes) PARTITION BY LIST (slot);

CREATE TABLE due_far (
    shard    smallint    NOT NULL,
    strict   boolean     NOT NULL,
    priority smallint    NOT NULL,
    run_at   timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    team_id  int         NOT NULL
);
-- The cascade reads it by run time; a cancel finds its job's row by run
-- time and id (mh_unwheel).
CREATE INDEX due_far_run_at ON due_far (run_at, job_id);

DO $$
BEGIN
    FOR s IN 0 .. 479 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF due_minutes FOR VALUES IN (%s)',
                       format('due_m%s', lpad(s::text, 3, '0')), s);
    END LOOP;
    FOR s IN 0 .. 95 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF due_hours FOR VALUES IN (%s)',
                       format('due_h%s', lpad(s::text, 2, '0')), s);
    END LOOP;
END $$;

-- The claim reads one shard's rows of a bucket class by class (strict,
-- priority), team by team, oldest first; the dispatcher's summary of a
-- shard's due rows counts them in the same order. The job id last: a cancel
-- finds its job's row in one probe, however many share its run time
-- (mh_unwheel). Hour slots are only ever moved whole: their index serves
-- the cancel alone (job ids rise with time: appended to, mostly).
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, team_id, run_at, job_id);
CREATE INDEX due_hours_job ON due_hours (job_id);

-- A row on the wheel in transit (bulk submission, cascades, expiry).
CREATE TYPE due_row AS (shard smallint, strict boolean, priority smallint, run_at timestamptz, job_id bigint,
                        team_id int);
