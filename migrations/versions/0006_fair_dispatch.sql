-- Revision 0006, frozen: the wheel's rows name their team; running jobs
-- counted per shard and team.
ALTER TABLE due_minutes ADD COLUMN team_id int;
ALTER TABLE due_hours ADD COLUMN team_id int;
ALTER TABLE due_far ADD COLUMN team_id int;
UPDATE due_minutes d SET team_id = j.team_id FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id;
UPDATE due_hours d SET team_id = j.team_id FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id;
UPDATE due_far d SET team_id = j.team_id FROM jobs j WHERE j.shard = d.shard AND j.id = d.job_id;
-- A row without its job claims nothing.
DELETE FROM due_minutes WHERE team_id IS NULL;
DELETE FROM due_hours WHERE team_id IS NULL;
DELETE FROM due_far WHERE team_id IS NULL;
ALTER TABLE due_minutes ALTER COLUMN team_id SET NOT NULL;
ALTER TABLE due_hours ALTER COLUMN team_id SET NOT NULL;
ALTER TABLE due_far ALTER COLUMN team_id SET NOT NULL;
ALTER TYPE due_row ADD ATTRIBUTE team_id int;

DROP INDEX due_minutes_claim;
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, team_id, run_at);

CREATE TABLE team_running (
    shard    smallint NOT NULL,
    team_id  int      NOT NULL,
    running  int      NOT NULL,
    PRIMARY KEY (shard, team_id)
);
INSERT INTO team_running (shard, team_id, running)
SELECT j.shard, j.team_id, count(*) FROM jobs j WHERE j.state IN ('claimed', 'running') GROUP BY 1, 2;
