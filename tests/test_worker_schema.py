"""Schemathesis against the worker protocol as a dispatcher serves it
(`minutehand dispatcher`: the worker routes and health only), with a valid
worker token: no 5xx and every response as the schema says, whatever the
body (negative capacity, huge waits, unknown jobs, stale or malformed lease
tokens, unknown fields). Jobs are due, so leases really claim some."""
from __future__ import annotations

import json
import urllib.request

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from minutehand.serve import build
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.submit import JobSpec
from tests.processes import serving
from tests.support import RESET

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SETTINGS = Settings(dispatcher_name="schema", shard_lease_s=5)


def dispatcher_app(store: Store | None):
    return build(SETTINGS, store, store, head=migrate.head(), submit_api=False).app


@pytest.fixture(scope="module")
def served(module_dsn, module_conn):
    module_conn.execute(RESET)
    store = Store(module_dsn, max_size=6, pool_options={"timeout": 5})
    token = store.create_worker_token("schema-fleet")
    store.submit_many("t", [JobSpec(name="x")] * 200)
    with serving(dispatcher_app(store), join_s=15) as url:
        yield url, token
    store.close()


SCHEMA = dispatcher_app(None).openapi_schema.to_schema()
schema = schemathesis.openapi.from_dict(SCHEMA)
schema.config.generation.update(with_security_parameters=False)    # our token, not generated ones


def test_the_served_schema_is_the_one_tested(served):
    url, _ = served
    with urllib.request.urlopen(f"{url}/schema/openapi.json") as r:
        assert json.loads(r.read()) == json.loads(json.dumps(SCHEMA))
    assert {p for p in SCHEMA["paths"] if p.startswith("/v1/worker")} == {
        "/v1/worker/lease", "/v1/worker/lease/end", "/v1/worker/outcomes", "/v1/worker/jobs/{job_id}/start",
        "/v1/worker/jobs/{job_id}/heartbeat", "/v1/worker/jobs/{job_id}/complete", "/v1/worker/jobs/{job_id}/fail", "/v1/worker/jobs/{job_id}/release"}


@schema.include(path_regex="^/v1/worker").parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_worker_protocol_conforms_to_its_schema(case, served):
    url, token = served
    if case.operation.path == "/v1/worker/lease" and isinstance(case.body, dict):
        wait = case.body.get("wait_s", 20.0)                       # keep valid long-polls short
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0.2 < wait <= 60:
            case.body["wait_s"] = 0.2
    case.call_and_validate(base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS,
                           timeout=30)
