"""The admin UI's jobs, dead-jobs and series pages over HTTP (app/minutehand/admin/jobs.py,
dead.py, series.py): what they show, what their actions change (and audit),
and every bad input a browser can send — a bad id, state, date, reversed
range, cursor, an unknown series, an action on a job in the wrong state, a
form without its CSRF token — answered with a clear 4xx page and nothing
written. A team sees only its own team's jobs, dead jobs and series, even by
URL: another team's job or series is 404, as an unknown one.

The tests share one clone of the migrated template, emptied before each
test (teams 't' and 'u')."""
from __future__ import annotations

import datetime as dt
import re

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.store.outcomes import Fail
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.admin_ui import set_tokens, small_store, ui_app
from tests.support import claim

pytestmark = pytest.mark.reused_db

ADMIN = "admin-pages-secret"
TOKENS = {"t": "tok-pages-t", "u": "tok-pages-u"}


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
    return set_tokens(module_conn, TOKENS)


@pytest.fixture
def admin(conn, app):
    with TestClient(app) as c:
        sign_in(c, ADMIN)
        yield c


@pytest.fixture
def team_t(conn, app):
    with TestClient(app) as c:
        sign_in(c, TOKENS["t"])
        yield c


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def sign_in(client: TestClient, token: str) -> None:
    page = client.get("/admin/signin")
    r = client.post("/admin/signin", data={"csrf": csrf_of(page.text), "token": token, "next": "/admin/"},
                    follow_redirects=False)
    assert r.status_code == 303


def csrf(client: TestClient) -> str:
    return csrf_of(client.get("/admin/jobs").text)


# ---------------------------------------------------------------- what a test writes and reads
def submit(store: Store, team: str = "t", name: str = "job", **kw) -> int:
    return store.submit(team, JobSpec(name=name, **kw)).job_id


def dead_job(store: Store, team: str = "t", name: str = "job", error: str = "boom") -> int:
    """A job of the team that failed on its last attempt (claimed and failed through the store)."""
    job_id = submit(store, team, name, max_attempts=1)
    leases = store.take_leases([job_id & 1023], "d1", 3600)
    [c] = [c for c in claim(store, leases, 100).jobs if c.job_id == job_id]
    assert store.fail([Fail(job_id, c.lease_token, error)])[0].state == "dead"
    return job_id


def state_of(conn: psycopg.Connection, job_id: int) -> str:
    return conn.execute("SELECT state::text FROM jobs WHERE id = %s", (job_id,)).fetchone()[0]


def written(conn: psycopg.Connection) -> tuple:
    """Everything an action could change: every job's state and attempts, the dead letters,
    the series' pause and cancel marks, and the audit entries that record a change."""
    return conn.execute("""SELECT (SELECT coalesce(array_agg(id::text || state::text || attempts ORDER BY id), '{}')
                                     FROM jobs),
                                  (SELECT count(*) FROM dead_jobs),
                                  (SELECT coalesce(array_agg(coalesce(paused_at, cancelled_at)::text ORDER BY id), '{}')
                                     FROM series),
                                  (SELECT count(*) FROM admin_audit WHERE ok)""").fetchone()


def audit(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("""SELECT actor, action, target, ok FROM admin_audit
                            WHERE action NOT IN ('sign-in', 'sign-out') ORDER BY id""").fetchall()


# ---------------------------------------------------------------- jobs: search
def test_search_by_id_finds_the_job_and_links_to_it(admin, ui_store):
    job_id = submit(ui_store, "u", "report")
    page = admin.get("/admin/jobs", params={"id": str(job_id)})
    assert page.status_code == 200
    assert f'href="/admin/jobs/{job_id}"' in page.text and "report" in page.text


def test_search_by_team_lists_newest_first_with_keyset_pages(admin, ui_store):
    ids = [submit(ui_store, "t", f"n{i}") for i in range(55)]
    submit(ui_store, "u", "other")
    first = admin.get("/admin/jobs", params={"team": "t"})
    assert first.status_code == 200
    shown = [int(x) for x in re.findall(r'href="/admin/jobs/(\d+)"', first.text)]
    assert shown == sorted(ids, reverse=True)[:50]
    older = re.search(r'href="/admin/jobs(\?[^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    assert f"before={shown[-1]}" in older
    second = admin.get("/admin/jobs" + older)
    assert [int(x) for x in re.findall(r'href="/admin/jobs/(\d+)"', second.text)] == sorted(ids, reverse=True)[50:]
    assert 'rel="next"' not in second.text


def test_search_filters_by_name_state_and_due_range(admin, ui_store, conn):
    now = conn.execute("SELECT now()").fetchone()[0]
    soon = submit(ui_store, "t", "a", due_at=now + dt.timedelta(hours=2))
    later = submit(ui_store, "t", "a", due_at=now + dt.timedelta(hours=5))
    other = submit(ui_store, "t", "b", due_at=now + dt.timedelta(hours=2))
    fmt = "%Y-%m-%dT%H:%M:%S"
    page = admin.get("/admin/jobs", params={"team": "t", "name": "a", "state": "scheduled",
                                            "due_from": (now + dt.timedelta(hours=1)).strftime(fmt),
                                            "due_to": (now + dt.timedelta(hours=3)).strftime(fmt)})
    assert page.status_code == 200
    assert {int(x) for x in re.findall(r'href="/admin/jobs/(\d+)"', page.text)} == {soon}
    assert later and other
    none = admin.get("/admin/jobs", params={"team": "t", "state": "dead"})
    assert none.status_code == 200 and "No job on this page matches" in none.text


@pytest.mark.parametrize("params,says", [
    ({"id": "abc"}, "id must be a job id"),
    ({"id": "-5"}, "id must be a job id"),
    ({"id": "99999999999999999999"}, "id must be a job id"),
    ({"team": "t", "state": "exploded"}, "state must be one of"),
    ({"team": "t", "due_from": "yesterday"}, "due from must be a date"),
    ({"team": "t", "due_to": "2030-13-45T00:00"}, "due to must be a date"),
    ({"team": "t", "due_from": "2030-01-02T00:00", "due_to": "2030-01-01T00:00"}, "reversed"),
    ({"team": "t", "due_from": "2030-01-01T00:00+01:00", "due_to": "2030-01-01T00:00+02:00"}, "reversed"),
    ({"team": "t", "due_from": "0001-01-01T00:00+05:00"}, "out of range"),
    ({"team": "t", "due_from": "2030-01-01T00:00", "due_to": "2030-01-01T00:00"}, "reversed"),
    ({"team": "t", "before": "xyz"}, "page cursor"),
    ({"team": "t", "before": "0"}, "page cursor"),
    ({"team": "Not A Team!"}, "is not a team name"),
    ({"team": "t", "name": "x" * 300}, "at most 200 characters"),
    ({"state": "dead"}, "needs a team"),                 # the admin must name one
    ({"name": "mail"}, "needs a team"),
])
def test_a_bad_search_is_a_400_page_that_says_why(admin, params, says):
    r = admin.get("/admin/jobs", params=params)
    assert r.status_code == 400, r.text
    assert says in r.text.replace("&#39;", "'")


def test_an_unknown_team_is_404(admin):
    r = admin.get("/admin/jobs", params={"team": "nobody"})
    assert r.status_code == 404 and "no such team" in r.text


def test_the_search_form_alone_asks_for_a_team_or_an_id(admin):
    r = admin.get("/admin/jobs")
    assert r.status_code == 200 and "Give a job id, or a team" in r.text


# ---------------------------------------------------------------- jobs: the job page
def test_the_job_page_shows_the_whole_record(admin, ui_store, conn):
    job_id = dead_job(ui_store, "t", "mail", error="smtp down")
    conn.execute("UPDATE jobs SET payload = %s WHERE id = %s", ('{"to": "a@b.c", "n": [1, 2]}', job_id))
    page = admin.get(f"/admin/jobs/{job_id}")
    assert page.status_code == 200
    text = page.text
    for shown in ("mail", "dead", "smtp down", "&#34;to&#34;: &#34;a@b.c&#34;", "Agreed run time", "Lateness",
                  "Claimed after run time", "Times it became dead", "d1"):
        assert shown in text or shown.replace("&#34;", "&quot;") in text, shown
    assert 'id="act-requeue"' in text and 'id="act-discard"' in text and 'id="act-cancel"' not in text


def test_a_large_payload_is_cut(admin, ui_store, conn):
    job_id = submit(ui_store, "t", "big", payload={"blob": "x" * 50_000})
    page = admin.get(f"/admin/jobs/{job_id}")
    assert page.status_code == 200
    assert "Cut to its first 16,384 characters" in page.text
    assert "x" * 20_000 not in page.text


@pytest.mark.parametrize("path", ["/admin/jobs/123", "/admin/jobs/99999999999999999999", "/admin/jobs/abc",
                                  "/admin/jobs/-1"])
def test_an_unknown_or_malformed_job_id_is_404(admin, path):
    r = admin.get(path)
    assert r.status_code == 404


# ---------------------------------------------------------------- jobs: actions
def test_cancel_asks_first_then_cancels_and_audits(admin, ui_store, conn):
    job_id = submit(ui_store, "t", "later", due_at=conn.execute("SELECT now() + interval '1 hour'").fetchone()[0])
    token = csrf(admin)
    ask = admin.post(f"/admin/jobs/{job_id}/cancel", data={"csrf": token})
    assert ask.status_code == 200 and "Cancel job" in ask.text and 'name="confirm" value="yes"' in ask.text
    assert state_of(conn, job_id) == "scheduled" and audit(conn) == []
    done = admin.post(f"/admin/jobs/{job_id}/cancel", data={"csrf": token, "confirm": "yes"}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/admin/jobs/{job_id}?done=cancel"
    assert state_of(conn, job_id) == "cancelled"
    assert audit(conn) == [("admin", "cancel job", str(job_id), True)]
    assert "the job is now <strong>cancelled</strong>" in admin.get(done.headers["location"]).text


def test_requeue_and_discard_of_a_dead_job(admin, ui_store, conn):
    a, b = dead_job(ui_store), dead_job(ui_store)
    token = csrf(admin)
    admin.post(f"/admin/jobs/{a}/requeue", data={"csrf": token, "confirm": "yes"})
    admin.post(f"/admin/jobs/{b}/discard", data={"csrf": token, "confirm": "yes"})
    assert (state_of(conn, a), state_of(conn, b)) == ("scheduled", "discarded")
    assert audit(conn) == [("admin", "requeue job", str(a), True), ("admin", "discard job", str(b), True)]


@pytest.mark.parametrize("op", ["requeue", "discard"])
@pytest.mark.parametrize("confirm", [None, "yes"])
def test_an_action_on_a_job_in_the_wrong_state_is_409_and_writes_nothing(admin, ui_store, conn, op, confirm):
    job_id = submit(ui_store, "t")                                  # scheduled, not dead
    before = written(conn)
    data = {"csrf": csrf(admin), **({"confirm": confirm} if confirm else {})}
    r = admin.post(f"/admin/jobs/{job_id}/{op}", data=data)
    assert r.status_code == 409 and "scheduled" in r.text
    assert written(conn) == before


def test_cancel_of_a_finished_job_is_409(admin, ui_store, conn):
    job_id = dead_job(ui_store)
    before = written(conn)
    r = admin.post(f"/admin/jobs/{job_id}/cancel", data={"csrf": csrf(admin), "confirm": "yes"})
    assert r.status_code == 409 and "dead" in r.text
    assert written(conn) == before
    assert audit(conn)[-1:] == [("admin", "cancel job", str(job_id), False)]    # the refusal is on the audit page


def test_an_unknown_action_is_404(admin, ui_store):
    job_id = submit(ui_store, "t")
    assert admin.post(f"/admin/jobs/{job_id}/explode", data={"csrf": csrf(admin)}).status_code == 404


@pytest.mark.parametrize("path", ["/admin/jobs/{job}/cancel", "/admin/dead", "/admin/dead/all",
                                  "/admin/series/{series}/pause"])
@pytest.mark.parametrize("token", [None, "forged"])
def test_a_form_without_its_csrf_token_is_refused_and_writes_nothing(admin, ui_store, conn, path, token):
    job = submit(ui_store, "t", due_at=conn.execute("SELECT now() + interval '1 hour'").fetchone()[0])
    dead = dead_job(ui_store)
    series = ui_store.submit_series("t", JobSpec(name="tick", repeat=_every(60))).series_id
    before = written(conn)
    data = {"confirm": "yes", "team": "t", "name": "job", "op": "requeue", "job": str(dead),
            **({"csrf": token} if token else {})}
    r = admin.post(path.format(job=job, series=series), data=data)
    assert r.status_code == 403 and "CSRF" in r.text
    assert written(conn) == before


def _every(seconds: int):
    from minutehand.store.records import Repeat
    return Repeat(every_s=seconds)


# ---------------------------------------------------------------- dead jobs
def test_dead_jobs_by_name_with_their_last_error(admin, ui_store):
    mail = [dead_job(ui_store, "t", "mail", error=f"smtp {i}") for i in range(3)]
    sms = dead_job(ui_store, "t", "sms", error="no carrier")
    dead_job(ui_store, "u", "mail", error="not t's")
    page = admin.get("/admin/dead", params={"team": "t"})
    assert page.status_code == 200
    assert re.search(r"mail</a>\s*<span class=\"muted\">\(3\)", page.text)
    assert "no carrier" in page.text and "smtp 2" in page.text and "not t&#39;s" not in page.text
    one = admin.get("/admin/dead", params={"team": "t", "name": "mail"})
    assert {int(x) for x in re.findall(r'name="job" value="(\d+)"', one.text)} == set(mail)
    assert sms


def test_dead_jobs_page_in_keyset_pages(admin, ui_store):
    ids = [dead_job(ui_store, "t", "x") for _ in range(52)]
    first = admin.get("/admin/dead", params={"team": "t", "name": "x"})
    got = [int(x) for x in re.findall(r'name="job" value="(\d+)"', first.text)]
    assert got == sorted(ids)[:50]
    nxt = re.search(r'href="/admin/dead(\?[^"]+)" rel="next"', first.text).group(1).replace("&amp;", "&")
    second = admin.get("/admin/dead" + nxt)
    assert [int(x) for x in re.findall(r'name="job" value="(\d+)"', second.text)] == sorted(ids)[50:]


def test_requeue_and_discard_selected_in_one_post(admin, ui_store, conn):
    a, b, c = (dead_job(ui_store, "t", "mail") for _ in range(3))
    r = admin.post("/admin/dead", data={"csrf": csrf(admin), "team": "t", "name": "mail", "op": "requeue",
                                        "job": [str(a), str(b)]}, follow_redirects=False)
    assert r.status_code == 303 and "done=requeue%3A2" in r.headers["location"]
    assert [state_of(conn, j) for j in (a, b, c)] == ["scheduled", "scheduled", "dead"]
    admin.post("/admin/dead", data={"csrf": csrf(admin), "team": "t", "op": "discard", "job": str(c)})
    assert state_of(conn, c) == "discarded"
    assert [(x[1], x[3]) for x in audit(conn)] == [("requeue dead jobs", True), ("discard dead jobs", True)]


def test_a_selection_with_one_job_no_longer_dead_changes_none(admin, ui_store, conn):
    a = dead_job(ui_store)
    alive = submit(ui_store, "t")
    before = written(conn)
    r = admin.post("/admin/dead", data={"csrf": csrf(admin), "team": "t", "op": "requeue",
                                        "job": [str(a), str(alive)]})
    assert r.status_code == 409 and str(alive) in r.text
    assert written(conn) == before


@pytest.mark.parametrize("data,status,says", [
    ({"team": "t", "op": "requeue"}, 400, "select at least one"),
    ({"team": "t", "op": "explode", "job": "1"}, 400, "choose requeue or discard"),
    ({"team": "t", "op": "requeue", "job": "abc"}, 400, "a selected job must be"),
    ({"op": "requeue", "job": "1"}, 400, "name the team"),
    ({"team": "nobody", "op": "requeue", "job": "1"}, 404, "no such team"),
    ({"team": "t", "op": "requeue", "job": "12345"}, 404, "no job 12345"),
    ({"team": "t", "op": "requeue", "job": [str(i) for i in range(1, 60)]}, 400, "at most 50"),
])
def test_a_bad_dead_jobs_form_is_refused_and_writes_nothing(admin, ui_store, conn, data, status, says):
    dead_job(ui_store)
    before = written(conn)
    r = admin.post("/admin/dead", data={"csrf": csrf(admin), **data})
    assert r.status_code == status and says in r.text
    assert written(conn) == before


def test_every_dead_job_of_a_name_after_a_confirmation(admin, ui_store, conn):
    mail = [dead_job(ui_store, "t", "mail") for _ in range(3)]
    other = dead_job(ui_store, "t", "sms")
    theirs = dead_job(ui_store, "u", "mail")
    form = {"csrf": csrf(admin), "team": "t", "name": "mail", "op": "requeue"}
    ask = admin.post("/admin/dead/all", data=form)
    assert ask.status_code == 200 and "every dead job of team t named mail" in ask.text
    assert [state_of(conn, j) for j in mail] == ["dead"] * 3
    r = admin.post("/admin/dead/all", data={**form, "confirm": "yes"}, follow_redirects=False)
    assert r.status_code == 303 and "done=requeue%3A3" in r.headers["location"]
    assert [state_of(conn, j) for j in mail] == ["scheduled"] * 3
    assert (state_of(conn, other), state_of(conn, theirs)) == ("dead", "dead")
    assert audit(conn) == [("admin", "requeue dead jobs named", "mail", True)]


@pytest.mark.parametrize("data,status,says", [
    ({"team": "t", "op": "requeue"}, 400, "name the team and the job name"),
    ({"team": "t", "name": "mail", "op": "burn"}, 400, "choose requeue or discard"),
    ({"team": "nobody", "name": "mail", "op": "requeue"}, 404, "no such team"),
])
def test_a_bad_name_wide_form_is_refused_and_writes_nothing(admin, ui_store, conn, data, status, says):
    dead_job(ui_store, "t", "mail")
    before = written(conn)
    r = admin.post("/admin/dead/all", data={"csrf": csrf(admin), "confirm": "yes", **data})
    assert r.status_code == status and says in r.text
    assert written(conn) == before


@pytest.mark.parametrize("params,says", [
    ({"team": "t", "after_id": "5"}, "needs both"),
    ({"team": "t", "after_name": "x"}, "needs both"),
    ({"team": "t", "after_name": "x", "after_id": "nope"}, "page cursor"),
    ({"team": "t", "name": "a", "after_name": "b", "after_id": "5"}, "another name"),
    ({"team": "BAD NAME"}, "is not a team name"),
])
def test_a_bad_dead_jobs_address_is_400(admin, params, says):
    r = admin.get("/admin/dead", params=params)
    assert r.status_code == 400 and says in r.text


# ---------------------------------------------------------------- series
def test_series_list_and_page_with_next_and_last_runs(admin, ui_store):
    series_id = ui_store.submit_series("t", JobSpec(name="tick", repeat=_every(60))).series_id
    listing = admin.get("/admin/series", params={"team": "t"})
    assert listing.status_code == 200 and f'href="/admin/series/{series_id}"' in listing.text
    page = admin.get(f"/admin/series/{series_id}")
    assert page.status_code == 200
    assert "every 60 s" in page.text and page.text.count("UTC</li>") == 5 and 'id="runs"' in page.text
    assert 'id="act-pause"' in page.text and 'id="act-resume"' not in page.text


def test_pause_resume_cancel_ask_first_then_act_and_audit(admin, ui_store, conn):
    series_id = ui_store.submit_series("t", JobSpec(name="tick", repeat=_every(60))).series_id
    token = csrf(admin)
    ask = admin.post(f"/admin/series/{series_id}/pause", data={"csrf": token})
    assert ask.status_code == 200 and 'name="confirm" value="yes"' in ask.text
    assert conn.execute("SELECT paused_at FROM series").fetchone()[0] is None
    for op, state in (("pause", "paused"), ("resume", "active"), ("cancel", "cancelled")):
        r = admin.post(f"/admin/series/{series_id}/{op}", data={"csrf": token, "confirm": "yes"},
                       follow_redirects=False)
        assert r.status_code == 303
        assert f"the series is now <strong>{state}</strong>" in admin.get(r.headers["location"]).text
    assert [a[1] for a in audit(conn)] == ["pause series", "resume series", "cancel series"]


@pytest.mark.parametrize("op", ["resume", "pause", "cancel"])
def test_a_control_the_state_does_not_allow_is_409(admin, ui_store, conn, op):
    series_id = ui_store.submit_series("t", JobSpec(name="tick", repeat=_every(60))).series_id
    ui_store.cancel_series("t", series_id)
    before = written(conn)
    r = admin.post(f"/admin/series/{series_id}/{op}", data={"csrf": csrf(admin), "confirm": "yes"})
    assert r.status_code == 409 and "cancelled" in r.text
    assert written(conn) == before


@pytest.mark.parametrize("path", ["/admin/series/12345", "/admin/series/99999999999999999999", "/admin/series/x"])
def test_an_unknown_series_is_404(admin, path):
    assert admin.get(path).status_code == 404


def test_a_bad_series_cursor_is_400(admin):
    r = admin.get("/admin/series", params={"team": "t", "after": "zzz"})
    assert r.status_code == 400 and "page cursor" in r.text


# ---------------------------------------------------------------- a team sees only its own
def test_a_team_sees_only_its_own_jobs_even_by_url(team_t, ui_store, conn):
    mine, theirs = submit(ui_store, "t", "mine"), submit(ui_store, "u", "theirs")
    theirs_dead = dead_job(ui_store, "u", "theirs", error="secret of u")
    theirs_series = ui_store.submit_series("u", JobSpec(name="tick", repeat=_every(60))).series_id
    assert team_t.get(f"/admin/jobs/{mine}").status_code == 200
    for path in (f"/admin/jobs/{theirs}", f"/admin/jobs/{theirs_dead}", f"/admin/series/{theirs_series}"):
        r = team_t.get(path)
        assert r.status_code == 404 and "theirs" not in r.text and "secret of u" not in r.text, path
    by_id = team_t.get("/admin/jobs", params={"id": str(theirs)})
    assert by_id.status_code == 200 and f"/admin/jobs/{theirs}" not in by_id.text
    for path in ("/admin/jobs", "/admin/dead", "/admin/series"):
        assert team_t.get(path, params={"team": "u"}).status_code == 404, path
    listing = team_t.get("/admin/jobs")                     # a team's search lists its own at once
    assert f"/admin/jobs/{mine}" in listing.text and "theirs" not in listing.text
    assert "secret of u" not in team_t.get("/admin/dead").text
    before = written(conn)
    token = csrf(team_t)
    for path, data in ((f"/admin/jobs/{theirs}/cancel", {}), (f"/admin/jobs/{theirs_dead}/requeue", {}),
                       (f"/admin/series/{theirs_series}/pause", {}),
                       ("/admin/dead", {"team": "t", "op": "requeue", "job": str(theirs_dead)}),
                       ("/admin/dead/all", {"team": "u", "name": "theirs", "op": "requeue"})):
        r = team_t.post(path, data={"csrf": token, "confirm": "yes", **data})
        assert r.status_code == 404, path
    assert written(conn) == before
