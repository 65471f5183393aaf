"""A span around each handler run, when OpenTelemetry is installed (the
`otel` extra): named after the job, a child of the submitter's trace when
the job carries its traceparent (LeasedJob.traceparent), with the job's id,
name, team, attempt and lateness, and a failure recorded on it. Without
OpenTelemetry nothing is imported and a run costs nothing more."""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from functools import cache

from minutehand.protocol import LeasedJob


@cache
def _otel():
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return propagate, trace


@contextlib.contextmanager
def handler_span(lj: LeasedJob) -> Iterator[None]:
    otel = _otel()
    if otel is None:
        yield
        return
    propagate, trace = otel
    parent = propagate.extract({"traceparent": lj.traceparent}) if lj.traceparent else None
    attributes = {"minutehand.job.id": str(int(lj.job_id)), "minutehand.job.name": lj.name,
                  "minutehand.job.team": lj.team, "minutehand.job.attempt": lj.attempt}
    if isinstance(lj.run_at, dt.datetime):          # a span never fails a job, whatever it was handed
        attributes["minutehand.job.lateness_s"] = round(
            (dt.datetime.now(dt.timezone.utc) - lj.run_at).total_seconds(), 3)
    tracer = trace.get_tracer("minutehand.worker")
    with tracer.start_as_current_span(lj.name, context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=attributes, record_exception=True, set_status_on_exception=True):
        yield
