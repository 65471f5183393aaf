-- Revision 0014, frozen: what the admin UI's dead-jobs and job pages read
-- by: a team's dead jobs by name (without probing every shard), and a job's
-- own events. Neither table is written on submit.
CREATE INDEX dead_jobs_by_team ON dead_jobs (team_id, name, job_id);
CREATE INDEX job_events_job ON job_events (shard, job_id);
