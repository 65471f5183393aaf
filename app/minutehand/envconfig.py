"""Settings read, lowest precedence first, from a TOML configuration file
(--config FILE, else MINUTEHAND_CONFIG), MINUTEHAND_<NAME> environment
variables and --<name> flags, each converted to its field's declared type.
Shared by the server's Settings and the worker library's WorkerSettings: a
leaf that imports nothing of minutehand (the worker must not need the
server's code), and only the standard library's tomllib for the file.

A settings class is a frozen dataclass whose fields have defaults, and names
its table of the file in CONFIG_SECTION: one file serves every role,

    [server]                      # Settings: serve, dispatcher, migrate, ...
    database_url = "postgresql://minutehand@db/minutehand"
    [worker]                      # WorkerSettings: minutehand worker
    worker_concurrency = 20

each key a setting's name, as in its variable and its flag. A key, table
or value the class does not know stops the command with the key's name:
a misspelt setting would otherwise be a default silently in force.

A setting's allowed values are part of its type, `Annotated[int,
Between(1, 65535)]` or `Annotated[str, LOG_LEVEL]`, checked by check()
(each class's __post_init__): a value out of range stops the command with
the setting's name and its range, before anything starts with it (a lease
of nan seconds would start a dispatcher that never dispatches).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tomllib
import typing
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")

# The tables a configuration file may hold, one per settings class (its CONFIG_SECTION).
SECTIONS = ("server", "worker", "client")
CONFIG_ENV = "MINUTEHAND_CONFIG"


@dataclasses.dataclass(frozen=True)
class Between:
    """A number setting's range, both ends included; a float must be finite too."""
    low: float
    high: float
    note: str = ""                         # what the number counts, when its name does not say

    def problem(self, value: typing.Any, kind: type) -> str | None:
        whole = kind is int
        fits = (type(value) is int) if whole else (type(value) in (int, float) and math.isfinite(value))
        if fits and self.low <= value <= self.high:
            return None
        note = f" ({self.note})" if self.note else ""
        return f"{value!r} is not {'a whole number' if whole else 'a number'} from {self.low} to {self.high}{note}"


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A text setting's allowed values, in any case."""
    values: tuple[str, ...]

    def problem(self, value: typing.Any, kind: type) -> str | None:
        if isinstance(value, str) and value.upper() in self.values:
            return None
        return f"{value!r} is not one of {', '.join(self.values)}"


# What a log_level may name: the levels of logging that uvicorn knows too.
LOG_LEVEL = OneOf(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))


def check(settings: typing.Any) -> None:
    """ValueError naming the first setting whose value its type's Between or
    OneOf refuses, and what it may be."""
    for name, hint in typing.get_type_hints(type(settings), include_extras=True).items():
        for rule in getattr(hint, "__metadata__", ()):
            if isinstance(rule, (Between, OneOf)) and (reason := rule.problem(getattr(settings, name),
                                                                              hint.__origin__)):
                raise ValueError(f"setting {name}: {reason}")


def load(cls: type[T], argv: list[str] | None = None, env: typing.Mapping[str, str] | None = None) -> T:
    """cls built from the file (if one is named), then the environment
    (os.environ unless env), then argv's flags: each overrides the one before.
    A value its setting does not allow (check()) stops the command."""
    env = os.environ if env is None else env
    # No abbreviations: a command's own flag (`migrate --citus`) is not a
    # setting, and must not be read as the start of one (--citus-shard-count).
    flags = vars(parser(cls, argparse.ArgumentParser(add_help=False, allow_abbrev=False)).parse_known_args(argv or [])[0])
    config = flags.pop("config") or env.get(CONFIG_ENV)
    values = read_file(cls, Path(config)) if config else {}
    for name in (f.name for f in dataclasses.fields(cls)):
        raw = env.get(f"MINUTEHAND_{name.upper()}")
        if raw is not None:
            values[name] = convert(cls, name, raw)
    values.update({k: convert(cls, k, v) for k, v in flags.items() if v is not None})
    try:
        return cls(**values)
    except ValueError as exc:                  # __post_init__: said like the refusals above
        raise SystemExit(str(exc)) from None


def parser(cls: type, parser_: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add --config and a --flag per field (default None: unset flags leave
    the file's, env's or the default value)."""
    parser_ = parser_ or argparse.ArgumentParser(add_help=False)
    parser_.add_argument("--config", metavar="FILE", default=None,
                         help=f"a TOML file of settings, its [{cls.CONFIG_SECTION}] table "
                              f"(env {CONFIG_ENV}); variables and flags override it")
    for f in dataclasses.fields(cls):
        parser_.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                             help=f"(env MINUTEHAND_{f.name.upper()}, default {f.default!s})")
    return parser_


def read_file(cls: type, path: Path) -> dict[str, typing.Any]:
    """The values of the file's table for cls, each of its field's type.
    The other known tables are another role's, and left alone."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise SystemExit(f"config {path}: cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"config {path}: not valid TOML ({exc})") from None
    except RecursionError:                     # tomllib reads nested arrays and tables by recursion
        raise SystemExit(f"config {path}: arrays or tables nested too deeply to read (a setting is a "
                         "number, a text or true/false)") from None
    for key, value in doc.items():
        if key not in SECTIONS or not isinstance(value, dict):
            raise SystemExit(f"config {path}: unknown key {key!r} at the top level; settings go in the "
                             f"tables {', '.join(f'[{s}]' for s in SECTIONS)}")
    table = doc.get(cls.CONFIG_SECTION, {})
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in known:
            raise SystemExit(f"config {path}: [{cls.CONFIG_SECTION}] {key}: unknown setting "
                             f"(known: {', '.join(sorted(known))})")
        try:
            # Strict: a file has types of its own, so "8080" for a number is a mistake to report.
            values[key] = msgspec.convert(value, hints[key], strict=True, dec_hook=_path)
        except msgspec.ValidationError as exc:
            raise SystemExit(f"config {path}: [{cls.CONFIG_SECTION}] {key}: {value!r} is not a valid "
                             f"value ({exc})") from None
    return values


def convert(cls: type, name: str, raw: str):
    """The text of an environment variable or flag as the field's declared
    type, by msgspec's lax conversion: "false" is False, "8" is 8, "1.5" a
    float; anything else is refused with the setting's name."""
    try:
        return msgspec.convert(raw, typing.get_type_hints(cls)[name], strict=False, dec_hook=_path)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"setting {name}: {raw!r} is not a valid value ({exc})") from None


def _path(kind: type, value: typing.Any) -> typing.Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise TypeError(f"Expected a path as a string, got `{type(value).__name__}`")   # a ValidationError
