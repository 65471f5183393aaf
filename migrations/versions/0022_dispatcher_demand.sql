-- Revision 0022, frozen: each dispatcher also says which teams have due
-- rows on its shards (NULL: not read yet) and how many jobs of each team run
-- from them, so that a team's quota is divided between the dispatchers where
-- its due work is.
ALTER TABLE dispatchers ADD COLUMN due int[];
ALTER TABLE dispatchers ADD COLUMN running_teams int[] NOT NULL DEFAULT '{}';
ALTER TABLE dispatchers ADD COLUMN running int[] NOT NULL DEFAULT '{}';
