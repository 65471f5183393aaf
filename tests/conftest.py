"""Fixtures shared by every test module, registered here once (test modules
never import fixtures):

- tests/fixtures/databases.py: the PostgreSQL server, the migrated template,
  `db_dsn` / `db` (a fresh database per test, or the module's reused database
  in a module marked `pytestmark = pytest.mark.reused_db`), `module_dsn`,
  `module_conn`;
- tests/fixtures/stores.py: `pinned_store` / `pinned_conn` (clock pinned to
  support.T0, reused_db modules), `live_store` (real clock) and `token`;
- tests/fixtures/processes.py: `fleet` (real dispatchers and workers, tests/fleet.py);
- tests/fixtures/browser.py: the admin UI in headless Chromium (`admin_site`,
  `browser`, `admin_tab`, `team_tab`, `anon_tab`; screenshots under test-output/).

Tiers (pyproject's markers): a test is in the tier its module or itself is
marked with (processes, bench), else in `browser` if it asks for the
browser, in `db` if it asks for a database and in `unit` if not.
`ops/test -m unit` runs the fast tier alone.

Under pytest-xdist (ops/test runs the suite in parallel processes), each
process starts its own server and template; the tests of a module that
share something made once per module (a database, a server) stay in one
process, the others are handed out one by one.

Helpers are imported as `from tests.support import ...`, `from tests.processes
import ...`, `from tests.worker_apps import ...`, `from tests.fleet import ...`.
"""
import os
import time
from collections import Counter

import pytest

TIERS = ("unit", "db", "processes", "browser", "bench")

pytest_plugins = ["tests.fixtures.databases", "tests.fixtures.stores", "tests.fixtures.processes",
                  "tests.fixtures.browser"]


def pytest_runtest_setup(item):
    """MINUTEHAND_TEST_DEADLINE (Unix time): tests due to start after it are
    skipped, each saying so, instead of the run being cut off mid-test by an
    outer time limit (CI gives its second pass, on Citus, what time is left)."""
    deadline = os.environ.get("MINUTEHAND_TEST_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip("not run: the run's time budget (MINUTEHAND_TEST_DEADLINE) was spent before this test")


@pytest.hookimpl(tryfirst=True)          # before -m deselects and xdist groups by the marks
def pytest_collection_modifyitems(config, items):
    # Schemathesis gives the tests of every API operation one node id (their
    # names differ: "test_x[GET /v1/jobs]"); xdist hands tests out by node id
    # and would run one of them. Each gets its name as its id.
    ids = Counter(item.nodeid for item in items)
    for item in items:
        if ids[item.nodeid] > 1:
            _rename(item, f"{item.nodeid.rpartition('::')[0]}::{item.name}")
    grouped = getattr(config.option, "loadgroup", False)      # an xdist process of --dist loadgroup
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            names = item.fixturenames
            item.add_marker("browser" if "browser" in names else "db" if "pg_server" in names else "unit")
        if _shares_with_its_module(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
            # xdist sends a group to one process by the "@group" its node id
            # ends with; it sets that id the way pytest 9 no longer reads, so
            # each process would build the module's fixture (a million rows)
            # again, and again whenever the module's tests came back to it.
            if grouped:
                _rename(item, f"{item.nodeid}@{item.module.__name__}")
    if grouped:
        # xdist hands out the groups first, largest first, then the other
        # tests in this order: the long ones (whole processes, benchmark-like
        # loads) first, so that none of them starts last and runs alone.
        items.sort(key=lambda item: not (item.get_closest_marker("processes") or item.get_closest_marker("bench"))
                   or bool(item.get_closest_marker("xdist_group")))


def _rename(item, nodeid: str) -> None:
    if hasattr(item, "_id"):                  # pytest 9 keeps it parsed
        item._id = type(item._id).parse(nodeid)
    else:
        item._nodeid = nodeid


def _shares_with_its_module(item) -> bool:
    """Whether the test uses a fixture made once per module (a database, a
    server, a million rows): handed out one by one, each process would make
    it again, and again each time it came back to the module."""
    if item.get_closest_marker("reused_db"):         # db_dsn asks for the module's database itself
        return True
    defs = item._fixtureinfo.name2fixturedefs
    return any(d.scope in ("module", "package") for name in item.fixturenames for d in defs.get(name, ()))
