"""How a request may arrive: limits the HTTP server enforces before the app
sees anything.

uvicorn runs with the httptools parser (app/minutehand/serve.py: ~1.5x the
requests/s of h11), which has no limit of its own on header size and no
deadline for reading a request: a client could send a 64 MB header line
(buffered in full before authentication looks at it) or trickle a request a
byte at a time and hold a connection, and its memory, for as long as it
likes. LimitedHttpTools, a subclass of uvicorn's HttpToolsProtocol, adds:

- head size: the request line and headers together at most
  max_header_bytes, else 431 and the connection is closed. Counted as bytes
  arrive (the parser keeps an unfinished header line to itself until it
  ends, so a head still incomplete after a read is refused on that count),
  and exactly when a head completes after reads that may have held more
  (so at most one read, 256 KiB, is ever held past the limit).
- head deadline: a request's head complete within header_timeout_s of its
  first byte, else 408 and closed. A connection on which no request has
  begun (just opened, or sending only blank lines) is closed after
  header_timeout_s too; idle after a response, uvicorn's keep-alive
  timeout closes it first.
- body deadline: the whole request, body included, within body_timeout_s
  of its first byte, else 408 (unless the app's response has begun) and
  closed.

Requests the parser refuses are answered 400, as problem+json like every
other refusal. The refusal is written, then the connection is half-closed and reading
stops; it is closed in full a moment later, so that the client reads the
answer rather than a reset. A deadline is armed only when a read leaves a
request incomplete: a request that arrives in one read, as nearly all do,
arms no timer.

Written against uvicorn 0.54's HttpToolsProtocol: data_received repeats
its body, to tell a head over the limit from a malformed request.
"""
from __future__ import annotations

import asyncio
import logging

import httptools
import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from minutehand.api.problems import PROBLEM_MEDIA_TYPE
from minutehand.settings import Settings
from minutehand.web.problems import HEADERS_TOO_LARGE, MALFORMED, TIMEOUT, Kind

log = logging.getLogger("uvicorn.error")

# How long a refused connection stays half-open for its answer to be read.
LINGER_S = 1.0


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the head is over the limit."""


class LimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size limit and deadlines;
    protocol_class(settings) makes one with the settings' limits."""

    max_header_bytes = 64 * 1024
    header_timeout_s = 10.0
    body_timeout_s = 30.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True        # the next bytes belong to a request's head
        self._begun = False         # a request has begun (its first byte parsed) and is not complete
        self._started_at: float | None = None    # when it began (loop time), once a deadline needs it
        self._head_bytes = 0        # bytes received while reading a head
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind: str | None = None    # "idle", "head", "body"

    # ------------------------------------------------------------ connection
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("idle", self.loop.time() + self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # HttpToolsProtocol.data_received, with the head counted and the
        # deadline set after each read.
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse_head()
            else:
                self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._disarm()                   # the connection is another protocol's now
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse_head()
            return
        self._watch()

    def _bad_request(self) -> None:
        self.send_400_response("Invalid HTTP request received.")

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what its parser refuses, as problem+json.
        self._refuse(MALFORMED, f"{msg.rstrip('.')}: the request line, a header or the body's framing is not "
                                "valid HTTP/1.1")

    # ------------------------------------------------------------ parser callbacks
    # (Called per request: kept to a few attribute writes. The head's exact
    # size is worked out only when the bytes read say it may be over.)
    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        self._begun = self._in_head = True
        self._started_at = None                  # set when a deadline needs it: by then, the read it began in

    def on_headers_complete(self) -> None:
        if self._head_bytes > self.max_header_bytes and self._head_size() > self.max_header_bytes:
            raise _HeadTooLarge
        self._in_head, self._head_bytes = False, 0
        HttpToolsProtocol.on_headers_complete(self)

    def on_message_complete(self) -> None:
        self._begun, self._in_head, self._head_bytes = False, True, 0
        HttpToolsProtocol.on_message_complete(self)

    def _head_size(self) -> int:
        """The request line and header fields, as parsed (": " and CRLF each)."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    # ------------------------------------------------------------ deadlines
    def _watch(self) -> None:
        """After a read: the deadline the connection is under now."""
        if self._begun:                          # a request is incomplete: the client owes the rest
            kind = "head" if self._in_head else "body"
            current = self._deadline_kind if self._deadline is not None else None
            if current == kind or (kind == "head" and current == "idle"):    # the earlier one stands
                return
            if self.transport.is_closing():
                return
            if self._started_at is None:
                self._started_at = self.loop.time()
            self._arm(kind, self._started_at + (self.header_timeout_s if kind == "head" else self.body_timeout_s))
        elif self.cycle is not None and not self.cycle.response_complete:
            if self._deadline is not None:       # a request is being answered: the client owes nothing
                self._disarm()
        elif self._deadline is None or self._deadline_kind != "idle":
            if not self.transport.is_closing():  # nothing begun (blank lines, or the rest of an answered body)
                self._arm("idle", self.loop.time() + self.header_timeout_s)

    def _arm(self, kind: str, at: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_at(at, self._expired)
        self._deadline_kind = kind

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_kind = None

    def _expired(self) -> None:
        self._deadline = self._deadline_kind = None
        if self.transport.is_closing():
            return
        if not self._begun:
            self.transport.close()               # nothing begun: nobody to answer
        elif self._in_head:
            self._refuse(TIMEOUT, f"the request's headers did not arrive within {self.header_timeout_s:g} s "
                                  "of its first byte")
        else:
            self._refuse(TIMEOUT, f"the request did not arrive in full within {self.body_timeout_s:g} s of "
                                  "its first byte: send the body at once, or less of it")

    # ------------------------------------------------------------ refusals
    def _refuse_head(self) -> None:
        self._refuse(HEADERS_TOO_LARGE, f"the request line and headers are over {self.max_header_bytes:,} "
                                        "bytes together: send fewer or shorter headers")

    def _refuse(self, kind: Kind, detail: str) -> None:
        """Answer (problem+json) if the answer cannot be mistaken for another
        request's, and close the connection."""
        self._disarm()
        if self.transport.is_closing():
            return
        prefix = "%s:%d - " % self.client if self.client else ""
        log.warning("%s%s: %s", prefix, kind.title, detail)
        cycle = self.cycle
        # The app's answer to this request, if it comes, goes nowhere; an
        # earlier request's answer still being written is not interrupted.
        answer = not self.pipeline
        if cycle is not None and not cycle.response_complete:
            if self._in_head or cycle.response_started:
                answer = False
            cycle.disconnected = True
            cycle.message_event.set()
        if answer:
            body = msgspec.json.encode({"type": kind.type, "title": kind.title, "status": kind.status,
                                        "detail": detail})
            head = [STATUS_LINE[kind.status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: ", PROBLEM_MEDIA_TYPE.encode(), b"\r\n",
                     b"content-length: ", str(len(body)).encode(), b"\r\n", b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
        self.flow.pause_reading()
        if answer and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def protocol_class(settings: Settings) -> type[LimitedHttpTools]:
    """LimitedHttpTools with the settings' limits (uvicorn.run(http=...))."""
    return type("LimitedHttpTools", (LimitedHttpTools,), {
        "max_header_bytes": settings.api_max_header_bytes,
        "header_timeout_s": settings.api_header_timeout_s,
        "body_timeout_s": settings.api_body_timeout_s,
    })
