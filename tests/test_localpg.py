"""minutehand.dev.localpg against real PostgreSQL binaries: start, reuse, stop, restart with data kept."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from minutehand.dev.localpg import LocalCluster

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def data_dir():
    # Not pytest's tmp_path: as root that sits in a 0700 directory the `postgres`
    # user cannot enter, and the cluster would be relocated to /var/tmp.
    tmp = Path(tempfile.mkdtemp(prefix="mh-localpg-"))
    tmp.chmod(0o755)
    yield tmp / "pgdata"
    LocalCluster(tmp / "pgdata").stop()  # in case the test failed half-way
    shutil.rmtree(tmp, ignore_errors=True)


def query(cluster: LocalCluster, sql: str):
    with psycopg.connect(cluster.dsn(), autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql)
        return cur.fetchone() if cur.description else None


def test_start_reuse_stop_restart(data_dir):
    cluster = LocalCluster(data_dir, fsync=False)
    cluster.ensure_started()
    port = cluster.port
    assert cluster.dsn("x") == f"postgresql://postgres@127.0.0.1:{port}/x"
    (system_id,) = query(cluster, "SELECT system_identifier FROM pg_control_system()")
    assert query(cluster, "SHOW max_locks_per_transaction") == ("1024",)
    assert query(cluster, "SHOW fsync") == ("off",)
    postmaster = (data_dir / "postmaster.pid").read_text().splitlines()[0]

    # A second call and a second process both reuse the running server.
    cluster.ensure_started()
    code = "import sys; from minutehand.dev.localpg import LocalCluster; c = LocalCluster(sys.argv[1]); c.ensure_started(); print(c.port)"
    out = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=True,
    )
    assert cluster.port == port and int(out.stdout) == port
    assert (data_dir / "postmaster.pid").read_text().splitlines()[0] == postmaster  # not restarted

    query(cluster, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
    cluster.stop()
    with pytest.raises(psycopg.OperationalError):
        query(cluster, "SELECT 1")
    cluster.stop()  # stopping a stopped cluster is fine

    cluster.ensure_started()
    assert cluster.port == port  # remembered
    assert query(cluster, "SELECT system_identifier FROM pg_control_system()") == (system_id,)  # no re-init
    assert query(cluster, "SELECT v FROM kept") == (42,)
    cluster.stop()
