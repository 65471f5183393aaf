-- Dead jobs: recorded when a job becomes dead (by fail_many and
-- expire_claims, in their transactions), put back on the wheel (requeue) or
-- set aside for good (discard), one job or all dead jobs of a team and name;
-- the team's feed of events and its webhook's position in it.
--
-- Locks: a job row first, then its dead_jobs row (the order fail_many and
-- expire_claims take them in), so a single requeue or discard and a bulk
-- one over the same job wait for each other instead of deadlocking.

-- How long events and delivery attempts are kept.
CREATE OR REPLACE FUNCTION mh_events_keep() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '7 days' $$;

-- Jobs that just became dead (parallel arrays, one item per job): their dead
-- letters and one event each, in the caller's transaction. Rows are written
-- in key order.
CREATE OR REPLACE FUNCTION mh_record_dead(p_shards smallint[], p_jobs bigint[], p_teams int[], p_names text[],
                                          p_attempts int[], p_max_attempts int[], p_errors text[],
                                          p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    -- A row per statement (dead jobs are few): on Citus an INSERT ... SELECT
    -- from the input goes through the coordinator and commits in two phases;
    -- one of VALUES runs on the shard's worker.
    FOR r IN SELECT * FROM unnest(p_shards, p_teams, p_names, p_jobs) u(shard, team_id, name, job_id)
              ORDER BY 1, 2, 3, 4 LOOP
        INSERT INTO dead_jobs (shard, team_id, name, job_id) VALUES (r.shard, r.team_id, r.name, r.job_id)
        ON CONFLICT DO NOTHING;
    END LOOP;
    FOR r IN SELECT * FROM unnest(p_shards, p_jobs, p_teams, p_names, p_attempts, p_max_attempts, p_errors)
                           u(shard, job_id, team_id, name, attempts, max_attempts, error)
              ORDER BY 1, 2 LOOP
        INSERT INTO job_events (shard, id, team_id, xid, kind, job_id, name, attempts, max_attempts, error, at)
        VALUES (r.shard, mh_new_id(r.shard), r.team_id, pg_current_xact_id(), 'dead', r.job_id, r.name, r.attempts,
                r.max_attempts, r.error, p_now);
    END LOOP;
END $$;

-- Why an attempt budget cannot be used (NULL: it can, or it was not given).
CREATE OR REPLACE FUNCTION mh_budget_problem(p_max_attempts int) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_max_attempts IS NOT NULL AND p_max_attempts NOT BETWEEN 1 AND 100
                THEN 'max_attempts must be between 1 and 100' END
$$;

-- Why a job in p_state cannot be requeued or discarded (p_verb).
CREATE OR REPLACE FUNCTION mh_not_dead(p_verb text, p_state job_state, p_requeued_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN p_requeued_at IS NOT NULL AND p_state::text IN ('scheduled', 'retrying', 'claimed', 'running')
            THEN format('job was already requeued (at %s) and is %s: only a dead job can be %s',
                        p_requeued_at, p_state, p_verb)
        ELSE format('job is %s: only a dead job can be %s', p_state, p_verb)
    END
$$;

-- A dead job of one shard, locked, back on the wheel: due now, its attempts
-- counted from 0 against p_max_attempts (NULL: its own), a new life as a
-- submission starts one (agreed run time now, no start, no claim, no
-- deadline: a misfired run of a series is not dropped again). The last
-- error stays until the next failure replaces it. Due now: no planned
-- load. Returns the counters of the jobs requeued (each counted as
-- submitted: a job that ends again is counted again), for the caller to add
-- once it has locked every job it settles: counter rows are taken after job
-- rows, never between them (a bulk requeue holding a counter row while it
-- waits for a job would deadlock with a single requeue of that job). The
-- job keeps its traceparent: it is the same job, so its new runs are
-- children of the submit that made it, as its earlier attempts were (the
-- requeue is an operator's act, in a trace of its own if any).
CREATE OR REPLACE FUNCTION mh_requeue_locked(p_shard smallint, p_ids bigint[], p_max_attempts int,
                                             p_now timestamptz) RETURNS stats_delta[]
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_rows  due_row[];
    v_names text[];
    v_stats stats_delta[];
BEGIN
    WITH requeued AS (
        UPDATE jobs j
           SET state = 'scheduled', attempts = 0, max_attempts = coalesce(p_max_attempts, j.max_attempts),
               run_at = p_now, agreed_at = p_now, deadline = NULL, started_at = NULL, lateness = NULL,
               claimed_at = NULL, finished_at = NULL, result = NULL, cancel_requested_at = NULL,
               requeued_at = p_now, updated_at = p_now
          FROM unnest(p_ids) AS i(id)
         WHERE j.shard = p_shard AND j.id = i.id AND j.state = 'dead'
        RETURNING j.id, j.team_id, j.name, j.strict, j.priority
    ), unlisted AS (
        DELETE FROM dead_jobs d USING requeued r
         WHERE d.shard = p_shard AND d.team_id = r.team_id AND d.name = r.name AND d.job_id = r.id
    )
    SELECT array_agg(ROW(p_shard, r.strict, r.priority, p_now, r.id, r.team_id)::due_row ORDER BY r.id),
           array_agg(r.name ORDER BY r.id),
           array_agg(mh_submitted(p_shard, r.team_id, r.name))
      INTO v_rows, v_names, v_stats FROM requeued r;
    PERFORM mh_enqueue_many(v_rows, p_now, v_names);
    RETURN coalesce(v_stats, '{}');
END $$;

-- The same, discarded: a terminal state a requeue does not leave, kept with
-- its last error (already counted as dead).
CREATE OR REPLACE FUNCTION mh_discard_locked(p_shard smallint, p_ids bigint[], p_now timestamptz) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_n bigint;
BEGIN
    WITH discarded AS (
        UPDATE jobs j SET state = 'discarded', updated_at = p_now
          FROM unnest(p_ids) AS i(id)
         WHERE j.shard = p_shard AND j.id = i.id AND j.state = 'dead'
        RETURNING j.id, j.team_id, j.name
    ), unlisted AS (
        DELETE FROM dead_jobs d USING discarded x
         WHERE d.shard = p_shard AND d.team_id = x.team_id AND d.name = x.name AND d.job_id = x.id
    )
    SELECT count(*) INTO v_n FROM discarded;
    RETURN v_n;
END $$;

-- One dead job of a team (p_discard: discard it, else requeue it). Another
-- team's job is "no such job"; a job that is not dead, or was requeued and
-- waits again, is refused with its state; nothing is written then.
CREATE OR REPLACE FUNCTION mh_settle_dead(p_job bigint, p_team text, p_discard boolean, p_max_attempts int)
RETURNS outcome LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now      timestamptz := mh_now();
    v_shard    smallint := mh_shard_of(p_job);
    v_team     int;
    v_state    job_state;
    v_requeued timestamptz;
BEGIN
    IF p_team IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'a requeue or discard needs the team the job belongs to';
    END IF;
    v_team := mh_team_id(p_team);
    IF mh_budget_problem(p_max_attempts) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = mh_budget_problem(p_max_attempts);
    END IF;
    SELECT j.state, j.requeued_at INTO v_state, v_requeued FROM jobs j
     WHERE j.shard = v_shard AND j.id = p_job AND j.team_id = v_team
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN ROW(p_job, false, NULL::job_state, 'no such job')::outcome;
    END IF;
    IF v_state <> 'dead' THEN
        RETURN ROW(p_job, false, v_state,
                   mh_not_dead(CASE WHEN p_discard THEN 'discarded' ELSE 'requeued' END, v_state, v_requeued))::outcome;
    END IF;
    IF p_discard THEN
        PERFORM mh_discard_locked(v_shard, ARRAY[p_job], v_now);
        RETURN ROW(p_job, true, 'discarded'::job_state, NULL::text)::outcome;
    END IF;
    PERFORM mh_add_stats(v_now, mh_requeue_locked(v_shard, ARRAY[p_job], p_max_attempts, v_now));
    RETURN ROW(p_job, true, 'scheduled'::job_state, NULL::text)::outcome;
END $$;

-- Put one dead job of the team back on the wheel, due now, with a new
-- attempt budget (p_max_attempts 1..100; NULL: the job's own). Callable
-- inside the caller's transaction, like submit_job; runs as its owner.
CREATE OR REPLACE FUNCTION requeue_job(p_job bigint, p_team text, p_max_attempts int DEFAULT NULL) RETURNS outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
BEGIN
    RETURN mh_settle_dead(p_job, p_team, false, p_max_attempts);
END $$;

-- Set one dead job of the team aside for good: state discarded.
CREATE OR REPLACE FUNCTION discard_job(p_job bigint, p_team text) RETURNS outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
BEGIN
    RETURN mh_settle_dead(p_job, p_team, true, NULL);
END $$;

-- The arguments of a bulk requeue or discard, refused (MH400) before anything is read.
CREATE OR REPLACE FUNCTION mh_check_settle(p_name text, p_limit int, p_max_attempts int) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF NOT mh_name_ok(p_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400',
            MESSAGE = 'name must be 1 to 200 characters from letters, digits and _ . : / -';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'limit must be between 1 and 100000';
    END IF;
    IF mh_budget_problem(p_max_attempts) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = mh_budget_problem(p_max_attempts);
    END IF;
END $$;

-- How many jobs requeue_dead with these arguments would put back now (its
-- arguments refused as it refuses them): what the API admits before it
-- requeues them. At most p_limit entries of dead_jobs_by_team read.
CREATE OR REPLACE FUNCTION dead_count(p_team text, p_name text, p_limit int, p_max_attempts int) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_team int := mh_team_id(p_team);
BEGIN
    PERFORM mh_check_settle(p_name, p_limit, p_max_attempts);
    RETURN (SELECT count(*) FROM (
                SELECT 1 FROM dead_jobs d WHERE d.team_id = v_team AND d.name = p_name
                 ORDER BY d.team_id, d.name, d.job_id      -- the index's order: read in it, stopped at the limit
                 LIMIT p_limit) x);
END $$;

-- Every dead job of a team and name, at most p_limit (1..100000) per call:
-- requeued (p_discard false, with p_max_attempts as requeue_job) or
-- discarded. Found through dead_jobs, shard by shard (each statement names
-- one shard; a shard without such jobs costs one index probe), oldest ids
-- first within a shard. The jobs are locked in (shard, id) order before
-- their dead letters. Returns how many, and whether more remain (call again).
CREATE OR REPLACE FUNCTION mh_settle_dead_by_name(p_team text, p_name text, p_discard boolean, p_max_attempts int,
                                                  p_limit int, OUT settled bigint, OUT more boolean)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now  timestamptz := mh_now();
    v_team int := mh_team_id(p_team);
    v_ids   bigint[];
    v_stats stats_delta[] := '{}';
    v_got   stats_delta[];
    s       int;
    s2      int;
BEGIN
    PERFORM mh_check_settle(p_name, p_limit, p_max_attempts);
    settled := 0; more := false;
    FOR s IN 0 .. mh_shard_count() - 1 LOOP
        IF settled >= p_limit THEN
            -- Whether any is left, from the shard before (the limit may have cut it) on.
            FOR s2 IN s - 1 .. mh_shard_count() - 1 LOOP
                more := EXISTS (SELECT 1 FROM dead_jobs d WHERE d.shard = s2 AND d.team_id = v_team AND d.name = p_name);
                EXIT WHEN more;
            END LOOP;
            EXIT;
        END IF;
        v_ids := ARRAY(SELECT d.job_id FROM dead_jobs d
                        WHERE d.shard = s AND d.team_id = v_team AND d.name = p_name
                        ORDER BY d.job_id LIMIT p_limit - settled);
        CONTINUE WHEN cardinality(v_ids) = 0;
        IF p_discard THEN
            settled := settled + mh_discard_locked(s::smallint, v_ids, v_now);
        ELSE
            v_got := mh_requeue_locked(s::smallint, v_ids, p_max_attempts, v_now);
            settled := settled + cardinality(v_got);
            v_stats := v_stats || v_got;
        END IF;
    END LOOP;
    PERFORM mh_add_stats(v_now, v_stats);          -- after every job row is locked
    IF settled >= p_limit AND NOT more THEN       -- the limit was reached in the last shard
        more := EXISTS (SELECT 1 FROM dead_jobs d
                         WHERE d.shard = mh_shard_count() - 1 AND d.team_id = v_team AND d.name = p_name);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION requeue_dead(p_team text, p_name text, p_max_attempts int DEFAULT NULL,
                                        p_limit int DEFAULT 10000, OUT requeued bigint, OUT more boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
BEGIN
    SELECT r.settled, r.more INTO requeued, more FROM mh_settle_dead_by_name(p_team, p_name, false, p_max_attempts, p_limit) r;
END $$;

CREATE OR REPLACE FUNCTION discard_dead(p_team text, p_name text, p_limit int DEFAULT 10000,
                                        OUT discarded bigint, OUT more boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
BEGIN
    SELECT r.settled, r.more INTO discarded, more FROM mh_settle_dead_by_name(p_team, p_name, true, NULL, p_limit) r;
END $$;

-- The names a team has dead jobs of (the first p_names in order), each with
-- its count up to p_cap (the admin UI's dead-jobs page): a skip scan of
-- dead_jobs_by_team, one probe per name, then at most p_cap index entries
-- counted per name. A loop, not a recursive CTE: Citus runs a recursive CTE
-- over a distributed table only when it names one shard, and here every
-- probe reads all of them.
CREATE OR REPLACE FUNCTION dead_names(p_team int, p_names int, p_cap int, OUT name text, OUT dead int)
RETURNS SETOF record LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_name text;
BEGIN
    -- (two probes, not one with "v_name IS NULL OR": the cached plan's index
    -- range must start at the name before, not at the team's first entry)
    v_name := (SELECT d.name FROM dead_jobs d WHERE d.team_id = p_team ORDER BY d.name LIMIT 1);
    FOR i IN 1 .. p_names LOOP
        IF i > 1 THEN
            v_name := (SELECT d.name FROM dead_jobs d WHERE d.team_id = p_team AND d.name > v_name
                        ORDER BY d.name LIMIT 1);
        END IF;
        EXIT WHEN v_name IS NULL;
        name := v_name;
        SELECT count(*)::int INTO dead FROM (
            SELECT 1 FROM dead_jobs d WHERE d.team_id = p_team AND d.name = v_name
             ORDER BY d.team_id, d.name, d.job_id      -- the index's order: read in it, stopped at the cap
             LIMIT p_cap) x;
        RETURN NEXT;
    END LOOP;
END $$;

-- A team's events after the position (p_xid, p_id), oldest first, at most
-- p_limit: only those of transactions older than every one still running,
-- so no event can commit behind a position already handed out. PL/pgSQL,
-- with that horizon read first: Citus plans no SQL function over a
-- distributed table called with parameters, and a pushed-down
-- pg_current_snapshot() would read a worker's transactions, not those of
-- the node whose xids the events carry.
CREATE OR REPLACE FUNCTION mh_events_after(p_team int, p_xid xid8, p_id bigint, p_limit int)
RETURNS SETOF job_events LANGUAGE plpgsql STABLE SET search_path = minutehand, pg_temp AS $$
DECLARE v_horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
BEGIN
    RETURN QUERY
    SELECT e.* FROM job_events e
     WHERE e.team_id = p_team AND (e.xid, e.id) > (p_xid, p_id) AND e.xid < v_horizon
     ORDER BY e.xid, e.id
     LIMIT p_limit;
END $$;

-- Events older than mh_events_keep(), one shard, at most p_limit per call.
CREATE OR REPLACE FUNCTION purge_events(p_shard int, p_limit int DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_n bigint;
BEGIN
    DELETE FROM job_events e
     WHERE e.shard = p_shard
       AND e.id = ANY (ARRAY(SELECT o.id FROM job_events o
                              WHERE o.shard = p_shard AND o.at < mh_now() - mh_events_keep()
                              ORDER BY o.at LIMIT p_limit));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

-- Delivery attempts older than mh_events_keep(), at most p_limit per call.
CREATE OR REPLACE FUNCTION purge_deliveries(p_limit int DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_n bigint;
BEGIN
    DELETE FROM webhook_deliveries w
     WHERE (w.team_id, w.id) IN (SELECT o.team_id, o.id FROM webhook_deliveries o
                                  WHERE o.at < mh_now() - mh_events_keep()
                                  ORDER BY o.at LIMIT p_limit);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

-- A delivery attempt's result: recorded, and the webhook's position moved
-- to (p_xid, p_id) on success, or its backoff raised on failure. Compare and
-- set: only if the position is still p_from_xid/p_from_id (another
-- deliverer, or a changed URL, may have moved on meanwhile). p_retry_s: the
-- wait before the next attempt after a failure.
CREATE OR REPLACE FUNCTION record_delivery(p_team int, p_url text, p_from_xid xid8, p_from_id bigint, p_xid xid8,
                                           p_id bigint, p_events int, p_first bigint, p_attempt int,
                                           p_status int, p_error text, p_duration_ms int, p_ok boolean,
                                           p_retry_s real) RETURNS boolean
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_now timestamptz := mh_now();
BEGIN
    INSERT INTO webhook_deliveries (team_id, at, url, events, first_event, last_event, attempt, status_code, error,
                                    duration_ms)
    VALUES (p_team, v_now, p_url, p_events, p_first, p_id, p_attempt, p_status, left(p_error, 2000), p_duration_ms);
    IF p_ok THEN
        UPDATE webhooks w SET delivered_xid = p_xid, delivered_id = p_id, failures = 0, next_attempt_at = NULL,
                              updated_at = v_now
         WHERE w.team_id = p_team AND w.delivered_xid = p_from_xid AND w.delivered_id = p_from_id;
    ELSE
        UPDATE webhooks w SET failures = w.failures + 1, updated_at = v_now,
                              next_attempt_at = v_now + make_interval(secs => p_retry_s)
         WHERE w.team_id = p_team AND w.delivered_xid = p_from_xid AND w.delivered_id = p_from_id;
    END IF;
    RETURN FOUND;
END $$;
