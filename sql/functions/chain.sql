-- The chain of a repeating series: each claim of its newest run marks the
-- series (chain_after, set by mh_take_claimed in the claim's transaction),
-- and the dispatcher that owns the shard reads the marked series
-- (series_to_chain), computes each next fire time in Python outside any
-- transaction (PostgreSQL has no cron parser: app/minutehand/store/repeat.py), and
-- creates the runs (chain_series). The mark is durable, so a dispatcher
-- killed at any point leaves the work to whoever owns the shard next; the
-- mark is compared and cleared with the run's creation, and (shard,
-- series_id, due_at) is unique, so no run is created twice. The runs are
-- admitted as the API admits a submission (chain_series, below): delayed
-- by a team's limits, never dropped.

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
-- horizon is marked a day ahead (chain_series): it is read again then; one
-- whose run the pending ceiling held back a second ahead, with that run's
-- due time (held_due_at), which is then its next run's.
CREATE OR REPLACE FUNCTION series_to_chain(p_shards int[], p_limit int DEFAULT 1000)
RETURNS TABLE (shard smallint, series_id bigint, chain_after timestamptz, first_due_at timestamptz, every_s int,
               cron text, timezone text, misfire text, held_due_at timestamptz, now timestamptz)
LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
-- PL/pgSQL, the clock read first: Citus plans no SQL function over a
-- distributed table called with parameters, and runs the query on workers,
-- where mh_now() would read their clock, not a pinned one.
DECLARE v_now timestamptz := mh_now();
BEGIN
    RETURN QUERY
    SELECT s.shard, s.id, s.chain_after, s.first_due_at, s.every_s, s.cron, s.timezone, s.misfire, s.held_due_at,
           v_now
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
--
-- Admission (sql/functions/admission.sql), the team's limits applied to its
-- runs as to its submissions through the API, with no run dropped:
-- - a run that would take the team past its pending ceiling (teams.max_pending,
--   else p_default_ceiling, the server's; 0: none) is held back: not created,
--   its due time kept (held_due_at) and the series looked at again a second
--   later, until there is room; it is then created at once, due at that
--   fire time (a pause, resume, cancel or new spec drops it with the mark).
--   The room there is goes to the team's runs due first, so a held run is
--   not passed over by the runs due after it;
-- - a run over the team's rate takes its token all the same, ahead: the
--   bucket goes below zero, and the run is placed no earlier than that token
--   would have come (its misfire-skip deadline moved as far). A team's series
--   together run at its rate, and its submissions through the API are
--   refused until the bucket is back above one token. A series has one
--   waiting run, so the bucket owes at most a token per series of the team.
-- Before any series row is locked, the teams of these series with a ceiling
-- are locked (mh_lock_pending, until commit: submissions of the team wait)
-- and the buckets of those with a rate, team by team in id order, so chains
-- and submissions wait for each other instead of deadlocking.
CREATE OR REPLACE FUNCTION chain_series(p_shard int, p_series bigint[], p_after timestamptz[],
                                        p_due timestamptz[], p_deadline timestamptz[],
                                        p_default_ceiling int DEFAULT 0)
RETURNS TABLE (series_id bigint, job_id bigint, run_at timestamptz)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := mh_now();
    v_s        series%ROWTYPE;
    v_item     record;
    v_team     teams%ROWTYPE;
    v_id       bigint;
    v_run      timestamptz;
    v_deadline timestamptz;
    v_at       timestamptz;
    v_k        int;
    v_teams    int[];                  -- the teams of these series
    v_limited  int[] := '{}';          -- those with a limit, and for each:
    v_room     bigint[] := '{}';       -- runs its ceiling has room for (NULL: no ceiling)
    v_tokens   float8[] := '{}';       -- tokens in its bucket (NULL: no rate)
    v_rates    float8[] := '{}';
    v_first    bigint[];               -- the series whose runs fit under their team's ceiling (NULL: all)
    v_stats    stats_delta[] := '{}';
    v_runs     timestamptz[] := '{}';
    v_run_teams int[] := '{}';         -- the team of each of v_runs
    v_run_team int;
BEGIN
    v_teams := ARRAY(SELECT DISTINCT s.team_id FROM series s WHERE s.shard = p_shard AND s.id = ANY (p_series));
    FOR v_team IN
        SELECT t.* FROM teams t
         WHERE t.id = ANY (v_teams)
           AND (t.submit_rate IS NOT NULL OR coalesce(t.max_pending, nullif(p_default_ceiling, 0)) IS NOT NULL)
         ORDER BY t.id
    LOOP
        v_limited := v_limited || v_team.id;
        IF coalesce(v_team.max_pending, nullif(p_default_ceiling, 0)) IS NOT NULL THEN
            PERFORM mh_lock_pending(v_team.id);
            v_room := v_room || (coalesce(v_team.max_pending, p_default_ceiling) - mh_pending(v_team.id));
        ELSE
            v_room := v_room || NULL::bigint;
        END IF;
        v_tokens := v_tokens || CASE WHEN v_team.submit_rate IS NOT NULL THEN mh_bucket(v_team, v_now) END;
        v_rates := v_rates || v_team.submit_rate::float8;
    END LOOP;
    IF EXISTS (SELECT 1 FROM unnest(v_room) r WHERE r IS NOT NULL) THEN
        v_first := ARRAY(
            SELECT x.id FROM (SELECT k.id, s.team_id,
                                     row_number() OVER (PARTITION BY s.team_id ORDER BY k.due, k.id) AS n
                                FROM unnest(p_series, p_due) AS k(id, due)
                                JOIN series s ON s.shard = p_shard AND s.id = k.id
                               WHERE k.due IS NOT NULL) x
             WHERE x.n <= coalesce(v_room[array_position(v_limited, x.team_id)], x.n));
    END IF;
    FOR v_item IN
        SELECT k.id, k.after, k.due, k.deadline
          FROM unnest(p_series, p_after, p_due, p_deadline) AS k(id, after, due, deadline) ORDER BY k.id
    LOOP
        SELECT * INTO v_s FROM series s
         WHERE s.shard = p_shard AND s.id = v_item.id AND s.chain_after = v_item.after
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        IF v_s.paused_at IS NOT NULL OR v_s.cancelled_at IS NOT NULL THEN
            UPDATE series s SET chain_after = NULL, held_due_at = NULL, updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        IF v_item.due IS NULL THEN
            UPDATE series s SET chain_after = v_now + interval '1 day', updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        v_k := array_position(v_limited, v_s.team_id);
        IF v_first IS NOT NULL AND NOT v_item.id = ANY (v_first) THEN
            UPDATE series s SET chain_after = v_now + interval '1 second', held_due_at = v_item.due, updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        v_id := mh_new_id(p_shard);
        v_run := greatest(v_item.due + mh_series_offset(v_s.id, v_s.flex_s), v_now);
        v_deadline := v_item.deadline;
        IF v_tokens[v_k] < 1 THEN                 -- the token it takes comes at v_at
            v_at := v_now + make_interval(secs => (1 - v_tokens[v_k]) / v_rates[v_k]);
            IF v_at > v_run THEN
                v_deadline := v_deadline + (v_at - v_run);
                v_run := v_at;
            END IF;
        END IF;
        -- No traceparent: only the first run, made by the submission, is
        -- part of the submitter's trace. Each later run is caused by the
        -- clock, not by that request; carried on, a daily series would
        -- hang a year of handler spans on one trace whose root ended long
        -- before (most tracing backends keep a trace days, not months), so
        -- each later run's handler span starts a trace of its own.
        INSERT INTO jobs (shard, id, team_id, name, payload, priority, due_at, flex_s, strict, run_at, state,
                          max_attempts, backoff_base_s, backoff_cap_s, series_id, created_at, updated_at,
                          agreed_at, deadline)
        VALUES (p_shard, v_id, v_s.team_id, v_s.name, v_s.payload, v_s.priority, v_item.due, v_s.flex_s, v_s."strict",
                v_run, 'scheduled', v_s.max_attempts, v_s.backoff_base_s, v_s.backoff_cap_s, v_s.id, v_now, v_now,
                v_run, v_deadline)
        ON CONFLICT (shard, series_id, due_at) WHERE series_id IS NOT NULL DO NOTHING;
        IF NOT FOUND THEN
            UPDATE series s SET chain_after = v_item.due, held_due_at = NULL, updated_at = v_now
             WHERE s.shard = p_shard AND s.id = v_s.id;
            CONTINUE;
        END IF;
        IF v_k IS NOT NULL THEN
            v_tokens[v_k] := v_tokens[v_k] - 1;
        END IF;
        PERFORM mh_enqueue(p_shard::smallint, v_id, v_run, v_s."strict", v_s.priority, v_s.team_id, v_now);
        UPDATE series s SET last_job_id = v_id, last_due_at = v_item.due, chain_after = NULL, held_due_at = NULL,
                            updated_at = v_now
         WHERE s.shard = p_shard AND s.id = v_s.id;
        v_stats := v_stats || mh_submitted(p_shard::smallint, v_s.team_id, v_s.name);
        v_runs := v_runs || v_run;
        v_run_teams := v_run_teams || v_s.team_id;
        series_id := v_s.id; job_id := v_id; run_at := v_run;
        RETURN NEXT;
    END LOOP;
    FOR v_k IN 1 .. cardinality(v_limited) LOOP
        IF v_tokens[v_k] IS NOT NULL THEN
            PERFORM mh_keep_tokens(v_limited[v_k], v_tokens[v_k], v_now);
        END IF;
    END LOOP;
    IF cardinality(v_stats) > 0 THEN
        PERFORM mh_add_stats(v_now, v_stats);
        -- each team's runs on its own rows, the teams in order (as a
        -- submission of one team takes its rows: no two orders meet)
        FOR v_run_team IN SELECT DISTINCT x.team FROM unnest(v_run_teams) x(team) ORDER BY 1 LOOP
            PERFORM mh_count_load(v_run_team, ARRAY(SELECT x.run FROM unnest(v_run_teams, v_runs) x(team, run)
                                                     WHERE x.team = v_run_team));
        END LOOP;
    END IF;
END $$;
