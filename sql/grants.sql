-- Roles for the SQL interface. `minutehand migrate` runs this after the
-- functions, as the role that owns the schema `minutehand`; grant the roles
-- to login roles: GRANT minutehand_service TO app_scheduler;
--
--   minutehand_service    the scheduler's own processes (serve, dispatcher,
--                         maintain, workers' job.once tables aside): every
--                         table and procedure
--   minutehand_submitter  another service that enqueues and cancels jobs
--                         inside its own transactions: submit_job,
--                         submit_job_detail, submit_jobs, submit_series,
--                         cancel, and for dead jobs requeue_job, discard_job,
--                         requeue_dead and discard_dead only. These run as
--                         their owner, so the role
--                         needs no right on any table; it acts for whichever
--                         team it names, so grant it only to services trusted
--                         with those teams (HTTP callers are held to their
--                         own team by their token instead)
--   minutehand_clock      may pin minutehand.now (tests, drills). Any other
--                         role that sets it gets an error
--
-- Both roles get USAGE on the schema. Its procedures and tables are the
-- owner's; PUBLIC loses its default right to execute the procedures.
-- (Everything else the owner owns in the schema is treated alike.) A role
-- that may not create roles still migrates: it is told, and the grants to
-- roles that exist are made.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT unnest(ARRAY['minutehand_service', 'minutehand_submitter', 'minutehand_clock']) AS name
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r.name);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE NOTICE 'cannot create role %: a superuser must create it', r.name;
            END;
        END IF;
    END LOOP;
    IF to_regrole('minutehand_service') IS NULL OR to_regrole('minutehand_submitter') IS NULL THEN
        RETURN;
    END IF;
    EXECUTE 'GRANT USAGE ON SCHEMA minutehand TO minutehand_service, minutehand_submitter';
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'minutehand'::regnamespace AND p.proowner = current_user::regrole
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', r.fn);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO minutehand_service', r.fn);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'minutehand'::regnamespace AND c.relowner = current_user::regrole
                AND c.relkind IN ('r', 'p', 'S')
    LOOP
        EXECUTE format('GRANT ALL ON %s TO minutehand_service', r.rel);
    END LOOP;
    GRANT EXECUTE ON FUNCTION
        minutehand.submit_job(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real, text),
        minutehand.submit_job_detail(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real, text),
        minutehand.submit_jobs(text, text[], timestamptz[], jsonb[], int[], int[], int[], boolean[], text[], real[],
                               real[], text[], smallint[]),
        minutehand.submit_series(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real, int, text,
                                 text, timestamptz, text, timestamptz, text),
        minutehand.cancel(bigint, text),
        minutehand.requeue_job(bigint, text, int),
        minutehand.discard_job(bigint, text),
        minutehand.requeue_dead(text, text, int, int),
        minutehand.discard_dead(text, text, int)
    TO minutehand_submitter;
END $$;
