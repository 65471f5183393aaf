-- The hierarchical timing wheel: where a pending job waits until it is due.
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
-- TRUNCATE (maintenance.sql), never vacuumed row by row. No DEFAULT partition:
-- a row parked there would block creating the partition that should hold it.
-- Rows are small and hold only what the claim orders by.

CREATE FUNCTION mh_minute_slot(t timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t) / 60)::bigint % mh_minute_slots())::smallint
$$;
CREATE FUNCTION mh_hour_slot(t timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t) / 3600)::bigint % mh_hour_slots())::smallint
$$;
CREATE FUNCTION mh_minute_part(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT format('due_m%s', lpad(p_slot::text, 3, '0')) $$;
CREATE FUNCTION mh_hour_part(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT format('due_h%s', lpad(p_slot::text, 2, '0')) $$;

-- Level boundaries at time t. The minute level ends on an hour boundary so
-- that a whole hour slot cascades at once; it covers 6 to 7 hours.
CREATE FUNCTION mh_minute_end(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT mh_hour(t + mh_horizon()) + interval '1 hour' $$;
CREATE FUNCTION mh_hour_end(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT mh_hour(t) + mh_hour_span() $$;

CREATE TABLE due_minutes (
    slot     smallint    NOT NULL,
    shard    smallint    NOT NULL,
    strict   boolean     NOT NULL,
    priority smallint    NOT NULL,
    run_at   timestamptz NOT NULL,
    job_id   bigint      NOT NULL
) PARTITION BY LIST (slot);

CREATE TABLE due_hours (LIKE due_minutes) PARTITION BY LIST (slot);

CREATE TABLE due_far (
    shard    smallint    NOT NULL,
    strict   boolean     NOT NULL,
    priority smallint    NOT NULL,
    run_at   timestamptz NOT NULL,
    job_id   bigint      NOT NULL
);
CREATE INDEX due_far_run_at ON due_far (run_at);

DO $$
BEGIN
    FOR s IN 0 .. mh_minute_slots() - 1 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF due_minutes FOR VALUES IN (%s)', mh_minute_part(s), s);
    END LOOP;
    FOR s IN 0 .. mh_hour_slots() - 1 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF due_hours FOR VALUES IN (%s)', mh_hour_part(s), s);
    END LOOP;
END $$;

-- The claim reads one shard's rows of a bucket in claim order. Hour slots
-- need no index: they are only ever moved whole.
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, run_at);

-- Put one pending job on the wheel, at the level its run time belongs to at
-- p_now. A run time already past goes into the current minute bucket.
CREATE FUNCTION mh_enqueue(p_shard smallint, p_job bigint, p_run_at timestamptz,
                           p_strict boolean, p_priority smallint, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_run_at < mh_minute_end(p_now) THEN
        INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id)
        VALUES (mh_minute_slot(greatest(p_run_at, p_now)), p_shard, p_strict, p_priority, p_run_at, p_job);
    ELSIF p_run_at < mh_hour_end(p_now) THEN
        INSERT INTO due_hours (slot, shard, strict, priority, run_at, job_id)
        VALUES (mh_hour_slot(p_run_at), p_shard, p_strict, p_priority, p_run_at, p_job);
    ELSE
        INSERT INTO due_far (shard, strict, priority, run_at, job_id)
        VALUES (p_shard, p_strict, p_priority, p_run_at, p_job);
    END IF;
END $$;

-- The same for a set of rows (bulk submission, cascades): three set-based
-- INSERTs, no per-row round trip. Returns how many rows went to each level.
CREATE TYPE due_row AS (shard smallint, strict boolean, priority smallint, run_at timestamptz, job_id bigint);

CREATE FUNCTION mh_enqueue_many(p_rows due_row[], p_now timestamptz,
                                OUT to_minutes bigint, OUT to_hours bigint, OUT to_far bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_minute_end timestamptz := mh_minute_end(p_now);
    v_hour_end   timestamptz := mh_hour_end(p_now);
BEGIN
    INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id)
    SELECT mh_minute_slot(greatest(r.run_at, p_now)), r.shard, r.strict, r.priority, r.run_at, r.job_id
      FROM unnest(p_rows) r WHERE r.run_at < v_minute_end;
    GET DIAGNOSTICS to_minutes = ROW_COUNT;
    INSERT INTO due_hours (slot, shard, strict, priority, run_at, job_id)
    SELECT mh_hour_slot(r.run_at), r.shard, r.strict, r.priority, r.run_at, r.job_id
      FROM unnest(p_rows) r WHERE r.run_at >= v_minute_end AND r.run_at < v_hour_end;
    GET DIAGNOSTICS to_hours = ROW_COUNT;
    INSERT INTO due_far (shard, strict, priority, run_at, job_id)
    SELECT r.shard, r.strict, r.priority, r.run_at, r.job_id
      FROM unnest(p_rows) r WHERE r.run_at >= v_hour_end;
    GET DIAGNOSTICS to_far = ROW_COUNT;
END $$;
