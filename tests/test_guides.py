"""Every Python example of docs/guides/ runs, against a real `minutehand
serve`: a block tagged `python file=NAME.py` is written as that file (a
module the others import; worker.py is started as a worker process), and
the plain `python` blocks run in order, as one script, with the client's
settings in the environment and DATABASE_URL naming the database (a block
marked illustrative, as tests/test_docs.py knows them, is left out)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ROOT, Process, Server

pytestmark = pytest.mark.processes

GUIDE = ROOT / "docs" / "guides" / "submitting-from-python.md"
BLOCK = re.compile(r"^```python( file=(?P<file>[\w.]+))?\n(?P<code>.*?)^```$", re.S | re.M)


def blocks(path: Path) -> tuple[dict[str, str], list[str]]:
    """The page's file blocks by name and its script blocks in order; a block
    marked `<!-- illustrative -->` on the line before its fence is neither
    (tests/test_docs.py)."""
    files, script = {}, []
    text = path.read_text()
    for m in BLOCK.finditer(text):
        if text[:m.start()].endswith("<!-- illustrative -->\n"):
            continue
        if m["file"]:
            files[m["file"]] = m["code"]
        else:
            script.append(m["code"])
    return files, script


def test_the_guide_has_examples_of_each_kind():
    files, script = blocks(GUIDE)
    assert {"invoices.py", "worker.py"} <= files.keys() and len(script) >= 6


def test_every_example_of_submitting_from_python_runs(db_dsn, live_store, tmp_path):
    files, script = blocks(GUIDE)
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    (tmp_path / "guide.py").write_text("\n\n".join(f"# ---- example {i}\n{code}" for i, code in enumerate(script)))
    team_token = live_store.create_team("billing", quota=1000)
    worker_token = live_store.create_worker_token("guide")
    server = Server(db_dsn)
    env = {**os.environ, "MINUTEHAND_CLIENT_URL": server.url, "MINUTEHAND_CLIENT_TOKEN": team_token,
           "MINUTEHAND_WORKER_URLS": server.url, "MINUTEHAND_WORKER_TOKEN": worker_token,
           "DATABASE_URL": db_dsn, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "app")])}
    worker = Process([sys.executable, str(tmp_path / "worker.py")], env=env, label="guide-worker")
    try:
        out = subprocess.run([sys.executable, str(tmp_path / "guide.py")], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr + "\n" + worker.output()[-3000:]
        assert "succeeded {'sent': 42, 'lines': 2}" in out.stdout
        assert "12000 1" in out.stdout
    finally:
        worker.stop()
        server.stop()

    def count(name: str) -> int:
        return len(live_store.list_jobs("billing", name=name, limit=500).jobs)

    # the transaction examples: what committed is there, what rolled back is not
    assert (count("confirm_order"), count("reserve_stock"), count("never_runs"), count("send_invoice")) == (2, 2, 0, 2)
