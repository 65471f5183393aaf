-- Revision 0013, frozen: the admin UI's sign-in sessions and audit log.
CREATE TABLE admin_sessions (
    id_hash     text        PRIMARY KEY,
    team_id     int,
    token_hash  text        NOT NULL,
    csrf        text        NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX admin_sessions_expiry ON admin_sessions (expires_at);
CREATE TABLE admin_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor       text        NOT NULL,
    token_ref   text        NOT NULL,
    team_id     int,
    action      text        NOT NULL,
    target      text        NOT NULL,
    ok          boolean     NOT NULL,
    detail      jsonb
);
CREATE INDEX admin_audit_team ON admin_audit (team_id, id DESC);
