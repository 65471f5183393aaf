-- Revision 0018, frozen: the due time of a series' next run held back by
-- its team's pending ceiling (created once there is room).
ALTER TABLE series ADD COLUMN held_due_at timestamptz;
