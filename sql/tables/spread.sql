-- Spreading flexible jobs (sql/functions/spread.sql).
--
-- Planned jobs per run minute, approximate by design: every job placed adds
-- 1 to the minute of its run time, in the submission's own transaction, and
-- nothing ever subtracts (a job that is cancelled, retried or runs late
-- stays counted where it was planned). Placement only needs to know where
-- the planned load is low, not exact figures. Each team counts on rows of
-- its own: a submission inside a caller's transaction holds its rows until
-- that commits, and another team's submissions never wait for it. Striped
-- within a team (stripe = backend pid % 16) so its concurrent submitters
-- rarely update the same row; each batch adds to its rows with one upsert,
-- in key order. The key leads with the minute: placement reads a window's
-- minutes (each a range of the key, every team's rows summed) and
-- maintenance drops old ones by a range of it. Rows of minutes more than an
-- hour back are deleted by maintenance (purge_load).
CREATE TABLE load_minutes (
    minute   timestamptz NOT NULL,
    team_id  int         NOT NULL,
    stripe   smallint    NOT NULL,
    jobs     int         NOT NULL,
    PRIMARY KEY (minute, team_id, stripe)
);

-- Default flex windows: what a job submitted without flex_s (and not
-- strict) gets. team_id 0 is the operator's rule, for every team; a team's
-- own rule wins over it. job_name is a job name, or '' for the round-cron
-- rule: cron series whose minute field lists only 0, 15, 30 and 45 (and
-- which no rule of their name covers).
CREATE TABLE flex_defaults (
    team_id     int         NOT NULL CHECK (team_id >= 0),
    job_name    text        NOT NULL CHECK (job_name = '' OR job_name ~ '^[A-Za-z0-9_.:/-]{1,200}$'),
    flex_s      int         NOT NULL CHECK (flex_s BETWEEN 0 AND 86400),
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (team_id, job_name)
);
