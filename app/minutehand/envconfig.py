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
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")

# The tables a configuration file may hold, one per settings class (its CONFIG_SECTION).
SECTIONS = ("server", "worker")
CONFIG_ENV = "MINUTEHAND_CONFIG"


def load(cls: type[T], argv: list[str] | None = None, env: typing.Mapping[str, str] | None = None) -> T:
    """cls built from the file (if one is named), then the environment
    (os.environ unless env), then argv's flags: each overrides the one before."""
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
    return cls(**values)


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
