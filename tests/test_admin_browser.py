"""The admin UI's own pages in headless Chromium (tests/fixtures/browser.py)
against `minutehand serve` over a seeded database: sign-in, the overview
(and its live refresh), dispatchers and shards, teams (an edit saved, one
refused), the audit page, a stranger sent to sign in, a form posted without
its CSRF token refused, a team's view, a token rotated only after the
confirmation the site's own script asks, an inline handler refused by the
Content-Security-Policy; every page free of console errors and
screenshotted at 1366x768 and 390x844 (test-output/screenshots/)."""
from __future__ import annotations

import psycopg
import pytest

from tests.fixtures.browser import WORKER


@pytest.fixture
def db(admin_site):
    with psycopg.connect(admin_site.dsn, autocommit=True) as conn:
        yield conn


def quota_of(db, team: str) -> int:
    return db.execute("SELECT quota FROM minutehand.teams WHERE name = %s", (team,)).fetchone()[0]


def test_a_stranger_is_sent_to_sign_in_and_comes_back_after(anon_tab, admin_site):
    anon_tab.goto("/admin/teams")
    assert "/admin/signin" in anon_tab.page.url
    assert anon_tab.page.locator("#token").is_visible()
    anon_tab.screenshot("signin")
    anon_tab.page.fill("#token", "not-a-token")
    with anon_tab.page.expect_navigation():
        anon_tab.page.press("#token", "Enter")
    assert "unknown token" in anon_tab.page.inner_text("main")
    anon_tab.expected_errors("status of 401")
    anon_tab.page.fill("#token", admin_site.seeded.tokens["beta"])
    with anon_tab.page.expect_navigation():
        anon_tab.page.click("button[type=submit]")
    assert anon_tab.page.url.endswith("/admin/teams")            # where it was going
    assert "team beta" in anon_tab.page.inner_text("header")


def test_the_overview_shows_the_fleet_and_refreshes_itself(admin_tab):
    admin_tab.goto("/admin/")
    text = admin_tab.page.inner_text("main")
    for heading in ("Last hour, per minute", "Lateness", "Running vs quota", "The next 24 hours"):
        assert heading in text
    assert admin_tab.page.locator("svg.chart").count() == 2
    assert admin_tab.page.locator("table >> text=alpha").count() == 1
    # htmx (vendored, served from /admin/static) reloads the live part
    with admin_tab.page.expect_response(lambda r: "/admin/overview/live" in r.url and r.status == 200,
                                        timeout=20_000):
        pass
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("overview")


def test_the_dispatchers_page_shows_leases_and_the_seeded_worker(admin_tab, admin_site):
    admin_tab.goto("/admin/dispatchers")
    text = admin_tab.page.inner_text("main")
    assert admin_site.server.name in text                     # the server's dispatcher holds shards
    assert WORKER in text
    assert str(admin_site.seeded.running[0]) in text
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("dispatchers")


def test_the_admin_edits_a_team_and_a_bad_value_is_refused(admin_tab, db):
    admin_tab.goto("/admin/teams")
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("teams")
    admin_tab.page.click("text=alpha")
    admin_tab.page.fill("#f-quota", "77")
    with admin_tab.page.expect_navigation():
        admin_tab.page.press("#f-quota", "Enter")
    assert "Saved" in admin_tab.page.inner_text("main")
    assert quota_of(db, "alpha") == 77
    admin_tab.page.fill("#f-quota", "0")
    admin_tab.page.fill("#f-weight", "lots")
    with admin_tab.page.expect_navigation():
        admin_tab.page.get_by_role("button", name="Save", exact=True).click()
    assert "Not saved" in admin_tab.page.inner_text("main")
    assert admin_tab.page.locator("[aria-invalid=true]").count() == 1
    admin_tab.expected_errors("status of 422")
    assert quota_of(db, "alpha") == 77
    admin_tab.screenshot("team-edit-refused")
    admin_tab.goto("/admin/audit")
    first = admin_tab.page.locator("tbody tr").first.inner_text()
    assert "edit team" in first and "alpha" in first
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("audit")


def test_a_form_posted_without_its_csrf_token_is_refused(admin_tab, db):
    admin_tab.goto("/admin/teams/beta")
    admin_tab.page.fill("#f-quota", "5")
    admin_tab.page.evaluate("document.querySelector('main form input[name=csrf]').remove()")
    with admin_tab.page.expect_navigation():
        admin_tab.page.get_by_role("button", name="Save", exact=True).click()
    assert "CSRF" in admin_tab.page.inner_text("main")
    admin_tab.expected_errors("status of 403")
    assert quota_of(db, "beta") == 20
    admin_tab.screenshot("csrf-refused")


def test_a_team_sees_its_own_team_read_only_and_nothing_of_the_fleet(team_tab):
    team_tab.goto("/admin/")
    assert "team alpha" in team_tab.page.inner_text("main")
    assert "The next 24 hours" not in team_tab.page.inner_text("main")
    team_tab.screenshot("overview-team")
    team_tab.goto("/admin/teams")
    assert team_tab.page.locator("tbody tr").count() == 1
    team_tab.goto("/admin/teams/alpha")
    assert team_tab.page.locator("form input[name=quota]").count() == 0     # read-only
    assert team_tab.goto("/admin/teams/beta").status == 404
    assert team_tab.goto("/admin/dispatchers").status == 403
    team_tab.expected_errors("status of 404", "status of 403")


def test_the_keyboard_reaches_the_skip_link_and_the_navigation(admin_tab):
    admin_tab.goto("/admin/")
    admin_tab.page.keyboard.press("Tab")
    assert admin_tab.page.evaluate("document.activeElement.textContent") == "Skip to content"
    for _ in range(2):
        admin_tab.page.keyboard.press("Tab")
    assert admin_tab.page.evaluate("document.activeElement.textContent") == "Overview"
    with admin_tab.page.expect_navigation():
        for _ in range(6):
            admin_tab.page.keyboard.press("Tab")
        admin_tab.page.keyboard.press("Enter")                   # the 7th link: Audit
    assert admin_tab.page.url.endswith("/admin/audit")


def test_an_ended_session_takes_the_live_overview_back_to_sign_in(admin_tab, db):
    admin_tab.goto("/admin/")
    db.execute("DELETE FROM minutehand.admin_sessions")          # signed out elsewhere (or expired)
    admin_tab.page.wait_for_url("**/admin/signin?next=*", timeout=25_000)   # at the next refresh
    assert admin_tab.page.url.endswith("/admin/signin?next=%2Fadmin%2F")      # back to the page, not the fragment
    assert admin_tab.page.locator("#token").is_visible()


def test_a_token_is_rotated_only_after_the_confirmation_and_no_inline_script_runs(admin_tab, admin_site, db):
    from tests.support import make_store

    store = make_store(admin_site.dsn, clock=None)
    try:
        store.create_team("gamma")
    finally:
        store.close()

    def token_hash() -> str:
        return db.execute("SELECT token_hash FROM minutehand.teams WHERE name = 'gamma'").fetchone()[0]

    before = token_hash()
    response = admin_tab.goto("/admin/teams/gamma")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    asked: list[str] = []
    admin_tab.page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    admin_tab.page.get_by_role("button", name="Rotate the token").click()
    admin_tab.page.wait_for_timeout(500)
    assert asked == ["Rotate the token of team gamma? The old token stops working at once."]
    assert token_hash() == before and admin_tab.page.locator("#new-token").count() == 0
    admin_tab.page.once("dialog", lambda d: d.accept())
    with admin_tab.page.expect_navigation():
        admin_tab.page.get_by_role("button", name="Rotate the token").click()
    assert admin_tab.page.locator("#new-token").is_visible() and token_hash() != before
    # an inline handler (as injected markup would carry) does not run
    admin_tab.page.evaluate("""document.querySelector('main').insertAdjacentHTML('beforeend',
        '<button id="injected" onclick="document.title = \\'ran\\'">x</button>')""")
    admin_tab.page.click("#injected")
    assert admin_tab.page.title() != "ran"
    admin_tab.expected_errors("Content Security Policy")      # the handler refused, and said so
