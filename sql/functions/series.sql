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
    -- Five fields apart by single spaces, nothing around them (as the HTTP API
    -- takes them: app/minutehand/rules.py).
    IF length(p_cron) > 200 OR p_cron !~ '^[0-9A-Za-z*/,?#-]+( [0-9A-Za-z*/,?#-]+){4}$' THEN
        RETURN format('repeat.cron %L is not a 5-field crontab expression (minute hour day month weekday, '
                      'apart by single spaces, nothing around them)', left(p_cron, 200));
    END IF;
    -- Not the zone files a host may have that name no IANA zone: its own local
    -- time, tzdata's Factory placeholder, the POSIX rules and the posix/ and
    -- right/ copies (they differ from host to host).
    IF p_timezone IS NOT NULL AND (p_timezone IN ('localtime', 'Factory', 'posixrules')
                                   OR p_timezone ~ '^(posix|right)/'
                                   OR NOT EXISTS (SELECT 1 FROM timezone_names z WHERE z.name = p_timezone)) THEN
        RETURN format('repeat.timezone %L is not an IANA time zone name (like Europe/Berlin; not localtime, '
                      'Factory or a posix/ or right/ copy)', left(p_timezone, 100));
    END IF;
    RETURN NULL;
END $$;

-- What "the same request" means for an idempotency key on a series: the
-- job fields as a job's key compares them (the due time as sent: NULL when
-- omitted, not the computed first run, so a retry after a fire time has
-- passed still names the first series) plus the repeat spec and its misfire
-- policy. Never equal to
-- a single job's hash: a key used for a job and then for a series conflicts.
CREATE OR REPLACE FUNCTION mh_series_hash(p_name text, p_due_at timestamptz, p_payload jsonb, p_priority int,
                               p_max_attempts int, p_flex_s int, p_strict boolean,
                               p_backoff_base_s real, p_backoff_cap_s real,
                               p_every_s int, p_cron text, p_timezone text, p_misfire text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array('series', mh_request_hash(p_name, p_due_at, p_payload, p_priority, p_max_attempts,
                                                           p_flex_s, p_strict, p_backoff_base_s, p_backoff_cap_s),
                                 p_every_s, p_cron, p_timezone, p_misfire)::text)
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
-- to UTC for cron. p_misfire: what an outage does to the series (run_once,
-- the default, or skip; sql/tables/series.sql); with skip, p_deadline is
-- the fire time after the first run's, when that run is dropped if not
-- claimed by then (NULL: the first run is never dropped).
--
-- p_flex_s omitted (NULL) and not strict: the default window of the name,
-- else for a cron series on round minutes the round-cron default
-- (mh_default_flex). A flexible series is not placed by load: every run is
-- due + mh_series_offset(series, flex_s), a stable offset from the series
-- id (never before now); its runs are counted in the planned load all the same.
--
-- p_traceparent: the caller's W3C trace context, as submit_job_detail's. The
-- first run keeps it (it is what this submission made); the runs the chain
-- makes later do not (sql/functions/chain.sql says why), and the series row
-- has no place for it.
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
    p_first_due_at timestamptz DEFAULT NULL, p_misfire text DEFAULT 'run_once', p_deadline timestamptz DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
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
    v_problem := coalesce(mh_payload_number_problem(v_payload), mh_repeat_problem(p_every_s, p_cron, v_zone));
    IF v_problem IS NULL AND (p_misfire IS NULL OR p_misfire NOT IN ('run_once', 'skip')) THEN
        v_problem := 'repeat.misfire must be run_once or skip';
    END IF;
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
            WHEN p_deadline <= v_first
                THEN format('the first run''s deadline (%s) must be after its due time (%s)', p_deadline, v_first)
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
                           p_backoff_base_s, p_backoff_cap_s, p_every_s, p_cron, v_zone, p_misfire),
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
                        last_due_at, created_at, updated_at, misfire)
    VALUES (v_shard, series_id, v_team, p_name, v_payload, p_priority, p_max_attempts, p_backoff_base_s,
            p_backoff_cap_s, v_flex, p_strict, p_every_s, p_cron, v_zone, p_idempotency_key, v_first, job_id,
            v_first, v_now, v_now, p_misfire);
    INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                      max_attempts, backoff_base_s, backoff_cap_s, idempotency_key, series_id, created_at, updated_at,
                      agreed_at, deadline, traceparent)
    VALUES (v_shard, job_id, v_team, p_name, v_payload, p_priority, v_first, v_flex, p_strict, run_at, 'scheduled',
            p_max_attempts, p_backoff_base_s, p_backoff_cap_s, p_idempotency_key, series_id, v_now, v_now, run_at,
            CASE WHEN p_misfire = 'skip' THEN p_deadline END, mh_traceparent(p_traceparent));
    PERFORM mh_enqueue(v_shard, job_id, run_at, p_strict, p_priority::smallint, v_team, v_now);
    PERFORM mh_add_stats(v_now, ARRAY[mh_submitted(v_shard, v_team, p_name)]);
    PERFORM mh_count_load(v_team, ARRAY[run_at]);
END $$;

-- ---------------------------------------------------------------- control
-- Reading a series and its runs, pausing, resuming, cancelling and changing
-- it, for the team named (required: a series of another team is "no such
-- series", MH404). Each control call locks the series row first (FOR
-- UPDATE), so control calls on one series and the chain (which creates the
-- next run when chain_after is set) take turns. One shard per statement:
-- the series' shard is read from its id. A series' waiting run is its
-- newest (last_job_id); while it has not started (scheduled, or claimed and
-- its start not reported) a pause, cancel or change cancels it as cancel()
-- does; a started run is left alone and finishes. Each also drops a run the
-- pending ceiling held back (held_due_at): its fire time is one of those a
-- pause skips or a new spec replaces.

-- A series' state from its columns.
CREATE OR REPLACE FUNCTION mh_series_state(p_paused_at timestamptz, p_cancelled_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_cancelled_at IS NOT NULL THEN 'cancelled'
                WHEN p_paused_at IS NOT NULL THEN 'paused'
                ELSE 'active' END
$$;

-- The team's series row, locked (FOR UPDATE); MH404 if the team or the series is unknown.
CREATE OR REPLACE FUNCTION mh_lock_series(p_team text, p_series bigint) RETURNS series
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_team   int;
    v_series series;
BEGIN
    IF p_team IS NULL OR p_series IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'a series is named by its team and its id';
    END IF;
    v_team := mh_team_id(p_team);
    SELECT * INTO v_series FROM series s
     WHERE s.shard = mh_shard_of(p_series) AND s.id = p_series AND s.team_id = v_team
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH404', MESSAGE = format('no such series %s', p_series);
    END IF;
    RETURN v_series;
END $$;

-- The series' waiting run cancelled if it has not started: scheduled, at
-- once; claimed, requested of its worker (mh_cancel_job). Its id if this
-- call cancelled it, else NULL (none, started, or requested). The caller holds
-- the series row and waits here for a claim that holds the run: a claim
-- never waits for a series row (mh_series_to_chain skips locked ones), so
-- the two take turns and cannot deadlock.
CREATE OR REPLACE FUNCTION mh_cancel_waiting_run(p_series series) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_outcome outcome;
BEGIN
    v_outcome := mh_cancel_job(p_series.last_job_id, p_series.team_id,
                               ARRAY['scheduled', 'claimed']::job_state[]);
    RETURN CASE WHEN v_outcome.ok AND v_outcome.state = 'cancelled' THEN p_series.last_job_id END;
END $$;

-- One series: its spec, state and chain columns, and its waiting run (the
-- newest: id, state, due and run time). MH404 if it is not the team's.
CREATE OR REPLACE FUNCTION series_detail(p_team text, p_series bigint)
RETURNS TABLE (series_id bigint, team text, name text, payload jsonb, priority int, max_attempts int,
               backoff_base_s real, backoff_cap_s real, flex_s int, strict boolean, every_s int, cron text,
               timezone text, misfire text, state text, first_due_at timestamptz, last_due_at timestamptz,
               chain_after timestamptz, paused_at timestamptz, cancelled_at timestamptz,
               created_at timestamptz, updated_at timestamptz, last_job_id bigint, last_job_state job_state,
               last_job_run_at timestamptz, now timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_team int;
    v_now  timestamptz := mh_now();     -- read here: on Citus the query below runs on a worker, on its clock
BEGIN
    IF p_team IS NULL OR p_series IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'a series is named by its team and its id';
    END IF;
    v_team := mh_team_id(p_team);
    RETURN QUERY
    SELECT s.id, p_team, s.name, s.payload, s.priority::int, s.max_attempts, s.backoff_base_s, s.backoff_cap_s,
           s.flex_s, s.strict, s.every_s, s.cron, s.timezone, s.misfire, mh_series_state(s.paused_at, s.cancelled_at),
           s.first_due_at, s.last_due_at, s.chain_after, s.paused_at, s.cancelled_at, s.created_at, s.updated_at,
           s.last_job_id, j.state, j.run_at, v_now
      FROM series s
      LEFT JOIN jobs j ON j.shard = s.shard AND j.id = s.last_job_id
     WHERE s.shard = mh_shard_of(p_series) AND s.id = p_series AND s.team_id = v_team;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH404', MESSAGE = format('no such series %s', p_series);
    END IF;
END $$;

-- A team's series, newest first: those with id < p_after (NULL: from the
-- newest), at most p_limit (1 to 1001), keyset on series_team.
CREATE OR REPLACE FUNCTION list_series(p_team text, p_after bigint DEFAULT NULL, p_limit int DEFAULT 100)
RETURNS TABLE (series_id bigint, name text, every_s int, cron text, timezone text, misfire text, state text,
               first_due_at timestamptz, last_due_at timestamptz, last_job_id bigint, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE v_team int;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1001 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'limit must be between 1 and 1001';
    END IF;
    v_team := mh_team_id(p_team);
    RETURN QUERY
    SELECT s.id, s.name, s.every_s, s.cron, s.timezone, s.misfire, mh_series_state(s.paused_at, s.cancelled_at),
           s.first_due_at, s.last_due_at, s.last_job_id, s.created_at
      FROM series s
     WHERE s.team_id = v_team AND s.id < coalesce(p_after, 9223372036854775807)
     ORDER BY s.id DESC
     LIMIT p_limit;
END $$;

-- Pause: no further run is created until resumed (chain_after cleared), and
-- the waiting run is cancelled if it has not started. A paused or cancelled
-- series is left as it is. Returns the state after the call, whether this
-- call changed it, and the run it cancelled (NULL: none).
CREATE OR REPLACE FUNCTION pause_series(p_team text, p_series bigint,
                                        OUT series_id bigint, OUT state text, OUT changed boolean,
                                        OUT cancelled_run bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_s   series := mh_lock_series(p_team, p_series);
BEGIN
    series_id := v_s.id;
    changed := v_s.paused_at IS NULL AND v_s.cancelled_at IS NULL;
    IF changed THEN
        UPDATE series s SET paused_at = v_now, chain_after = NULL, held_due_at = NULL, updated_at = v_now
         WHERE s.shard = v_s.shard AND s.id = v_s.id;
        cancelled_run := mh_cancel_waiting_run(v_s);
        v_s.paused_at := v_now;
    END IF;
    state := mh_series_state(v_s.paused_at, v_s.cancelled_at);
END $$;

-- Resume a paused series: its next run is created at its first fire time
-- after now (chain_after = now: the fire times of the pause are not caught
-- up). An active series is left as it is; a cancelled one cannot be resumed (MH409).
CREATE OR REPLACE FUNCTION resume_series(p_team text, p_series bigint,
                                         OUT series_id bigint, OUT state text, OUT changed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_s   series := mh_lock_series(p_team, p_series);
BEGIN
    series_id := v_s.id;
    IF v_s.cancelled_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH409',
            MESSAGE = format('series %s was cancelled at %s: a cancelled series cannot be resumed (submit a new one)',
                             v_s.id, v_s.cancelled_at);
    END IF;
    changed := v_s.paused_at IS NOT NULL;
    IF changed THEN
        UPDATE series s SET paused_at = NULL, chain_after = v_now, held_due_at = NULL, updated_at = v_now
         WHERE s.shard = v_s.shard AND s.id = v_s.id;
    END IF;
    state := 'active';
END $$;

-- Cancel a series: no further run is created, and the waiting run is
-- cancelled if it has not started. Cancelling a cancelled series changes nothing.
CREATE OR REPLACE FUNCTION cancel_series(p_team text, p_series bigint,
                                         OUT series_id bigint, OUT state text, OUT changed boolean,
                                         OUT cancelled_run bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_s   series := mh_lock_series(p_team, p_series);
BEGIN
    series_id := v_s.id;
    state := 'cancelled';
    changed := v_s.cancelled_at IS NULL;
    IF changed THEN
        UPDATE series s SET cancelled_at = v_now, chain_after = NULL, held_due_at = NULL, updated_at = v_now
         WHERE s.shard = v_s.shard AND s.id = v_s.id;
        cancelled_run := mh_cancel_waiting_run(v_s);
    END IF;
END $$;

-- A new repeat spec (and misfire policy; NULL keeps it), from the next run:
-- the waiting run is cancelled if it has not started (a started run
-- finishes), and unless the series is paused its next run is created at the
-- new spec's first fire time after now (chain_after = now); a paused series
-- keeps the new spec for its resume. Validated as submit_series validates
-- the spec (MH400; cron defaults to UTC); a cancelled series cannot be changed (MH409).
CREATE OR REPLACE FUNCTION change_series(p_team text, p_series bigint, p_every_s int DEFAULT NULL,
                                         p_cron text DEFAULT NULL, p_timezone text DEFAULT NULL,
                                         p_misfire text DEFAULT NULL,
                                         OUT series_id bigint, OUT state text, OUT changed boolean,
                                         OUT cancelled_run bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_s       series := mh_lock_series(p_team, p_series);
    v_zone    text := CASE WHEN p_cron IS NOT NULL THEN coalesce(p_timezone, 'UTC') ELSE p_timezone END;
    v_problem text;
BEGIN
    series_id := v_s.id;
    v_problem := mh_repeat_problem(p_every_s, p_cron, v_zone);
    IF v_problem IS NULL AND p_misfire IS NOT NULL AND p_misfire NOT IN ('run_once', 'skip') THEN
        v_problem := format('misfire %L must be run_once or skip', left(p_misfire, 100));
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = v_problem;
    END IF;
    IF v_s.cancelled_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH409',
            MESSAGE = format('series %s was cancelled at %s: a cancelled series cannot be changed',
                             v_s.id, v_s.cancelled_at);
    END IF;
    UPDATE series s
       SET every_s = p_every_s, cron = p_cron, timezone = v_zone, misfire = coalesce(p_misfire, s.misfire),
           chain_after = CASE WHEN s.paused_at IS NULL THEN v_now END, held_due_at = NULL, updated_at = v_now
     WHERE s.shard = v_s.shard AND s.id = v_s.id;
    cancelled_run := mh_cancel_waiting_run(v_s);
    changed := true;
    state := mh_series_state(v_s.paused_at, NULL);
END $$;
