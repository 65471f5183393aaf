-- What happens to a claimed job: it starts, heartbeats, succeeds, fails or
-- is given back; and cancellation before it starts. Every call names the job
-- and the lease token of its current claim; a wrong or stale token changes
-- nothing and the answer says why, per item. Batch forms take parallel
-- arrays and run in one transaction, so the commit rate does not cap
-- throughput. Results are matched to items by position, so a job named
-- twice in one batch succeeds at most once. Batches lock the job rows in
-- (shard, id) order and the idempotency keys a completion writes in
-- (shard, team, key) order, the orders submit_jobs takes them in, so two
-- batches over the same rows (a worker retrying an outcomes request through
-- another dispatcher) wait for each other instead of deadlocking. Answers
-- still come in input order.
--
-- Every way out of claimed/running subtracts the job from team_running, and
-- every counted event is added to team_stats (sql/functions/stats.sql), in
-- the same transaction, one statement per batch each: after the job rows,
-- team_running rows in (shard, team) order, then team_stats rows in key
-- order. Outcome rows of team_stats use stripes 16 + shard % 16.
--
-- Every statement on distributed tables names the batch's shards
-- (mh_batch_shards): on Citus the store sends one call per shard
-- (Store.outcome_calls), each statement of which is then a router statement
-- on that shard's worker and the call a one-phase commit there; the
-- coordinator-local counters (team_stats) are written by statements of
-- their own, never inside one Citus pushes down.

-- Why an outcome for a job was refused, from whether it exists and its state.
CREATE OR REPLACE FUNCTION mh_refusal(p_found boolean, p_state job_state) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN NOT p_found THEN 'no such job'
        WHEN p_state NOT IN ('claimed', 'running') THEN format('job is %s, not claimed', p_state)
        ELSE 'lease token does not match the current claim (it expired and the job was claimed again)'
    END
$$;
-- Jobs that left claimed/running, subtracted from team_running: one row per
-- (shard, team), taken in that order, never below zero. An upsert, so that
-- the rows are taken in the order of its SELECT; only existing rows are
-- named (a claim made them), so it always updates and never inserts. It
-- selects from team_running itself (x.shard, not the input's), so that on
-- Citus the INSERT ... SELECT runs on the shard's worker: one selecting
-- from the input alone goes through the coordinator, which then commits
-- in two phases even when one worker is involved.
CREATE OR REPLACE FUNCTION mh_not_running(p_shards smallint[], p_teams int[]) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_shards smallint[] := CASE WHEN mh_on_citus() THEN p_shards END;    -- (as mh_batch_shards)
BEGIN
    IF coalesce(cardinality(p_shards), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO team_running AS r (shard, team_id, running)
    SELECT x.shard, x.team_id, -count(*) FROM unnest(p_shards, p_teams) u(shard, team_id)
      JOIN team_running x ON x.shard = u.shard AND x.team_id = u.team_id     -- (a join: Citus plans no correlated EXISTS here)
     WHERE (v_shards IS NULL OR x.shard = ANY (v_shards))                    -- (Citus: read only these shards)
     GROUP BY x.shard, x.team_id
     ORDER BY x.shard, x.team_id
    ON CONFLICT (shard, team_id) DO UPDATE SET running = greatest(r.running + excluded.running, 0);
END $$;
-- Attempts that ended without success (job_attempts): p_jobs as they were
-- while the attempt ran, with the state and error its end gave them; the
-- worker NULL where the end does not know it (an expired claim's error names
-- it). In the caller's transaction, in key order. A row per statement: on
-- Citus an INSERT ... SELECT from the input goes through the coordinator
-- and commits in two phases; one of VALUES runs on the shard's worker (and
-- failures are few: a batch's successes record nothing).
CREATE OR REPLACE FUNCTION mh_record_attempts(p_jobs jobs[], p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    j jobs;
BEGIN
    FOR j IN SELECT * FROM unnest(p_jobs) u ORDER BY u.shard, u.id LOOP
        INSERT INTO job_attempts (shard, job_id, attempt, ended_at, worker, claimed_at, started_at, outcome, error)
        VALUES (j.shard, j.id, j.attempts, p_now, j.claimed_by, j.claimed_at, j.started_at, j.state, j.last_error)
        ON CONFLICT DO NOTHING;
    END LOOP;
END $$;
-- Exponential backoff with jitter: attempt n waits a random time in
-- [d/2, d] with d = min(cap, base * 2^(n-1)): it grows, spreads, and never
-- exceeds the cap.
CREATE OR REPLACE FUNCTION mh_backoff(p_attempt int, p_base_s real, p_cap_s real) RETURNS interval
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT make_interval(secs => d / 2 + random() * d / 2)
      FROM (SELECT least(p_cap_s::float8, p_base_s * power(2::float8, greatest(p_attempt, 1) - 1)) AS d) x
$$;

-- The answers of an outcome batch, in input order: the items that went
-- through (p_ords, with the state each left its job in) ok; every other
-- item refused with why, from its job as read after the batch by (shard,
-- id) — only those jobs, in one statement over their shards (refusals are
-- few; on Citus the statement is pruned to those shards, where a join of
-- the batch with jobs would read every shard). A refused item whose job the
-- batch changed through another item (one job named twice) was refused by
-- its token. An item whose job is running under its own token is answered
-- ok when p_running_ok (a repeated start), refused with p_started when that
-- is given (a release: the job has started), else refused as any other.
CREATE OR REPLACE FUNCTION mh_answers(p_ids bigint[], p_tokens uuid[], p_ords bigint[], p_states job_state[],
                                      p_running_ok boolean DEFAULT false, p_started text DEFAULT NULL)
RETURNS SETOF outcome
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_refused bigint[];
    v_shards  smallint[];
    v_ids     bigint[];
    v_states  job_state[];
    v_tokens  uuid[];
BEGIN
    v_refused := ARRAY(SELECT u.id FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
                         LEFT JOIN unnest(p_ords) AS d(ord) ON d.ord = u.ord WHERE d.ord IS NULL AND u.id IS NOT NULL);
    IF cardinality(v_refused) > 0 THEN
        v_shards := ARRAY(SELECT DISTINCT mh_shard_of(x) FROM unnest(v_refused) x);
        SELECT array_agg(j.id), array_agg(j.state), array_agg(j.lease_token) INTO v_ids, v_states, v_tokens
          FROM jobs j WHERE j.shard = ANY (v_shards) AND j.id = ANY (v_refused);
    END IF;
    RETURN QUERY
    SELECT u.id, d.ord IS NOT NULL OR r.again,
           coalesce(d.state, j.state),
           CASE WHEN d.ord IS NOT NULL OR r.again THEN NULL
                WHEN b.id IS NOT NULL THEN mh_refusal(true, 'claimed')
                WHEN r.own AND p_started IS NOT NULL THEN p_started
                ELSE mh_refusal(j.id IS NOT NULL, j.state) END
      FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
      LEFT JOIN unnest(p_ords, p_states) AS d(ord, state) ON d.ord = u.ord
      LEFT JOIN unnest(v_ids, v_states, v_tokens) AS j(id, state, lease_token) ON d.ord IS NULL AND j.id = u.id
      LEFT JOIN (SELECT DISTINCT p_ids[x.ord::int] AS id FROM unnest(p_ords) AS x(ord)) b ON d.ord IS NULL AND b.id = u.id
      CROSS JOIN LATERAL (SELECT coalesce(j.state = 'running' AND j.lease_token = u.token, false) AS own) o
      CROSS JOIN LATERAL (SELECT p_running_ok AND o.own AS again, o.own) r
     ORDER BY u.ord;
END $$;

CREATE OR REPLACE FUNCTION start_many(p_ids bigint[], p_tokens uuid[]) RETURNS SETOF outcome
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_shards smallint[] := mh_batch_shards(p_ids);
    v_ords   bigint[];
    v_stats  stats_delta[];
BEGIN
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), started AS (
        -- Only a claimed job starts (once per attempt); a repeated start of
        -- the running job changes nothing and is answered ok below. o is the
        -- row as this statement found it: the job's first start is the one
        -- that finds started_at NULL (while a job stays claimed under one
        -- token nothing else sets started_at, so o holds even after waiting
        -- for a concurrent writer).
        UPDATE jobs j
           SET state = 'running', started_at = coalesce(j.started_at, v_now),
               lateness = coalesce(j.lateness, v_now - j.agreed_at), updated_at = v_now
          FROM input i JOIN jobs o ON o.shard = mh_shard_of(i.id) AND o.id = i.id
                                  AND (v_shards IS NULL OR o.shard = ANY (v_shards))
         WHERE j.shard = o.shard AND j.id = o.id AND j.lease_token = i.token AND j.state = 'claimed'
           AND (v_shards IS NULL OR j.shard = ANY (v_shards))
        RETURNING j.id, i.ord, j.shard, j.team_id, j.name, j.lateness, o.started_at IS NULL AS first
    )
    SELECT array_agg(s.ord),
           array_agg(ROW(16 + s.shard % 16, s.team_id, s.name, 0, 1, 0, 0, 0, 0, mh_seconds(s.lateness),
                         NULL)::stats_delta) FILTER (WHERE s.first)
      INTO v_ords, v_stats FROM started s;
    PERFORM mh_add_stats(v_now, v_stats);
    RETURN QUERY SELECT * FROM mh_answers(p_ids, p_tokens, v_ords,
                                          array_fill('running'::job_state, ARRAY[coalesce(cardinality(v_ords), 0)]),
                                          true);
END $$;

-- A heartbeat extends a claim to now + p_extend_s; it never shortens one
-- (its reminder in claim_checks stays valid).
CREATE OR REPLACE FUNCTION heartbeat_many(p_ids bigint[], p_tokens uuid[], p_extend_s real) RETURNS SETOF outcome
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_expires timestamptz;
    v_shards  smallint[] := mh_batch_shards(p_ids);
    v_ords    bigint[];
    v_states  job_state[];
BEGIN
    IF p_extend_s IS NULL OR NOT (p_extend_s BETWEEN 1 AND 86400) THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'extension must be between 1 and 86400 seconds';
    END IF;
    v_expires := v_now + make_interval(secs => p_extend_s);
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), renewed AS (
        UPDATE jobs j SET claim_expires_at = greatest(j.claim_expires_at, v_expires), updated_at = v_now
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state IN ('claimed', 'running') AND (v_shards IS NULL OR j.shard = ANY (v_shards))
        RETURNING j.id, j.state, i.ord
    )
    SELECT array_agg(r.ord), array_agg(r.state) INTO v_ords, v_states FROM renewed r;
    RETURN QUERY SELECT * FROM mh_answers(p_ids, p_tokens, v_ords, v_states);
END $$;

-- Success closes the job and stores its result under its idempotency key,
-- unless one is recorded there already (record_results, below: the worker
-- library records first, then completes with what the key holds).
CREATE OR REPLACE FUNCTION complete_many(p_ids bigint[], p_tokens uuid[], p_results jsonb[] DEFAULT NULL)
RETURNS SETOF outcome LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_shards smallint[] := mh_batch_shards(p_ids);
    v_ords   bigint[];
    v_done   smallint[];
    v_teams  int[];
    v_stats  stats_delta[];
BEGIN
    WITH input AS (
        SELECT u.id, u.token, u.result, u.ord
          FROM unnest(p_ids, p_tokens, p_results) WITH ORDINALITY AS u(id, token, result, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), done AS (
        -- A job completed without a reported start started at its claim. o
        -- is the row as found: that is the job's first start if it had none
        -- and no start of this claim came in between (then started_at would
        -- not be the claim time).
        UPDATE jobs j
           SET state = 'succeeded', result = i.result, finished_at = v_now, updated_at = v_now,
               started_at = coalesce(j.started_at, j.claimed_at),
               lateness = coalesce(j.lateness, j.claimed_at - j.agreed_at),
               claim_expires_at = NULL, lease_token = NULL
          FROM input i JOIN jobs o ON o.shard = mh_shard_of(i.id) AND o.id = i.id
                                  AND (v_shards IS NULL OR o.shard = ANY (v_shards))
         WHERE j.shard = o.shard AND j.id = o.id AND j.lease_token = i.token
           AND (v_shards IS NULL OR j.shard = ANY (v_shards))
           AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.shard, j.team_id, j.name, j.idempotency_key, i.result, i.ord, j.lateness,
                  o.started_at IS NULL AND j.started_at = j.claimed_at AS first, j.finished_at - j.started_at AS run
    ), stored AS (
        UPDATE idempotency_keys k SET result = d.result, completed_at = v_now
          FROM (SELECT * FROM done d WHERE d.idempotency_key IS NOT NULL
                 ORDER BY d.shard, d.team_id, d.idempotency_key) d
         WHERE k.shard = d.shard AND k.team_id = d.team_id AND k.key = d.idempotency_key AND k.job_id = d.id
           AND k.completed_at IS NULL AND (v_shards IS NULL OR k.shard = ANY (v_shards))
        RETURNING 1
    )
    SELECT array_agg(d.ord), array_agg(d.shard), array_agg(d.team_id),
           array_agg(ROW(16 + d.shard % 16, d.team_id, d.name, 0, d.first::int, 1, 0, 0, 0,
                         CASE WHEN d.first THEN mh_seconds(d.lateness) END, mh_seconds(d.run))::stats_delta)
      INTO v_ords, v_done, v_teams, v_stats FROM done d;
    -- After the keys: team_running, then team_stats.
    PERFORM mh_not_running(v_done, v_teams);
    PERFORM mh_add_stats(v_now, v_stats);
    RETURN QUERY SELECT * FROM mh_answers(p_ids, p_tokens, v_ords,
                                          array_fill('succeeded'::job_state, ARRAY[coalesce(cardinality(v_ords), 0)]));
END $$;

-- A keyed job's result recorded under its idempotency key as soon as its
-- handler returns, before the completion is sent: the key row belongs to the
-- job, not to a claim, so this holds whatever became of the claim (expired,
-- the job claimed again, the completion refused or never sent). A job that
-- is delivered again carries the result (`replay`, sql/functions/claim.sql)
-- and is completed with it, its handler not run again. The first result
-- recorded stays; each item is answered, in input order, with the result the
-- key holds (as JSON text; 'null' for none), or refused with why: no such
-- job, no key, or its key no longer names it (it expired and was reused or
-- purged). Only key rows are written, in (shard, team, key) order.
CREATE OR REPLACE FUNCTION record_results(p_ids bigint[], p_results jsonb[])
RETURNS TABLE (job_id bigint, ok boolean, result text, reason text)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := mh_now();
    -- (a value, not a subquery in the statement: Citus prunes to the shards it names)
    v_in     smallint[] := ARRAY(SELECT DISTINCT mh_shard_of(x) FROM unnest(p_ids) x);
    v_jobs   jobs[];
    v_keys   idempotency_keys[];
BEGIN
    SELECT array_agg(j) INTO v_jobs FROM jobs j WHERE j.shard = ANY (v_in) AND j.id = ANY (p_ids);
    IF EXISTS (SELECT 1 FROM unnest(v_jobs) j WHERE j.idempotency_key IS NOT NULL) THEN
        WITH input AS (
            SELECT j.shard, j.team_id, j.idempotency_key AS key, j.id, u.result
              FROM unnest(p_ids, p_results) WITH ORDINALITY AS u(id, result, ord)
              JOIN unnest(v_jobs) j ON j.id = u.id
             WHERE j.idempotency_key IS NOT NULL
             ORDER BY j.shard, j.team_id, j.idempotency_key, u.ord
        )
        UPDATE idempotency_keys k SET result = i.result, completed_at = v_now
          FROM input i
         WHERE k.shard = i.shard AND k.team_id = i.team_id AND k.key = i.key AND k.job_id = i.id
           AND k.completed_at IS NULL AND k.shard = ANY (v_in);
        SELECT array_agg(k) INTO v_keys FROM idempotency_keys k
         WHERE k.shard = ANY (v_in)
           AND k.key = ANY (ARRAY(SELECT j.idempotency_key FROM unnest(v_jobs) j WHERE j.idempotency_key IS NOT NULL));
    END IF;
    RETURN QUERY
    SELECT u.id, k.key IS NOT NULL, CASE WHEN k.key IS NOT NULL THEN coalesce(k.result::text, 'null') END,
           CASE WHEN j.id IS NULL THEN 'no such job'
                WHEN j.idempotency_key IS NULL THEN 'the job has no idempotency key: nothing to record its result under'
                WHEN k.key IS NULL THEN 'its idempotency key no longer names it (expired)' END
      FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
      LEFT JOIN unnest(v_jobs) j ON j.id = u.id
      LEFT JOIN unnest(v_keys) k ON k.shard = j.shard AND k.team_id = j.team_id AND k.key = j.idempotency_key
                                AND k.job_id = j.id AND k.completed_at IS NOT NULL
     ORDER BY u.ord;
END $$;

-- Failure: retry after backoff while attempts remain and the error is
-- retryable; otherwise the job is dead (kept, with its last error; listed
-- in dead_jobs and reported to its team, sql/functions/dead.sql).
-- Per item, because each retry time is computed from that job's own
-- attempts, base and cap (in a variable, not in UPDATE SET: Citus rule).
CREATE OR REPLACE FUNCTION fail_many(p_ids bigint[], p_tokens uuid[], p_errors text[], p_retryable boolean[] DEFAULT NULL)
RETURNS SETOF outcome LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now     timestamptz := mh_now();
    v_job     jobs%ROWTYPE;
    v_run_at  timestamptz;
    v_error   text;
    v_answers outcome[] := array_fill(NULL::outcome, ARRAY[coalesce(cardinality(p_ids), 0)]);
    v_shards  smallint[] := '{}';
    v_teams   int[] := '{}';
    v_stats   stats_delta[] := '{}';
    v_dead    jobs[] := '{}';
    v_ended   jobs[] := '{}';
    v_ids     bigint[];
    v_states  job_state[];
    v_tokens  uuid[];
    v_held    bigint[];
    -- (a value, not a subquery in the statement: Citus prunes to the shards it names)
    v_in      smallint[] := ARRAY(SELECT DISTINCT mh_shard_of(x) FROM unnest(p_ids) x);
    i         int;
BEGIN
    -- Every item's job read first, in one statement pruned to the batch's
    -- shards. An item whose job no item of the batch holds (none, not
    -- claimed or running, or under another token) is refused from that
    -- read, without a locking read of its own: on Citus each such read is a
    -- round trip to a worker, and a batch of 10,000 stale items took one
    -- each (over 30 s). No item of the batch can change such a job, so the
    -- state read is the one the item would have found at its turn.
    SELECT array_agg(j.id), array_agg(j.state), array_agg(j.lease_token) INTO v_ids, v_states, v_tokens
      FROM jobs j WHERE j.shard = ANY (v_in) AND j.id = ANY (p_ids);
    v_held := ARRAY(SELECT DISTINCT j.id FROM unnest(v_ids, v_states, v_tokens) AS j(id, state, token)
                      JOIN unnest(p_ids, p_tokens) AS u(id, token) ON u.id = j.id AND u.token = j.token
                     WHERE j.state IN ('claimed', 'running'));
    FOR i IN SELECT u.ord FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord) JOIN unnest(v_held) AS h(id) ON h.id = u.id
              ORDER BY mh_shard_of(u.id), u.id, u.ord
    LOOP
        SELECT * INTO v_job FROM jobs j
         WHERE j.shard = mh_shard_of(p_ids[i]) AND j.id = p_ids[i] FOR UPDATE;
        IF NOT FOUND OR v_job.state NOT IN ('claimed', 'running') OR v_job.lease_token IS DISTINCT FROM p_tokens[i] THEN
            v_answers[i] := ROW(p_ids[i], false, v_job.state, mh_refusal(FOUND, v_job.state))::outcome;
            CONTINUE;
        END IF;
        v_error := left(coalesce(p_errors[i], 'failed'), 10000);
        v_shards := v_shards || v_job.shard;
        v_teams := v_teams || v_job.team_id;
        IF coalesce(p_retryable[i], true) AND v_job.attempts < v_job.max_attempts THEN
            v_run_at := v_now + mh_backoff(v_job.attempts, v_job.backoff_base_s, v_job.backoff_cap_s);
            UPDATE jobs j
               SET state = 'retrying', run_at = v_run_at, last_error = v_error, updated_at = v_now,
                   claimed_by = NULL, claim_expires_at = NULL, lease_token = NULL
             WHERE j.shard = v_job.shard AND j.id = v_job.id;
            PERFORM mh_enqueue(v_job.shard, v_job.id, v_run_at, (v_job).strict, v_job.priority, v_job.team_id, v_now);
            v_stats := v_stats || ROW(16 + v_job.shard % 16, v_job.team_id, v_job.name, 0, 0, 0, 1, 0, 0,
                                      NULL, NULL)::stats_delta;
            v_job.state := 'retrying';
            v_job.last_error := v_error;
            v_ended := v_ended || v_job;
            v_answers[i] := ROW(v_job.id, true, 'retrying'::job_state, NULL::text)::outcome;
        ELSE
            UPDATE jobs j
               SET state = 'dead', last_error = v_error, finished_at = v_now, updated_at = v_now,
                   started_at = coalesce(j.started_at, j.claimed_at),
                   lateness = coalesce(j.lateness, j.claimed_at - j.agreed_at),
                   claim_expires_at = NULL, lease_token = NULL
             WHERE j.shard = v_job.shard AND j.id = v_job.id;
            -- (v_job, read FOR UPDATE, is the row as it was: its first start is this one if it had none)
            v_stats := v_stats || ROW(16 + v_job.shard % 16, v_job.team_id, v_job.name, 0,
                                      (v_job.started_at IS NULL)::int, 0, 0, 1, 0,
                                      CASE WHEN v_job.started_at IS NULL
                                           THEN mh_seconds(v_job.claimed_at - v_job.agreed_at) END,
                                      mh_seconds(v_now - coalesce(v_job.started_at, v_job.claimed_at)))::stats_delta;
            v_job.last_error := v_error;
            v_dead := v_dead || v_job;
            v_job.state := 'dead';
            v_ended := v_ended || v_job;
            v_answers[i] := ROW(v_job.id, true, 'dead'::job_state, NULL::text)::outcome;
        END IF;
    END LOOP;
    PERFORM mh_not_running(v_shards, v_teams);
    PERFORM mh_add_stats(v_now, v_stats);
    PERFORM mh_record_attempts(v_ended, v_now);
    -- The dead ones are listed by team and name and reported to their team.
    IF cardinality(v_dead) > 0 THEN
        PERFORM mh_record_dead(ARRAY(SELECT d.shard FROM unnest(v_dead) d), ARRAY(SELECT d.id FROM unnest(v_dead) d),
                               ARRAY(SELECT d.team_id FROM unnest(v_dead) d), ARRAY(SELECT d.name FROM unnest(v_dead) d),
                               ARRAY(SELECT d.attempts FROM unnest(v_dead) d),
                               ARRAY(SELECT d.max_attempts FROM unnest(v_dead) d),
                               ARRAY(SELECT d.last_error FROM unnest(v_dead) d), v_now);
    END IF;
    RETURN QUERY
    SELECT (coalesce(v_answers[u.ord], ROW(u.id, false, j.state, mh_refusal(j.id IS NOT NULL, j.state))::outcome)).*
      FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
      LEFT JOIN unnest(v_ids, v_states) AS j(id, state) ON j.id = u.id
     ORDER BY u.ord;
END $$;

-- A worker gives back claimed jobs it did not start (it is shutting down,
-- or the request that leased them went away): they are due again at once,
-- at their old run time (so they keep their place), and the attempt the
-- claim counted is not counted. Only a claimed job: once its start is
-- reported the attempt counts for good, and a release is refused with a
-- reason of its own (a worker that gave back a job it ran, attempt after
-- attempt, would run its side effects forever without it ever dying); the
-- worker fails it instead, or leaves it to its claim's expiry. A job whose
-- cancel was requested while this claim held it (mh_cancel_job) did not run
-- under it: it is cancelled now.
CREATE OR REPLACE FUNCTION release_many(p_ids bigint[], p_tokens uuid[]) RETURNS SETOF outcome
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_shards smallint[] := mh_batch_shards(p_ids);
    v_ords   bigint[];
    v_states job_state[];
    v_done   smallint[];
    v_teams  int[];
    v_rows   due_row[];
    v_stats  stats_delta[];
BEGIN
    WITH input AS (
        SELECT u.id, u.token, u.ord FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
         ORDER BY mh_shard_of(u.id), u.id
    ), released AS (
        UPDATE jobs j
           SET state = CASE WHEN j.cancel_requested_at >= j.claimed_at THEN 'cancelled'
                            WHEN j.attempts > 1 THEN 'retrying' ELSE 'scheduled' END::job_state,
               finished_at = CASE WHEN j.cancel_requested_at >= j.claimed_at THEN v_now END,
               attempts = j.attempts - 1, claimed_by = NULL, claim_expires_at = NULL,
               lease_token = NULL, claimed_at = NULL, updated_at = v_now
          FROM input i
         WHERE j.shard = mh_shard_of(i.id) AND j.id = i.id AND j.lease_token = i.token
           AND j.state = 'claimed' AND (v_shards IS NULL OR j.shard = ANY (v_shards))
        RETURNING j.shard, j.strict, j.priority, j.run_at, j.id, j.team_id, j.name, j.state, i.ord
    )
    SELECT array_agg(r.ord), array_agg(r.state), array_agg(r.shard), array_agg(r.team_id),
           array_agg(ROW(r.shard, r.strict, r.priority, r.run_at, r.id, r.team_id)::due_row)
               FILTER (WHERE r.state <> 'cancelled'),
           array_agg(mh_cancelled(r.shard, r.team_id, r.name)) FILTER (WHERE r.state = 'cancelled')
      INTO v_ords, v_states, v_done, v_teams, v_rows, v_stats FROM released r;
    IF v_done IS NOT NULL THEN
        PERFORM mh_not_running(v_done, v_teams);
        -- A row per statement (give-backs are few): on Citus mh_enqueue_many's
        -- INSERT ... SELECT goes through the coordinator and commits in two phases.
        PERFORM mh_enqueue(r.shard, r.job_id, r.run_at, r.strict, r.priority, r.team_id, v_now)
           FROM unnest(v_rows) r ORDER BY r.shard, r.job_id;
        PERFORM mh_add_stats(v_now, v_stats);
    END IF;
    RETURN QUERY SELECT * FROM mh_answers(p_ids, p_tokens, v_ords, v_states, p_started =>
        'job has started: only a job whose start was not reported can be released (its attempt counts: '
        'fail it to have it retried, or let its claim expire)');
END $$;

-- Single-job forms.
CREATE OR REPLACE FUNCTION start(p_job bigint, p_token uuid) RETURNS outcome
LANGUAGE sql SET search_path = minutehand, pg_temp AS $$ SELECT * FROM start_many(ARRAY[p_job], ARRAY[p_token]) $$;
CREATE OR REPLACE FUNCTION heartbeat(p_job bigint, p_token uuid, p_extend_s real) RETURNS outcome
LANGUAGE sql SET search_path = minutehand, pg_temp AS $$ SELECT * FROM heartbeat_many(ARRAY[p_job], ARRAY[p_token], p_extend_s) $$;
CREATE OR REPLACE FUNCTION complete(p_job bigint, p_token uuid, p_result jsonb DEFAULT NULL) RETURNS outcome
LANGUAGE sql SET search_path = minutehand, pg_temp AS $$ SELECT * FROM complete_many(ARRAY[p_job], ARRAY[p_token], ARRAY[p_result]) $$;
CREATE OR REPLACE FUNCTION fail(p_job bigint, p_token uuid, p_error text, p_retryable boolean DEFAULT true) RETURNS outcome
LANGUAGE sql SET search_path = minutehand, pg_temp AS $$ SELECT * FROM fail_many(ARRAY[p_job], ARRAY[p_token], ARRAY[p_error], ARRAY[p_retryable]) $$;

-- Cancel one job of a team if its state is one of p_states: the row locked
-- first, so whether it was claimed is read from the row as it is now. A
-- waiting job's row comes off the wheel before that, so that no claim meets
-- it, named or not, and no count of what is due includes it (mh_unwheel):
-- the wheel row, then the job, the order a claim takes them in, so a cancel
-- and a claim of one job queue, never deadlock. A job that waits is
-- cancelled at once. A claimed one is in a worker's hands, and its handler
-- may already run (the library reports starts in batches): the cancel is
-- only requested (cancel_requested_at), and the worker's answer decides.
-- Given back (release), or its claim expired, without a start: it is
-- cancelled then. Started or finished: it ran, and ends as it ends; the
-- request was too late. Answered ok with state 'claimed' and why. Another
-- team's job is "no such job". The body of cancel(), and of the series
-- controls (which cancel a series' waiting run).
CREATE OR REPLACE FUNCTION mh_cancel_job(p_job bigint, p_team int, p_states job_state[]) RETURNS outcome
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_job    jobs;
    v_state  job_state;
    v_name   text;
    v_series bigint;
BEGIN
    SELECT * INTO v_job FROM jobs j WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job AND j.team_id = p_team;
    IF v_job.state IN ('scheduled', 'retrying') AND v_job.state = ANY (p_states) THEN
        PERFORM mh_unwheel(v_job, v_now);
    END IF;
    SELECT j.state, j.name, j.series_id INTO v_state, v_name, v_series FROM jobs j
     WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job AND j.team_id = p_team
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN ROW(p_job, false, NULL::job_state, 'no such job')::outcome;
    END IF;
    IF v_state = 'claimed' AND v_state = ANY (p_states) THEN
        -- (a request already made of this claim keeps its time)
        UPDATE jobs j SET cancel_requested_at = CASE WHEN j.cancel_requested_at >= j.claimed_at
                                                     THEN j.cancel_requested_at ELSE v_now END,
                          updated_at = v_now
         WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job;
        RETURN ROW(p_job, true, v_state, 'cancel requested: a worker holds the job; it is cancelled if the worker '
                                         'gives it back or its claim expires without a start, and runs on if '
                                         'its handler had started')::outcome;
    END IF;
    IF v_state = ANY (p_states) THEN
        UPDATE jobs j SET state = 'cancelled', finished_at = v_now, updated_at = v_now
         WHERE j.shard = mh_shard_of(p_job) AND j.id = p_job;
        IF v_series IS NOT NULL THEN
            -- A series' newest run cancelled skips one occurrence, it does not end the
            -- series: the series is marked for its next run, as a claim marks it (a
            -- pause or cancel of the series has already cleared what it would mark).
            UPDATE series s SET chain_after = s.last_due_at, updated_at = v_now
             WHERE s.shard = mh_shard_of(p_job)
               AND s.id IN (SELECT mh_series_to_chain(mh_shard_of(p_job), ARRAY[v_series], ARRAY[p_job]));
        END IF;
        PERFORM mh_add_stats(v_now, ARRAY[mh_cancelled(mh_shard_of(p_job), p_team, v_name)]);
        RETURN ROW(p_job, true, 'cancelled'::job_state, NULL::text)::outcome;
    END IF;
    RETURN ROW(p_job, false, v_state, format('job is %s: only a job that has not started can be cancelled', v_state))::outcome;
END $$;

-- Cancel a job that has not started (a claimed one: requested, above), for
-- the team named (required: a job of another team is "no such job").
-- Administrators cancel through the job's own team. A waiting job's row on
-- the wheel goes with it. Runs as its owner, like submit_job.
CREATE OR REPLACE FUNCTION cancel(p_job bigint, p_team text) RETURNS outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = minutehand, pg_temp AS $$
BEGIN
    IF p_team IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'cancel needs the team the job belongs to';
    END IF;
    RETURN mh_cancel_job(p_job, mh_team_id(p_team), ARRAY['scheduled', 'retrying', 'claimed']::job_state[]);
END $$;
