-- Shards and job ids. Constants are immutable functions rather than a
-- settings table: they are inlined into plans and cost nothing on the hot
-- path. Changing one is a migration.

-- Logical shards S. The id keeps 10 shard bits, so S may grow to 1024.
CREATE OR REPLACE FUNCTION mh_shard_count() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 256 $$;

-- Job ids: 64-bit, time-ordered, generated here (not a plain sequence):
--   [ms since 2025-01-01 : 40 bits, to 2059][sequence mod 8192 : 13 bits][shard : 10 bits]
-- so the shard is read from the id with no lookup. Two ids can only collide
-- if 8192 ids are drawn in one millisecond into the same shard.

-- The smallest id made at time t: ids are ordered by creation time, so a
-- range of ids is a range of creation times (bounded scans of recent jobs).
-- The epoch of t is read from its UTC wall time: extract() from a
-- timestamptz is only STABLE, and PostgreSQL does not inline an IMMUTABLE
-- function whose body is not, so each row would call it.
CREATE OR REPLACE FUNCTION mh_id_at(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t AT TIME ZONE 'UTC') * 1000)::bigint - 1735689600000) << 23
$$;

CREATE OR REPLACE FUNCTION mh_new_id(p_shard int) RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE AS $$
    SELECT mh_id_at(clock_timestamp()) | (nextval('job_id_seq') << 10) | p_shard
$$;

CREATE OR REPLACE FUNCTION mh_shard_of(p_id bigint) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (p_id & 1023)::smallint $$;
-- Whether this server runs Citus (its library is loaded).
CREATE OR REPLACE FUNCTION mh_on_citus() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT current_setting('citus.version', true) IS NOT NULL $$;
-- The shards an outcome batch names in every statement (`shard = ANY (...)`):
-- on Citus the distinct shards of these jobs, so that a batch of one Citus
-- shard's jobs is router statements on that shard's worker, not statements
-- on every shard; on plain PostgreSQL NULL, and the statements' filter
-- `(v_shards IS NULL OR ...)` folds away (with it the planner may prefer
-- a shard's index to the primary key).
CREATE OR REPLACE FUNCTION mh_batch_shards(p_ids bigint[]) RETURNS smallint[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN mh_on_citus() THEN (SELECT coalesce(array_agg(DISTINCT mh_shard_of(x)), '{}') FROM unnest(p_ids) x) END
$$;

-- A job without an idempotency key lands on a random shard; one with a key
-- on the shard of (team, key), so the key row and the job share a shard and
-- a keyed submit stays a single-shard transaction.
CREATE OR REPLACE FUNCTION mh_random_shard() RETURNS smallint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT floor(random() * mh_shard_count())::smallint $$;
-- The shards submit_jobs places one call's keyless jobs on (random among
-- them): on a database distributed by Citus, the logical shards kept in
-- the Citus shard of a random one, so that the call writes on one worker
-- node and commits in one phase (over many calls every shard gets its
-- share); on plain PostgreSQL NULL: any shard.
CREATE OR REPLACE FUNCTION mh_placement_shards() RETURNS smallint[]
LANGUAGE plpgsql VOLATILE SET search_path = minutehand, pg_temp AS $$
DECLARE v_pick smallint := mh_random_shard();
BEGIN
    IF NOT mh_on_citus() THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass) THEN
        RETURN NULL;                     -- (Citus, not distributed yet)
    END IF;
    RETURN ARRAY(SELECT s::smallint FROM generate_series(0, mh_shard_count() - 1) s
                  WHERE get_shard_id_for_distribution_column('jobs', s::smallint)
                        = get_shard_id_for_distribution_column('jobs', v_pick));
END $$;
CREATE OR REPLACE FUNCTION mh_key_shard(p_team int, p_key text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (abs(hashtextextended(p_team::text || ':' || p_key, 0)) % mh_shard_count())::smallint
$$;
