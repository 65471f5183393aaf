-- Hardening (revision 0004): what one team's bad or careless input must not
-- do to another team, the service or a job. Replaces procedure bodies of
-- earlier files (CREATE OR REPLACE, same signatures unless said otherwise);
-- sql/undo/0004_hardening.sql puts the earlier ones back.
--
--   due times before 2000 are refused (PostgreSQL stores dates back to 4713
--     BC, which no client can read back: one such row once stalled dispatch)
--   submit_jobs refuses arrays of different lengths instead of padding them
--   cancel() needs the team it acts for
--   only members of the role minutehand_clock (and superusers) may pin mh_now()
--   rows are locked in one global order, (shard, id) for jobs and
--     (shard, team, key) for idempotency keys, so batches cannot deadlock
--   time zones are checked against a table, not the pg_timezone_names view
--     (which reads every zone file on disk: ~100 ms per call)
--   the claim answers a stale lease with a row (claim_for_worker never
--     raises for it), names each job's team, and can be limited to teams
--   a claim that expires on the last attempt says why the job is dead
--   the procedures other services call (submit_job, submit_job_detail,
--     submit_jobs, submit_series, cancel) run as their owner, so a role
--     granted only those (sql/grants.sql) can enqueue without any right on
--     the tables; search_path is pinned for them

-- ---------------------------------------------------------------- due times
-- The earliest due time accepted. Past due times are normal (they run at
-- once); a due time centuries back is a mistake, and one before year 1 can
-- be stored by PostgreSQL but not read by Python or most clients.
CREATE FUNCTION mh_earliest_due() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$;

-- Why a due time cannot be used (NULL: it can). p_label names it in the reason.
CREATE FUNCTION mh_due_problem(p_label text, p_due_at timestamptz, p_now timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
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
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.:/-]{1,200}$'
            THEN 'name must be 1 to 200 characters from letters, digits and _ . : / -'
        WHEN mh_due_problem('due time', p_due_at, p_now) IS NOT NULL THEN mh_due_problem('due time', p_due_at, p_now)
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
        WHEN p_key IS NOT NULL AND p_key ~ '[^\x20-\x7e]'
            THEN 'idempotency key must be printable ASCII (no control or non-ASCII characters)'
    END
$$;

-- ---------------------------------------------------------------- the clock
-- A pinned clock moves every procedure's notion of now: due times, claim
-- expiry, leases. Only the role minutehand_clock (tests, drills) may pin it;
-- any other session that sets minutehand.now gets an error, not a clock.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minutehand_clock') THEN
        CREATE ROLE minutehand_clock NOLOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot create role minutehand_clock: only superusers may pin minutehand.now';
END $$;

CREATE FUNCTION mh_pinned_clock(p_setting text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The session's role, not current_user: the submission procedures run as
    -- their owner (SECURITY DEFINER). No catalog scans: the clock is read by
    -- every procedure, also in the plans tests inspect.
    IF current_setting('is_superuser') <> 'on'
       AND NOT coalesce(pg_has_role(session_user, to_regrole('minutehand_clock'), 'MEMBER'), false) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH403',
            MESSAGE = format('role %I may not pin minutehand.now (only members of minutehand_clock may)', session_user);
    END IF;
    RETURN p_setting::timestamptz;
END $$;

-- Unpinned (the production case) this reads one setting and the wall clock;
-- the role check runs only for a pinned clock.
CREATE OR REPLACE FUNCTION mh_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN coalesce(current_setting('minutehand.now', true), '') = '' THEN clock_timestamp()
                ELSE mh_pinned_clock(current_setting('minutehand.now', true)) END
$$;

-- ---------------------------------------------------------------- submission
-- The entry points of other services run with their owner's rights.
ALTER FUNCTION submit_job(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real)
    SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION submit_job_detail(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real)
    SECURITY DEFINER SET search_path = public, pg_temp;

-- submit_jobs as in sql/003_submit.sql, except: arrays must all be as long
-- as p_names (or NULL), and keyed items take their key rows in (shard, key)
-- order, the order every procedure locks keys in.
CREATE OR REPLACE FUNCTION submit_jobs(
    p_team text, p_names text[], p_due_ats timestamptz[] DEFAULT NULL, p_payloads jsonb[] DEFAULT NULL,
    p_priorities int[] DEFAULT NULL, p_max_attempts int[] DEFAULT NULL, p_flex_s int[] DEFAULT NULL,
    p_stricts boolean[] DEFAULT NULL, p_keys text[] DEFAULT NULL,
    p_backoff_base_s real[] DEFAULT NULL, p_backoff_cap_s real[] DEFAULT NULL)
RETURNS SETOF submit_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_n       int := coalesce(cardinality(p_names), 0);
    v_due     due_row[];
    v_results submit_result[];
    v_keyed   record;
    v_label   text;
    r         record;
BEGIN
    SELECT a.label INTO v_label
      FROM (VALUES ('due_ats', cardinality(p_due_ats)), ('payloads', cardinality(p_payloads)),
                   ('priorities', cardinality(p_priorities)), ('max_attempts', cardinality(p_max_attempts)),
                   ('flex_s', cardinality(p_flex_s)), ('stricts', cardinality(p_stricts)),
                   ('keys', cardinality(p_keys)), ('backoff_base_s', cardinality(p_backoff_base_s)),
                   ('backoff_cap_s', cardinality(p_backoff_cap_s))) AS a(label, n)
     WHERE a.n IS NOT NULL AND a.n <> v_n
     LIMIT 1;
    IF v_label IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = format('p_%s has a different length than p_names (%s): pass one value per job, or NULL',
                             v_label, v_n);
    END IF;
    WITH checked AS (
        SELECT * FROM mh_batch_items(p_names, p_due_ats, p_payloads, p_priorities, p_max_attempts, p_flex_s,
                                     p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s, v_now)
    ), sharded AS (
        SELECT c.*, mh_random_shard() AS shard FROM checked c WHERE c.problem IS NULL AND c.key IS NULL
    ), fresh AS (
        SELECT s.*, mh_new_id(s.shard) AS id, mh_run_at(s.due_at, s.flex_s, s.is_strict, v_now) AS run_at
          FROM sharded s
    ), new_jobs AS (
        INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                          max_attempts, backoff_base_s, backoff_cap_s, created_at, updated_at)
        SELECT f.shard, f.id, v_team, f.name, f.payload, f.priority, coalesce(f.due_at, v_now), f.flex_s, f.is_strict,
               f.run_at, 'scheduled', f.max_attempts, f.base, f.cap, v_now, v_now
          FROM fresh f
    )
    SELECT (SELECT array_agg(ROW(f.shard, f.is_strict, f.priority, f.run_at, f.id)::due_row) FROM fresh f),
           (SELECT array_agg(ROW(c.idx, f.id, f.run_at, f.id IS NOT NULL, c.problem)::submit_result)
              FROM checked c LEFT JOIN fresh f ON f.idx = c.idx
             WHERE c.key IS NULL OR c.problem IS NOT NULL)
      INTO v_due, v_results;
    PERFORM mh_enqueue_many(v_due, v_now);
    RETURN QUERY SELECT * FROM unnest(v_results);

    FOR r IN SELECT * FROM mh_batch_items(p_names, p_due_ats, p_payloads, p_priorities, p_max_attempts, p_flex_s,
                                          p_stricts, p_keys, p_backoff_base_s, p_backoff_cap_s, v_now) c
              WHERE c.key IS NOT NULL AND c.problem IS NULL
              ORDER BY mh_key_shard(v_team, c.key), c.key, c.idx
    LOOP
        SELECT * INTO v_keyed FROM mh_submit_keyed(v_team, r.name, r.due_at, r.payload, r.priority, r.max_attempts,
                                                   r.flex_s, r.is_strict, r.key, r.base, r.cap, v_now);
        RETURN NEXT ROW(r.idx, v_keyed.job_id, v_keyed.run_at, v_keyed.created, v_keyed.conflict)::submit_result;
    END LOOP;
END $$;

-- ---------------------------------------------------------------- repeating jobs
-- Time zone names PostgreSQL knows, copied from pg_timezone_names when the
-- schema is migrated (that view reads every zone file on each call). A
-- name without '/' must be listed here: timezone() would also take an
-- abbreviation (CEST) or a POSIX offset (UTC+3), neither of which keeps
-- DST rules. Migrating again after a tzdata update refreshes the list.
CREATE TABLE timezone_names (name text PRIMARY KEY);
INSERT INTO timezone_names SELECT DISTINCT name FROM pg_timezone_names;

CREATE OR REPLACE FUNCTION mh_repeat_problem(p_every_s int, p_cron text, p_timezone text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF (p_every_s IS NULL) = (p_cron IS NULL) THEN
        RETURN 'repeat needs exactly one of every_s or cron';
    END IF;
    IF p_every_s IS NOT NULL THEN
        IF p_timezone IS NOT NULL THEN
            RETURN 'repeat.timezone goes with cron, not with every_s';
        END IF;
        IF p_every_s NOT BETWEEN 1 AND 31622400 THEN
            RETURN 'repeat.every_s must be between 1 and 31622400 seconds';
        END IF;
        RETURN NULL;
    END IF;
    IF length(p_cron) > 200 OR p_cron !~ '^\s*[0-9A-Za-z*/,?#-]+(\s+[0-9A-Za-z*/,?#-]+){4}\s*$' THEN
        RETURN format('repeat.cron %L is not a 5-field crontab expression (minute hour day month weekday)',
                      left(p_cron, 200));
    END IF;
    IF p_timezone IS NOT NULL AND NOT EXISTS (SELECT 1 FROM timezone_names z WHERE z.name = p_timezone) THEN
        RETURN format('repeat.timezone %L is not an IANA time zone name (like Europe/Berlin)', left(p_timezone, 100));
    END IF;
    RETURN NULL;
END $$;

-- submit_series as in sql/007_series.sql, except that the first run's due
-- time is checked like any due time (not before 2000, not past the horizon).
CREATE OR REPLACE FUNCTION submit_series(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT 0,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600,
    p_every_s int DEFAULT NULL, p_cron text DEFAULT NULL, p_timezone text DEFAULT NULL,
    p_first_due_at timestamptz DEFAULT NULL,
    OUT series_id bigint, OUT job_id bigint, OUT run_at timestamptz, OUT created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_payload jsonb := coalesce(p_payload, '{}');
    v_zone    text := CASE WHEN p_cron IS NOT NULL THEN coalesce(p_timezone, 'UTC') ELSE p_timezone END;
    v_first   timestamptz;
    v_problem text;
    v_shard   smallint;
    v_key     record;
BEGIN
    v_problem := mh_payload_problem(v_payload);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH413', MESSAGE = v_problem;
    END IF;
    v_problem := mh_repeat_problem(p_every_s, p_cron, v_zone);
    IF v_problem IS NULL THEN
        v_problem := mh_job_problem(p_name, p_due_at, p_priority, p_max_attempts, p_flex_s, p_strict,
                                    p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, v_now);
    END IF;
    IF v_problem IS NULL THEN
        v_first := CASE WHEN p_every_s IS NOT NULL THEN coalesce(p_first_due_at, p_due_at, v_now)
                        ELSE p_first_due_at END;
        v_problem := CASE
            WHEN v_first IS NULL
                THEN 'a cron series needs its first due time (p_first_due_at): the first fire time of the '
                     'expression in its zone at or after the start'
            WHEN v_first < p_due_at
                THEN format('the first run (%s) cannot be due before the requested start (%s)', v_first, p_due_at)
            ELSE mh_due_problem('the first run of this series', v_first, v_now)
        END;
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = v_problem;
    END IF;

    IF p_idempotency_key IS NULL THEN
        v_shard := mh_random_shard();
        job_id := mh_new_id(v_shard);
    ELSE
        v_shard := mh_key_shard(v_team, p_idempotency_key);
        job_id := mh_new_id(v_shard);
        SELECT * INTO v_key FROM mh_take_key(
            v_shard, v_team, p_idempotency_key, job_id,
            mh_series_hash(p_name, p_due_at, v_payload, p_priority, p_max_attempts, p_flex_s, p_strict,
                           p_backoff_base_s, p_backoff_cap_s, p_every_s, p_cron, v_zone),
            v_now);
        IF v_key.conflict IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'MH409', MESSAGE = v_key.conflict;
        END IF;
        IF v_key.existing IS NOT NULL THEN
            created := false;
            job_id := v_key.existing;
            SELECT j.series_id, j.run_at INTO series_id, run_at
              FROM jobs j WHERE j.shard = v_shard AND j.id = v_key.existing;
            RETURN;
        END IF;
    END IF;

    created := true;
    series_id := mh_new_id(v_shard);
    run_at := mh_run_at(v_first, p_flex_s, p_strict, v_now);
    INSERT INTO series (shard, id, team_id, name, payload, priority, max_attempts, backoff_base_s, backoff_cap_s,
                        flex_s, strict, every_s, cron, timezone, idempotency_key, first_due_at, last_job_id,
                        last_due_at, created_at, updated_at)
    VALUES (v_shard, series_id, v_team, p_name, v_payload, p_priority, p_max_attempts, p_backoff_base_s,
            p_backoff_cap_s, p_flex_s, p_strict, p_every_s, p_cron, v_zone, p_idempotency_key, v_first, job_id,
            v_first, v_now, v_now);
    INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                      max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, series_id, created_at, updated_at)
    VALUES (v_shard, job_id, v_team, p_name, v_payload, p_priority, v_first, p_flex_s, p_strict, run_at, 'scheduled',
            p_max_attempts, p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, series_id, v_now, v_now);
    PERFORM mh_enqueue(v_shard, job_id, run_at, p_strict, p_priority::smallint, v_now);
END $$;

-- ---------------------------------------------------------------- outcomes
-- The outcome batches of sql/005_outcomes.sql and release_many of
-- sql/008_dispatch.sql, with their input sorted by (shard, id) so that the
-- job rows are locked in that order (a worker that retries an outcomes
-- request through another dispatcher can have two batches holding the same
-- jobs in different orders), and the idempotency keys a completion writes
-- locked in (shard, team, key) order, the order submit_jobs takes them in.
-- Answers still come in input order.
CREATE OR REPLACE FUNCTION start_many(p_ids bigint[], p_tokens uuid[]) RETURNS SETOF outcome
LANGUAGE plpgsql AS $$
DECLARE v_now timestamptz := mh_now();
BEGIN
    RETURN QUERY
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), started AS (
        UPDATE jobs j
           SET state = 'running', started_at = coalesce(j.started_at, v_now),
               lateness = coalesce(j.lateness, v_now - j.due_at), updated_at = v_now
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state IN ('claimed', 'running')
        RETURNING j.id, i.ord
    )
    SELECT i.id, s.id IS NOT NULL,
           CASE WHEN s.id IS NOT NULL THEN 'running'::job_state ELSE j.state END,
           CASE WHEN s.id IS NULL THEN mh_refusal(j.found, j.state) END
      FROM input i
      LEFT JOIN started s ON s.ord = i.ord
      LEFT JOIN LATERAL mh_job_state(i.id, s.id IS NULL) j ON true
     ORDER BY i.ord;
END $$;

CREATE OR REPLACE FUNCTION heartbeat_many(p_ids bigint[], p_tokens uuid[], p_extend_s real) RETURNS SETOF outcome
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_expires timestamptz;
BEGIN
    IF p_extend_s IS NULL OR NOT (p_extend_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'extension must be between 1 and 86400 seconds';
    END IF;
    v_expires := v_now + make_interval(secs => p_extend_s);
    RETURN QUERY
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), renewed AS (
        UPDATE jobs j SET claim_expires_at = greatest(j.claim_expires_at, v_expires), updated_at = v_now
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.state, i.ord
    )
    SELECT i.id, r.id IS NOT NULL, coalesce(r.state, j.state),
           CASE WHEN r.id IS NULL THEN mh_refusal(j.found, j.state) END
      FROM input i
      LEFT JOIN renewed r ON r.ord = i.ord
      LEFT JOIN LATERAL mh_job_state(i.id, r.id IS NULL) j ON true
     ORDER BY i.ord;
END $$;

CREATE OR REPLACE FUNCTION complete_many(p_ids bigint[], p_tokens uuid[], p_results jsonb[] DEFAULT NULL)
RETURNS SETOF outcome LANGUAGE plpgsql AS $$
DECLARE v_now timestamptz := mh_now();
BEGIN
    RETURN QUERY
    WITH input AS (
        SELECT u.id, u.token, u.result, u.ord
          FROM unnest(p_ids, p_tokens, p_results) WITH ORDINALITY AS u(id, token, result, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), done AS (
        UPDATE jobs j
           SET state = 'succeeded', result = i.result, finished_at = v_now, updated_at = v_now,
               started_at = coalesce(j.started_at, j.claimed_at),
               lateness = coalesce(j.lateness, j.claimed_at - j.due_at),
               claim_expires_at = NULL, lease_token = NULL
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.shard, j.team_id, j.idempotency_key, i.result, i.ord
    ), stored AS (
        UPDATE idempotency_keys k SET result = d.result, completed_at = v_now
          FROM (SELECT * FROM done d WHERE d.idempotency_key IS NOT NULL
                 ORDER BY d.shard, d.team_id, d.idempotency_key) d
         WHERE k.shard = d.shard AND k.team_id = d.team_id AND k.key = d.idempotency_key AND k.job_id = d.id
    )
    SELECT i.id, d.id IS NOT NULL,
           CASE WHEN d.id IS NOT NULL THEN 'succeeded'::job_state ELSE j.state END,
           CASE WHEN d.id IS NULL THEN mh_refusal(j.found, j.state) END
      FROM input i
      LEFT JOIN done d ON d.ord = i.ord
      LEFT JOIN LATERAL mh_job_state(i.id, d.id IS NULL) j ON true
     ORDER BY i.ord;
END $$;

CREATE OR REPLACE FUNCTION fail_many(p_ids bigint[], p_tokens uuid[], p_errors text[], p_retryable boolean[] DEFAULT NULL)
RETURNS SETOF outcome LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_job     jobs%ROWTYPE;
    v_run_at  timestamptz;
    v_error   text;
    v_answers outcome[] := array_fill(NULL::outcome, ARRAY[coalesce(cardinality(p_ids), 0)]);
    i         int;
BEGIN
    FOR i IN SELECT u.ord FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord) ORDER BY mh_shard_of(u.id), u.id, u.ord
    LOOP
        SELECT * INTO v_job FROM jobs j
         WHERE j.shard = mh_shard_of(p_ids[i]) AND j.id = p_ids[i] FOR UPDATE;
        IF NOT FOUND OR v_job.state NOT IN ('claimed', 'running') OR v_job.lease_token IS DISTINCT FROM p_tokens[i] THEN
            v_answers[i] := ROW(p_ids[i], false, v_job.state, mh_refusal(FOUND, v_job.state))::outcome;
            CONTINUE;
        END IF;
        v_error := left(coalesce(p_errors[i], 'failed'), 10000);
        IF coalesce(p_retryable[i], true) AND v_job.attempts < v_job.max_attempts THEN
            v_run_at := v_now + mh_backoff(v_job.attempts, v_job.backoff_base_s, v_job.backoff_cap_s);
            UPDATE jobs j
               SET state = 'retrying', run_at = v_run_at, last_error = v_error, updated_at = v_now,
                   claimed_by = NULL, claim_expires_at = NULL, lease_token = NULL
             WHERE j.shard = v_job.shard AND j.id = v_job.id;
            PERFORM mh_enqueue(v_job.shard, v_job.id, v_run_at, (v_job).strict, v_job.priority, v_now);
            v_answers[i] := ROW(v_job.id, true, 'retrying'::job_state, NULL::text)::outcome;
        ELSE
            UPDATE jobs j
               SET state = 'dead', last_error = v_error, finished_at = v_now, updated_at = v_now,
                   started_at = coalesce(j.started_at, j.claimed_at),
                   lateness = coalesce(j.lateness, j.claimed_at - j.due_at),
                   claim_expires_at = NULL, lease_token = NULL
             WHERE j.shard = v_job.shard AND j.id = v_job.id;
            v_answers[i] := ROW(v_job.id, true, 'dead'::job_state, NULL::text)::outcome;
        END IF;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_answers);
END $$;

CREATE OR REPLACE FUNCTION release_many(p_ids bigint[], p_tokens uuid[]) RETURNS SETOF outcome
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_ords   bigint[];
    v_states job_state[];
    v_rows   due_row[];
BEGIN
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
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

-- Cancel a job that has not started, for the team named (required: a job
-- of another team is "no such job"). Administrators cancel through the
-- job's own team.
CREATE OR REPLACE FUNCTION cancel(p_job bigint, p_team text) RETURNS outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_now   timestamptz := mh_now();
    v_team  int;
    v_state job_state;
BEGIN
    IF p_team IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'cancel needs the team the job belongs to';
    END IF;
    v_team := mh_team_id(p_team);
    UPDATE jobs j SET state = 'cancelled', finished_at = v_now, updated_at = v_now
     WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job AND j.team_id = v_team
       AND j.state IN ('scheduled', 'retrying');
    IF FOUND THEN
        RETURN ROW(p_job, true, 'cancelled'::job_state, NULL::text)::outcome;
    END IF;
    SELECT j.state INTO v_state FROM jobs j
     WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job AND j.team_id = v_team;
    IF NOT FOUND THEN
        RETURN ROW(p_job, false, NULL::job_state, 'no such job')::outcome;
    END IF;
    RETURN ROW(p_job, false, v_state, format('job is %s: only a job that has not started can be cancelled', v_state))::outcome;
END $$;

-- ---------------------------------------------------------------- claim expiry
-- expire_claims as in sql/006_maintenance.sql; the reason it records says
-- what a person reading a dead job needs: the claim lapsed on the last
-- attempt, and the job may have run (at-least-once).
CREATE OR REPLACE FUNCTION expire_claims(p_shard int, p_limit int DEFAULT 1000, OUT returned bigint, OUT dead bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := mh_now();
    v_ids  bigint[];
    v_rows due_row[];
BEGIN
    returned := 0; dead := 0;
    WITH due AS (
        DELETE FROM claim_checks c
         WHERE c.shard = p_shard
           AND c.ctid = ANY (ARRAY(SELECT k.ctid FROM claim_checks k
                                    WHERE k.shard = p_shard AND k.check_at <= v_now LIMIT p_limit))
        RETURNING c.job_ids
    )
    SELECT array_agg(DISTINCT i ORDER BY i) INTO v_ids FROM due, unnest(due.job_ids) i;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- The jobs are visited in id order (a nested loop over the sorted ids),
    -- the order the outcome batches lock them in.
    WITH expired AS (
        UPDATE jobs j
           SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'scheduled' END::job_state,
               finished_at = CASE WHEN j.attempts >= j.max_attempts THEN v_now END,
               last_error = CASE WHEN j.attempts >= j.max_attempts
                   THEN format('claim expired on attempt %s of %s (by %s, at %s): no attempts left. The worker '
                               'stopped reporting; the job may have run (at-least-once)',
                               j.attempts, j.max_attempts, j.claimed_by, j.claim_expires_at)
                   ELSE format('claim expired on attempt %s of %s (by %s, at %s)',
                               j.attempts, j.max_attempts, j.claimed_by, j.claim_expires_at) END,
               run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at ELSE v_now END,
               claimed_by = NULL, claim_expires_at = NULL, lease_token = NULL, updated_at = v_now
          FROM unnest(v_ids) AS i(id)
         WHERE j.shard = p_shard AND j.id = i.id
           AND j.state IN ('claimed', 'running') AND j.claim_expires_at < v_now
        RETURNING j.id, j.state, j.strict, j.priority
    )
    SELECT array_agg(ROW(p_shard, e.strict, e.priority, v_now, e.id)::due_row) FILTER (WHERE e.state = 'scheduled'),
           count(*) FILTER (WHERE e.state = 'scheduled'),
           count(*) FILTER (WHERE e.state = 'dead')
      INTO v_rows, returned, dead
      FROM expired e;
    PERFORM mh_enqueue_many(v_rows, v_now);

    INSERT INTO claim_checks (shard, check_at, job_ids)
    SELECT p_shard, min(j.claim_expires_at), array_agg(j.id)
      FROM jobs j
     WHERE j.shard = p_shard AND j.id = ANY (v_ids) AND j.state IN ('claimed', 'running')
    HAVING count(*) > 0;
END $$;

-- ---------------------------------------------------------------- the claim
-- The claim of one minute bucket for workers that handle only some job
-- names ($4, NULL: any) or only some teams' jobs ($5, team ids; NULL: any).
-- The due rows carry neither, so each candidate is joined to its job (a
-- primary-key probe); rows of other names or teams are skipped, and stay
-- for a worker that takes them. Unfiltered claims use mh_claim_sql.
CREATE FUNCTION mh_claim_filtered_sql(p_slot int) RETURNS text
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

-- Whether p_owner holds the current lease of a shard with epoch p_epoch.
CREATE FUNCTION mh_lease_problem(p_shard int, p_owner text, p_epoch bigint, p_now timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT EXISTS (
        SELECT 1 FROM shards s
         WHERE s.shard = p_shard AND s.owner = p_owner AND s.epoch = p_epoch AND s.lease_expires_at > p_now)
    THEN format('shard %s: %L does not hold a current lease with epoch %s', p_shard, p_owner, p_epoch) END
$$;

-- The claim itself, for a caller that has checked the lease in the same
-- transaction (claim_due, claim_for_worker): up to p_limit due jobs of one
-- shard, of the given names and teams (NULL: any), with each job's team
-- and the result stored under its idempotency key (`replay`). The hand and
-- the buckets work as described for claim_due in sql/004_claim.sql.
CREATE FUNCTION mh_claim(p_shard int, p_limit int, p_owner text, p_lease_s real, p_worker text,
                         p_names text[], p_teams text[])
RETURNS TABLE (job_id bigint, team_id int, team text, name text, payload jsonb, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, priority smallint, strict boolean, replay jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := mh_now();
    v_cur      timestamptz := mh_minute(v_now);
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
    IF v_hand IS NULL OR v_hand < v_cur - mh_sweep_after() THEN
        v_hand := greatest(coalesce(v_hand, v_cur - interval '1 minute'), v_cur - mh_sweep_after());
        PERFORM mh_move_hand(p_shard, v_hand);
    END IF;
    v_bucket := v_hand;
    LOOP
        v_any := v_bucket >= v_cur OR mh_bucket_has_rows(v_bucket, p_shard);
        IF v_any THEN
            IF p_names IS NULL AND p_teams IS NULL THEN
                EXECUTE mh_claim_sql(mh_minute_slot(v_bucket)) INTO v_ids USING p_shard, v_now, v_left;
            ELSE
                EXECUTE mh_claim_filtered_sql(mh_minute_slot(v_bucket)) INTO v_ids
                  USING p_shard, v_now, v_left, p_names, v_team_ids;
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
            SELECT c.id, c.team_id, t.name, c.name, c.payload, c.attempts, c.max_attempts, c.idempotency_key,
                   c.lease_token, c.claim_expires_at, c.due_at, c.run_at, c.priority, c.strict, k.result
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
        IF NOT v_any AND v_bucket = v_hand AND v_bucket < v_cur - interval '1 minute' THEN
            v_hand := v_bucket + interval '1 minute';
            PERFORM mh_move_hand(p_shard, v_hand);
        END IF;
        v_bucket := v_bucket + interval '1 minute';
    END LOOP;
END $$;

-- claim_due keeps its signature and its refusal (MH403 for a stale lease);
-- the claim is mh_claim's.
CREATE OR REPLACE FUNCTION claim_due(p_shard int, p_limit int, p_owner text, p_epoch bigint,
                                     p_lease_s real, p_worker text DEFAULT NULL, p_names text[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, team_id int, name text, payload jsonb, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, priority smallint, strict boolean, replay jsonb)
LANGUAGE plpgsql AS $$
DECLARE v_problem text := mh_lease_problem(p_shard, p_owner, p_epoch, mh_now());
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH403', MESSAGE = v_problem;
    END IF;
    RETURN QUERY
    SELECT c.job_id, c.team_id, c.name, c.payload, c.attempt, c.max_attempts, c.idempotency_key, c.lease_token,
           c.claim_expires_at, c.due_at, c.run_at, c.priority, c.strict, c.replay
      FROM mh_claim(p_shard, p_limit, p_owner, p_lease_s, p_worker, p_names, NULL) c;
END $$;

-- A time as it is when every client can read it (years 1 to 9999), else NULL.
CREATE FUNCTION mh_readable(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN t >= '0001-01-01 00:00:00+00' AND t < '10000-01-01 00:00:00+00' THEN t END
$$;

-- The dispatcher's claim: many go in one round trip, so nothing expected
-- raises. A stale lease is one row naming why (every other column NULL),
-- checked once, in the claim's own transaction. Each job names its team;
-- payload and replayed result come as JSON text, handed on as they are.
-- (New signature: p_teams and the team column.)
DROP FUNCTION claim_for_worker(int, int, text, bigint, real, text, text[]);
CREATE FUNCTION claim_for_worker(p_shard int, p_limit int, p_owner text, p_epoch bigint,
                                 p_lease_s real, p_worker text, p_names text[], p_teams text[])
RETURNS TABLE (job_id bigint, team text, name text, payload text, attempt int, max_attempts int,
               idempotency_key text, lease_token uuid, claim_expires_at timestamptz,
               due_at timestamptz, run_at timestamptz, replay text, refused text)
LANGUAGE plpgsql AS $$
DECLARE v_problem text := mh_lease_problem(p_shard, p_owner, p_epoch, mh_now());
BEGIN
    IF v_problem IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
                            NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, v_problem;
        RETURN;
    END IF;
    -- A time no client can read (before year 1 or after 9999: a row written
    -- around the procedures) comes as NULL, so that the dispatcher can fail
    -- that job alone instead of failing to read every row of the claim.
    RETURN QUERY
    SELECT c.job_id, c.team, c.name, c.payload::text, c.attempt, c.max_attempts, c.idempotency_key, c.lease_token,
           c.claim_expires_at, mh_readable(c.due_at), mh_readable(c.run_at), c.replay::text, NULL::text
      FROM mh_claim(p_shard, p_limit, p_owner, p_lease_s, p_worker, p_names, p_teams) c;
END $$;
