-- The chain of a repeating series: each claim of its newest run marks the
-- series (chain_after, set by mh_take_claimed in the claim's transaction),
-- and the dispatcher that owns the shard reads the marked series
-- (series_to_chain), computes each next fire time in Python outside any
-- transaction (PostgreSQL has no cron parser: app/minutehand/store/repeat.py), and
-- creates the runs (chain_series). The mark is durable, so a dispatcher
-- killed at any point leaves the work to whoever owns the shard next; the
-- mark is compared and cleared with the run's creation, and (shard,
-- series_id, due_at) is unique, so no run is created twice.

-- Of these series (p_series) those whose newest run is one of p_runs and
-- that want a next run (not paused, not cancelled, not marked already),
-- locked for the caller's mark. A row locked by a control call is skipped:
-- pause and cancel want no next run, a new spec marks the series itself.
CREATE OR REPLACE FUNCTION mh_series_to_chain(p_shard int, p_series bigint[], p_runs bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT s.id FROM series s
     WHERE s.shard = p_shard AND s.id = ANY (p_series) AND s.last_job_id = ANY (p_runs)
       AND s.chain_after IS NULL AND s.paused_at IS NULL AND s.cancelled_at IS NULL
       FOR UPDATE SKIP LOCKED
$$;

-- The jobs of a claim that are past their deadline and never started (runs
-- of a series with misfire skip whose next fire time came before they were
-- claimed): cancelled, with the reason, and their series marked for the
-- next run. Called by the claim only when it claimed fewer jobs than it
-- took due rows for (the rest were cancelled jobs, or these).
CREATE OR REPLACE FUNCTION mh_drop_missed(p_shard int, p_ids bigint[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_stats stats_delta[];
BEGIN
    WITH dropped AS (
        UPDATE jobs j
           SET state = 'cancelled', finished_at = p_now, updated_at = p_now,
               last_error = 'skipped: its series fired again (' || mh_time_text(j.deadline)
                            || ') before it was claimed (misfire skip)'
         WHERE j.shard = p_shard AND j.id = ANY (p_ids) AND j.state IN ('scheduled', 'retrying')
           AND j.deadline <= p_now AND j.attempts = 0
        RETURNING j.id, j.team_id, j.name, j.series_id
    ), chained AS (
        UPDATE series s SET chain_after = s.last_due_at, updated_at = p_now
         WHERE s.shard = p_shard
           AND s.id IN (SELECT mh_series_to_chain(p_shard, ARRAY(SELECT d.series_id FROM dropped d),
                                                  ARRAY(SELECT d.id FROM dropped d)))
    )
    SELECT array_agg(mh_cancelled(p_shard::smallint, d.team_id, d.name)) INTO v_stats FROM dropped d;
    IF v_stats IS NOT NULL THEN
        PERFORM mh_add_stats(p_now, v_stats);
    END IF;
END $$;

-- The marked series of these shards, oldest mark first, with what the chain
-- needs to compute their next fire times, and the database's clock (pinned
-- in tests) to compute them against. A series with no fire time within the
-- horizon is marked a day ahead (chain_series): it is read again then.
CREATE OR REPLACE FUNCTION series_to_chain(p_shards int[], p_limit int DEFAULT 1000)
RETURNS TABLE (shard smallint, series_id bigint, chain_after timestamptz, first_due_at timestamptz, every_s int,
               cron text, timezone text, misfire text, now timestamptz)
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
-- PL/pgSQL, the clock read first: Citus plans no SQL function over a
-- distributed table called with parameters, and runs the query on workers,
-- where mh_now() would read their clock, not a pinned one.
DECLARE v_now timestamptz := mh_now();
BEGIN
    RETURN QUERY
    SELECT s.shard, s.id, s.chain_after, s.first_due_at, s.every_s, s.cron, s.timezone, s.misfire, v_now
      FROM series s
     WHERE s.shard = ANY (p_shards) AND s.chain_after IS NOT NULL AND s.chain_after <= v_now
     ORDER BY s.chain_after
     LIMIT p_limit;
END $$;

-- Create the next run of each of these series of one shard, as the chain
-- computed it (a flexible series' run at its stable offset in the window,
-- mh_series_offset, counted in the planned load): due p_due[i] (NULL: no
-- fire time within the horizon, look again in a day), dropped at
-- p_deadline[i] if not claimed by then (misfire skip; NULL: never). Only where the series is still marked p_after[i]
-- (compare and set: a control call or another dispatcher that got there
-- first wins, and this one writes nothing for it). A paused or cancelled
-- series gets no run, and its mark is cleared. A run already there at that
-- due time (one a pause or a new spec cancelled) keeps its place: the mark
-- moves to it, and the next look takes the fire time after it. Returns the
-- runs created.
CREATE OR REPLACE FUNCTION chain_series(p_shard int, p_series bigint[], p_after timestamptz[],
                                        p_due timestamptz[], p_deadline timestamptz[])
RETURNS TABLE (series_id bigint, job_id bigint, run_at timestamptz)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := mh_now();
    v_s     series%ROWTYPE;
    v_item  record;
    v_id    bigint;
    v_run   timestamptz;
    v_stats stats_delta[] := '{}';
    v_runs  timestamptz[] := '{}';
    v_teams int[] := '{}';            -- the team of each of v_runs
    v_team  int;
BEGIN
    FOR v_item IN
        SELECT k.id, k.after, k.due, k.deadline
          FROM unnest(p_series, p_after, p_due, p_deadline) AS k(id, after, due, deadline) ORDER BY k.id
    LOOP
        SELECT * INTO v_s FROM series s
         WHERE s.shard = p_shard AND s.id = v_item.id AND s.chain_after = v_item.after
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        IF v_s.paused_at IS NOT NULL OR v_s.cancelled_at IS NOT NULL THEN
            UPDATE series s SET chain_after = NULL, updated_at = v_now WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        IF v_item.due IS NULL THEN
            UPDATE series s SET chain_after = v_now + interval '1 day', updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        v_id := mh_new_id(p_shard);
        v_run := greatest(v_item.due + mh_series_offset(v_s.id, v_s.flex_s), v_now);
        INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                          max_attempts, backoff_base_s, backoff_cap_s, series_id, created_at, updated_at,
                          agreed_at, deadline)
        VALUES (p_shard, v_id, v_s.team_id, v_s.name, v_s.payload, v_s.priority, v_item.due, v_s.flex_s, v_s."strict",
                v_run, 'scheduled', v_s.max_attempts, v_s.backoff_base_s, v_s.backoff_cap_s, v_s.id, v_now, v_now,
                v_run, v_item.deadline)
        ON CONFLICT (shard, series_id, due_at) WHERE series_id IS NOT NULL DO NOTHING;
        IF NOT FOUND THEN
            UPDATE series s SET chain_after = v_item.due, updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        PERFORM mh_enqueue(p_shard::smallint, v_id, v_run, v_s."strict", v_s.priority, v_s.team_id, v_now);
        UPDATE series s SET last_job_id = v_id, last_due_at = v_item.due, chain_after = NULL, updated_at = v_now
         WHERE s.shard = p_shard AND s.id = v_s.id;
        v_stats := v_stats || mh_submitted(p_shard::smallint, v_s.team_id, v_s.name);
        v_runs := v_runs || v_run;
        v_teams := v_teams || v_s.team_id;
        series_id := v_s.id; job_id := v_id; run_at := v_run;
        RETURN NEXT;
    END LOOP;
    IF cardinality(v_stats) > 0 THEN
        PERFORM mh_add_stats(v_now, v_stats);
        -- each team's runs on its own rows, the teams in order (as a
        -- submission of one team takes its rows: no two orders meet)
        FOR v_team IN SELECT DISTINCT x.team FROM unnest(v_teams) x(team) ORDER BY 1 LOOP
            PERFORM mh_count_load(v_team, ARRAY(SELECT x.run FROM unnest(v_teams, v_runs) x(team, run)
                                                 WHERE x.team = v_team));
        END LOOP;
    END IF;
END $$;
