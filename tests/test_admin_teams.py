"""The admin UI's teams pages over HTTP (app/minutehand/admin/teams.py): an admin's
edit saved and audited in the same transaction; every bad value refused
with 422, the form shown again with the reason, and nothing written; a
team's session refused any change (403) and any other team (404); token
rotation through the UI (the old token stops working, the team's sessions
end).

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u')."""
from __future__ import annotations

import pytest
from litestar.testing import TestClient

from minutehand.store.teams import hash_token
from tests.admin_ui import csrf_of, set_tokens, sign_in, small_store, ui_app

pytestmark = pytest.mark.reused_db

ADMIN = "admin-ui-teams-secret"
TOKEN_T = "tok-admin-teams-t"
TEAM_ROW = ("SELECT quota, weight, submit_rate, submit_burst, max_pending, retention_s, token_hash "
            "FROM teams WHERE name = %s")
GOOD = {"quota": "70", "weight": "3", "submit_rate": "", "submit_burst": "", "max_pending": "", "retention_s": ""}


@pytest.fixture(scope="module")
def app(module_dsn):
    store = small_store(module_dsn)
    yield ui_app(store, ADMIN)
    store.close()


@pytest.fixture
def conn(db_dsn, module_conn):
    return set_tokens(module_conn, {"t": TOKEN_T})


@pytest.fixture
def admin(conn, app):
    with TestClient(app) as c:
        sign_in(c, ADMIN)
        yield c


def edit(client: TestClient, team: str, **fields: str):
    csrf = csrf_of(client.get("/admin/teams").text)
    return client.post(f"/admin/teams/{team}", data={**GOOD, **fields, "csrf": csrf})


def audit(conn) -> list[tuple]:
    return conn.execute("SELECT actor, action, target, ok, detail FROM admin_audit "
                        "WHERE action <> 'sign-in' ORDER BY id").fetchall()


def test_an_admin_edit_is_saved_and_audited(admin, conn):
    r = edit(admin, "t", quota="70", weight="3", submit_rate="12.5", submit_burst="40", max_pending="900",
             retention_s="3600")
    assert r.status_code == 200 and "Saved" in r.text
    assert conn.execute(TEAM_ROW, ("t",)).fetchone()[:6] == (70, 3, 12.5, 40, 900, 3600)
    (row,) = audit(conn)
    assert row[:4] == ("admin", "edit team", "t", True)
    assert row[4]["quota"] == 70 and row[4]["submit_rate"] == 12.5
    # empty fields: no rate limit (and no burst), the server's ceiling and retention
    assert edit(admin, "t").status_code == 200
    assert conn.execute(TEAM_ROW, ("t",)).fetchone()[:6] == (70, 3, None, None, None, None)


@pytest.mark.parametrize("fields,reason", [
    ({"quota": ""}, "quota: give a whole number"),
    ({"quota": "0"}, "quota: '0' is not a whole number"),
    ({"quota": "-4"}, "quota: '-4'"),
    ({"quota": "1.5"}, "quota: '1.5'"),
    ({"quota": "abc"}, "quota: 'abc'"),
    ({"quota": str(2**31)}, "quota: '2147483648'"),
    ({"quota": "٣"}, "quota: '٣'"),                               # a digit, but not an ASCII one
    ({"weight": "0"}, "weight: '0'"),
    ({"submit_rate": "0"}, "submit_rate: '0'"),
    ({"submit_rate": "-1"}, "submit_rate: '-1'"),
    ({"submit_rate": "nan"}, "submit_rate: 'nan'"),
    ({"submit_rate": "inf"}, "submit_rate: 'inf'"),
    ({"submit_rate": "1e7"}, "submit_rate: '1e7'"),
    ({"submit_rate": "fast"}, "submit_rate: 'fast'"),
    ({"submit_burst": "0", "submit_rate": "5"}, "submit_burst: '0'"),
    ({"submit_burst": "10"}, "submit_burst goes with a submit_rate"),   # the store's own check
    ({"max_pending": "0"}, "max_pending: '0'"),
    ({"retention_s": "0"}, "retention_s: '0'"),
    ({"retention_s": "315360001"}, "retention_s: 315360001 is out of range"),
])
def test_a_bad_value_is_refused_with_422_and_nothing_written(admin, conn, fields, reason):
    before = conn.execute(TEAM_ROW, ("t",)).fetchone()
    r = edit(admin, "t", **fields)
    assert r.status_code == 422, r.text
    assert "Not saved" in r.text and reason.replace("'", "&#39;") in r.text, r.text
    for name, value in fields.items():                             # the form comes back as typed
        assert f'name="{name}" type="text" inputmode="decimal" value="{value}"' in r.text
    assert conn.execute(TEAM_ROW, ("t",)).fetchone() == before
    # refused in the form: no audit entry; refused by the store: audited as refused
    assert all(not row[3] for row in audit(conn))


def test_an_unknown_or_malformed_team_is_refused(admin, conn):
    assert edit(admin, "nobody").status_code == 404
    assert admin.get("/admin/teams/nobody").status_code == 404
    assert admin.get("/admin/teams/Not%20A%20Name").status_code == 400
    assert audit(conn) == []


def test_a_team_can_change_nothing(conn, app):
    with TestClient(app) as team:
        sign_in(team, TOKEN_T)
        csrf = csrf_of(team.get("/admin/teams").text)
        before = conn.execute(TEAM_ROW, ("t",)).fetchone()
        r = team.post("/admin/teams/t", data={**GOOD, "quota": "5", "csrf": csrf})
        assert r.status_code == 403 and "for the admin" in r.text
        assert team.post("/admin/teams/t/token", data={"csrf": csrf}).status_code == 403
        assert team.post("/admin/teams/u", data={**GOOD, "csrf": csrf}).status_code == 403
        assert conn.execute(TEAM_ROW, ("t",)).fetchone() == before
        assert team.get("/admin/teams/u").status_code == 404
    assert audit(conn) == []


def test_an_edit_without_the_csrf_token_is_refused(admin, conn):
    before = conn.execute(TEAM_ROW, ("t",)).fetchone()
    for data in [{**GOOD, "quota": "5"}, {**GOOD, "quota": "5", "csrf": "x" * 43}]:
        assert admin.post("/admin/teams/t", data=data).status_code == 403
        assert admin.post("/admin/teams/t/token", data={k: v for k, v in data.items() if k == "csrf"}
                          ).status_code == 403
    assert conn.execute(TEAM_ROW, ("t",)).fetchone() == before
    assert audit(conn) == []


def test_the_admin_rotates_a_token_the_old_one_stops_and_the_teams_session_ends(admin, conn, app):
    with TestClient(app) as team:
        sign_in(team, TOKEN_T)
        assert team.get("/admin/teams").status_code == 200
        csrf = csrf_of(admin.get("/admin/teams/t").text)
        r = admin.post("/admin/teams/t/token", data={"csrf": csrf})
        assert r.status_code == 200
        new = r.text.split('<code id="new-token">')[1].split("</code>")[0]
        assert new.startswith("mh_") and conn.execute(TEAM_ROW, ("t",)).fetchone()[6] == hash_token(new)
        assert team.get("/admin/teams", follow_redirects=False).status_code == 303      # signed out
        assert sign_in(team, TOKEN_T).status_code == 401
        assert sign_in(team, new).status_code == 303
    assert [row[:4] for row in audit(conn)] == [("admin", "rotate token", "t", True)]
    assert "mh_" not in str(audit(conn))                          # the audit never holds a token


def test_a_malformed_page_cursor_is_refused(admin):
    for query in ["after=Not%20A%20Name", "after=" + "a" * 64]:
        r = admin.get(f"/admin/teams?{query}")
        assert r.status_code == 400, query
        assert "not understood" in r.text
