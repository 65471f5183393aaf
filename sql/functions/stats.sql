-- Counters per team and job name (sql/tables/stats.sql): added to by the
-- procedures of the events they count, in the same transaction, one upsert
-- per batch; folded into hour rows and purged by maintenance.

-- Histogram bucket bounds, in seconds: bucket i (1-based) counts values in
-- (bound[i-1], bound[i]]; the first everything <= 0 (on time), the last
-- everything over an hour.
CREATE OR REPLACE FUNCTION mh_stats_bounds() RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{0,0.01,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,300,900,3600}'::float8[]
$$;
CREATE OR REPLACE FUNCTION mh_stats_buckets() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 16 $$;
-- How long counters are kept.
CREATE OR REPLACE FUNCTION mh_stats_keep() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '35 days' $$;
-- How many job names of a team have counters of their own
-- (team_stats_names); its later names are counted together under
-- mh_stats_other(). So a read of a team's counters costs at most this many
-- rows per minute and stripe, whatever names the team uses.
CREATE OR REPLACE FUNCTION mh_stats_names() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 50 $$;
-- The name those later names are counted under: not a valid job name
-- (mh_name_ok), so no job's own counters are mixed into it.
CREATE OR REPLACE FUNCTION mh_stats_other() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '(other)' $$;

-- The bucket of a value in seconds (NULL: none). width_bucket counts the
-- bounds <= its operand; over the negated bounds it counts those >= p_s,
-- which makes the buckets closed at the top.
CREATE OR REPLACE FUNCTION mh_stats_bucket(p_s float8) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT mh_stats_buckets()
           - width_bucket(-p_s, '{-3600,-900,-300,-60,-30,-10,-5,-2.5,-1,-0.5,-0.25,-0.1,-0.05,-0.01,0}'::float8[])
$$;

-- Two histograms added bucket by bucket. Written out for the 16 buckets
-- (mh_stats_buckets()), one expression PostgreSQL inlines: mh_add_stats adds
-- one per counter row it updates, on every batch of outcomes.
CREATE OR REPLACE FUNCTION mh_hist_add(p_a bigint[], p_b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY[p_a[1] + p_b[1], p_a[2] + p_b[2], p_a[3] + p_b[3], p_a[4] + p_b[4],
                 p_a[5] + p_b[5], p_a[6] + p_b[6], p_a[7] + p_b[7], p_a[8] + p_b[8],
                 p_a[9] + p_b[9], p_a[10] + p_b[10], p_a[11] + p_b[11], p_a[12] + p_b[12],
                 p_a[13] + p_b[13], p_a[14] + p_b[14], p_a[15] + p_b[15], p_a[16] + p_b[16]]
$$;
-- Many histograms (array_agg of them: a 2-D array) added bucket by bucket.
CREATE OR REPLACE FUNCTION mh_hist_sum(p_hists bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(t.n ORDER BY t.b), array_fill(0::bigint, ARRAY[mh_stats_buckets()]))
      FROM (SELECT (k - 1) % mh_stats_buckets() + 1 AS b, sum(x)::bigint AS n
              FROM unnest(p_hists) WITH ORDINALITY u(x, k) GROUP BY 1) t
$$;

-- Add a batch's events to the counters of the minute of p_now: grouped per
-- row, rows taken in key order (team, stripe, name: the minute is one), so
-- concurrent batches wait for each other instead of deadlocking. Then the
-- jobs each team has submitted and not finished (team_pending, what the
-- pending ceiling is checked against), on the same stripes, also in key
-- order: one place counts every way a job is created or finishes.
--
-- A job name is counted as itself once registered in team_stats_names,
-- else under mh_stats_other(). Names new to a team with room left are
-- registered first, in name order, into its next slots up to
-- mh_stats_names(): under a transaction lock per team (advisory, on the
-- coordinator, where every writer of team_stats runs, on Citus too), so
-- concurrent batches never register more. Only a batch bringing a name new
-- to a team that is not full takes it; it waits for another registering
-- names of that team to commit. A batch whose names are all registered
-- (nearly every one) pays a probe per name and nothing else.
CREATE OR REPLACE FUNCTION mh_add_stats(p_now timestamptz, p_rows stats_delta[]) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_team   int;
    v_room   boolean;
    v_used   int;
    v_unkept boolean := false;
BEGIN
    IF coalesce(cardinality(p_rows), 0) = 0 THEN
        RETURN;
    END IF;
    -- Teams with names not registered, and whether each has room. (The names
    -- are probed by key, once each: LATERAL with LIMIT is never turned into a
    -- join that reads every team's names.)
    FOR v_team, v_room IN
        SELECT d.team_id,
               NOT EXISTS (SELECT 1 FROM team_stats_names n WHERE n.team_id = d.team_id AND n.slot = mh_stats_names())
          FROM (SELECT DISTINCT u.team_id, u.name FROM unnest(p_rows) u) d
          LEFT JOIN LATERAL (SELECT true AS kept FROM team_stats_names n
                              WHERE n.team_id = d.team_id AND n.name = d.name LIMIT 1) k ON true
         WHERE k.kept IS NULL
         GROUP BY d.team_id
         ORDER BY d.team_id
    LOOP
        v_unkept := true;
        CONTINUE WHEN NOT v_room;
        PERFORM pg_advisory_xact_lock('team_stats_names'::regclass::oid::int, v_team);
        -- (new statements: they see the names the lock's last holder registered)
        v_used := coalesce((SELECT max(n.slot) FROM team_stats_names n WHERE n.team_id = v_team), 0);
        INSERT INTO team_stats_names (team_id, name, slot)
        SELECT v_team, d.name, v_used + row_number() OVER (ORDER BY d.name)
          FROM (SELECT DISTINCT u.name FROM unnest(p_rows) u WHERE u.team_id = v_team) d
         WHERE NOT EXISTS (SELECT 1 FROM team_stats_names n WHERE n.team_id = v_team AND n.name = d.name)
         ORDER BY d.name
         LIMIT greatest(0, mh_stats_names() - v_used);
    END LOOP;
    IF v_unkept THEN
        -- the events of names still not registered, renamed
        p_rows := ARRAY(
            SELECT ROW(u.stripe, u.team_id, coalesce(k.name, mh_stats_other()), u.submitted, u.started, u.succeeded,
                       u.failed, u.dead, u.cancelled, u.lateness_s, u.runtime_s)::stats_delta
              FROM unnest(p_rows) u
              LEFT JOIN LATERAL (SELECT n.name FROM team_stats_names n
                                  WHERE n.team_id = u.team_id AND n.name = u.name LIMIT 1) k ON true);
    END IF;
    INSERT INTO team_stats AS s (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead, cancelled,
                                 lateness_hist, runtime_hist)
    SELECT mh_minute(p_now), d.stripe, d.team_id, d.name, sum(d.submitted), sum(d.started), sum(d.succeeded),
           sum(d.failed), sum(d.dead), sum(d.cancelled),
           -- each histogram counted by the aggregate itself, bucket by bucket
           -- (the 16 of mh_stats_buckets(); NULL values in none)
           ARRAY[count(*) FILTER (WHERE d.lb = 1), count(*) FILTER (WHERE d.lb = 2),
                 count(*) FILTER (WHERE d.lb = 3), count(*) FILTER (WHERE d.lb = 4),
                 count(*) FILTER (WHERE d.lb = 5), count(*) FILTER (WHERE d.lb = 6),
                 count(*) FILTER (WHERE d.lb = 7), count(*) FILTER (WHERE d.lb = 8),
                 count(*) FILTER (WHERE d.lb = 9), count(*) FILTER (WHERE d.lb = 10),
                 count(*) FILTER (WHERE d.lb = 11), count(*) FILTER (WHERE d.lb = 12),
                 count(*) FILTER (WHERE d.lb = 13), count(*) FILTER (WHERE d.lb = 14),
                 count(*) FILTER (WHERE d.lb = 15), count(*) FILTER (WHERE d.lb = 16)],
           ARRAY[count(*) FILTER (WHERE d.rb = 1), count(*) FILTER (WHERE d.rb = 2),
                 count(*) FILTER (WHERE d.rb = 3), count(*) FILTER (WHERE d.rb = 4),
                 count(*) FILTER (WHERE d.rb = 5), count(*) FILTER (WHERE d.rb = 6),
                 count(*) FILTER (WHERE d.rb = 7), count(*) FILTER (WHERE d.rb = 8),
                 count(*) FILTER (WHERE d.rb = 9), count(*) FILTER (WHERE d.rb = 10),
                 count(*) FILTER (WHERE d.rb = 11), count(*) FILTER (WHERE d.rb = 12),
                 count(*) FILTER (WHERE d.rb = 13), count(*) FILTER (WHERE d.rb = 14),
                 count(*) FILTER (WHERE d.rb = 15), count(*) FILTER (WHERE d.rb = 16)]
      FROM (SELECT u.*, mh_stats_bucket(u.lateness_s) AS lb, mh_stats_bucket(u.runtime_s) AS rb
              FROM unnest(p_rows) u) d
     GROUP BY d.team_id, d.stripe, d.name
     ORDER BY d.team_id, d.stripe, d.name
    ON CONFLICT (team_id, minute, stripe, name) DO UPDATE
       SET submitted = s.submitted + excluded.submitted, started = s.started + excluded.started,
           succeeded = s.succeeded + excluded.succeeded, failed = s.failed + excluded.failed,
           dead = s.dead + excluded.dead, cancelled = s.cancelled + excluded.cancelled,
           lateness_hist = mh_hist_add(s.lateness_hist, excluded.lateness_hist),
           runtime_hist = mh_hist_add(s.runtime_hist, excluded.runtime_hist);
    INSERT INTO team_pending AS p (team_id, stripe, pending)
    SELECT d.team_id, d.stripe, sum(d.submitted - d.succeeded - d.dead - d.cancelled)
      FROM unnest(p_rows) d
     GROUP BY d.team_id, d.stripe
    HAVING sum(d.submitted - d.succeeded - d.dead - d.cancelled) <> 0
     ORDER BY d.team_id, d.stripe
    ON CONFLICT (team_id, stripe) DO UPDATE SET pending = p.pending + excluded.pending;
END $$;

-- Seconds of an interval (NULL stays NULL).
CREATE OR REPLACE FUNCTION mh_seconds(p interval) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT extract(epoch FROM p)::float8 $$;

-- Where a window of p_window_s seconds back from p_now starts: at a minute
-- while it lies within the minute rows (the last one to two hours), else at
-- an hour, the grain of the older rows. Either way the rows from there on
-- cover exactly [start, now].
CREATE OR REPLACE FUNCTION mh_stats_since(p_now timestamptz, p_window_s int) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_now - make_interval(secs => p_window_s) >= mh_hour(p_now) - interval '1 hour'
                THEN mh_minute(p_now - make_interval(secs => p_window_s))
                ELSE mh_hour(p_now - make_interval(secs => p_window_s)) END
$$;

-- Fold minute rows older than the hour before the current one into one row
-- per hour, team and name (stripe -1), at most p_hours hours per call,
-- oldest first. Rows written late for a folded hour are folded by a later
-- call. Concurrent callers fold each row once (DELETE ... RETURNING).
-- Returns how many minute rows were folded.
CREATE OR REPLACE FUNCTION roll_up_stats(p_hours int DEFAULT 6) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_line timestamptz := mh_hour(mh_now()) - interval '1 hour';
    v_from timestamptz;
    v_to   timestamptz;
    v_n    bigint;
BEGIN
    SELECT min(s.minute) INTO v_from FROM team_stats s WHERE s.stripe >= 0;
    IF v_from IS NULL OR v_from >= v_line THEN
        RETURN 0;
    END IF;
    v_to := least(v_line, mh_hour(v_from) + p_hours * interval '1 hour');
    WITH gone AS (
        DELETE FROM team_stats s WHERE s.stripe >= 0 AND s.minute >= v_from AND s.minute < v_to
        RETURNING s.*
    ), hours AS (
        INSERT INTO team_stats AS s (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                     cancelled, lateness_hist, runtime_hist)
        SELECT mh_hour(g.minute), -1, g.team_id, g.name, sum(g.submitted), sum(g.started), sum(g.succeeded),
               sum(g.failed), sum(g.dead), sum(g.cancelled),
               mh_hist_sum(array_agg(g.lateness_hist)), mh_hist_sum(array_agg(g.runtime_hist))
          FROM gone g
         GROUP BY g.team_id, mh_hour(g.minute), g.name
         ORDER BY g.team_id, mh_hour(g.minute), g.name
        ON CONFLICT (team_id, minute, stripe, name) DO UPDATE
           SET submitted = s.submitted + excluded.submitted, started = s.started + excluded.started,
               succeeded = s.succeeded + excluded.succeeded, failed = s.failed + excluded.failed,
               dead = s.dead + excluded.dead, cancelled = s.cancelled + excluded.cancelled,
               lateness_hist = mh_hist_add(s.lateness_hist, excluded.lateness_hist),
               runtime_hist = mh_hist_add(s.runtime_hist, excluded.runtime_hist)
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;

-- Drop counters older than mh_stats_keep(), at most p_limit rows per call,
-- by primary key; what they counted is added to the (team, name)'s row of
-- everything purged (minute -infinity, stripe -2), so team_stats added up
-- whole stays the count since the first event: the Prometheus counters
-- (app/minutehand/api/metrics.py) never go back. No window reaches that row.
CREATE OR REPLACE FUNCTION purge_stats(p_limit int DEFAULT 100000) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_n bigint;
BEGIN
    WITH gone AS (
        DELETE FROM team_stats s
         WHERE (s.team_id, s.minute, s.stripe, s.name) IN (
               SELECT o.team_id, o.minute, o.stripe, o.name FROM team_stats o
                WHERE o.minute < mh_now() - mh_stats_keep() AND o.minute > '-infinity'
                ORDER BY o.minute LIMIT p_limit)
        RETURNING s.*
    ), kept AS (
        INSERT INTO team_stats AS s (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead,
                                     cancelled, lateness_hist, runtime_hist)
        SELECT '-infinity', -2, g.team_id, g.name, sum(g.submitted), sum(g.started), sum(g.succeeded),
               sum(g.failed), sum(g.dead), sum(g.cancelled),
               mh_hist_sum(array_agg(g.lateness_hist)), mh_hist_sum(array_agg(g.runtime_hist))
          FROM gone g
         GROUP BY g.team_id, g.name
         ORDER BY g.team_id, g.name
        ON CONFLICT (team_id, minute, stripe, name) DO UPDATE
           SET submitted = s.submitted + excluded.submitted, started = s.started + excluded.started,
               succeeded = s.succeeded + excluded.succeeded, failed = s.failed + excluded.failed,
               dead = s.dead + excluded.dead, cancelled = s.cancelled + excluded.cancelled,
               lateness_hist = mh_hist_add(s.lateness_hist, excluded.lateness_hist),
               runtime_hist = mh_hist_add(s.runtime_hist, excluded.runtime_hist)
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;
