"""The configuration file (minutehand.envconfig): the example in ops/ names
every setting of both settings classes, read from the dataclasses (so a new
setting fails here until the example shows it) and nothing else, with its
default; a file's unknown keys, tables and ill-typed values stop the command
with the key's name; a value out of its setting's range (every number has
one, the log level its names) stops it with the setting's name and range,
never a traceback; and the order: file < environment < flags."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

from minutehand import envconfig
from minutehand.client.settings import ClientSettings
from minutehand.settings import Settings
from minutehand.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "ops" / "minutehand.example.toml"
CLASSES = (Settings, WorkerSettings, ClientSettings)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "minutehand.toml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the example file
def commented_out(section: str) -> set[str]:
    """Keys shown as `# key = value` in a table of the example: TOML has no
    null, so a setting whose default is None is shown that way."""
    keys, current = set(), None
    for line in EXAMPLE.read_text().splitlines():
        if m := re.match(r"^\[(\w+)\]", line):
            current = m[1]
        elif current == section and (m := re.match(r"^# (\w+) = ", line)):
            keys.add(m[1])
    return keys


def test_the_example_names_every_setting_and_nothing_else():
    doc = tomllib.loads(EXAMPLE.read_text())
    assert sorted(doc) == sorted(envconfig.SECTIONS) == sorted(c.CONFIG_SECTION for c in CLASSES)
    for cls in CLASSES:
        fields = {f.name for f in dataclasses.fields(cls)}
        nulls = {f.name for f in dataclasses.fields(cls) if f.default is None}
        shown = set(doc[cls.CONFIG_SECTION]) | (commented_out(cls.CONFIG_SECTION) & nulls)
        assert not fields - shown, f"settings missing from {EXAMPLE.name} [{cls.CONFIG_SECTION}]: " \
                                   f"{sorted(fields - shown)}"
        assert not shown - fields, f"{EXAMPLE.name} [{cls.CONFIG_SECTION}] names unknown settings: " \
                                   f"{sorted(shown - fields)}"


def test_the_example_shows_each_default_and_a_comment_above_it():
    for cls in CLASSES:
        assert cls.load(["--config", str(EXAMPLE)], env={}) == cls(), \
            f"a value in {EXAMPLE.name} [{cls.CONFIG_SECTION}] is not its setting's default"
    lines = EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            above = i - 1
            while above >= 0 and "=" in lines[above] and not lines[above].startswith("#"):
                above -= 1              # settings grouped under one comment (quota and weight)
            assert lines[above].startswith("#"), f"{EXAMPLE.name}:{i + 1} {line!r} has no comment above it"


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("text, message", [
    ('[server]\nhttp_prot = 9000\n', r"\[server\] http_prot: unknown setting"),
    ('[worker]\ndatabase_url = "postgresql://x"\n', r"\[worker\] database_url: unknown setting"),
    ('[server]\nhttp_port = "9000"\n', r"\[server\] http_port: '9000' is not a valid value \(Expected `int`"),
    ('[server]\nclaim_lease_s = true\n', r"\[server\] claim_lease_s: True is not a valid value"),
    ('[server]\ndata_dir = 5\n', r"\[server\] data_dir: 5 is not a valid value"),
    ('[server]\ndefault_team_quota = 0\n', r"setting default_team_quota: 0 is not a whole number from 1"),
    ('http_port = 9000\n', r"unknown key 'http_port' at the top level; settings go in the tables \[server\]"),
    ('[servers]\nhttp_port = 9000\n', r"unknown key 'servers' at the top level"),
    ('[server]\nhttp_port = \n', r"not valid TOML"),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    cls = WorkerSettings if text.startswith("[worker]") else Settings    # each role checks its own table
    with pytest.raises(SystemExit, match=message) as exc:
        cls.load(["--config", str(path)], env={})
    assert str(path) in str(exc.value) or "default_team_quota" in str(exc.value)


def test_a_missing_file_is_refused(tmp_path: Path):
    with pytest.raises(SystemExit, match=r"config .*nothere.toml: cannot be read \(No such file"):
        WorkerSettings.load([], env={"MINUTEHAND_CONFIG": str(tmp_path / "nothere.toml")})


def test_a_role_reads_its_own_table_and_leaves_the_others(tmp_path: Path):
    path = write(tmp_path, '[server]\nhttp_port = 9000\nlog_level = "DEBUG"\n'
                           '[worker]\nworker_concurrency = 3\nlog_level = "WARNING"\n')
    assert (Settings.load(["--config", str(path)], env={}).http_port,
            Settings.load(["--config", str(path)], env={}).log_level) == (9000, "DEBUG")
    w = WorkerSettings.load(["--config", str(path)], env={})
    assert (w.worker_concurrency, w.log_level) == (3, "WARNING")


# ---------------------------------------------------------------- precedence
def test_file_then_environment_then_flags(tmp_path: Path):
    path = write(tmp_path, '[server]\nhttp_port = 9001\npool_size = 3\nclaim_lease_s = 12\n'
                           'data_dir = "/srv/mh"\n[worker]\nworker_grace_s = 5\nworker_concurrency = 4\n')
    env = {"MINUTEHAND_CONFIG": str(path), "MINUTEHAND_POOL_SIZE": "5", "MINUTEHAND_HTTP_PORT": "9002",
           "MINUTEHAND_WORKER_CONCURRENCY": "6"}
    s = Settings.load(["--http-port", "9003"], env=env)
    # http_port: all three (the flag); pool_size: file and env (env); claim_lease_s: the file's, an int as float.
    assert (s.http_port, s.pool_size, s.claim_lease_s, s.data_dir) == (9003, 5, 12.0, Path("/srv/mh"))
    assert type(s.claim_lease_s) is float
    w = WorkerSettings.load(["--worker-grace-s", "7"], env=env)
    assert (w.worker_grace_s, w.worker_concurrency) == (7.0, 6)


def test_the_config_flag_overrides_the_config_variable(tmp_path: Path):
    env_file = tmp_path / "env.toml"
    env_file.write_text("[server]\nhttp_port = 1111\n")
    flag_file = write(tmp_path, "[server]\nhttp_port = 2222\n")
    assert Settings.load([], env={"MINUTEHAND_CONFIG": str(env_file)}).http_port == 1111
    assert Settings.load(["--config", str(flag_file)], env={"MINUTEHAND_CONFIG": str(env_file)}).http_port == 2222


def test_the_command_line_refuses_a_bad_file_with_the_key(tmp_path: Path):
    """Through `minutehand`: the message, not a traceback, and exit status 1."""
    path = write(tmp_path, "[server]\npool_size = 'eight'\n")
    got = subprocess.run([sys.executable, "-m", "minutehand.cli.main", "migrate", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got
    assert "[server] pool_size: 'eight' is not a valid value" in got.stderr and "Traceback" not in got.stderr
    path = write(tmp_path, "[worker]\nworker_concurency = 2\n")
    got = subprocess.run([sys.executable, "-m", "minutehand.cli.main", "worker", "x:worker", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and "[worker] worker_concurency: unknown setting" in got.stderr, got


def test_a_command_flag_is_not_read_as_the_start_of_a_setting():
    """`migrate --citus` is migrate's own flag, not --citus-shard-count abbreviated."""
    assert Settings.load(["--citus"], env={}).citus_shard_count == Settings().citus_shard_count
    assert Settings.load(["--citus", "--citus-shard-count", "4"], env={}).citus_shard_count == 4


# ---------------------------------------------------------------- ranges
def test_every_number_setting_has_a_range_and_the_log_level_its_names():
    for cls in CLASSES:
        for name, hint in typing.get_type_hints(cls, include_extras=True).items():
            rules = [r for r in getattr(hint, "__metadata__", ()) if isinstance(r, (envconfig.Between, envconfig.OneOf))]
            kind = getattr(hint, "__origin__", hint)
            if kind in (int, float) or name == "log_level":
                assert len(rules) == 1, f"{cls.__name__}.{name} has no range: add Annotated[..., Between(low, high)]"


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MINUTEHAND_")}
    return subprocess.run([sys.executable, "-m", "minutehand.cli.main", *argv], capture_output=True, text=True,
                          timeout=60, env={**environ, "MINUTEHAND_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x",
                                           **(env or {})})


# Each started a server that never dispatched (while /healthz said 200), or stopped in a traceback.
OUT_OF_RANGE = [
    ("claim_lease_s = nan", "setting claim_lease_s: nan is not a number from 1 to 86400"),
    ("shard_lease_s = 0", "setting shard_lease_s: 0.0 is not a number from 1 to 3600"),
    ("shard_lease_s = inf", "setting shard_lease_s: inf is not a number from 1 to 3600"),
    ("dispatch_batch = 0", "setting dispatch_batch: 0 is not a whole number from 1 to 10000"),
    ("http_port = 70000", "setting http_port: 70000 is not a whole number from 1 to 65535"),
    ("pool_size = 0", "setting pool_size: 0 is not a whole number from 1 to 1000"),
    ("log_level = 'NOPE'", "setting log_level: 'NOPE' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("webhook_concurrency = 0", "setting webhook_concurrency: 0 is not a whole number from 1 to 256"),
    ("api_db_wait_s = -inf", "setting api_db_wait_s: -inf is not a number from 0.1 to 600"),
    ("x = " + "[" * 2000 + "]" * 2000, "arrays or tables nested too deeply to read"),
]


@pytest.mark.parametrize("line, message", OUT_OF_RANGE, ids=[line[:24] for line, _ in OUT_OF_RANGE])
def test_a_setting_out_of_range_in_the_file_stops_serve_with_its_name_and_range(tmp_path: Path, line: str,
                                                                                  message: str):
    got = run_cli("serve", "--config", str(write(tmp_path, f"[server]\n{line}\n")))
    assert got.returncode == 1 and message in got.stderr, got
    assert "Traceback" not in got.stderr


@pytest.mark.parametrize("command, name, value, message", [
    ("serve", "SHARD_LEASE_S", "inf", "setting shard_lease_s: inf is not a number from 1 to 3600"),
    ("dispatcher", "CLAIM_LEASE_S", "nan", "setting claim_lease_s: nan is not a number from 1 to 86400"),
    ("serve", "LOG_LEVEL", "NOPE", "setting log_level: 'NOPE' is not one of DEBUG"),
    ("migrate", "POOL_SIZE", "0", "setting pool_size: 0 is not a whole number from 1 to 1000"),
    ("worker", "LOG_LEVEL", "chatty", "setting log_level: 'chatty' is not one of DEBUG"),
    ("worker", "WORKER_CONCURRENCY", "0", "setting worker_concurrency: 0 is not a whole number from 1 to 1000000"),
])
def test_a_setting_out_of_range_in_the_environment_stops_the_command(command: str, name: str, value: str,
                                                                     message: str):
    argv = [command, "tests.worker_apps:app"] if command == "worker" else [command]
    got = run_cli(*argv, env={f"MINUTEHAND_{name}": value})
    assert got.returncode == 1 and message in got.stderr, got
    assert "Traceback" not in got.stderr


def test_settings_made_in_code_are_range_checked_too():
    with pytest.raises(ValueError, match="setting claim_lease_s: nan is not a number from 1 to 86400"):
        Settings(claim_lease_s=float("nan"))
    with pytest.raises(ValueError, match="setting http_port: 8080.5 is not a whole number"):
        Settings(http_port=8080.5)
    with pytest.raises(ValueError, match="setting worker_grace_s: -1 is not a number from 0 to 86400"):
        WorkerSettings(worker_grace_s=-1)
    assert Settings(log_level="debug", claim_lease_s=1, shard_lease_s=3600).log_level == "debug"
