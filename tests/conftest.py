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

Helpers are imported as `from tests.support import ...`, `from tests.processes
import ...`, `from tests.worker_apps import ...`, `from tests.fleet import ...`.
"""
import os
import time

import pytest

pytest_plugins = ["tests.fixtures.databases", "tests.fixtures.stores", "tests.fixtures.processes",
                  "tests.fixtures.browser"]


def pytest_runtest_setup(item):
    """MINUTEHAND_TEST_DEADLINE (Unix time): tests due to start after it are
    skipped, each saying so, instead of the run being cut off mid-test by an
    outer time limit (CI gives its second pass, on Citus, what time is left)."""
    deadline = os.environ.get("MINUTEHAND_TEST_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip("not run: the run's time budget (MINUTEHAND_TEST_DEADLINE) was spent before this test")
