-- Revision 0008, frozen: repeating series keep running. The chain's state
-- and controls on the series, and a deadline on jobs (misfire skip).
ALTER TABLE jobs ADD COLUMN deadline timestamptz;
ALTER TABLE series ADD COLUMN misfire text NOT NULL DEFAULT 'run_once' CHECK (misfire IN ('run_once', 'skip'));
ALTER TABLE series ADD COLUMN paused_at timestamptz;
ALTER TABLE series ADD COLUMN chain_after timestamptz;
CREATE INDEX series_chain ON series (shard, chain_after) WHERE chain_after IS NOT NULL;
CREATE INDEX series_team ON series (team_id, id DESC);
-- A series stored before the chain existed continues from its first run
-- once that run has been claimed.
UPDATE series s SET chain_after = s.last_due_at
  FROM jobs j
 WHERE j.shard = s.shard AND j.id = s.last_job_id AND j.state NOT IN ('scheduled', 'retrying')
   AND s.cancelled_at IS NULL;
