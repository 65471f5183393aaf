"""Typed results of the store: what each procedure returns, as dataclasses."""
from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any


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
class JobSpec:
    """One job to submit (defaults as in submit_job). payload: any JSON value,
    or its JSON text already encoded, as bytes. With repeat: a series, stored
    with its first run (submit_series); due_at is then the first run's due
    time (every_s) or the earliest start (cron)."""
    name: str
    due_at: dt.datetime | None = None
    payload: Any = field(default_factory=dict)
    priority: int = 0
    max_attempts: int = 3
    flex_s: int | None = None      # None: the default window of the name (0 unless a rule sets one)
    strict: bool = False
    idempotency_key: str | None = None
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 3600.0
    repeat: Repeat | None = None


@dataclass(frozen=True)
class Submitted:
    job_id: int
    run_at: dt.datetime
    created: bool            # False: the idempotency key named an earlier job
    series_id: int | None = None   # a repeating job: its series (job_id is the first run)


@dataclass(frozen=True)
class BatchItem:
    idx: int
    job_id: int | None
    run_at: dt.datetime | None
    created: bool
    error: str | None
    series_id: int | None = None


@dataclass(frozen=True)
class ClaimRequest:
    """One claim of the dispatcher's round trip: up to `limit` due jobs of a
    shard it leases (at `epoch`) for a worker, of these job names and teams
    (None: any)."""
    shard: int
    epoch: int
    limit: int
    worker: str
    names: list[str] | None = None
    teams: list[str] | None = None


@dataclass(frozen=True, slots=True)
class PlannedClaim:
    """A claim the dispatcher planned across its shards (claim_planned): from
    one minute bucket of a shard, per cell (strict, priority, team id) up to
    its limit of due rows, of these job names (None: any)."""
    shard: int
    epoch: int
    worker: str
    bucket: dt.datetime
    stricts: list[bool]
    priorities: list[int]
    teams: list[int]
    limits: list[int]
    names: list[str] | None = None


@dataclass(frozen=True, slots=True)
class EdgeCell:
    """Rows due now in one shard's bucket, of one class and team (due_edge)."""
    bucket: dt.datetime
    strict: bool
    priority: int
    team_id: int
    due: int
    oldest: dt.datetime


@dataclass(frozen=True, slots=True)
class TeamTerms:
    """What the dispatcher shares capacity by: a team's quota and weight."""
    id: int
    name: str
    quota: int
    weight: int


# What a worker (or the dispatcher) reports about a claimed job, one record
# per kind: each names the job and the lease token of the claim it acts on.
@dataclass(frozen=True, slots=True)
class Start:
    """The worker began running the job (claimed → running)."""
    job_id: int
    lease_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The job still runs: extend its claim to now + extend_s."""
    job_id: int
    lease_token: uuid.UUID


@dataclass(frozen=True, slots=True)
class Complete:
    """The job succeeded; result is its JSON text (None: no result)."""
    job_id: int
    lease_token: uuid.UUID
    result: bytes | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The job failed: retried after backoff while attempts remain and
    retryable, else dead."""
    job_id: int
    lease_token: uuid.UUID
    error: str
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Release:
    """Give back a claimed job that was not started: due again at once,
    the attempt not counted."""
    job_id: int
    lease_token: uuid.UUID


Report = Start | Heartbeat | Complete | Fail | Release


@dataclass(frozen=True)
class Outcome:
    """The answer to one report: ok, or refused (changed nothing) and why."""
    job_id: int
    ok: bool
    state: str | None
    reason: str | None


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
class Maintenance:
    from_far: int
    from_hours: int
    swept_buckets: int
    carried: int
    claims_returned: int
    claims_dead: int
    keys_purged: int
    stats_rolled: int
    stats_purged: int
    load_purged: int
    events_purged: int


@dataclass(frozen=True)
class FlexDefault:
    """A default flex window: of a job name (job_name), or of cron series on
    round minutes (job_name None); a team's (team) or the operator's, for
    every team (team None)."""
    team: str | None
    job_name: str | None
    flex_s: int
    updated_at: dt.datetime


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


# Histogram bucket bounds of the statistics, in seconds (mh_stats_bounds()):
# bucket i counts values in (BOUNDS[i-1], BOUNDS[i]]; the first counts
# values <= 0, the last (no upper bound) those over an hour.
STATS_BOUNDS_S = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def quantile_bound(hist: Sequence[int], q: float) -> float | None:
    """The upper bound (s) of the bucket holding the q-quantile of a
    histogram; None when it is empty or the quantile lies in the last bucket
    (beyond the last bound)."""
    total = sum(hist)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank and n:
            return STATS_BOUNDS_S[i] if i < len(STATS_BOUNDS_S) else None
    return None


@dataclass(frozen=True)
class Tally:
    """Counts of events in a window (team_stats rows added up)."""
    submitted: int = 0        # jobs created (an idempotency replay creates none)
    started: int = 0          # jobs started for the first time (a retry's start is not counted again)
    succeeded: int = 0
    failed: int = 0           # failures that were retried
    dead: int = 0             # jobs set aside: failed or claim expired on the last attempt
    cancelled: int = 0
    lateness_hist: tuple[int, ...] = (0,) * (len(STATS_BOUNDS_S) + 1)   # first start - agreed_at
    runtime_hist: tuple[int, ...] = (0,) * (len(STATS_BOUNDS_S) + 1)    # finished_at - started_at

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.submitted + other.submitted, self.started + other.started,
                     self.succeeded + other.succeeded, self.failed + other.failed, self.dead + other.dead,
                     self.cancelled + other.cancelled,
                     tuple(a + b for a, b in zip(self.lateness_hist, other.lateness_hist)),
                     tuple(a + b for a, b in zip(self.runtime_hist, other.runtime_hist)))

    @property
    def volume(self) -> int:
        return self.submitted + self.started + self.succeeded + self.failed + self.dead + self.cancelled


@dataclass(frozen=True)
class MetricsRead:
    """One read of the jobs for /metrics (Store.metrics_read)."""
    line: dt.datetime                                  # team_stats rows below it no longer change
    below: dict[tuple[str, str], Tally]                # (team, name): added up from the last line to this one
    recent: dict[tuple[str, str], Tally]               # (team, name): added up from this line on
    running: dict[str, tuple[int, int]]                # team: (jobs claimed and not finished, quota)
    depth: dict[str, int]                              # current_minute, next_minute (counted); minutes, hours, far


@dataclass(frozen=True)
class TeamSettings:
    """A team as an administrator sees it (never its token). submit_rate and
    submit_burst: its token bucket (None: no rate limit); max_pending: its
    pending ceiling (None: the server's max_pending_per_team)."""
    name: str
    quota: int
    weight: int
    created_at: dt.datetime
    submit_rate: float | None = None
    submit_burst: int | None = None
    max_pending: int | None = None
    retention_s: int | None = None     # its finished jobs are kept this long (None: the server's setting)


@dataclass(frozen=True)
class Admitted:
    """How many of a submission's jobs a team may write now (mh_admit).
    limited_by: 'pending', 'rate' or 'burst' when fewer than asked, else
    None; retry_after_s under 'rate'; pending and ceiling when the team has
    a ceiling; rate and burst: its token bucket (None: no rate limit)."""
    admitted: int
    limited_by: str | None
    retry_after_s: float | None
    pending: int | None
    ceiling: int | None
    rate: float | None
    burst: int | None


@dataclass(frozen=True)
class Retained:
    """One retention pass over some shards: jobs removed, jobs filed to be
    looked at again later, jobs the walk visited, and the shards whose walk
    took a full batch (a backlog: another pass would find more)."""
    removed: int
    deferred: int
    walked: int
    backlog: int


@dataclass(frozen=True)
class JobGone:
    """Why a job id has no row: the time the id was made, the retention that
    applies (seconds), and whether the id is older than that retention (a
    finished job of that id would have been removed: expired, or never
    existed), or younger (no such job)."""
    made_at: dt.datetime
    retention_s: int
    expired: bool


@dataclass(frozen=True)
class TeamPage:
    teams: list[TeamSettings]
    next_cursor: str | None  # the last name: pass as after= for the next page; None: no more


@dataclass(frozen=True)
class TeamStats:
    """A team's counters over a window, by job name: the names of most
    volume one by one, the rest added up in `other`."""
    team: str
    quota: int
    running: int                   # claimed or running now (team_running)
    window_start: dt.datetime      # the counters cover [window_start, now]
    total: Tally
    names: dict[str, Tally]        # most volume first
    other: Tally | None            # the names beyond the first STATS_NAMES, added up
    other_names: int               # how many names `other` holds


@dataclass(frozen=True)
class FleetTeam:
    team: str
    quota: int
    running: int
    tally: Tally


@dataclass(frozen=True)
class FleetStats:
    window_start: dt.datetime
    teams: list[FleetTeam]         # every team, by name
    total: Tally
    running: int


# ---------------------------------------------------------------- series control
@dataclass(frozen=True)
class SeriesRun:
    """One run of a series, as its listing shows it."""
    job_id: int
    due_at: dt.datetime
    agreed_at: dt.datetime        # the run time agreed when the run was created
    run_at: dt.datetime
    state: str
    attempts: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str | None


@dataclass(frozen=True)
class SeriesDetail:
    """A series: what each run is made of, its repeat spec and misfire
    policy, its state (active, paused, cancelled), the chain's columns, its
    waiting run (the newest) and its newest runs."""
    series_id: int
    team: str
    name: str
    payload: Any
    priority: int
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    flex_s: int
    strict: bool
    every_s: int | None
    cron: str | None
    timezone: str | None
    misfire: str
    state: str
    first_due_at: dt.datetime
    last_due_at: dt.datetime
    chain_after: dt.datetime | None
    paused_at: dt.datetime | None
    cancelled_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    last_job_id: int
    last_job_state: str | None
    last_job_run_at: dt.datetime | None
    now: dt.datetime               # the database's clock when read
    runs: list[SeriesRun] = field(default_factory=list)   # newest first

    @property
    def repeat(self) -> Repeat:
        return Repeat(self.every_s, self.cron, self.timezone)


@dataclass(frozen=True)
class SeriesSummary:
    """A series as a listing shows it."""
    series_id: int
    name: str
    every_s: int | None
    cron: str | None
    timezone: str | None
    misfire: str
    state: str
    first_due_at: dt.datetime
    last_due_at: dt.datetime
    last_job_id: int
    created_at: dt.datetime


@dataclass(frozen=True)
class SeriesPage:
    series: list[SeriesSummary]
    next_cursor: int | None        # pass as after= for the next (older) page; None: no more


@dataclass(frozen=True)
class SeriesControl:
    """The answer to a pause, resume, cancel or change of a series."""
    series_id: int
    state: str                     # after the call: active, paused or cancelled
    changed: bool                  # False: the series already was so (nothing written)
    cancelled_run: int | None      # the waiting run this call cancelled (None: none had not started)


@dataclass(frozen=True)
class DeadSettled:
    """A requeue or discard of a team's dead jobs of one name: how many, and
    whether more remain (call again)."""
    count: int
    more: bool


@dataclass(frozen=True)
class JobEvent:
    """A job of the team that became dead (kind "dead"), from the team's feed.
    position: (xid, id), where the feed goes on after it."""
    id: int
    xid: str
    kind: str
    job_id: int
    name: str
    attempts: int
    max_attempts: int
    error: str | None
    at: dt.datetime


@dataclass(frozen=True)
class JobRecord:
    """The whole record of one job, as the admin UI's job page shows it.
    payload and result: pretty JSON cut to the reader's cap (None: no
    result), with their full size in bytes."""
    job_id: int
    team: str
    name: str
    state: str
    priority: int
    due_at: dt.datetime
    flex_s: int
    strict: bool
    agreed_at: dt.datetime
    run_at: dt.datetime
    deadline: dt.datetime | None
    attempts: int
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    claimed_by: str | None
    claim_expires_at: dt.datetime | None
    idempotency_key: str | None
    series_id: int | None
    lateness: dt.timedelta | None
    lateness_final: bool
    last_error: str | None
    payload: str
    payload_bytes: int
    result: str | None
    result_bytes: int | None
    created_at: dt.datetime
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    requeued_at: dt.datetime | None


@dataclass(frozen=True)
class JobDeath:
    """A time a job became dead (its job_events row): the attempts it had had and the error then."""
    at: dt.datetime
    attempts: int
    max_attempts: int
    error: str | None


@dataclass(frozen=True)
class JobAttempt:
    """An attempt of a job that ended without success (its job_attempts row);
    worker None for an expired claim (its error names the worker)."""
    attempt: int
    ended_at: dt.datetime
    worker: str | None
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None
    outcome: str
    error: str | None


@dataclass(frozen=True)
class DeadJob:
    """A dead job as the admin UI's dead-jobs page lists it."""
    job_id: int
    name: str
    attempts: int
    max_attempts: int
    last_error: str | None
    finished_at: dt.datetime | None
    created_at: dt.datetime
    requeued_at: dt.datetime | None


@dataclass(frozen=True)
class DeadPage:
    jobs: list[DeadJob]
    next_cursor: tuple[str, int] | None   # (name, id) the next page starts after; None: no more


@dataclass(frozen=True)
class DeadName:
    """A name a team has dead jobs of, and how many (counted up to a cap)."""
    name: str
    dead: int


@dataclass(frozen=True)
class Webhook:
    url: str
    failures: int                      # failed attempts of the batch now being delivered
    next_attempt_at: dt.datetime | None
    updated_at: dt.datetime


@dataclass(frozen=True)
class WebhookDelivery:
    """One delivery attempt: its events (ids first..last), the answer or the error."""
    at: dt.datetime
    url: str
    events: int
    first_event: int
    last_event: int
    attempt: int
    status_code: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class PendingDelivery:
    """A webhook with events to deliver: from its position (from_xid,
    from_id), the next events as JSON-ready dicts, oldest first."""
    team_id: int
    team: str
    url: str
    secret: str
    from_xid: str
    from_id: int
    failures: int
    events: list[dict[str, Any]]


# ---------------------------------------------------------------- the admin UI (app/minutehand/admin/)
@dataclass(frozen=True)
class AdminSession:
    """A signed-in browser: its team (None: the admin), the hash of the token
    it signed in with, and the CSRF token its forms carry."""
    team: str | None
    token_hash: str
    csrf: str


@dataclass(frozen=True)
class AuditNote:
    """What an admin action records: who (actor: 'admin' or the signed-in
    team; token_ref: the first 12 hex digits of the sha256 of the token it
    signed in with), the team it concerned (None: the whole fleet), what
    (action, target, details)."""
    actor: str
    token_ref: str
    team: str | None
    action: str
    target: str
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One action taken through the admin UI."""
    id: int
    at: dt.datetime
    actor: str                      # 'admin' or the signed-in team
    token_ref: str                  # the first 12 hex digits of the sha256 of the token used
    team: str | None                # the team it concerned (None: the fleet)
    action: str
    target: str
    ok: bool
    detail: dict[str, Any] | None


@dataclass(frozen=True)
class MinuteCounts:
    """One minute of the counters (team_stats), the fleet's or a team's."""
    minute: dt.datetime
    submitted: int
    started: int
    succeeded: int
    failed: int
    dead: int
    lateness_hist: tuple[int, ...]


@dataclass(frozen=True)
class Overview:
    """What the admin UI's overview shows, read without touching the jobs:
    the last hour minute by minute; running vs quota per team; jobs planned
    per run minute from an hour back to a day ahead (load_minutes); the
    wheel's depth (counted in the current and next minute, estimated for
    each level), None for a team's overview."""
    now: dt.datetime
    minutes: list[MinuteCounts]
    running: list[tuple[str, int, int]]             # (team, running, quota)
    planned: list[tuple[dt.datetime, int]]
    depth: dict[str, int] | None


@dataclass(frozen=True)
class ShardLease:
    shard: int
    owner: str | None               # None: free, or its lease expired
    last_owner: str | None
    lease_expires_at: dt.datetime | None
    epoch: int
    hand: dt.datetime | None


@dataclass(frozen=True)
class DispatcherSeen:
    name: str
    expires_at: dt.datetime
    live: bool
    duties: list[str] | None


@dataclass(frozen=True)
class WorkerSeen:
    """A worker holding jobs now: counts from its latest claims (sampled, see admin_workers)."""
    worker: str
    running: int
    claimed: int
    last_seen: dt.datetime
    job_ids: list[int]


@dataclass(frozen=True)
class FleetView:
    shards: list[ShardLease]
    dispatchers: list[DispatcherSeen]
    workers: list[WorkerSeen]

