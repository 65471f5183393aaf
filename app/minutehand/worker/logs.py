"""Structured logs for workers: one JSON object per line on stderr, so a
fleet's logs can be searched by job id without parsing prose.

The worker logs through the standard `logging` module, with the event name
as the message and the job's fields in `extra`:

    log.info("job_succeeded", extra={"job_id": 42, "job_name": "send_report", "duration_ms": 12.5})

and `setup()` (what `minutehand worker` calls) renders every record as

    {"ts": "2030-01-01T12:00:30.123Z", "level": "info", "event": "job_succeeded",
     "job_id": 42, "name": "send_report", "duration_ms": 12.5, "worker": "host:123"}
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import sys

# The fields a record may carry besides ts/level/event, in output order: output
# name -> record attribute ("name" is taken on a LogRecord: the job's name is
# passed as extra={"job_name": ...}).
FIELDS = {"job_id": "job_id", "name": "job_name", "attempt": "attempt", "worker": "worker",
          "duration_ms": "duration_ms", "error": "error", "url": "url", "reason": "reason",
          "state": "state", "count": "count"}

log = logging.getLogger("minutehand.worker")


class JsonFormatter(logging.Formatter):
    """A record -> one JSON line: ts, level, event, then whichever FIELDS it has."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds")
                  .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        for key, attr in FIELDS.items():
            value = getattr(record, attr, None)
            if value is not None:
                out[key] = value
        if record.name != log.name and not record.name.startswith(log.name + "."):
            out["logger"] = record.name
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str | int = "INFO") -> None:
    """Make every log record of the process a JSON line on stderr (replaces
    the root logger's handlers); httpx's per-request lines are kept quiet."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fields(worker: str, **kw) -> dict:
    """logging kwargs for a worker's event ('name' is LogRecord's own
    attribute: the job's name travels as job_name, written out as "name")."""
    if "name" in kw:
        kw["job_name"] = kw.pop("name")
    return {"extra": {"worker": worker, **kw}}
