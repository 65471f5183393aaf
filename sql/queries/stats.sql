-- The counters of team_stats read (app/minutehand/store/stats.py): a team's
-- and the fleet's statistics, and what /metrics reads of the jobs.

-- name: team_stats
-- A team's counters since mh_stats_since(now, window_s), by job name: the
-- `names` names of most volume one by one, the rest added up in one row
-- (name NULL, other_names: how many), with the names counted together
-- past the team's first mh_stats_names() (one more). Reads team_stats rows
-- of the team only, through its primary key: at most mh_stats_names() + 1
-- per minute or hour and stripe; running now from team_running, one probe
-- per shard. No row: no such team; one row with name NULL and other_names
-- 0: nothing counted in the window.
WITH team AS (SELECT t.id, t.name, t.quota FROM teams t WHERE t.name = %(team)s::text),
since AS (SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t),
by_name AS (
    SELECT s.name, sum(s.submitted) AS submitted, sum(s.started) AS started, sum(s.succeeded) AS succeeded,
           sum(s.failed) AS failed, sum(s.dead) AS dead, sum(s.cancelled) AS cancelled,
           mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist,
           mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
      FROM team_stats s
     WHERE s.team_id = (SELECT id FROM team) AND s.minute >= (SELECT t FROM since)
     GROUP BY s.name),
ranked AS (
    SELECT b.*, b.name <> mh_stats_other()
                AND row_number() OVER (ORDER BY b.name = mh_stats_other(),
                                                b.submitted + b.started + b.succeeded + b.failed + b.dead + b.cancelled
                                                DESC, b.name) <= %(names)s::int AS shown
      FROM by_name b),
folded AS (
    SELECT CASE WHEN r.shown THEN r.name END AS name, count(*) FILTER (WHERE NOT r.shown) AS other_names,
           sum(r.submitted)::bigint AS submitted, sum(r.started)::bigint AS started,
           sum(r.succeeded)::bigint AS succeeded, sum(r.failed)::bigint AS failed, sum(r.dead)::bigint AS dead,
           sum(r.cancelled)::bigint AS cancelled,
           mh_hist_sum(array_agg(r.lateness_hist)) AS lateness_hist, mh_hist_sum(array_agg(r.runtime_hist)) AS runtime_hist
      FROM ranked r
     GROUP BY 1),
-- Its own uncorrelated CTE: Citus refuses a subquery correlated with `team`.
running AS (
    SELECT coalesce(sum(r.running), 0)::bigint AS n
      FROM generate_series(0, mh_shard_count() - 1) g(shard)
      JOIN team_running r ON r.shard = g.shard AND r.team_id = (SELECT id FROM team))
SELECT team.name AS team, team.quota, (SELECT t FROM since) AS window_start, (SELECT n FROM running) AS running,
       f.name, coalesce(f.other_names, 0) AS other_names, f.submitted, f.started, f.succeeded, f.failed, f.dead,
       f.cancelled, f.lateness_hist, f.runtime_hist
  FROM team
  LEFT JOIN folded f ON true

-- name: fleet_stats
-- Every team's counters since mh_stats_since(now, window_s) (admin): the
-- rows of the window through team_stats_minute, added up per team; running
-- now per team from team_running (read whole: a row per shard and team).
WITH since AS (SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t),
counted AS (
    SELECT s.team_id, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
           sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
           sum(s.cancelled)::bigint AS cancelled,
           mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist,
           mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
      FROM team_stats s
     WHERE s.minute >= (SELECT t FROM since)
     GROUP BY s.team_id),
running AS (SELECT r.team_id, sum(r.running)::bigint AS running FROM team_running r GROUP BY r.team_id)
SELECT t.name AS team, t.quota, (SELECT t FROM since) AS window_start, coalesce(r.running, 0) AS running,
       c.submitted, c.started, c.succeeded, c.failed, c.dead, c.cancelled, c.lateness_hist, c.runtime_hist
  FROM teams t
  LEFT JOIN counted c ON c.team_id = t.id
  LEFT JOIN running r ON r.team_id = t.id
 ORDER BY t.name

-- name: fleet_window
-- Where a stats window of window_s seconds starts (a fleet with no team).
SELECT mh_stats_since(mh_now(), %(window_s)s::int) AS t

-- name: no_parallel_workers
-- In this transaction only: plans without parallel workers.
SET LOCAL max_parallel_workers_per_gather = 0

-- name: metrics_clock
-- Where the Prometheus exposition (app/minutehand/api/metrics.py) divides team_stats
-- into rows it has added up once and rows it reads on every refresh (line):
-- the hour two hours back. On an hour boundary, so a minute row and the hour
-- row roll_up_stats folds it into lie on the same side; purge_stats folds
-- what it drops into a row below it (stripe -2). Rows below it change only
-- by a transaction that began before it (mh_now() is a transaction's start).
-- And the minute slots of now and the next minute, for metrics_due_depth (as
-- parameters there, so the plan names their partitions only: mh_now() is
-- volatile, which no partition pruning takes).
SELECT mh_hour(n) - interval '2 hours' AS line, mh_minute_slot(n) AS current_slot,
       mh_minute_slot(n + interval '1 minute') AS next_slot
  FROM (SELECT mh_now() AS n) now

-- name: metrics_job_totals
-- The counters of team_stats added up per team and job name over the rows
-- with since <= minute < until (NULL: unbounded): every row, whatever its
-- grain (minute, hour, purged). With since set, a range of team_stats_minute.
SELECT t.name AS team, s.name, sum(s.submitted)::bigint AS submitted, sum(s.started)::bigint AS started,
       sum(s.succeeded)::bigint AS succeeded, sum(s.failed)::bigint AS failed, sum(s.dead)::bigint AS dead,
       sum(s.cancelled)::bigint AS cancelled,
       mh_hist_sum(array_agg(s.lateness_hist)) AS lateness_hist, mh_hist_sum(array_agg(s.runtime_hist)) AS runtime_hist
  FROM team_stats s JOIN teams t ON t.id = s.team_id
 WHERE s.minute >= coalesce(%(since)s::timestamptz, '-infinity')
   AND s.minute < coalesce(%(until)s::timestamptz, 'infinity')
 GROUP BY t.name, s.name

-- name: metrics_running
-- Every team's quota and its jobs claimed and not finished now (team_running:
-- a row per shard and team).
SELECT t.name AS team, t.quota, coalesce(r.running, 0)::bigint AS running
  FROM teams t
  LEFT JOIN (SELECT team_id, sum(running) AS running FROM team_running GROUP BY team_id) r ON r.team_id = t.id

-- name: metrics_due_depth
-- How many jobs wait on the wheel: counted exactly in the current and the
-- next minute bucket (their slots from metrics_clock; two partitions, the
-- ones the dispatchers read), and
-- estimated for each whole level from the planner's statistics
-- (pg_class.reltuples as of autovacuum's last ANALYZE of each partition;
-- never analysed or just truncated: 0), so no read of the pending set.
SELECT (SELECT count(*) FROM due_minutes d WHERE d.slot = %(current_slot)s::smallint) AS current_minute,
       (SELECT count(*) FROM due_minutes d WHERE d.slot = %(next_slot)s::smallint) AS next_minute,
       e.minutes, e.hours, e.far
  FROM mh_wheel_estimates() e
