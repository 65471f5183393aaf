-- Revision 0012, frozen: retention of finished jobs. A team's own retention
-- (NULL: the server's), and per shard the walk's low-water mark and the
-- jobs it passed that are looked at again later.
ALTER TABLE teams ADD COLUMN retention_s int CHECK (retention_s BETWEEN 1 AND 315360000);
CREATE TABLE retention_marks (
    shard     smallint NOT NULL PRIMARY KEY,
    walked_to bigint   NOT NULL
);
CREATE TABLE retention_checks (
    shard    smallint    NOT NULL,
    job_id   bigint      NOT NULL,
    check_at timestamptz NOT NULL,
    PRIMARY KEY (shard, job_id)
);
CREATE INDEX retention_checks_due ON retention_checks (shard, check_at);
