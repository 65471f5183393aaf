"""What hostile or careless clients sent the running service, each sent again
exactly as it was, through a real `minutehand serve` on 127.0.0.1 (HTTP over
loopback; raw sockets where a client library would not send it): every one
is refused with a 4xx problem+json that says why, and nothing is written.

- JSON nested ~1,000 deep (payload, batch item, worker result): 422, not a
  500; payloads and results are capped at 64 levels, so whatever is accepted
  decodes anywhere the worker reads it
- results over 256 KiB: 413 on complete, refused alone in a batch of outcomes
- batches: counted before items are decoded; an item that does not decode
  (NUL characters, a due time without an offset, 87.5 as an integer, a bad
  idempotency key) is refused alone
- Idempotency-Key: not ASCII, control characters, or sent twice
- integer fields take 87.0, refuse 87.5 and "87"
- OPTIONS lists every method of a path; ?state=bogus names `state`
- the server's own limits: a head over api_max_header_bytes (431), a head or
  body that does not arrive in time (408), a connection that sends nothing

The module shares one database (`module_dsn`, tests/fixtures/databases.py) and one server; each
test compares table counts before and after, on its own rows."""
from __future__ import annotations

import select
import socket
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import msgspec
import pytest

from minutehand.api import jobs
from minutehand.protocol.jsontext import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_text_problem, nested_deeper
from minutehand.store.store import Store
from minutehand.store.teams import hash_token
from minutehand.web.problems import ApiProblem
from tests.processes import Server, logs
from tests.support import RESET

pytestmark = pytest.mark.processes

ADMIN = "admin-hardening-token"
TEAM_TOKEN = "tok-hardening-t"
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 1.0, 2.0
TABLES = ("jobs", "series", "due_minutes", "due_hours", "due_far", "idempotency_keys", "teams")
COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)
DEEP = 1000                    # what was sent: msgspec ran out of stack reading it


@dataclass
class Env:
    server: Server
    http: httpx.Client         # team t's token
    worker: httpx.Client       # a worker token
    admin: httpx.Client
    conn: object               # autocommit connection to the database

    @property
    def port(self) -> int:
        return self.server.port


@pytest.fixture(scope="module")
def env(module_dsn, module_conn) -> Iterator[Env]:
    module_conn.execute(RESET)
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TEAM_TOKEN),))
    store = Store(module_dsn, max_size=2)
    worker_token = store.create_worker_token("hardening")
    store.close()
    server = Server(module_dsn, "--admin-token", ADMIN, "--api-header-timeout-s", str(HEADER_TIMEOUT_S),
                    "--api-body-timeout-s", str(BODY_TIMEOUT_S))
    clients = [httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"})
               for token in (TEAM_TOKEN, worker_token, ADMIN)]
    try:
        yield Env(server, *clients, conn=module_conn)
    finally:
        for c in clients:
            c.close()
        server.stop()


@pytest.fixture
def conn(env):
    return env.conn


def counts(conn) -> dict[str, int]:
    return dict(zip(TABLES, conn.execute(COUNTS).fetchone()))


def assert_problem(r: httpx.Response, status: int, slug: str, *details: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status and body["type"] == f"/problems/{slug}" and body["title"], body
    for detail in details:
        assert detail.lower() in body["detail"].lower(), body
    return body


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """JSON text: `depth` arrays and objects, alternating, around a leaf."""
    opens = b"".join(b"[" if i % 2 == 0 else b'{"k":' for i in range(depth))
    closes = b"".join(b"]" if i % 2 == 0 else b"}" for i in reversed(range(depth)))
    return opens + leaf + closes


def post_json(client: httpx.Client, path: str, body: bytes, **kw) -> httpx.Response:
    return client.post(path, content=body, headers={"Content-Type": "application/json", **kw.pop("headers", {})},
                       **kw)


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:12]}"


def leased(env: Env, name: str, count: int) -> list[dict]:
    """Lease `count` jobs named `name` for worker w1 (bounded: 20 s)."""
    got: list[dict] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        r = env.worker.post("/v1/worker/lease", json={"worker": "w1", "capacity": count - len(got),
                                                      "names": [name], "wait_s": 5})
        assert r.status_code == 200, r.text
        got += r.json()["jobs"]
    assert len(got) == count, logs(env.server)
    return got


def job_row(conn, job_id) -> tuple:
    return conn.execute("SELECT state::text, result, lease_token::text, claimed_by FROM jobs WHERE id = %s",
                        (int(job_id),)).fetchone()


# ---------------------------------------------------------------- nesting
def test_a_payload_nested_a_thousand_deep_is_422_not_500(env, conn):
    before = counts(conn)
    body = b'{"name": "deep", "payload": ' + nested(DEEP) + b"}"
    assert_problem(post_json(env.http, "/v1/jobs", body), 422, "invalid-input", "nested", f"{MAX_JSON_DEPTH} levels")
    assert counts(conn) == before
    assert "Traceback" not in env.server.output()


def test_a_payload_nested_past_the_cap_is_refused_and_at_the_cap_accepted(env, conn):
    before = counts(conn)
    for body in (nested(MAX_JSON_DEPTH + 1), b'{"a": [' + nested(MAX_JSON_DEPTH) + b"]}"):
        r = post_json(env.http, "/v1/jobs", b'{"name": "deep", "payload": ' + body + b"}")
        assert_problem(r, 422, "invalid-input", f"payload is nested more than {MAX_JSON_DEPTH} levels")
    assert counts(conn) == before
    name = unique("deep64")
    r = post_json(env.http, "/v1/jobs", b'{"name": "%s", "payload": %s}' % (name.encode(), nested(MAX_JSON_DEPTH)))
    assert r.status_code == 201, r.text
    # the worker decodes what was accepted, wherever its stack stands
    [job] = leased(env, name, 1)
    raw = msgspec.json.encode(job["payload"])

    def decode_at(depth: int):
        return decode_at(depth - 1) if depth else msgspec.json.decode(raw)

    assert decode_at(sys.getrecursionlimit() - 120) == job["payload"]


def test_a_batch_item_nested_a_thousand_deep_is_422_and_one_past_the_cap_is_refused_alone(env, conn):
    before = counts(conn)
    body = b'{"jobs": [{"name": "ok"}, {"name": "deep", "payload": ' + nested(DEEP) + b"}]}"
    assert_problem(post_json(env.http, "/v1/jobs/batch", body), 422, "invalid-input", "nested")
    assert counts(conn) == before
    name = unique("fine")
    body = b'{"jobs": [{"name": "%s"}, {"name": "deep", "payload": %s}]}' % (name.encode(),
                                                                           nested(MAX_JSON_DEPTH + 1))
    r = post_json(env.http, "/v1/jobs/batch", body)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items[0]["created"] is True and f"nested more than {MAX_JSON_DEPTH} levels" in items[1]["error"]
    assert counts(conn)["jobs"] == before["jobs"] + 1


def test_a_result_nested_a_thousand_deep_is_422_on_both_routes(env, conn):
    name = unique("res.deep")
    env.http.post("/v1/jobs", json={"name": name})
    [job] = leased(env, name, 1)
    held = job_row(conn, job["job_id"])
    body = b'{"lease_token": "%s", "result": %s}' % (job["lease_token"].encode(), nested(DEEP))
    assert_problem(post_json(env.worker, f"/v1/worker/jobs/{job['job_id']}/complete", body), 422,
                   "invalid-input", "nested")
    body = b'{"complete": [{"job_id": "%s", "lease_token": "%s", "result": %s}]}' % (
        job["job_id"].encode(), job["lease_token"].encode(), nested(DEEP))
    assert_problem(post_json(env.worker, "/v1/worker/outcomes", body), 422, "invalid-input", "nested")
    # one past the cap: 422 alone; in a batch of outcomes, that item alone
    body = b'{"lease_token": "%s", "result": %s}' % (job["lease_token"].encode(), nested(MAX_JSON_DEPTH + 1))
    assert_problem(post_json(env.worker, f"/v1/worker/jobs/{job['job_id']}/complete", body), 422,
                   "invalid-input", f"result is nested more than {MAX_JSON_DEPTH} levels", "unchanged")
    assert job_row(conn, job["job_id"]) == held                 # still claimed, by the same lease
    assert "Traceback" not in env.server.output()


# ---------------------------------------------------------------- results
def test_a_result_over_256_kib_is_413_and_the_job_keeps_its_claim(env, conn):
    name = unique("res.big")
    env.http.post("/v1/jobs", json={"name": name})
    [job] = leased(env, name, 1)
    held = job_row(conn, job["job_id"])
    big = {"lease_token": job["lease_token"], "result": {"blob": "x" * 300_000}}
    r = env.worker.post(f"/v1/worker/jobs/{job['job_id']}/complete", json=big)
    assert_problem(r, 413, "too-large", f"{MAX_JSON_BYTES:,}", "unchanged")
    assert job_row(conn, job["job_id"]) == held
    # the claim still stands: the worker can fail it (or complete it with less)
    r = env.worker.post(f"/v1/worker/jobs/{job['job_id']}/fail",
                        json={"lease_token": job["lease_token"], "error": "result too large", "retryable": False})
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    assert job_row(conn, job["job_id"])[0] == "dead"


def test_in_a_batch_of_outcomes_a_result_over_the_limit_is_refused_alone(env, conn):
    name = unique("res.batch")
    env.http.post("/v1/jobs/batch", json={"jobs": [{"name": name}] * 3})
    claimed = leased(env, name, 3)
    held = job_row(conn, claimed[1]["job_id"])
    results = [{"small": 1}, {"blob": "x" * 300_000}, [1, 2]]
    r = env.worker.post("/v1/worker/outcomes", json={"complete": [
        {"job_id": j["job_id"], "lease_token": j["lease_token"], "result": res} for j, res in zip(claimed, results)]})
    assert r.status_code == 200, r.text
    answers = r.json()["complete"]
    assert [a["job_id"] for a in answers] == [j["job_id"] for j in claimed]
    assert [a["ok"] for a in answers] == [True, False, True]
    size = len(msgspec.json.encode(results[1]))
    assert f"{size:,} bytes" in answers[1]["reason"] and f"{MAX_JSON_BYTES:,}" in answers[1]["reason"]
    assert job_row(conn, claimed[0]["job_id"])[:2] == ("succeeded", {"small": 1})
    assert job_row(conn, claimed[2]["job_id"])[:2] == ("succeeded", [1, 2])
    assert job_row(conn, claimed[1]["job_id"]) == held


def test_results_and_errors_jsonb_or_text_cannot_hold_are_refused_alone_or_kept_readable(env, conn):
    name = unique("res.nul")
    env.http.post("/v1/jobs/batch", json={"jobs": [{"name": name}] * 3})
    a, b, c = leased(env, name, 3)
    held = job_row(conn, a["job_id"])
    body = ('{"complete": [{"job_id": "%s", "lease_token": "%s", "result": "\\u0000"}, '
            '{"job_id": "%s", "lease_token": "%s", "result": "ok"}], '
            '"fail": [{"job_id": "%s", "lease_token": "%s", "error": "bad\\u0000byte", "retryable": false}]}' % (
                a["job_id"], a["lease_token"], b["job_id"], b["lease_token"], c["job_id"], c["lease_token"])).encode()
    r = post_json(env.worker, "/v1/worker/outcomes", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [x["ok"] for x in out["complete"]] == [False, True] and out["fail"][0]["ok"] is True
    assert "\\u0000" in out["complete"][0]["reason"]
    assert job_row(conn, a["job_id"]) == held and job_row(conn, b["job_id"])[:2] == ("succeeded", "ok")
    assert conn.execute("SELECT last_error FROM jobs WHERE id = %s", (int(c["job_id"]),)).fetchone()[0] == \
        "bad\ufffdbyte"


# ---------------------------------------------------------------- batches
def test_batch_items_that_do_not_decode_are_refused_alone_and_the_others_submitted(env, conn):
    good = [unique("good") for _ in range(3)]
    items = [
        f'{{"name": "{good[0]}"}}',
        '{"name": "nul\\u0000name"}',
        '{"name": "a", "payload": {"k": "\\u0000"}}',
        '{"name": "a", "payload": {"k": "\\\\u0000 is text"}, "idempotency_key": "nul\\u0000key"}',
        '{"name": "a", "due_at": "2030-01-01T00:00:00"}',
        '{"name": "a", "max_attempts": 87.5}',
        '{"name": "a", "extra": 1}',
        f'{{"name": "{good[1]}", "max_attempts": 87.0, "payload": {{"k": "\\\\u0000 is text"}}}}',
        '{"name": "a", "idempotency_key": "caf\\u00e9"}',
        '{"name": "a", "idempotency_key": " padded"}',
        f'{{"name": "a", "idempotency_key": "{"k" * 256}"}}',
        f'{{"name": "{good[2]}", "idempotency_key": "order 17/{good[2]}"}}',
        '{"name": "a", "repeat": {"cron": "0 3 * * *", "timezone": "UTC\\u0000"}}',
        '[1, 2]',
    ]
    before = counts(conn)
    r = post_json(env.http, "/v1/jobs/batch", ('{"jobs": [' + ", ".join(items) + "]}").encode())
    assert r.status_code == 200, r.text
    body = r.json()
    out = body["items"]
    assert [i["idx"] for i in out] == list(range(len(items)))
    ok = {0, 7, 11}
    assert [i["error"] is None for i in out] == [n in ok for n in range(len(items))], out
    expected = {1: "name cannot be stored: it contains a NUL", 2: "payload cannot be stored: it contains the escape",
                3: "idempotency key contains '\\x00'", 4: "timezone", 5: "got `float` with a fraction",
                6: "unknown field `extra` - at `$.jobs[6]`", 8: "idempotency key contains 'é'",
                9: "starts or ends with a space", 10: "256 characters", 12: "repeat.timezone cannot be stored",
                13: "Expected `object`, got `array` - at `$.jobs[13]`"}
    for n, text in expected.items():
        assert text.lower() in out[n]["error"].lower(), (n, out[n])
        assert out[n]["job_id"] is None and out[n]["created"] is False
    assert (body["created"], body["existing"], body["rejected"]) == (3, 0, len(items) - 3)
    after = counts(conn)
    assert after["jobs"] == before["jobs"] + 3 and after["idempotency_keys"] == before["idempotency_keys"] + 1
    rows = dict(conn.execute("SELECT name, max_attempts FROM jobs WHERE name = ANY(%s)", (good,)).fetchall())
    assert rows == {good[0]: 3, good[1]: 87, good[2]: 3}


def test_a_batch_is_counted_before_its_items_are_decoded(env, conn):
    before = counts(conn)
    # two million empty items (6 MB): refused at item 10,001, not read in full
    body = b'{"jobs": [' + b"{}," * 2_000_000 + b"{}]}"
    assert_problem(post_json(env.http, "/v1/jobs/batch", body), 413, "too-large", "at most 10,000 jobs")
    body = b'{"jobs": [' + b",".join([b'{"name": "j"}'] * 10_001) + b"]}"
    assert_problem(post_json(env.http, "/v1/jobs/batch", body), 413, "too-large", "at most 10,000 jobs")
    assert counts(conn) == before
    for body, status, slug, detail in [(b'{"jobs": {"name": "a"}}', 422, "invalid-input", "expected `array`"),
                                       (b'{"jobs": [' + b"{}, " * 6000 + b"]}", 400, "malformed-request",
                                        "not valid JSON"),
                                       (b'{"jobs": [' + b"{}," * 20_000 + b'{}], "x": 1}', 422, "invalid-input",
                                        "unknown field `x`"),
                                       (b"{}", 422, "invalid-input", "missing required field `jobs`")]:
        assert_problem(post_json(env.http, "/v1/jobs/batch", body), status, slug, detail)
    assert counts(conn) == before


def test_reading_the_jobs_of_a_huge_batch_allocates_almost_nothing_past_the_limit():
    body = b'{"jobs": [' + b"{}," * 5_000_000 + b"{}]}"
    jobs._bounded_envelope(10_000)                  # the decoder, built once per process
    tracemalloc.start()
    try:
        with pytest.raises(ApiProblem) as refused:
            jobs.batch_items(body, 10_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status_code == 413
    assert peak < 8 * 1024 * 1024, f"{peak:,} bytes allocated"    # a list of 5 M raw items: ~250 MB


# ---------------------------------------------------------------- Idempotency-Key
@pytest.mark.parametrize("values, status, slug, detail", [
    ([b"caf\xc3\xa9"], 422, "invalid-input", "byte 0xC3"),
    ([b"tab\there"], 422, "invalid-input", "'\\t'"),
    ([b"k" * 256], 422, "invalid-input", "256 characters"),
    ([b"first", b"second"], 400, "malformed-request", "2 Idempotency-Key headers"),
    ([b"same", b"same"], 400, "malformed-request", "2 Idempotency-Key headers"),
])
def test_idempotency_keys_that_are_not_printable_ascii_or_sent_twice_are_refused(env, conn, values, status,
                                                                                  slug, detail):
    before = counts(conn)
    headers = [("Content-Type", "application/json")] + [(b"Idempotency-Key", v) for v in values]
    r = env.http.post("/v1/jobs", content=b'{"name": "keyed"}', headers=headers)
    body = assert_problem(r, status, slug, detail)
    if status == 422:
        assert "printable ascii" in body["detail"].lower()
    assert counts(conn) == before


def test_an_idempotency_key_with_a_control_character_is_refused(env, conn):
    """A client library refuses to send \\x01 in a header; a raw socket does."""
    before = counts(conn)
    body = b'{"name": "keyed"}'
    request = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TEAM_TOKEN.encode() +
               b"\r\nContent-Type: application/json\r\nIdempotency-Key: a\x01b\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", env.port), timeout=10) as s:
        s.sendall(request)
        got = read_response(s)
    head, _, payload = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 4"), got
    assert b"application/problem+json" in head.lower(), got
    problem = msgspec.json.decode(payload)
    assert problem["status"] in (400, 422) and problem["detail"], problem
    assert counts(conn) == before


def test_a_printable_key_with_inner_spaces_works_and_replays(env, conn):
    h = {"Idempotency-Key": f"order 17 {uuid.uuid4().hex}"}
    first = env.http.post("/v1/jobs", json={"name": "keyed"}, headers=h)
    again = env.http.post("/v1/jobs", json={"name": "keyed"}, headers=h)
    assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
    assert again.json()["job_id"] == first.json()["job_id"]
    key = conn.execute("SELECT idempotency_key FROM jobs WHERE id = %s", (int(first.json()["job_id"]),)).fetchone()[0]
    assert key == h["Idempotency-Key"]


# ---------------------------------------------------------------- integers
def test_integer_fields_take_integral_numbers_and_refuse_fractions_and_strings(env, conn):
    name = unique("ints")
    r = env.http.post("/v1/jobs", json={"name": name, "max_attempts": 87.0, "priority": 3.0, "flex_s": 60.0})
    assert r.status_code == 201, r.text
    row = conn.execute("SELECT max_attempts, priority, flex_s FROM jobs WHERE id = %s",
                       (int(r.json()["job_id"]),)).fetchone()
    assert row == (87, 3, 60)
    r = env.http.post("/v1/jobs", json={"name": unique("every"), "repeat": {"every_s": 3600.0}})
    assert r.status_code == 201, r.text
    assert env.http.get(f"/v1/jobs/{r.json()['job_id']}").json()["repeat"]["every_s"] == 3600
    before = counts(conn)
    for field, value, detail in [("max_attempts", 87.5, "fraction"), ("max_attempts", "87", "got `str`"),
                                 ("priority", 1e10, "out of range"), ("flex_s", True, "got `bool`"),
                                 ("priority", [1], "got `array`")]:
        r = env.http.post("/v1/jobs", json={"name": "ints", field: value})
        assert_problem(r, 422, "invalid-input", detail, f"$.{field}")
    assert_problem(env.http.post("/v1/jobs", json={"name": "ints", "repeat": {"every_s": 0.5}}), 422,
                   "invalid-input", "fraction", "$.repeat.every_s")
    for body in ({"name": unique("team"), "quota": 5.5}, {"name": unique("team"), "weight": "2"}):
        assert_problem(env.admin.post("/v1/teams", json=body), 422, "invalid-input", "Expected `int`")
    assert counts(conn) == before
    team = unique("team").replace(".", "-")
    r = env.admin.post("/v1/teams", json={"name": team, "quota": 5.0, "weight": 2.0})
    assert r.status_code == 201, r.text
    assert conn.execute("SELECT quota, weight FROM teams WHERE name = %s", (team,)).fetchone() == (5, 2)


def test_the_schema_still_calls_the_integer_fields_integers(env):
    components = env.http.get("/schema/openapi.json").json()["components"]["schemas"]
    for struct, fields in {"JobIn": ("priority", "max_attempts", "flex_s"), "Repeat": ("every_s",),
                           "TeamIn": ("quota", "weight")}.items():
        for field in fields:
            prop = components[struct]["properties"][field]
            types = [prop.get("type")] + [alt.get("type") for alt in prop.get("anyOf", [])]
            assert "integer" in types and "number" not in types, (struct, field, prop)


# ---------------------------------------------------------------- OPTIONS, parameters
@pytest.mark.parametrize("path, methods", [("/v1/jobs/12345", "DELETE, GET, OPTIONS"),
                                           ("/v1/jobs", "GET, OPTIONS, POST"),
                                           ("/v1/jobs/batch", "OPTIONS, POST")])
def test_options_lists_every_method_of_the_path(env, path, methods):
    r = env.http.options(path)
    assert r.status_code == 204 and r.headers["allow"] == methods, (r.status_code, r.headers)
    for method in methods.split(", "):
        if method != "OPTIONS":
            assert env.http.request(method, path, json={}).status_code != 405, method


def test_a_bad_state_filter_names_the_state_parameter_and_its_values(env):
    body = assert_problem(env.http.get("/v1/jobs", params={"state": "bogus"}), 400, "malformed-request",
                          "state:", "bogus", "scheduled, claimed, running, retrying, succeeded, dead, cancelled")
    assert "job_state" not in r_text(body) and body["errors"][0]["key"] == "state"


def r_text(body: dict) -> str:
    return msgspec.json.encode(body).decode()


# ---------------------------------------------------------------- the server's limits
def exchange(port: int, first: bytes, *, drip: bytes = b"", every_s: float = 0.2, limit_s: float = 10.0,
             background: bytes = b"") -> tuple[bytes, float | None]:
    """Send `first`, then `drip` every every_s seconds (while the server
    listens), reading all along; (everything received, seconds until the
    server closed, or None if it had not within limit_s). `background` is
    sent from a thread (it may block once the server stops reading)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=limit_s)
    start = time.monotonic()
    got, closed_at = b"", None
    sender = None
    try:
        if background:
            def send() -> None:
                try:
                    s.sendall(background)
                except OSError:
                    pass                        # refused and closed: expected
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
        if first:
            s.sendall(first)
        next_drip = start + every_s
        while time.monotonic() - start < limit_s:
            wait = max(0.0, next_drip - time.monotonic()) if drip else limit_s - (time.monotonic() - start)
            ready, _, _ = select.select([s], [], [], max(0.0, min(wait, limit_s)))
            if ready:
                try:
                    chunk = s.recv(65536)
                except (ConnectionResetError, TimeoutError):
                    chunk = b""
                if not chunk:
                    closed_at = time.monotonic() - start
                    break
                got += chunk
            elif drip and time.monotonic() >= next_drip:
                try:
                    s.sendall(drip)
                except OSError:
                    pass                        # closed: read what it said
                next_drip += every_s
    finally:
        s.close()
        if sender is not None:
            sender.join(5)
    return got, closed_at


def status_of(got: bytes) -> int | None:
    line = got.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else None


def problem_of(got: bytes) -> dict:
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), got[:500]
    return msgspec.json.decode(body)


def test_a_header_over_the_limit_is_431_and_the_connection_closed(env):
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TEAM_TOKEN.encode() + b"\r\nX-Big: "
    got, closed_at = exchange(env.port, b"", background=head + b"a" * 3_000_000 + b"\r\n\r\n", limit_s=10)
    assert status_of(got) == 431, got[:300]
    assert problem_of(got)["type"] == "/problems/headers-too-large"
    assert closed_at is not None and closed_at < 5, closed_at
    # many headers, each small, count together
    many = head + b"1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(1000)) + b"\r\n"
    got, closed_at = exchange(env.port, many, limit_s=10)
    assert status_of(got) == 431 and closed_at is not None, got[:300]
    # four at once, as sent before: each refused
    results: list = [None] * 4

    def one(i: int) -> None:
        results[i] = exchange(env.port, b"", background=head + b"a" * 3_000_000 + b"\r\n\r\n", limit_s=10)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert [status_of(r[0]) for r in results] == [431] * 4
    # a head just under the limit is served
    r = env.http.get("/v1/jobs", headers={"X-Fill": "f" * 60_000})
    assert r.status_code == 200, r.text


def test_a_head_sent_slowly_is_cut_off_at_the_header_deadline(env):
    got, closed_at = exchange(env.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", drip=b"X-Slow: 1\r\n",
                              every_s=0.2, limit_s=10)
    assert closed_at is not None and HEADER_TIMEOUT_S - 0.1 < closed_at < HEADER_TIMEOUT_S + 3, closed_at
    assert status_of(got) == 408, got[:300]
    assert "headers did not arrive" in problem_of(got)["detail"]


def test_a_body_sent_slowly_is_cut_off_at_the_body_deadline_and_nothing_written(env, conn):
    before = counts(conn)
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TEAM_TOKEN.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\": \"slow\", \"payload\": \"")
    got, closed_at = exchange(env.port, head, drip=b"x" * 10, every_s=0.2, limit_s=15)
    assert closed_at is not None and BODY_TIMEOUT_S - 0.1 < closed_at < BODY_TIMEOUT_S + 3, closed_at
    assert status_of(got) == 408, got[:300]
    assert "did not arrive in full" in problem_of(got)["detail"]
    assert counts(conn) == before


def test_a_connection_that_sends_nothing_or_only_blank_lines_is_closed(env):
    for drip in (b"", b"\r\n"):
        got, closed_at = exchange(env.port, b"", drip=drip, every_s=0.2, limit_s=10)
        assert got == b"" and closed_at is not None and closed_at < HEADER_TIMEOUT_S + 3, (drip, got, closed_at)


def test_a_request_in_several_quick_pieces_and_keep_alive_still_work(env):
    s = socket.create_connection(("127.0.0.1", env.port), timeout=10)
    try:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for piece in (request[:10], request[10:25], request[25:]):
            s.sendall(piece)
            time.sleep(0.1)
        first = read_response(s)
        time.sleep(HEADER_TIMEOUT_S + 0.5)          # idle between requests: keep-alive's 5 s applies
        s.sendall(request)
        second = read_response(s)
    finally:
        s.close()
    assert status_of(first) == 200 and status_of(second) == 200, (first, second)


def read_response(s: socket.socket, limit_s: float = 5) -> bytes:
    got, deadline = b"", time.monotonic() + limit_s
    while time.monotonic() < deadline:
        head, sep, body = got.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                return got
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


# ---------------------------------------------------------------- the checks themselves
@pytest.mark.parametrize("text, deeper", [
    (b"{}", False), (b"[" * 64 + b"]" * 64, False), (b"[" * 65 + b"]" * 65, True),
    (b"[" + b",".join([b"[]"] * 1000) + b"]", False),                                  # many brackets, shallow
    (b'["' + b"[" * 200 + b'"]', False),                                  # brackets in a string
    (b'["\\"' + b"[" * 200 + b'"]', False),                               # ... after an escaped quote
    (b'{"a": ' * 64 + b"1" + b"}" * 64, False), (b'{"a": ' * 65 + b"1" + b"}" * 65, True),
    (b"[" * 30 + b"[" + b",".join([b"[[]]"] * 40) + b"]" + b"]" * 30, False),
    (b"[" * 63 + b"[[]]" + b"]" * 63, True),
])
def test_nesting_depth_is_measured_exactly(text, deeper):
    msgspec.json.decode(text)                                             # valid JSON, as the API sees it
    assert nested_deeper(text) is deeper


@pytest.mark.parametrize("text, problem", [
    (b'"\\u0000"', "\\u0000"), (b'"\\\\u0000"', None), (b'"\\\\\\u0000"', "\\u0000"),
    (b'{"k\\u0000": 1}', "\\u0000"), (b'"\xff"', "not UTF-8"), ('"é"'.encode(), None),
])
def test_json_text_jsonb_cannot_hold_is_found(text, problem):
    found = json_text_problem("payload", text)
    assert (found is None) if problem is None else (problem in found), found
