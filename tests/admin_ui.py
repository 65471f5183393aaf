"""What the admin UI's HTTP tests share: the app without a dispatcher (a
test client starts it) over a small store of its own, the module's teams
given tokens, and signing in through the form."""
from __future__ import annotations

import re

import psycopg
from litestar import Litestar
from litestar.testing import TestClient

from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.teams import hash_token


def small_store(dsn: str) -> Store:
    return Store(dsn, max_size=4, pool_options={"timeout": 5})


def ui_app(store: Store, admin_token: str) -> Litestar:
    # no submit threads: the app is started (and stopped) by a client per test
    return build(Settings(admin_token=admin_token, api_submit_workers=0), store, dispatch=False,
                 head=migrate.head()).app


def set_tokens(conn: psycopg.Connection, tokens: dict[str, str]) -> psycopg.Connection:
    """Give teams (by name) these tokens; the connection, for the fixture."""
    for team, token in tokens.items():
        conn.execute("UPDATE teams SET token_hash = %s WHERE name = %s", (hash_token(token), team))
    return conn


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def sign_in(client: TestClient, token: str, next_path: str | None = None):
    page = client.get("/admin/signin", params={"next": next_path} if next_path else None)
    assert page.status_code == 200
    return client.post("/admin/signin", data={"csrf": csrf_of(page.text), "token": token,
                                              "next": next_path or "/admin/"}, follow_redirects=False)
