-- minutehand core: constants, the clock, job ids, and the tables every other
-- file builds on. Applied by migrations/versions/0001_foundation.py.
--
-- Citus-readiness: the tables are shaped so that Citus could distribute
-- them by `shard` (not built yet: running on a Citus cluster). Citus needs
-- the distribution column in every primary and unique key, so every
-- distributed table carries `shard` and every unique key includes it;
-- `teams`, small and read everywhere, would be a reference table.

-- ---------------------------------------------------------------- constants
-- Immutable functions rather than a settings table: they are inlined into
-- plans and cost nothing on the hot path. Changing one is a migration.

-- Logical shards S. The id keeps 10 shard bits, so S may grow to 1024.
CREATE FUNCTION mh_shard_count() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 256 $$;

-- Minute ring: slot = epoch minute mod 480. The minute level holds jobs due
-- before the next hour boundary after now + 6 h (at most 7 h ahead); a passed
-- slot is swept 30 min after the hand leaves it, long before its reuse.
CREATE FUNCTION mh_minute_slots() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 480 $$;
CREATE FUNCTION mh_horizon() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '6 hours' $$;
CREATE FUNCTION mh_sweep_after() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '30 minutes' $$;

-- Hour ring: slot = epoch hour mod 96, for jobs up to 72 h ahead; beyond
-- that they wait in due_far (one row per job, indexed by run time).
CREATE FUNCTION mh_hour_slots() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 96 $$;
CREATE FUNCTION mh_hour_span() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '72 hours' $$;

-- Limits enforced by submission (one implementation, for SQL and HTTP callers).
CREATE FUNCTION mh_payload_max_bytes() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 262144 $$;
CREATE FUNCTION mh_max_ahead() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '366 days' $$;
CREATE FUNCTION mh_idempotency_ttl() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '24 hours' $$;

-- ---------------------------------------------------------------- the clock
-- Every procedure asks mh_now(), never now(): a session may pin it with
--   SET minutehand.now = '2030-01-01 00:00:00+00'
-- (and set it again to advance), so tests of time never sleep. Unpinned it is
-- the wall clock, not the transaction start: a caller's long transaction must
-- not place a job into a bucket the hand has already passed.
CREATE FUNCTION mh_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('minutehand.now', true), '')::timestamptz,
                    clock_timestamp())
$$;

CREATE FUNCTION mh_minute(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT date_bin('1 minute', t, timestamptz '2000-01-01 00:00:00+00') $$;
CREATE FUNCTION mh_hour(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT date_bin('1 hour', t, timestamptz '2000-01-01 00:00:00+00') $$;

-- ---------------------------------------------------------------- job ids
-- 64-bit, time-ordered, generated here (not a plain sequence):
--   [ms since 2025-01-01 : 40 bits, to 2059][sequence mod 8192 : 13 bits][shard : 10 bits]
-- so the shard is read from the id with no lookup. Two ids can only collide
-- if 8192 ids are drawn in one millisecond into the same shard. No sequence
-- cache: a cached block could outlive a whole cycle and repeat a value.
CREATE SEQUENCE job_id_seq CYCLE MINVALUE 0 MAXVALUE 8191;

-- The smallest id made at time t: ids are ordered by creation time, so a
-- range of ids is a range of creation times (bounded scans of recent jobs).
CREATE FUNCTION mh_id_at(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t) * 1000)::bigint - 1735689600000) << 23
$$;

CREATE FUNCTION mh_new_id(p_shard int) RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE AS $$
    SELECT mh_id_at(clock_timestamp()) | (nextval('job_id_seq') << 10) | p_shard
$$;

CREATE FUNCTION mh_shard_of(p_id bigint) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (p_id & 1023)::smallint $$;

-- A job without an idempotency key lands on a random shard; one with a key
-- on the shard of (team, key), so the key row and the job share a shard and
-- a keyed submit stays a single-shard transaction.
CREATE FUNCTION mh_random_shard() RETURNS smallint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT floor(random() * mh_shard_count())::smallint $$;
CREATE FUNCTION mh_key_shard(p_team int, p_key text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (abs(hashtextextended(p_team::text || ':' || p_key, 0)) % mh_shard_count())::smallint
$$;

-- ---------------------------------------------------------------- tables
CREATE TYPE job_state AS ENUM
    ('scheduled', 'claimed', 'running', 'retrying', 'succeeded', 'dead', 'cancelled');

-- Teams: a reference table on Citus. quota = max running jobs, weight = share.
CREATE TABLE teams (
    id          int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    quota       int  NOT NULL DEFAULT 1000 CHECK (quota > 0),
    weight      int  NOT NULL DEFAULT 1 CHECK (weight > 0),
    token_hash  text,                       -- sha256 hex of the bearer token
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The job record: one row per job, read by (shard, id) for status.
-- Not time-partitioned: a unique id would then need the partition key.
CREATE TABLE jobs (
    shard            smallint    NOT NULL,
    id               bigint      NOT NULL,
    team_id          int         NOT NULL,
    name             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         smallint    NOT NULL,
    due_at           timestamptz NOT NULL,   -- requested due time
    flex_s           int         NOT NULL,   -- flex window the submitter allowed
    strict           boolean     NOT NULL,
    run_at           timestamptz NOT NULL,   -- assigned run time (retry time after a failure)
    state            job_state   NOT NULL,
    attempts         int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL,
    backoff_base_s   real        NOT NULL,
    backoff_cap_s    real        NOT NULL,
    claimed_by       text,
    claim_expires_at timestamptz,
    lease_token      uuid,
    idempotency_key  text,
    series_id        bigint,                 -- repeating jobs: a chain of ordinary jobs
    lateness         interval,               -- start - due, once started
    result           jsonb,
    last_error       text,
    created_at       timestamptz NOT NULL,
    claimed_at       timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (shard, id)
) WITH (fillfactor = 30);
-- No index covers a column that claim, start, heartbeat, complete or fail
-- change (state, claim fields, result): those updates are HOT, adding no
-- index entries. A job's life is two or three updates; fillfactor 30 leaves
-- each page room for them even while a long transaction keeps old versions
-- from being pruned (measured: at 70, a held snapshot turned 60% of the
-- updates non-HOT and cost ~15% of claim+complete throughput; at 30, none).
-- The price is a heap about twice as large; the lasting fix is to move the
-- mutable columns into a narrow table of their own.
-- Claim expiry is found through claim_checks instead of an index.
-- A team's jobs, newest first (keyset pagination on id).
CREATE INDEX jobs_team_recent ON jobs (team_id, id DESC);
-- A repeating series cannot create the same run twice, whatever fails over.
CREATE UNIQUE INDEX jobs_series_run ON jobs (shard, series_id, due_at) WHERE series_id IS NOT NULL;

-- Reminders to look at claims when they would expire: one row per claim
-- call (up to its whole batch of jobs), not per job. expire_claims() reads
-- the due ones; a claim renewed by heartbeats is simply filed again.
CREATE TABLE claim_checks (
    shard    smallint    NOT NULL,
    check_at timestamptz NOT NULL,
    job_ids  bigint[]    NOT NULL
);
CREATE INDEX claim_checks_due ON claim_checks (shard, check_at);

-- Idempotency keys, colocated with their job (same shard), kept 24 h.
CREATE TABLE idempotency_keys (
    shard        smallint    NOT NULL,
    team_id      int         NOT NULL,
    key          text        NOT NULL,
    job_id       bigint      NOT NULL,
    request_hash text        NOT NULL,       -- the same key with another body is refused
    result       jsonb,                      -- stored on success, replayed to later runs
    completed_at timestamptz,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (shard, team_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (shard, expires_at);

-- Per-shard state: the dispatcher lease with its fencing epoch, and the hand
-- of the wheel (the oldest minute bucket that may still hold due rows).
CREATE TABLE shards (
    shard            smallint PRIMARY KEY,
    owner            text,
    epoch            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    hand             timestamptz
);
INSERT INTO shards (shard) SELECT g FROM generate_series(0, mh_shard_count() - 1) g;

-- Global duties (cascade, sweep) serialise on this one row; it also records
-- how far each has gone, so a run after an outage knows to look further.
CREATE TABLE wheel (
    id              int PRIMARY KEY CHECK (id = 1),
    swept_until     timestamptz,              -- minute buckets before this are emptied
    cascaded_until  timestamptz               -- hour slots before this moved to minute buckets
);
INSERT INTO wheel (id) VALUES (1);
