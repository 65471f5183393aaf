"""The trace context a submission is made under, kept with its jobs so that
the worker's span of the handler continues the submitter's trace
(app/minutehand/worker/traces.py); and the server's own span of each HTTP
request, when OpenTelemetry's ASGI instrumentation is installed (the `otel`
extra).

A submission's traceparent is its request's span, when the server traces
its requests (then the trace reads: the caller's span, the request, the
handler); else the request's `traceparent` header as sent. A header that is
not a valid W3C traceparent (version-traceid-parentid-flags in lowercase
hex, version not ff, neither id all zeros), or sent more than once, is
ignored, as W3C Trace Context says: the job is submitted without one, never
refused. Without OpenTelemetry nothing is imported."""
from __future__ import annotations

import re
from functools import cache
from typing import Any

from litestar import Request

TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid(value: str | None) -> str | None:
    """value if it is a W3C traceparent a job may keep, else None (as the
    procedures' mh_traceparent in sql/functions/submit.sql)."""
    return value if value is not None and TRACEPARENT.fullmatch(value) else None


@cache
def _propagate():
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate


def traceparent(request: Request) -> str | None:
    """The traceparent a submission made by this request keeps (None: none)."""
    propagate = _propagate()
    if propagate is not None:                  # the request's own span, when the server traces requests
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if own := valid(carrier.get("traceparent")):
            return own
    values = [v for k, v in request.scope["headers"] if k == b"traceparent"]
    if len(values) != 1 or not values[0].isascii():
        return None
    return valid(values[0].decode("ascii"))


def plugins() -> list[Any]:
    """Litestar's OpenTelemetry plugin (a server span per HTTP request, a
    child of the caller's traceparent), when its instrumentation is
    installed and the process has set up a tracer provider (an SDK's, e.g.
    by running under `opentelemetry-instrument`) before the app is made;
    else none. Without a provider its spans would go nowhere, and the
    instrumentation would still cost two to five times a small request's
    own time in Litestar (measured, with no provider: a few hundred
    microseconds a request), on every worker and submit request. The ASGI
    receive and send spans, one per message, are left out."""
    try:
        from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryPlugin
        from opentelemetry import trace
    except ImportError:                        # no opentelemetry-instrumentation-asgi (or an older Litestar)
        return []
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return []                              # none set up: nothing would be recorded
    return [OpenTelemetryPlugin(OpenTelemetryConfig(exclude_spans=["receive", "send"]))]
