"""The admin UI's access over HTTP (app/minutehand/admin/access.py): sign-in with the
admin token or a team's, the session cookie's attributes, the redirect of
every page to the sign-in page, CSRF on every form (refused with 403 and
nothing written), sign-out, a rotated token ending a team's session, and
the audit page (newest first, keyset pages, a team sees its own); the
security headers on every response (error pages and static files too), no
CSRF token on the page of a refused request, no script in a template, and
failed sign-ins audited and throttled per client address.

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u')."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from litestar.testing import TestClient

import minutehand.admin
from minutehand.admin.throttle import SignInThrottle

from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store import errors
from minutehand.store.admin import AuditNote
from minutehand.store.submit import JobSpec
from minutehand.store.teams import hash_token
from tests.admin_ui import csrf_of, set_tokens, sign_in, small_store, ui_app

pytestmark = pytest.mark.reused_db

ADMIN = "admin-ui-secret"
TOKEN_T, TOKEN_U = "tok-admin-ui-t", "tok-admin-ui-u"
PAGES = ["/admin/", "/admin/overview/live", "/admin/audit", "/admin/teams", "/admin/teams/t", "/admin/dispatchers"]


@pytest.fixture(scope="module")
def ui_store(module_dsn):
    s = small_store(module_dsn)
    yield s
    s.close()


@pytest.fixture(scope="module")
def app(ui_store):
    return ui_app(ui_store, ADMIN)


@pytest.fixture
def conn(db_dsn, module_conn):
    return set_tokens(module_conn, {"t": TOKEN_T, "u": TOKEN_U})


@pytest.fixture
def client(conn, app):
    with TestClient(app) as c:
        yield c


def audit_rows(conn) -> list[tuple]:
    return conn.execute("SELECT actor, team_id, action, target, ok FROM admin_audit ORDER BY id").fetchall()


def test_every_page_sends_a_stranger_to_the_sign_in_page(client):
    for page in PAGES:
        r = client.get(page, follow_redirects=False)
        assert r.status_code == 303, page
        assert r.headers["location"].startswith("/admin/signin?next="), page
    r = client.get("/admin/overview/live", headers={"HX-Request": "true", "HX-Current-URL": "http://x/admin/?a=1"},
                   follow_redirects=False)
    assert r.status_code == 204 and r.headers["HX-Redirect"] == "/admin/signin?next=%2Fadmin%2F%3Fa%3D1"
    r = client.get("/admin/overview/live", headers={"HX-Request": "true", "HX-Current-URL": "https://evil.example/"},
                   follow_redirects=False)
    assert r.headers["HX-Redirect"] == "/admin/signin?next=%2Fadmin%2F"
    # the sign-in page itself and the static files need no session
    assert client.get("/admin/signin").status_code == 200
    assert client.get("/admin/static/htmx.min.js").status_code == 200
    assert client.get("/admin/static/admin.css").status_code == 200


def test_the_admin_signs_in_with_a_session_cookie_and_is_audited(client, conn):
    r = sign_in(client, ADMIN, "/admin/audit")
    assert r.status_code == 303 and r.headers["location"] == "/admin/audit"
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("mh_admin="))
    attrs = cookie.lower()
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/admin" in attrs
    assert "secure" not in attrs            # plain http here; over TLS the cookie is Secure
    page = client.get("/admin/audit")
    assert page.status_code == 200 and "sign-in" in page.text
    # only the session id's hash is stored
    session_id = cookie.split(";")[0].split("=", 1)[1]
    stored = conn.execute("SELECT id_hash, team_id FROM admin_sessions").fetchall()
    assert stored == [(hash_token(session_id), None)]
    assert audit_rows(conn) == [("admin", None, "sign-in", "admin", True)]


def test_no_admin_page_can_be_framed_by_another_site(client):
    for page in ["/admin/signin", "/admin/"]:                  # (pages: static files are not pages)
        headers = client.get(page).headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"], page
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"


def test_the_cookie_is_secure_over_tls(conn, app):
    with TestClient(app, base_url="https://testserver.local") as c:
        r = sign_in(c, ADMIN)
        cookie = next(v for v in r.headers.get_list("set-cookie") if v.startswith("mh_admin="))
        assert "secure" in cookie.lower()


@pytest.mark.parametrize("token", ["", "wrong-token", ADMIN + "x", "x" * 5000])
def test_a_bad_token_is_refused_with_401_and_no_session(client, conn, token):
    r = sign_in(client, token)
    assert r.status_code == 401
    assert "token" in r.text
    assert conn.execute("SELECT count(*) FROM admin_sessions").fetchone()[0] == 0
    assert client.get("/admin/", follow_redirects=False).status_code == 303


def test_a_sign_in_without_its_form_token_is_refused(client, conn):
    client.get("/admin/signin")
    r = client.post("/admin/signin", data={"token": ADMIN, "csrf": "forged"}, follow_redirects=False)
    assert r.status_code == 403
    r = client.post("/admin/signin", data={"token": ADMIN}, follow_redirects=False)
    assert r.status_code == 403
    assert conn.execute("SELECT count(*) FROM admin_sessions").fetchone()[0] == 0


def test_no_admin_sign_in_without_an_admin_token_setting(conn, ui_store):
    app = build(Settings(admin_token="", api_submit_workers=0), ui_store, dispatch=False, head=migrate.head()).app
    with TestClient(app) as c:
        assert sign_in(c, "").status_code == 401
        assert sign_in(c, TOKEN_T).status_code == 303


def test_next_never_leads_off_the_admin_ui(client):
    for target in ["https://evil.example/", "//evil.example/admin", "/v1/jobs", "/admin\\..\\x"]:
        r = sign_in(client, ADMIN, target)
        assert r.headers["location"] == "/admin/", target


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(client, conn):
    sign_in(client, ADMIN)
    before = audit_rows(conn)
    for data in [{}, {"csrf": "forged"}, {"csrf": ""}]:
        r = client.post("/admin/signout", data=data, follow_redirects=False)
        assert r.status_code == 403
        assert "CSRF" in r.text
    assert audit_rows(conn) == before
    assert client.get("/admin/audit").status_code == 200         # still signed in


def test_sign_out_ends_the_session(client, conn):
    sign_in(client, ADMIN)
    csrf = csrf_of(client.get("/admin/audit").text)
    r = client.post("/admin/signout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/signin"
    assert conn.execute("SELECT count(*) FROM admin_sessions").fetchone()[0] == 0
    assert client.get("/admin/audit", follow_redirects=False).status_code == 303
    assert audit_rows(conn)[-1] == ("admin", None, "sign-out", "admin", True)


def test_a_stolen_cookie_without_its_csrf_token_cannot_sign_out(client, conn):
    sign_in(client, TOKEN_T)
    with TestClient(client.app) as other:
        other.cookies.set("mh_admin", client.cookies.get("mh_admin"), path="/admin")
        assert other.post("/admin/signout", data={"csrf": "guess"}).status_code == 403
    assert conn.execute("SELECT count(*) FROM admin_sessions").fetchone()[0] == 1


def test_a_team_token_rotated_ends_the_teams_session(client, conn):
    assert sign_in(client, TOKEN_T).status_code == 303
    assert client.get("/admin/audit").status_code == 200
    conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token("new"),))
    assert client.get("/admin/audit", follow_redirects=False).status_code == 303


def test_a_changed_admin_token_ends_the_admins_session(client, conn, ui_store):
    sign_in(client, ADMIN)
    other = build(Settings(admin_token="another", api_submit_workers=0), ui_store, dispatch=False, head=migrate.head()).app
    with TestClient(other) as c:
        c.cookies.set("mh_admin", client.cookies.get("mh_admin"), path="/admin")
        assert c.get("/admin/audit", follow_redirects=False).status_code == 303


def test_an_expired_session_goes_back_to_the_sign_in_page(client, conn):
    sign_in(client, ADMIN)
    conn.execute("UPDATE admin_sessions SET expires_at = now() - interval '1 second'")
    assert client.get("/admin/audit", follow_redirects=False).status_code == 303


def test_the_audit_page_is_newest_first_keyset_paged_and_a_team_sees_its_own(client, conn, ui_store):
    for i in range(60):
        ui_store.audit(AuditNote("admin", "0" * 12, "t" if i % 2 else "u", "probe", f"p{i}"))
    sign_in(client, ADMIN)
    first = client.get("/admin/audit").text
    targets = re.findall(r"<code>(p\d+)</code>", first)
    assert targets[0] == "sign-in" or targets[:3] == ["p59", "p58", "p57"]
    older = re.search(r'href="/admin/audit\?before=(\d+)"', first).group(1)
    second = client.get(f"/admin/audit?before={older}").text
    seen = targets + re.findall(r"<code>(p\d+)</code>", second)
    assert seen == [f"p{i}" for i in range(59, -1, -1)]
    assert client.get("/admin/audit?before=0").status_code == 400
    assert client.get("/admin/audit?before=x").status_code == 400
    with TestClient(client.app) as team:
        sign_in(team, TOKEN_T)
        own = re.findall(r"<code>(p\d+)</code>", team.get("/admin/audit").text)
        assert own and all(int(p[1:]) % 2 for p in own)


def test_an_action_and_its_audit_entry_commit_together(conn, ui_store):
    note = AuditNote("admin", "0" * 12, "t", "set quota", "t")
    ui_store.audited(note, lambda: ui_store.update_team("t", quota=5))
    assert conn.execute("SELECT quota FROM teams WHERE name = 't'").fetchone()[0] == 5
    with pytest.raises(Exception):
        ui_store.audited(note, lambda: (ui_store.update_team("t", quota=6), ui_store.update_team("t", quota=0)))
    # the first update rolled back with the refused second; the refusal is audited on its own
    assert conn.execute("SELECT quota FROM teams WHERE name = 't'").fetchone()[0] == 5
    assert [r[4] for r in audit_rows(conn)] == [True, False]
    assert conn.execute("SELECT detail->>'refused' FROM admin_audit ORDER BY id DESC LIMIT 1").fetchone()[0]


def test_every_page_renders_for_the_admin_and_a_team_sees_only_what_is_its_own(client):
    sign_in(client, ADMIN)
    for page in PAGES:
        r = client.get(page)
        assert r.status_code == 200, (page, r.text[:500])
        assert 'href="/admin/static/htmx.min.js"' in r.text or "<script src=\"/admin/static/htmx.min.js\"" in r.text \
            or page == "/admin/overview/live"
    with TestClient(client.app) as team:
        sign_in(team, TOKEN_T)
        for page in ["/admin/", "/admin/overview/live", "/admin/audit", "/admin/teams", "/admin/teams/t"]:
            assert team.get(page).status_code == 200, page
        refused = team.get("/admin/dispatchers")
        assert refused.status_code == 403 and "for the admin" in refused.text
        other = team.get("/admin/teams/u")
        assert other.status_code == 404 and "no such team" in other.text
        assert ">u<" not in team.get("/admin/teams").text


def test_a_procedures_refusal_inside_an_audited_action_is_the_stores_error(conn, ui_store):
    note = AuditNote("admin", "0" * 12, "t", "submit", "t")
    with pytest.raises(errors.InvalidInput):
        ui_store.audited(note, lambda: ui_store.submit("t", JobSpec(name="x", max_attempts=0)))
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert [r[4] for r in audit_rows(conn)] == [False]


# ---------------------------------------------------------------- hardening
def assert_secured(r, what: str) -> None:
    """The security headers of every /admin response."""
    assert (r.headers.get("x-frame-options"), r.headers.get("x-content-type-options"),
            r.headers.get("referrer-policy")) == ("DENY", "nosniff", "same-origin"), (what, r.status_code, r.headers)
    policy = dict(d.strip().split(" ", 1) for d in r.headers.get("content-security-policy", "").split(";"))
    assert policy.get("script-src") == "'self'" and policy.get("frame-ancestors") == "'none'", (what, policy)
    assert policy.get("default-src") == "'self'" and policy.get("object-src") == "'none'", (what, policy)


def test_every_admin_response_carries_the_security_headers_error_pages_and_static_files_too(client, ui_store):
    job_id = ui_store.submit("t", JobSpec(name="waits")).job_id
    seen = {
        "sign-in page": client.get("/admin/signin"),
        "redirect to sign in": client.get("/admin/jobs", follow_redirects=False),
        "htmx": client.get("/admin/static/htmx.min.js"),
        "stylesheet": client.get("/admin/static/admin.css"),
        "script": client.get("/admin/static/admin.js"),
        "no such static file": client.get("/admin/static/nothing.js"),
        "no such page": client.get("/admin/nothing/here"),
        "no such method": client.delete("/admin/"),
        "unknown token": sign_in(client, "not-a-token"),
        "expired sign-in form": client.post("/admin/signin", data={"token": ADMIN, "csrf": "forged"}),
    }
    sign_in(client, ADMIN)
    csrf = csrf_of(client.get("/admin/audit").text)
    seen |= {
        "page": client.get("/admin/"),
        "fragment": client.get("/admin/overview/live"),
        "400": client.get("/admin/audit?before=x"),
        "404": client.get("/admin/teams/nobody"),
        "409": client.post(f"/admin/jobs/{job_id}/requeue", data={"csrf": csrf}),
        "403 without CSRF": client.post("/admin/signout", data={"csrf": "forged"}),
    }
    assert [(what, r.status_code) for what, r in seen.items()] == [
        ("sign-in page", 200), ("redirect to sign in", 303), ("htmx", 200), ("stylesheet", 200), ("script", 200),
        ("no such static file", 404), ("no such page", 404), ("no such method", 405), ("unknown token", 401), ("expired sign-in form", 403), ("page", 200),
        ("fragment", 200), ("400", 400), ("404", 404), ("409", 409), ("403 without CSRF", 403)]
    for what, r in seen.items():
        assert_secured(r, what)
    assert "content-security-policy" not in client.get("/healthz").headers      # the API's are not pages


def test_a_refused_request_gets_no_csrf_token_and_no_sign_out_form(client):
    sign_in(client, ADMIN)
    refused = client.post("/admin/signout", data={"csrf": "forged"})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert 'name="csrf"' not in refused.text and "Sign out" not in refused.text
    stranger = TestClient(client.app)
    with stranger:
        missing = stranger.get("/admin/static/nothing.js")
        assert missing.status_code == 404 and 'name="csrf"' not in missing.text
    # a page (an error page too) of a request the guard let through is the signed-in browser's own
    own = client.get("/admin/teams/nobody")
    assert own.status_code == 404 and "Sign out" in own.text and 'name="csrf"' in own.text


def test_no_template_holds_a_script_or_an_inline_handler():
    """script-src 'self' runs none of them: behaviour lives in static/admin.js
    (data-confirm), and htmx may not evaluate code (hx-on, hx-vars, js:)."""
    folder = Path(minutehand.admin.__file__).parent / "templates"
    for template in folder.glob("*.html"):
        text = template.read_text()
        assert not re.search(r"\son[a-z]+\s*=", text, re.I), f"{template.name}: an inline event handler"
        assert not re.search(r"<script(?![^>]*\bsrc=)", text, re.I), f"{template.name}: an inline script"
        assert not re.search(r"javascript:|hx-on|hx-vars|js:", text, re.I), f"{template.name}: code in an attribute"
    base = (folder / "base.html").read_text()
    assert "/static/admin.js" in base and '"allowEval": false' in base


def test_failed_sign_ins_are_audited_and_then_throttled_per_client(conn, ui_store):
    with TestClient(ui_app(ui_store, ADMIN)) as c:        # a server of its own: a throttle of its own
        for i in range(10):
            assert sign_in(c, f"guess-{i}").status_code == 401
        throttled = sign_in(c, "guess-10")
        assert throttled.status_code == 429 and "too many failed sign-ins" in throttled.text
        assert 1 <= int(throttled.headers["retry-after"]) <= 6
        assert_secured(throttled, "429")
        # the right token too: while throttled, no token is looked at
        assert sign_in(c, ADMIN).status_code == 429
    assert conn.execute("SELECT count(*) FROM admin_sessions").fetchone()[0] == 0
    rows = conn.execute("SELECT actor, team_id, action, target, ok, detail->>'refused' FROM admin_audit "
                        "ORDER BY id").fetchall()
    assert rows == [("stranger", None, "sign-in", "testclient", False, "unknown token")] * 10
    # the admin reads them on the audit page
    with TestClient(ui_app(ui_store, ADMIN)) as c:
        assert sign_in(c, ADMIN).status_code == 303
        assert c.get("/admin/audit").text.count("stranger") == 10


def test_the_throttle_refills_and_keeps_clients_apart():
    now = [0.0]
    throttle = SignInThrottle(failures=3, per_s=30, max_clients=2, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.wait_s("a") == 0
        throttle.failed("a")
    assert throttle.wait_s("a") == pytest.approx(10)        # one try back every 10 s
    assert throttle.wait_s("b") == 0                        # another address
    now[0] = 10
    assert throttle.wait_s("a") == 0                        # one try: a failure would empty it again
    throttle.failed("b")
    throttle.failed("c")                                    # over max_clients: the oldest bucket (a's) goes
    for _ in range(3):
        assert throttle.wait_s("a") == 0
        throttle.failed("a")
