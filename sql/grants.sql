-- Roles for the SQL interface. Run as the role that owns the schema (the
-- one `minutehand migrate` runs as), after each migrate:
--     psql "$DATABASE_URL" -f sql/grants.sql
-- then grant the roles to login roles: GRANT minutehand_service TO app_scheduler;
--
--   minutehand_service    the scheduler's own processes (serve, dispatcher,
--                         maintain, workers' job.once tables aside): every
--                         table and procedure
--   minutehand_submitter  another service that enqueues and cancels jobs
--                         inside its own transactions: submit_job,
--                         submit_job_detail, submit_jobs, submit_series and
--                         cancel only. These run as their owner, so the role
--                         needs no right on any table; it acts for whichever
--                         team it names, so grant it only to services trusted
--                         with those teams (HTTP callers are held to their
--                         own team by their token instead)
--   minutehand_clock      may pin minutehand.now (tests, drills); made by the
--                         migration. Any other role that sets it gets an error
--
-- The schema's procedures and tables are the owner's; PUBLIC loses its
-- default right to execute the procedures. (Everything else the owner
-- owns in the schema is treated alike.)
DO $$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minutehand_service') THEN
        CREATE ROLE minutehand_service NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'minutehand_submitter') THEN
        CREATE ROLE minutehand_submitter NOLOGIN;
    END IF;
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'public'::regnamespace AND p.proowner = current_user::regrole
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', r.fn);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO minutehand_service', r.fn);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'public'::regnamespace AND c.relowner = current_user::regrole
                AND c.relkind IN ('r', 'p', 'S')
    LOOP
        EXECUTE format('GRANT ALL ON %s TO minutehand_service', r.rel);
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION
    submit_job(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real),
    submit_job_detail(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real),
    submit_jobs(text, text[], timestamptz[], jsonb[], int[], int[], int[], boolean[], text[], real[], real[]),
    submit_series(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real, int, text, text,
                  timestamptz),
    cancel(bigint, text)
TO minutehand_submitter;
