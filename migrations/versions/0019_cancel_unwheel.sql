-- Revision 0019, frozen: a cancel takes its job's row off the wheel, found
-- by run time and job id on every level (mh_unwheel). Rows of jobs that no
-- longer wait, left by cancels before this revision, are removed.
DELETE FROM due_minutes d
 WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id
                                          AND j.state IN ('scheduled', 'retrying'));
DELETE FROM due_hours d
 WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id
                                          AND j.state IN ('scheduled', 'retrying'));
DELETE FROM due_far d
 WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id
                                          AND j.state IN ('scheduled', 'retrying'));

DROP INDEX due_minutes_claim;
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, team_id, run_at, job_id);
CREATE INDEX due_hours_job ON due_hours (job_id);
DROP INDEX due_far_run_at;
CREATE INDEX due_far_run_at ON due_far (run_at, job_id);
