"""Schemathesis against the OpenAPI schema the API serves, over every
endpoint, with a team's token and with the admin token, through a real
uvicorn server on 127.0.0.1, with every check it has (its `--checks all`):
no 5xx; every response (status, content type, headers, body) as the schema
says; OPTIONS and 405 list the methods the schema has for the path; what
the schema refuses the server refuses, and what it accepts the server
accepts, but for what no schema can say (NO_SCHEMA_SAYS, below). Few
examples per operation, so the suite stays fast; the refusal tests of
test_api.py cover the edges by hand."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import (allow_header_conformance, content_type_conformance,
                                               ensure_resource_availability, ignored_auth, missing_required_header,
                                               negative_data_rejection, object_level_authorization,
                                               positive_data_acceptance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance,
                                               unsupported_method)

from minutehand.api.app import create_app
from minutehand.settings import Settings
from minutehand.store import migrate
from minutehand.store.store import Store
from minutehand.store.teams import hash_token
from tests.processes import serving
from tests.support import RESET

ADMIN = "admin-secret-token"
TEAM_TOKEN = "tok-team-t"

# What the server refuses of a request the schema accepts, where no schema
# can say it: each by the start of the problem's detail, with why. Any other
# refusal of a schema-valid request fails the run.
NO_SCHEMA_SAYS = {
    r"an admin token acts for every team": "?team= is optional for a team's token, needed by the admin's; "
                                           "an operation has one schema for both",
    r"repeat\.(cron|timezone) ": "what a crontab expression or a zone name means, APScheduler and zoneinfo read",
    r"due time .* is (before|more than)": "the due time's bounds: no JSON Schema keyword bounds a date-time, and "
                                          "the horizon moves with the clock",
    r"(a strict job cannot have a flex window|backoff cap must be between the backoff base|"
    r"submit_burst goes with a submit_rate)": "a rule between two fields, or a field and the team's stored limits",
    r"payload (cannot be stored|is nested)": "payload is any JSON; jsonb holds no \\u0000, and depth is capped",
    r"(after is not a cursor|cursor is not one) this API returned": "an opaque cursor: only one the API made",
    r"url (must|is not a URL)": "what an absolute http(s) URL with a host is, urllib.parse reads",
}
_SERVER_ONLY = re.compile("|".join(NO_SCHEMA_SAYS))


def _float_rounded_id(url: str) -> bool:
    """The one gap in schemathesis itself: it writes the bounds of a 64-bit
    path id through a float (-2**63 as -9223372036854776000), just past them."""
    ids = (int(n) for n in re.findall(r"/(-?[0-9]{19,20})(?=[/?]|$)", url))
    return any(0 < abs(n) - 2**63 <= 4096 or n == 2**63 for n in ids)


def _problem(response) -> dict:
    try:
        body = json.loads(response.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def positive_data_acceptance_but_what_no_schema_says(ctx, response, case):
    """A schema-valid request is accepted, or refused for a reason of
    NO_SCHEMA_SAYS (or carries a float-rounded id)."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code in (400, 422) and _SERVER_ONLY.match(str(_problem(response).get("detail", ""))):
            return None
        if response.status_code == 400 and _float_rounded_id(response.request.url):
            return None
        raise


def negative_data_rejection_as_documented(ctx, response, case):
    """A schema-violating request is refused, 413 included (a body over the
    endpoint's byte limit is refused unread: a schema bounds values, not the
    length of their JSON text); but a batch, as docs/reference/http-api.md says, reports an
    item it cannot take in its place and answers 200 for the others."""
    try:
        return negative_data_rejection(ctx, response, case)
    except AcceptedNegativeData:
        if response.status_code == 413:
            return None
        if case.operation.label == "POST /v1/jobs/batch" and _problem(response).get("rejected"):
            return None
        raise


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, positive_data_acceptance_but_what_no_schema_says,
          negative_data_rejection_as_documented, missing_required_header, unsupported_method,
          allow_header_conformance, ensure_resource_availability, ignored_auth, object_level_authorization]
# Not use_after_free: DELETE /v1/jobs/{id} cancels a job, which stays readable
# (state cancelled) for its retention, as docs/operations/retention.md says.


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


def _wait_until_the_team_token_is_taken(server: str, ceiling_s: float = 30.0) -> None:
    """A rotation's refusal of the old token may still be remembered for the
    token cache's period."""
    deadline = time.monotonic() + ceiling_s
    request = urllib.request.Request(f"{server}/v1/teams/me/stats",
                                     headers={"Authorization": f"Bearer {TEAM_TOKEN}"})
    while True:
        try:
            with urllib.request.urlopen(request):
                return
        except urllib.error.HTTPError as e:
            if e.code != 401 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_stateful_submit_then_read_and_cancel(server, module_conn):
    """Sequences that follow the schema's links: a submitted job's id fed to
    its status and its cancellation."""
    # The admin's examples may have rotated the team's token (401 from then
    # on) or left it a rate limit or a pending ceiling that refuses every
    # submission (429, as documented).
    module_conn.execute("UPDATE teams SET submit_rate = NULL, submit_burst = NULL, max_pending = NULL, "
                        "token_hash = %s WHERE name = 't'", (hash_token(TEAM_TOKEN),))
    _wait_until_the_team_token_is_taken(server)
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
