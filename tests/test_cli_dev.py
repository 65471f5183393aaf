"""`minutehand dev` (what ops/dev runs), end to end: the embedded cluster
started and migrated, the API answering, the demo workload running; a
second run reuses the cluster, reports and cancels what the first left
unstarted, and a worker of the user's own runs a job with what dev printed;
SIGINT to its process group stops everything cleanly even when SIGINT was
ignored at start (a background job of a script). Whatever happens, the
test's processes are killed and its cluster stopped and removed."""
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from minutehand.dev.localpg import LocalCluster

pytestmark = pytest.mark.processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process in a process group of its own, its output collected by a thread."""

    def __init__(self, argv: list[str], **kwargs):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, **kwargs)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._eof = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def _take(self, timeout: float) -> str | None:
        line = self._queue.get(timeout=timeout)
        if line is None:
            self._eof.set()
        else:
            self.lines.append(line)
        return line

    def expect(self, pattern: str, timeout: float = 90) -> re.Match:
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if m := re.search(pattern, line):
                return m
        while not self._eof.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                line = self._take(left)
            except queue.Empty:
                break
            if line is not None and (m := re.search(pattern, line)):
                return m
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.output}")

    def finish(self, timeout: float = 90) -> int:
        """Wait for the exit and the end of the output; the exit code."""
        rc = self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + 10
        while not self._eof.is_set() and time.monotonic() < deadline:
            try:
                self._take(deadline - time.monotonic())
            except queue.Empty:
                break
        return rc

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def kill_group(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def dev(data_dir: Path, port: int, *args: str, sigint_ignored: bool = False) -> Proc:
    argv = [sys.executable, "-m", "minutehand.cli.main", "dev", "--data-dir", str(data_dir),
            "--http-port", str(port), "--rate", "50", *args]
    if sigint_ignored:                  # as a background job of a script starts it: SIGINT set to SIG_IGN
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    return Proc(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def http(method: str, url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, json.loads(resp.read())


def submit_when_up(port: int, token: str, name: str) -> str:
    for _ in range(100):
        try:
            status, body = http("POST", f"http://127.0.0.1:{port}/v1/jobs", token, {"name": name})
            assert status == 201
            return body["job_id"]
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the API never answered")


def sign_in_to_admin(admin_url: str, token: str) -> str:
    """Sign in to the admin UI as a browser would (cookies, the form's CSRF
    token); the page it lands on, with a marker of who is signed in."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    with opener.open(admin_url, timeout=5) as resp:                   # redirected to the sign-in page
        page = resp.read().decode()
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"csrf": csrf, "token": token, "next": "/admin/audit"}).encode()
    with opener.open(admin_url + "signin", data=form, timeout=5) as resp:
        landed = resp.read().decode()
    return "Signed in as admin" if ">admin</span>" in landed and "sign-in" in landed else landed


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


USER_WORKER = """\
from minutehand.worker import Worker

worker = Worker()


@worker.job("hello")
def hello(job):
    return {"hello": "from the user's worker"}
"""


def test_dev_runs_the_demo_and_the_api_then_a_second_run_reuses_the_cluster(tmp_path):
    tmp_path.chmod(0o755)                        # when root, the cluster runs as `postgres`
    procs: list[Proc] = []
    try:
        # first run: the API takes a job with the printed token; the demo runs; it stops by itself
        port = free_port()
        first = dev(tmp_path, port, "--seconds", "12")
        procs.append(first)
        token = first.expect(r"token: (mh_\S+)").group(1)
        admin_url, admin_token = first.expect(r"admin UI at (\S+) : sign in with the admin token (mha_\S+)").groups()
        submit_when_up(port, token, "hello")     # nobody handles "hello": it stays, and is not the demo's
        assert admin_url == f"http://127.0.0.1:{port}/admin/"
        assert "Signed in as admin" in sign_in_to_admin(admin_url, admin_token)
        assert first.finish() == 0, first.output
        out = first.output
        assert "succeeded" in out and "embedded PostgreSQL stopped" in out, out
        url = re.search(r"embedded PostgreSQL at (\S+)", out).group(1)
        assert not listening(port), "serve outlived minutehand dev"

        # second run, started with SIGINT ignored: same cluster (same data, same port)
        port2 = free_port()
        second = dev(tmp_path, port2, sigint_ignored=True)
        procs.append(second)
        second.expect(re.escape(f"embedded PostgreSQL at {url}"))
        # the first run's unstarted demo jobs due soon (demo.soon, within a minute) are its backlog:
        # reported and cancelled; those due days ahead (demo.later) are reported and kept
        left = second.expect(r"left from a previous run: ([\d,]+) unstarted demo jobs due by now .*, ([\d,]+) due later")
        backlog, later = (int(g.replace(",", "")) for g in left.groups())
        assert backlog > 0 and later > 0
        assert second.expect(r"cancelled ([\d,]+) of the ([\d,]+) due ones").groups() == (f"{backlog:,}",) * 2
        second.expect(rf"kept the {later:,} due later")
        token2 = second.expect(r"token: (mh_\S+)").group(1)
        env = {k: second.expect(rf"export {k}=(\S+)").group(1)
               for k in ("MINUTEHAND_DATABASE_URL", "MINUTEHAND_WORKER_URLS", "MINUTEHAND_WORKER_TOKEN")}
        assert env["MINUTEHAND_DATABASE_URL"] == url
        assert env["MINUTEHAND_WORKER_URLS"] == f"http://127.0.0.1:{port2}"
        command = shlex.split(second.expect(r"^\s+(\S+minutehand worker mymodule:worker)$").group(1))
        second.expect(r"demo: team 'demo'")

        # the user's own worker, from its module's folder, with what dev printed, runs a job
        (tmp_path / "mymodule.py").write_text(USER_WORKER)
        user = Proc(command, cwd=tmp_path, env={**os.environ, **env})
        procs.append(user)
        job_id = submit_when_up(port2, token2, "hello")
        deadline = time.monotonic() + 30
        while (state := http("GET", f"http://127.0.0.1:{port2}/v1/jobs/{job_id}", token2)[1]["state"]) != "succeeded":
            assert time.monotonic() < deadline, f"job {state}; worker:\n{user.output}"
            time.sleep(0.2)
        user.proc.send_signal(signal.SIGTERM)
        assert user.finish() == 0, user.output

        # SIGINT to the process group (a Ctrl-C, or a script stopping its background job) stops it all
        second.expect(r"submitted [\d,]+; ")
        os.killpg(second.proc.pid, signal.SIGINT)
        assert second.finish() == 0, second.output
        out2 = second.output
        assert "stopping (SIGINT)" in out2 and "embedded PostgreSQL stopped" in out2, out2
        assert not listening(port2), "serve outlived minutehand dev"
    finally:
        for p in procs:
            p.kill_group()
        cluster = LocalCluster(tmp_path / "pgdata")
        if cluster.running():
            cluster.stop()
        # as root the data may live elsewhere (app/minutehand/dev/localpg.py relocates it): remove it too
        pgdata = tmp_path / "pgdata"
        shutil.rmtree(pgdata.resolve().parent if pgdata.is_symlink() else pgdata, ignore_errors=True)
