-- Maintenance: each duty is safe to run concurrently with itself and with
-- claims. The dispatcher schedules them; maintain() runs them all once.

-- What an expired claim leaves its job as. A job whose result is recorded
-- under its key (record_results) ran to the end: it is due again to be
-- completed with that result (replay), not dead for the lost report. One
-- whose cancel was requested while this claim held it, and whose start
-- never came, is cancelled. Else due again, or dead on its last attempt.
CREATE OR REPLACE FUNCTION mh_expired(p_state job_state, p_attempts int, p_max int, p_cancel boolean,
                                      p_recorded boolean) RETURNS job_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_recorded THEN 'scheduled'::job_state
                WHEN p_cancel AND p_state = 'claimed' THEN 'cancelled'::job_state
                WHEN p_attempts >= p_max THEN 'dead'::job_state
                ELSE 'scheduled'::job_state END
$$;

-- Claims past their expiry go back to the current bucket with their attempt
-- count kept (the claim already counted the attempt; not when the job's
-- result is recorded: its handler's run is done, only its report was lost).
-- A job whose last attempt expired is dead: a job that kills its workers
-- must not loop, and the reason it records says the claim lapsed and the job
-- may have run (at-least-once); it is listed in dead_jobs and reported to
-- its team (sql/functions/dead.sql). A claimed job whose cancel was
-- requested is cancelled (mh_expired). Driven by the due reminders in
-- claim_checks (at most p_limit per call), so it never scans the jobs;
-- claims renewed since are filed again for the time they now expire. One
-- shard per call (a row-locking statement names one).
CREATE OR REPLACE FUNCTION expire_claims(p_shard int, p_limit int DEFAULT 1000, OUT returned bigint, OUT dead bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_ids    bigint[];
    v_expired  bigint[];    -- the claims that expired now
    v_recorded bigint[];    -- expired claims whose result is recorded under the key
    v_rows   due_row[];
    v_names  text[];     -- the job name of each of v_rows
    v_teams  int[];
    v_stats  stats_delta[];
    -- the dead ones, for mh_record_dead
    v_dead      bigint[];
    v_dteams    int[];
    v_dnames    text[];
    v_dattempts int[];
    v_dmax      int[];
    v_derrors   text[];
BEGIN
    returned := 0; dead := 0;
    WITH due AS (
        DELETE FROM claim_checks c
         WHERE c.shard = p_shard
           AND c.ctid = ANY (ARRAY(SELECT k.ctid FROM claim_checks k
                                    WHERE k.shard = p_shard AND k.check_at <= v_now LIMIT p_limit))
        RETURNING c.job_ids
    )
    SELECT array_agg(DISTINCT i ORDER BY i) INTO v_ids FROM due, unnest(due.job_ids) i;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    v_recorded := ARRAY(SELECT j.id FROM jobs j
                          JOIN idempotency_keys k ON k.shard = j.shard AND k.team_id = j.team_id
                                                 AND k.key = j.idempotency_key AND k.job_id = j.id
                         WHERE j.shard = p_shard AND j.id = ANY (v_ids) AND j.idempotency_key IS NOT NULL
                           AND j.state IN ('claimed', 'running') AND j.claim_expires_at < v_now
                           AND k.shard = p_shard AND k.completed_at IS NOT NULL);

    -- The jobs are visited in id order (a nested loop over the sorted ids),
    -- the order the outcome batches lock them in.
    WITH expired AS (
        UPDATE jobs j
           SET state = mh_expired(j.state, j.attempts, j.max_attempts, j.cancel_requested_at >= j.claimed_at,
                                  j.id = ANY (v_recorded)),
               finished_at = CASE WHEN mh_expired(j.state, j.attempts, j.max_attempts,
                                                  j.cancel_requested_at >= j.claimed_at, j.id = ANY (v_recorded))
                                       <> 'scheduled' THEN v_now END,
               attempts = j.attempts - (j.id = ANY (v_recorded))::int,
               -- (|| and IMMUTABLE casts, not format(): Citus evaluates nothing STABLE over a row in SET)
               last_error = 'claim expired on attempt ' || j.attempts::text || ' of ' || j.max_attempts::text
                   || ' (by ' || coalesce(j.claimed_by, '') || ', at ' || mh_time_text(j.claim_expires_at) || ')'
                   || CASE mh_expired(j.state, j.attempts, j.max_attempts, j.cancel_requested_at >= j.claimed_at,
                                      j.id = ANY (v_recorded))
                           WHEN 'dead'
                           THEN ': no attempts left. The worker stopped reporting; the job may have run (at-least-once)'
                           WHEN 'cancelled' THEN ': cancelled, as requested while it was claimed. Its worker reported '
                                                 'no start; it may have begun the job'
                           ELSE CASE WHEN j.id = ANY (v_recorded)
                                     THEN ': its result was recorded; it is delivered again to be completed with it'
                                     ELSE '' END END,
               run_at = CASE WHEN mh_expired(j.state, j.attempts, j.max_attempts,
                                             j.cancel_requested_at >= j.claimed_at, j.id = ANY (v_recorded))
                                  = 'scheduled' THEN v_now ELSE j.run_at END,
               claimed_by = NULL, claim_expires_at = NULL, lease_token = NULL, updated_at = v_now
          FROM unnest(v_ids) AS i(id)
         WHERE j.shard = p_shard AND j.id = i.id
           AND j.state IN ('claimed', 'running') AND j.claim_expires_at < v_now
        RETURNING j.id, j.state, j.strict, j.priority, j.team_id, j.name, j.started_at, j.attempts, j.max_attempts,
                  j.last_error
    )
    SELECT array_agg(e.id ORDER BY e.id),
           array_agg(ROW(p_shard, e.strict, e.priority, v_now, e.id, e.team_id)::due_row ORDER BY e.id)
               FILTER (WHERE e.state = 'scheduled'),
           array_agg(e.name ORDER BY e.id) FILTER (WHERE e.state = 'scheduled'),
           count(*) FILTER (WHERE e.state = 'scheduled'),
           count(*) FILTER (WHERE e.state = 'dead'),
           array_agg(e.team_id),
           array_agg(CASE WHEN e.state = 'dead'
                          THEN ROW(16 + p_shard % 16, e.team_id, e.name, 0, 0, 0, 0, 1, 0, NULL,
                                   mh_seconds(v_now - e.started_at))::stats_delta
                          ELSE mh_cancelled(p_shard::smallint, e.team_id, e.name) END)
               FILTER (WHERE e.state IN ('dead', 'cancelled')),
           array_agg(e.id ORDER BY e.id) FILTER (WHERE e.state = 'dead'),
           array_agg(e.team_id ORDER BY e.id) FILTER (WHERE e.state = 'dead'),
           array_agg(e.name ORDER BY e.id) FILTER (WHERE e.state = 'dead'),
           array_agg(e.attempts ORDER BY e.id) FILTER (WHERE e.state = 'dead'),
           array_agg(e.max_attempts ORDER BY e.id) FILTER (WHERE e.state = 'dead'),
           array_agg(e.last_error ORDER BY e.id) FILTER (WHERE e.state = 'dead')
      INTO v_expired, v_rows, v_names, returned, dead, v_teams, v_stats, v_dead, v_dteams, v_dnames, v_dattempts,
           v_dmax, v_derrors
      FROM expired e;
    -- The attempts, for their history (job_attempts; the error names the
    -- worker), read back from the jobs: an INSERT fed by the UPDATE above
    -- would be planned on Citus through the coordinator, its rows sent to
    -- every worker node and committed in two phases; from the jobs of
    -- this shard it is one statement on their worker.
    INSERT INTO job_attempts (shard, job_id, attempt, ended_at, claimed_at, started_at, outcome, error)
    SELECT j.shard, j.id, j.attempts, v_now, j.claimed_at, j.started_at, j.state, j.last_error
      FROM jobs j
     WHERE j.shard = p_shard AND j.id = ANY (v_expired)
     ORDER BY j.id
    ON CONFLICT DO NOTHING;
    -- Every expired claim leaves claimed/running; a dead one is counted (its
    -- run time too if it had started), and a cancelled one.
    PERFORM mh_not_running(array_fill(p_shard::smallint, ARRAY[coalesce(cardinality(v_teams), 0)]), v_teams);
    PERFORM mh_add_stats(v_now, v_stats);
    PERFORM mh_enqueue_many(v_rows, v_now, v_names);
    -- The dead ones are listed by team and name and reported to their team.
    PERFORM mh_record_dead(array_fill(p_shard::smallint, ARRAY[coalesce(cardinality(v_dead), 0)]), v_dead, v_dteams,
                           v_dnames, v_dattempts, v_dmax, v_derrors, v_now);

    -- (grouped by the shard column: on Citus one statement on the shard's
    -- worker, where an aggregate over no group goes through the coordinator)
    INSERT INTO claim_checks (shard, check_at, job_ids)
    SELECT j.shard, min(j.claim_expires_at), array_agg(j.id)
      FROM jobs j
     WHERE j.shard = p_shard AND j.id = ANY (v_ids) AND j.state IN ('claimed', 'running')
     GROUP BY j.shard;
END $$;
-- Move jobs down the wheel as the horizon reaches them, in bulk:
--   due_far   -> hour (or minute) level: rows due before mh_hour_end(now),
--                earliest first, at most p_far_limit per call;
--   due_hours -> minute level: every hour slot wholly before
--                mh_minute_end(now) is moved with one INSERT ... SELECT and
--                emptied with TRUNCATE. The last 24 hours of slots are
--                revisited for stragglers (a submitter whose clock read came
--                just before the boundary and its commit just after); on the
--                first run, or after an outage of more than that, every slot.
-- A slot can then also hold rows of a later lap: those stay, and the slot is
-- emptied by DELETE instead. Returns how many rows moved. Concurrent
-- callers: one works, the others return 0 at once (row lock on `wheel`).
CREATE OR REPLACE FUNCTION cascade_wheel(p_far_limit int DEFAULT 200000, OUT from_far bigint, OUT from_hours bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now        timestamptz := mh_now();
    v_minute_end timestamptz := mh_minute_end(v_now);
    v_hour_end   timestamptz := mh_hour_end(v_now);
    v_since      timestamptz;
    v_hour       timestamptz;
    v_part       text;
    v_any        boolean;
    v_rows       due_row[];
    v_cut        timestamptz;
BEGIN
    from_far := 0; from_hours := 0;
    SELECT w.cascaded_until INTO v_since FROM wheel w WHERE w.id = 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN RETURN; END IF;

    -- The earliest p_far_limit rows, taken by a cut in run_at (every row at
    -- the cut goes too), not by ctid: Citus deletes by no ctid across shards.
    SELECT max(c.run_at) INTO v_cut
      FROM (SELECT c.run_at FROM due_far c WHERE c.run_at < v_hour_end ORDER BY c.run_at LIMIT p_far_limit) c;
    -- (None due: no DELETE at all. `run_at <= NULL` folds to false, and an
    -- UPDATE or DELETE whose condition folds to false fails on Citus 13.2,
    -- or crashes its coordinator.)
    IF v_cut IS NOT NULL THEN
        WITH moved AS (
            DELETE FROM due_far f WHERE f.run_at <= v_cut
            RETURNING f.*
        )
        SELECT array_agg(ROW(m.shard, m.strict, m.priority, m.run_at, m.job_id, m.team_id)::due_row), count(*)
          INTO v_rows, from_far FROM moved m;
        PERFORM mh_enqueue_many(v_rows, v_now);
    END IF;

    IF v_since IS NOT NULL AND v_since >= v_minute_end - interval '24 hours' THEN
        v_hour := v_minute_end - interval '24 hours';
    ELSE
        v_hour := v_minute_end - mh_hour_slots() * interval '1 hour';
    END IF;
    WHILE v_hour < v_minute_end LOOP
        v_part := mh_hour_part(mh_hour_slot(v_hour));
        v_hour := v_hour + interval '1 hour';
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', v_part) INTO v_any;
        CONTINUE WHEN NOT v_any;
        from_hours := from_hours + mh_move_down(v_part, v_minute_end, v_now);
    END LOOP;
    UPDATE wheel SET cascaded_until = v_minute_end
     WHERE id = 1 AND (cascaded_until IS NULL OR cascaded_until < v_minute_end);
END $$;

-- Carry the overdue rows (run_at before p_cur) of one minute slot into the
-- current bucket and empty the slot. p_passed: the slot's minute has passed
-- the sweep line, so it is emptied even with nothing to carry (its claimed
-- rows' dead tuples go with it); otherwise an untouched slot is left alone.
-- A row whose job no longer waits (left from before cancels took their
-- rows, or written around the procedures) is dropped, not carried forward
-- again and again. Never the current bucket's own slot.
CREATE OR REPLACE FUNCTION mh_carry_forward(p_slot int, p_cur timestamptz, p_passed boolean) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_any boolean;
BEGIN
    IF p_slot = mh_minute_slot(p_cur) THEN
        RAISE EXCEPTION 'slot % is the current bucket: it cannot be carried forward into itself', p_slot;
    END IF;
    IF NOT p_passed THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE run_at < $1)', mh_minute_part(p_slot))
           INTO v_any USING p_cur;
        IF NOT v_any THEN RETURN 0; END IF;
    END IF;
    RETURN mh_move_down(mh_minute_part(p_slot), p_cur, p_cur, p_waiting => true);
END $$;

-- Carry forward, then empty, the minute buckets the hand has passed: every
-- bucket older than the sweep line (30 min behind now) gets its leftover due
-- rows moved to the current bucket, and is emptied with TRUNCATE (dead
-- tuples of claimed rows go with it, no VACUUM). `wheel.swept_until`
-- remembers how far it got. On the first run, or after an outage longer than
-- the margin, passed buckets may share their slot with future ones (the
-- ring is 480 minutes): then every slot outside the claim window
-- [sweep line, now] is checked for overdue rows instead.
-- Concurrent callers: as cascade_wheel.
CREATE OR REPLACE FUNCTION sweep_passed(OUT buckets int, OUT carried bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now    timestamptz := mh_now();
    v_cur    timestamptz := mh_minute(v_now);
    v_line   timestamptz := v_cur - mh_sweep_after();
    v_since  timestamptz;
    v_bucket timestamptz;
    v_normal boolean;
BEGIN
    buckets := 0; carried := 0;
    SELECT w.swept_until INTO v_since FROM wheel w WHERE w.id = 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN RETURN; END IF;
    v_normal := v_since IS NOT NULL AND v_since >= v_line - mh_sweep_after();
    IF v_normal THEN
        v_bucket := v_since;
        WHILE v_bucket < v_line LOOP
            carried := carried + mh_carry_forward(mh_minute_slot(v_bucket), v_cur, true);
            buckets := buckets + 1;
            v_bucket := v_bucket + interval '1 minute';
        END LOOP;
    ELSE
        v_bucket := v_cur + interval '1 minute';
        WHILE v_bucket < v_line + mh_minute_slots() * interval '1 minute' LOOP
            carried := carried + mh_carry_forward(mh_minute_slot(v_bucket), v_cur, false);
            buckets := buckets + 1;
            v_bucket := v_bucket + interval '1 minute';
        END LOOP;
    END IF;
    UPDATE wheel SET swept_until = v_line WHERE id = 1 AND (swept_until IS NULL OR swept_until < v_line);
END $$;

-- Idempotency keys live 24 h. One shard per call, bounded per call.
CREATE OR REPLACE FUNCTION purge_idempotency_keys(p_shard int, p_limit int DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_n   bigint;
BEGIN
    DELETE FROM idempotency_keys k
     WHERE k.shard = p_shard
       AND k.ctid = ANY (ARRAY(SELECT c.ctid FROM idempotency_keys c
                                WHERE c.shard = p_shard AND c.expires_at <= v_now LIMIT p_limit));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

-- The planned load of minutes more than an hour back is not read again
-- (placement never looks before now): dropped, oldest first, at most
-- p_limit rows per call.
CREATE OR REPLACE FUNCTION purge_load(p_limit int DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_n bigint;
BEGIN
    DELETE FROM load_minutes l
     WHERE (l.minute, l.team_id, l.stripe) IN (
           SELECT o.minute, o.team_id, o.stripe FROM load_minutes o
            WHERE o.minute < mh_now() - interval '1 hour'
            ORDER BY o.minute LIMIT p_limit);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

-- Every duty once, over every shard: for operators, the demo and tests.
CREATE OR REPLACE FUNCTION maintain(OUT from_far bigint, OUT from_hours bigint, OUT swept_buckets int, OUT carried bigint,
                         OUT claims_returned bigint, OUT claims_dead bigint, OUT keys_purged bigint,
                         OUT stats_rolled bigint, OUT stats_purged bigint, OUT load_purged bigint,
                         OUT events_purged bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    s int;
    r record;
BEGIN
    SELECT * INTO r FROM cascade_wheel();
    from_far := r.from_far; from_hours := r.from_hours;
    SELECT * INTO r FROM sweep_passed();
    swept_buckets := r.buckets; carried := r.carried;
    claims_returned := 0; claims_dead := 0; keys_purged := 0; events_purged := 0;
    FOR s IN 0 .. mh_shard_count() - 1 LOOP
        SELECT * INTO r FROM expire_claims(s);
        claims_returned := claims_returned + r.returned;
        claims_dead := claims_dead + r.dead;
        keys_purged := keys_purged + purge_idempotency_keys(s);
        events_purged := events_purged + purge_events(s);
    END LOOP;
    PERFORM purge_deliveries();
    stats_rolled := roll_up_stats();
    stats_purged := purge_stats();
    load_purged := purge_load();
END $$;
