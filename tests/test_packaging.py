"""The built wheel is the whole server: built from the sdist of this checkout, installed
with its `server` extra into a throwaway virtualenv outside the tree, and
run from a folder that is no checkout, it migrates a fresh database, serves
the API (its explorer's files included) and runs a job on a worker of a
module written there. Nothing is downloaded but the build backend (from
pip's cache after the first run): the virtualenv sees the
dependencies of ours (.venv's site-packages, by a path in a .pth file, which
does not pull in .venv's editable install) and pip runs with --no-index."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port, wait_until

pytestmark = pytest.mark.processes

WORKER_MODULE = '''
from minutehand.worker import Worker

worker = Worker()

@worker.job("wheel.hello")
def hello(job):
    return {"hello": job.payload}
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # From a copy of what the Dockerfile copies: setuptools reuses a build/
    # folder, so a wheel built in the tree could carry files deleted since.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("app", "sql", "migrations"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # The sdist first, then the wheel from it, as a user's pip builds one.
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
                   check=True, capture_output=True, timeout=300, cwd=src)
    (sdist,) = out.glob("minutehand[-_]scheduler-*.tar.gz")
    with tarfile.open(sdist) as tar:
        inside = {name.partition("/")[2] for name in tar.getnames()}
    assert {"sql/tables/jobs.sql", "sql/__init__.py", "migrations/env.py",
            "app/minutehand/admin/templates/base.html"} <= inside
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "--disable-pip-version-check", "-w", str(out), str(sdist)],
                   check=True, capture_output=True, timeout=300, cwd=out)
    (built,) = out.glob("minutehand_scheduler-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The virtualenv's bin folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", purelib],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "ours-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--disable-pip-version-check", f"{wheel}[server]"],
                   check=True, capture_output=True, timeout=300, cwd=venv)
    return venv / "bin"


def test_the_wheel_carries_the_sql_the_revisions_and_the_ui(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"minutehand/sql/{p.relative_to(ROOT / 'sql')}" for p in (ROOT / "sql").rglob("*.sql")}
    expected |= {f"minutehand/migrations/{p.relative_to(ROOT / 'migrations')}"
                 for p in (ROOT / "migrations").rglob("*") if p.suffix in (".py", ".sql")}
    admin = ROOT / "app" / "minutehand" / "admin"
    expected |= {f"minutehand/admin/{p.relative_to(admin)}"
                 for d in ("templates", "static") for p in (admin / d).iterdir()}
    expected |= {"minutehand/api/swagger/swagger-ui-bundle.js", "minutehand/api/swagger/swagger-ui.css"}
    assert expected <= names, sorted(expected - names)
    assert not [n for n in names if n.startswith(("tests/", "ops/", "docs/"))]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:                          # not listening yet
        return 0, b""


def test_migrate_serve_and_a_worker_run_a_job_from_the_installed_wheel(installed, pg_server, tmp_path):
    name = f"mh_wheel_{os.getpid()}_{secrets.token_hex(4)}"
    work = tmp_path / "somewhere"            # no checkout: nothing to find sql/ or migrations/ in
    work.mkdir()
    (work / "hellojobs.py").write_text(textwrap.dedent(WORKER_MODULE))
    port = free_port()
    with pg_server.janitor(name):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MINUTEHAND_")},
               "MINUTEHAND_DATABASE_URL": pg_server.dsn(name, search_path=False), "PYTHONUNBUFFERED": "1",
               "MINUTEHAND_HTTP_PORT": str(port), "MINUTEHAND_ADMIN_TOKEN": secrets.token_hex(24)}

        def run(*argv: str) -> str:
            done = subprocess.run([str(installed / "minutehand"), *argv], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        where = subprocess.run([str(installed / "python"), "-c",
                                "import minutehand.sql; print(minutehand.sql.__file__)"],
                               cwd=work, env=env, capture_output=True, text=True, check=True).stdout
        assert str(installed.parent) in where and str(ROOT) not in where, where
        version = run("--version").split()[1]
        run("migrate")
        token = run("team", "create", "wheel").splitlines()[-1]
        worker_token = run("worker-token", "create", "wheel").splitlines()[-1]
        logs = [open(work / f"{role}.log", "w") for role in ("serve", "worker")]
        serve = subprocess.Popen([str(installed / "minutehand"), "serve"], cwd=work, env=env, stdout=logs[0],
                                 stderr=subprocess.STDOUT)
        worker = subprocess.Popen([str(installed / "minutehand"), "worker", "hellojobs:worker"], cwd=work,
                                  env={**env, "MINUTEHAND_WORKER_URLS": f"http://127.0.0.1:{port}",
                                       "MINUTEHAND_WORKER_TOKEN": worker_token},
                                  stdout=logs[1], stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _get(base + "/readyz")[0] == 200, 90, "serve to be ready")
            ready = json.loads(_get(base + "/readyz")[1])
            assert ready["version"] == version
            assert json.loads(_get(base + "/schema/openapi.json")[1])["info"]["version"] == version
            page = _get(base + "/schema/swagger")[1].decode()
            assert "cdn." not in page and "/schema-assets/swagger/swagger-ui-bundle.js" in page
            assert _get(base + "/schema-assets/swagger/swagger-ui-bundle.js")[0] == 200
            req = urllib.request.Request(base + "/v1/jobs", method="POST",
                                         data=json.dumps({"name": "wheel.hello", "payload": 42}).encode(),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                job_id = json.loads(resp.read())["job_id"]

            def finished():
                status = json.loads(_get(f"{base}/v1/jobs/{job_id}", token)[1])
                return status if status["state"] in ("succeeded", "dead") else None
            status = wait_until(finished, 90, "the job to finish", every_s=0.2)
            assert status["state"] == "succeeded" and status["result"] == {"hello": 42}, status
        finally:
            for proc in (worker, serve):
                proc.terminate()
            for proc in (worker, serve):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for f in logs:
                f.close()
