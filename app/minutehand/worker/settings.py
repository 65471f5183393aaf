"""The worker library's settings: the [worker] table of a TOML file (--config
FILE or MINUTEHAND_CONFIG), MINUTEHAND_WORKER_* environment variables, the
matching flags of `minutehand worker` (each overrides the one before), read
and range-checked the way the server reads its own (minutehand.envconfig),
without the server's code."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Annotated, ClassVar

from minutehand import envconfig
from minutehand.envconfig import LOG_LEVEL, Between


@dataclass(frozen=True)
class WorkerSettings:
    CONFIG_SECTION: ClassVar[str] = "worker"        # its table in a configuration file
    # The dispatchers' base URLs (comma-separated), the fleet token (`minutehand
    # worker-token create NAME`), how many jobs run at once, and how long
    # SIGTERM waits for running jobs before giving up. An async handler's job
    # holds a slot, not a thread: tens of thousands of sleeping jobs are
    # ordinary (the sustained benchmark runs 50,000 a process).
    worker_urls: str = "http://127.0.0.1:8080"
    worker_token: str = ""
    worker_concurrency: Annotated[int, Between(1, 1_000_000)] = 10
    worker_grace_s: Annotated[float, Between(0, 86400)] = 30.0
    # Serve this worker's Prometheus metrics (docs/operations/metrics.md) on
    # worker_metrics_host:worker_metrics_port; port 0: no metrics server.
    worker_metrics_port: Annotated[int, Between(0, 65535)] = 0
    worker_metrics_host: str = "127.0.0.1"
    log_level: Annotated[str, LOG_LEVEL] = "INFO"

    def __post_init__(self) -> None:
        envconfig.check(self)

    @classmethod
    def load(cls, argv: list[str] | None = None, env: dict[str, str] | None = None) -> WorkerSettings:
        return envconfig.load(cls, argv, env)

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        return envconfig.parser(cls, parser)
