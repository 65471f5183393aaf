"""The process tests/test_chain_processes.py kills with SIGKILL: it
continues the chain of repeating series in small batches, one commit each,
until it is killed. Imports only the store, so a forkserver starts it in
milliseconds."""
from __future__ import annotations

import datetime as dt

from minutehand.store.store import Store


def chain_until_killed(dsn: str, clock: str, limit: int, ready) -> None:
    store = Store(dsn, max_size=1, clock=dt.datetime.fromisoformat(clock))
    with store.connection():                      # connected (and clock set) before the work starts
        pass
    ready.set()
    while True:
        store.continue_series(range(256), limit)
