-- Repeating jobs: a series row and its first run (sql/tables/series.sql).
--
-- Fire times are computed in Python (APScheduler: cron in an IANA zone,
-- DST included); the procedures take them as values. What SQL can check
-- without a cron parser it checks here, once, for HTTP and SQL callers.

-- NULL when the repeat spec is acceptable, else a reason a person can act on.
-- The cron expression is checked for shape only (5 fields); the HTTP API
-- parses it with APScheduler, whose fire times the caller passes in. The zone
-- must be an IANA name PostgreSQL knows (timezone_names): an abbreviation
-- like CEST or an offset like UTC+3 is refused, a zone name keeps its DST rules.
CREATE OR REPLACE FUNCTION mh_repeat_problem(p_every_s int, p_cron text, p_timezone text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
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

-- What "the same request" means for an idempotency key on a series: the
-- job fields as a job's key compares them (the due time as sent: NULL when
-- omitted, not the computed first run, so a retry after a fire time has
-- passed still names the first series) plus the repeat spec. Never equal to
-- a single job's hash: a key used for a job and then for a series conflicts.
CREATE OR REPLACE FUNCTION mh_series_hash(p_name text, p_due_at timestamptz, p_payload jsonb, p_priority int,
                               p_max_attempts int, p_flex_s int, p_strict boolean,
                               p_backoff_base_s real, p_backoff_cap_s real,
                               p_every_s int, p_cron text, p_timezone text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array('series', mh_request_hash(p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                                                           p_flex_s, p_strict, p_backoff_base_s, p_backoff_cap_s),
                                 p_every_s, p_cron, p_timezone)::text)
$$;

-- A repeating job: the series row and its first run (an ordinary job with
-- series_id), on one shard, in the caller's transaction. Validated as
-- submit_job validates a job, plus the repeat spec; the first run's due
-- time is checked like any due time. Runs as its owner, like submit_job.
--
-- p_due_at is the due time as the submitter sent it (NULL: now); it is what
-- an idempotency key compares. p_first_due_at is the first run's due time:
-- for every_s, omitted means p_due_at (or now); for cron it is required —
-- the first fire time of the expression in its zone at or after the start,
-- computed by the caller (the HTTP API uses APScheduler). p_timezone defaults
-- to UTC for cron.
--
-- p_flex_s omitted (NULL) and not strict: the default window of the name,
-- else for a cron series on round minutes the round-cron default
-- (mh_default_flex). A flexible series is not placed by load: every run is
-- due + mh_series_offset(series, flex_s), a stable offset from the series
-- id (never before now); its runs are counted in the planned load all the same.
--
-- Returns the series id, the first run's job id and run time, and whether
-- they were created (false: the idempotency key named an earlier series,
-- whose first run is returned).
CREATE OR REPLACE FUNCTION submit_series(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT NULL,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600,
    p_every_s int DEFAULT NULL, p_cron text DEFAULT NULL, p_timezone text DEFAULT NULL,
    p_first_due_at timestamptz DEFAULT NULL,
    OUT series_id bigint, OUT job_id bigint, OUT run_at timestamptz, OUT created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := mh_now();
    v_team    int := mh_team_id(p_team);
    v_payload jsonb := coalesce(p_payload, '{}');
    v_zone    text := CASE WHEN p_cron IS NOT NULL THEN coalesce(p_timezone, 'UTC') ELSE p_timezone END;
    v_flex    int := mh_flex_of(v_team, p_name, p_flex_s, p_strict, p_cron);
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
        v_problem := mh_job_problem(p_name, p_due_at, p_priority, p_max_attempts, v_flex, p_strict,
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
    run_at := greatest(v_first + CASE WHEN p_strict THEN interval '0' ELSE mh_series_offset(series_id, v_flex) END,
                       v_now);
    INSERT INTO series (shard, id, team_id, name, payload, priority, max_attempts, backoff_base_s, backoff_cap_s,
                        flex_s, strict, every_s, cron, timezone, idempotency_key, first_due_at, last_job_id,
                        last_due_at, created_at, updated_at)
    VALUES (v_shard, series_id, v_team, p_name, v_payload, p_priority, p_max_attempts, p_backoff_base_s,
            p_backoff_cap_s, v_flex, p_strict, p_every_s, p_cron, v_zone, p_idempotency_key, v_first, job_id,
            v_first, v_now, v_now);
    INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                      max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, series_id, created_at, updated_at,
                      agreed_at)
    VALUES (v_shard, job_id, v_team, p_name, v_payload, p_priority, v_first, v_flex, p_strict, run_at, 'scheduled',
            p_max_attempts, p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, series_id, v_now, v_now, run_at);
    PERFORM mh_enqueue(v_shard, job_id, run_at, p_strict, p_priority::smallint, v_team, v_now);
    PERFORM mh_add_stats(v_now, ARRAY[mh_submitted(v_shard, v_team, p_name)]);
    PERFORM mh_count_load(ARRAY[run_at]);
END $$;
