"""HTTP calls to one dispatcher: the two batch endpoints of the worker
protocol (app/minutehand/protocol/) and the end of a stopping worker's
polls, over one keep-alive connection pool.

Errors are sorted into what the caller does next: `Unavailable` (connection
refused or lost, timeout, 5xx: back off and retry, perhaps elsewhere) and
`Refused` (a 4xx: the request itself is wrong, e.g. a bad worker token;
retrying it unchanged cannot help).
"""
from __future__ import annotations

import httpx
import msgspec

from minutehand.protocol import EndPollsIn, LeaseIn, LeaseOut, OutcomesIn, OutcomesOut, dec_hook, enc_hook


class Unavailable(Exception):
    """The dispatcher did not answer usefully; try again later."""


class Refused(Exception):
    """The dispatcher answered 4xx: the request was wrong."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}")
        self.status = status


_lease_out = msgspec.json.Decoder(LeaseOut, dec_hook=dec_hook)
_outcomes_out = msgspec.json.Decoder(OutcomesOut, dec_hook=dec_hook)
_encode = msgspec.json.Encoder(enc_hook=enc_hook).encode


def _decode(decoder: msgspec.json.Decoder, raw: bytes):
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:           # a proxy's error page, a truncated body, ...
        raise Unavailable(f"unreadable answer: {exc}") from exc


class DispatcherClient:
    def __init__(self, url: str, token: str, *, connect_timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
            # keep-alive: one lease long-poll plus outcome posts at a time, per dispatcher
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=8, keepalive_expiry=60),
        )

    async def lease(self, body: LeaseIn) -> LeaseOut:
        """Long-poll for jobs; the read timeout leaves the server its wait_s and some margin."""
        raw = await self._post("/v1/worker/lease", _encode(body), read_timeout_s=body.wait_s + 15.0)
        return _decode(_lease_out, raw)

    async def end_polls(self, worker: str, timeout_s: float = 5.0) -> None:
        """Have the dispatcher answer this worker's waiting long-polls now (it is stopping)."""
        await self._post("/v1/worker/lease/end", _encode(EndPollsIn(worker=worker)), read_timeout_s=timeout_s)

    async def outcomes(self, body: OutcomesIn, timeout_s: float = 10.0) -> OutcomesOut:
        """timeout_s: short enough that a frozen dispatcher is given up on (and
        another tried) well within a claim period."""
        raw = await self._post("/v1/worker/outcomes", _encode(body), read_timeout_s=timeout_s)
        return _decode(_outcomes_out, raw)

    async def _post(self, path: str, content: bytes, read_timeout_s: float) -> bytes:
        timeout = httpx.Timeout(read_timeout_s, connect=self._http.timeout.connect)
        try:
            resp = await self._http.post(path, content=content, timeout=timeout)
        except httpx.TransportError as exc:          # refused, reset, timed out, ...
            raise Unavailable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
        if resp.status_code >= 500 or resp.status_code == 429:     # overloaded, or its database away
            raise Unavailable(f"{resp.status_code}: {resp.text[:500]}")
        if resp.status_code >= 400:
            raise Refused(resp.status_code, resp.text[:2000])
        return resp.content

    async def close(self) -> None:
        await self._http.aclose()
