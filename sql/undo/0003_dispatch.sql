-- Undo revision 0003 (sql/008_dispatch.sql): drop what it made and put back
-- the revision-0001 bodies it replaced (copied from sql/002_wheel.sql and
-- sql/004_claim.sql).
DROP FUNCTION claim_for_worker(int, int, text, bigint, real, text, text[]);
DROP FUNCTION release_many(bigint[], uuid[]);
DROP FUNCTION claim_due(int, int, text, bigint, real, text, text[]);
DROP FUNCTION mh_claim_named_sql(int);
DROP FUNCTION take_duty_lease(text, text, real);
DROP FUNCTION leave_dispatchers(text);
DROP FUNCTION dispatcher_members(text, real);
DROP TABLE duty_leases;
DROP TABLE dispatchers;
DROP TABLE worker_tokens;

CREATE OR REPLACE FUNCTION mh_enqueue(p_shard smallint, p_job bigint, p_run_at timestamptz,
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

CREATE OR REPLACE FUNCTION mh_enqueue_many(p_rows due_row[], p_now timestamptz,
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

CREATE FUNCTION claim_due(p_shard int, p_limit int, p_owner text, p_epoch bigint,
                          p_lease_s real, p_worker text DEFAULT NULL)
RETURNS TABLE (job_id bigint, team_id int, name text, payload jsonb, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, priority smallint, strict boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_cur     timestamptz := mh_minute(v_now);
    v_hand    timestamptz;
    v_bucket  timestamptz;
    v_left    int := p_limit;
    v_got     int;
    v_any     boolean;
    v_ids     bigint[];
    v_token   uuid := gen_random_uuid();
    v_expires timestamptz := v_now + make_interval(secs => p_lease_s);
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'limit must be between 1 and 10000';
    END IF;
    IF p_lease_s IS NULL OR NOT (p_lease_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'claim lease must be between 1 and 86400 seconds';
    END IF;
    SELECT s.hand INTO v_hand FROM shards s
     WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch AND s.lease_expires_at > v_now;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH403',
            MESSAGE = format('shard %s: %L does not hold a current lease with epoch %s', p_shard, p_owner, p_epoch);
    END IF;
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
            EXECUTE mh_claim_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left;
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
            )
            SELECT * FROM claimed c ORDER BY c.strict DESC, c.priority DESC, c.run_at;
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
