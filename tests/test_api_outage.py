"""The API while its database goes away and comes back, on a throwaway
cluster of its own (the shared test server keeps running): requests answer
503 with Retry-After while it is down, /healthz stays up, and the first
request after the restart succeeds, without restarting the app."""
from __future__ import annotations

import psycopg
import pytest
from litestar.testing import TestClient

from minutehand.api.app import create_app
from minutehand.serve import api_store
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from tests.processes import local_cluster

pytestmark = pytest.mark.processes


@pytest.fixture
def cluster():
    with local_cluster("mh-outage-", fsync=False, shared_buffers="32MB", max_wal_size="256MB") as c:
        yield c


def test_database_stopped_is_503_and_restarted_serves_again(cluster):
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE mh")
    url = cluster.dsn("mh")
    migrate.upgrade(url)
    with Store(url) as s:
        token = s.create_team("t")
    settings = Settings(database_url=url, api_db_wait_s=2, api_retry_after_s=7, pool_size=4)
    store = api_store(settings)
    h = {"Authorization": f"Bearer {token}"}
    try:
        with TestClient(create_app(settings, store)) as client:
            assert client.post("/v1/jobs", headers=h, json={"name": "before"}).status_code == 201
            assert client.get("/readyz").status_code == 200

            cluster.stop()
            for _ in range(2):
                r = client.post("/v1/jobs", headers=h, json={"name": "during"})
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "7"
                assert r.headers["content-type"].startswith("application/problem+json")
                assert r.json()["type"] == "/problems/unavailable"
            assert client.get("/v1/jobs", headers=h).status_code == 503      # token cached, the read fails
            assert client.get("/readyz").status_code == 503
            assert client.get("/healthz").status_code == 200

            cluster.ensure_started()
            r = client.post("/v1/jobs", headers=h, json={"name": "after"})
            assert r.status_code == 201, r.text
            assert client.get("/readyz").status_code == 200
            assert [j["name"] for j in client.get("/v1/jobs", headers=h).json()["jobs"]] == ["after", "before"]
    finally:
        store.close()
