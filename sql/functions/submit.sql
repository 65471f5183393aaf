-- Submission: validate, pick the run time, write the job record and its row
-- on the wheel in one transaction. Callable from any database session, inside
-- the caller's own transaction: roll back and no job exists. The entry
-- points other services call (submit_job, submit_job_detail, submit_jobs)
-- run as their owner (SECURITY DEFINER), so a role granted only those
-- (sql/grants.sql) can enqueue without any right on the tables.
--
-- Errors carry SQLSTATEs a caller can map without parsing text:
--   MH400 invalid input   MH404 unknown team / job   MH409 idempotency conflict
--   MH413 payload too large

-- Limits enforced by submission (one implementation, for SQL and HTTP callers).
CREATE OR REPLACE FUNCTION mh_payload_max_bytes() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 262144 $$;
CREATE OR REPLACE FUNCTION mh_max_ahead() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '366 days' $$;
CREATE OR REPLACE FUNCTION mh_idempotency_ttl() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '24 hours' $$;
-- The earliest due time accepted. Past due times are normal (they run at
-- once); a due time centuries back is a mistake, and one before year 1 can
-- be stored by PostgreSQL but not read by Python or most clients.
CREATE OR REPLACE FUNCTION mh_earliest_due() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$;
-- Whether a job name is 1 to 200 characters from letters, digits and _ . : / -
-- (false for NULL). Not written as '^[...]{1,200}$': PostgreSQL's regex
-- engine unrolls the bound, and a batch paid ~25 us a job for it (~1 us so).
CREATE OR REPLACE FUNCTION mh_name_ok(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_name IS NOT NULL AND length(p_name) BETWEEN 1 AND 200 AND p_name !~ '[^A-Za-z0-9_.:/-]'
$$;

-- A W3C traceparent as a job keeps it (sql/tables/jobs.sql), or NULL: the
-- four fields version-traceid-parentid-flags in lowercase hex (2, 32, 16
-- and 2 digits), version not ff, neither id all zeros. Anything else is
-- ignored, never refused, as W3C Trace Context says of a traceparent that
-- cannot be parsed: the job is submitted with none. No regex with bounds
-- (see mh_name_ok): a batch checks one per job.
CREATE OR REPLACE FUNCTION mh_traceparent(p_traceparent text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- 55 characters of hex digits and dashes, with exactly its three dashes
    -- (52 others) at their places: the four fields, each all hex.
    SELECT CASE WHEN length(p_traceparent) = 55 AND p_traceparent !~ '[^0-9a-f-]'
                 AND length(replace(p_traceparent, '-', '')) = 52
                 AND substr(p_traceparent, 3, 1) = '-' AND substr(p_traceparent, 36, 1) = '-'
                 AND substr(p_traceparent, 53, 1) = '-' AND left(p_traceparent, 2) <> 'ff'
                 AND substr(p_traceparent, 4, 32) <> '00000000000000000000000000000000'
                 AND substr(p_traceparent, 37, 16) <> '0000000000000000'
                THEN p_traceparent END
$$;

-- NULL when acceptable, else a reason a person can act on. (The problem
-- functions are STABLE, as format() is, so that they are inlined into the
-- batch's statement instead of called per row.)
-- The size of the payload as JSON text: what the submitter sent, whatever
-- its stored (possibly compressed) form.
CREATE OR REPLACE FUNCTION mh_payload_problem(p_payload jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(p_payload::text) > mh_payload_max_bytes()
                THEN format('payload is %s bytes as JSON, over the limit of %s',
                            octet_length(p_payload::text), mh_payload_max_bytes()) END
$$;

-- A number beyond a double (1e400): jsonb keeps it, but no JSON decoder a
-- worker uses reads it (the HTTP API refuses it as it parses the body). As
-- text jsonb writes such a number out in 309 digits or more, so a shorter
-- payload (most are) is not walked: the walk costs ~5 us a job.
CREATE OR REPLACE FUNCTION mh_payload_number_problem(p_payload jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(p_payload::text) > 308
                 AND jsonb_path_exists(p_payload, '$.** ? (@.type() == "number" && @.abs() > 1.7976931348623157e308)')
                THEN 'payload holds a number beyond a double (over 1.8e308 in size), which no JSON decoder reads' END
$$;

-- Why a due time cannot be used (NULL: it can). p_label names it in the reason.
CREATE OR REPLACE FUNCTION mh_due_problem(p_label text, p_due_at timestamptz, p_now timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_due_at IN ('infinity', '-infinity') THEN format('%s must be a finite time', p_label)
        WHEN p_due_at < mh_earliest_due()
            THEN format('%s %s is before %s: send a time in this century (a past time runs at once)',
                        p_label, p_due_at, mh_earliest_due())
        WHEN p_due_at > p_now + mh_max_ahead()
            THEN format('%s %s is more than %s ahead', p_label, p_due_at, mh_max_ahead())
    END
$$;

CREATE OR REPLACE FUNCTION mh_job_problem(p_name text, p_due_at timestamptz, p_priority int, p_max_attempts int,
                                          p_flex_s int, p_strict boolean, p_backoff_base_s real,
                                          p_backoff_cap_s real, p_key text, p_now timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN NOT mh_name_ok(p_name)
            THEN 'name must be 1 to 200 characters from letters, digits and _ . : / -'
        WHEN mh_due_problem('due time', p_due_at, p_now) IS NOT NULL THEN mh_due_problem('due time', p_due_at, p_now)
        WHEN p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN 'priority must be between -100 and 100'
        WHEN p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 100 THEN 'max_attempts must be between 1 and 100'
        WHEN p_flex_s IS NULL OR p_flex_s NOT BETWEEN 0 AND 86400 THEN 'flex window must be between 0 and 86400 seconds'
        WHEN p_strict IS NULL THEN 'strict must be true or false'
        WHEN p_strict AND p_flex_s > 0 THEN 'a strict job cannot have a flex window'
        -- (0.01 as a real: the parameter is one, and 0.01::real is a little less than 0.01)
        WHEN p_backoff_base_s IS NULL OR NOT (p_backoff_base_s BETWEEN 0.01::real AND 86400)
            THEN 'backoff base must be between 0.01 and 86400 seconds'
        WHEN p_backoff_cap_s IS NULL OR NOT (p_backoff_cap_s BETWEEN p_backoff_base_s AND 604800)
            THEN 'backoff cap must be between the backoff base and 604800 seconds'
        WHEN p_key IS NOT NULL AND (length(p_key) NOT BETWEEN 1 AND 255)
            THEN 'idempotency key must be 1 to 255 characters'
        WHEN p_key IS NOT NULL AND p_key ~ '[^\x20-\x7e]'
            THEN 'idempotency key must be printable ASCII (no control or non-ASCII characters)'
    END
$$;

-- What "the same request" means for an idempotency key.
CREATE OR REPLACE FUNCTION mh_request_hash(p_name text, p_due_at timestamptz, p_payload jsonb, p_priority int,
                                           p_max_attempts int, p_flex_s int, p_strict boolean,
                                           p_backoff_base_s real, p_backoff_cap_s real) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array(p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                                 p_flex_s, p_strict, p_backoff_base_s, p_backoff_cap_s)::text)
$$;

-- The run time of one job. Strict: the due time. Flexible: a point of the
-- window where the planned load is lowest (mh_place, sql/functions/spread.sql),
-- decided once, here. Never earlier than now. A batch places its jobs
-- together with mh_place instead. Not counted: the caller adds what it
-- creates to the load (mh_count_load).
CREATE OR REPLACE FUNCTION mh_run_at(p_due_at timestamptz, p_flex_s int, p_strict boolean, p_now timestamptz)
RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_strict OR coalesce(p_flex_s, 0) <= 0 THEN greatest(coalesce(p_due_at, p_now), p_now)
                ELSE (mh_place(ARRAY[p_due_at], ARRAY[p_flex_s], ARRAY[p_strict], p_now))[1] END
$$;

CREATE OR REPLACE FUNCTION mh_team(p_team text) RETURNS teams
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE v_team teams%ROWTYPE;
BEGIN
    SELECT * INTO v_team FROM teams WHERE name = p_team;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH404', MESSAGE = format('unknown team %L', p_team);
    END IF;
    RETURN v_team;
END $$;

CREATE OR REPLACE FUNCTION mh_team_id(p_team text) RETURNS int
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
BEGIN
    RETURN (mh_team(p_team)).id;
END $$;

-- A validated job becomes a record and a row on the wheel, at p_run_at
-- (NULL: placed now, mh_run_at), with the traceparent it was submitted
-- under (checked by the caller: mh_traceparent). The caller counts it
-- (mh_count_load).
CREATE OR REPLACE FUNCTION mh_write_job(p_shard smallint, p_id bigint, p_team int, p_name text,
                                        p_due_at timestamptz, p_payload jsonb, p_priority int, p_max_attempts int,
                                        p_flex_s int, p_strict boolean, p_key text, p_base real, p_cap real,
                                        p_now timestamptz, p_run_at timestamptz DEFAULT NULL,
                                        p_traceparent text DEFAULT NULL)
RETURNS timestamptz LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_run_at timestamptz := coalesce(p_run_at, mh_run_at(p_due_at, p_flex_s, p_strict, p_now));
BEGIN
    INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                      max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, created_at, updated_at, agreed_at,
                      traceparent)
    VALUES (p_shard, p_id, p_team, p_name, p_payload, p_priority, coalesce(p_due_at, p_now), p_flex_s, p_strict,
            v_run_at, 'scheduled', p_max_attempts, p_base, p_cap, p_key, p_now, p_now, v_run_at, p_traceparent);
    PERFORM mh_enqueue(p_shard, p_id, v_run_at, p_strict, p_priority::smallint, p_team, p_now);
    RETURN v_run_at;
END $$;

-- Validated jobs without a key (submit_jobs), written with one INSERT per
-- table from the array (on Citus, up to mh_values_rows() jobs as literal
-- VALUES: mh_insert_values) and put on the wheel. The caller counts them.
CREATE OR REPLACE FUNCTION mh_write_jobs(p_team int, p_jobs new_job[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF p_jobs IS NULL THEN
        RETURN;
    END IF;
    IF mh_on_citus() AND cardinality(p_jobs) <= mh_values_rows() THEN
        PERFORM mh_insert_values('jobs', 'shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, '
                                         'state, max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at, '
                                         'agreed_at, traceparent',
                                 ARRAY(SELECT format('(%L,%L,%L,%L,%L,%L,%L,%L,%L,%L,''scheduled'',%L,%L,%L,%L,%L,%L,%L)',
                                                     j.shard, j.id, p_team, j.name, j.payload, j.priority, j.due_at,
                                                     j.flex_s, j.strict, j.run_at, j.max_attempts, j.backoff_base_s,
                                                     j.backoff_cap_s, p_now, p_now, j.run_at, j.traceparent)
                                         FROM unnest(p_jobs) j));
    ELSE
        INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                          max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at, agreed_at, traceparent)
        SELECT j.shard, j.id, p_team, j.name, j.payload, j.priority, j.due_at, j.flex_s, j.strict, j.run_at,
               'scheduled', j.max_attempts, j.backoff_base_s, j.backoff_cap_s, p_now, p_now, j.run_at, j.traceparent
          FROM unnest(p_jobs) j;
    END IF;
    PERFORM mh_enqueue_many(ARRAY(SELECT ROW(j.shard, j.strict, j.priority, j.run_at, j.id, p_team)::due_row
                                    FROM unnest(p_jobs) j),
                            p_now, ARRAY(SELECT j.name FROM unnest(p_jobs) j));
END $$;

-- A submission row of team_stats for one created job (stripe: shard % 16).
CREATE OR REPLACE FUNCTION mh_submitted(p_shard smallint, p_team int, p_name text) RETURNS stats_delta
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(p_shard % 16, p_team, p_name, 1, 0, 0, 0, 0, 0, NULL, NULL)::stats_delta
$$;

-- A cancellation row of team_stats for one job that ended cancelled (stripe
-- 16 + shard % 16: events of a finished job count apart from submissions).
CREATE OR REPLACE FUNCTION mh_cancelled(p_shard smallint, p_team int, p_name text) RETURNS stats_delta
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ROW(16 + p_shard % 16, p_team, p_name, 0, 0, 0, 0, 0, 1, NULL, NULL)::stats_delta
$$;

-- Take an idempotency key for a new job (p_job_id), for jobs and series
-- alike: both NULL, the key is now this job's; existing, the same request
-- (p_hash) within 24 h made that job; conflict, another request used the
-- key. A conflict is returned as text, not raised, so a batch can report it
-- per item without a subtransaction per item.
CREATE OR REPLACE FUNCTION mh_take_key(p_shard smallint, p_team int, p_key text, p_job_id bigint, p_hash text,
                                       p_now timestamptz, OUT existing bigint, OUT conflict text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_key idempotency_keys%ROWTYPE;
BEGIN
    -- A concurrent submit with the same key waits here on the unique key
    -- until the first commits (then this one finds its row) or rolls back.
    LOOP
        INSERT INTO idempotency_keys (shard, team_id, key, job_id, request_hash, created_at, expires_at)
        VALUES (p_shard, p_team, p_key, p_job_id, p_hash, p_now, p_now + mh_idempotency_ttl())
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        SELECT * INTO v_key FROM idempotency_keys k
         WHERE k.shard = p_shard AND k.team_id = p_team AND k.key = p_key
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;              -- purged in between: try the insert again
        IF v_key.expires_at > p_now THEN
            IF v_key.request_hash <> p_hash THEN
                conflict := format('idempotency key %L was used for a different request (job %s) within %s',
                                   p_key, v_key.job_id, mh_idempotency_ttl());
            ELSE
                existing := v_key.job_id;
            END IF;
            RETURN;
        END IF;
        -- Expired: the key starts over with this job.
        UPDATE idempotency_keys k
           SET job_id = p_job_id, request_hash = p_hash, result = NULL, completed_at = NULL,
               created_at = p_now, expires_at = p_now + mh_idempotency_ttl()
         WHERE k.shard = p_shard AND k.team_id = p_team AND k.key = p_key;
        RETURN;
    END LOOP;
END $$;

-- A validated job with an idempotency key. The same key from the same team
-- within 24 h names the first job (created false) and writes nothing; with a
-- different request it is a conflict (job_id NULL). p_flex_s is the window
-- the job gets, p_sent_flex_s the one sent (NULL: omitted), which the key
-- compares; p_run_at the run time placed for it (NULL: placed here). The
-- traceparent is no part of the request the key compares: a retry from
-- another span is the same request, and names the first job as it was.
CREATE OR REPLACE FUNCTION mh_submit_keyed(p_team int, p_name text, p_due_at timestamptz, p_payload jsonb,
                                           p_priority int, p_max_attempts int, p_flex_s int, p_strict boolean,
                                           p_key text, p_base real, p_cap real, p_now timestamptz,
                                           p_sent_flex_s int, p_run_at timestamptz, p_traceparent text,
                                           OUT job_id bigint, OUT run_at timestamptz, OUT created boolean,
                                           OUT conflict text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_shard smallint := mh_key_shard(p_team, p_key);
    v_key   record;
BEGIN
    job_id := mh_new_id(v_shard);
    SELECT * INTO v_key FROM mh_take_key(
        v_shard, p_team, p_key, job_id,
        mh_request_hash(p_name, p_due_at, p_payload, p_priority, p_max_attempts, p_sent_flex_s, p_strict, p_base,
                        p_cap),
        p_now);
    IF v_key.conflict IS NOT NULL OR v_key.existing IS NOT NULL THEN
        created := false;
        conflict := v_key.conflict;
        job_id := v_key.existing;
        SELECT j.run_at INTO run_at FROM jobs j WHERE j.shard = v_shard AND j.id = v_key.existing;
        RETURN;
    END IF;
    created := true;
    run_at := mh_write_job(v_shard, job_id, p_team, p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                           p_flex_s, p_strict, p_key, p_base, p_cap, p_now, p_run_at, p_traceparent);
END $$;

-- One job. Returns its id, assigned run time, and whether it was created
-- (false: the idempotency key named an earlier job, whose id is returned).
-- p_flex_s omitted (NULL) and not strict: the default window of its name
-- (mh_default_flex). p_traceparent: the W3C trace context of the caller
-- (its `traceparent`), kept with the job so that the worker's span of the
-- handler continues that trace; one that is not a valid traceparent is
-- ignored (mh_traceparent), as is NULL.
CREATE OR REPLACE FUNCTION submit_job_detail(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT NULL,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600, p_traceparent text DEFAULT NULL,
    OUT job_id bigint, OUT run_at timestamptz, OUT created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_payload jsonb := coalesce(p_payload, '{}');
    v_flex    int := mh_flex_of(v_team, p_name, p_flex_s, p_strict);
    v_problem text;
    v_shard   smallint;
    v_keyed   record;
BEGIN
    v_problem := mh_payload_problem(v_payload);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH413', MESSAGE = v_problem;
    END IF;
    v_problem := coalesce(mh_payload_number_problem(v_payload),
                          mh_job_problem(p_name, p_due_at, p_priority, p_max_attempts, v_flex, p_strict,
                                         p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, v_now));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = v_problem;
    END IF;
    IF p_idempotency_key IS NULL THEN
        v_shard := mh_random_shard();
        job_id := mh_new_id(v_shard);
        created := true;
        run_at := mh_write_job(v_shard, job_id, v_team, p_name, p_due_at, v_payload, p_priority, p_max_attempts,
                               v_flex, p_strict, NULL, p_backoff_base_s, p_backoff_cap_s, v_now, NULL,
                               mh_traceparent(p_traceparent));
        PERFORM mh_add_stats(v_now, ARRAY[mh_submitted(v_shard, v_team, p_name)]);
        PERFORM mh_count_load(v_team, ARRAY[run_at]);
        RETURN;
    END IF;
    SELECT * INTO v_keyed FROM mh_submit_keyed(v_team, p_name, p_due_at, v_payload, p_priority, p_max_attempts,
                                               v_flex, p_strict, p_idempotency_key, p_backoff_base_s,
                                               p_backoff_cap_s, v_now, p_flex_s, NULL,
                                               mh_traceparent(p_traceparent));
    IF v_keyed.conflict IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH409', MESSAGE = v_keyed.conflict;
    END IF;
    job_id := v_keyed.job_id; run_at := v_keyed.run_at; created := v_keyed.created;
    IF created THEN
        PERFORM mh_add_stats(v_now, ARRAY[mh_submitted(mh_shard_of(job_id), v_team, p_name)]);
        PERFORM mh_count_load(v_team, ARRAY[run_at]);
    END IF;
END $$;

-- The SQL-level interface: enqueue inside your own transaction, get the id
-- (p_traceparent: as submit_job_detail's).
CREATE OR REPLACE FUNCTION submit_job(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT NULL,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600, p_traceparent text DEFAULT NULL)
RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
    SELECT (submit_job_detail(p_team, p_name, p_due_at, p_payload, p_priority, p_max_attempts, p_flex_s,
                              p_strict, p_idempotency_key, p_backoff_base_s, p_backoff_cap_s,
                              p_traceparent)).job_id
$$;

-- The default flex windows by job name a batch of team p_team gets (the
-- team's rule wins over the operator's; a plain job is no cron series), for
-- mh_batch_items: the names, and the windows in the same order.
CREATE OR REPLACE FUNCTION mh_batch_rules(p_team int, OUT names text[], OUT flex int[])
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
BEGIN
    SELECT array_agg(r.job_name), array_agg(r.flex_s) INTO names, flex
      FROM (SELECT DISTINCT ON (r.job_name) r.job_name, r.flex_s FROM flex_defaults r
             WHERE r.team_id IN (p_team, 0) AND r.job_name <> ''
             ORDER BY r.job_name, r.team_id DESC) r;
END $$;

-- The items of a batch, with the team's default flex windows by name
-- (mh_batch_rules), defaults filled in (a flex window
-- omitted: mh_flex_of; sent_flex_s keeps what was sent, for idempotency
-- keys) and each checked: problem is NULL for a valid item. Strict, like
-- every other field, defaults to what submit_job's does (false): a NULL
-- p_stricts, or a NULL in it, leaves the name's default window in force.
CREATE OR REPLACE FUNCTION mh_batch_items(
    p_rule_names text[], p_rule_flex int[], p_names text[], p_due_ats timestamptz[], p_payloads jsonb[], p_priorities int[],
    p_max_attempts int[], p_flex_s int[], p_stricts boolean[], p_keys text[], p_backoff_base_s real[],
    p_backoff_cap_s real[], p_now timestamptz)
RETURNS TABLE (idx int, name text, due_at timestamptz, payload jsonb, priority int, max_attempts int,
               flex_s int, is_strict boolean, key text, base real, cap real, sent_flex_s int, problem text)
LANGUAGE sql STABLE AS $$
    SELECT i.*, coalesce(mh_payload_problem(i.payload), mh_payload_number_problem(i.payload),
                         mh_job_problem(i.name, i.due_at, i.priority, i.max_attempts, i.flex_s,
                                        i.strict, i.base, i.cap, i.key, p_now))
      FROM (SELECT (u.ord - 1)::int AS idx, u.name, u.due_at, coalesce(u.payload, '{}') AS payload,
                   coalesce(u.priority, 0) AS priority, coalesce(u.max_attempts, 3) AS max_attempts,
                   CASE WHEN u.flex_s IS NOT NULL THEN u.flex_s WHEN u.strict THEN 0
                        ELSE coalesce(d.flex_s, 0) END AS flex_s,
                   coalesce(u.strict, false) AS strict, u.key,
                   coalesce(u.base, 1) AS base, coalesce(u.cap, 3600) AS cap, u.flex_s AS sent_flex_s
              FROM unnest(p_names, p_due_ats, p_payloads, p_priorities, p_max_attempts, p_flex_s,
                          p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s)
                   WITH ORDINALITY AS u(name, due_at, payload, priority, max_attempts, flex_s, strict, key,
                                        base, cap, ord)
              -- the name rules of the team and the operator's (mh_batch_rules), read once
              -- for the batch by the caller (Citus inlines no SQL function that reads a table)
              LEFT JOIN unnest(p_rule_names, p_rule_flex) AS d(job_name, flex_s)
                ON d.job_name = u.name AND u.flex_s IS NULL) i
$$;

-- Many jobs of one team in one call: parallel arrays, each as long as
-- p_names or NULL (NULL array or element: the default). Each item is
-- validated; valid items are written together, invalid ones are reported
-- (error) and written nowhere. idx is the 0-based array position; rows come
-- in no particular order. The valid items' run times are placed together
-- (mh_place: flexible ones where the window is least loaded, keyed ones
-- included). Jobs without a key land on random shards among p_shards (NULL:
-- mh_placement_shards, any shard on plain PostgreSQL, one Citus shard's on
-- Citus), written set-based (one INSERT per table, no loop); keyed ones one
-- by one through the same path as submit_job_detail, on their key's shard,
-- taking their key rows in (shard, key) order, the order every procedure
-- locks keys in. Every job created is added to the counters and to the
-- planned load, one upsert each. p_traceparents: each job's traceparent, as
-- submit_job_detail's p_traceparent (one per job, not one per call: the API
-- sends single submissions of many requests as one batch).
CREATE OR REPLACE FUNCTION submit_jobs(
    p_team text, p_names text[], p_due_ats timestamptz[] DEFAULT NULL, p_payloads jsonb[] DEFAULT NULL,
    p_priorities int[] DEFAULT NULL, p_max_attempts int[] DEFAULT NULL, p_flex_s int[] DEFAULT NULL,
    p_stricts boolean[] DEFAULT NULL, p_keys text[] DEFAULT NULL,
    p_backoff_base_s real[] DEFAULT NULL, p_backoff_cap_s real[] DEFAULT NULL, p_traceparents text[] DEFAULT NULL,
    p_shards smallint[] DEFAULT NULL)
RETURNS SETOF submit_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_n       int := coalesce(cardinality(p_names), 0);
    v_shards  smallint[] := coalesce(p_shards, mh_placement_shards());
    v_fresh   new_job[];              -- the keyless jobs to create
    v_results submit_result[];
    v_stats   stats_delta[];
    v_load    timestamptz[];          -- run times of the jobs created
    v_placed  timestamptz[];          -- by idx + 1: the run time placed for each valid item
    v_keyed   record;
    v_rules   record;
    v_label   text;
    r         record;
BEGIN
    SELECT a.label INTO v_label
      FROM (VALUES ('due_ats', cardinality(p_due_ats)), ('payloads', cardinality(p_payloads)),
                   ('priorities', cardinality(p_priorities)), ('max_attempts', cardinality(p_max_attempts)),
                   ('flex_s', cardinality(p_flex_s)), ('stricts', cardinality(p_stricts)),
                   ('keys', cardinality(p_keys)), ('backoff_base_s', cardinality(p_backoff_base_s)),
                   ('backoff_cap_s', cardinality(p_backoff_cap_s)),
                   ('traceparents', cardinality(p_traceparents))) AS a(label, n)
     WHERE a.n IS NOT NULL AND a.n <> v_n
     LIMIT 1;
    IF v_label IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = format('p_%s has a different length than p_names (%s): pass one value per job, or NULL',
                             v_label, v_n);
    END IF;
    IF cardinality(p_shards) = 0 OR EXISTS (SELECT 1 FROM unnest(p_shards) s
                                             WHERE s IS NULL OR s NOT BETWEEN 0 AND mh_shard_count() - 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = format('p_shards must name shards from 0 to %s, or be NULL', mh_shard_count() - 1);
    END IF;
    SELECT * INTO v_rules FROM mh_batch_rules(v_team);
    -- Everything is worked out first, in a statement that reads no table
    -- (on Citus: run on the coordinator alone), and then written by plain
    -- INSERTs of the arrays: an INSERT fed by a query would send that
    -- query's result to every worker node first.
    WITH checked AS (
        SELECT * FROM mh_batch_items(v_rules.names, v_rules.flex, p_names, p_due_ats, p_payloads, p_priorities,
                                     p_max_attempts,
                                     p_flex_s, p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s, v_now)
    ), placed AS (
        SELECT p.idx, p.run_at
          FROM (SELECT array_agg(c.idx ORDER BY c.idx) AS idxs,
                       CASE WHEN bool_or(c.flex_s > 0 AND NOT c.is_strict)
                            THEN mh_place(array_agg(c.due_at ORDER BY c.idx), array_agg(c.flex_s ORDER BY c.idx),
                                          array_agg(c.is_strict ORDER BY c.idx), v_now)
                            ELSE array_agg(greatest(coalesce(c.due_at, v_now), v_now) ORDER BY c.idx) END AS runs
                  FROM checked c WHERE c.problem IS NULL) a,
               unnest(a.idxs, a.runs) p(idx, run_at)
    ), fresh AS (
        SELECT c.*, mh_new_id(s.shard) AS id, s.shard, p.run_at
          FROM checked c
          JOIN placed p ON p.idx = c.idx
          CROSS JOIN LATERAL (SELECT coalesce(v_shards[1 + floor(random() * cardinality(v_shards))::int],
                                              mh_random_shard()) AS shard
                               WHERE c.idx IS NOT NULL) s          -- (a volatile draw per item)
         WHERE c.key IS NULL
    )
    SELECT (SELECT array_agg(ROW(f.shard, f.id, f.name, f.payload, f.priority, coalesce(f.due_at, v_now),
                                 f.flex_s, f.is_strict, f.run_at, f.max_attempts, f.base, f.cap,
                                 mh_traceparent(p_traceparents[f.idx + 1]))::new_job ORDER BY f.id)
              FROM fresh f),
           (SELECT array_agg(ROW(c.idx, f.id, f.run_at, f.id IS NOT NULL, c.problem)::submit_result)
              FROM checked c LEFT JOIN fresh f ON f.idx = c.idx
             WHERE c.key IS NULL OR c.problem IS NOT NULL),
           (SELECT array_agg(p.run_at ORDER BY c.idx) FROM checked c LEFT JOIN placed p ON p.idx = c.idx
             WHERE EXISTS (SELECT 1 FROM checked k WHERE k.key IS NOT NULL AND k.problem IS NULL))
      INTO v_fresh, v_results, v_placed;
    PERFORM mh_write_jobs(v_team, v_fresh, v_now);
    SELECT array_agg(mh_submitted(f.shard, v_team, f.name)), array_agg(f.run_at) INTO v_stats, v_load
      FROM unnest(v_fresh) f;
    RETURN QUERY SELECT * FROM unnest(v_results);

    IF v_placed IS NOT NULL THEN
        FOR r IN SELECT * FROM mh_batch_items(v_rules.names, v_rules.flex, p_names, p_due_ats, p_payloads, p_priorities,
                                     p_max_attempts,
                                              p_flex_s, p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s, v_now) c
                  WHERE c.key IS NOT NULL AND c.problem IS NULL
                  ORDER BY mh_key_shard(v_team, c.key), c.key, c.idx
        LOOP
            SELECT * INTO v_keyed FROM mh_submit_keyed(v_team, r.name, r.due_at, r.payload, r.priority,
                                                       r.max_attempts, r.flex_s, r.is_strict, r.key, r.base, r.cap,
                                                       v_now, r.sent_flex_s, v_placed[r.idx + 1],
                                                       mh_traceparent(p_traceparents[r.idx + 1]));
            IF v_keyed.created THEN
                v_stats := v_stats || mh_submitted(mh_shard_of(v_keyed.job_id), v_team, r.name);
                v_load := v_load || v_keyed.run_at;
            END IF;
            RETURN NEXT ROW(r.idx, v_keyed.job_id, v_keyed.run_at, v_keyed.created, v_keyed.conflict)::submit_result;
        END LOOP;
    END IF;
    -- Every job created, in one upsert each: the counters and the planned load.
    PERFORM mh_add_stats(v_now, v_stats);
    PERFORM mh_count_load(v_team, v_load);
END $$;
