-- Submission: validate, pick the run time, write the job record and its row
-- on the wheel in one transaction. Callable from any database session, inside
-- the caller's own transaction: roll back and no job exists.
--
-- Errors carry SQLSTATEs a caller can map without parsing text:
--   MH400 invalid input   MH404 unknown team / job   MH409 idempotency conflict
--   MH413 payload too large

-- NULL when acceptable, else a reason a person can act on.
CREATE FUNCTION mh_payload_problem(p_payload jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN pg_column_size(p_payload) > mh_payload_max_bytes()
            THEN format('payload is %s bytes encoded, over the limit of %s', pg_column_size(p_payload), mh_payload_max_bytes())
    END
$$;

CREATE FUNCTION mh_job_problem(p_name text, p_due_at timestamptz, p_priority int, p_max_attempts int,
                               p_flex_s int, p_strict boolean, p_backoff_base_s real, p_backoff_cap_s real,
                               p_key text, p_now timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.:/-]{1,200}$'
            THEN 'name must be 1 to 200 characters from letters, digits and _ . : / -'
        WHEN p_due_at IN ('infinity', '-infinity') THEN 'due time must be a finite time'
        WHEN p_due_at > p_now + mh_max_ahead()
            THEN format('due time %s is more than %s ahead', p_due_at, mh_max_ahead())
        WHEN p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN 'priority must be between -100 and 100'
        WHEN p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 100 THEN 'max_attempts must be between 1 and 100'
        WHEN p_flex_s IS NULL OR p_flex_s NOT BETWEEN 0 AND 86400 THEN 'flex window must be between 0 and 86400 seconds'
        WHEN p_strict IS NULL THEN 'strict must be true or false'
        WHEN p_strict AND p_flex_s > 0 THEN 'a strict job cannot have a flex window'
        WHEN p_backoff_base_s IS NULL OR NOT (p_backoff_base_s BETWEEN 0.01 AND 86400)
            THEN 'backoff base must be between 0.01 and 86400 seconds'
        WHEN p_backoff_cap_s IS NULL OR NOT (p_backoff_cap_s BETWEEN p_backoff_base_s AND 604800)
            THEN 'backoff cap must be between the backoff base and 604800 seconds'
        WHEN p_key IS NOT NULL AND (length(p_key) NOT BETWEEN 1 AND 255)
            THEN 'idempotency key must be 1 to 255 characters'
    END
$$;

-- What "the same request" means for an idempotency key.
CREATE FUNCTION mh_request_hash(p_name text, p_due_at timestamptz, p_payload jsonb, p_priority int,
                                p_max_attempts int, p_flex_s int, p_strict boolean,
                                p_backoff_base_s real, p_backoff_cap_s real) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array(p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                                 p_flex_s, p_strict, p_backoff_base_s, p_backoff_cap_s)::text)
$$;

-- Strict: the due time. Flexible: a point spread uniformly inside the
-- window, decided once, here. Never earlier than now.
CREATE FUNCTION mh_run_at(p_due_at timestamptz, p_flex_s int, p_strict boolean, p_now timestamptz)
RETURNS timestamptz LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT greatest(coalesce(p_due_at, p_now)
                    + CASE WHEN p_strict OR p_flex_s = 0 THEN interval '0'
                           ELSE make_interval(secs => random() * p_flex_s) END,
                    p_now)
$$;

CREATE FUNCTION mh_team_id(p_team text) RETURNS int
LANGUAGE plpgsql STABLE AS $$
DECLARE v_id int;
BEGIN
    SELECT id INTO v_id FROM teams WHERE name = p_team;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH404', MESSAGE = format('unknown team %L', p_team);
    END IF;
    RETURN v_id;
END $$;

-- One job. Returns its id, assigned run time, and whether it was created
-- (false: the idempotency key named an earlier job, whose id is returned).
CREATE FUNCTION submit_job_detail(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT 0,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600,
    OUT job_id bigint, OUT run_at timestamptz, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_payload jsonb := coalesce(p_payload, '{}');
    v_problem text;
    v_shard   smallint;
    v_hash    text;
    v_key     idempotency_keys%ROWTYPE;
BEGIN
    v_problem := mh_payload_problem(v_payload);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH413', MESSAGE = v_problem;
    END IF;
    v_problem := mh_job_problem(p_name, p_due_at, p_priority, p_max_attempts, p_flex_s, p_strict,
                                p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, v_now);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = v_problem;
    END IF;

    IF p_idempotency_key IS NULL THEN
        v_shard := mh_random_shard();
        job_id := mh_new_id(v_shard);
    ELSE
        v_shard := mh_key_shard(v_team, p_idempotency_key);
        job_id := mh_new_id(v_shard);
        v_hash := mh_request_hash(p_name, p_due_at, v_payload, p_priority, p_max_attempts, p_flex_s,
                                  p_strict, p_backoff_base_s, p_backoff_cap_s);
        -- A concurrent submit with the same key waits here on the unique key
        -- until the first commits (then this one finds its row) or rolls back.
        LOOP
            INSERT INTO idempotency_keys (shard, team_id, key, job_id, request_hash, created_at, expires_at)
            VALUES (v_shard, v_team, p_idempotency_key, job_id, v_hash, v_now, v_now + mh_idempotency_ttl())
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_key FROM idempotency_keys k
             WHERE k.shard = v_shard AND k.team_id = v_team AND k.key = p_idempotency_key
               FOR UPDATE;
            CONTINUE WHEN NOT FOUND;              -- purged in between: try the insert again
            IF v_key.expires_at > v_now THEN
                IF v_key.request_hash <> v_hash THEN
                    RAISE EXCEPTION USING ERRCODE = 'MH409',
                        MESSAGE = format('idempotency key %L was used for a different request (job %s) within %s',
                                         p_idempotency_key, v_key.job_id, mh_idempotency_ttl());
                END IF;
                job_id := v_key.job_id;
                created := false;
                SELECT j.run_at INTO run_at FROM jobs j WHERE j.shard = v_shard AND j.id = v_key.job_id;
                RETURN;
            END IF;
            -- Expired: the key starts over with this job.
            UPDATE idempotency_keys k
               SET job_id = submit_job_detail.job_id, request_hash = v_hash, result = NULL, completed_at = NULL,
                   created_at = v_now, expires_at = v_now + mh_idempotency_ttl()
             WHERE k.shard = v_shard AND k.team_id = v_team AND k.key = p_idempotency_key;
            EXIT;
        END LOOP;
    END IF;

    run_at := mh_run_at(p_due_at, p_flex_s, p_strict, v_now);
    created := true;
    INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                      max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, created_at, updated_at)
    VALUES (v_shard, job_id, v_team, p_name, v_payload, p_priority, coalesce(p_due_at, v_now), p_flex_s, p_strict,
            run_at, 'scheduled', p_max_attempts, p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, v_now, v_now);
    PERFORM mh_enqueue(v_shard, job_id, run_at, p_strict, p_priority::smallint, v_now);
END $$;

-- The SQL-level interface: enqueue inside your own transaction, get the id.
CREATE FUNCTION submit_job(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT 0,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600)
RETURNS bigint LANGUAGE sql AS $$
    SELECT (submit_job_detail(p_team, p_name, p_due_at, p_payload, p_priority, p_max_attempts, p_flex_s,
                              p_strict, p_idempotency_key, p_backoff_base_s, p_backoff_cap_s)).job_id
$$;

-- Many jobs of one team in one call: parallel arrays (NULL array or element =
-- the default). Set-based: one INSERT per table, no per-row round trip.
-- Each item is validated; valid items are written together, invalid ones are
-- reported (error) and written nowhere. idx is the 0-based array position.
CREATE FUNCTION submit_jobs(
    p_team text, p_names text[], p_due_ats timestamptz[] DEFAULT NULL, p_payloads jsonb[] DEFAULT NULL,
    p_priorities int[] DEFAULT NULL, p_max_attempts int[] DEFAULT NULL, p_flex_s int[] DEFAULT NULL,
    p_stricts boolean[] DEFAULT NULL, p_keys text[] DEFAULT NULL,
    p_backoff_base_s real[] DEFAULT NULL, p_backoff_cap_s real[] DEFAULT NULL)
RETURNS TABLE (idx int, job_id bigint, run_at timestamptz, created boolean, error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := mh_now();
    v_team int := mh_team_id(p_team);
    v_due  due_row[] := '{}';
    r      record;
    v_key  idempotency_keys%ROWTYPE;
BEGIN
    IF p_keys IS NOT NULL THEN
        -- Expired keys start over, as in submit_job_detail.
        DELETE FROM idempotency_keys k
         USING (SELECT DISTINCT key FROM unnest(p_keys) key WHERE key IS NOT NULL) b
         WHERE k.shard = mh_key_shard(v_team, b.key) AND k.team_id = v_team AND k.key = b.key
           AND k.expires_at <= v_now;
    END IF;

    FOR r IN
        WITH items AS (
            SELECT (u.ord - 1)::int AS idx, u.name, u.due_at, coalesce(u.payload, '{}') AS payload,
                   coalesce(u.priority, 0) AS priority, coalesce(u.max_attempts, 3) AS max_attempts,
                   coalesce(u.flex_s, 0) AS flex_s, coalesce(u.strict, false) AS strict, u.key,
                   coalesce(u.base, 1) AS base, coalesce(u.cap, 3600) AS cap
              FROM unnest(p_names, p_due_ats, p_payloads, p_priorities, p_max_attempts, p_flex_s,
                          p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s)
                   WITH ORDINALITY AS u(name, due_at, payload, priority, max_attempts, flex_s, strict, key, base, cap, ord)
        ), checked AS (
            SELECT i.*, coalesce(mh_payload_problem(i.payload),
                                 mh_job_problem(i.name, i.due_at, i.priority, i.max_attempts, i.flex_s,
                                                i.strict, i.base, i.cap, i.key, v_now)) AS problem
              FROM items i
        ), fresh AS (
            SELECT c.*, s.shard, mh_new_id(s.shard) AS id, mh_run_at(c.due_at, c.flex_s, c.strict, v_now) AS run_at,
                   CASE WHEN c.key IS NOT NULL THEN
                       mh_request_hash(c.name, c.due_at, c.payload, c.priority, c.max_attempts, c.flex_s,
                                       c.strict, c.base, c.cap) END AS request_hash,
                   c.key IS NULL OR row_number() OVER (PARTITION BY c.key ORDER BY c.idx) = 1 AS first_of_key
              FROM checked c
             CROSS JOIN LATERAL (SELECT CASE WHEN c.key IS NULL THEN mh_random_shard()
                                             ELSE mh_key_shard(v_team, c.key) END AS shard) s
             WHERE c.problem IS NULL
        ), new_keys AS (
            INSERT INTO idempotency_keys (shard, team_id, key, job_id, request_hash, created_at, expires_at)
            SELECT f.shard, v_team, f.key, f.id, f.request_hash, v_now, v_now + mh_idempotency_ttl()
              FROM fresh f WHERE f.key IS NOT NULL AND f.first_of_key
            ON CONFLICT DO NOTHING
            RETURNING idempotency_keys.job_id
        ), new_jobs AS (
            INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                              max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, created_at, updated_at)
            SELECT f.shard, f.id, v_team, f.name, f.payload, f.priority, coalesce(f.due_at, v_now), f.flex_s, f.strict,
                   f.run_at, 'scheduled', f.max_attempts, f.base, f.cap, f.key, v_now, v_now
              FROM fresh f
             WHERE f.key IS NULL OR f.id IN (SELECT nk.job_id FROM new_keys nk)
            RETURNING jobs.id
        )
        SELECT c.idx, c.problem, c.key, f.shard, f.strict AS is_strict, f.priority, f.id, f.run_at, f.request_hash,
               (nj.id IS NOT NULL) AS is_new
          FROM checked c
          LEFT JOIN fresh f ON f.idx = c.idx
          LEFT JOIN new_jobs nj ON nj.id = f.id
    LOOP
        idx := r.idx; job_id := NULL; run_at := NULL; created := false; error := r.problem;
        IF r.problem IS NULL AND r.is_new THEN
            v_due := v_due || ROW(r.shard, r.is_strict, r.priority, r.run_at, r.id)::due_row;
            job_id := r.id; run_at := r.run_at; created := true;
        ELSIF r.problem IS NULL THEN
            -- The key named an earlier job (before this call, or earlier in this batch).
            SELECT * INTO v_key FROM idempotency_keys k
             WHERE k.shard = r.shard AND k.team_id = v_team AND k.key = r.key;
            IF v_key.request_hash <> r.request_hash THEN
                error := format('idempotency key %L was used for a different request (job %s)', r.key, v_key.job_id);
            ELSE
                job_id := v_key.job_id;
                SELECT j.run_at INTO run_at FROM jobs j WHERE j.shard = r.shard AND j.id = v_key.job_id;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM mh_enqueue_many(v_due, v_now);
END $$;
