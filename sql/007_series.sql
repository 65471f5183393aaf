-- Repeating jobs: a series row and its first run. Applied by
-- migrations/versions/0002_series.py; undone by sql/undo/0002_series.sql.
--
-- A series is a chain of ordinary jobs: each run is a row of `jobs` whose
-- series_id names the series, on the series' own shard, so (shard,
-- series_id, due_at) — the unique index jobs_series_run of 001_core.sql —
-- stops any run from being created twice. This revision stores the series
-- with its first run only, so a series runs once. Not built yet: continuing
-- the chain — creating run N+1 (due at the next fire time after
-- last_due_at) from run N, unless cancelled_at is set — which will read and
-- advance the columns marked "chain" below.
--
-- Fire times are computed in Python (APScheduler: cron in an IANA zone,
-- DST included); the procedures take them as values. What SQL can check
-- without a cron parser it checks here, once, for HTTP and SQL callers.

-- ---------------------------------------------------------------- table
-- Citus-ready like jobs: distributed by shard, colocated with the runs.
CREATE TABLE series (
    shard            smallint    NOT NULL,
    id               bigint      NOT NULL,   -- mh_new_id(shard): the shard is readable from it
    team_id          int         NOT NULL,
    -- what every run is made of
    name             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         smallint    NOT NULL,
    max_attempts     int         NOT NULL,
    backoff_base_s   real        NOT NULL,
    backoff_cap_s    real        NOT NULL,
    flex_s           int         NOT NULL,
    strict           boolean     NOT NULL,
    -- the repeat spec: every every_s seconds, or a 5-field crontab in an IANA zone
    every_s          int,
    cron             text,
    timezone         text,
    -- the key the series was submitted with; it names the first run only
    -- (later runs carry no key: a stored result must not be replayed to them)
    idempotency_key  text,
    first_due_at     timestamptz NOT NULL,   -- the first run's due time
    -- chain: the newest run created and its due time (run N+1 follows it)
    last_job_id      bigint      NOT NULL,
    last_due_at      timestamptz NOT NULL,
    cancelled_at     timestamptz,            -- chain: set, no further run is created
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (shard, id),
    CHECK ((every_s IS NULL) <> (cron IS NULL)),
    CHECK ((cron IS NULL) = (timezone IS NULL))
);

-- ---------------------------------------------------------------- validation
-- NULL when the repeat spec is acceptable, else a reason a person can act on.
-- The cron expression is checked for shape only (5 fields); the HTTP API
-- parses it with APScheduler, whose fire times the caller passes in. The zone
-- must be an IANA name PostgreSQL knows (an abbreviation like CEST or an
-- offset like UTC+3 is refused: a zone name keeps its DST rules).
CREATE FUNCTION mh_repeat_problem(p_every_s int, p_cron text, p_timezone text) RETURNS text
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
    IF p_timezone IS NOT NULL THEN
        IF p_timezone !~ '^[A-Za-z][A-Za-z0-9_+-]{0,63}(/[A-Za-z0-9_+-]{1,63}){0,3}$' THEN
            RETURN format('repeat.timezone %L is not an IANA time zone name (like Europe/Berlin)',
                          left(p_timezone, 100));
        END IF;
        IF p_timezone = 'UTC' THEN
            RETURN NULL;
        ELSIF strpos(p_timezone, '/') = 0 THEN
            -- Without a '/', timezone() would also take an abbreviation (CEST) or a
            -- POSIX offset (UTC+3), neither an IANA name: look the name up (~20 ms).
            IF NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = p_timezone) THEN
                RETURN format('repeat.timezone %L is not an IANA time zone name (like Europe/Berlin)', p_timezone);
            END IF;
        ELSE
            BEGIN
                PERFORM timezone(p_timezone, timestamptz '2000-01-01 00:00:00+00');
            EXCEPTION WHEN invalid_parameter_value THEN
                RETURN format('repeat.timezone %L is not an IANA time zone name (like Europe/Berlin)', p_timezone);
            END;
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- What "the same request" means for an idempotency key on a series: the
-- job fields as a job's key compares them (the due time as sent: NULL when
-- omitted, not the computed first run, so a retry after a fire time has
-- passed still names the first series) plus the repeat spec. Never equal to
-- a single job's hash: a key used for a job and then for a series conflicts.
CREATE FUNCTION mh_series_hash(p_name text, p_due_at timestamptz, p_payload jsonb, p_priority int,
                               p_max_attempts int, p_flex_s int, p_strict boolean,
                               p_backoff_base_s real, p_backoff_cap_s real,
                               p_every_s int, p_cron text, p_timezone text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array('series', mh_request_hash(p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                                                           p_flex_s, p_strict, p_backoff_base_s, p_backoff_cap_s),
                                 p_every_s, p_cron, p_timezone)::text)
$$;

-- Take an idempotency key for a new job (p_job_id), as mh_submit_keyed does
-- for single jobs: both NULL, the key is now this job's; existing, the same
-- request within 24 h made that job; conflict, another request used the key.
CREATE FUNCTION mh_take_key(p_shard smallint, p_team int, p_key text, p_job_id bigint, p_hash text,
                            p_now timestamptz, OUT existing bigint, OUT conflict text)
LANGUAGE plpgsql AS $$
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

-- ---------------------------------------------------------------- submission
-- A repeating job: the series row and its first run (an ordinary job with
-- series_id), on one shard, in the caller's transaction. Validated as
-- submit_job validates a job, plus the repeat spec.
--
-- p_due_at is the due time as the submitter sent it (NULL: now); it is what
-- an idempotency key compares. p_first_due_at is the first run's due time:
-- for every_s, omitted means p_due_at (or now); for cron it is required —
-- the first fire time of the expression in its zone at or after the start,
-- computed by the caller (the HTTP API uses APScheduler). p_timezone defaults
-- to UTC for cron.
--
-- Returns the series id, the first run's job id and run time, and whether
-- they were created (false: the idempotency key named an earlier series,
-- whose first run is returned).
CREATE FUNCTION submit_series(
    p_team text, p_name text, p_due_at timestamptz DEFAULT NULL, p_payload jsonb DEFAULT '{}',
    p_priority int DEFAULT 0, p_max_attempts int DEFAULT 3, p_flex_s int DEFAULT 0,
    p_strict boolean DEFAULT false, p_idempotency_key text DEFAULT NULL,
    p_backoff_base_s real DEFAULT 1, p_backoff_cap_s real DEFAULT 3600,
    p_every_s int DEFAULT NULL, p_cron text DEFAULT NULL, p_timezone text DEFAULT NULL,
    p_first_due_at timestamptz DEFAULT NULL,
    OUT series_id bigint, OUT job_id bigint, OUT run_at timestamptz, OUT created boolean)
LANGUAGE plpgsql AS $$
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
            WHEN v_first IN ('infinity', '-infinity') THEN 'the first due time must be a finite time'
            WHEN v_first < p_due_at
                THEN format('the first run (%s) cannot be due before the requested start (%s)', v_first, p_due_at)
            WHEN v_first > v_now + mh_max_ahead()
                THEN format('the first run of this series (%s) is more than %s ahead', v_first, mh_max_ahead())
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
