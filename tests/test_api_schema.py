"""Schemathesis against the OpenAPI schema the API serves, over every
endpoint, with a team's token and with the admin token, through a real
uvicorn server on 127.0.0.1: no 5xx, and every response (status, content
type, body) as the schema says. Few examples per operation, so the suite
stays fast; the refusal tests of test_api.py cover the edges by hand."""
from __future__ import annotations

import json
import urllib.request

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from minutehand.api.app import create_app
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.teams import hash_token
from tests.processes import serving
from tests.support import RESET

ADMIN = "admin-secret-token"
TEAM_TOKEN = "tok-team-t"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server(module_dsn, module_conn):
    module_conn.execute(RESET)                                   # teams 't' and 'u'
    module_conn.execute("UPDATE teams SET token_hash = %s WHERE name = 't'", (hash_token(TEAM_TOKEN),))
    store = Store(module_dsn, max_size=4, pool_options={"timeout": 5})
    with serving(create_app(Settings(admin_token=ADMIN), store, head=migrate.head())) as url:
        yield url
    store.close()


# The schema the app serves, built from the app itself (building it needs no
# database); test_the_served_schema_is_the_one_tested checks it is the one
# served. (Loading it lazily from the server, schemathesis.pytest.from_fixture,
# does not work with pytest 9.)
SCHEMA = create_app(Settings(admin_token=ADMIN), None, head=migrate.head()).openapi_schema.to_schema()
schema = schemathesis.openapi.from_dict(SCHEMA)
schema.config.generation.update(with_security_parameters=False)    # our tokens, not generated ones
valid_schema = schemathesis.openapi.from_dict(SCHEMA)                # for sequences: valid requests only
valid_schema.config.generation.update(with_security_parameters=False, modes=[GenerationMode.POSITIVE])
# Sequences follow only the schema's own links (a created job's id to its
# status and cancellation): links schemathesis would infer, e.g. from a
# listing's ids, draw from what the shared database holds at the time, which
# differs between runs (hypothesis refuses that as flaky generation).
valid_schema.config.phases.stateful.inference.algorithms = []
EXAMPLES = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def test_the_served_schema_is_the_one_tested(server):
    with urllib.request.urlopen(f"{server}/schema/openapi.json") as r:
        assert json.loads(r.read()) == json.loads(json.dumps(SCHEMA))


@schema.parametrize()
@EXAMPLES
def test_api_conforms_to_its_schema_with_a_team_token(case, server):
    case.call_and_validate(base_url=server, headers={"Authorization": f"Bearer {TEAM_TOKEN}"}, checks=CHECKS)


@schema.parametrize()
@EXAMPLES
def test_api_conforms_to_its_schema_with_the_admin_token(case, server):
    case.call_and_validate(base_url=server, headers={"Authorization": f"Bearer {ADMIN}"}, checks=CHECKS)


def test_stateful_submit_then_read_and_cancel(server, module_conn):
    """Sequences that follow the schema's links: a submitted job's id fed to
    its status and its cancellation."""
    # The admin's examples may have left the team a rate limit or a pending
    # ceiling that refuses every submission (429, as documented).
    module_conn.execute("UPDATE teams SET submit_rate = NULL, submit_burst = NULL, max_pending = NULL")
    steps = []

    class Workflow(valid_schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"base_url": server, "headers": {"Authorization": f"Bearer {TEAM_TOKEN}"}}

        def after_call(self, response, case):
            super().after_call(response, case)
            steps.append((case.operation.label, response.status_code))

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None,
                                   recorder=self.recorder)

    Workflow.run(settings=settings(max_examples=15, stateful_step_count=4, deadline=None, derandomize=True,
                                   suppress_health_check=list(HealthCheck)))
    followed = {label for label, status in steps if "{job_id}" in label and status == 200}
    assert followed, f"no link from a created job was followed: {sorted(set(steps))[:20]}"
