"""Webhooks against a real PostgreSQL and a real HTTP receiver on
127.0.0.1: a team's events (its dead jobs) are POSTed to its webhook,
signed (HMAC-SHA256 of the body, header Minutehand-Signature), retried with
exponential backoff after a 500 and after a timeout until a 2xx, each
attempt recorded; a slow receiver (trickling its answer, never answering,
or answering a huge body) delays only its own team's events; the admin API
that sets them, with its refusals; and a
`minutehand dispatcher` process SIGKILLed while its deliverer waits for the
receiver's answer: after a restart the event is delivered (at least once,
nothing lost)."""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from litestar.testing import TestClient

from minutehand.maintenance.schedule import MaintenanceSchedule
from minutehand.maintenance.webhooks import SIGNATURE_HEADER, WebhookDeliverer, sign
from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.outcomes import Fail
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.processes import Server, logs, wait_until
from tests.support import T0, claim as claim_shards, make_store

S = dt.timedelta(seconds=1)
SECRET = "a-secret-of-32-characters-length"
ADMIN = "admin-secret-token"
TOKENS = {"t": "tok-team-t", "u": "tok-team-u"}
T = {"Authorization": f"Bearer {TOKENS['t']}"}
U = {"Authorization": f"Bearer {TOKENS['u']}"}
A = {"Authorization": f"Bearer {ADMIN}"}


# ---------------------------------------------------------------- a receiver on 127.0.0.1
HUGE = 200 * 2 ** 20                   # bytes of the "huge" answer's body
TRICKLE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


class Receiver:
    """An HTTP server in threads of this process. Each POST takes the next
    answer of `script` (then `then`): an int is a status code; "stall" holds
    the request until `release` is set (or stall_s passes) and answers 200;
    "trickle" sends a 200 answer one byte every 2 s; "huge" answers 200 with
    a body of HUGE bytes. `cut` is set when the deliverer closed the
    connection before a trickled or huge answer was all sent, `sent` counts
    the huge body's bytes sent."""

    def __init__(self, script: list, then: int | str = 200, stall_s: float = 60.0):
        self.script, self.then, self.stall_s = list(script), then, stall_s
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.cut = threading.Event()
        self.sent = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    answer = receiver.script.pop(0) if receiver.script else receiver.then
                if answer in ("trickle", "huge"):
                    self.close_connection = True
                    try:
                        self.send_slowly() if answer == "trickle" else self.send_huge()
                    except OSError:
                        receiver.cut.set()
                    return
                if answer == "stall":
                    receiver.release.wait(receiver.stall_s)
                    answer = 200
                try:
                    self.send_response(answer)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:                     # the deliverer went away meanwhile
                    pass

            def send_slowly(self):
                for i in range(len(TRICKLE)):
                    if receiver.release.wait(2.0):
                        return
                    self.wfile.write(TRICKLE[i:i + 1])

            def send_huge(self):
                self.send_response(200)
                self.send_header("Content-Length", str(HUGE))
                self.end_headers()
                piece = b"x" * 65536
                while receiver.sent < HUGE:
                    self.wfile.write(piece)
                    receiver.sent += len(piece)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/minutehand"

    def bodies(self) -> list[dict]:
        with self.lock:
            return [json.loads(b) for _, b in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


@contextmanager
def receiving(script: list, **kw) -> Iterator[Receiver]:
    r = Receiver(script, **kw)
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.release.set()
        r.server.shutdown()
        r.server.server_close()


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does: HMAC-SHA256 of the raw body under the secret,
    compared in constant time with the header's hex digest."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get(SIGNATURE_HEADER.lower(), ""))


# ---------------------------------------------------------------- helpers
def dead_job(store: Store, team: str = "t", name: str = "job", owner: str = "test") -> int:
    job_id = store.submit(team, JobSpec(name=name, max_attempts=1)).job_id
    leases = store.take_leases([job_id & 1023], owner, 3600)
    [c] = [c for c in claim_shards(store, leases, 100, owner).jobs if c.job_id == job_id]
    assert store.fail([Fail(job_id, c.lease_token, "boom")])[0].state == "dead"
    store.release_leases(leases, owner)
    # An event goes out once every transaction begun before it has ended (so
    # none commits an older event after it): on Citus the fixtures' clone of
    # the next test's database is such a transaction, for seconds.
    wait_until(lambda: deliverable(store, team), what=f"team {team}'s event to be deliverable")
    return job_id


def deliverable(store: Store, team: str) -> bool:
    with store.connection() as conn:
        return conn.execute("SELECT EXISTS (SELECT FROM teams t, mh_events_after(t.id, '0'::xid8, 0, 1) "
                            "WHERE t.name = %s) AS ok", (team,)).fetchone()["ok"]


@pytest.fixture
def pinned(db_dsn) -> Iterator[Store]:
    s = make_store(db_dsn)                              # clock pinned to T0
    s.create_team("t")
    s.create_team("u")
    yield s
    s.close()


@contextmanager
def deliverer(store: Store, **kw) -> Iterator[WebhookDeliverer]:
    d = WebhookDeliverer(store, **{"timeout_s": 0.5, "backoff_base_s": 1.0, "backoff_cap_s": 8.0, **kw})
    d.start()
    try:
        yield d
    finally:
        d.stop()


# ---------------------------------------------------------------- delivery
def test_signature_is_hmac_sha256_of_the_body():
    body = b'{"team":"t","events":[]}'
    assert sign("k" * 16, body) == "sha256=" + hmac.new(b"k" * 16, body, hashlib.sha256).hexdigest()
    assert verify("k" * 16, {SIGNATURE_HEADER.lower(): sign("k" * 16, body)}, body)
    assert not verify("k" * 16, {SIGNATURE_HEADER.lower(): sign("k" * 16, body)}, body + b" ")


def test_a_500_and_a_timeout_are_retried_with_backoff_until_a_2xx(pinned):
    job_id = dead_job(pinned)
    with receiving([500, "stall"], stall_s=2.0) as receiver, deliverer(pinned) as d:
        pinned.set_webhook("t", receiver.url, SECRET)
        assert d.deliver() == 0                         # 500
        hook = pinned.webhook("t")
        assert hook.failures == 1 and T0 + 0.5 * S <= hook.next_attempt_at <= T0 + 1 * S   # [d/2, d], d = 1 s
        pinned.clock = hook.next_attempt_at - 0.01 * S
        assert d.deliver() == 0 and receiver.count() == 1   # backing off: not tried again yet

        failed_at = pinned.clock = hook.next_attempt_at
        assert d.deliver() == 0                         # no answer within 0.5 s
        hook = pinned.webhook("t")
        assert hook.failures == 2 and failed_at + 1 * S <= hook.next_attempt_at <= failed_at + 2 * S   # d = 2 s
        pinned.clock = hook.next_attempt_at - 0.01 * S
        assert d.deliver() == 0 and receiver.count() == 2

        pinned.clock = hook.next_attempt_at
        assert d.deliver() == 1                         # 200
        hook = pinned.webhook("t")
        assert hook.failures == 0 and hook.next_attempt_at is None
        assert d.deliver() == 0 and receiver.count() == 3   # delivered: nothing more to send

        for headers, body in receiver.requests:
            assert verify(SECRET, headers, body), headers
            assert headers["content-type"] == "application/json"
        bodies = receiver.bodies()
        assert bodies[0] == bodies[1] == bodies[2]      # the same batch each time
        [event] = bodies[0]["events"]
        assert bodies[0]["team"] == "t"
        assert (event["job_id"], event["kind"], event["name"], event["error"]) == (str(job_id), "dead", "job", "boom")
        assert (event["attempts"], event["max_attempts"]) == (1, 1)

    attempts = pinned.webhook_deliveries("t")           # newest first
    assert [(a.attempt, a.status_code) for a in attempts] == [(3, 200), (2, None), (1, 500)]
    assert attempts[0].error is None
    assert attempts[1].error == "no answer within 0.5 s"
    assert attempts[2].error.startswith("HTTP 500")
    assert {(a.events, a.first_event, a.last_event, a.url) for a in attempts} == \
        {(1, int(event["event_id"]), int(event["event_id"]), receiver.url)}


def test_the_backoff_grows_exponentially_up_to_its_cap(pinned):
    dead_job(pinned)
    with receiving([], then=503) as receiver, deliverer(pinned, backoff_base_s=1.0, backoff_cap_s=4.0) as d:
        pinned.set_webhook("t", receiver.url, SECRET)
        now, waits = T0, []
        for _ in range(5):
            pinned.clock = now
            assert d.deliver() == 0
            hook = pinned.webhook("t")
            waits.append((hook.next_attempt_at - now).total_seconds())
            now = hook.next_attempt_at
        assert receiver.count() == 5
    for wait, d_s in zip(waits, (1, 2, 4, 4, 4)):
        assert d_s / 2 <= wait <= d_s, waits


def test_events_go_in_order_in_batches_each_to_its_own_teams_webhook(pinned):
    mine = [dead_job(pinned, name=f"n{i}") for i in range(5)]
    theirs = dead_job(pinned, team="u")
    with receiving([]) as receiver, receiving([]) as other, deliverer(pinned, batch=2) as d:
        pinned.set_webhook("t", receiver.url, SECRET)
        while d.deliver():
            pass
        assert [[e["job_id"] for e in b["events"]] for b in receiver.bodies()] == \
            [[str(mine[0]), str(mine[1])], [str(mine[2]), str(mine[3])], [str(mine[4])]]
        assert other.count() == 0                       # team u has no webhook: nothing sent
        pinned.set_webhook("u", other.url, "another-secret-16")
        while d.deliver():
            pass
        assert [[e["job_id"] for e in b["events"]] for b in other.bodies()] == [[str(theirs)]]
        assert verify("another-secret-16", *other.requests[0])
        later = dead_job(pinned)
        assert d.deliver() == 1
        assert [e["job_id"] for e in receiver.bodies()[-1]["events"]] == [str(later)]


def test_a_refused_connection_is_an_attempt_with_its_error(pinned):
    dead_job(pinned)
    with receiving([]) as receiver:
        url = receiver.url
    with deliverer(pinned) as d:
        pinned.set_webhook("t", url, SECRET)           # nobody listens there any more
        assert d.deliver() == 0
    [attempt] = pinned.webhook_deliveries("t")
    assert attempt.status_code is None and "ConnectError" in attempt.error


# ---------------------------------------------------------------- one team's slow receiver
DEADLINE_S = 15.0


@contextmanager
def delivering(store: Store, d: WebhookDeliverer, every_s: float = 0.5) -> Iterator[None]:
    """The `webhooks` duty as the dispatcher's maintenance runs it, every
    every_s, in a thread."""
    schedule = MaintenanceSchedule(store, "deliverer", lambda: [], webhooks=d, webhook_every_s=every_s)
    stop = threading.Event()

    def run():
        while not stop.is_set():
            try:
                schedule.deliver_webhooks()
            except Exception as exc:                # the next pass tries again, as the schedule's do
                print("deliver_webhooks failed:", exc)
            stop.wait(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)


@pytest.mark.parametrize("answer", ["trickle", "stall", "huge"])
def test_a_slow_receiver_delays_only_its_own_team(pinned, answer):
    """Team t's receiver trickles its answer a byte every 2 s, or never
    answers, or answers 200 with a 200 MB body; team u's answers at once.
    While t's POST is in flight, u's new events reach u within seconds. t's
    POST ends at the deadline (webhook_timeout_s, for the whole request): a
    failed attempt, its batch sent again after the backoff; a huge answer is
    read only up to its first bytes (the status is what counts) and the
    connection closed."""
    with receiving([answer], stall_s=120) as slow, receiving([]) as healthy, \
            deliverer(pinned, timeout_s=DEADLINE_S) as d:
        pinned.set_webhook("t", slow.url, SECRET)
        pinned.set_webhook("u", healthy.url, "another-secret-16")
        stuck = dead_job(pinned, team="t")
        first = dead_job(pinned, team="u")
        with delivering(pinned, d):
            wait_until(lambda: slow.count() == 1 and healthy.count() == 1, 30, "both teams' first POSTs")
            posted = time.monotonic()
            second = dead_job(pinned, team="u")
            made = time.monotonic()
            wait_until(lambda: healthy.count() == 2, 30, "team u's second POST")
            late_s = time.monotonic() - made
            if answer != "huge":                        # t's POST is still in flight: nothing recorded yet
                assert pinned.webhook_deliveries("t") == [] and time.monotonic() - posted < DEADLINE_S
            assert late_s < DEADLINE_S / 3, late_s      # a pass every 0.5 s: within a second when not loaded
            assert [[e["job_id"] for e in b["events"]] for b in healthy.bodies()] == [[str(first)], [str(second)]]

            wait_until(lambda: pinned.webhook_deliveries("t"), DEADLINE_S + 30, "team t's attempt to end")
            [attempt] = pinned.webhook_deliveries("t")
            if answer == "huge":
                assert attempt.status_code == 200 and attempt.error is None
                assert attempt.duration_ms < DEADLINE_S * 1000
                wait_until(slow.cut.is_set, 30, "the deliverer to close the huge answer's connection")
                assert slow.sent < HUGE / 4, slow.sent  # what the sockets' buffers held, not the body
                assert pinned.webhook("t").failures == 0
                return
            assert attempt.status_code is None and attempt.error == f"no answer within {DEADLINE_S:g} s"
            assert DEADLINE_S * 1000 - 50 <= attempt.duration_ms < (DEADLINE_S + 10) * 1000, attempt.duration_ms
            hook = pinned.webhook("t")
            assert hook.failures == 1                   # not delivered: the same batch is due again
            if answer == "trickle":
                wait_until(slow.cut.is_set, 30, "the deliverer to close the trickling connection")

            pinned.clock = hook.next_attempt_at         # the backoff has passed: sent again, answered 200
            wait_until(lambda: [a.status_code for a in pinned.webhook_deliveries("t")] == [200, None], 30,
                       "team t's second attempt")
            bodies = slow.bodies()
            assert len(bodies) == 2 and bodies[0] == bodies[1]
            assert [e["job_id"] for e in bodies[1]["events"]] == [str(stuck)]
            assert pinned.webhook("t").failures == 0


# ---------------------------------------------------------------- the admin API
@pytest.fixture
def client(db_dsn) -> Iterator[TestClient]:
    s = Store(db_dsn, max_size=4, pool_options={"timeout": 5})
    for team, token in TOKENS.items():
        s.create_team(team)
        with s.connection() as conn:
            conn.execute("UPDATE teams SET token_hash = %s WHERE name = %s", (hash_token(token), team))
    with TestClient(build(Settings(admin_token=ADMIN), s, dispatch=False, head=migrate.head()).app) as c:
        c.store = s
        yield c
    s.close()


def test_http_the_admin_sets_reads_and_removes_a_webhook(client):
    r = client.put("/v1/teams/t/webhook", json={"url": "https://example.com/hook", "secret": SECRET}, headers=A)
    assert r.status_code == 200, r.text
    assert r.json()["url"] == "https://example.com/hook" and r.json()["secret"] == SECRET
    got = client.get("/v1/teams/me/webhook", headers=T).json()
    assert got["url"] == "https://example.com/hook" and got["failures"] == 0 and "secret" not in got
    r = client.put("/v1/teams/t/webhook", json={"url": "http://127.0.0.1:9/x"}, headers=A)
    made = r.json()["secret"]
    assert len(made) >= 32 and made != SECRET             # omitted: one is made, shown once
    assert client.get("/v1/teams/t/webhook", headers=A).json()["url"] == "http://127.0.0.1:9/x"
    assert client.get("/v1/teams/me/webhook/deliveries", headers=T).json() == {"deliveries": []}
    assert client.delete("/v1/teams/t/webhook", headers=A).status_code == 204
    assert client.get("/v1/teams/me/webhook", headers=T).status_code == 404
    assert client.delete("/v1/teams/t/webhook", headers=A).status_code == 404


@pytest.mark.parametrize("body, status, detail", [
    ({"url": "ftp://example.com/x", "secret": SECRET}, 422, "http"),
    ({"url": "/relative", "secret": SECRET}, 422, "absolute"),
    ({"url": "https://", "secret": SECRET}, 422, "host"),
    ({"url": "https://example.com/a b", "secret": SECRET}, 422, "whitespace"),
    ({"url": "https://example.com/x", "secret": "short"}, 422, "secret"),
    ({"url": "https://example.com/x", "secret": "has spaces in it, sixteen+"}, 422, "secret"),
    ({"url": "https://example.com/x", "extra": 1}, 422, ""),
    ({"secret": SECRET}, 422, ""),
    ({"url": "https://example.com/" + "x" * 2000}, 422, ""),
])
def test_http_bad_webhooks_are_422_and_write_nothing(client, body, status, detail):
    r = client.put("/v1/teams/t/webhook", json=body, headers=A)
    assert r.status_code == status, r.text
    assert detail in r.json()["detail"]
    assert client.store.webhook("t") is None


def test_http_webhooks_belong_to_the_admin_and_the_team_itself(client):
    body = {"url": "https://example.com/hook", "secret": SECRET}
    assert client.put("/v1/teams/t/webhook", json=body, headers=T).status_code == 403
    assert client.delete("/v1/teams/t/webhook", headers=T).status_code == 403
    assert client.put("/v1/teams/nobody/webhook", json=body, headers=A).status_code == 404
    assert client.store.webhook("t") is None
    assert client.put("/v1/teams/t/webhook", json=body, headers=A).status_code == 200
    assert client.get("/v1/teams/t/webhook", headers=U).status_code == 404
    assert client.get("/v1/teams/t/webhook/deliveries", headers=U).status_code == 404
    assert client.get("/v1/teams/me/webhook", headers=A).status_code == 422
    assert client.get("/v1/teams/nobody/webhook/deliveries", headers=A).status_code == 404
    assert client.get("/v1/teams/me/webhook/deliveries?limit=0", headers=T).status_code == 400


# ---------------------------------------------------------------- a deliverer killed mid-delivery
@pytest.mark.processes
def test_a_dispatcher_killed_while_the_receiver_holds_the_request_delivers_after_restart(db_dsn):
    """The receiver holds the first POST unanswered; the dispatcher process
    delivering it is SIGKILLed. Its position has not moved, so the same
    dispatcher restarted (it takes the `webhooks` duty back at once: the
    lease is its own) sends the event again and records the 2xx."""
    store = make_store(db_dsn, clock=None)
    store.create_team("t")
    server = None
    try:
        with receiving(["stall"], stall_s=120) as receiver:
            store.set_webhook("t", receiver.url, SECRET)
            job_id = dead_job(store)
            flags = ("--webhook-timeout-s", "60", "--webhook-every-s", "0.2")
            server = Server(db_dsn, *flags, role="dispatcher", name="deliverer")
            wait_until(lambda: receiver.count() == 1, 30, "the first POST")
            server.kill()
            assert store.webhook_deliveries("t") == []       # no answer came: nothing recorded, nothing moved
            [pending] = store.webhooks_due(batch=10, limit=10)
            assert [e["job_id"] for e in pending.events] == [job_id]
            receiver.release.set()                          # the held request ends (to a dead client)

            server = Server(db_dsn, *flags, role="dispatcher", name="deliverer")
            wait_until(lambda: [d.status_code for d in store.webhook_deliveries("t")] == [200], 30,
                       f"the redelivery\n{logs(server)}")
            bodies = receiver.bodies()
            assert len(bodies) == 2 and bodies[0] == bodies[1]
            assert [e["job_id"] for e in bodies[1]["events"]] == [str(job_id)]
            assert all(verify(SECRET, h, b) for h, b in receiver.requests)
            assert store.webhooks_due(batch=10, limit=10) == []
    finally:
        if server is not None:
            server.stop()
        store.close()
