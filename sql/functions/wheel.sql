-- The timing wheel (sql/tables/wheel.sql): its sizes, where a time lands on
-- it, putting pending jobs on it, and moving rows down its levels.

-- Minute ring: slot = epoch minute mod 480. The minute level holds jobs due
-- before the next hour boundary after now + 6 h (at most 7 h ahead); a passed
-- slot is swept 30 min after the hand leaves it, long before its reuse.
CREATE OR REPLACE FUNCTION mh_minute_slots() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 480 $$;
CREATE OR REPLACE FUNCTION mh_horizon() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '6 hours' $$;
CREATE OR REPLACE FUNCTION mh_sweep_after() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '30 minutes' $$;

-- Hour ring: slot = epoch hour mod 96, for jobs up to 72 h ahead; beyond
-- that they wait in due_far (one row per job, indexed by run time).
CREATE OR REPLACE FUNCTION mh_hour_slots() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 96 $$;
CREATE OR REPLACE FUNCTION mh_hour_span() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '72 hours' $$;

-- How many distinct job names the dispatchers are told of at most per
-- shard (a wake-up's) or cell (due_edges'); past that, the names are unknown.
CREATE OR REPLACE FUNCTION mh_edge_names() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 16 $$;

-- (The epoch read from the UTC wall time, as in mh_id_at: inlined.)
CREATE OR REPLACE FUNCTION mh_minute_slot(t timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t AT TIME ZONE 'UTC') / 60)::bigint % mh_minute_slots())::smallint
$$;
CREATE OR REPLACE FUNCTION mh_hour_slot(t timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (floor(extract(epoch FROM t AT TIME ZONE 'UTC') / 3600)::bigint % mh_hour_slots())::smallint
$$;
CREATE OR REPLACE FUNCTION mh_minute_part(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT format('due_m%s', lpad(p_slot::text, 3, '0')) $$;
CREATE OR REPLACE FUNCTION mh_hour_part(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT format('due_h%s', lpad(p_slot::text, 2, '0')) $$;

-- Level boundaries at time t. The minute level ends on an hour boundary so
-- that a whole hour slot cascades at once; it covers 6 to 7 hours.
CREATE OR REPLACE FUNCTION mh_minute_end(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT mh_hour(t + mh_horizon()) + interval '1 hour' $$;
CREATE OR REPLACE FUNCTION mh_hour_end(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT mh_hour(t) + mh_hour_span() $$;

-- Put one pending job on the wheel, at the level its run time belongs to at
-- p_now; a run time already past goes into the current minute bucket. One
-- INSERT into one level: the plans of a single submission name one level
-- (tests/test_explain.py), which the set form below, three INSERTs, would not.
--
-- A row put into the current or next minute bucket wakes the dispatchers
-- (LISTEN minutehand_due): they otherwise sleep until the next run time
-- they know of. The payload names the shards that got such rows, comma
-- separated (at most 256 numbers, within NOTIFY's 8000 bytes), so a
-- dispatcher claims from those shards only. Sent at commit; a repeated
-- payload in one transaction is sent once.
CREATE OR REPLACE FUNCTION mh_enqueue(p_shard smallint, p_job bigint, p_run_at timestamptz,
                                      p_strict boolean, p_priority smallint, p_team int, p_now timestamptz)
RETURNS void LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF p_run_at < mh_minute_end(p_now) THEN
        INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
        VALUES (mh_minute_slot(greatest(p_run_at, p_now)), p_shard, p_strict, p_priority, p_run_at, p_job, p_team);
        IF p_run_at < mh_minute(p_now) + interval '2 minutes' THEN
            PERFORM pg_notify('minutehand_due', p_shard::text);
        END IF;
    ELSIF p_run_at < mh_hour_end(p_now) THEN
        INSERT INTO due_hours (slot, shard, strict, priority, run_at, job_id, team_id)
        VALUES (mh_hour_slot(p_run_at), p_shard, p_strict, p_priority, p_run_at, p_job, p_team);
    ELSE
        INSERT INTO due_far (shard, strict, priority, run_at, job_id, team_id)
        VALUES (p_shard, p_strict, p_priority, p_run_at, p_job, p_team);
    END IF;
END $$;

-- Rows (p_rows: each a parenthesized list of literals) written into p_table
-- by one INSERT ... VALUES; none, nothing. On Citus a multi-row VALUES of
-- one shard's rows is a router statement, committed in one phase on that
-- shard's worker, where an INSERT fed by a query or an array goes through
-- COPY, which Citus always commits in two. Planning each literal costs
-- there (measured: ~90 µs a row, against COPY's ~9 µs a row and ~1 ms for
-- the second phase), so callers use it on Citus for up to mh_values_rows()
-- rows: the common small batches, a single submission, an expired claim.
CREATE OR REPLACE FUNCTION mh_values_rows() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 16 $$;
CREATE OR REPLACE FUNCTION mh_insert_values(p_table text, p_columns text, p_rows text[]) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF cardinality(p_rows) > 0 THEN
        EXECUTE format('INSERT INTO %I (%s) VALUES %s', p_table, p_columns, array_to_string(p_rows, ','));
    END IF;
END $$;

-- The same for a set of rows (bulk submission, cascades, expiry, give-back):
-- three set-based INSERTs, no per-row round trip (on Citus, up to
-- mh_values_rows() rows as literal VALUES: mh_insert_values). Returns how many rows
-- went to each level.
--
-- Its wake-up counts the rows due now instead of naming their shards, so
-- that a dispatcher adds them to what it knows without reading the shards
-- again (when jobs trickle in, every batch lands on most shards). The
-- payload's items, comma separated:
--   @B/I                 the bucket the rows went into (B: its epoch second),
--                        and the least job id (no two payloads of one
--                        transaction are alike, so none is dropped as a repeat)
--   S/strict/P/T/N/O     shard S got N rows due now of class (strict 0 or 1,
--                        priority P) and team T, the oldest O ms after B
--   S                    shard S got rows due later in this or the next minute
--   S=A+B                the job names of shard S's rows of the two items
--                        above (p_names: each row's); none for a shard whose
--                        rows have more than mh_edge_names() names, or when
--                        p_names is NULL: then its names are unknown, and a
--                        dispatcher may look for any name there
-- A payload over NOTIFY's limit drops the names, then names the shards
-- only, as mh_enqueue's.
CREATE OR REPLACE FUNCTION mh_enqueue_many(p_rows due_row[], p_now timestamptz, p_names text[] DEFAULT NULL,
                                      OUT to_minutes bigint, OUT to_hours bigint, OUT to_far bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_minute_end timestamptz := mh_minute_end(p_now);
    v_hour_end   timestamptz := mh_hour_end(p_now);
    v_bucket     timestamptz := mh_minute(p_now);
    v_cells      text;
    v_first      bigint;
    v_later      text;
    v_names      text;
    v_payload    text;
BEGIN
    IF mh_on_citus() AND cardinality(p_rows) <= mh_values_rows() THEN
        -- (few rows on Citus: literal VALUES, one phase; mh_insert_values)
        PERFORM mh_insert_values('due_minutes', 'slot, shard, strict, priority, run_at, job_id, team_id',
                                 ARRAY(SELECT format('(%L,%L,%L,%L,%L,%L,%L)', mh_minute_slot(greatest(r.run_at, p_now)),
                                                     r.shard, r.strict, r.priority, r.run_at, r.job_id, r.team_id)
                                         FROM unnest(p_rows) r WHERE r.run_at < v_minute_end)),
                mh_insert_values('due_hours', 'slot, shard, strict, priority, run_at, job_id, team_id',
                                 ARRAY(SELECT format('(%L,%L,%L,%L,%L,%L,%L)', mh_hour_slot(r.run_at), r.shard,
                                                     r.strict, r.priority, r.run_at, r.job_id, r.team_id)
                                         FROM unnest(p_rows) r
                                        WHERE r.run_at >= v_minute_end AND r.run_at < v_hour_end)),
                mh_insert_values('due_far', 'shard, strict, priority, run_at, job_id, team_id',
                                 ARRAY(SELECT format('(%L,%L,%L,%L,%L,%L)', r.shard, r.strict, r.priority, r.run_at,
                                                     r.job_id, r.team_id)
                                         FROM unnest(p_rows) r WHERE r.run_at >= v_hour_end));
        SELECT count(*) FILTER (WHERE r.run_at < v_minute_end),
               count(*) FILTER (WHERE r.run_at >= v_minute_end AND r.run_at < v_hour_end),
               count(*) FILTER (WHERE r.run_at >= v_hour_end)
          INTO to_minutes, to_hours, to_far
          FROM unnest(p_rows) r;
    ELSE
        INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
        SELECT mh_minute_slot(greatest(r.run_at, p_now)), r.shard, r.strict, r.priority, r.run_at, r.job_id, r.team_id
          FROM unnest(p_rows) r WHERE r.run_at < v_minute_end;
        GET DIAGNOSTICS to_minutes = ROW_COUNT;
        INSERT INTO due_hours (slot, shard, strict, priority, run_at, job_id, team_id)
        SELECT mh_hour_slot(r.run_at), r.shard, r.strict, r.priority, r.run_at, r.job_id, r.team_id
          FROM unnest(p_rows) r WHERE r.run_at >= v_minute_end AND r.run_at < v_hour_end;
        GET DIAGNOSTICS to_hours = ROW_COUNT;
        INSERT INTO due_far (shard, strict, priority, run_at, job_id, team_id)
        SELECT r.shard, r.strict, r.priority, r.run_at, r.job_id, r.team_id
          FROM unnest(p_rows) r WHERE r.run_at >= v_hour_end;
        GET DIAGNOSTICS to_far = ROW_COUNT;
    END IF;
    IF to_minutes > 0 THEN
        SELECT string_agg(format('%s/%s/%s/%s/%s/%s', c.shard, c.strict::int, c.priority, c.team_id, c.n,
                                 floor(extract(epoch FROM c.oldest - v_bucket) * 1000)::bigint), ','),
               min(c.first)
          INTO v_cells, v_first
          FROM (SELECT r.shard, r.strict, r.priority, r.team_id, count(*) AS n, min(r.run_at) AS oldest,
                       min(r.job_id) AS first
                  FROM unnest(p_rows) r WHERE r.run_at <= p_now
                 GROUP BY r.shard, r.strict, r.priority, r.team_id) c;
        SELECT string_agg(DISTINCT r.shard::text, ',') INTO v_later
          FROM unnest(p_rows) r WHERE r.run_at > p_now AND r.run_at < v_bucket + interval '2 minutes';
        IF p_names IS NOT NULL THEN
            -- (A name outside the pattern submissions allow, written around
            -- them, could break the payload's syntax: its shard's names are unknown.)
            SELECT string_agg(n.shard || '=' || n.names, ',') INTO v_names
              FROM (SELECT r.shard, string_agg(DISTINCT p_names[r.o::int], '+') AS names
                      FROM unnest(p_rows) WITH ORDINALITY AS r(shard, strict, priority, run_at, job_id, team_id, o)
                     WHERE r.run_at < v_bucket + interval '2 minutes'
                     GROUP BY r.shard
                    HAVING count(DISTINCT p_names[r.o::int]) <= mh_edge_names()
                       AND bool_and(p_names[r.o::int] ~ '^[A-Za-z0-9_.:/-]+$')) n;
        END IF;
        v_payload := concat_ws(',', '@' || extract(epoch FROM v_bucket)::bigint || '/' || v_first || ',' || v_cells,
                               v_later, v_names);
        IF octet_length(v_payload) > 7900 THEN
            v_payload := concat_ws(',', '@' || extract(epoch FROM v_bucket)::bigint || '/' || v_first || ',' || v_cells,
                                   v_later);
        END IF;
        IF octet_length(v_payload) > 7900 THEN
            SELECT string_agg(DISTINCT r.shard::text, ',') INTO v_payload
              FROM unnest(p_rows) r WHERE r.run_at < v_bucket + interval '2 minutes';
        END IF;
        IF v_payload <> '' THEN
            PERFORM pg_notify('minutehand_due', v_payload);
        END IF;
    END IF;
END $$;

-- Take a waiting job's row off the wheel (p_job as read: its job is being
-- cancelled); whether one was there. Where the row waits follows from the
-- job's run time: the minute bucket of it or, once due, a later one up to
-- now (sweep_passed carried it forward, or a give-back put it back with its
-- old run time); the hour slot of it; due_far. Each look is one index probe
-- in one partition; a due row not in its own bucket costs a look at the
-- claim window (the buckets claims read, mh_hand), and one behind that
-- window is seen by no claim and dropped by sweep_passed. A level is looked
-- at only if the row can be there: never above the level the run time had
-- when the job was created (every later placement comes later, and rows
-- only move down). Levels are looked at top down, each statement with a
-- fresh snapshot, so a row the cascade or the sweep moves meanwhile is
-- found where it went. A row a claim holds is waited for (then it is gone).
CREATE OR REPLACE FUNCTION mh_unwheel(p_job jobs, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_run     timestamptz := p_job.run_at;
    v_cur     timestamptz := mh_minute(p_now);
    -- (the slots written out: the plan then names those partitions alone)
    v_minutes text := $f$DELETE FROM due_minutes d
                          WHERE d.slot IN (%s) AND d.shard = $1 AND d.strict = $2 AND d.priority = $3
                            AND d.team_id = $4 AND d.run_at = $5 AND d.job_id = $6$f$;
    v_window  int[];
    v_n       bigint;
BEGIN
    IF v_run >= mh_minute_end(p_job.created_at) THEN
        IF v_run >= mh_hour_end(p_job.created_at) THEN
            DELETE FROM due_far f WHERE f.run_at = v_run AND f.job_id = p_job.id AND f.shard = p_job.shard;
            IF FOUND THEN RETURN true; END IF;
        END IF;
        IF v_run < mh_hour_end(p_now) THEN
            EXECUTE format('DELETE FROM %I d WHERE d.job_id = $1 AND d.shard = $2', mh_hour_part(mh_hour_slot(v_run)))
              USING p_job.id, p_job.shard;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            IF v_n > 0 THEN RETURN true; END IF;
        END IF;
    END IF;
    IF v_run >= mh_minute_end(p_now) THEN
        RETURN false;
    END IF;
    EXECUTE format(v_minutes, mh_minute_slot(v_run))
      USING p_job.shard, p_job."strict", p_job.priority, p_job.team_id, v_run, p_job.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 OR v_run > p_now THEN
        RETURN v_n > 0;
    END IF;
    v_window := ARRAY(SELECT mh_minute_slot(b)
                        FROM generate_series(greatest(mh_minute(v_run) + interval '1 minute', v_cur - mh_sweep_after()),
                                             v_cur, interval '1 minute') b);
    IF cardinality(v_window) = 0 THEN
        RETURN false;
    END IF;
    EXECUTE format(v_minutes, array_to_string(v_window, ','))
      USING p_job.shard, p_job."strict", p_job.priority, p_job.team_id, v_run, p_job.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n > 0;
END $$;

-- Whether a minute bucket holds any row of a shard, locked or not.
CREATE OR REPLACE FUNCTION mh_bucket_has_rows(p_bucket timestamptz, p_shard int) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE v_any boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE shard = $1)', mh_minute_part(mh_minute_slot(p_bucket)))
       INTO v_any USING p_shard;
    RETURN v_any;
END $$;

-- Move a shard's hand forward (never back). If another transaction holds
-- the shard's row (a claimer moving it too, or one that hangs before it
-- commits), skip: waiting would stall this shard's claims behind it, and
-- the next claim moves the hand anyway.
CREATE OR REPLACE FUNCTION mh_move_hand(p_shard int, p_hand timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    PERFORM 1 FROM shards s WHERE s.shard = p_shard FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE shards s SET hand = p_hand WHERE s.shard = p_shard AND (s.hand IS NULL OR s.hand < p_hand);
    END IF;
END $$;

-- Move the rows of one wheel partition that are due before p_before down to
-- the minute level (a row already due lands in the current bucket), then
-- empty the partition with TRUNCATE, or, if it also holds later rows (a
-- slot shared with a later lap of the ring after an outage), DELETE just the
-- moved ones. The partition is locked meanwhile: its submitters and
-- claimers wait, and none of their rows is lost to the TRUNCATE. With
-- p_waiting (leftovers carried forward: few), a row whose job no longer
-- waits is dropped instead of moved.
CREATE OR REPLACE FUNCTION mh_move_down(p_part text, p_before timestamptz, p_now timestamptz,
                                        p_waiting boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_moved bigint;
    v_later boolean;
BEGIN
    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', p_part);
    EXECUTE format($f$INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id, team_id)
                      SELECT mh_minute_slot(greatest(p.run_at, $2)), p.shard, p.strict, p.priority, p.run_at, p.job_id,
                             p.team_id
                        FROM %I p WHERE p.run_at < $1 %s$f$, p_part,
                   CASE WHEN p_waiting THEN
                       $w$AND EXISTS (SELECT 1 FROM jobs j WHERE j.shard = p.shard AND j.id = p.job_id
                                                         AND j.state IN ('scheduled', 'retrying'))$w$ END)
       USING p_before, p_now;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE run_at >= $1)', p_part) INTO v_later USING p_before;
    IF v_later THEN
        EXECUTE format('DELETE FROM %I WHERE run_at < $1', p_part) USING p_before;
    ELSE
        EXECUTE format('TRUNCATE %I', p_part);
    END IF;
    RETURN v_moved;
END $$;

-- How many rows each level of the wheel holds, estimated from the planner's
-- statistics (pg_class.reltuples as of autovacuum's last ANALYZE of each
-- table; never analysed or just truncated: 0), so no read of the pending
-- set (/metrics, the admin overview). On Citus the coordinator's tables are
-- empty shells: each node adds up the statistics of the placements it holds
-- (from the Citus metadata every node keeps), one command per node.
CREATE OR REPLACE FUNCTION mh_wheel_estimates(OUT minutes bigint, OUT hours bigint, OUT far bigint)
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_citus boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN      -- (Citus' catalogs: named only when there)
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1)' INTO v_citus
          USING 'due_far'::regclass;
    END IF;
    IF NOT v_citus THEN
        SELECT coalesce(sum(greatest(c.reltuples, 0)) FILTER (WHERE i.inhparent = 'due_minutes'::regclass), 0),
               coalesce(sum(greatest(c.reltuples, 0)) FILTER (WHERE i.inhparent = 'due_hours'::regclass), 0)
          INTO minutes, hours
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent IN ('due_minutes'::regclass, 'due_hours'::regclass);
        far := (SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c WHERE c.oid = 'due_far'::regclass);
        RETURN;
    END IF;
    EXECUTE $e$
        SELECT coalesce(sum(split_part(r.result, ',', 1)::bigint), 0), coalesce(sum(split_part(r.result, ',', 2)::bigint), 0),
               coalesce(sum(split_part(r.result, ',', 3)::bigint), 0)
          FROM run_command_on_all_nodes($c$
              SELECT concat_ws(',', coalesce(sum(greatest(c.reltuples, 0)) FILTER (WHERE l.level = 'minutes'), 0)::bigint,
                                    coalesce(sum(greatest(c.reltuples, 0)) FILTER (WHERE l.level = 'hours'), 0)::bigint,
                                    coalesce(sum(greatest(c.reltuples, 0)) FILTER (WHERE l.level = 'far'), 0)::bigint)
                FROM (SELECT i.inhrelid AS rel, 'minutes' AS level FROM pg_inherits i
                       WHERE i.inhparent = 'minutehand.due_minutes'::regclass
                      UNION ALL
                      SELECT i.inhrelid, 'hours' FROM pg_inherits i WHERE i.inhparent = 'minutehand.due_hours'::regclass
                      UNION ALL
                      SELECT 'minutehand.due_far'::regclass, 'far') l
                JOIN pg_dist_shard s ON s.logicalrelid = l.rel
                JOIN pg_dist_placement p ON p.shardid = s.shardid
                                        AND p.groupid = (SELECT groupid FROM pg_dist_local_group)
                JOIN pg_class c ON c.oid = to_regclass(shard_name(s.logicalrelid, s.shardid))$c$) r
         WHERE r.success$e$
    INTO minutes, hours, far;
END $$;
