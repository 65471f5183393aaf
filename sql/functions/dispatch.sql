-- Dispatchers: membership (the shards are divided between the live
-- members) and duty leases (sql/tables/dispatch.sql).

-- Renew a dispatcher's membership with what the quotas need from it (the
-- columns of sql/tables/dispatch.sql); the live members, each with what it
-- said.
CREATE OR REPLACE FUNCTION dispatcher_members(p_name text, p_ttl_s real, p_waiting int[], p_due int[],
                                              p_running_teams int[], p_running int[])
RETURNS TABLE (name text, waiting int[], due int[], running_teams int[], running int[])
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
#variable_conflict use_column
DECLARE v_now timestamptz := mh_now();
BEGIN
    INSERT INTO dispatchers AS d (name, expires_at, waiting, due, running_teams, running)
    VALUES (p_name, v_now + make_interval(secs => p_ttl_s), coalesce(p_waiting, '{}'), p_due,
            coalesce(p_running_teams, '{}'), coalesce(p_running, '{}'))
    ON CONFLICT (name) DO UPDATE SET expires_at = excluded.expires_at, waiting = excluded.waiting, due = excluded.due,
                                     running_teams = excluded.running_teams, running = excluded.running;
    -- Long-gone members are forgotten (the table stays as small as the fleet).
    DELETE FROM dispatchers d WHERE d.expires_at < v_now - interval '1 hour';
    RETURN QUERY SELECT d.name, d.waiting, d.due, d.running_teams, d.running
                   FROM dispatchers d WHERE d.expires_at > v_now ORDER BY d.name;
END $$;

CREATE OR REPLACE FUNCTION leave_dispatchers(p_name text) RETURNS void
LANGUAGE sql SET search_path = minutehand, pg_temp AS $$ DELETE FROM dispatchers WHERE name = p_name $$;

CREATE OR REPLACE FUNCTION take_duty_lease(p_duty text, p_owner text, p_ttl_s real) RETURNS boolean
LANGUAGE plpgsql SET search_path = minutehand, pg_temp AS $$
DECLARE
    v_now timestamptz := mh_now();
    v_got boolean;
BEGIN
    INSERT INTO duty_leases AS l (duty, owner, expires_at)
    VALUES (p_duty, p_owner, v_now + make_interval(secs => p_ttl_s))
    ON CONFLICT (duty) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
     WHERE l.owner = excluded.owner OR l.expires_at <= v_now
    RETURNING true INTO v_got;
    RETURN coalesce(v_got, false);
END $$;
