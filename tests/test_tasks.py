"""Tasks shared by submitter and worker (minutehand.client.task,
Worker.handles), end to end with a real `minutehand serve`: a child process
that imports only the task module submits; the worker's handler receives
the payload as the task's type; a payload that does not decode fails its
job at once, not retried, with the reason; untyped handlers still work."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from minutehand.client import Client
from minutehand.worker import Job, Worker
from tests.support import running
from tests.invoice_tasks import Invoice, send_invoice
from tests.processes import ROOT, Server, wait_until

pytestmark = pytest.mark.processes

SUBMITTER = textwrap.dedent("""
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("litestar", "sqlalchemy", "psycopg", "alembic", "uvicorn"):
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, Blocked())
    import datetime as dt
    from minutehand.client import Client
    from tests.invoice_tasks import Invoice, send_invoice

    with Client(sys.argv[1], sys.argv[2]) as client:
        created = send_invoice.submit(client, Invoice(42, dt.date(2030, 1, 31), ["tea"]))
    assert not [m for m in sys.modules if m.startswith("minutehand.worker")], sorted(sys.modules)
    print(int(created.job_id))
""")


@pytest.fixture
def server(db_dsn, live_store) -> Iterator[Server]:
    s = Server(db_dsn, "--claim-lease-s", "30")
    yield s
    s.stop()


def test_a_typed_task_end_to_end(server, live_store, token):
    team_token = live_store.rotate_token("t")
    out = subprocess.run([sys.executable, "-c", SUBMITTER, server.url, team_token], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    typed_id = int(out.stdout)
    with Client(server.url, team_token) as client:
        bad_id = client.submit("send_invoice", {"number": "forty-two", "due": "2030-01-31"}).job_id
        plain_id = client.submit("plain", {"n": 1}).job_id
        with pytest.raises(TypeError, match="Invoice"):
            send_invoice.submit(client, {"number": 1})

        received: dict[int, object] = {}
        worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=4, grace_s=5)

        @worker.handles(send_invoice)
        def send(job: Job[Invoice]):
            received[job.id] = job.payload
            return {"sent": job.payload.number}

        @worker.job("plain")
        async def plain(job: Job):
            received[job.id] = job.payload
            return None

        assert send.__name__ == "send"                # the decorator gives back the function itself
        with running(worker):
            wait_until(lambda: {client.status(i).state for i in (typed_id, bad_id, plain_id)} <= {"succeeded", "dead"}
                       and len(received) == 2, 120, "the jobs to finish")
        assert received[typed_id] == Invoice(42, dt.date(2030, 1, 31), ["tea"])
        assert received[plain_id] == {"n": 1}
        assert client.status(typed_id).result == {"sent": 42}
        bad = client.status(bad_id)
        assert (bad.state, bad.attempts, bad.max_attempts) == ("dead", 1, 3)     # not retried
        assert "does not decode as Invoice" in bad.last_error and "$.number" in bad.last_error
        assert bad_id not in received


def test_an_async_handler_of_a_task(server, live_store, token):
    team_token = live_store.rotate_token("t")
    got = []
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=2, grace_s=5)

    @worker.handles(send_invoice)
    async def send(job: Job[Invoice]):
        got.append(job.payload)

    with Client(server.url, team_token) as client:
        send_invoice.submit_many(client, [Invoice(i, dt.date(2030, 1, 1)) for i in range(3)])
        with running(worker):
            wait_until(lambda: len(got) == 3, 120, "three invoices")
    assert sorted(i.number for i in got) == [0, 1, 2]
