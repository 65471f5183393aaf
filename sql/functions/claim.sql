-- The claim: shard leases with a fencing epoch, and taking due jobs off the
-- wheel for workers.

-- Take or renew the lease on one shard for p_ttl_s seconds. Returns the epoch
-- to pass to claim_due, or NULL while another owner's lease is unexpired.
-- The epoch rises whenever the lease changes hands (or lapsed), so a paused
-- old owner that wakes up holds a stale epoch and its claims are refused.
CREATE OR REPLACE FUNCTION take_shard_lease(p_shard int, p_owner text, p_ttl_s real) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    RETURN (SELECT l.epoch FROM take_shard_leases(ARRAY[p_shard], p_owner, p_ttl_s) l);
END $$;

-- Leases on several shards in one statement: (shard, epoch) of
-- those now held. The dispatcher renews all its leases every fifth of a lease
-- period; on Citus the store calls this once per Citus shard, so a renewal is
-- a few router statements each committed in one phase on one worker, not a
-- distributed transaction per logical shard (256 of them took longer than a
-- short lease lasts on a busy cluster). The rows are locked in shard order
-- first, so two dispatchers asking for overlapping shards queue, never deadlock.
-- A lock held over a second (on Citus, a shard group being moved) fails the
-- call: those shards are not renewed this time, and the others' calls go on.
CREATE OR REPLACE FUNCTION take_shard_leases(p_shards int[], p_owner text, p_ttl_s real)
RETURNS TABLE (shard int, epoch bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp SET lock_timeout = '1s' AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_expires timestamptz := v_now + make_interval(secs => p_ttl_s);
BEGIN
    PERFORM 1 FROM shards s WHERE s.shard = ANY (p_shards) ORDER BY s.shard FOR UPDATE;
    RETURN QUERY
    UPDATE shards s
       SET owner = p_owner, lease_expires_at = v_expires,
           epoch = CASE WHEN s.owner = p_owner AND s.lease_expires_at > v_now THEN s.epoch ELSE s.epoch + 1 END
     WHERE s.shard = ANY (p_shards)
       AND (s.owner IS NULL OR s.owner = p_owner OR s.lease_expires_at <= v_now)
    RETURNING s.shard::int, s.epoch;
END $$;

-- Give shards up at once (a clean shutdown), so others take them without
-- waiting for expiry; only the current holder of a shard's epoch can. Several
-- shards ({shard: epoch} as two arrays) in one statement; on Citus called once
-- per Citus shard, as take_shard_leases.
CREATE OR REPLACE FUNCTION release_shard_leases(p_shards int[], p_owner text, p_epochs bigint[]) RETURNS int
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_released int;
BEGIN
    PERFORM 1 FROM shards s WHERE s.shard = ANY (p_shards) ORDER BY s.shard FOR UPDATE;
    UPDATE shards s SET owner = NULL, lease_expires_at = NULL
     WHERE s.shard = ANY (p_shards) AND s.owner = p_owner
       AND s.epoch = p_epochs[array_position(p_shards, s.shard::int)];
    GET DIAGNOSTICS v_released = ROW_COUNT;
    RETURN v_released;
END $$;

-- Why p_owner does not hold the current lease of a shard with epoch p_epoch
-- (NULL: it does). PL/pgSQL: Citus cannot plan a SQL function's own
-- parameterized statement over a distributed table.
CREATE OR REPLACE FUNCTION mh_lease_problem(p_shard int, p_owner text, p_epoch bigint, p_now timestamptz) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM shards s
                    WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch AND s.lease_expires_at > p_now) THEN
        RETURN format('shard %s: %L does not hold a current lease with epoch %s', p_shard, p_owner, p_epoch);
    END IF;
    RETURN NULL;
END $$;

-- The statement that takes due rows off one minute bucket, for EXECUTE with
--   $1 shard, $2 now, $3 limit; it returns the claimed job ids as an array.
-- It names the bucket's partition directly: its plan, and the locks it
-- takes, cover exactly that partition. Only this small statement is planned
-- per call; the job update that follows is static SQL with a cached plan.
CREATE OR REPLACE FUNCTION mh_claim_sql(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.shard = $1 AND d.ctid = ANY (ARRAY(
                   SELECT c.ctid FROM %1$I c
                    WHERE c.shard = $1 AND c.run_at <= $2
                    ORDER BY c.strict DESC, c.priority DESC, c.run_at
                    LIMIT $3
                      FOR UPDATE SKIP LOCKED))
            RETURNING d.job_id
        )
        SELECT array_agg(job_id) FROM picked
    $f$, mh_minute_part(p_slot))
$$;

-- The same for workers that handle only some job names ($4, NULL: any) or
-- only some teams' jobs ($5, team ids; NULL: any). The due rows carry the
-- team but not the name, so for names each candidate is joined to its job
-- (a primary-key probe); rows of other names or teams are skipped, and stay
-- for a worker that takes them.
CREATE OR REPLACE FUNCTION mh_claim_filtered_sql(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.shard = $1 AND d.ctid = ANY (ARRAY(
                   SELECT c.ctid FROM %1$I c
                     JOIN jobs j ON j.shard = c.shard AND j.id = c.job_id
                    WHERE c.shard = $1 AND c.run_at <= $2
                      AND ($4::text[] IS NULL OR j.name = ANY ($4))
                      AND ($5::int[] IS NULL OR c.team_id = ANY ($5))
                    ORDER BY c.strict DESC, c.priority DESC, c.run_at
                    LIMIT $3
                      FOR UPDATE OF c SKIP LOCKED))
            RETURNING d.job_id
        )
        SELECT array_agg(job_id) FROM picked
    $f$, mh_minute_part(p_slot))
$$;

-- The dispatcher's planned claim from one bucket: for each cell (strict,
-- priority, team) up to its limit of due rows, oldest first, for EXECUTE
-- with $1 shard, $2 stricts, $3 priorities, $4 team ids, $5 limits, $6 now,
-- and with p_named, $7 job names (each candidate joined to its job by
-- primary key, as mh_claim_filtered_sql). One index probe per cell
-- (due_minutes_claim leads with exactly these).
CREATE OR REPLACE FUNCTION mh_claim_cells_sql(p_slot int, p_named boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.shard = $1 AND d.ctid = ANY (ARRAY(
                   SELECT x.ctid
                     FROM unnest($2::boolean[], $3::smallint[], $4::int[], $5::int[]) AS k(strict, priority, team_id, lim)
                    CROSS JOIN LATERAL (
                          SELECT c.ctid FROM %1$I c %2$s
                           WHERE c.shard = $1 AND c.strict = k.strict AND c.priority = k.priority
                             AND c.team_id = k.team_id AND c.run_at <= $6 %3$s
                           ORDER BY c.run_at
                           LIMIT k.lim
                             FOR UPDATE OF c SKIP LOCKED) x))
            RETURNING d.job_id
        )
        SELECT array_agg(job_id) FROM picked
    $f$, mh_minute_part(p_slot),
       CASE WHEN p_named THEN 'JOIN jobs j ON j.shard = c.shard AND j.id = c.job_id' ELSE '' END,
       CASE WHEN p_named THEN 'AND j.name = ANY ($7)' ELSE '' END)
$$;

-- The jobs whose due rows a claim took become claimed by p_claimer: one
-- reminder row files the whole batch for expire_claims, and the team's
-- running count rises, all in the claim's transaction. Due rows of
-- cancelled jobs were removed too, and claim nothing here. A job past its
-- deadline that never started (a repeating run that misfired under the
-- skip policy) is cancelled instead. When the newest run of a series is
-- claimed or dropped, its series is marked for its next run (chain_after),
-- and the shard's dispatcher creates it (sql/functions/chain.sql). A series
-- row locked by a control call (pause, cancel, a new spec) is not waited
-- for: that call decides the series' next run itself. Each job names
-- its team and carries the result recorded under its idempotency key while
-- the key names it (`replay`: an earlier run's handler returned it, and the
-- worker reports it instead of running the job; 'null' for a null result);
-- payload and replay come as JSON text, handed on as they are. A time no
-- client can read (before year 1 or after 9999: a row written around the
-- procedures) comes as NULL, so that the dispatcher fails that job alone
-- instead of failing to read every row of the claim. Each job's traceparent
-- (NULL: none) comes from the row the claim's update returned, read as it is:
-- the worker's span of the handler continues the submitter's trace.
CREATE OR REPLACE FUNCTION mh_take_claimed(p_shard int, p_ids bigint[], p_claimer text, p_lease_s real,
                                           p_now timestamptz)
RETURNS TABLE (job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, team_id int, strict boolean, priority smallint,
               traceparent text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_token   uuid := gen_random_uuid();
    v_expires timestamptz := p_now + make_interval(secs => p_lease_s);
    v_claimed jobs[];
    v_done    bigint[];
    v_chain   bigint[];
    v_keys    idempotency_keys[];
    v_team    int;
    v_count   int;
    v_got     int;
BEGIN
    -- One statement per table, each naming the shard and passing rows on in
    -- variables, not through a chain of CTEs: on Citus each is then a router
    -- query on the shard's worker and the claim one single-shard transaction
    -- (Citus splits a CTE chain into intermediate results sent to every
    -- worker, with a two-phase commit). Steps with nothing to do are skipped
    -- (an UPDATE whose condition folds to false, `id = ANY (NULL)`, fails on
    -- Citus 13.2 or crashes its coordinator).
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    WITH claimed AS (
        UPDATE jobs j
           SET state = 'claimed', attempts = j.attempts + 1, claimed_by = p_claimer,
               lease_token = v_token, claim_expires_at = v_expires, claimed_at = p_now, updated_at = p_now
         WHERE j.shard = p_shard AND j.id = ANY (p_ids) AND j.state IN ('scheduled', 'retrying')
           AND (j.deadline IS NULL OR j.deadline > p_now OR j.attempts > 0)
        RETURNING j AS job
    )
    SELECT array_agg(c.job ORDER BY (c.job).strict DESC, (c.job).priority DESC, (c.job).run_at) INTO v_claimed
      FROM claimed c;
    IF v_claimed IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM unnest(v_claimed) c WHERE c.series_id IS NOT NULL) THEN
            v_chain := ARRAY(SELECT mh_series_to_chain(p_shard,
                                                       ARRAY(SELECT c.series_id FROM unnest(v_claimed) c
                                                              WHERE c.series_id IS NOT NULL),
                                                       ARRAY(SELECT c.id FROM unnest(v_claimed) c
                                                              WHERE c.series_id IS NOT NULL)));
            UPDATE series s SET chain_after = s.last_due_at, updated_at = p_now
             WHERE s.shard = p_shard AND s.id = ANY (v_chain);
        END IF;
        v_done := ARRAY(SELECT c.id FROM unnest(v_claimed) c);
        INSERT INTO claim_checks (shard, check_at, job_ids) VALUES (p_shard, v_expires, v_done);
        -- A row per team, in team order (INSERT ... SELECT would go through
        -- Citus' coordinator and commit in two phases; a claim names few teams).
        FOR v_team, v_count IN SELECT c.team_id, count(*) FROM unnest(v_claimed) c GROUP BY c.team_id ORDER BY c.team_id
        LOOP
            INSERT INTO team_running AS r (shard, team_id, running) VALUES (p_shard, v_team, v_count)
            ON CONFLICT (shard, team_id) DO UPDATE SET running = r.running + excluded.running;
        END LOOP;
        IF EXISTS (SELECT 1 FROM unnest(v_claimed) c WHERE c.idempotency_key IS NOT NULL) THEN
            SELECT array_agg(k) INTO v_keys FROM idempotency_keys k
             WHERE k.shard = p_shard AND k.key = ANY (ARRAY(SELECT c.idempotency_key FROM unnest(v_claimed) c
                                                             WHERE c.idempotency_key IS NOT NULL))
               AND k.completed_at IS NOT NULL;
        END IF;
    END IF;
    RETURN QUERY
    SELECT c.id, t.name, c.name, c.payload::text, c.attempts, c.max_attempts, c.idempotency_key,
           c.lease_token, c.claim_expires_at, mh_readable(c.due_at), mh_readable(c.run_at),
           CASE WHEN k.key IS NOT NULL THEN coalesce(k.result::text, 'null') END, c.team_id, c.strict, c.priority,
           c.traceparent
      FROM unnest(v_claimed) WITH ORDINALITY AS c
      JOIN teams t ON t.id = c.team_id
      LEFT JOIN unnest(v_keys) k ON k.team_id = c.team_id AND k.key = c.idempotency_key AND k.job_id = c.id
     ORDER BY c.ordinality;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    IF v_got < cardinality(p_ids) THEN
        PERFORM mh_drop_missed(p_shard, p_ids, p_now);
    END IF;
END $$;

-- Where a shard's claims start reading: its hand (the oldest minute bucket
-- that may still hold its due rows), never behind the sweep line (older
-- buckets are carried forward by maintenance). A shard never claimed
-- before starts at the sweep line, so rows that came due before its first
-- claim are found at once rather than by the sweep.
CREATE OR REPLACE FUNCTION mh_hand(p_shard int, p_cur timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
BEGIN
    -- (PL/pgSQL, as mh_lease_problem.)
    RETURN (SELECT greatest(coalesce(max(s.hand), p_cur - mh_sweep_after()), p_cur - mh_sweep_after())
              FROM shards s WHERE s.shard = p_shard);
END $$;

-- Claim up to p_limit due jobs of one shard for a worker, of the given
-- names and teams (NULL: any), in the shard's own order: bucket by bucket
-- from the hand, strict before flexible, higher priority first, oldest
-- first. One shard per call: a row-locking statement must name one shard
-- value to stay single-shard on Citus; the dispatcher sends many shards'
-- claims in one round trip, so nothing expected raises: a stale lease is
-- one row naming why (`refused`, every other column NULL), checked in the
-- claim's own transaction. (The dispatcher orders and shares out across
-- its shards with claim_planned; this is the form for one shard on its own,
-- and for workers that take only some job names.)
CREATE OR REPLACE FUNCTION claim_due(p_shard int, p_limit int, p_owner text, p_epoch bigint, p_lease_s real,
                                     p_worker text DEFAULT NULL, p_names text[] DEFAULT NULL,
                                     p_teams text[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, traceparent text, refused text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := mh_now();
    v_cur      timestamptz := mh_minute(v_now);
    v_problem  text := mh_lease_problem(p_shard, p_owner, p_epoch, v_now);
    v_bucket   timestamptz;
    v_left     int := p_limit;
    v_got      int;
    v_ids      bigint[];
    v_team_ids int[];
BEGIN
    IF v_problem IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
                            NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
                            NULL::text, v_problem;
        RETURN;
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'limit must be between 1 and 10000';
    END IF;
    IF p_lease_s IS NULL OR NOT (p_lease_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'claim lease must be between 1 and 86400 seconds';
    END IF;
    IF p_teams IS NOT NULL THEN
        -- Unknown names match no job (a worker may list a team before it exists).
        v_team_ids := ARRAY(SELECT t.id FROM teams t WHERE t.name = ANY (p_teams));
    END IF;
    v_bucket := mh_hand(p_shard, v_cur);
    LOOP
        -- A bucket behind now is usually drained: a cheap probe first.
        IF v_bucket >= v_cur OR mh_bucket_has_rows(v_bucket, p_shard) THEN
            IF p_names IS NULL AND p_teams IS NULL THEN
                EXECUTE mh_claim_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left;
            ELSE
                EXECUTE mh_claim_filtered_sql(mh_minute_slot(v_bucket)) INTO v_ids
                  USING p_shard, v_now, v_left, p_names, v_team_ids;
            END IF;
            RETURN QUERY
            SELECT c.job_id, c.team, c.name, c.payload, c.attempt, c.max_attempts, c.idempotency_key, c.lease_token,
                   c.claim_expires_at, c.due_at, c.run_at, c.replay, c.traceparent, NULL::text
              FROM mh_take_claimed(p_shard, v_ids, coalesce(p_worker, p_owner), p_lease_s, v_now) c;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            EXIT WHEN v_left <= 0;
        END IF;
        EXIT WHEN v_bucket >= v_cur;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
END $$;

-- The dispatcher's claim: from one bucket of one shard, for each cell
-- (strict, priority, team) up to its limit, the cells it chose across all
-- its shards by order, quota and rotation (app/minutehand/dispatch/fairness.py); of
-- those job names only, for workers that take only some (NULL: any). Rows
-- as claim_due's, with the cell each job came from (team_id, strict,
-- priority), so the dispatcher can count down what it knows is due. A
-- stale lease: one row naming why, as claim_due.
CREATE OR REPLACE FUNCTION claim_planned(p_shard int, p_owner text, p_epoch bigint, p_lease_s real, p_worker text,
                                         p_bucket timestamptz, p_stricts boolean[], p_priorities smallint[],
                                         p_teams int[], p_limits int[], p_names text[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, team_id int, strict boolean, priority smallint,
               traceparent text, refused text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_problem text := mh_lease_problem(p_shard, p_owner, p_epoch, v_now);
    v_ids     bigint[];
    v_n       int := cardinality(p_limits);
BEGIN
    IF v_problem IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
                            NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
                            NULL::int, NULL::boolean, NULL::smallint, NULL::text, v_problem;
        RETURN;
    END IF;
    IF p_bucket IS NULL OR v_n IS NULL OR cardinality(p_stricts) IS DISTINCT FROM v_n
       OR cardinality(p_priorities) IS DISTINCT FROM v_n OR cardinality(p_teams) IS DISTINCT FROM v_n
       OR (SELECT bool_or(l IS NULL OR l < 1) OR sum(l) > 10000 FROM unnest(p_limits) l) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = 'a planned claim needs a bucket and cells of equal length, each limit at least 1, 10000 in all';
    END IF;
    IF p_lease_s IS NULL OR NOT (p_lease_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'claim lease must be between 1 and 86400 seconds';
    END IF;
    EXECUTE mh_claim_cells_sql(mh_minute_slot(p_bucket), p_names IS NOT NULL) INTO v_ids
      USING p_shard, p_stricts, p_priorities, p_teams, p_limits, v_now, p_names;
    RETURN QUERY
    SELECT c.*, NULL::text FROM mh_take_claimed(p_shard, v_ids, coalesce(p_worker, p_owner), p_lease_s, v_now) c;
END $$;

-- claim_planned for many shards of one bucket at once, for plain
-- PostgreSQL: $1 the shard of each cell, then as mh_claim_cells_sql. One
-- statement plans and locks the bucket's partition once for the round, where
-- a statement per shard would plan it once per shard (most of a claim's cost
-- when jobs trickle in and each shard has one or two due). Not for Citus: a
-- row-locking statement there must name one shard.
CREATE OR REPLACE FUNCTION mh_claim_shards_sql(p_slot int, p_named boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.ctid = ANY (ARRAY(
                   SELECT x.ctid
                     FROM unnest($1::int[], $2::boolean[], $3::smallint[], $4::int[], $5::int[])
                          AS k(shard, strict, priority, team_id, lim)
                    CROSS JOIN LATERAL (
                          SELECT c.ctid FROM %1$I c %2$s
                           WHERE c.shard = k.shard AND c.strict = k.strict AND c.priority = k.priority
                             AND c.team_id = k.team_id AND c.run_at <= $6 %3$s
                           ORDER BY c.run_at
                           LIMIT k.lim
                             FOR UPDATE OF c SKIP LOCKED) x))
            RETURNING d.shard, d.job_id
        )
        SELECT array_agg(shard ORDER BY shard, job_id), array_agg(job_id ORDER BY shard, job_id) FROM picked
    $f$, mh_minute_part(p_slot),
       CASE WHEN p_named THEN 'JOIN jobs j ON j.shard = c.shard AND j.id = c.job_id' ELSE '' END,
       CASE WHEN p_named THEN 'AND j.name = ANY ($7)' ELSE '' END)
$$;

-- mh_take_claimed for the jobs of many shards at once (p_shards the shard of
-- each id, sorted by shard), for claim_planned_shards on plain PostgreSQL:
-- each step one statement for all of them, rows locked in shard order (the
-- order outcome batches lock team_running rows in), one reminder row per
-- shard. The rare steps (series to chain, misfires) go shard by shard.
CREATE OR REPLACE FUNCTION mh_take_claimed_shards(p_shards int[], p_ids bigint[], p_claimer text, p_lease_s real,
                                                  p_now timestamptz)
RETURNS TABLE (shard int, job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, team_id int, strict boolean, priority smallint,
               traceparent text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_token   uuid := gen_random_uuid();
    v_expires timestamptz := p_now + make_interval(secs => p_lease_s);
    v_claimed jobs[];
    v_keys    idempotency_keys[];
    v_shard   int;
    v_missed  bigint[];
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    WITH claimed AS (
        UPDATE jobs j
           SET state = 'claimed', attempts = j.attempts + 1, claimed_by = p_claimer,
               lease_token = v_token, claim_expires_at = v_expires, claimed_at = p_now, updated_at = p_now
          FROM unnest(p_shards, p_ids) AS t(shard, id)
         WHERE j.shard = t.shard AND j.id = t.id AND j.state IN ('scheduled', 'retrying')
           AND (j.deadline IS NULL OR j.deadline > p_now OR j.attempts > 0)
        RETURNING j AS job
    )
    SELECT array_agg(c.job ORDER BY (c.job).shard, (c.job).strict DESC, (c.job).priority DESC, (c.job).run_at)
      INTO v_claimed FROM claimed c;
    IF v_claimed IS NOT NULL THEN
        FOR v_shard IN SELECT DISTINCT c.shard FROM unnest(v_claimed) c WHERE c.series_id IS NOT NULL ORDER BY 1 LOOP
            UPDATE series s SET chain_after = s.last_due_at, updated_at = p_now
             WHERE s.shard = v_shard
               AND s.id IN (SELECT mh_series_to_chain(v_shard,
                                                      ARRAY(SELECT c.series_id FROM unnest(v_claimed) c
                                                             WHERE c.shard = v_shard AND c.series_id IS NOT NULL),
                                                      ARRAY(SELECT c.id FROM unnest(v_claimed) c
                                                             WHERE c.shard = v_shard AND c.series_id IS NOT NULL)));
        END LOOP;
        INSERT INTO claim_checks (shard, check_at, job_ids)
        SELECT c.shard, v_expires, array_agg(c.id) FROM unnest(v_claimed) c GROUP BY c.shard ORDER BY c.shard;
        INSERT INTO team_running AS r (shard, team_id, running)
        SELECT c.shard, c.team_id, count(*) FROM unnest(v_claimed) c GROUP BY c.shard, c.team_id
         ORDER BY c.shard, c.team_id
        ON CONFLICT (shard, team_id) DO UPDATE SET running = r.running + excluded.running;
        IF EXISTS (SELECT 1 FROM unnest(v_claimed) c WHERE c.idempotency_key IS NOT NULL) THEN
            SELECT array_agg(k) INTO v_keys FROM idempotency_keys k
              JOIN unnest(v_claimed) c ON k.shard = c.shard AND k.key = c.idempotency_key
             WHERE k.completed_at IS NOT NULL;
        END IF;
    END IF;
    RETURN QUERY
    SELECT c.shard::int, c.id, t.name, c.name, c.payload::text, c.attempts, c.max_attempts, c.idempotency_key,
           c.lease_token, c.claim_expires_at, mh_readable(c.due_at), mh_readable(c.run_at),
           CASE WHEN k.key IS NOT NULL THEN coalesce(k.result::text, 'null') END, c.team_id, c.strict, c.priority,
           c.traceparent
      FROM unnest(v_claimed) WITH ORDINALITY AS c
      JOIN teams t ON t.id = c.team_id
      LEFT JOIN unnest(v_keys) k ON k.shard = c.shard AND k.team_id = c.team_id AND k.key = c.idempotency_key
                                AND k.job_id = c.id
     ORDER BY c.ordinality;
    IF coalesce(cardinality(v_claimed), 0) < cardinality(p_ids) THEN
        FOR v_shard, v_missed IN
            SELECT t.shard, array_agg(t.id) FROM unnest(p_shards, p_ids) AS t(shard, id)
             WHERE NOT EXISTS (SELECT 1 FROM unnest(v_claimed) c WHERE c.shard = t.shard AND c.id = t.id)
             GROUP BY t.shard ORDER BY t.shard
        LOOP
            PERFORM mh_drop_missed(v_shard, v_missed, p_now);
        END LOOP;
    END IF;
END $$;

-- claim_planned for many shards of one bucket in one call, for plain
-- PostgreSQL (on Citus the dispatcher sends claim_planned per shard): the
-- cells as claim_planned's, each naming its shard (p_cell_shards), and the
-- epoch of each shard in p_shards. Rows as claim_planned's, with the shard
-- each came from; a shard whose lease is stale claims nothing and gives one
-- row naming why.
CREATE OR REPLACE FUNCTION claim_planned_shards(p_owner text, p_lease_s real, p_worker text, p_bucket timestamptz,
                                                p_shards int[], p_epochs bigint[], p_cell_shards int[],
                                                p_stricts boolean[], p_priorities smallint[], p_teams int[],
                                                p_limits int[], p_names text[] DEFAULT NULL)
RETURNS TABLE (shard int, job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, team_id int, strict boolean, priority smallint,
               traceparent text, refused text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := mh_now();
    v_n      int := cardinality(p_limits);
    v_stale  int[];
    v_shards int[];
    v_ids    bigint[];
BEGIN
    IF p_bucket IS NULL OR v_n IS NULL OR cardinality(p_stricts) IS DISTINCT FROM v_n
       OR cardinality(p_priorities) IS DISTINCT FROM v_n OR cardinality(p_teams) IS DISTINCT FROM v_n
       OR cardinality(p_cell_shards) IS DISTINCT FROM v_n
       OR cardinality(p_epochs) IS DISTINCT FROM cardinality(p_shards)
       OR (SELECT bool_or(l IS NULL OR l < 1) OR sum(l) > 10000 FROM unnest(p_limits) l) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = 'a planned claim needs a bucket, an epoch per shard and cells of equal length, each limit at least 1, 10000 in all';
    END IF;
    IF p_lease_s IS NULL OR NOT (p_lease_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'claim lease must be between 1 and 86400 seconds';
    END IF;
    v_stale := ARRAY(SELECT u.shard FROM unnest(p_shards, p_epochs) AS u(shard, epoch)
                      WHERE NOT EXISTS (SELECT 1 FROM shards s
                                         WHERE s.shard = u.shard AND s.owner = p_owner AND s.epoch = u.epoch
                                           AND s.lease_expires_at > v_now));
    RETURN QUERY
    SELECT u.shard, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
           NULL::int, NULL::boolean, NULL::smallint, NULL::text,
           format('shard %s: %L does not hold a current lease with epoch %s', u.shard, p_owner, u.epoch)
      FROM unnest(p_shards, p_epochs) AS u(shard, epoch) WHERE u.shard = ANY (v_stale);
    SELECT array_agg(k.shard), array_agg(k.strict), array_agg(k.priority), array_agg(k.team_id), array_agg(k.lim)
      INTO v_shards, p_stricts, p_priorities, p_teams, p_limits
      FROM unnest(p_cell_shards, p_stricts, p_priorities, p_teams, p_limits) AS k(shard, strict, priority, team_id, lim)
     WHERE k.shard <> ALL (v_stale);
    IF v_shards IS NULL THEN
        RETURN;
    END IF;
    EXECUTE mh_claim_shards_sql(mh_minute_slot(p_bucket), p_names IS NOT NULL) INTO v_shards, v_ids
      USING v_shards, p_stricts, p_priorities, p_teams, p_limits, v_now, p_names;
    RETURN QUERY
    SELECT c.*, NULL::text FROM mh_take_claimed_shards(v_shards, v_ids, coalesce(p_worker, p_owner), p_lease_s, v_now) c;
END $$;

-- What a shard has due, as the dispatcher plans from it: per bucket (from
-- the hand to the current one), class (strict, priority) and team, how
-- many rows are due now and the oldest run time among them; then one row
-- with team_id NULL whose next_at is the earliest run time not yet due in
-- the current and next buckets (NULL: none), when the dispatcher looks
-- again. Counting reads the claim index in its own order. The hand moves
-- past buckets it finds empty, never closer than a minute behind now (rows
-- whose submitter read the clock just before the minute turned and
-- committed just after), and only over buckets with no row of this shard
-- left, locked or not: a claimer that dies mid-transaction must not leave
-- its rows stranded behind the hand. With p_since, only the rows that came
-- due by the clock since then (run_at >= p_since, the next run time the last
-- look gave), from the buckets that can hold them, and the hand stays: the
-- dispatcher adds them to what it knows, without counting the rest again.
CREATE OR REPLACE FUNCTION due_edge(p_shard int, p_since timestamptz DEFAULT NULL)
RETURNS TABLE (bucket timestamptz, strict boolean, priority smallint, team_id int, due int,
               oldest timestamptz, next_at timestamptz)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_cur    timestamptz := mh_minute(v_now);
    v_hand   timestamptz := mh_hand(p_shard, v_cur);
    v_bucket timestamptz := greatest(v_hand, mh_minute(coalesce(p_since, v_hand)));
    v_found  int;
    v_next   timestamptz;
BEGIN
    WHILE v_bucket <= v_cur LOOP
        IF v_bucket >= v_cur - interval '1 minute' OR mh_bucket_has_rows(v_bucket, p_shard) THEN
            RETURN QUERY EXECUTE format(
                $f$SELECT $2, d.strict, d.priority, d.team_id, count(*)::int, min(d.run_at), NULL::timestamptz
                     FROM %I d WHERE d.shard = $1 AND d.run_at <= $3 AND ($4::timestamptz IS NULL OR d.run_at >= $4)
                    GROUP BY d.strict, d.priority, d.team_id$f$, mh_minute_part(mh_minute_slot(v_bucket)))
              USING p_shard, v_bucket, v_now, p_since;
            GET DIAGNOSTICS v_found = ROW_COUNT;
        ELSE
            v_found := 0;
        END IF;
        IF p_since IS NULL AND v_found = 0 AND v_bucket = v_hand AND v_bucket < v_cur - interval '1 minute' THEN
            v_hand := v_bucket + interval '1 minute';
        END IF;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
    IF v_hand IS DISTINCT FROM (SELECT s.hand FROM shards s WHERE s.shard = p_shard) THEN
        PERFORM mh_move_hand(p_shard, v_hand);
    END IF;
    v_bucket := v_cur;
    WHILE v_next IS NULL AND v_bucket <= v_cur + interval '1 minute' LOOP
        EXECUTE format('SELECT min(run_at) FROM %I WHERE shard = $1 AND run_at > $2',
                       mh_minute_part(mh_minute_slot(v_bucket)))
           INTO v_next USING p_shard, v_now;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
    RETURN QUERY SELECT NULL::timestamptz, NULL::boolean, NULL::smallint, NULL::int, NULL::int, NULL::timestamptz,
                        v_next;
END $$;

-- due_edge for many shards at once, in one statement, each row naming its
-- shard (p_since: per shard, as due_edge's, NULL for a whole read): one
-- statement per bucket from the oldest shard's start to the current bucket
-- for all of them (each shard's range of the claim index, as due_edge reads
-- it; a whole bucket read at once would also read the dead rows of its
-- claims), their next run times in one pass, and the hands moved as
-- due_edge moves them: over each empty bucket from the hand (whole reads
-- only), one statement per bucket for the shards whose hand is there, never
-- closer than a minute behind now. When jobs trickle in over hundreds of
-- shards a read costs per bucket and row, not per shard; a fresh database
-- (every hand unset: 30 buckets back) costs per bucket too, which on Citus
-- is one multi-shard read each instead of a router statement per shard and
-- bucket. On Citus, which plans no correlated read of a distributed table
-- from unnest(), the next run times and the empty buckets are read grouped
-- by shard over `shard = ANY`.
-- With p_cap, a cell's count stops at p_cap rows (its oldest): behind a
-- backlog a read costs per cell, not per waiting row, and the dispatcher
-- reads a shard again once it has claimed a capped cell down. On Citus,
-- where counts group by shard, every due row is still read (the count is
-- capped after).
-- Each cell also names the job names of the rows it counted (`names`, a
-- primary-key probe of `jobs` per counted row), so that a worker taking only
-- some names is not served from a shard whose due rows are all of others;
-- NULL (unknown) where the count reached the cap (rows not seen) and past
-- mh_edge_names() distinct names.
-- With p_routed (on Citus, for shards of one Citus shard), every read of a
-- distributed table names the shards, so that Citus routes it to that
-- shard's worker node alone: the read works while another node is away.
-- Over many shards that costs more than the reads grouped by shard.
CREATE OR REPLACE FUNCTION due_edges(p_shards int[], p_since timestamptz[], p_cap int DEFAULT NULL,
                                     p_routed boolean DEFAULT false)
RETURNS TABLE (shard int, bucket timestamptz, strict boolean, priority smallint, team_id int, due int,
               oldest timestamptz, next_at timestamptz, names text[])
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_cur     timestamptz := mh_minute(v_now);
    v_sweep   timestamptz := v_cur - mh_sweep_after();
    v_citus   boolean := mh_on_citus();
    v_shards  int[];
    v_starts  timestamptz[];
    v_since   timestamptz[];
    v_hands   timestamptz[];          -- where each shard's hand goes (mh_hand's, then moved)
    v_stored  timestamptz[];          -- each shard's hand as stored (NULL: never set)
    v_bucket  timestamptz;
    v_here    int[];                  -- the shards whose hand may move on from this bucket
    v_empty   int[];
BEGIN
    IF cardinality(p_since) IS DISTINCT FROM cardinality(p_shards) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'due_edges needs one since (or NULL) per shard';
    END IF;
    IF p_cap < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'due_edges counts at least 1 row per cell, or all (NULL)';
    END IF;
    -- Each shard's hand as mh_hand gives it (never behind the sweep line),
    -- and where its read starts (a read since a time: that time's bucket).
    EXECUTE format(
        $f$SELECT array_agg(x.shard ORDER BY x.shard), array_agg(greatest(x.hand, mh_minute(coalesce(x.since, x.hand))) ORDER BY x.shard),
                  array_agg(x.since ORDER BY x.shard), array_agg(x.hand ORDER BY x.shard), array_agg(x.stored ORDER BY x.shard)
             FROM (SELECT u.shard, u.since, greatest(coalesce(s.hand, $3), $3) AS hand, s.hand AS stored
                     FROM unnest($1::int[], $2::timestamptz[]) AS u(shard, since)
                     LEFT JOIN shards s ON s.shard = u.shard %s) x$f$,
        CASE WHEN p_routed THEN 'AND s.shard = ANY ($1)' END)
      INTO v_shards, v_starts, v_since, v_hands, v_stored
      USING p_shards, p_since, v_sweep;
    IF v_shards IS NULL THEN
        RETURN;
    END IF;
    v_bucket := (SELECT min(t) FROM unnest(v_starts) t);
    WHILE v_bucket <= v_cur LOOP
        RETURN QUERY EXECUTE format(CASE WHEN v_citus THEN
            -- Each shard's due rows counted grouped by shard, the count
            -- capped after; the names of a cell counted whole probed from
            -- its ids (a cell counted up to the cap is probed for none).
            $f$SELECT x.shard, $4, d.strict, d.priority, d.team_id, d.due, d.oldest, NULL::timestamptz, d.names
                 FROM unnest($1::int[], $2::timestamptz[], $3::timestamptz[]) AS x(shard, start, since)
                CROSS JOIN LATERAL (
                      SELECT k.strict, k.priority, k.team_id, least(k.due, $6)::int AS due, k.oldest, n.names
                        FROM (SELECT c.shard, c.strict, c.priority, c.team_id, count(*) AS due,
                                     min(c.run_at) AS oldest, array_agg(c.job_id) AS ids
                                FROM %1$I c
                               WHERE c.shard = x.shard %2$s AND c.run_at <= $5
                                 AND (x.since IS NULL OR c.run_at >= x.since)
                               GROUP BY c.shard, c.strict, c.priority, c.team_id) k
                        LEFT JOIN LATERAL (
                              SELECT CASE WHEN count(DISTINCT j.name) <= mh_edge_names()
                                          THEN array_agg(DISTINCT j.name) END AS names
                                FROM jobs j
                               WHERE coalesce(k.due < $6, true) AND j.shard = k.shard %3$s
                                 AND j.id = ANY (k.ids)) n
                          ON true) d
                WHERE x.start <= $4$f$
          ELSE
            -- Each shard's cells found by skipping through the claim index
            -- (one descent per cell: the next team, else the next priority,
            -- else the next strictness; none past the shard's last cell,
            -- found by one descent from the end, as most shards have one
            -- cell), then each cell's due rows counted oldest first up to
            -- the cap.
            $f$SELECT x.shard, $4, d.strict, d.priority, d.team_id, d.due, d.oldest, NULL::timestamptz, d.names
                 FROM unnest($1::int[], $2::timestamptz[], $3::timestamptz[]) AS x(shard, start, since)
                CROSS JOIN LATERAL (
                      WITH RECURSIVE cell AS (
                          (SELECT c.strict, c.priority, c.team_id FROM %1$I c WHERE c.shard = x.shard
                            ORDER BY c.strict DESC, c.priority DESC, c.team_id LIMIT 1)
                        UNION ALL
                          SELECT n.strict, n.priority, n.team_id
                            FROM cell p CROSS JOIN LATERAL (
                                  (SELECT c.strict, c.priority, c.team_id FROM %1$I c
                                    WHERE c.shard = x.shard AND c.strict = p.strict AND c.priority = p.priority
                                      AND c.team_id > p.team_id
                                    ORDER BY c.team_id LIMIT 1)
                                  UNION ALL
                                  (SELECT c.strict, c.priority, c.team_id FROM %1$I c
                                    WHERE c.shard = x.shard AND c.strict = p.strict AND c.priority < p.priority
                                    ORDER BY c.priority DESC, c.team_id LIMIT 1)
                                  UNION ALL
                                  (SELECT c.strict, c.priority, c.team_id FROM %1$I c
                                    WHERE c.shard = x.shard AND c.strict < p.strict
                                    ORDER BY c.strict DESC, c.priority DESC, c.team_id LIMIT 1)
                                  LIMIT 1) n
                           WHERE (p.strict, p.priority, p.team_id) <>
                                 (SELECT c.strict, c.priority, c.team_id FROM %1$I c WHERE c.shard = x.shard
                                   ORDER BY c.strict, c.priority, c.team_id DESC LIMIT 1))
                      SELECT p.strict, p.priority, p.team_id, k.due, k.oldest, n.names
                        FROM cell p CROSS JOIN LATERAL (
                              SELECT count(*)::int AS due, min(r.run_at) AS oldest, array_agg(r.job_id) AS ids
                                FROM (SELECT c.run_at, c.job_id FROM %1$I c
                                       WHERE c.shard = x.shard AND c.strict = p.strict AND c.priority = p.priority
                                         AND c.team_id = p.team_id
                                         AND c.run_at <= $5 AND c.run_at >= coalesce(x.since, '-infinity')
                                       ORDER BY c.run_at LIMIT $6) r) k
                       CROSS JOIN LATERAL (      -- (no probe for a cell counted up to the cap: unknown)
                              SELECT CASE WHEN count(DISTINCT j.name) <= mh_edge_names()
                                          THEN array_agg(DISTINCT j.name) END AS names
                                FROM jobs j
                               WHERE coalesce(k.due < $6, true) AND j.shard = x.shard AND j.id = ANY (k.ids)) n
                       WHERE k.due > 0) d
                WHERE x.start <= $4$f$ END,
            mh_minute_part(mh_minute_slot(v_bucket)), CASE WHEN p_routed THEN 'AND c.shard = ANY ($1)' END,
            CASE WHEN p_routed THEN 'AND j.shard = ANY ($1)' END)
          USING v_shards, v_starts, v_since, v_bucket, v_now, p_cap;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
    RETURN QUERY EXECUTE format(CASE WHEN v_citus THEN
        $f$SELECT x.shard, NULL::timestamptz, NULL::boolean, NULL::smallint, NULL::int, NULL::int,
                  NULL::timestamptz, coalesce(a.next_at, b.next_at), NULL::text[]
             FROM unnest($1::int[]) AS x(shard)
             LEFT JOIN (SELECT n.shard, min(n.run_at) AS next_at FROM %1$I n
                         WHERE n.shard = ANY ($1) AND n.run_at > $2 GROUP BY n.shard) a ON a.shard = x.shard
             LEFT JOIN (SELECT n.shard, min(n.run_at) AS next_at FROM %2$I n
                         WHERE n.shard = ANY ($1) AND n.run_at > $2 GROUP BY n.shard) b ON b.shard = x.shard$f$
      ELSE
        $f$SELECT x.shard, NULL::timestamptz, NULL::boolean, NULL::smallint, NULL::int, NULL::int,
                  NULL::timestamptz,
                  coalesce((SELECT min(n.run_at) FROM %1$I n WHERE n.shard = x.shard AND n.run_at > $2),
                           (SELECT min(n.run_at) FROM %2$I n WHERE n.shard = x.shard AND n.run_at > $2)),
                  NULL::text[]
             FROM unnest($1::int[]) AS x(shard)$f$ END,
        mh_minute_part(mh_minute_slot(v_cur)), mh_minute_part(mh_minute_slot(v_cur + interval '1 minute')))
      USING v_shards, v_now;
    -- The hands of whole reads move on over empty buckets, bucket by bucket
    -- from the oldest, while they stay two or more minutes behind.
    v_bucket := (SELECT min(h) FROM unnest(v_hands) h);
    WHILE v_bucket < v_cur - interval '1 minute' LOOP
        v_here := ARRAY(SELECT x.shard FROM unnest(v_shards, v_hands, v_since) AS x(shard, hand, since)
                         WHERE x.since IS NULL AND x.hand = v_bucket);
        IF cardinality(v_here) > 0 THEN
            EXECUTE format(
                $f$SELECT array_agg(x.shard) FROM unnest($1::int[]) AS x(shard) WHERE $f$ || CASE WHEN v_citus
                THEN $f$x.shard <> ALL (ARRAY(SELECT DISTINCT d.shard FROM %1$I d WHERE d.shard = ANY ($1)))$f$
                ELSE $f$NOT EXISTS (SELECT 1 FROM %1$I d WHERE d.shard = x.shard)$f$ END,
                mh_minute_part(mh_minute_slot(v_bucket)))
              INTO v_empty USING v_here;
            v_hands := ARRAY(SELECT CASE WHEN x.shard = ANY (v_empty) AND x.hand = v_bucket
                                         THEN x.hand + interval '1 minute' ELSE x.hand END
                               FROM unnest(v_shards, v_hands) WITH ORDINALITY AS x(shard, hand, o) ORDER BY x.o);
        END IF;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
    PERFORM mh_move_hand(x.shard, x.hand)
       FROM unnest(v_shards, v_hands, v_stored) AS x(shard, hand, stored)
      WHERE x.hand IS DISTINCT FROM x.stored;
END $$;
