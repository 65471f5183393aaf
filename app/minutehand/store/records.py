"""Records several parts of the store share: a repeat spec (submission,
series, a job's status) and the answer to an action on one job (outcomes,
dead jobs). Each part's other records are in its own module."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Repeat:
    """A repeating job: every every_s seconds, or a 5-field crontab
    expression in an IANA time zone (None: UTC). Exactly one of the two.
    misfire: after an outage, run_once (the run that waited runs, once) or
    skip (a run whose next fire time came before it was claimed is dropped)."""
    every_s: int | None = None
    cron: str | None = None
    timezone: str | None = None
    misfire: str = "run_once"


@dataclass(frozen=True)
class Outcome:
    """The answer to one report: ok, or refused (changed nothing) and why."""
    job_id: int
    ok: bool
    state: str | None
    reason: str | None
