-- Dispatchers and workers (revision 0003): who may lease work, which
-- dispatchers are alive (to split the shards between them), global duties
-- under a lease row, wake-ups on due-now work, the claim by job names, and
-- giving back jobs a worker did not start.

-- ---------------------------------------------------------------- fleet tokens
-- Worker credentials: only a worker may lease, heartbeat or complete jobs.
-- Only the sha256 of a token is kept (a reference table on Citus).
CREATE TABLE worker_tokens (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    token_hash  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------- membership
-- Each dispatcher renews its row as often as its shard leases; the live
-- rows are the members the shards are divided between. A member that stops
-- renewing drops out when its row expires, together with its leases.
CREATE TABLE dispatchers (
    name        text PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);

CREATE FUNCTION dispatcher_members(p_name text, p_ttl_s real) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE v_now timestamptz := mh_now();
BEGIN
    INSERT INTO dispatchers AS d (name, expires_at) VALUES (p_name, v_now + make_interval(secs => p_ttl_s))
    ON CONFLICT (name) DO UPDATE SET expires_at = excluded.expires_at;
    -- Long-gone members are forgotten (the table stays as small as the fleet).
    DELETE FROM dispatchers d WHERE d.expires_at < v_now - interval '1 hour';
    RETURN QUERY SELECT d.name FROM dispatchers d WHERE d.expires_at > v_now ORDER BY d.name;
END $$;

CREATE FUNCTION leave_dispatchers(p_name text) RETURNS void
LANGUAGE sql AS $$ DELETE FROM dispatchers WHERE name = p_name $$;

-- ---------------------------------------------------------------- duty leases
-- A duty for the whole wheel (cascade, sweep) runs in one dispatcher at a
-- time: the holder of this row until it expires. A row, not an advisory
-- lock: advisory locks are per node on Citus and vanish with a connection.
CREATE TABLE duty_leases (
    duty        text PRIMARY KEY,
    owner       text NOT NULL,
    expires_at  timestamptz NOT NULL
);

CREATE FUNCTION take_duty_lease(p_duty text, p_owner text, p_ttl_s real) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_got boolean;
BEGIN
    INSERT INTO duty_leases AS l (duty, owner, expires_at)
    VALUES (p_duty, p_owner, v_now + make_interval(secs => p_ttl_s))
    ON CONFLICT (duty) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
     WHERE l.owner = excluded.owner OR l.expires_at <= v_now
    RETURNING true INTO v_got;
    RETURN coalesce(v_got, false);
END $$;

-- ---------------------------------------------------------------- wake-ups
-- A row put into the current or next minute bucket wakes the dispatchers
-- (LISTEN minutehand_due): they otherwise sleep until the next run time
-- they know of. The payload names the shards that got such rows, comma
-- separated (a batch: one notification with every shard it touched, at
-- most 256 numbers, within NOTIFY's 8000 bytes), so a dispatcher claims
-- from those shards only. Sent at commit; a repeated payload in one
-- transaction is sent once.
CREATE OR REPLACE FUNCTION mh_enqueue(p_shard smallint, p_job bigint, p_run_at timestamptz,
                                      p_strict boolean, p_priority smallint, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_run_at < mh_minute_end(p_now) THEN
        INSERT INTO due_minutes (slot, shard, strict, priority, run_at, job_id)
        VALUES (mh_minute_slot(greatest(p_run_at, p_now)), p_shard, p_strict, p_priority, p_run_at, p_job);
        IF p_run_at < mh_minute(p_now) + interval '2 minutes' THEN
            PERFORM pg_notify('minutehand_due', p_shard::text);
        END IF;
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
    v_shards     text;
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
    IF to_minutes > 0 THEN
        SELECT string_agg(DISTINCT r.shard::text, ',') INTO v_shards
          FROM unnest(p_rows) r WHERE r.run_at < mh_minute(p_now) + interval '2 minutes';
        IF v_shards IS NOT NULL THEN
            PERFORM pg_notify('minutehand_due', v_shards);
        END IF;
    END IF;
END $$;

-- ---------------------------------------------------------------- the claim
-- The claim of mh_claim_sql for workers that handle only some job names:
-- $4 is the list of names. The due rows do not carry the name, so each
-- candidate is joined to its job (a primary-key probe); rows of other names
-- are skipped, and stay for a worker that handles them.
CREATE FUNCTION mh_claim_named_sql(p_slot int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format($f$
        WITH picked AS (
            DELETE FROM %1$I d
             WHERE d.ctid = ANY (ARRAY(
                   SELECT c.ctid FROM %1$I c
                     JOIN jobs j ON j.shard = c.shard AND j.id = c.job_id
                    WHERE c.shard = $1 AND c.run_at <= $2 AND j.name = ANY ($4)
                    ORDER BY c.strict DESC, c.priority DESC, c.run_at
                    LIMIT $3
                      FOR UPDATE OF c SKIP LOCKED))
            RETURNING d.job_id
        )
        SELECT array_agg(job_id) FROM picked
    $f$, mh_minute_part(p_slot))
$$;

-- claim_due as in sql/004_claim.sql, with two additions: p_names (NULL: any
-- name) and, per job, the result stored under its idempotency key within
-- its TTL (`replay`: the worker reports it instead of running the job).
DROP FUNCTION claim_due(int, int, text, bigint, real, text);
CREATE FUNCTION claim_due(p_shard int, p_limit int, p_owner text, p_epoch bigint,
                          p_lease_s real, p_worker text DEFAULT NULL, p_names text[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, team_id int, name text, payload jsonb, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, priority smallint, strict boolean, replay jsonb)
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
    IF v_hand IS NULL OR v_hand < v_cur - mh_sweep_after() THEN
        v_hand := greatest(coalesce(v_hand, v_cur - interval '1 minute'), v_cur - mh_sweep_after());
        PERFORM mh_move_hand(p_shard, v_hand);
    END IF;
    v_bucket := v_hand;
    LOOP
        v_any := v_bucket >= v_cur OR mh_bucket_has_rows(v_bucket, p_shard);
        IF v_any THEN
            IF p_names IS NULL THEN
                EXECUTE mh_claim_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left;
            ELSE
                EXECUTE mh_claim_named_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left, p_names;
            END IF;
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
            SELECT c.*, k.result
              FROM claimed c
              LEFT JOIN idempotency_keys k
                ON c.idempotency_key IS NOT NULL AND k.shard = p_shard AND k.team_id = c.team_id
               AND k.key = c.idempotency_key AND k.completed_at IS NOT NULL AND k.expires_at > v_now
             ORDER BY c.strict DESC, c.priority DESC, c.run_at;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            EXIT WHEN v_left <= 0 OR v_bucket >= v_cur;
            v_any := mh_bucket_has_rows(v_bucket, p_shard);
        END IF;
        IF NOT v_any AND v_bucket = v_hand AND v_bucket < v_cur - interval '1 minute' THEN
            v_hand := v_bucket + interval '1 minute';
            PERFORM mh_move_hand(p_shard, v_hand);
        END IF;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
END $$;

-- ---------------------------------------------------------------- give back
-- A worker gives back claimed jobs it did not start (it is shutting down,
-- or the request that leased them went away): they are due again at once,
-- at their old run time (so they keep their place), and the attempt the
-- claim counted is not counted.
CREATE FUNCTION release_many(p_ids bigint[], p_tokens uuid[]) RETURNS SETOF outcome
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_ords   bigint[];
    v_states job_state[];
    v_rows   due_row[];
BEGIN
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
    ), released AS (
        UPDATE jobs j
           SET state = CASE WHEN j.attempts > 1 THEN 'retrying' ELSE 'scheduled' END::job_state,
               attempts = j.attempts - 1, claimed_by = NULL, claim_expires_at = NULL,
               lease_token = NULL, claimed_at = NULL, updated_at = v_now
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state IN ('claimed', 'running')
        RETURNING j.shard, j.strict, j.priority, j.run_at, j.id, j.state, i.ord
    )
    SELECT array_agg(r.ord), array_agg(r.state), array_agg(ROW(r.shard, r.strict, r.priority, r.run_at, r.id)::due_row)
      INTO v_ords, v_states, v_rows FROM released r;
    IF v_rows IS NOT NULL THEN
        PERFORM mh_enqueue_many(v_rows, v_now);
    END IF;
    RETURN QUERY
    SELECT u.id, r.ord IS NOT NULL, coalesce(r.state, j.state),
           CASE WHEN r.ord IS NULL THEN mh_refusal(j.found, j.state) END
      FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
      LEFT JOIN unnest(v_ords, v_states) AS r(ord, state) ON r.ord = u.ord
      LEFT JOIN LATERAL mh_job_state(u.id, r.ord IS NULL) j ON true
     ORDER BY u.ord;
END $$;

-- claim_due for the dispatcher's batched round trips: a shard whose lease
-- is not current answers with one row naming why (every other column
-- NULL) instead of raising, so many shards' claims can go in one round
-- trip without an error cutting the rest short. (claim_due checks the
-- lease again; a lease that lapses in between still raises MH403.)
CREATE FUNCTION claim_for_worker(p_shard int, p_limit int, p_owner text, p_epoch bigint,
                                 p_lease_s real, p_worker text, p_names text[])
RETURNS TABLE (job_id bigint, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, refused text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM shards s
     WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch AND s.lease_expires_at > mh_now();
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::uuid,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text,
                            format('shard %s: %L does not hold a current lease with epoch %s', p_shard, p_owner, p_epoch);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.job_id, c.name, c.payload::text, c.attempt, c.max_attempts, c.idempotency_key, c.lease_token,
           c.claim_expires_at, c.due_at, c.run_at, c.replay::text, NULL::text
      FROM claim_due(p_shard, p_limit, p_owner, p_epoch, p_lease_s, p_worker, p_names) c;
END $$;
