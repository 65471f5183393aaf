-- Revision 0023, frozen: the W3C traceparent a job was submitted under
-- (NULL: none). Nullable with no default, so adding it rewrites no row (on
-- Citus too, where jobs is distributed: ADD COLUMN is propagated).
ALTER TABLE jobs ADD COLUMN traceparent text;
