"""Teams' quota and weight: the defaults a new team gets (settings), setting
them over HTTP (PATCH /v1/teams/{name}) and from the CLI (`minutehand team
set`), reading one team and listing them all (keyset pages by name), and
every refusal: its status, problem type and detail, and that nothing changed.

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u', quota 1000 and weight 1)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from litestar.testing import TestClient

from minutehand.cli import main as cli
from minutehand.serve import build
from minutehand.settings import TEAM_LIMIT_MAX, Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.teams import hash_token

pytestmark = pytest.mark.reused_db   # one database for the module, reset before each test

ADMIN = "admin-secret-token"
TOKEN_T = "tok-team-t"
T = {"Authorization": f"Bearer {TOKEN_T}"}
A = {"Authorization": f"Bearer {ADMIN}"}
QUOTA, WEIGHT = 70, 3          # this module's server defaults, unlike the built-in ones
TEAMS = "SELECT name, quota, weight, token_hash FROM teams ORDER BY name"


@pytest.fixture(scope="module")
def api_store(module_dsn):
    s = Store(module_dsn, max_size=4, pool_options={"timeout": 5})
    yield s
    s.close()


@pytest.fixture(scope="module")
def client_module(api_store):
    settings = Settings(admin_token=ADMIN, default_team_quota=QUOTA, default_team_weight=WEIGHT)
    with TestClient(build(settings, api_store, dispatch=False, head=migrate.head()).app) as c:
        yield c


@pytest.fixture
def conn(db_dsn, module_conn):
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TOKEN_T),))
    return module_conn


@pytest.fixture
def client(conn, client_module):
    return client_module


def teams(conn) -> list[tuple]:
    return conn.execute(TEAMS).fetchall()


def quota_weight(conn, name: str) -> tuple[int, int] | None:
    row = conn.execute("SELECT quota, weight FROM teams WHERE name = %s", (name,)).fetchone()
    return tuple(row) if row else None


def assert_problem(r, status: int, slug: str, detail: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status and body["type"] == f"/problems/{slug}", body
    assert detail.lower() in body["detail"].lower(), body
    return body


# ---------------------------------------------------------------- settings
def test_the_built_in_defaults_are_1000_and_1():
    s = Settings()
    assert (s.default_team_quota, s.default_team_weight) == (1000, 1)


def test_defaults_are_read_from_the_environment_and_flags():
    s = Settings.load(["--default-team-weight", "4"], env={"MINUTEHAND_DEFAULT_TEAM_QUOTA": "25"})
    assert (s.default_team_quota, s.default_team_weight) == (25, 4)
    s = Settings.load([], env={"MINUTEHAND_DEFAULT_TEAM_QUOTA": str(TEAM_LIMIT_MAX)})
    assert s.default_team_quota == TEAM_LIMIT_MAX


@pytest.mark.parametrize("name", ["default_team_quota", "default_team_weight"])
@pytest.mark.parametrize("raw", ["0", "-1", str(TEAM_LIMIT_MAX + 1), "1.5", "ten", ""])
def test_a_default_outside_the_documented_bounds_is_refused_with_its_name(name, raw):
    with pytest.raises(SystemExit) as exc:
        Settings.load([], env={f"MINUTEHAND_{name.upper()}": raw})
    assert name in str(exc.value)


def test_a_settings_object_cannot_be_made_with_a_bad_default():
    for bad in (0, -5, TEAM_LIMIT_MAX + 1, True, 2.0):
        with pytest.raises(ValueError, match="default_team_weight"):
            Settings(default_team_weight=bad)


# ---------------------------------------------------------------- create
def test_a_team_created_without_quota_or_weight_gets_the_settings(client, conn):
    r = client.post("/v1/teams", headers=A, json={"name": "plain"})
    assert r.status_code == 201, r.text
    assert quota_weight(conn, "plain") == (QUOTA, WEIGHT)
    assert client.get("/v1/teams/plain", headers=A).json()["quota"] == QUOTA


def test_a_team_created_with_one_of_them_gets_the_setting_for_the_other(client, conn):
    assert client.post("/v1/teams", headers=A, json={"name": "q", "quota": 5}).status_code == 201
    assert client.post("/v1/teams", headers=A, json={"name": "w", "weight": 9}).status_code == 201
    assert client.post("/v1/teams", headers=A, json={"name": "qw", "quota": 6, "weight": 2}).status_code == 201
    assert quota_weight(conn, "q") == (5, WEIGHT)
    assert quota_weight(conn, "w") == (QUOTA, 9)
    assert quota_weight(conn, "qw") == (6, 2)


@pytest.mark.parametrize("extra", [{"quota": None}, {"weight": None}, {"quota": 0}, {"weight": -1},
                                   {"quota": TEAM_LIMIT_MAX + 1}, {"quota": "5"}, {"weight": 1.5}])
def test_team_creation_refuses_a_bad_quota_or_weight(client, conn, extra):
    before = teams(conn)
    assert_problem(client.post("/v1/teams", headers=A, json={"name": "bad", **extra}), 422, "invalid-input")
    assert teams(conn) == before


# ---------------------------------------------------------------- set
@pytest.mark.parametrize("body, expected", [
    ({"quota": 5}, (5, 1)),
    ({"weight": 7}, (1000, 7)),
    ({"quota": 12, "weight": 4}, (12, 4)),
    ({"quota": 8.0}, (8, 1)),                      # a JSON number with no fraction is an integer
    ({"quota": TEAM_LIMIT_MAX, "weight": TEAM_LIMIT_MAX}, (TEAM_LIMIT_MAX, TEAM_LIMIT_MAX)),
])
def test_admin_sets_quota_weight_or_both(client, conn, body, expected):
    r = client.patch("/v1/teams/t", headers=A, json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["name"], got["quota"], got["weight"]) == ("t", *expected) and got["created_at"]
    assert quota_weight(conn, "t") == expected
    assert quota_weight(conn, "u") == (1000, 1)            # no other team is touched


def test_a_change_keeps_the_token_and_is_what_the_team_then_reads(client, conn):
    before = conn.execute("SELECT token_hash, created_at FROM teams WHERE name = 't'").fetchone()
    assert client.patch("/v1/teams/t", headers=A, json={"quota": 3}).status_code == 200
    assert conn.execute("SELECT token_hash, created_at FROM teams WHERE name = 't'").fetchone() == before
    me = client.get("/v1/teams/me", headers=T).json()
    assert (me["name"], me["quota"], me["weight"]) == ("t", 3, 1)
    assert client.get("/v1/teams/me/stats", headers=T).json()["quota"] == 3


BAD_BODIES = [
    ({"quota": 0}, 422, "invalid-input", "from 1 to"),
    ({"weight": 0}, 422, "invalid-input", "from 1 to"),
    ({"quota": -3}, 422, "invalid-input", "from 1 to"),
    ({"weight": -1, "quota": 5}, 422, "invalid-input", "from 1 to"),     # nothing of it is applied
    ({"quota": TEAM_LIMIT_MAX + 1}, 422, "invalid-input", "out of range"),
    ({"weight": 10**30}, 422, "invalid-input", "out of range"),
    ({"quota": "5"}, 422, "invalid-input", "expected `int`, got `str`"),
    ({"quota": 2.5}, 422, "invalid-input", "fraction"),
    ({"quota": True}, 422, "invalid-input", "expected `int`, got `bool`"),
    ({"quota": None}, 422, "invalid-input", "got `null`"),
    ({"weight": None, "quota": 5}, 422, "invalid-input", "got `null`"),
    ({}, 422, "invalid-input", "give at least one of quota, weight"),
    ({"quota": 5, "owner": "me"}, 422, "invalid-input", "unknown field `owner`"),
    ({"name": "renamed"}, 422, "invalid-input", "unknown field `name`"),
    ([5], 422, "invalid-input", "expected `object`"),
    (b"", 400, "malformed-request", "empty"),
    (b'{"quota": ', 400, "malformed-request", "not valid JSON"),
]


@pytest.mark.parametrize("body, status, slug, detail", BAD_BODIES)
def test_bad_bodies_are_refused_and_change_nothing(client, conn, body, status, slug, detail):
    before = teams(conn)
    kw = {"content": body, "headers": {**A, "Content-Type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body, "headers": A}
    assert_problem(client.patch("/v1/teams/t", **kw), status, slug, detail)
    assert teams(conn) == before


@pytest.mark.parametrize("body", [{"quota": 5}, {"quota": 0}, {"surprise": 1}, b"{not json"])
def test_a_team_token_is_refused_403_before_its_body_is_read(client, conn, body):
    before = teams(conn)
    kw = {"content": body, "headers": {**T, "Content-Type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body, "headers": T}
    for name in ("t", "u", "me"):
        assert_problem(client.patch(f"/v1/teams/{name}", **kw), 403, "forbidden", "admin token")
    assert teams(conn) == before


def test_no_token_is_401_and_changes_nothing(client, conn):
    before = teams(conn)
    assert_problem(client.patch("/v1/teams/t", json={"quota": 5}), 401, "unauthorized")
    assert_problem(client.get("/v1/teams/t"), 401, "unauthorized")
    assert_problem(client.get("/v1/teams"), 401, "unauthorized")
    assert teams(conn) == before


def test_an_unknown_team_is_404_and_nothing_is_created(client, conn):
    before = teams(conn)
    assert_problem(client.patch("/v1/teams/nobody", headers=A, json={"quota": 5}), 404, "not-found",
                   "no such team 'nobody'")
    assert_problem(client.patch("/v1/teams/Bad%20Name", headers=A, json={"quota": 5}), 404, "not-found")
    assert teams(conn) == before


# ---------------------------------------------------------------- read one
def test_reading_a_team(client, conn):
    for headers, name in ((A, "t"), (T, "t"), (T, "me")):
        r = client.get(f"/v1/teams/{name}", headers=headers)
        assert r.status_code == 200, r.text
        assert {k: v for k, v in r.json().items() if k != "created_at"} == {
            "name": "t", "quota": 1000, "weight": 1, "submit_rate": None, "submit_burst": None, "max_pending": None,
            "retention_s": None}
    # another team is "no such team" to a team, as its jobs are
    assert_problem(client.get("/v1/teams/u", headers=T), 404, "not-found", "no such team")
    assert_problem(client.get("/v1/teams/nobody", headers=A), 404, "not-found", "no such team")
    assert_problem(client.get("/v1/teams/me", headers=A), 422, "invalid-input", "name the team")


# ---------------------------------------------------------------- list
def test_the_list_is_admin_only(client):
    assert_problem(client.get("/v1/teams", headers=T), 403, "forbidden", "admin token")


def test_the_list_pages_by_name(client, conn):
    conn.execute("INSERT INTO teams (name, quota, weight) SELECT 'p' || lpad(i::text, 2, '0'), i, i + 1 "
                 "FROM generate_series(1, 11) i")
    names, cursor, pages = [], None, 0
    while True:
        r = client.get("/v1/teams", headers=A, params={"limit": 4, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["teams"]) <= 4
        names += [t["name"] for t in page["teams"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    expected = sorted(["t", "u", *(f"p{i:02}" for i in range(1, 12))])
    assert names == expected and pages == 4              # 13 teams: 4 + 4 + 4 + 1
    one = client.get("/v1/teams", headers=A, params={"cursor": "p03", "limit": 1}).json()
    assert one["teams"][0] | {"created_at": None} == {"name": "p04", "quota": 4, "weight": 5, "created_at": None,
                                                      "submit_rate": None, "submit_burst": None, "max_pending": None,
                                                      "retention_s": None}
    assert one["next_cursor"] == "p04"
    everything = client.get("/v1/teams", headers=A, params={"limit": 1000}).json()
    assert [t["name"] for t in everything["teams"]] == expected and everything["next_cursor"] is None
    # a page that ends exactly at the last team says there is no more
    assert client.get("/v1/teams", headers=A, params={"cursor": "p11", "limit": 2}).json()["next_cursor"] is None


@pytest.mark.parametrize("params, detail", [
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "many"}, "limit"),
    ({"cursor": "Not A Name"}, "cursor"), ({"cursor": ""}, "cursor"),
])
def test_bad_list_parameters_are_400(client, params, detail):
    assert_problem(client.get("/v1/teams", headers=A, params=params), 400, "malformed-request", detail)


def test_the_routes_are_in_the_schema(client):
    schema = client.get("/schema/openapi.json").json()
    assert {"get", "patch"} <= set(schema["paths"]["/v1/teams/{name}"])
    assert {"get", "post"} <= set(schema["paths"]["/v1/teams"])
    patch = schema["paths"]["/v1/teams/{name}"]["patch"]
    assert patch["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/TeamSettingsIn"}
    assert {"403", "404", "422"} <= set(patch["responses"])
    body = schema["components"]["schemas"]["TeamSettingsIn"]
    assert body["additionalProperties"] is False
    for field in ("quota", "weight"):
        assert body["properties"][field] | {"description": ""} == {"type": "integer", "minimum": 1,
                                                                  "maximum": TEAM_LIMIT_MAX, "description": ""}


# ---------------------------------------------------------------- CLI
def run_cli(module_dsn, *argv, env=None) -> subprocess.CompletedProcess:
    """`minutehand ...` as a real process against the module's database."""
    return subprocess.run([sys.executable, "-m", "minutehand.cli.main", *argv, "--database-url", module_dsn],
                          capture_output=True, text=True, timeout=60, env=env)


def test_cli_set_and_list_in_a_real_process(conn, module_dsn):
    r = run_cli(module_dsn, "team", "set", "t", "--quota", "40", "--weight", "6")
    assert r.returncode == 0, r.stderr
    assert "quota 40, weight 6" in r.stdout and quota_weight(conn, "t") == (40, 6)
    r = run_cli(module_dsn, "team", "set", "u", "--weight", "2")
    assert r.returncode == 0, r.stderr
    assert quota_weight(conn, "u") == (1000, 2)
    r = run_cli(module_dsn, "team", "list")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0][:3] == ["name", "quota", "weight"]
    assert [row[:3] for row in rows[1:]] == [["t", "40", "6"], ["u", "1000", "2"]]


def test_cli_create_takes_its_defaults_from_the_settings(conn, module_dsn):
    import os
    env = {**os.environ, "MINUTEHAND_DEFAULT_TEAM_QUOTA": "33"}
    r = run_cli(module_dsn, "team", "create", "fromenv", env=env)
    assert r.returncode == 0, r.stderr
    assert quota_weight(conn, "fromenv") == (33, 1) and "mh_" in r.stdout
    cli.main(["team", "create", "fromflag", "--default-team-weight", "5", "--database-url", module_dsn])
    assert quota_weight(conn, "fromflag") == (1000, 5)
    cli.main(["team", "create", "given", "--quota", "2", "--weight", "3", "--database-url", module_dsn])
    assert quota_weight(conn, "given") == (2, 3)


def test_cli_list_pages(conn, module_dsn, capsys):
    conn.execute("INSERT INTO teams (name) VALUES ('a1'), ('a2')")
    cli.main(["team", "list", "--limit", "2", "--database-url", module_dsn])
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["a1", "a2"]
    assert "--after a2" in out
    cli.main(["team", "list", "--after", "a2", "--database-url", module_dsn])
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["t", "u"]


@pytest.mark.parametrize("argv, message", [
    (["team", "set", "t"], "give --quota, --weight, --submit-rate, --submit-burst or --max-pending-jobs"),
    (["team", "set", "nobody", "--quota", "5"], "no such team 'nobody'"),
])
def test_cli_set_refusals_change_nothing(conn, module_dsn, argv, message):
    before = teams(conn)
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--database-url", module_dsn])
    assert message in str(exc.value)
    assert teams(conn) == before


@pytest.mark.parametrize("value", ["0", "-1", str(TEAM_LIMIT_MAX + 1), "1.5", "many"])
@pytest.mark.parametrize("flag", ["--quota", "--weight"])
def test_cli_refuses_a_bad_quota_or_weight_before_the_database(conn, module_dsn, flag, value):
    before = teams(conn)
    r = run_cli(module_dsn, "team", "set", "t", flag, value)
    assert r.returncode == 2 and flag in r.stderr, r.stderr
    with pytest.raises(SystemExit):
        cli.main(["team", "create", "newteam", flag, value, "--database-url", module_dsn])
    assert teams(conn) == before
