"""Reading jobs: one job's status, a team's jobs page by page
(sql/queries/jobs.sql)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from minutehand.store.base import StoreBase
from minutehand.store.records import Repeat


@dataclass(frozen=True)
class JobStatus:
    job_id: int
    team: str
    name: str
    state: str
    priority: int
    due_at: dt.datetime
    agreed_at: dt.datetime       # the run time agreed at submission (due + the spread chosen then)
    run_at: dt.datetime          # the current attempt's run time (a retry's, after a failure)
    strict: bool
    flex_s: int
    attempts: int
    max_attempts: int
    claimed_by: str | None
    claim_expires_at: dt.datetime | None
    # first start - agreed_at once started (final); before the first start,
    # past the agreed time: now - agreed_at, the lateness so far (not final)
    lateness: dt.timedelta | None
    lateness_final: bool
    last_error: str | None
    result: Any
    idempotency_key: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    # a cancel asked of the worker that held it: cancelled if it had not
    # started; else it ran (too late), and its state says how it ended
    cancel_requested_at: dt.datetime | None = None
    series_id: int | None = None   # a run of a repeating job: its series and the series' spec
    every_s: int | None = None
    cron: str | None = None
    timezone: str | None = None
    misfire: str = "run_once"

    @property
    def repeat(self) -> Repeat | None:
        if self.series_id is None:
            return None
        return Repeat(self.every_s, self.cron, self.timezone, self.misfire)


@dataclass(frozen=True)
class JobSummary:
    """A job as a listing shows it."""
    job_id: int
    team: str
    name: str
    state: str
    priority: int
    due_at: dt.datetime
    run_at: dt.datetime
    attempts: int
    max_attempts: int
    created_at: dt.datetime


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobSummary]
    next_cursor: int | None  # pass as before_id for the next page; None: nothing older


class JobStore(StoreBase):
    """Reading jobs, a part of Store."""

    def list_jobs(self, team: str, *, state: str | None = None, name: str | None = None,
                  due_before: dt.datetime | None = None, due_after: dt.datetime | None = None,
                  before_id: int | None = None, limit: int = 50, scan: int = 2000) -> JobPage:
        """A team's jobs with id < before_id, newest first, filtered; one page.

        Keyset on the team's (team_id, id DESC) index, never OFFSET. A page
        reads at most `scan` of the team's jobs: when the filters match
        fewer than `limit` of them, the page is short and next_cursor says
        where to go on, so a rare filter never walks a team's whole history
        in one request. next_cursor None: nothing older."""
        rows = self._all("list_jobs", {"team": team, "state": state, "name": name, "due_before": due_before,
                                       "due_after": due_after, "before": before_id, "limit": limit,
                                       "scan": scan})
        jobs = [JobSummary(**{k: r[k] for k in JobSummary.__dataclass_fields__}) for r in rows
                if r["job_id"] is not None]
        head = rows[0]
        if len(jobs) == limit:
            cursor = jobs[-1].job_id
        elif head["scanned"] == scan:
            cursor = head["scanned_to"]
        else:
            cursor = None
        return JobPage(jobs, cursor)

    def status(self, job_id: int, team: str | None = None) -> JobStatus | None:
        rows = self._all_at_now("job_status", {"job_id": job_id, "team": team})
        return JobStatus(**rows[0]) if rows else None
