"""The Python client (app/minutehand/client/) against a real `minutehand
serve`: every method, every kind of refusal as its exception class,
retries after 503 and 429 (Retry-After honoured) through a front server
that refuses first, a submit whose connection dropped after the server
took it (one job, not two), chunking past the server's batch limit, the
async client, and the `minutehand submit|status|cancel|jobs` commands."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from minutehand import client as mh
from minutehand.client import AsyncClient, Client, Repeat, SeriesRepeat, job
from minutehand.worker import Job, NonRetryable, Worker
from tests.client_support import Front, Team
from tests.support import running
from tests.processes import ROOT, Server, free_port, wait_until

pytestmark = pytest.mark.processes


@pytest.fixture
def team(live_store) -> Team:
    return Team("t", live_store.rotate_token("t"))


@pytest.fixture
def server(db_dsn, live_store) -> Iterator[Server]:
    s = Server(db_dsn, "--claim-lease-s", "30", "--api-max-batch", "5")
    yield s
    s.stop()


@pytest.fixture
def client(server, team) -> Iterator[Client]:
    with Client(server.url, team.token, retries=2) as c:
        yield c


def count(store, name: str) -> int:
    return len(store.list_jobs("t", name=name, limit=500).jobs)


def test_submit_status_list_and_cancel(client, live_store):
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    created = client.submit("report", {"to": "ops"}, due_at=later, priority=5, max_attempts=2)
    assert created.created and isinstance(created.job_id, int) and created.run_at >= later
    status = client.status(created.job_id)
    assert (status.name, status.state, status.priority, status.max_attempts) == ("report", "scheduled", 5, 2)
    assert status.idempotency_key.startswith("mh-auto:")          # made for the retries
    ids = [client.submit("listed", {"i": i}, due_at=later).job_id for i in range(5)]
    listed = [j.job_id for j in client.jobs(name="listed", page_size=2)]   # three pages
    assert listed == sorted(ids, reverse=True)
    assert client.cancel(created.job_id).state == "cancelled"
    assert client.status(created.job_id).state == "cancelled"
    with Client(client.url, client.token, auto_keys=False) as plain:
        assert plain.status(plain.submit("unkeyed").job_id).idempotency_key is None


def test_series_create_show_list_pause_resume_change_cancel(client):
    created = client.create_series("tick", Repeat(every_s=3600), {"n": 1})
    assert created.series_id is not None
    shown = client.get_series(created.series_id)
    assert (shown.name, shown.state, shown.repeat.every_s, shown.payload) == ("tick", "active", 3600, {"n": 1})
    assert [s.series_id for s in client.list_series()] == [created.series_id]
    assert client.pause_series(created.series_id).state == "paused"
    assert client.resume_series(created.series_id).state == "active"
    changed = client.change_series(created.series_id, SeriesRepeat(cron="0 9 * * *", timezone="Europe/Berlin"))
    assert changed.changed
    assert client.get_series(created.series_id).repeat.cron == "0 9 * * *"
    assert client.cancel_series(created.series_id).state == "cancelled"
    assert not client.cancel_series(created.series_id).changed


def test_dead_jobs_requeue_discard_events_and_stats(client, server, token):
    worker = Worker(urls=[server.url], token=token, wait_s=1, concurrency=4, grace_s=5)

    @worker.job("doomed")
    def doomed(job: Job):
        raise NonRetryable(f"no ({job.payload['i']})")

    ids = [client.submit("doomed", {"i": i}, max_attempts=1).job_id for i in range(4)]
    with running(worker):
        wait_until(lambda: all(client.status(i).state == "dead" for i in ids), 120, "the jobs to die")
    assert sorted(j.job_id for j in client.dead_jobs(name="doomed")) == sorted(ids)
    assert client.requeue(ids[0], max_attempts=2).state == "scheduled"
    assert client.discard(ids[1]).state == "discarded"
    assert client.discard_dead("doomed", limit=1).discarded == 1
    requeued = client.requeue_dead("doomed")
    assert (requeued.requeued, requeued.more) == (1, False)
    events = list(client.events())
    assert sorted(e.job_id for e in events) == sorted(ids) and {e.kind for e in events} == {"dead"}
    pages = list(client.event_pages())
    assert pages[-1].events == [] and list(client.events(after=pages[-1].next_cursor)) == []
    stats = client.team_stats(window_s=3600)
    assert stats.team == "t" and stats.total.submitted >= 4 and stats.total.dead >= 4


def test_each_refusal_is_its_own_exception_with_the_problem_fields(client, server, live_store, team):
    with pytest.raises(mh.NotFound) as nf:
        client.status(123456789)
    assert nf.value.status == 404 and nf.value.type.endswith("/not-found") and nf.value.detail
    assert nf.value.extra["job_id"] == "123456789"
    with pytest.raises(mh.Invalid) as bad:
        client.submit("no spaces allowed")
    assert bad.value.status == 422 and "name" in bad.value.detail
    with pytest.raises(mh.TooLarge):
        client.submit("big", {"blob": "x" * 300_000})
    with pytest.raises(mh.Conflict):
        client.submit("keyed", {"a": 1}, idempotency_key="k-1")
        client.submit("keyed", {"a": 2}, idempotency_key="k-1")
    waiting = client.submit("waiting").job_id
    with pytest.raises(mh.NotDead) as nd:
        client.requeue(waiting)
    assert nd.value.status == 409
    client.cancel(waiting)
    with pytest.raises(mh.NotCancellable) as nc:
        client.cancel(waiting)
    assert nc.value.extra["state"] == "cancelled" and isinstance(nc.value, mh.Conflict)
    with pytest.raises(mh.Malformed):
        list(client.jobs(page_size=0))
    with pytest.raises(mh.NotFound):
        client.team_stats(team="nobody")
    with Client(server.url, "mh_wrong", retries=0) as wrong, pytest.raises(mh.Unauthorized):
        wrong.submit("x")
    with Client(f"http://127.0.0.1:{free_port()}", team.token, retries=1) as away, pytest.raises(mh.Unavailable):
        away.status(1)


def test_admission_limits_are_overloaded_errors_and_a_rate_limit_is_waited_out(db_dsn, live_store):
    rated = Team("rated", live_store.create_team("rated", submit_rate=1, submit_burst=1))
    full = Team("full", live_store.create_team("full", max_pending=1))
    s = Server(db_dsn)
    try:
        with Client(s.url, rated.token, retries=0) as c:
            c.submit("a")
            with pytest.raises(mh.RateLimited) as rl:
                c.submit("b")
            assert isinstance(rl.value, mh.Overloaded) and rl.value.retry_after_s >= 1
        with Client(s.url, rated.token, retries=5) as c:
            begun = time.monotonic()
            for _ in range(2):
                c.submit("c")                       # each waits for its token, as Retry-After said
            assert time.monotonic() - begun >= 1.0
        with Client(s.url, full.token, retries=5) as c:
            c.submit("a")
            with pytest.raises(mh.PendingCeiling) as pc:
                c.submit("b")                       # no Retry-After: not waited for
            assert pc.value.extra["ceiling"] == 1
    finally:
        s.stop()
    assert count(live_store, "c") == 0              # another team's names: none of t's


def test_503_and_429_with_retry_after_are_retried(server, team, live_store):
    plan = {1: ("refuse", 503, {"Retry-After": "1"}), 2: ("refuse", 429, {"Retry-After": "1"}),
            3: ("refuse", 503, {})}
    with Front(server.url, lambda m, p, n: plan.get(n)) as front, Client(front.url, team.token, retries=3) as c:
        begun = time.monotonic()
        created = c.submit("patient")
        assert time.monotonic() - begun >= 2.0      # both Retry-After waits
        assert [a for _, _, a in front.seen] == [plan[1], plan[2], plan[3], None]
        assert c.status(created.job_id).state in ("scheduled", "claimed", "running")
    with Front(server.url, lambda m, p, n: ("refuse", 503, {"Retry-After": "0"})) as front, \
            Client(front.url, team.token, retries=2) as c, pytest.raises(mh.Unavailable):
        c.submit("never")
    assert len(front.seen) == 3 and count(live_store, "never") == 0


def test_a_submit_whose_answer_was_lost_is_retried_into_the_same_job(server, team, live_store):
    def drop_first_submit(method, path, n):
        return ("drop",) if (method, path) == ("POST", "/v1/jobs") and n == 1 else None

    with Front(server.url, drop_first_submit) as front, Client(front.url, team.token, retries=2) as c:
        created = c.submit("once", {"x": 1})
        assert not created.created                  # the first attempt made it
        assert [a for _, _, a in front.seen] == [("drop",), None]
    assert [j.job_id for j in live_store.list_jobs("t", name="once").jobs] == [created.job_id]

    def drop_first_batch(method, path, n):
        return ("drop",) if path == "/v1/jobs/batch" and n == 1 else None

    with Front(server.url, drop_first_batch) as front, Client(front.url, team.token, retries=2) as c:
        out = c.submit_many([job("once-many", {"i": i}) for i in range(3)])
        assert (out.created, out.existing) == (0, 3)
    assert count(live_store, "once-many") == 3

    with Front(server.url, lambda m, p, n: ("drop",) if m == "DELETE" else None) as front, \
            Client(front.url, team.token, retries=2) as c:
        with pytest.raises(mh.Unavailable):         # a cancel is not sent twice
            c.cancel(created.job_id)
        assert len(front.seen) == 1


def test_submit_many_is_chunked_to_the_servers_batch_limit(server, team, live_store):
    requests = []
    transport = httpx.HTTPTransport()

    class Counting(httpx.BaseTransport):
        def handle_request(self, request):
            requests.append(request.url.path)
            return transport.handle_request(request)

    with Client(server.url, team.token, transport=Counting()) as c:
        items = [job("chunked", {"i": i}) for i in range(12)] + [job("bad name", {})]
        out = c.submit_many(items)
    assert (out.created, out.rejected) == (12, 1)
    assert [it.idx for it in out.items] == list(range(13)) and out.items[12].error
    assert requests == ["/v1/jobs/batch"] * 4      # refused (413, max_items 5), then 5 + 5 + 3
    assert count(live_store, "chunked") == 12


def test_the_async_client(server, team, live_store):
    async def main():
        async with AsyncClient(server.url, team.token) as c:
            created = await c.submit("async", {"a": 1})
            assert (await c.status(created.job_id)).name == "async"
            out = await c.submit_many([job("async", {"i": i}) for i in range(7)])
            assert out.created == 7
            listed = [j.job_id async for j in c.jobs(name="async", page_size=3)]
            assert len(listed) == 8 and created.job_id in listed
            assert (await c.cancel(created.job_id)).state == "cancelled"
            series = await c.create_series("async-tick", Repeat(every_s=60))
            assert (await c.pause_series(series.series_id)).state == "paused"
            assert [s.series_id async for s in c.list_series()] == [series.series_id]
            assert [e async for e in c.events()] == []
            with pytest.raises(mh.NotFound):
                await c.status(1)
            return (await c.team_stats()).total.submitted

    assert asyncio.run(main()) >= 9


def test_settings_come_from_the_environment_and_a_file(tmp_path, server, team):
    env = {"MINUTEHAND_CLIENT_URL": server.url, "MINUTEHAND_CLIENT_TOKEN": team.token}
    with Client(settings=mh.ClientSettings.load([], env)) as c:
        assert c.submit("from-env").created
    config = tmp_path / "mh.toml"
    config.write_text(f'[client]\nclient_url = "{server.url}"\nclient_token = "{team.token}"\nclient_retries = 1\n')
    settings = mh.ClientSettings.load([], {"MINUTEHAND_CONFIG": str(config)})
    assert (settings.client_url, settings.client_retries) == (server.url, 1)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minutehand.cli.main", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


def test_the_submit_status_cancel_and_jobs_commands(server, team):
    env = {"MINUTEHAND_CLIENT_URL": server.url, "MINUTEHAND_CLIENT_TOKEN": team.token}
    tomorrow = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).replace(microsecond=0)
    out = cli("submit", "cli-job", "--payload", '{"n": 1}', "--due-at", tomorrow.isoformat(), env=env)
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert created["created"] and dt.datetime.fromisoformat(created["run_at"]) == tomorrow
    status = json.loads(cli("status", created["job_id"], env=env).stdout)
    assert (status["name"], status["state"], status["job_id"]) == ("cli-job", "scheduled", created["job_id"])
    out = cli("submit", "cli-job", "--count", "3", "--due-at", tomorrow.isoformat(), env=env)
    assert json.loads(out.stdout)["created"] == 3, out.stderr
    lines = cli("jobs", "--name", "cli-job", "--limit", "10", env=env).stdout.splitlines()
    assert len(lines) == 4 and {json.loads(line)["name"] for line in lines} == {"cli-job"}
    assert json.loads(cli("cancel", created["job_id"], env=env).stdout)["state"] == "cancelled"
    again = cli("cancel", created["job_id"], env=env)
    assert again.returncode == 1 and "409" in again.stderr and "cancelled" in again.stderr
    refused = cli("submit", "x", "--client-token", "mh_wrong", env=env)
    assert refused.returncode == 1 and "401" in refused.stderr
