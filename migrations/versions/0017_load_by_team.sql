-- Revision 0017, frozen: the planned load counted per team as well as per
-- minute and stripe, so that no submission waits on a row another team's
-- open transaction holds. The table is made again, its columns in key
-- order; the counts made before it are kept under team 0 (no team).
ALTER TABLE load_minutes RENAME TO load_minutes_0016;
ALTER TABLE load_minutes_0016 RENAME CONSTRAINT load_minutes_pkey TO load_minutes_0016_pkey;
CREATE TABLE load_minutes (
    minute   timestamptz NOT NULL,
    team_id  int         NOT NULL,
    stripe   smallint    NOT NULL,
    jobs     int         NOT NULL,
    PRIMARY KEY (minute, team_id, stripe)
);
INSERT INTO load_minutes (minute, team_id, stripe, jobs)
SELECT o.minute, 0, o.stripe, o.jobs FROM load_minutes_0016 o;
DROP TABLE load_minutes_0016;
