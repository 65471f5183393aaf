-- Revision 0020, frozen: a cancel requested of a claimed job.
ALTER TABLE jobs ADD COLUMN cancel_requested_at timestamptz;
