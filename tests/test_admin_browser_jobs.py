"""The admin UI's jobs, dead-jobs and series pages in headless Chromium
(tests/fixtures/browser.py) against `minutehand serve` over a seeded
database: search finds a job by id; a pending job cancelled through its
confirmation is cancelled in the database; a dead job requeued from the
dead-jobs page is scheduled again, one discarded only after its confirmation
(asked by the site's own script); a paused series gets no new run while the
dispatcher's chain runs (and, resumed, asks for one again); a team cannot see another team's job or series,
even by URL; every page free of console errors and screenshotted at
1366x768 and 390x844 (test-output/screenshots/)."""
from __future__ import annotations

import time

import psycopg
import pytest


@pytest.fixture
def db(admin_site):
    with psycopg.connect(admin_site.dsn, autocommit=True) as conn:
        conn.execute("SET search_path = minutehand")
        yield conn


def state_of(db, job_id: int) -> str:
    return db.execute("SELECT state::text FROM jobs WHERE id = %s", (job_id,)).fetchone()[0]


def runs_of(db, series_id: int) -> list[tuple[int, str]]:
    return db.execute("SELECT id, state::text FROM jobs WHERE series_id = %s ORDER BY due_at",
                      (series_id,)).fetchall()


def chain_of(db, series_id: int) -> tuple:
    """When the series wants its next run (None: never), and whether it is paused."""
    return db.execute("SELECT chain_after, paused_at IS NOT NULL FROM series WHERE id = %s", (series_id,)).fetchone()


def test_search_finds_a_job_by_id(admin_tab, admin_site):
    job_id = admin_site.seeded.pending["beta"][1]
    admin_tab.goto("/admin/jobs")
    admin_tab.page.fill("#f-id", str(job_id))
    with admin_tab.page.expect_navigation():
        admin_tab.page.press("#f-id", "Enter")
    rows = admin_tab.page.locator("#results tbody tr")
    assert rows.count() == 1 and "beta.report" in rows.first.inner_text()
    with admin_tab.page.expect_navigation():
        rows.first.locator("a").click()
    assert admin_tab.page.url.endswith(f"/admin/jobs/{job_id}")
    assert str(job_id) in admin_tab.page.inner_text("h1")
    admin_tab.screenshot("job-search-by-id")


def test_the_jobs_of_a_team_page_by_page(admin_tab, admin_site):
    admin_tab.goto("/admin/jobs?team=alpha")
    links = admin_tab.page.locator("#results tbody a")
    assert links.count() >= 10
    assert "Nothing older" in admin_tab.page.inner_text("#read-window")
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("jobs-of-team")
    admin_tab.goto("/admin/jobs?team=alpha&state=dead")
    assert admin_tab.page.locator("#results tbody tr").count() == len(admin_site.seeded.dead["alpha"])
    admin_tab.page.select_option("#f-state", "succeeded")
    with admin_tab.page.expect_navigation():
        admin_tab.page.get_by_role("button", name="Search").click()
    assert admin_tab.page.locator("#results tbody tr").count() == len(admin_site.seeded.succeeded)


def test_a_bad_search_shows_why(admin_tab):
    assert admin_tab.goto("/admin/jobs?team=alpha&due_from=2030-01-02T00:00&due_to=2030-01-01T00:00").status == 400
    assert "reversed" in admin_tab.page.inner_text("main")
    admin_tab.expected_errors("status of 400")
    admin_tab.screenshot("jobs-bad-search")


def test_cancel_a_pending_job_and_see_it_cancelled_in_the_database(admin_tab, admin_site, db):
    job_id = admin_site.seeded.pending["alpha"][0]
    admin_tab.goto(f"/admin/jobs/{job_id}")
    assert "scheduled" in admin_tab.page.inner_text("#job-state")
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("job")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#act-cancel")
    assert "Cancel job" in admin_tab.page.inner_text("h1")
    assert state_of(db, job_id) == "scheduled"                  # asked, not done
    admin_tab.screenshot("job-cancel-confirm")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#confirm")
    assert "cancelled" in admin_tab.page.inner_text("#job-state")
    assert state_of(db, job_id) == "cancelled"
    assert db.execute("""SELECT actor, action, ok FROM admin_audit WHERE target = %s""",
                      (str(job_id),)).fetchall() == [("admin", "cancel job", True)]
    assert admin_tab.page.locator("#act-cancel").count() == 0


def test_requeue_a_dead_job_and_see_it_scheduled(admin_tab, admin_site, db):
    job_id = admin_site.seeded.dead["alpha"][0]
    admin_tab.goto("/admin/dead?team=alpha")
    text = admin_tab.page.inner_text("main")
    assert "alpha.flaky" in text and "boom: connection refused by upstream" in text
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("dead")
    admin_tab.page.check(f"#pick-{job_id}")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#requeue-selected")
    assert "Requeued 1 job" in admin_tab.page.inner_text("#done")
    assert state_of(db, job_id) == "scheduled"
    assert db.execute("SELECT attempts, requeued_at IS NOT NULL FROM jobs WHERE id = %s",
                      (job_id,)).fetchone() == (0, True)
    assert db.execute("SELECT count(*) FROM dead_jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    # one name's dead jobs, with the form that takes them all (after a confirmation)
    admin_tab.goto("/admin/dead?team=beta&name=beta.flaky")
    assert admin_tab.page.locator("#dead-jobs tbody tr").count() == len(admin_site.seeded.dead["beta"])
    assert admin_tab.page.locator("#requeue-all").is_visible()
    admin_tab.screenshot("dead-by-name")


def test_pause_a_series_and_see_no_new_run(admin_tab, admin_site, db):
    series_id = admin_site.seeded.series["alpha"]
    admin_tab.goto("/admin/series?team=alpha")
    admin_tab.screenshot("series-list")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click(f"a[href='/admin/series/{series_id}']")
    assert "active" in admin_tab.page.inner_text("#series-state")
    assert admin_tab.page.locator("#fire-times li").count() == 5
    assert admin_tab.fits_every_size()
    admin_tab.screenshot("series")
    [(first_run, waiting)] = runs_of(db, series_id)
    assert waiting == "scheduled"
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#act-pause")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#confirm")
    assert "paused" in admin_tab.page.inner_text("#series-state")
    # the waiting run is cancelled, nothing asks for the next one, and the dispatcher's chain
    # (four times a second) creates none
    time.sleep(3)
    assert runs_of(db, series_id) == [(first_run, "cancelled")]
    assert chain_of(db, series_id) == (None, True)
    # resumed from the page, the chain asks for its next run again
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#act-resume")
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#confirm")
    assert "active" in admin_tab.page.inner_text("#series-state")
    after, paused = chain_of(db, series_id)
    assert after is not None and not paused
    assert [a for (a,) in db.execute("SELECT action FROM admin_audit WHERE target = %s ORDER BY id",
                                     (str(series_id),))] == ["pause series", "resume series"]


def test_a_team_cannot_see_another_teams_job_even_by_url(team_tab, admin_site):
    beta = admin_site.seeded
    team_tab.goto("/admin/jobs")
    assert "alpha.report" in team_tab.page.inner_text("main") and "beta" not in team_tab.page.inner_text("#results")
    team_tab.screenshot("jobs-team")
    for path in (f"/admin/jobs/{beta.pending['beta'][0]}", f"/admin/jobs/{beta.dead['beta'][0]}",
                 f"/admin/series/{beta.series['beta']}", "/admin/jobs?team=beta", "/admin/dead?team=beta"):
        assert team_tab.goto(path).status == 404, path
        text = team_tab.page.inner_text("main")
        assert "beta.report" not in text and "beta.flaky" not in text, path
    team_tab.expected_errors("status of 404")
    team_tab.goto(f"/admin/jobs?id={beta.pending['beta'][0]}")
    assert team_tab.page.locator("#results").count() == 0
    assert "No job" in team_tab.page.inner_text("main")
    team_tab.goto("/admin/dead")
    assert "beta" not in team_tab.page.inner_text("main")
    team_tab.screenshot("dead-team")
    team_tab.goto("/admin/series")
    assert team_tab.page.locator("#series tbody tr").count() == 1
    team_tab.screenshot("series-team")


def test_discarding_dead_jobs_asks_first_and_cancelled_changes_nothing(admin_tab, admin_site, db):
    job_id = admin_site.seeded.dead["beta"][0]
    admin_tab.goto("/admin/dead?team=beta")
    admin_tab.page.check(f"#pick-{job_id}")
    asked: list[str] = []
    admin_tab.page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    admin_tab.page.click("#discard-selected")
    admin_tab.page.wait_for_timeout(500)
    assert asked == ["Discard the selected dead jobs for good?"] and state_of(db, job_id) == "dead"
    admin_tab.page.once("dialog", lambda d: d.accept())
    with admin_tab.page.expect_navigation():
        admin_tab.page.click("#discard-selected")
    assert "Discarded 1 job" in admin_tab.page.inner_text("#done")
    assert state_of(db, job_id) == "discarded"
