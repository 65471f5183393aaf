"""Settings read from MINUTEHAND_<NAME> environment variables or --<name>
flags (flags win), each converted to its field's declared type. Shared by
the server's Settings and the worker library's WorkerSettings: a leaf that
imports nothing of minutehand (the worker must not need the server's code).

A settings class is a frozen dataclass whose fields have defaults.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")


def load(cls: type[T], argv: list[str] | None = None, env: typing.Mapping[str, str] | None = None) -> T:
    """cls built from the environment (os.environ unless env) and argv's flags."""
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for name in fields:
        raw = env.get(f"MINUTEHAND_{name.upper()}")
        if raw is not None:
            values[name] = convert(cls, name, raw)
    if argv:
        flags, _ = parser(cls).parse_known_args(argv)
        values.update({k: convert(cls, k, v) for k, v in vars(flags).items() if v is not None})
    return cls(**values)


def parser(cls: type, parser_: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add a --flag per field (default None: unset flags leave env/defaults)."""
    parser_ = parser_ or argparse.ArgumentParser(add_help=False)
    for f in dataclasses.fields(cls):
        parser_.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                             help=f"(env MINUTEHAND_{f.name.upper()}, default {f.default!s})")
    return parser_


def convert(cls: type, name: str, raw: str):
    """The text of an environment variable or flag as the field's declared
    type, by msgspec's lax conversion: "false" is False, "8" is 8, "1.5" a
    float; anything else is refused with the setting's name."""
    try:
        return msgspec.convert(raw, typing.get_type_hints(cls)[name], strict=False,
                               dec_hook=lambda kind, value: Path(value) if kind is Path else value)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"setting {name}: {raw!r} is not a valid value ({exc})") from None
