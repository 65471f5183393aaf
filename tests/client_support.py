"""What the client's tests share: teams and their tokens, and a small HTTP
server in front of the real one that refuses or drops the first requests it
is told to (`Front`), for the client's retries."""
from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass
class Team:
    name: str
    token: str


class Front:
    """An HTTP server that answers each request by `plan(method, path, n)`
    (n counts the requests so far, from 1): ("refuse", status, headers), or
    ("drop",) to forward the request and close the connection unanswered,
    or None to forward it and return the real answer."""

    def __init__(self, upstream: str, plan: Callable[[str, str, int], tuple | None]):
        self.upstream = upstream
        self.plan = plan
        self.seen: list[tuple[str, str, tuple | None]] = []
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                front.seen.append((self.command, self.path, None))
                action = front.plan(self.command, self.path, len(front.seen))
                front.seen[-1] = (self.command, self.path, action)
                if action is not None and action[0] == "refuse":
                    _, status, headers = action
                    content = b'{"type":"/problems/unavailable","title":"Refused","status":%d,"detail":"not now"}' % status
                    self.send_response(status)
                    for k, v in {**headers, "Content-Type": "application/problem+json",
                                 "Content-Length": str(len(content))}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(content)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                resp = httpx.request(self.command, front.upstream + self.path, headers=headers, content=body,
                                     timeout=30)
                if action is not None and action[0] == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Front:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
