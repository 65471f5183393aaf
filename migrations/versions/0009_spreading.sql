-- Revision 0009, frozen: planned jobs per run minute (where flexible jobs
-- are placed) and default flex windows per team and job name.
CREATE TABLE load_minutes (
    minute  timestamptz NOT NULL,
    stripe  smallint    NOT NULL,
    jobs    int         NOT NULL,
    PRIMARY KEY (minute, stripe)
);
CREATE TABLE flex_defaults (
    team_id     int         NOT NULL CHECK (team_id >= 0),
    job_name    text        NOT NULL CHECK (job_name = '' OR job_name ~ '^[A-Za-z0-9_.:/-]{1,200}$'),
    flex_s      int         NOT NULL CHECK (flex_s BETWEEN 0 AND 86400),
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (team_id, job_name)
);
