"""Real processes for end-to-end tests: `minutehand serve` / `minutehand
dispatcher` and `minutehand worker` as child processes on a test database,
each logging to a file (printed by the test on failure, see `logs`); and an
app served by uvicorn in a thread (`serving`). The fixtures those tests share
(`live_store`, `token`) are in tests/fixtures/stores.py."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from minutehand.dev.localpg import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_cluster(prefix: str, fsync: bool = True, **settings: str) -> Iterator[LocalCluster]:
    """A PostgreSQL cluster of the test's own (durable unless told), in a directory removed after it."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o755)
    c = LocalCluster(tmp / "pgdata", fsync=fsync, settings={"shared_buffers": "64MB", **settings})
    try:
        c.ensure_started()
        yield c
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def wait_until(check: Callable[[], object], timeout_s: float = 20.0, what: str = "condition",
               every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Process:
    """A child process with its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, label: str = "proc"):
        self.label = label
        self.log_path = Path(tempfile.mkstemp(prefix=f"mh-{label}-", suffix=".log")[1])
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 20) -> int:
        """SIGTERM (SIGCONT first, should it be stopped), then SIGKILL after timeout_s."""
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.proc.returncode

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


class Server(Process):
    """`minutehand serve` (API + dispatcher) or `minutehand dispatcher` on dsn."""

    def __init__(self, dsn: str, *extra: str, role: str = "serve", name: str | None = None,
                 port: int | None = None):
        self.port = port or free_port()              # a port: e.g. a restart where the workers expect it
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name or f"{role}-{self.port}"
        super().__init__([sys.executable, "-m", "minutehand.cli.main", role, "--database-url", dsn,
                          "--http-port", str(self.port), "--dispatcher-name", self.name, *extra],
                         label=self.name)
        wait_until(self.ready, 60, f"{self.name} to answer /healthz")

    def ready(self) -> bool:
        assert self.alive(), f"{self.name} exited:\n{self.output()}"
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False


class WorkerProcess(Process):
    """`minutehand worker tests.worker_apps:<app>` against the given dispatchers."""

    def __init__(self, app: str, urls: list[str], token: str, *, concurrency: int = 10,
                 env: dict[str, str] | None = None, label: str = "worker"):
        super().__init__([sys.executable, "-m", "minutehand.cli.main", "worker", f"tests.worker_apps:{app}",
                          "--worker-urls", ",".join(urls), "--worker-token", token,
                          "--worker-concurrency", str(concurrency)], env=env, label=label)


def logs(*procs: Process, tail: int = 60) -> str:
    """The last lines of each process's log, for an assertion message."""
    parts = []
    for p in procs:
        lines = p.output().splitlines()[-tail:]
        parts.append(f"--- {p.label} (pid {p.pid}) ---\n" + "\n".join(lines))
    return "\n".join(parts)


@contextmanager
def serving(app, join_s: float = 10) -> Iterator[str]:
    """An ASGI app served by uvicorn in a thread of this process on
    127.0.0.1 (lifespan on); yields its base URL, stops it on exit."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, 20, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(join_s)

