"""The server's settings (serve, dispatcher, migrate, dev...): the [server]
table of a TOML file (--config FILE or MINUTEHAND_CONFIG), overridden by
environment variables MINUTEHAND_<NAME>, overridden by the matching
command-line flag --<name> (minutehand.envconfig). Every setting is shown
with its default in ops/minutehand.example.toml; each number has its range
and the log level its names (envconfig.Between, envconfig.OneOf), checked
before a command runs. The worker library's are in
app/minutehand/worker/settings.py."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from minutehand import envconfig
from minutehand.envconfig import LOG_LEVEL, Between

# teams.quota and teams.weight are int columns: the bounds the API documents.
TEAM_LIMIT_MIN, TEAM_LIMIT_MAX = 1, 2**31 - 1
# teams.submit_rate: jobs per second, above 0 and at most this.
SUBMIT_RATE_MAX = 1_000_000
# A retention (job_retention_s, a team's retention_s): 1 second to 10 years,
# as the CHECK on teams.retention_s.
RETENTION_MIN_S, RETENTION_MAX_S = 1, 315_360_000
TEAM_LIMIT = Between(TEAM_LIMIT_MIN, TEAM_LIMIT_MAX)


@dataclass(frozen=True)
class Settings:
    CONFIG_SECTION: ClassVar[str] = "server"        # its table in a configuration file
    # PostgreSQL URL. Empty: `minutehand dev` starts the embedded cluster.
    database_url: str = ""
    # Where `minutehand dev` keeps its embedded cluster.
    data_dir: Path = Path(".minutehand")
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, Between(1, 65535)] = 8080
    pool_size: Annotated[int, Between(1, 1000)] = 8
    # Dispatcher: shard lease and worker claim periods, in seconds.
    shard_lease_s: Annotated[float, Between(1, 3600)] = 10.0
    claim_lease_s: Annotated[float, Between(1, 86400)] = 30.0
    # Whether a round of claims waits for its commit to reach the disk. Off: a
    # database crash may undo the last moments of claims (at most three times
    # wal_writer_delay, 0.6 s by default): those jobs are due again, and run
    # again if a worker already had them (its reports are refused); never
    # lost, since the job was written durably when submitted and any later
    # durable commit (an outcome) flushes the claim with it. On: a claim
    # survives a crash, at one WAL flush per round.
    claim_synchronous_commit: bool = False
    # This dispatcher's name in shard leases (empty: host:pid).
    dispatcher_name: str = ""
    # Most jobs claimed for workers in one round, and outcomes written per transaction.
    dispatch_batch: Annotated[int, Between(1, 10_000)] = 500
    # Seconds a stopping serve or dispatcher (SIGTERM) gives HTTP requests in
    # flight before it cuts them (workers' long-polls are answered at once);
    # then its background parts stop, within a few seconds more.
    shutdown_grace_s: Annotated[float, Between(0, 3600)] = 10.0
    log_level: Annotated[str, LOG_LEVEL] = "INFO"
    # HTTP API. The admin token acts on every team and manages teams; it is
    # compared by hash, and empty means no admin access over HTTP.
    admin_token: str = ""
    # How long a sign-in to the admin UI (/admin) lasts, in seconds (a
    # rotated team token, or a changed admin_token, ends it at once).
    admin_session_s: Annotated[float, Between(60, 31_536_000)] = 12 * 3600
    # Largest request body for one job, and for a batch, in bytes (-> 413).
    # The job payload itself is limited in SQL (mh_payload_max_bytes, 256 KiB).
    api_max_body_bytes: Annotated[int, Between(1024, 2**31 - 1)] = 320 * 1024
    api_max_batch_body_bytes: Annotated[int, Between(1024, 2**31 - 1)] = 64 * 1024 * 1024
    api_max_batch: Annotated[int, Between(1, 100_000)] = 10_000
    # How a request may arrive, enforced by the HTTP server before the app
    # sees it (app/minutehand/api/limits.py): its request line and headers together at
    # most api_max_header_bytes (else 431 and the connection is closed); its
    # headers in full within api_header_timeout_s of its first byte, and its
    # body within api_body_timeout_s of its first byte (else 408 and closed).
    # A connection that has not begun a request is closed after
    # api_header_timeout_s too (after a response, uvicorn's 5 s keep-alive
    # applies first). The body deadline counts from the request's first byte
    # however the body arrives: it must cover the slowest legitimate client's
    # largest batch (api_max_batch_body_bytes).
    api_max_header_bytes: Annotated[int, Between(1024, 16 * 1024 * 1024)] = 64 * 1024
    api_header_timeout_s: Annotated[float, Between(0.1, 3600)] = 10.0
    api_body_timeout_s: Annotated[float, Between(0.1, 3600)] = 30.0
    # How long a token -> team lookup is remembered (a rotated token keeps
    # working for at most this long on other server processes).
    api_token_cache_s: Annotated[float, Between(0, 3600)] = 10.0
    # How long a request waits for a database connection before it answers
    # 503 (also how long a lost connection is retried before it is replaced
    # on demand), and the Retry-After a 503 suggests, in seconds.
    api_db_wait_s: Annotated[float, Between(0.1, 600)] = 2.0
    api_retry_after_s: Annotated[int, Between(0, 86400)] = 5
    # Threads that send single submissions arriving together as one batch
    # call (app/minutehand/api/coalesce.py); 0: one store call per request. Measured on
    # 2 cores: 1 and 2 are fastest; 2 keeps one slow batch (a key waiting on
    # another transaction) from holding every submission up.
    api_submit_workers: Annotated[int, Between(0, 64)] = 2
    # A new team's quota (most of its jobs running at once while other teams
    # have due work waiting) and weight (its share when teams compete), when
    # its creation names none.
    default_team_quota: Annotated[int, TEAM_LIMIT] = 1000
    default_team_weight: Annotated[int, TEAM_LIMIT] = 1
    # Admission control (app/minutehand/web/admission.py). A new team's submission rate
    # limit, when its creation names none: jobs per second (0: none) and the
    # most at once (0: one second's worth). The admin sets each team's own.
    default_team_submit_rate: Annotated[float, Between(0, SUBMIT_RATE_MAX, "jobs per second; 0: none")] = 0.0
    default_team_submit_burst: Annotated[int, Between(0, TEAM_LIMIT_MAX)] = 0
    # The most jobs a team may have submitted and not finished, for every
    # team without a max_pending of its own (0: no ceiling).
    max_pending_per_team: Annotated[int, Between(0, TEAM_LIMIT_MAX)] = 0
    # How long a server process remembers that a team has no admission limit
    # (a limit set through another process applies within this time).
    admission_cache_s: Annotated[float, Between(0, 3600)] = 5.0
    # Webhooks (docs/guides/dead-jobs.md): a POST's deadline (the whole request:
    # connecting, sending, the receiver's answer), the backoff after failed
    # attempts (a random wait in [d/2, d], d = min(cap, base * 2^(failures -
    # 1))), the most events per POST, how often the dispatcher holding the
    # `webhooks` duty looks for new events, and how many webhooks it POSTs to
    # at once (one POST per team at most).
    webhook_timeout_s: Annotated[float, Between(0.1, 3600)] = 10.0
    webhook_backoff_base_s: Annotated[float, Between(0.01, 86400)] = 1.0
    webhook_backoff_cap_s: Annotated[float, Between(0.01, 86400)] = 600.0
    webhook_batch: Annotated[int, Between(1, 10_000)] = 100
    webhook_every_s: Annotated[float, Between(0.01, 3600)] = 1.0
    webhook_concurrency: Annotated[int, Between(1, 256)] = 8
    # /metrics (docs/operations/metrics.md): how many job names of a team get a `name`
    # label of their own (the first seen, by volume; the rest are counted as
    # `(other)`; at most the 50 the counters keep apart), and how long what
    # it reads from the database is reused between scrapes, in seconds.
    metrics_names_per_team: Annotated[int, Between(0, 50)] = 50
    metrics_read_s: Annotated[float, Between(0, 3600)] = 10.0
    # How long a finished job (succeeded, dead, discarded, cancelled) is kept after it
    # finished, in seconds, unless its team has its own (teams.retention_s);
    # then the dispatcher's maintenance removes it and its status answers 404
    # "expired". Give every process the same value (the API reads it to tell
    # an expired job from an unknown id).
    job_retention_s: Annotated[int, Between(RETENTION_MIN_S, RETENTION_MAX_S, "seconds: 10 years")] = 7 * 86400
    # How often the dispatcher's maintenance removes expired jobs, in seconds
    # (each pass takes up to retention_batch jobs per shard it owns; passes
    # follow each other while a backlog lasts). A pass visits every shard it
    # owns, so it runs seldom and takes much.
    retention_every_s: Annotated[float, Between(0.1, 86400)] = 30.0
    retention_batch: Annotated[int, TEAM_LIMIT] = 2000
    # `minutehand migrate --citus`: Citus shards per distributed table when the
    # database is first distributed (ops/citus/README.md says how it was chosen;
    # a distributed database keeps its count).
    citus_shard_count: Annotated[int, Between(1, 64_000)] = 16

    def __post_init__(self) -> None:
        envconfig.check(self)
        if self.default_team_submit_burst and not self.default_team_submit_rate:
            raise ValueError("setting default_team_submit_burst: set default_team_submit_rate too")

    @classmethod
    def load(cls, argv: list[str] | None = None, env: dict[str, str] | None = None) -> Settings:
        return envconfig.load(cls, argv, env)

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        """Add a --flag per setting (default None: unset flags leave env/defaults)."""
        return envconfig.parser(cls, parser)


def sqlalchemy_url(database_url: str) -> str:
    """postgresql://... -> postgresql+psycopg://... (the driver we use)."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix):]
    return database_url
