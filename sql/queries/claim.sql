-- The dispatcher's side (app/minutehand/store/claim.py): shard leases, what
-- is due, the claims (sql/functions/claim.sql), and the dispatchers'
-- membership and duty leases (sql/functions/dispatch.sql).

-- name: take_shard_leases
-- Take or renew some shards' leases; (shard, epoch) of those now held.
SELECT shard, epoch FROM take_shard_leases(%(shards)s::int[], %(owner)s::text, %(ttl_s)s::real)

-- name: release_shard_leases
-- Give some shards up at once (their epochs in the same order).
SELECT release_shard_leases(%(shards)s::int[], %(owner)s::text, %(epochs)s::bigint[]) AS released

-- name: commit_without_flush
-- This transaction's commit does not wait for its WAL to reach the disk.
SELECT set_config('synchronous_commit', 'off', true)

-- name: due_edges
-- What some shards have due now (since: per shard, only what came due by
-- the clock since then; NULL: all), per shard, bucket, class and team (cap:
-- counted up to that many rows a cell; NULL: all), and
-- for each shard one row (team_id NULL) saying when it next has more; each
-- cell names the job names of its rows (NULL: unknown). A run
-- time before year 1 (a row written around the procedures) reads as year 1:
-- due, so the claim reaches that job and fails it alone, and the reader can
-- load it. routed: on Citus, for the shards of one Citus shard, read on
-- its worker node alone.
SELECT shard, bucket, strict, priority, team_id, due,
       CASE WHEN oldest < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz ELSE oldest END
           AS oldest,
       CASE WHEN next_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'::timestamptz ELSE next_at END
           AS next_at,
       names
  FROM due_edges(%(shards)s::int[], %(since)s::timestamptz[], %(cap)s::int, %(routed)s::boolean)

-- name: team_terms
-- Every team's quota and weight, for sharing capacity between them.
SELECT id, name, quota, weight FROM teams

-- name: teams_running
-- Jobs claimed and not finished, per team, on some shards.
SELECT team_id, sum(running)::int AS running FROM team_running WHERE shard = ANY (%(shards)s::int[])
 GROUP BY team_id HAVING sum(running) > 0

-- name: claim_due
-- Claim up to limit due jobs of one shard for one worker, of the given names
-- and teams (NULL: any); a stale lease is one row with `refused` set. The
-- payload and a replayed result come as JSON text: the dispatcher hands them
-- on as they are.
SELECT * FROM claim_due(%(shard)s::int, %(limit)s::int, %(owner)s::text, %(epoch)s::bigint,
                        %(lease_s)s::real, %(worker)s::text, %(names)s::text[], %(teams)s::text[])

-- name: claim_planned
-- The dispatcher's planned claim from one bucket of one shard: per cell
-- (strict, priority, team id) up to its limit, of these job names (NULL:
-- any); rows as claim_due's, with the cell each came from.
SELECT * FROM claim_planned(%(shard)s::int, %(owner)s::text, %(epoch)s::bigint, %(lease_s)s::real,
                            %(worker)s::text, %(bucket)s::timestamptz, %(stricts)s::boolean[],
                            %(priorities)s::smallint[], %(teams)s::int[], %(limits)s::int[], %(names)s::text[])

-- name: claim_planned_shards
-- claim_planned for many shards of one bucket in one statement (plain
-- PostgreSQL): each cell names its shard; each shard its epoch. Rows as
-- claim_planned's, with their shard.
SELECT * FROM claim_planned_shards(%(owner)s::text, %(lease_s)s::real, %(worker)s::text, %(bucket)s::timestamptz,
                                   %(shards)s::int[], %(epochs)s::bigint[], %(cell_shards)s::int[],
                                   %(stricts)s::boolean[], %(priorities)s::smallint[], %(teams)s::int[],
                                   %(limits)s::int[], %(names)s::text[])

-- name: dispatcher_members
-- Renew this dispatcher's membership with what the quotas need from it:
-- the teams waiting on its shards, the teams with due rows there (NULL: not
-- read yet) and the jobs each team runs from there; the live members by
-- name, each with what it said.
SELECT name, waiting, due, running_teams, running
  FROM dispatcher_members(%(name)s::text, %(ttl_s)s::real, %(waiting)s::int[], %(due)s::int[],
                          %(running_teams)s::int[], %(running)s::int[])

-- name: leave_dispatchers
-- A dispatcher stopping cleanly leaves at once.
SELECT leave_dispatchers(%(name)s::text)

-- name: take_duty_lease
-- Take or renew the lease on a global duty; whether this owner holds it.
SELECT take_duty_lease(%(duty)s::text, %(owner)s::text, %(ttl_s)s::real) AS held

-- name: shard_owners
-- Every shard's lease holder (NULL when free or expired by `now`, the
-- database's clock as the store read it: on Citus this read runs on the
-- workers) and epoch.
SELECT shard, CASE WHEN lease_expires_at > %(now)s::timestamptz THEN owner END AS owner, epoch FROM shards ORDER BY shard
