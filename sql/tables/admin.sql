-- The admin UI (app/minutehand/admin/): its sign-in sessions and its audit log. Both
-- are small control tables (reference tables on Citus): they are read by
-- primary key or by a short keyset walk, never with the jobs.

-- A browser signed in to /admin. The cookie holds a random session id; only
-- its sha256 is kept. token_hash is the hash of the token signed in with:
-- a team's session ends as soon as the team's token is rotated (the hash no
-- longer matches teams.token_hash), the admin's when the admin token
-- setting changes. csrf: the token every state-changing form of the session
-- must carry.
CREATE TABLE admin_sessions (
    id_hash     text        PRIMARY KEY,
    team_id     int,                          -- NULL: the admin
    token_hash  text        NOT NULL,
    csrf        text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX admin_sessions_expiry ON admin_sessions (expires_at);

-- Every action taken through the admin UI: who (the admin or a team, and
-- a reference to the token used: the first 12 hex digits of its sha256),
-- what (action and target, details as JSON), when, and whether the store
-- accepted it. team_id: the team the action concerned (NULL: the whole
-- fleet), which is what a team's own audit page shows.
CREATE TABLE admin_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor       text        NOT NULL,         -- 'admin', or the signed-in team's name
    token_ref   text        NOT NULL,
    team_id     int,
    action      text        NOT NULL,
    target      text        NOT NULL,
    ok          boolean     NOT NULL,
    detail      jsonb
);
-- A team's entries, newest first (keyset on id).
CREATE INDEX admin_audit_team ON admin_audit (team_id, id DESC);
