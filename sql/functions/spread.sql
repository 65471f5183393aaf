-- Spreading flexible jobs (sql/tables/spread.sql). A flexible job (not
-- strict, flex_s > 0) may run anywhere in [due, due + flex_s]; its run time
-- is chosen once, at submission, here: where its window is least loaded by
-- the jobs already planned (load_minutes), strict jobs keeping their exact
-- time and flexible ones filling the gaps around them. The part of a window
-- before now is not available (a past-due job's window starts at now). A
-- repeating flexible series is not placed by load: each series keeps a
-- stable offset inside its window (mh_series_offset), so its runs are
-- evenly spread across series and predictable per series; its runs are
-- counted all the same, and one-off jobs fill around them.

-- The stripe of load_minutes this session adds to: concurrent sessions of
-- one team rarely share a row.
CREATE OR REPLACE FUNCTION mh_load_stripe() RETURNS smallint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT (pg_backend_pid() % 16)::smallint $$;

-- Windows of at most this many minutes are read whole by a batch placing
-- several jobs in them; longer ones through a random sample of
-- mh_place_sample(n) of their minutes.
CREATE OR REPLACE FUNCTION mh_place_cap() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 120 $$;
CREATE OR REPLACE FUNCTION mh_place_sample(p_jobs int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT greatest(60, 2 * p_jobs) $$;
-- Fewer jobs than this in one window of a batch are placed one by one,
-- each on the least loaded of mh_place_choices() random minutes of its
-- window (power of d choices) instead.
CREATE OR REPLACE FUNCTION mh_place_fill_min() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 8 $$;
CREATE OR REPLACE FUNCTION mh_place_choices() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 4 $$;

-- Add a batch of run times of team p_team to the planned load: one upsert,
-- one row per minute of the team's rows in this session's stripe, taken in
-- key order (so concurrent batches of the team wait for each other instead
-- of deadlocking; another team's never wait: its rows are its own). Every
-- procedure that creates a job calls it once per transaction (per batch and
-- team) with the run times it created, in its own transaction: submissions,
-- series runs and the chain. Approximate by design: never decremented. Runs
-- in the current minute (or before: due at once) are not counted:
-- placement reads the current minute only for a window starting in its
-- first 30 s, and most jobs are due now, so their submissions write no
-- counter row.
CREATE OR REPLACE FUNCTION mh_count_load(p_team int, p_run_ats timestamptz[]) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_from timestamptz := mh_minute(mh_now()) + interval '1 minute';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unnest(p_run_ats) t WHERE t >= v_from AND isfinite(t)) THEN
        RETURN;
    END IF;
    INSERT INTO load_minutes AS l (minute, team_id, stripe, jobs)
    SELECT mh_minute(t), p_team, mh_load_stripe(), count(*)
      FROM unnest(p_run_ats) t
     WHERE t >= v_from AND isfinite(t)
     GROUP BY 1
     ORDER BY 1
    ON CONFLICT (minute, team_id, stripe) DO UPDATE SET jobs = l.jobs + excluded.jobs;
END $$;

-- A cron expression fires on round minutes: its minute field (the first of
-- the 5) is a comma-separated list whose every element is 0, 15, 30 or 45
-- (a leading zero allowed), or a step of 15 or 30 from 0 (*/15, */30, 0/15,
-- 0/30). So `0 0 * * *`, `0 * * * *`, `*/15 * * * *`, `0,30 9-17 * * *`
-- are round; `7 0 * * *`, `* * * * *`, `*/5 * * * *` are not.
CREATE OR REPLACE FUNCTION mh_round_cron(p_cron text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce((regexp_split_to_array(btrim(p_cron), '\s+'))[1]
                    ~ '^((0?0|15|30|45|(\*|0?0)/(15|30)),)*(0?0|15|30|45|(\*|0?0)/(15|30))$', false)
$$;

-- The flex window of a job submitted without one (and not strict): the
-- team's rule for its name, else the operator's (team_id 0); else, for a
-- cron series on round minutes (p_cron), the team's round-cron rule, else
-- the operator's; else 0.
CREATE OR REPLACE FUNCTION mh_default_flex(p_team int, p_name text, p_cron text DEFAULT NULL) RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(
        (SELECT d.flex_s FROM flex_defaults d
          WHERE d.team_id IN (p_team, 0) AND d.job_name = p_name AND p_name <> ''
          ORDER BY d.team_id DESC LIMIT 1),
        (SELECT d.flex_s FROM flex_defaults d
          WHERE mh_round_cron(p_cron) AND d.team_id IN (p_team, 0) AND d.job_name = ''
          ORDER BY d.team_id DESC LIMIT 1),
        0)
$$;

-- The flex window a job gets: what was sent; omitted (NULL) and not strict,
-- the default of its name (mh_default_flex); omitted and strict, 0.
CREATE OR REPLACE FUNCTION mh_flex_of(p_team int, p_name text, p_flex_s int, p_strict boolean,
                                      p_cron text DEFAULT NULL) RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_flex_s IS NOT NULL THEN p_flex_s
                WHEN p_strict IS NOT false THEN 0
                ELSE mh_default_flex(p_team, p_name, p_cron) END
$$;

-- A repeating flexible series' offset inside its window: from a hash of
-- the series id, uniform over [0, flex_s] across series, the same for every
-- run of one series. Its runs are due + offset (never before now).
CREATE OR REPLACE FUNCTION mh_series_offset(p_series bigint, p_flex_s int) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN coalesce(p_flex_s, 0) <= 0 THEN interval '0'
                ELSE make_interval(secs => (hashint8(p_series)::float8 + 2147483648) / 4294967295 * p_flex_s) END
$$;

-- The run times of a batch of jobs, in the order given (the arrays as long
-- as each other; a NULL due time is now). Strict and zero-flex jobs: the
-- due time (now if it passed). Flexible jobs: a minute of the available
-- window [greatest(due, now), due + flex_s] where the planned load is
-- lowest, then a uniformly random second of that minute (within the
-- window). The candidate minutes are those at least half inside the
-- window (a window holding no such minute: the minutes it touches).
--
-- The batch's flexible jobs are grouped by candidate minutes. A group of at
-- least mh_place_fill_min() jobs is water-filled: its minutes sorted by
-- load, the lowest filled up to a common level (all minutes of a window up
-- to mh_place_cap() minutes, else a random sample). Smaller groups place
-- each job on the least loaded of a few random minutes of its window. The
-- counts of every candidate minute are read once, by one index scan, and
-- kept up to date in memory as the batch places its jobs (the batch's
-- strict jobs counted first), so a batch never piles onto one minute. The
-- caller adds the created jobs to the counts (mh_count_load).
CREATE OR REPLACE FUNCTION mh_place(p_due_ats timestamptz[], p_flex_s int[], p_stricts boolean[],
                                    p_now timestamptz) RETURNS timestamptz[]
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_n        int := coalesce(cardinality(p_due_ats), 0);
    v_run      timestamptz[];
    v_gfill    boolean[];             -- per group: water-filled (else d choices per job)
    v_gjobs    int[];                 -- the water-filled groups' items, by group (v_gj: where each starts)
    v_gj       int[];
    v_minutes  timestamptz[];         -- every candidate minute, sorted
    v_loads    int[];                 -- their planned load (index as v_minutes)
    v_cidx     int[];                 -- water-fill candidates (index into v_minutes), by group
    v_gc       int[];                 -- (v_gc: where each group's start)
    v_d        int := mh_place_choices();
    v_pjob     int[];                 -- d-choice jobs, and their d minutes each (indexes, d per job)
    v_pidx     int[];
    v_qi       int[];
    v_qn       int[];
    v_jobs     int[];
    v_picked   record;
    g          int;
    a          int;
    i          int;
    k          int;
BEGIN
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    -- Fixed run times first; flexible items stay NULL until placed.
    SELECT array_agg(CASE WHEN u.strict OR u.flex <= 0 OR u.due + make_interval(secs => u.flex) <= p_now
                          THEN greatest(u.due, p_now) END ORDER BY u.ord)
      INTO v_run
      FROM (SELECT coalesce(x.due, p_now) AS due, coalesce(x.flex, 0) AS flex, coalesce(x.strict, false) AS strict,
                   x.ord
              FROM unnest(p_due_ats, p_flex_s, p_stricts) WITH ORDINALITY x(due, flex, strict, ord)) u;
    IF array_position(v_run, NULL) IS NULL THEN
        RETURN v_run;                  -- nothing flexible
    END IF;

    -- The flexible items, grouped by their candidate minutes [f, l]; each
    -- group's candidates: every minute (or a sample) for water-filling, else
    -- d random minutes per job. Numbered by minute (idx into v_minutes).
    WITH items AS (
        SELECT x.ord::int AS ord, greatest(coalesce(x.due, p_now), p_now) AS ws,
               coalesce(x.due, p_now) + make_interval(secs => x.flex) AS we
          FROM unnest(p_due_ats, p_flex_s, v_run) WITH ORDINALITY x(due, flex, run, ord)
         WHERE x.run IS NULL
    ), ranged AS (
        SELECT i.ord, CASE WHEN w.f <= w.l THEN w.f ELSE mh_minute(i.ws) END AS f,
               CASE WHEN w.f <= w.l THEN w.l ELSE mh_minute(i.we - interval '1 microsecond') END AS l
          FROM items i,
               LATERAL (SELECT CASE WHEN mh_minute(i.ws) + interval '30 seconds' >= i.ws THEN mh_minute(i.ws)
                                    ELSE mh_minute(i.ws) + interval '1 minute' END AS f,
                               CASE WHEN mh_minute(i.we) + interval '30 seconds' <= i.we THEN mh_minute(i.we)
                                    ELSE mh_minute(i.we) - interval '1 minute' END AS l) w
    ), groups AS (
        SELECT (row_number() OVER (ORDER BY r.l - r.f, r.f, r.l))::int AS grp, r.f, r.l,
               (extract(epoch FROM r.l - r.f) / 60)::int + 1 AS span, count(*)::int AS n,
               count(*) >= mh_place_fill_min() AS fill, array_agg(r.ord) AS jobs
          FROM ranged r GROUP BY r.f, r.l
    ), cand AS (
        SELECT g.grp, NULL::int AS job, 0 AS pick, m.minute
          FROM groups g,
               LATERAL (SELECT g.f + st.step * interval '1 minute' AS minute
                          FROM generate_series(0, g.span - 1) st(step)
                         ORDER BY CASE WHEN g.span > mh_place_cap() THEN random() ELSE 0 END
                         LIMIT CASE WHEN g.span > mh_place_cap() THEN mh_place_sample(g.n) END) m
         WHERE g.fill
        UNION ALL
        SELECT g.grp, j.ord, c.pick, g.f + floor(random() * g.span)::int * interval '1 minute'
          FROM groups g, unnest(g.jobs) j(ord), generate_series(1, v_d) c(pick)
         WHERE NOT g.fill
    ), ranked AS (
        SELECT c.*, dense_rank() OVER (ORDER BY c.minute)::int AS idx FROM cand c
    )
    -- Each group's slices of the flat arrays: the start of group g at [g],
    -- its end before [g + 1] (a last entry closes the last group).
    SELECT (SELECT array_agg(g.fill ORDER BY g.grp) FROM groups g),
           (SELECT array_agg(j.ord ORDER BY g.grp, j.ord) FROM groups g, unnest(g.jobs) j(ord) WHERE g.fill),
           (SELECT array_agg(x.start ORDER BY x.grp)
                   || (1 + (SELECT coalesce(sum(g.n), 0) FROM groups g WHERE g.fill))::int
              FROM (SELECT g.grp, (1 + coalesce(sum(CASE WHEN g.fill THEN g.n ELSE 0 END)
                                   OVER (ORDER BY g.grp ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))::int
                               AS start
                      FROM groups g) x),
           (SELECT array_agg(DISTINCT r.minute ORDER BY r.minute) FROM ranked r),
           (SELECT array_agg(r.idx ORDER BY r.grp, r.idx) FROM ranked r WHERE r.job IS NULL),
           (SELECT array_agg(x.start ORDER BY x.grp)
                   || (1 + (SELECT count(*) FROM ranked r WHERE r.job IS NULL))::int
              FROM (SELECT g.grp, (1 + coalesce(sum(coalesce(c.n, 0))
                                   OVER (ORDER BY g.grp ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))::int
                               AS start
                      FROM groups g
                      LEFT JOIN (SELECT r.grp, count(*) AS n FROM ranked r WHERE r.job IS NULL GROUP BY r.grp) c
                        ON c.grp = g.grp) x),
           (SELECT array_agg(r.job ORDER BY r.grp, r.job) FROM ranked r WHERE r.job IS NOT NULL AND r.pick = 1),
           (SELECT array_agg(r.idx ORDER BY r.grp, r.job, r.pick) FROM ranked r WHERE r.job IS NOT NULL)
      INTO v_gfill, v_gjobs, v_gj, v_minutes, v_cidx, v_gc, v_pjob, v_pidx;

    -- Their planned load (every team's rows of each minute: one range of
    -- the key per minute), read once, plus this batch's fixed run times.
    SELECT array_agg(coalesce(c.jobs, 0) + coalesce(b.jobs, 0) ORDER BY m.idx)
      INTO v_loads
      FROM unnest(v_minutes) WITH ORDINALITY m(minute, idx)
      LEFT JOIN (SELECT l.minute, sum(l.jobs)::int AS jobs FROM load_minutes l
                  WHERE l.minute = ANY (v_minutes) GROUP BY l.minute) c ON c.minute = m.minute
      LEFT JOIN (SELECT mh_minute(r) AS minute, count(*)::int AS jobs FROM unnest(v_run) r
                  WHERE r IS NOT NULL GROUP BY 1) b ON b.minute = m.minute;

    -- Water-fill the larger groups, narrowest window first.
    FOR g IN 1 .. cardinality(v_gfill) LOOP
        CONTINUE WHEN NOT v_gfill[g];
        v_jobs := v_gjobs[v_gj[g] : v_gj[g + 1] - 1];
        -- Sorted by load (ties at random), the first r minutes can be raised
        -- to the load of minute r with r * load_r - (their loads' sum) jobs;
        -- the level is set by the last r the group's jobs reach.
        WITH c AS (
            SELECT x.idx, v_loads[x.idx] AS load FROM unnest(v_cidx[v_gc[g] : v_gc[g + 1] - 1]) x(idx)
        ), s AS (
            SELECT c.idx, c.load, row_number() OVER w AS r, sum(c.load) OVER w AS cum
              FROM c WINDOW w AS (ORDER BY c.load, random() ROWS UNBOUNDED PRECEDING)
        ), top AS (
            SELECT s.r AS j, cardinality(v_jobs) + s.cum AS total FROM s
             WHERE s.r * s.load - s.cum <= cardinality(v_jobs) ORDER BY s.r DESC LIMIT 1
        )
        SELECT array_agg(s.idx), array_agg(q.n)
          INTO v_qi, v_qn
          FROM s, top,
               LATERAL (SELECT (top.total / top.j + CASE WHEN s.r <= top.total % top.j THEN 1 ELSE 0 END
                                - s.load)::int AS n) q
         WHERE s.r <= top.j AND q.n > 0;
        FOR i IN 1 .. coalesce(cardinality(v_qi), 0) LOOP
            v_loads[v_qi[i]] := v_loads[v_qi[i]] + v_qn[i];
        END LOOP;
        -- The group's jobs, in order, take the minutes' quotas in minute order.
        FOR v_picked IN
            WITH slots AS (
                SELECT q.idx, row_number() OVER (ORDER BY q.idx) AS t
                  FROM unnest(v_qi, v_qn) q(idx, n), generate_series(1, q.n)
            ), jobs AS (
                SELECT j.ord, row_number() OVER (ORDER BY j.ord) AS t FROM unnest(v_jobs) j(ord)
            )
            SELECT jobs.ord, slots.idx FROM jobs JOIN slots USING (t)
        LOOP
            v_run[v_picked.ord] := mh_place_second(v_minutes[v_picked.idx], p_due_ats[v_picked.ord],
                                                   p_flex_s[v_picked.ord], p_now);
        END LOOP;
    END LOOP;

    -- The others one by one: the least loaded of their d minutes (the
    -- first of equals: the picks are random already).
    FOR i IN 1 .. coalesce(cardinality(v_pjob), 0) LOOP
        a := v_pidx[(i - 1) * v_d + 1];
        FOR k IN 2 .. v_d LOOP
            IF v_loads[v_pidx[(i - 1) * v_d + k]] < v_loads[a] THEN
                a := v_pidx[(i - 1) * v_d + k];
            END IF;
        END LOOP;
        v_loads[a] := v_loads[a] + 1;
        v_run[v_pjob[i]] := mh_place_second(v_minutes[a], p_due_ats[v_pjob[i]], p_flex_s[v_pjob[i]], p_now);
    END LOOP;
    RETURN v_run;
END $$;

-- A uniformly random time in the part of p_minute inside the available
-- window of a job (due p_due_at, flex p_flex_s, never before p_now).
CREATE OR REPLACE FUNCTION mh_place_second(p_minute timestamptz, p_due_at timestamptz, p_flex_s int,
                                           p_now timestamptz) RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT w.lo + random() * (w.hi - w.lo)
      FROM (SELECT greatest(p_minute, coalesce(p_due_at, p_now), p_now) AS lo,
                   least(p_minute + interval '1 minute', coalesce(p_due_at, p_now) + make_interval(secs => p_flex_s))
                       AS hi) w
$$;

-- ---------------------------------------------------------------- default windows
-- Set the default window p_flex_s (0 to 86400 s) of job name p_name (NULL:
-- of cron series on round minutes) for team p_team (NULL: the operator's,
-- for every team; a team's own rule wins over it).
CREATE OR REPLACE FUNCTION set_flex_default(p_team text, p_name text, p_flex_s int,
                                            OUT team text, OUT job_name text, OUT flex_s int,
                                            OUT updated_at timestamptz)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_team int := CASE WHEN p_team IS NULL THEN 0 ELSE mh_team_id(p_team) END;
    v_now  timestamptz := mh_now();
BEGIN
    IF p_name IS NOT NULL AND NOT mh_name_ok(p_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = 'job name must be 1 to 200 characters from letters, digits and _ . : / -';
    END IF;
    IF p_flex_s IS NULL OR p_flex_s NOT BETWEEN 0 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'flex window must be between 0 and 86400 seconds';
    END IF;
    INSERT INTO flex_defaults AS d (team_id, job_name, flex_s, updated_at)
    VALUES (v_team, coalesce(p_name, ''), p_flex_s, v_now)
    ON CONFLICT (team_id, job_name) DO UPDATE SET flex_s = excluded.flex_s, updated_at = excluded.updated_at;
    team := p_team; job_name := p_name; flex_s := p_flex_s; updated_at := v_now;
END $$;

-- Remove a default window (arguments as set_flex_default); whether there was one.
CREATE OR REPLACE FUNCTION delete_flex_default(p_team text, p_name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_team int := CASE WHEN p_team IS NULL THEN 0 ELSE mh_team_id(p_team) END;
BEGIN
    DELETE FROM flex_defaults d WHERE d.team_id = v_team AND d.job_name = coalesce(p_name, '');
    RETURN FOUND;
END $$;

-- A team's default windows (NULL: the operator's): the round-cron rule
-- (job_name NULL) first, then by job name after p_after; at most p_limit.
CREATE OR REPLACE FUNCTION flex_defaults_of(p_team text, p_after text, p_limit int)
RETURNS TABLE (team text, job_name text, flex_s int, updated_at timestamptz)
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE v_team int := CASE WHEN p_team IS NULL THEN 0 ELSE mh_team_id(p_team) END;
BEGIN
    RETURN QUERY
        SELECT p_team, nullif(d.job_name, ''), d.flex_s, d.updated_at FROM flex_defaults d
         WHERE d.team_id = v_team AND d.job_name > coalesce(p_after, '') OR
               (p_after IS NULL AND d.team_id = v_team AND d.job_name = '')
         ORDER BY d.job_name LIMIT p_limit;
END $$;
