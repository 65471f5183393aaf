"""Submitting from Python: the HTTP API as a client (sync `Client`, async
`AsyncClient`), submits inside your own database transaction (`submit`,
`submit_many` and their `_async` forms, on psycopg or SQLAlchemy), and
tasks, a job name with a typed payload shared by submitter and worker.

    from minutehand.client import Client, job

    with Client("http://127.0.0.1:8080", token="mht_...") as client:
        created = client.submit("send_report", {"to": "ops"})
        print(client.status(created.job_id).state)

Modules: http.py (Client, AsyncClient: retries, chunking), calls.py (each
API call as data), jobs.py (a job to submit, idempotency keys), tx.py (in
your transaction), tasks.py (task), errors.py (one exception class per
kind of refusal), settings.py (ClientSettings: MINUTEHAND_CLIENT_URL,
MINUTEHAND_CLIENT_TOKEN, the [client] table), traces.py (the caller's
traceparent, with OpenTelemetry installed).

Like the worker library, it needs only the base install (httpx, msgspec):
psycopg and SQLAlchemy are never imported, their connections only used.
The request and answer types are the API's own (minutehand.protocol.api).
"""
from minutehand.client.errors import (Conflict, Forbidden, Invalid, Malformed, MinutehandError, NotCancellable,
                                      NotDead, NotFound, Overloaded, PendingCeiling, RateLimited, ServerError,
                                      TooLarge, Unauthorized, Unavailable)
from minutehand.client.http import AsyncClient, Client
from minutehand.client.jobs import job
from minutehand.client.settings import ClientSettings
from minutehand.client.tasks import PayloadError, Task, task
from minutehand.client.tx import submit, submit_async, submit_many, submit_many_async
from minutehand.protocol.api import Repeat, SeriesRepeat

__all__ = ["AsyncClient", "Client", "ClientSettings", "Conflict", "Forbidden", "Invalid", "Malformed",
           "MinutehandError", "NotCancellable", "NotDead", "NotFound", "Overloaded", "PayloadError",
           "PendingCeiling", "RateLimited", "Repeat", "SeriesRepeat", "ServerError", "Task", "TooLarge",
           "Unauthorized", "Unavailable", "job", "submit", "submit_async", "submit_many", "submit_many_async",
           "task"]
