-- Revision 0021, frozen: the job names a team's counters keep apart, at
-- most 50 per team; team_stats counts a team's other names together under
-- '(other)'. Plain SQL: a revision runs without the functions.
CREATE TABLE team_stats_names (
    team_id  int      NOT NULL,
    name     text     NOT NULL,
    slot     smallint NOT NULL,
    PRIMARY KEY (team_id, name),
    UNIQUE (team_id, slot)
);
-- Each team keeps the 50 names of most volume among those it has counters
-- of, most first.
INSERT INTO team_stats_names (team_id, name, slot)
SELECT r.team_id, r.name, r.slot
  FROM (SELECT s.team_id, s.name,
               row_number() OVER (PARTITION BY s.team_id
                                  ORDER BY sum(s.submitted + s.started + s.succeeded + s.failed + s.dead
                                               + s.cancelled) DESC, s.name) AS slot
          FROM team_stats s
         GROUP BY s.team_id, s.name) r
 WHERE r.slot <= 50;
-- The rows of its other names, added up per minute (or hour, or the purged
-- row) and stripe into one '(other)' row each, histograms bucket by bucket.
WITH gone AS (
    DELETE FROM team_stats s
     WHERE NOT EXISTS (SELECT 1 FROM team_stats_names n WHERE n.team_id = s.team_id AND n.name = s.name)
    RETURNING s.*
), counts AS (
    SELECT g.team_id, g.minute, g.stripe, sum(g.submitted)::bigint AS submitted, sum(g.started)::bigint AS started,
           sum(g.succeeded)::bigint AS succeeded, sum(g.failed)::bigint AS failed, sum(g.dead)::bigint AS dead,
           sum(g.cancelled)::bigint AS cancelled
      FROM gone g
     GROUP BY g.team_id, g.minute, g.stripe
), buckets AS (
    SELECT g.team_id, g.minute, g.stripe, b.i, sum(b.l)::bigint AS l, sum(b.r)::bigint AS r
      FROM gone g, unnest(g.lateness_hist, g.runtime_hist) WITH ORDINALITY b(l, r, i)
     GROUP BY g.team_id, g.minute, g.stripe, b.i
), hists AS (
    SELECT b.team_id, b.minute, b.stripe, array_agg(b.l ORDER BY b.i) AS lateness_hist,
           array_agg(b.r ORDER BY b.i) AS runtime_hist
      FROM buckets b
     GROUP BY b.team_id, b.minute, b.stripe
)
INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead, cancelled,
                        lateness_hist, runtime_hist)
SELECT c.minute, c.stripe, c.team_id, '(other)', c.submitted, c.started, c.succeeded, c.failed, c.dead, c.cancelled,
       h.lateness_hist, h.runtime_hist
  FROM counts c
  JOIN hists h ON h.team_id = c.team_id AND h.minute = c.minute AND h.stripe = c.stripe;
