"""The caller's W3C trace context (`traceparent`), when OpenTelemetry is
installed (the `otel` extra): sent with each request, so that a server that
records it can tie the job to the caller's trace. Without OpenTelemetry
nothing is imported and nothing is sent."""
from __future__ import annotations

from functools import cache


@cache
def _propagate():
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate


def headers() -> dict[str, str]:
    propagate = _propagate()
    if propagate is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def traceparent() -> str | None:
    return headers().get("traceparent")
