"""The documentation's commands do what it says: every shell and Python block
of the quickstart and the guides (and the configuration page's) either runs
here, against a real server, or is marked `<!-- illustrative -->` on the
line before its fence (a command that runs for good, or code that needs
more than the page gives it).

The shell blocks of RUN_PAGES run in one bash session, in that order, as a
reader pastes them: the first page's block migrates a fresh database and
starts `minutehand serve` in the background, the others reuse it and its
variables. Only addresses are replaced (the example URL, port 8080), and
curl fails on an HTTP error status (a doc whose request is refused fails).
Then the quickstart's worker module runs a job through that server."""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port

DOCS = ROOT / "docs"
CHECKED = ("tutorials", "guides")
RUN_PAGES = ("guides/submitting.md", "guides/repeating.md", "guides/teams.md", "guides/dead-jobs.md",
             "operations/configuration.md")
ILLUSTRATIVE = "<!-- illustrative -->"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    illustrative: bool


def blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip().rpartition("\n")[2].strip()
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                         before == ILLUSTRATIVE))
    return out


def runnable(block: Block) -> bool:
    return block.lang in ("sh", "bash", "python") and not block.illustrative


# Python blocks this module runs, by page and first line.
PYTHON_RUN = {("tutorials/quickstart.md", "from minutehand.worker import Worker"),
              ("guides/dead-jobs.md", "import hashlib, hmac")}
# Pages whose every Python block tests/test_guides.py runs.
PYTHON_PAGES_RUN = {"guides/submitting-from-python.md"}


def _python_block(page: str, first_line: str) -> str:
    (found,) = [b.text for b in blocks(page) if b.lang == "python" and b.text.startswith(first_line)]
    return found


@pytest.mark.unit
def test_every_block_of_the_quickstart_and_the_guides_runs_here_or_says_it_is_illustrative():
    pages = sorted(str(p.relative_to(DOCS)) for d in CHECKED for p in (DOCS / d).glob("*.md"))
    unrun = [f"{b.page}:{b.line} ({b.lang})" for page in pages for b in blocks(page) if runnable(b)
             and not (b.lang in ("sh", "bash") and b.page in RUN_PAGES)
             and (b.page, b.text.partition("\n")[0]) not in PYTHON_RUN
             and not (b.lang == "python" and b.page in PYTHON_PAGES_RUN)]
    assert not unrun, f"run these in tests/test_docs.py or mark them {ILLUSTRATIVE}: {unrun}"


@pytest.mark.unit
def test_the_webhook_signature_check_accepts_a_signed_body_and_refuses_another():
    scope: dict = {}
    exec(_python_block("guides/dead-jobs.md", "import hashlib, hmac"), scope)
    body = b'{"team": "billing", "events": []}'
    header = "sha256=" + hmac.new(b"s" * 32, body, hashlib.sha256).hexdigest()
    assert scope["verified"]("s" * 32, body, header)
    assert not scope["verified"]("s" * 32, body + b" ", header)


EPILOGUE = """
# The quickstart's worker, on the server the pages started.
export MINUTEHAND_WORKER_URLS=http://127.0.0.1:{port}
export MINUTEHAND_WORKER_TOKEN=$(minutehand worker-token create docs | tail -n 1)
minutehand worker mymodule:worker > worker.log 2>&1 &
HELLO=$(curl -s -X POST localhost:8080/v1/jobs -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \\
        -d '{{"name": "hello", "payload": "docs"}}' |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["job_id"])')
for _ in $(seq 120); do
    STATE=$(curl -s localhost:8080/v1/jobs/$HELLO -H "Authorization: Bearer $TOKEN" |
            python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["state"], json.dumps(j["result"]))')
    [ "${{STATE%% *}}" = succeeded ] && break
    sleep 0.5
done
echo "hello: $STATE"
"""


@pytest.mark.processes
def test_the_pages_commands_run_against_a_real_server(pg_server, tmp_path):
    name = f"mh_docs_{os.getpid()}_{secrets.token_hex(4)}"
    port = free_port()
    script = ["set -euo pipefail",
              # What a reader sees of a refused request: its body, and the paste stops there.
              'curl() { command curl --fail-with-body "$@"; }',
              "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT"]
    for page in RUN_PAGES:
        for b in blocks(page):
            if runnable(b) and b.lang in ("sh", "bash"):
                script += [f"echo '### {b.page}:{b.line}'", b.text]
    script.append(EPILOGUE.format(port=port))
    text = "\n".join(script)
    worker_module = _python_block("tutorials/quickstart.md", "from minutehand.worker import Worker")
    (tmp_path / "mymodule.py").write_text(worker_module)
    with pg_server.janitor(name):
        text = (text.replace("postgresql://user@host/db", pg_server.dsn(name, search_path=False))
                    .replace("localhost:8080", f"127.0.0.1:{port}"))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MINUTEHAND_")},
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MINUTEHAND_HTTP_PORT": str(port),
               "PYTHONUNBUFFERED": "1"}
        done = subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert 'hello: succeeded {"hello": "docs"}' in done.stdout, out[-6000:]
