-- The claim: shard leases with a fencing epoch, and taking due jobs off the
-- wheel for workers.

-- Take or renew the lease on one shard for p_ttl_s seconds. Returns the epoch
-- to pass to claim_due, or NULL while another owner's lease is unexpired.
-- The epoch rises whenever the lease changes hands (or lapsed), so a paused
-- old owner that wakes up holds a stale epoch and its claims are refused.
CREATE OR REPLACE FUNCTION take_shard_lease(p_shard int, p_owner text, p_ttl_s real) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_expires timestamptz := v_now + make_interval(secs => p_ttl_s);
    v_epoch   bigint;
BEGIN
    UPDATE shards s
       SET owner = p_owner, lease_expires_at = v_expires,
           epoch = CASE WHEN s.owner = p_owner AND s.lease_expires_at > v_now THEN s.epoch ELSE s.epoch + 1 END
     WHERE s.shard = p_shard
       AND (s.owner IS NULL OR s.owner = p_owner OR s.lease_expires_at <= v_now)
    RETURNING s.epoch INTO v_epoch;
    RETURN v_epoch;
END $$;

-- Give a shard up at once (a clean shutdown), so another takes it without
-- waiting for expiry. Only the current holder of the epoch can.
CREATE OR REPLACE FUNCTION release_shard_lease(p_shard int, p_owner text, p_epoch bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    UPDATE shards s SET owner = NULL, lease_expires_at = NULL
     WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch;
    RETURN FOUND;
END $$;

-- Why p_owner does not hold the current lease of a shard with epoch p_epoch
-- (NULL: it does).
CREATE OR REPLACE FUNCTION mh_lease_problem(p_shard int, p_owner text, p_epoch bigint, p_now timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT EXISTS (
        SELECT 1 FROM shards s
         WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch AND s.lease_expires_at > p_now)
    THEN format('shard %s: %L does not hold a current lease with epoch %s', p_shard, p_owner, p_epoch) END
$$;

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
             WHERE d.ctid = ANY (ARRAY(
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
-- only some teams' jobs ($5, team ids; NULL: any). The due rows carry
-- neither, so each candidate is joined to its job (a primary-key probe);
-- rows of other names or teams are skipped, and stay for a worker that
-- takes them.
CREATE OR REPLACE FUNCTION mh_claim_filtered_sql(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.ctid = ANY (ARRAY(
                   SELECT c.ctid FROM %1$I c
                     JOIN jobs j ON j.shard = c.shard AND j.id = c.job_id
                    WHERE c.shard = $1 AND c.run_at <= $2
                      AND ($4::text[] IS NULL OR j.name = ANY ($4))
                      AND ($5::int[] IS NULL OR j.team_id = ANY ($5))
                    ORDER BY c.strict DESC, c.priority DESC, c.run_at
                    LIMIT $3
                      FOR UPDATE OF c SKIP LOCKED))
            RETURNING d.job_id
        )
        SELECT array_agg(job_id) FROM picked
    $f$, mh_minute_part(p_slot))
$$;

-- Claim up to p_limit due jobs of one shard for a worker, of the given
-- names and teams (NULL: any). One shard per call: a row-locking statement
-- must name one shard value to stay single-shard on Citus; the dispatcher
-- sends many shards' claims in one round trip, so nothing expected raises:
-- a stale lease is one row naming why (`refused`, every other column NULL),
-- checked in the claim's own transaction. Each job names its team and
-- carries the result stored under its idempotency key within its TTL
-- (`replay`: the worker reports it instead of running the job); payload and
-- replay come as JSON text, handed on as they are. A time no client can read
-- (before year 1 or after 9999: a row written around the procedures) comes
-- as NULL, so that the dispatcher fails that job alone instead of failing
-- to read every row of the claim.
--
-- The shard's hand is the oldest minute bucket that may still hold its due
-- rows. Buckets are read from the hand forward to the current one, so a
-- bucket left behind (a stopped dispatcher, the midnight spike) drains
-- before newer ones. In steady state the hand sits one minute behind: the
-- claim probes the previous minute's partition (one index probe) and claims
-- from the current one. Two partitions, whatever the size of the wheel.
CREATE OR REPLACE FUNCTION claim_due(p_shard int, p_limit int, p_owner text, p_epoch bigint, p_lease_s real,
                                     p_worker text DEFAULT NULL, p_names text[] DEFAULT NULL,
                                     p_teams text[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, refused text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := mh_now();
    v_cur      timestamptz := mh_minute(v_now);
    v_problem  text := mh_lease_problem(p_shard, p_owner, p_epoch, v_now);
    v_hand     timestamptz;
    v_bucket   timestamptz;
    v_left     int := p_limit;
    v_got      int;
    v_any      boolean;
    v_ids      bigint[];
    v_team_ids int[];
    v_token    uuid := gen_random_uuid();
    v_expires  timestamptz := v_now + make_interval(secs => p_lease_s);
BEGIN
    IF v_problem IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
                            NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, v_problem;
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
    SELECT s.hand INTO v_hand FROM shards s WHERE s.shard = p_shard;
    -- A shard's first claim sets its hand; buckets older than the sweep line
    -- are carried forward by maintenance, so the hand never lags further.
    IF v_hand IS NULL OR v_hand < v_cur - mh_sweep_after() THEN
        v_hand := greatest(coalesce(v_hand, v_cur - interval '1 minute'), v_cur - mh_sweep_after());
        PERFORM mh_move_hand(p_shard, v_hand);
    END IF;
    v_bucket := v_hand;
    LOOP
        -- A bucket behind now is usually drained: a cheap probe first.
        v_any := v_bucket >= v_cur OR mh_bucket_has_rows(v_bucket, p_shard);
        IF v_any THEN
            IF p_names IS NULL AND p_teams IS NULL THEN
                EXECUTE mh_claim_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left;
            ELSE
                EXECUTE mh_claim_filtered_sql(mh_minute_slot(v_bucket)) INTO v_ids
                  USING p_shard, v_now, v_left, p_names, v_team_ids;
            END IF;
            -- Due rows of cancelled jobs were removed too, and claim nothing here.
            -- One reminder row files the whole batch for expire_claims.
            RETURN QUERY
            WITH claimed AS (
                UPDATE jobs j
                   SET state = 'claimed', attempts = j.attempts + 1, claimed_by = coalesce(p_worker, p_owner),
                       lease_token = v_token, claim_expires_at = v_expires, claimed_at = v_now, updated_at = v_now
                 WHERE j.shard = p_shard AND j.id = ANY (v_ids) AND j.state IN ('scheduled', 'retrying')
                RETURNING j.id, j.team_id, j.name, j.payload, j.attempts, j.max_attempts, j.idempotency_key,
                          j.lease_token, j.claim_expires_at, j.due_at, j.run_at, j.priority, j.strict
            ), reminder AS (
                INSERT INTO claim_checks (shard, check_at, job_ids)
                SELECT p_shard, v_expires, array_agg(c.id) FROM claimed c HAVING count(*) > 0
            ), counted AS (
                INSERT INTO team_running AS r (shard, team_id, running)
                SELECT p_shard, c.team_id, count(*) FROM claimed c GROUP BY c.team_id ORDER BY c.team_id
                ON CONFLICT (shard, team_id) DO UPDATE SET running = r.running + excluded.running
            )
            SELECT c.id, t.name, c.name, c.payload::text, c.attempts, c.max_attempts, c.idempotency_key,
                   c.lease_token, c.claim_expires_at, mh_readable(c.due_at), mh_readable(c.run_at),
                   k.result::text, NULL::text
              FROM claimed c
              JOIN teams t ON t.id = c.team_id
              LEFT JOIN idempotency_keys k
                ON c.idempotency_key IS NOT NULL AND k.shard = p_shard AND k.team_id = c.team_id
               AND k.key = c.idempotency_key AND k.completed_at IS NOT NULL AND k.expires_at > v_now
             ORDER BY c.strict DESC, c.priority DESC, c.run_at;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            EXIT WHEN v_left <= 0 OR v_bucket >= v_cur;
            v_any := mh_bucket_has_rows(v_bucket, p_shard);
        END IF;
        -- The hand moves past a bucket only when no row of this shard is left
        -- in it, locked by another claimer or not: a claimer that dies
        -- mid-transaction must not leave its rows stranded behind the hand.
        -- It stays one minute behind now, for rows whose submitter read the
        -- clock just before the minute turned and committed just after.
        IF NOT v_any AND v_bucket = v_hand AND v_bucket < v_cur - interval '1 minute' THEN
            v_hand := v_bucket + interval '1 minute';
            PERFORM mh_move_hand(p_shard, v_hand);
        END IF;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
END $$;

-- The earliest run time among this shard's rows in its current and next
-- buckets (and any behind the hand), or NULL when none is due before the
-- bucket after next begins. The dispatcher sleeps until then or a NOTIFY.
CREATE OR REPLACE FUNCTION next_due(p_shard int) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_cur    timestamptz := mh_minute(v_now);
    v_bucket timestamptz;
    v_min    timestamptz;
BEGIN
    SELECT greatest(coalesce(s.hand, v_cur - interval '1 minute'), v_cur - mh_sweep_after())
      INTO v_bucket FROM shards s WHERE s.shard = p_shard;
    WHILE v_bucket <= v_cur + interval '1 minute' LOOP
        EXECUTE format('SELECT min(run_at) FROM %I WHERE shard = $1', mh_minute_part(mh_minute_slot(v_bucket)))
           INTO v_min USING p_shard;
        EXIT WHEN v_min IS NOT NULL;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
    RETURN v_min;
END $$;
