-- Retention of finished jobs. A job that succeeded, died, was discarded or
-- was cancelled is removed once its team's retention (teams.retention_s,
-- else the server's job_retention_s, passed in as p_default_s) has passed
-- since it finished.
--
-- Per shard, a walk along the primary key (shard, id) from a low-water mark
-- (retention_marks): ids are time-ordered, so the jobs behind the walk are
-- the oldest ones, visited once each, and the dead index entries and tuples
-- the deletes leave are never read again by the walk. A visited job that
-- cannot go yet (not finished, a team that keeps jobs longer, an
-- idempotency key that still names it) is filed in retention_checks for the
-- earliest time it could go, and looked at again then. Space of removed
-- rows is reused by later jobs after autovacuum (measured, README
-- "Retention"). Nothing here is on the hot path: claims never read a
-- finished job, and a removed job's leftovers are harmless (claim_checks:
-- expire_claims updates only claimed or running jobs; a claim that takes a
-- due row whose job is gone claims nothing for it).

-- The time a job id was made (its 40-bit millisecond part): the inverse of
-- mh_id_at.
CREATE OR REPLACE FUNCTION mh_id_time(p_id bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(((p_id >> 23) + 1735689600000) / 1000.0)
$$;

-- The shortest retention any team has, in seconds (p_default_s: the
-- server's): the walk never needs to look at jobs younger than that.
CREATE OR REPLACE FUNCTION mh_shortest_retention(p_default_s int) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT least(p_default_s, (SELECT min(t.retention_s) FROM teams t))
$$;

-- The id the retention walk stops before at p_now: behind the shortest
-- retention, and behind it again by as much (at most 5 minutes). A job id
-- is drawn when its submitting transaction runs, and a transaction still
-- open when the walk passes its ids would leave its jobs behind the mark
-- for good.
CREATE OR REPLACE FUNCTION mh_retention_cut(p_default_s int, p_now timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT mh_id_at(p_now - (k + least(k, 300)) * interval '1 second') FROM mh_shortest_retention(p_default_s) k
$$;

-- Of some jobs of one shard — those of p_ids, or with p_ids NULL the first
-- p_limit from id p_from up to p_cut (the walk) — remove those past their
-- retention and file the others for the earliest time they could go: a
-- finished job at its finish + retention; a job not finished yet at its run
-- time (or now) + retention, as it cannot finish before it runs; a keyed
-- job not before its idempotency key expires (the key answers with its
-- job, which must still be there to read); a cancelled job not before its
-- run time has passed too (its due row waits in the wheel until then and
-- the claim drops it). Rows are deleted in id order, the order outcome
-- batches lock them in. Returns how many were removed and filed, how many
-- were looked at, and the largest id among them.
CREATE OR REPLACE FUNCTION mh_retain(p_shard int, p_ids bigint[], p_from bigint, p_cut bigint, p_limit int,
                                     p_default_s int, p_now timestamptz,
                                     OUT removed bigint, OUT deferred bigint, OUT seen bigint, OUT last_id bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_gone  bigint[];
    v_later bigint[];
    v_at    timestamptz[];
    v_dead_teams int[];
    v_dead_names text[];
    v_dead_ids   bigint[];
BEGIN
    SELECT array_agg(b.id ORDER BY b.id) FILTER (WHERE b.go_at < p_now),
           array_agg(b.id) FILTER (WHERE NOT b.go_at < p_now),
           array_agg(b.go_at) FILTER (WHERE NOT b.go_at < p_now),
           count(*), max(b.id)
      INTO v_gone, v_later, v_at, seen, last_id
      FROM (SELECT j.id,
                   CASE WHEN j.state IN ('succeeded', 'dead', 'cancelled', 'discarded')
                        THEN greatest(coalesce(j.finished_at, j.updated_at) + r.keep,
                                      -- a live key keeps its job: probed per keyed job by
                                      -- primary key (a join may read every key of the shard)
                                      CASE WHEN j.idempotency_key IS NOT NULL THEN
                                          (SELECT k.expires_at FROM idempotency_keys k
                                            WHERE k.shard = p_shard AND k.team_id = j.team_id
                                              AND k.key = j.idempotency_key AND k.job_id = j.id
                                              AND k.expires_at > p_now) END,
                                      CASE WHEN j.state = 'cancelled' THEN j.run_at END)
                        ELSE greatest(j.run_at, p_now) + r.keep END AS go_at
              FROM (SELECT c.id, c.team_id, c.state, c.finished_at, c.updated_at, c.run_at, c.idempotency_key
                      FROM jobs c WHERE p_ids IS NOT NULL AND c.shard = p_shard AND c.id = ANY (p_ids)
                    UNION ALL
                    (SELECT w.id, w.team_id, w.state, w.finished_at, w.updated_at, w.run_at, w.idempotency_key
                       FROM jobs w
                      WHERE p_ids IS NULL AND w.shard = p_shard AND w.id >= p_from AND w.id < p_cut
                      ORDER BY w.id LIMIT p_limit)) j
              JOIN teams t ON t.id = j.team_id
             CROSS JOIN LATERAL (SELECT coalesce(t.retention_s, p_default_s) * interval '1 second' AS keep) r) b;

    -- The state is judged again under the row lock: a dead job requeued
    -- meanwhile is waiting again and stays. A dead job's letter goes with it
    -- (job row first, then its dead_jobs row: the order of sql/functions/dead.sql).
    WITH gone AS (
        DELETE FROM jobs j
         WHERE j.shard = p_shard AND j.id = ANY (coalesce(v_gone, '{}'))
           AND j.state IN ('succeeded', 'dead', 'cancelled', 'discarded')
        RETURNING j.team_id, j.name, j.id, j.state, j.attempts
    ), attempts AS (          -- the history of attempts that failed (none for a first-time success)
        DELETE FROM job_attempts a
         WHERE a.shard = p_shard
           AND a.job_id = ANY (ARRAY(SELECT g.id FROM gone g
                                      WHERE g.attempts > 1 OR (g.attempts = 1 AND g.state <> 'succeeded')))
    )
    SELECT count(*), array_agg(g.team_id) FILTER (WHERE g.state = 'dead'),
           array_agg(g.name) FILTER (WHERE g.state = 'dead'), array_agg(g.id) FILTER (WHERE g.state = 'dead')
      INTO removed, v_dead_teams, v_dead_names, v_dead_ids FROM gone g;
    IF v_dead_ids IS NOT NULL THEN
        DELETE FROM dead_jobs d USING unnest(v_dead_teams, v_dead_names, v_dead_ids) AS x(team_id, name, job_id)
         WHERE d.shard = p_shard AND d.team_id = x.team_id AND d.name = x.name AND d.job_id = x.job_id;
    END IF;

    -- (through the jobs of the shard: on Citus one statement on its worker,
    -- where rows from arrays alone go through the coordinator and commit in
    -- two phases)
    INSERT INTO retention_checks AS c (shard, job_id, check_at)
    SELECT j.shard, j.id, l.at
      FROM unnest(v_later, v_at) AS l(id, at)
      JOIN jobs j ON j.shard = p_shard AND j.id = l.id
     ORDER BY j.id
    ON CONFLICT (shard, job_id) DO UPDATE SET check_at = excluded.check_at;
    deferred := coalesce(cardinality(v_later), 0);
END $$;

-- One pass over one shard: the jobs filed for now or earlier
-- (retention_checks, at most p_limit), then the next p_limit jobs of the
-- walk, up to mh_retention_cut. Concurrent calls for
-- one shard: one walks, the others only do the filed jobs (row lock on the
-- mark, skipped). Committed without waiting for the WAL flush: a crash can
-- only lose the last removals, and the walk does them again from its mark.
CREATE OR REPLACE FUNCTION retain_jobs(p_shard int, p_default_s int, p_limit int DEFAULT 500,
                                       OUT removed bigint, OUT deferred bigint, OUT walked bigint)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now      timestamptz := mh_now();
    v_from     bigint;
    v_ids      bigint[];
    v_r        record;
BEGIN
    IF p_default_s IS NULL OR p_default_s < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'MH400', MESSAGE = 'the default retention must be at least 1 second';
    END IF;
    removed := 0; deferred := 0; walked := 0;
    PERFORM set_config('synchronous_commit', 'off', true);

    WITH due AS (
        DELETE FROM retention_checks c
         WHERE c.shard = p_shard
           AND c.job_id IN (SELECT k.job_id FROM retention_checks k
                             WHERE k.shard = p_shard AND k.check_at <= v_now
                             ORDER BY k.check_at LIMIT p_limit
                               FOR UPDATE SKIP LOCKED)
        RETURNING c.job_id
    )
    SELECT array_agg(d.job_id ORDER BY d.job_id) INTO v_ids FROM due d;
    IF v_ids IS NOT NULL THEN
        SELECT * INTO v_r FROM mh_retain(p_shard, v_ids, NULL, NULL, NULL, p_default_s, v_now);
        removed := v_r.removed; deferred := v_r.deferred;
    END IF;

    SELECT m.walked_to INTO v_from FROM retention_marks m WHERE m.shard = p_shard FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        INSERT INTO retention_marks (shard, walked_to) VALUES (p_shard, 0) ON CONFLICT DO NOTHING;
        SELECT m.walked_to INTO v_from FROM retention_marks m WHERE m.shard = p_shard FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN RETURN; END IF;
    END IF;
    SELECT * INTO v_r FROM mh_retain(p_shard, NULL, v_from, mh_retention_cut(p_default_s, v_now),
                                     p_limit, p_default_s, v_now);
    IF v_r.seen = 0 THEN RETURN; END IF;
    walked := v_r.seen;
    removed := removed + v_r.removed; deferred := deferred + v_r.deferred;
    UPDATE retention_marks SET walked_to = v_r.last_id + 1 WHERE shard = p_shard;
END $$;

-- Why a job id has no row, for status: expired is true when the id was
-- made before its team's retention cut (now - retention), so a job of that
-- id, finished, would have been removed by now; false when it is younger
-- (such a job would still be there: the id never named a job of this team)
-- or cannot be an id at all (its shard bits out of range, made in the
-- future). An id cannot say whether it was ever used, so an expired answer
-- is "expired or never existed". p_team NULL (an administrator): the
-- shortest retention of any team.
CREATE OR REPLACE FUNCTION job_gone(p_id bigint, p_team text, p_default_s int,
                                    OUT made_at timestamptz, OUT retention_s int, OUT expired boolean)
LANGUAGE sql STABLE AS $$
    SELECT mh_id_time(p_id), k.keep,
           p_id > 0 AND (p_id & 1023) < mh_shard_count() AND mh_id_time(p_id) < mh_now() - k.keep * interval '1 second'
      FROM (SELECT CASE WHEN p_team IS NULL THEN mh_shortest_retention(p_default_s)
                        ELSE coalesce((SELECT t.retention_s FROM teams t WHERE t.name = p_team), p_default_s)
                   END AS keep) k
$$;
