-- Dispatchers and workers: who may lease work, which dispatchers are alive
-- (the shards are divided between them), and global duties under a lease row.

-- Worker credentials: only a worker may lease, heartbeat or complete jobs.
-- Only the sha256 of a token is kept (a reference table on Citus).
CREATE TABLE worker_tokens (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    token_hash  text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Each dispatcher renews its row as often as its shard leases; the live
-- rows are the members the shards are divided between. A member that stops
-- renewing drops out when its row expires, together with its leases. With
-- each renewal it says what the quotas need from it: which teams wait on
-- its shards with headroom (while any does, the others lend no capacity
-- past a quota), which teams have due rows there (NULL: not read yet, so
-- any), and how many jobs of each team run from there (running[i] of
-- running_teams[i]). Each team's quota is divided between the dispatchers
-- where it has due rows.
CREATE TABLE dispatchers (
    name           text PRIMARY KEY,
    expires_at     timestamptz NOT NULL,
    waiting        int[] NOT NULL DEFAULT '{}',
    due            int[],
    running_teams  int[] NOT NULL DEFAULT '{}',
    running        int[] NOT NULL DEFAULT '{}'
);

-- A duty for the whole wheel (cascade, sweep) runs in one dispatcher at a
-- time: the holder of this row until it expires. A row, not an advisory
-- lock: advisory locks are per node on Citus and vanish with a connection.
CREATE TABLE duty_leases (
    duty        text PRIMARY KEY,
    owner       text NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- Jobs claimed and not yet finished, per shard and team: what a team's
-- quota is measured against. Kept in the transactions that change it (the
-- claim adds, every way out of claimed/running subtracts), so it survives a
-- crash exactly; one row per (shard, team), so no single row is hot.
CREATE TABLE team_running (
    shard    smallint NOT NULL,
    team_id  int      NOT NULL,
    running  int      NOT NULL,
    PRIMARY KEY (shard, team_id)
);
