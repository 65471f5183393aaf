-- Revision 0003, frozen: worker tokens, dispatcher membership, duty leases,
-- in schema public.
CREATE TABLE worker_tokens (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    token_hash  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dispatchers (
    name        text PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);

CREATE TABLE duty_leases (
    duty        text PRIMARY KEY,
    owner       text NOT NULL,
    expires_at  timestamptz NOT NULL
);
