"""`Client` (sync) and `AsyncClient`: the HTTP API of app/minutehand/api/ for
a team's token, with its own types (minutehand.protocol.api), refusals as
the exceptions of errors.py, and the retries a caller would write anyway:

- 429 with Retry-After and 503 are tried again after the wait the server
  asks for (else an exponential backoff), up to `retries` times: nothing
  was written by the refused call. A 429 without Retry-After (a pending
  ceiling) is raised: waiting a moment does not clear it.
- A call that got no answer is sent again if that is safe (reads; series
  pause, resume, cancel; submissions, which carry an idempotency key made
  here when the caller gave none: the retry names the job the first
  attempt made, so a dropped connection gives one job, not two).
- submit_many sends chunks of at most the server's batch limit: it starts
  at the default (10,000) and, told a lower one (413 with max_items),
  sends chunks of that size from where it was.

Both read their URL and token, when not given, from ClientSettings
(MINUTEHAND_CLIENT_URL, MINUTEHAND_CLIENT_TOKEN, the [client] table)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx

from minutehand.client import calls, errors, traces
from minutehand.client.jobs import job, with_key
from minutehand.client.settings import ClientSettings
from minutehand.protocol.api import (BatchJobIn, BatchOut, CancelledOut, DeadDiscardedOut, DeadRequeuedOut, EventOut,
                                     EventPageOut, JobCreated, JobOut, JobSummaryOut, Repeat, SeriesControlOut,
                                     SeriesOut, SeriesRepeat, SeriesSummaryOut, SettledOut, StatsOut)

DEFAULT_MAX_BATCH = 10_000          # the server's api_max_batch unless its operator set another
MAX_WAIT_S = 60.0                   # the longest one wait between tries, whatever Retry-After says


class _Base:
    def __init__(self, url: str | None, token: str | None, *, timeout_s: float | None, retries: int | None,
                 auto_keys: bool, max_batch: int, settings: ClientSettings | None):
        if settings is None:             # the environment and the file only for what was not given
            settings = ClientSettings.load() if url is None or token is None else ClientSettings()
        self.url = (url if url is not None else settings.client_url).rstrip("/")
        self.token = token if token is not None else settings.client_token
        self.timeout_s = timeout_s if timeout_s is not None else settings.client_timeout_s
        self.retries = retries if retries is not None else settings.client_retries
        self.auto_keys = auto_keys
        self.max_batch = max_batch
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            self._headers["Authorization"] = f"Bearer {self.token}"

    def _item(self, name: str, payload: Any, options: dict[str, Any]) -> BatchJobIn:
        item = job(name, payload, **options)
        return with_key(item) if self.auto_keys else item

    def _items(self, jobs: Iterable[BatchJobIn]) -> list[BatchJobIn]:
        return [with_key(j) if self.auto_keys else j for j in jobs]

    def _wait(self, call: calls.Call, attempt: int, response: httpx.Response | None,
              exc: httpx.TransportError | None) -> float | None:
        """Seconds to wait before sending the call again; None: do not."""
        if attempt >= self.retries:
            return None
        if exc is not None:
            sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            return calls.backoff_s(attempt) if call.resend or not sent else None
        after = calls.retry_after(response.headers.get("Retry-After"))
        if response.status_code == 503 or (response.status_code == 429 and after is not None):
            return min(MAX_WAIT_S, after if after is not None else calls.backoff_s(attempt))
        return None

    def _request(self, call: calls.Call) -> dict[str, Any]:
        return {"method": call.method, "url": call.path, "params": call.params, "content": call.body,
                "headers": {**call.headers, **traces.headers()}}

    @staticmethod
    def _unavailable(call: calls.Call, exc: httpx.TransportError) -> errors.Unavailable:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return errors.Unavailable(f"{call.method} {call.path}: no answer ({text})")

    @staticmethod
    def _smaller(size: int, exc: errors.TooLarge) -> int | None:
        """The chunk size to try after a batch was refused as too large."""
        limit = exc.extra.get("max_items")
        if isinstance(limit, int) and 0 < limit < size:
            return limit
        return size // 2 if size > 1 and limit is None else None


class Client(_Base):
    """The HTTP API, sync (httpx). Use as a context manager, or close()."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float | None = None,
                 retries: int | None = None, auto_keys: bool = True, max_batch: int = DEFAULT_MAX_BATCH,
                 settings: ClientSettings | None = None, transport: httpx.BaseTransport | None = None):
        super().__init__(url, token, timeout_s=timeout_s, retries=retries, auto_keys=auto_keys,
                         max_batch=max_batch, settings=settings)
        self._http = httpx.Client(base_url=self.url, headers=self._headers, timeout=self.timeout_s,
                                  transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: calls.Call) -> Any:
        attempt = 0
        while True:
            try:
                resp = self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                wait = self._wait(call, attempt, None, exc)
                if wait is None:
                    raise self._unavailable(call, exc) from exc
            else:
                wait = self._wait(call, attempt, resp, None)
                if wait is None:
                    return calls.read(call, resp.status_code, resp.content,
                                      calls.retry_after(resp.headers.get("Retry-After")))
            time.sleep(wait)
            attempt += 1

    # ------------------------------------------------------------ jobs
    def submit(self, name: str, payload: Any = None, **options: Any) -> JobCreated:
        """One job (options: those of minutehand.client.job). created False:
        its idempotency key named an earlier job, whose id it is."""
        return self._send(calls.submit(self._item(name, payload, options)))

    def submit_many(self, jobs: Iterable[BatchJobIn]) -> BatchOut:
        """Many jobs (each made by minutehand.client.job), in chunks of at
        most the server's batch limit; items[i].idx is the job's position
        in `jobs`. A refused item is reported in its place (error)."""
        items, outs, start, size = self._items(jobs), [], 0, self.max_batch
        while start < len(items):
            chunk = items[start:start + size]
            try:
                outs.append((start, self._send(calls.submit_batch(chunk))))
            except errors.TooLarge as exc:
                if (size := self._smaller(len(chunk), exc)) is None:
                    raise
                continue
            start += len(chunk)
        return calls.merge(outs)

    def status(self, job_id: int) -> JobOut:
        return self._send(calls.status(job_id))

    def cancel(self, job_id: int) -> CancelledOut:
        """state cancelled: done; claimed: requested of the worker that holds it."""
        return self._send(calls.cancel(job_id))

    def jobs(self, *, state: str | None = None, name: str | None = None, due_before=None, due_after=None,
             page_size: int = 100) -> Iterator[JobSummaryOut]:
        """The team's jobs, newest first, page after page (keyset cursor)."""
        cursor = None
        while True:
            page = self._send(calls.jobs_page(state=state, name=name, due_before=due_before, due_after=due_after,
                                              cursor=cursor, limit=page_size))
            yield from page.jobs
            if (cursor := page.next_cursor) is None:
                return

    # ------------------------------------------------------------ series
    def create_series(self, name: str, repeat: Repeat, payload: Any = None, **options: Any) -> JobCreated:
        """A repeating job: its series_id and first run."""
        return self.submit(name, payload, repeat=repeat, **options)

    def get_series(self, series_id: int | str) -> SeriesOut:
        return self._send(calls.get_series(series_id))

    def list_series(self, *, page_size: int = 100) -> Iterator[SeriesSummaryOut]:
        cursor = None
        while True:
            page = self._send(calls.series_page(cursor, page_size))
            yield from page.series
            if (cursor := page.next_cursor) is None:
                return

    def pause_series(self, series_id: int | str) -> SeriesControlOut:
        return self._send(calls.series_action(series_id, "pause"))

    def resume_series(self, series_id: int | str) -> SeriesControlOut:
        return self._send(calls.series_action(series_id, "resume"))

    def cancel_series(self, series_id: int | str) -> SeriesControlOut:
        return self._send(calls.series_action(series_id, "cancel"))

    def change_series(self, series_id: int | str, repeat: SeriesRepeat, misfire: str | None = None
                      ) -> SeriesControlOut:
        return self._send(calls.change_series(series_id, repeat, misfire))

    # ------------------------------------------------------------ dead jobs
    def dead_jobs(self, *, name: str | None = None, page_size: int = 100) -> Iterator[JobSummaryOut]:
        return self.jobs(state="dead", name=name, page_size=page_size)

    def requeue(self, job_id: int, *, max_attempts: int | None = None) -> SettledOut:
        return self._send(calls.settle(job_id, "requeue", max_attempts))

    def discard(self, job_id: int) -> SettledOut:
        return self._send(calls.settle(job_id, "discard"))

    def requeue_dead(self, name: str, *, max_attempts: int | None = None, limit: int = 10_000) -> DeadRequeuedOut:
        return self._send(calls.settle_name(name, "requeue", max_attempts, limit))

    def discard_dead(self, name: str, *, limit: int = 10_000) -> DeadDiscardedOut:
        return self._send(calls.settle_name(name, "discard", None, limit))

    # ------------------------------------------------------------ events, stats
    def event_pages(self, after: str | None = None, *, team: str = "me", limit: int = 100
                    ) -> Iterator[EventPageOut]:
        """Pages of the team's events from the cursor `after`, up to the
        first empty one; keep the last page's next_cursor to read on later."""
        while True:
            page = self._send(calls.events_page(team, after, limit))
            yield page
            if not page.events:
                return
            after = page.next_cursor

    def events(self, after: str | None = None, *, team: str = "me", limit: int = 100) -> Iterator[EventOut]:
        for page in self.event_pages(after, team=team, limit=limit):
            yield from page.events

    def team_stats(self, *, team: str = "me", window_s: int | None = None) -> StatsOut:
        return self._send(calls.team_stats(team, window_s))


class AsyncClient(_Base):
    """The HTTP API, async (httpx): the methods of Client, awaited; the
    listings are async iterators."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout_s: float | None = None,
                 retries: int | None = None, auto_keys: bool = True, max_batch: int = DEFAULT_MAX_BATCH,
                 settings: ClientSettings | None = None, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(url, token, timeout_s=timeout_s, retries=retries, auto_keys=auto_keys,
                         max_batch=max_batch, settings=settings)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=self.timeout_s,
                                       transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: calls.Call) -> Any:
        attempt = 0
        while True:
            try:
                resp = await self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                wait = self._wait(call, attempt, None, exc)
                if wait is None:
                    raise self._unavailable(call, exc) from exc
            else:
                wait = self._wait(call, attempt, resp, None)
                if wait is None:
                    return calls.read(call, resp.status_code, resp.content,
                                      calls.retry_after(resp.headers.get("Retry-After")))
            await asyncio.sleep(wait)
            attempt += 1

    async def submit(self, name: str, payload: Any = None, **options: Any) -> JobCreated:
        return await self._send(calls.submit(self._item(name, payload, options)))

    async def submit_many(self, jobs: Iterable[BatchJobIn]) -> BatchOut:
        items, outs, start, size = self._items(jobs), [], 0, self.max_batch
        while start < len(items):
            chunk = items[start:start + size]
            try:
                outs.append((start, await self._send(calls.submit_batch(chunk))))
            except errors.TooLarge as exc:
                if (size := self._smaller(len(chunk), exc)) is None:
                    raise
                continue
            start += len(chunk)
        return calls.merge(outs)

    async def status(self, job_id: int) -> JobOut:
        return await self._send(calls.status(job_id))

    async def cancel(self, job_id: int) -> CancelledOut:
        return await self._send(calls.cancel(job_id))

    async def jobs(self, *, state: str | None = None, name: str | None = None, due_before=None, due_after=None,
                   page_size: int = 100) -> AsyncIterator[JobSummaryOut]:
        cursor = None
        while True:
            page = await self._send(calls.jobs_page(state=state, name=name, due_before=due_before,
                                                    due_after=due_after, cursor=cursor, limit=page_size))
            for j in page.jobs:
                yield j
            if (cursor := page.next_cursor) is None:
                return

    async def create_series(self, name: str, repeat: Repeat, payload: Any = None, **options: Any) -> JobCreated:
        return await self.submit(name, payload, repeat=repeat, **options)

    async def get_series(self, series_id: int | str) -> SeriesOut:
        return await self._send(calls.get_series(series_id))

    async def list_series(self, *, page_size: int = 100) -> AsyncIterator[SeriesSummaryOut]:
        cursor = None
        while True:
            page = await self._send(calls.series_page(cursor, page_size))
            for s in page.series:
                yield s
            if (cursor := page.next_cursor) is None:
                return

    async def pause_series(self, series_id: int | str) -> SeriesControlOut:
        return await self._send(calls.series_action(series_id, "pause"))

    async def resume_series(self, series_id: int | str) -> SeriesControlOut:
        return await self._send(calls.series_action(series_id, "resume"))

    async def cancel_series(self, series_id: int | str) -> SeriesControlOut:
        return await self._send(calls.series_action(series_id, "cancel"))

    async def change_series(self, series_id: int | str, repeat: SeriesRepeat, misfire: str | None = None
                            ) -> SeriesControlOut:
        return await self._send(calls.change_series(series_id, repeat, misfire))

    def dead_jobs(self, *, name: str | None = None, page_size: int = 100) -> AsyncIterator[JobSummaryOut]:
        return self.jobs(state="dead", name=name, page_size=page_size)

    async def requeue(self, job_id: int, *, max_attempts: int | None = None) -> SettledOut:
        return await self._send(calls.settle(job_id, "requeue", max_attempts))

    async def discard(self, job_id: int) -> SettledOut:
        return await self._send(calls.settle(job_id, "discard"))

    async def requeue_dead(self, name: str, *, max_attempts: int | None = None,
                           limit: int = 10_000) -> DeadRequeuedOut:
        return await self._send(calls.settle_name(name, "requeue", max_attempts, limit))

    async def discard_dead(self, name: str, *, limit: int = 10_000) -> DeadDiscardedOut:
        return await self._send(calls.settle_name(name, "discard", None, limit))

    async def event_pages(self, after: str | None = None, *, team: str = "me", limit: int = 100
                          ) -> AsyncIterator[EventPageOut]:
        while True:
            page = await self._send(calls.events_page(team, after, limit))
            yield page
            if not page.events:
                return
            after = page.next_cursor

    async def events(self, after: str | None = None, *, team: str = "me", limit: int = 100
                     ) -> AsyncIterator[EventOut]:
        async for page in self.event_pages(after, team=team, limit=limit):
            for e in page.events:
                yield e

    async def team_stats(self, *, team: str = "me", window_s: int | None = None) -> StatsOut:
        return await self._send(calls.team_stats(team, window_s))
