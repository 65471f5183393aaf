-- Revision 0002, frozen: the series table, in schema public.
CREATE TABLE series (
    shard            smallint    NOT NULL,
    id               bigint      NOT NULL,   -- mh_new_id(shard): the shard is readable from it
    team_id          int         NOT NULL,
    -- what every run is made of
    name             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         smallint    NOT NULL,
    max_attempts     int         NOT NULL,
    backoff_base_s   real        NOT NULL,
    backoff_cap_s    real        NOT NULL,
    flex_s           int         NOT NULL,
    strict           boolean     NOT NULL,
    -- the repeat spec: every every_s seconds, or a 5-field crontab in an IANA zone
    every_s          int,
    cron             text,
    timezone         text,
    -- the key the series was submitted with; it names the first run only
    -- (later runs carry no key: a stored result must not be replayed to them)
    idempotency_key  text,
    first_due_at     timestamptz NOT NULL,   -- the first run's due time
    -- chain: the newest run created and its due time (run N+1 follows it)
    last_job_id      bigint      NOT NULL,
    last_due_at      timestamptz NOT NULL,
    cancelled_at     timestamptz,            -- chain: set, no further run is created
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (shard, id),
    CHECK ((every_s IS NULL) <> (cron IS NULL)),
    CHECK ((cron IS NULL) = (timezone IS NULL))
);
