-- Admission control: how many of a submission's jobs a team may submit now,
-- checked by the API before it writes anything (sql/tables/admission.sql).
-- Two limits, each a team's own: its pending ceiling (jobs submitted and not
-- finished, team_pending; teams.max_pending, NULL: the server's setting) and
-- its rate (a token bucket: teams.submit_rate tokens a second, at most
-- teams.submit_burst saved up; NULL: none). One job is one token.

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
-- tokens taken, never a job. The ceiling is read without a lock:
-- concurrent submissions of one team may together pass it by what they
-- carry (each is checked against the count the others have not committed).
CREATE OR REPLACE FUNCTION mh_admit(p_team text, p_jobs int, p_at_least int, p_default_ceiling int,
                                    OUT admitted int, OUT limited_by text, OUT retry_after_s float8,
                                    OUT pending bigint, OUT ceiling int, OUT rate float8, OUT burst int)
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now      timestamptz := mh_now();
    v_team     teams%ROWTYPE;
    v_tokens   float8;
    v_refilled timestamptz;
BEGIN
    SELECT * INTO v_team FROM teams WHERE name = p_team;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MH404', MESSAGE = format('unknown team %L', p_team);
    END IF;
    admitted := p_jobs;
    rate := v_team.submit_rate;
    burst := v_team.submit_burst;
    ceiling := coalesce(v_team.max_pending, nullif(p_default_ceiling, 0));
    IF ceiling IS NOT NULL THEN
        SELECT coalesce(sum(p.pending), 0) INTO pending FROM team_pending p WHERE p.team_id = v_team.id;
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
    LOOP
        SELECT b.tokens, b.refilled_at INTO v_tokens, v_refilled FROM team_buckets b
         WHERE b.team_id = v_team.id FOR UPDATE;
        EXIT WHEN FOUND;
        -- A team's first limited submission: its bucket starts full.
        INSERT INTO team_buckets (team_id, tokens, refilled_at) VALUES (v_team.id, v_team.submit_burst, v_now)
        ON CONFLICT DO NOTHING;
    END LOOP;
    -- (A clock set back refills nothing, and the bucket keeps its later time.)
    v_tokens := least(v_team.submit_burst::float8,
                      v_tokens + v_team.submit_rate * greatest(mh_seconds(v_now - v_refilled), 0));
    v_refilled := greatest(v_now, v_refilled);
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
    UPDATE team_buckets b SET tokens = v_tokens - admitted, refilled_at = v_refilled WHERE b.team_id = v_team.id;
END $$;
