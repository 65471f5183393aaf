"""Every setting in one place: environment variables MINUTEHAND_<NAME>, or
the matching command-line flag --<name> (flags win)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import msgspec


@dataclass(frozen=True)
class Settings:
    # PostgreSQL URL. Empty: `minutehand dev` starts the embedded cluster.
    database_url: str = ""
    # Where `minutehand dev` keeps its embedded cluster.
    data_dir: Path = Path(".minutehand")
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    pool_size: int = 8
    # Dispatcher: shard lease and worker claim periods, in seconds.
    shard_lease_s: float = 10.0
    claim_lease_s: float = 30.0
    # This dispatcher's name in shard leases (empty: host:pid).
    dispatcher_name: str = ""
    # Most jobs claimed for workers in one round, and outcomes written per transaction.
    dispatch_batch: int = 500
    # Worker (`minutehand worker`): the dispatchers' base URLs (comma-separated),
    # the fleet token (`minutehand worker-token create NAME`), how many jobs run at
    # once, and how long SIGTERM waits for running jobs before giving up.
    worker_urls: str = "http://127.0.0.1:8080"
    worker_token: str = ""
    worker_concurrency: int = 10
    worker_grace_s: float = 30.0
    log_level: str = "INFO"
    # HTTP API. The admin token acts on every team and manages teams; it is
    # compared by hash, and empty means no admin access over HTTP.
    admin_token: str = ""
    # Largest request body for one job, and for a batch, in bytes (-> 413).
    # The job payload itself is limited in SQL (mh_payload_max_bytes, 256 KiB).
    api_max_body_bytes: int = 320 * 1024
    api_max_batch_body_bytes: int = 64 * 1024 * 1024
    api_max_batch: int = 10_000
    # How a request may arrive, enforced by the HTTP server before the app
    # sees it (app/api/limits.py): its request line and headers together at
    # most api_max_header_bytes (else 431 and the connection is closed); its
    # headers in full within api_header_timeout_s of its first byte, and its
    # body within api_body_timeout_s of its first byte (else 408 and closed).
    # A connection that has not begun a request is closed after
    # api_header_timeout_s too (after a response, uvicorn's 5 s keep-alive
    # applies first). The body deadline counts from the request's first byte
    # however the body arrives: it must cover the slowest legitimate client's
    # largest batch (api_max_batch_body_bytes).
    api_max_header_bytes: int = 64 * 1024
    api_header_timeout_s: float = 10.0
    api_body_timeout_s: float = 30.0
    # How long a token -> team lookup is remembered (a rotated token keeps
    # working for at most this long on other server processes).
    api_token_cache_s: float = 10.0
    # How long a request waits for a database connection before it answers
    # 503 (also how long a lost connection is retried before it is replaced
    # on demand), and the Retry-After a 503 suggests, in seconds.
    api_db_wait_s: float = 2.0
    api_retry_after_s: int = 5
    # Threads that send single submissions arriving together as one batch
    # call (app/api/coalesce.py); 0: one store call per request. Measured on
    # 2 cores: 1 and 2 are fastest; 2 keeps one slow batch (a key waiting on
    # another transaction) from holding every submission up.
    api_submit_workers: int = 2

    @classmethod
    def load(cls, argv: list[str] | None = None, env: dict[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(f"MINUTEHAND_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _convert(f, raw)
        if argv:
            flags, _ = cls.parser().parse_known_args(argv)
            values.update({k: _convert(_field(k), v) for k, v in vars(flags).items() if v is not None})
        return cls(**values)

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        """Add a --flag per setting (default None: unset flags leave env/defaults)."""
        parser = parser or argparse.ArgumentParser(add_help=False)
        for f in fields(cls):
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                                help=f"(env MINUTEHAND_{f.name.upper()}, default {f.default!s})")
        return parser


def _field(name: str) -> dataclasses.Field:
    return next(f for f in fields(Settings) if f.name == name)


def _convert(f: dataclasses.Field, raw: str):
    """The text of an environment variable or flag as the setting's declared
    type, by msgspec's lax conversion: "false" is False, "8" is 8, "1.5" a
    float; anything else is refused with the setting's name."""
    try:
        return msgspec.convert(raw, typing.get_type_hints(Settings)[f.name], strict=False,
                               dec_hook=lambda kind, value: Path(value) if kind is Path else value)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"setting {f.name}: {raw!r} is not a valid value ({exc})") from None


def sqlalchemy_url(database_url: str) -> str:
    """postgresql://... -> postgresql+psycopg://... (the driver we use)."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix):]
    return database_url
