"""The client's settings: the [client] table of a TOML file (--config FILE
or MINUTEHAND_CONFIG), MINUTEHAND_CLIENT_* environment variables, and the
flags of `minutehand submit|status|cancel|jobs`, read the way the worker
reads its own (minutehand.envconfig)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Annotated, ClassVar

from minutehand import envconfig
from minutehand.envconfig import LOG_LEVEL, Between


@dataclass(frozen=True)
class ClientSettings:
    CONFIG_SECTION: ClassVar[str] = "client"
    # The HTTP API's base URL and the team's token (`minutehand team create NAME`).
    client_url: str = "http://127.0.0.1:8080"
    client_token: str = ""
    # How long one request may take, and how many times a call is retried
    # after a 429, a 503 or a dropped connection before its error is raised.
    client_timeout_s: Annotated[float, Between(0.1, 3600)] = 30.0
    client_retries: Annotated[int, Between(0, 100)] = 5
    log_level: Annotated[str, LOG_LEVEL] = "WARNING"

    def __post_init__(self) -> None:
        envconfig.check(self)

    @classmethod
    def load(cls, argv: list[str] | None = None, env: dict[str, str] | None = None) -> ClientSettings:
        return envconfig.load(cls, argv, env)

    @classmethod
    def parser(cls, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        return envconfig.parser(cls, parser)
