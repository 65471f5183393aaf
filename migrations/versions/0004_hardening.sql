-- Revision 0004, frozen: the role that may pin the clock, and the time zone
-- names, in schema public.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minutehand_clock') THEN
        CREATE ROLE minutehand_clock NOLOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot create role minutehand_clock: only superusers may pin minutehand.now';
END $$;

CREATE TABLE timezone_names (name text PRIMARY KEY);
INSERT INTO timezone_names SELECT DISTINCT name FROM pg_timezone_names;
