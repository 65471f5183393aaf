"""Every worker keeps a long-poll open at every dispatcher, an open file
each: a `minutehand dispatcher` started with a low soft limit of open files
(1,024 on many systems) raises it to the hard limit, and holds more polls
than the limit it was started with."""
from __future__ import annotations

import asyncio
import json
import re
import resource
from pathlib import Path

import pytest

from tests.processes import Server, logs

pytestmark = pytest.mark.processes

GIVEN = 256          # the soft limit the dispatcher starts with
POLLS = 400          # long-polls held at once: more than it


def soft_and_hard(pid: int) -> tuple[int, int]:
    line = next(l for l in Path(f"/proc/{pid}/limits").read_text().splitlines() if l.startswith("Max open files"))
    soft, hard = re.findall(r"\d+|unlimited", line)[:2]
    return int(soft), int(hard)


async def long_polls(port: int, token: str, n: int, wait_s: float) -> list:
    """n long-polls held at once, each on a connection of its own: each one's
    status, or the error that ended it."""
    async def poll(i: int):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"worker": f"w{i}", "capacity": 1, "names": [f"nothing.due-{i}"],
                               "wait_s": wait_s}).encode()
            writer.write(f"POST /v1/worker/lease HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
            answer = await asyncio.wait_for(reader.read(), wait_s + 60)
            writer.close()
            return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else answer[:80]
        except (OSError, asyncio.TimeoutError) as exc:
            return repr(exc)
    return await asyncio.gather(*(poll(i) for i in range(n)))


def test_a_dispatcher_started_with_a_low_open_file_limit_holds_more_polls_than_it(db_dsn, live_store):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < POLLS + 500:
        pytest.skip(f"the hard limit of open files here ({hard}) is below {POLLS + 500}")
    token = live_store.create_worker_token("fleet")
    resource.setrlimit(resource.RLIMIT_NOFILE, (GIVEN, hard))     # what the child inherits
    try:
        server = Server(db_dsn, role="dispatcher")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        started_soft, started_hard = soft_and_hard(server.pid)
        assert started_soft == started_hard > GIVEN, logs(server)
        answers = asyncio.run(long_polls(server.port, token, POLLS, wait_s=5))
        assert answers == [200] * POLLS, (sorted(set(map(str, answers))), logs(server))
        assert server.alive(), logs(server)
    finally:
        server.stop()
