"""The PostgreSQL server a benchmark runs against: the one given by --dsn, or
a fresh local cluster, durable (fsync and synchronous_commit on), removed
afterwards."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from minutehand.dev.localpg import LocalCluster


@contextmanager
def bench_server(dsn: str | None, prefix: str) -> Iterator[str]:
    """A superuser DSN for the benchmark."""
    if dsn is not None:
        yield dsn
        return
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o755)                    # when root, the server runs as `postgres` and must reach it
    cluster = LocalCluster(tmp / "pgdata")
    try:
        cluster.ensure_started()
        yield cluster.dsn()
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
