"""A team's pending ceiling under concurrent submissions over HTTP, against a
real `minutehand serve`: batches, and single requests (coalesced by the
server's submit threads), sent at once cannot together pass the ceiling —
the check and the write share one transaction under the team's lock — and
each refusal is a 429 that wrote nothing. The ceiling's read-only
behaviour (counts, messages) is in tests/test_admission.py."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import psycopg
import pytest

from tests.processes import Server, logs

pytestmark = pytest.mark.processes


@pytest.fixture
def team(db_dsn, live_store) -> str:
    """Team t's token; t may have 50 jobs pending (set before the server reads it)."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("UPDATE teams SET max_pending = 50 WHERE name = 't'")
    return live_store.rotate_token("t")


@pytest.fixture
def server(db_dsn, team):
    s = Server(db_dsn)
    yield s
    s.stop()


def post(server: Server, path: str, body, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def all_at_once(n: int, send) -> list[tuple[int, dict]]:
    """send(i) from n threads released together; the answers in order."""
    answers: list = [None] * n
    go = threading.Barrier(n)

    def one(i: int) -> None:
        go.wait()
        answers[i] = send(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return answers


def pending_and_jobs(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as c:
        return c.execute("""SELECT (SELECT coalesce(sum(pending), 0) FROM team_pending),
                                   (SELECT count(*) FROM jobs)""").fetchone()


def test_concurrent_batches_cannot_pass_the_ceiling_together(db_dsn, server, team):
    """10 batches of 40 at once against a ceiling of 50: one fits, and once
    it is counted no other does (the bound: 0 over). Without the lock, each
    was checked against the count the others had not committed: 400 pending."""
    answers = all_at_once(10, lambda i: post(server, "/v1/jobs/batch",
                                             {"jobs": [{"name": "job", "payload": {"b": i, "i": k}}
                                                       for k in range(40)]}, team))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] + [429] * 9, (answers, logs(server))
    assert next(body for status, body in answers if status == 200)["created"] == 40
    for status, body in answers:
        if status == 429:
            assert body["type"] == "/problems/pending-ceiling" and body["ceiling"] == 50, body
    assert pending_and_jobs(db_dsn) == (40, 40)


def test_concurrent_single_submissions_fill_the_ceiling_exactly(db_dsn, server, team):
    """60 single requests at once against a ceiling of 50: exactly 50 are
    written, each other one is refused alone."""
    answers = all_at_once(60, lambda i: post(server, "/v1/jobs", {"name": "job", "payload": {"i": i}}, team))
    statuses = [status for status, _ in answers]
    assert sorted(statuses) == [201] * 50 + [429] * 10, (answers, logs(server))
    assert all(body["type"] == "/problems/pending-ceiling" for status, body in answers if status == 429)
    assert pending_and_jobs(db_dsn) == (50, 50)
