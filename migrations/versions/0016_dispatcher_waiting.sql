-- Revision 0016, frozen: each dispatcher says which teams wait on its shards
-- with quota headroom (the others then lend no capacity past a quota).
ALTER TABLE dispatchers ADD COLUMN waiting int[] NOT NULL DEFAULT '{}';
