-- Admission control: how many of a submission's jobs a team may submit now,
-- checked by the API before it writes anything (sql/tables/admission.sql).
-- Two limits, each a team's own: its pending ceiling (jobs submitted and not
-- finished, team_pending; teams.max_pending, NULL: the server's setting) and
-- its rate (a token bucket: teams.submit_rate tokens a second, at most
-- teams.submit_burst saved up; NULL: none). One job is one token.

-- Jobs the team has submitted and not finished: the sum of its rows (at most 32).
CREATE OR REPLACE FUNCTION mh_pending(p_team_id int) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(p.pending), 0)::bigint FROM team_pending p WHERE p.team_id = p_team_id
$$;

-- A team's token bucket, its row locked for the caller's transaction (made
-- full at the team's first limited submission), as it is at p_now: the
-- tokens saved up and refilled since, at most the burst. Below zero when
-- series runs took tokens ahead (chain_series). A clock set back refills
-- nothing. What is taken is written back with mh_keep_tokens.
CREATE OR REPLACE FUNCTION mh_bucket(p_team teams, p_now timestamptz) RETURNS float8
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_tokens   float8;
    v_refilled timestamptz;
BEGIN
    LOOP
        SELECT b.tokens, b.refilled_at INTO v_tokens, v_refilled FROM team_buckets b
         WHERE b.team_id = p_team.id FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO team_buckets (team_id, tokens, refilled_at) VALUES (p_team.id, p_team.submit_burst, p_now)
        ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN least(p_team.submit_burst::float8,
                 v_tokens + p_team.submit_rate * greatest(mh_seconds(p_now - v_refilled), 0));
END $$;

-- The tokens left in a team's bucket (read by mh_bucket) as of p_now; the
-- bucket keeps the later of its time and p_now.
CREATE OR REPLACE FUNCTION mh_keep_tokens(p_team_id int, p_tokens float8, p_now timestamptz) RETURNS void
LANGUAGE sql AS $$
    UPDATE team_buckets b SET tokens = p_tokens, refilled_at = greatest(b.refilled_at, p_now)
     WHERE b.team_id = p_team_id
$$;

-- The lock that makes a team's pending-ceiling checks take turns with the
-- writes they admit: an advisory lock per team, held until the caller's
-- transaction ends, taken before the count is read (READ COMMITTED: the
-- read after it sees every job committed by the holder before). Teams do
-- not wait for each other. On Citus it is the coordinator's, where every
-- transaction that takes it runs.
CREATE OR REPLACE FUNCTION mh_lock_pending(p_team_id int) RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(1835561060, p_team_id) $$;     -- 1835561060: "mhpd"

-- The pending ceiling where the jobs it admits are written: in the caller's
-- transaction, which then writes them, how many of p_jobs the team may add
-- (admitted: all, or as many as fit), its count and its ceiling
-- (teams.max_pending, else p_default_ceiling; NULL: none, all admitted and
-- no lock taken). With a ceiling the team's lock is held until the caller
-- commits, so concurrent writers of one team that all check here (the
-- API's submissions and requeues, the chain of series) cannot pass the
-- ceiling together: each counts the jobs the one before it committed.
-- Submissions through SQL are counted and neither checked nor held back.
CREATE OR REPLACE FUNCTION mh_hold_pending(p_team text, p_jobs int, p_default_ceiling int,
                                           OUT admitted int, OUT pending bigint, OUT ceiling int)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE v_team teams%ROWTYPE;
BEGIN
    v_team := mh_team(p_team);
    admitted := p_jobs;
    ceiling := coalesce(v_team.max_pending, nullif(p_default_ceiling, 0));
    IF ceiling IS NULL THEN
        RETURN;
    END IF;
    PERFORM mh_lock_pending(v_team.id);
    pending := mh_pending(v_team.id);
    admitted := least(p_jobs, greatest(ceiling - pending, 0))::int;
END $$;

-- p_jobs jobs asked for, at least p_at_least of them or none (a batch asks
-- for all of its jobs, coalesced single submissions for at least one).
-- admitted: how many may be written now (0: none); their tokens are taken.
-- limited_by: what held the count below p_jobs ('pending', 'rate', or
-- 'burst': more at once than the bucket holds, never admitted whole);
-- retry_after_s: under 'rate', seconds until the tokens for what was not
-- admitted (p_at_least of them, or one more job after a partial admission)
-- are there; pending and ceiling: the count and the ceiling, when there is
-- one; rate and burst: the team's bucket (NULL: no rate limit).
--
-- The bucket row is locked by this call alone, in its own short transaction
-- before the submission's: tokens taken for jobs the submission then does not
-- write are not given back. That write is not worth a flush of the WAL
-- (synchronous_commit off): a crash may forget the last few milliseconds of
-- tokens taken, never a job. The ceiling is read here without a lock, so
-- that a team at its ceiling takes no tokens; concurrent submissions may
-- each pass this read, and the submission's own transaction checks again
-- under the team's lock (mh_hold_pending).
CREATE OR REPLACE FUNCTION mh_admit(p_team text, p_jobs int, p_at_least int, p_default_ceiling int,
                                    OUT admitted int, OUT limited_by text, OUT retry_after_s float8,
                                    OUT pending bigint, OUT ceiling int, OUT rate float8, OUT burst int)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now      timestamptz := mh_now();
    v_team     teams%ROWTYPE;
    v_tokens   float8;
BEGIN
    v_team := mh_team(p_team);
    admitted := p_jobs;
    rate := v_team.submit_rate;
    burst := v_team.submit_burst;
    ceiling := coalesce(v_team.max_pending, nullif(p_default_ceiling, 0));
    IF ceiling IS NOT NULL THEN
        pending := mh_pending(v_team.id);
        IF pending + admitted > ceiling THEN
            admitted := greatest(ceiling - pending, 0)::int;
            limited_by := 'pending';
        END IF;
    END IF;
    IF v_team.submit_rate IS NULL OR admitted < p_at_least THEN
        admitted := CASE WHEN admitted >= p_at_least THEN admitted ELSE 0 END;
        RETURN;
    END IF;
    IF p_at_least > v_team.submit_burst THEN
        admitted := 0;
        limited_by := 'burst';
        RETURN;
    END IF;
    v_tokens := mh_bucket(v_team, v_now);
    IF v_tokens < admitted THEN
        admitted := floor(v_tokens)::int;
        limited_by := 'rate';
    END IF;
    IF admitted < p_at_least THEN
        admitted := 0;
        retry_after_s := (p_at_least - v_tokens) / v_team.submit_rate;
        RETURN;                               -- nothing taken: the bucket stays as it was
    END IF;
    IF limited_by = 'rate' THEN
        retry_after_s := (1 - (v_tokens - admitted)) / v_team.submit_rate;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM mh_keep_tokens(v_team.id, v_tokens - admitted, v_now);
END $$;
