"""`minutehand dev` (what ops/dev runs), end to end: the embedded cluster
started and migrated, the API answering, the demo workload running; a
second run reuses the cluster; SIGINT stops everything cleanly."""
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dev(data_dir: Path, port: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli.main", "dev", "--data-dir", str(data_dir),
                             "--http-port", str(port), "--rate", "50", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_dev_runs_the_demo_and_the_api_then_a_second_run_reuses_the_cluster(tmp_path):
    tmp_path.chmod(0o755)                        # when root, the cluster runs as `postgres`
    port = free_port()
    first = dev(tmp_path, port, "--seconds", "12")
    # the API comes up and takes a job with the printed token
    lines, token = [], None
    deadline = time.monotonic() + 60
    while token is None and time.monotonic() < deadline:
        line = first.stdout.readline()
        lines.append(line)
        if m := re.search(r"token: (mh_\S+)", line):
            token = m.group(1)
    assert token, "".join(lines)
    for _ in range(50):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/jobs", data=b'{"name": "hello"}',
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 201
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise AssertionError("the API never answered")
    out = "".join(lines) + first.communicate(timeout=60)[0]
    assert first.returncode == 0, out
    assert "succeeded" in out and "embedded PostgreSQL stopped" in out
    url = re.search(r"embedded PostgreSQL at (\S+)", out).group(1)

    # a second run finds the same cluster (same data, same port); SIGINT stops it cleanly
    second = dev(tmp_path, free_port())
    time.sleep(8)
    second.send_signal(signal.SIGINT)
    out2 = second.communicate(timeout=60)[0]
    assert second.returncode == 0, out2
    assert f"embedded PostgreSQL at {url}" in out2
    assert "stopping" in out2 and "embedded PostgreSQL stopped" in out2
    # as root the data may live elsewhere (app/localpg.py relocates it): remove it too
    shutil.rmtree((tmp_path / "pgdata").resolve().parent if (tmp_path / "pgdata").is_symlink() else tmp_path,
                  ignore_errors=True)
