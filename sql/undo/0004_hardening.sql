-- Undo revision 0004 (sql/009_hardening.sql): drop what it made. The bodies
-- it replaced are put back afterwards from the files that defined them
-- (migrations/versions/0004_hardening.py). The role minutehand_clock is
-- shared by every database of the server and stays.
DROP FUNCTION claim_for_worker(int, int, text, bigint, real, text, text[], text[]);
DROP FUNCTION mh_claim(int, int, text, real, text, text[], text[]);
DROP FUNCTION mh_readable(timestamptz);
DROP FUNCTION mh_lease_problem(int, text, bigint, timestamptz);
DROP FUNCTION mh_claim_filtered_sql(int);
DROP FUNCTION mh_pinned_clock(text);
DROP FUNCTION mh_due_problem(text, timestamptz, timestamptz);
DROP FUNCTION mh_earliest_due();
DROP TABLE timezone_names;
ALTER FUNCTION submit_job(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real)
    SECURITY INVOKER RESET search_path;
ALTER FUNCTION submit_job_detail(text, text, timestamptz, jsonb, int, int, int, boolean, text, real, real)
    SECURITY INVOKER RESET search_path;
