"""The composition root of `minutehand serve` and `minutehand dispatcher`:
builds the stores (pools that fail fast when the database is away and
reconnect when it is back), the dispatcher, its outcome writer, the
maintenance duties, the submit threads and the HTTP app, and runs them in
one uvicorn process, started in order and stopped in reverse
(minutehand.lifecycle). SIGTERM stops it cleanly (status 0): long-polls are
answered at once, requests in flight get shutdown_grace_s, then the parts
stop — the outcome writer writes what it has, the shard leases are given
back."""
from __future__ import annotations

import gc
import logging
import resource
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import uvicorn
from litestar import Litestar
from psycopg.conninfo import make_conninfo

from minutehand.admin.app import admin_ui
from minutehand.api.app import create_app
from minutehand.api.coalesce import SubmitCoalescer
from minutehand.api.limits import protocol_class
from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.dispatch.outcomes import OutcomeWriter
from minutehand.lifecycle import Service, Services
from minutehand.maintenance.schedule import MaintenanceSchedule
from minutehand.maintenance.webhooks import WebhookDeliverer
from minutehand.settings import Settings
from minutehand.store.store import Store
from minutehand.web.admission import Admission


def api_store(settings: Settings) -> Store:
    """A store for the API: a request waits at most api_db_wait_s for a
    connection (then 503); one connection attempt gives up after 5 s (an
    unreachable host must not hold a thread for long); a lost connection is
    retried (with backoff) for api_db_wait_s, then replaced on demand, so
    the pool reconnects within seconds of the database coming back."""
    url = make_conninfo(settings.database_url, connect_timeout=5)
    return Store(url, min_size=min(2, settings.pool_size), max_size=settings.pool_size,
                 pool_options={"timeout": settings.api_db_wait_s,
                               "reconnect_timeout": settings.api_db_wait_s}, pool_name="api")


def dispatcher_store(settings: Settings) -> Store:
    """The dispatcher's own store: a connection attempt gives up after 5 s,
    and a lost connection is replaced on demand."""
    return Store(make_conninfo(settings.database_url, connect_timeout=5), min_size=min(2, settings.pool_size),
                 max_size=settings.pool_size, pool_options={"timeout": 10.0, "reconnect_timeout": 10.0},
                 pool_name="dispatcher")


def quiet_gc() -> None:
    """Fewer, cheaper garbage collections: the objects alive at start-up (the
    app, its routes and schema, the modules) are frozen out of every future
    collection, and the young generation is collected every 50,000
    allocations rather than 700. Measured with 64 connections of single
    submissions: p99 latency 60 ms -> 13 ms (the full collections were the
    tail), throughput unchanged or better."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def open_files_for_long_polls() -> int:
    """Every worker keeps a long-poll open at every dispatcher, a file each:
    the soft limit of open files (1,024 on many systems, which a fleet of a
    thousand workers reaches) raised to the hard limit. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):      # an infinite hard limit the kernel caps lower: keep the soft one
            pass
    logging.getLogger(__name__).info("open files: at most %s (a worker's long-poll holds one)", soft)
    return soft


class StoppingServer(uvicorn.Server):
    """uvicorn's server; at the stop signal, before uvicorn's graceful wait
    (shutdown_grace_s) for the requests in flight, on_stop runs: the
    dispatcher answers its workers' long-polls at once, so they turn to other
    dispatchers and the wait is not spent on polls that would run out their
    wait_s. Then the background parts stop (the app's lifespan)."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None] | None):
        super().__init__(config)
        self.on_stop = on_stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit and self.on_stop is not None:
            # In a signal handler, which may have interrupted this thread inside
            # the dispatcher's lock: another thread takes it.
            threading.Thread(target=self.on_stop, name="close-polls", daemon=True).start()
        super().handle_exit(sig, frame)


@dataclass
class Process:
    """What `serve` runs: the HTTP app, and the background components it
    starts with itself, in order (stopped in reverse)."""
    app: Litestar
    services: Services
    dispatcher: Dispatcher | None


def dispatcher_parts(settings: Settings, store: Store | None) -> tuple[Dispatcher, Services]:
    """A dispatcher and what runs with it, in start order: its outcome writer
    (before it: a round's give-backs go through the writer), the dispatcher
    (its threads, then its shard keeper), the webhook deliverer, its
    maintenance (after them: the duties work on the shards it leases and
    deliver through the deliverer)."""
    writer = OutcomeWriter(store, extend_s=settings.claim_lease_s)
    dispatcher = Dispatcher(settings, store, writer=writer)
    # Webhooks are delivered from the dispatcher's maintenance, under a duty
    # lease; the deliverer's client and threads start before it, stop after.
    webhooks = WebhookDeliverer(store, timeout_s=settings.webhook_timeout_s,
                                backoff_base_s=settings.webhook_backoff_base_s,
                                backoff_cap_s=settings.webhook_backoff_cap_s, batch=settings.webhook_batch,
                                concurrency=settings.webhook_concurrency)
    maintenance = MaintenanceSchedule(store, dispatcher.name, dispatcher.owned_shards,
                                      claimed=lambda: dispatcher.claimed, webhooks=webhooks,
                                      webhook_every_s=settings.webhook_every_s,
                                      retention_s=settings.job_retention_s,
                                      retention_every_s=settings.retention_every_s,
                                      retention_batch=settings.retention_batch,
                                      default_ceiling=settings.max_pending_per_team,
                                      claim_lease_s=settings.claim_lease_s)
    return dispatcher, Services(writer, dispatcher, webhooks, maintenance)


def build(settings: Settings, store: Store | None, dispatch_store: Store | None = None, *,
          submit_api: bool = True, dispatch: bool = True, head: str | None = None) -> Process:
    """The process on these stores (none is touched until it starts). Start
    order: outcome writer, dispatcher (its threads, then its shard keeper),
    maintenance, submit threads; the app starts them (its lifespan) before
    it serves and stops them in reverse after."""
    services: list[Service] = []
    dispatcher = None
    if dispatch:
        dispatcher, parts = dispatcher_parts(settings, dispatch_store)
        services.append(parts)
    submitter = None
    if submit_api and settings.api_submit_workers > 0:
        submitter = SubmitCoalescer(store, Admission(store, settings), workers=settings.api_submit_workers)
        services.append(submitter)
    lifecycle = Services(*services)
    app = create_app(settings, store, head=head, submit_api=submit_api, dispatcher=dispatcher,
                     submitter=submitter, lifecycle=lifecycle, ui=admin_ui)
    return Process(app, lifecycle, dispatcher)


def serve(settings: Settings, *, submit_api: bool = True, dispatch: bool = True) -> None:
    """One process: the submitter API (submit_api), and a dispatcher with the
    worker protocol (dispatch); `minutehand serve` runs both, `minutehand
    dispatcher` only the second."""
    store = api_store(settings)
    # The dispatcher's leases, claims, outcomes and maintenance have a pool of
    # their own: requests that hold the API's connections (slow submissions,
    # a flood) must never keep a dispatcher from renewing its shard leases.
    dispatch_store = dispatcher_store(settings) if dispatch else None
    try:
        process = build(settings, store, dispatch_store, submit_api=submit_api, dispatch=dispatch)
        quiet_gc()
        if dispatch:
            open_files_for_long_polls()
        config = uvicorn.Config(process.app, host=settings.http_host, port=settings.http_port,
                                log_level=settings.log_level.lower(), access_log=False,
                                timeout_graceful_shutdown=settings.shutdown_grace_s,
                                # httptools with a head size limit and read deadlines (app/minutehand/api/limits.py);
                                # the same head limit for h11, should the parser ever be switched to it
                                http=protocol_class(settings),
                                h11_max_incomplete_event_size=settings.api_max_header_bytes)
        # uvicorn raises the stop signal again once it has shut down, for the handler
        # in place before it: ours makes SIGTERM (how systemd, Docker and Kubernetes
        # stop a service) a clean exit, status 0, after the stores are closed below.
        signal.signal(signal.SIGTERM, lambda *_: None)
        on_stop = process.dispatcher.close_polls if process.dispatcher is not None else None
        StoppingServer(config, on_stop).run()
    finally:
        store.close()
        if dispatch_store is not None:
            dispatch_store.close()
        logging.getLogger(__name__).info("stopped")
