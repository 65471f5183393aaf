"""The admin UI's overview over HTTP (app/minutehand/admin/overview.py): the figures
it shows come from the counters (team_stats: the last hour per minute and
lateness), team_running (running vs quota) and load_minutes (the day ahead),
for the fleet (admin) or one team; and its live fragment is what htmx
reloads.

The tests of this module share one clone of the migrated template, emptied
before each test (teams 't' and 'u'). The clock is pinned (support.T0) for
the app's store and the test's connection alike: with the real clock, a test
that wrote "a minute ago" just before a minute's end would read it as two
minutes ago."""
from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient

from minutehand.store.stats import STATS_BOUNDS_S
from tests.admin_ui import set_tokens, sign_in, ui_app
from tests.support import make_store

pytestmark = pytest.mark.reused_db

ADMIN = "admin-ui-overview-secret"
TOKEN_U = "tok-admin-overview-u"
BUCKETS = len(STATS_BOUNDS_S) + 1


@pytest.fixture(scope="module")
def app(module_dsn):
    store = make_store(module_dsn)
    yield ui_app(store, ADMIN)
    store.close()


@pytest.fixture
def conn(pinned_conn):
    return set_tokens(pinned_conn, {"u": TOKEN_U})


def count(conn, team: str, minutes_ago: int, stripe: int, started: int, succeeded: int, failed: int, dead: int,
          late_bucket: int) -> None:
    hist = [0] * BUCKETS
    hist[late_bucket] = started
    conn.execute("""
        INSERT INTO team_stats (minute, stripe, team_id, name, submitted, started, succeeded, failed, dead, cancelled,
                                lateness_hist, runtime_hist)
        SELECT mh_minute(mh_now()) - %s * interval '1 minute', %s, t.id, 'job', 0, %s, %s, %s, %s, 0, %s, %s
          FROM teams t WHERE t.name = %s""",
                 (minutes_ago, stripe, started, succeeded, failed, dead, hist, [0] * BUCKETS, team))


def figure(html: str, label: str) -> str:
    return re.search(rf"<dt>{re.escape(label)}</dt><dd>([^<]*)</dd>", html).group(1)


def test_the_overview_shows_the_counters_of_the_last_hour(conn, app):
    count(conn, "t", 1, 16, started=7, succeeded=5, failed=2, dead=1, late_bucket=3)    # 0.1 s
    count(conn, "t", 1, 17, started=3, succeeded=0, failed=0, dead=0, late_bucket=3)
    count(conn, "u", 1, 16, started=90, succeeded=0, failed=0, dead=0, late_bucket=9)   # 10 s
    count(conn, "t", 90, -1, started=1000, succeeded=0, failed=0, dead=0, late_bucket=12)   # over an hour back
    conn.execute("INSERT INTO team_running (shard, team_id, running) SELECT 5, id, 250 FROM teams WHERE name = 't'")
    conn.execute("INSERT INTO load_minutes (minute, team_id, stripe, jobs) "
                 "VALUES (mh_minute(mh_now()) + interval '3 hours', 1, 0, 40), "
                 "(mh_minute(mh_now()) + interval '3 hours', 2, 0, 2)")
    with TestClient(app) as c:
        sign_in(c, ADMIN)
        html = c.get("/admin/").text
        assert figure(html, "Started (last minute)") == "100"
        assert figure(html, "Succeeded (last minute)") == "5"
        assert figure(html, "Failed (last minute)") == "2"
        assert figure(html, "Dead (last minute)") == "1"
        assert figure(html, "Starts counted") == "100"
        # 10 of 100 first starts 0.1 s late, 90 of them 10 s: p50 and p99 in the 10 s bucket
        assert figure(html, "p50") == "≤ 10 s" and figure(html, "p99") == "≤ 10 s"
        assert re.search(r'data-label="Team">t</td><td class="num" data-label="Running">250</td>\s*'
                         r'<td class="num" data-label="Quota">1,000</td>', html)
        assert re.search(r"Busiest minute\s+ahead: \d\d:\d\d with 42", html)
        live = c.get("/admin/overview/live").text
        assert live.startswith('<div id="live" hx-get="/admin/overview/live" hx-trigger="every 10s"')
        assert "<html" not in live
    with TestClient(app) as team:
        sign_in(team, TOKEN_U)
        html = team.get("/admin/").text
        assert figure(html, "Started (last minute)") == "90"
        assert figure(html, "p50") == "≤ 10 s"
        assert 'data-label="Team">t<' not in html and "The next 24 hours" not in html


def test_an_empty_fleet_shows_zeros_and_no_lateness(conn, app):
    with TestClient(app) as c:
        sign_in(c, ADMIN)
        html = c.get("/admin/").text
        assert figure(html, "Started (last minute)") == "0"
        assert figure(html, "p50") == "—" and figure(html, "Starts counted") == "0"
        assert re.search(r"Busiest minute\s+ahead: none", html)
