-- The job record and what hangs off it: teams, idempotency keys, claim
-- reminders, and the types the procedures return. The current definitions;
-- a database gets them by `minutehand migrate` (fresh) or through the
-- revisions in migrations/versions/ (tests/test_schema.py holds the two equal).
--
-- Citus-readiness: every table Citus would distribute carries `shard` in
-- every primary and unique key; `teams`, small and read everywhere, would be
-- a reference table.

CREATE TYPE job_state AS ENUM
    ('scheduled', 'claimed', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'discarded');

-- The sequence part of job ids (mh_new_id): 13 bits. No cache: a cached
-- block could outlive a whole cycle and repeat a value.
CREATE SEQUENCE job_id_seq CYCLE MINVALUE 0 MAXVALUE 8191;

-- Teams: a reference table on Citus. quota = max running jobs, weight = share.
CREATE TABLE teams (
    id          int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    quota       int  NOT NULL DEFAULT 1000 CHECK (quota > 0),
    weight      int  NOT NULL DEFAULT 1 CHECK (weight > 0),
    token_hash  text,                       -- sha256 hex of the bearer token
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Admission (sql/functions/admission.sql): submissions per second and
    -- the most at once (a token bucket; NULL: no rate limit), and the most
    -- jobs submitted and not finished (NULL: the server's setting).
    submit_rate  float8 CONSTRAINT teams_submit_rate_check CHECK (submit_rate > 0 AND submit_rate <= 1000000),
    submit_burst int CONSTRAINT teams_submit_burst_check CHECK (submit_burst > 0),
    max_pending  int CONSTRAINT teams_max_pending_check CHECK (max_pending > 0),
    -- seconds its finished jobs are kept (NULL: the server's job_retention_s)
    retention_s int CHECK (retention_s BETWEEN 1 AND 315360000),
    CONSTRAINT teams_submit_limit_check CHECK ((submit_rate IS NULL) = (submit_burst IS NULL))
);

-- The job record: one row per job, read by (shard, id) for status.
-- Not time-partitioned: a unique id would then need the partition key.
CREATE TABLE jobs (
    shard            smallint    NOT NULL,
    id               bigint      NOT NULL,
    team_id          int         NOT NULL,
    name             text        NOT NULL,
    payload          jsonb       NOT NULL,
    priority         smallint    NOT NULL,
    due_at           timestamptz NOT NULL,   -- requested due time
    flex_s           int         NOT NULL,   -- flex window the submitter allowed
    strict           boolean     NOT NULL,
    run_at           timestamptz NOT NULL,   -- assigned run time (retry time after a failure)
    state            job_state   NOT NULL,
    attempts         int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL,
    backoff_base_s   real        NOT NULL,
    backoff_cap_s    real        NOT NULL,
    claimed_by       text,
    claim_expires_at timestamptz,
    lease_token      uuid,
    idempotency_key  text,
    series_id        bigint,                 -- repeating jobs: a chain of ordinary jobs
    lateness         interval,               -- first start - agreed_at, once started
    result           jsonb,
    last_error       text,
    created_at       timestamptz NOT NULL,
    claimed_at       timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL,
    -- the run time agreed at submission (due + the spread chosen then, never
    -- before the submission): run_at moves with retries, this does not
    agreed_at        timestamptz NOT NULL,
    -- not claimed by then: dropped, cancelled by the claim (a run of a
    -- repeating job with misfire skip: its series' next fire time)
    deadline         timestamptz,
    -- when a dead job was last put back on the wheel (requeue_job)
    requeued_at      timestamptz,
    -- a cancel that reached the job while a worker held it (claimed, start
    -- not reported): it applies to that claim (at or after claimed_at)
    cancel_requested_at timestamptz,
    -- the W3C trace context (traceparent) the job was submitted under, when
    -- the submitter sent one: the worker's span of the handler is its child
    traceparent      text,
    PRIMARY KEY (shard, id)
) WITH (fillfactor = 30);
-- No index covers a column that claim, start, heartbeat, complete or fail
-- change (state, claim fields, result): those updates are HOT. A job's life
-- is two or three updates; fillfactor 30 leaves each page room for them even
-- while a long transaction keeps old versions from being pruned (measured:
-- at 70, a held snapshot turned 60% of the updates non-HOT and cost ~15% of
-- claim+complete throughput; at 30, none). Claim expiry is found through
-- claim_checks instead of an index.
-- A team's jobs, newest first (keyset pagination on id).
CREATE INDEX jobs_team_recent ON jobs (team_id, id DESC);
-- A repeating series cannot create the same run twice, whatever fails over.
CREATE UNIQUE INDEX jobs_series_run ON jobs (shard, series_id, due_at) WHERE series_id IS NOT NULL;

-- Reminders to look at claims when they would expire: one row per claim
-- call (up to its whole batch of jobs), not per job. expire_claims() reads
-- the due ones; a claim renewed by heartbeats is simply filed again.
CREATE TABLE claim_checks (
    shard    smallint    NOT NULL,
    check_at timestamptz NOT NULL,
    job_ids  bigint[]    NOT NULL
);
CREATE INDEX claim_checks_due ON claim_checks (shard, check_at);

-- Idempotency keys, colocated with their job (same shard), kept 24 h.
CREATE TABLE idempotency_keys (
    shard        smallint    NOT NULL,
    team_id      int         NOT NULL,
    key          text        NOT NULL,
    job_id       bigint      NOT NULL,
    request_hash text        NOT NULL,       -- the same key with another body is refused
    result       jsonb,                      -- stored on success, replayed to later runs
    completed_at timestamptz,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (shard, team_id, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (shard, expires_at);

-- What submit_jobs answers per item, and every outcome procedure per job.
CREATE TYPE submit_result AS (idx int, job_id bigint, run_at timestamptz, created boolean, error text);
CREATE TYPE outcome AS (job_id bigint, ok boolean, state job_state, reason text);
-- A validated job without a key, as submit_jobs hands it to mh_write_jobs.
CREATE TYPE new_job AS (shard smallint, id bigint, name text, payload jsonb, priority int, due_at timestamptz,
                        flex_s int, strict boolean, run_at timestamptz, max_attempts int, backoff_base_s real,
                        backoff_cap_s real, traceparent text);

-- Attempts that ended without success, one row each: the job's own record
-- keeps only its latest attempt (worker, claim, start, end, error), so a
-- retried or expired one would otherwise be known only by the attempt
-- count. Written by the transaction that ends the attempt (fail_many,
-- expire_claims), never on the way to success, so the hot path writes
-- nothing here; removed with the job (retention).
CREATE TABLE job_attempts (
    shard      smallint    NOT NULL,
    job_id     bigint      NOT NULL,
    attempt    int         NOT NULL,
    ended_at   timestamptz NOT NULL,
    worker     text,                      -- NULL: an expired claim (its error names the worker)
    claimed_at timestamptz,
    started_at timestamptz,
    outcome    job_state   NOT NULL,      -- what the end made the job: retrying, scheduled (expired), dead
    error      text,
    PRIMARY KEY (shard, job_id, attempt, ended_at)
);
