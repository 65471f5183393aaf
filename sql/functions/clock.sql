-- The clock. Every procedure asks mh_now(), never now(): a session may pin it
-- with
--   SET minutehand.now = '2030-01-01 00:00:00+00'
-- (and set it again to advance), so tests of time never sleep. Unpinned it is
-- the wall clock, not the transaction start: a caller's long transaction must
-- not place a job into a bucket the hand has already passed. Only members of
-- the role minutehand_clock (tests, drills) and superusers may pin it; any
-- other session that sets minutehand.now gets an error, not a clock.
--
-- Name resolution in this folder: PL/pgSQL functions and every function a
-- client calls pin `search_path = minutehand, pg_temp`; the small SQL
-- helpers have no SET (it would keep the planner from inlining them into
-- hot statements) and resolve names through their caller's path.

CREATE OR REPLACE FUNCTION mh_pinned_clock(p_setting text) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION mh_minute(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT date_bin('1 minute', t, timestamptz '2000-01-01 00:00:00+00') $$;
CREATE OR REPLACE FUNCTION mh_hour(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT date_bin('1 hour', t, timestamptz '2000-01-01 00:00:00+00') $$;

-- A time as it is when every client can read it (years 1 to 9999), else NULL.
CREATE OR REPLACE FUNCTION mh_readable(t timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN t >= '0001-01-01 00:00:00+00' AND t < '10000-01-01 00:00:00+00' THEN t END
$$;

-- A time as text in UTC, as a UTC session prints it ('2030-01-01 12:00:30+00').
-- IMMUTABLE, unlike format() or a cast of a timestamptz (they follow the
-- session's TimeZone): Citus evaluates only IMMUTABLE functions over a row's
-- columns in UPDATE ... SET, where error messages name a job's times.
CREATE OR REPLACE FUNCTION mh_time_text(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT rtrim(rtrim(to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), '0'), '.') || '+00'
$$;
