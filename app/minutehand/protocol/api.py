"""Bodies and responses of the HTTP API, as msgspec Structs: one definition
for the server's routes (app/minutehand/api/) and the Python client
(app/minutehand/client/), so that neither needs the other's dependencies.

Request bodies are decoded strictly (app/minutehand/api/bodies.py, jobs.py): unknown
fields, wrong JSON types, and a due time without a UTC offset are refused
with 422 before anything reaches the database. Everything else about a job
(name pattern, ranges, the due-time horizon, payload size) is validated once,
in SQL, by the procedures the store calls. What only the API can see is
checked here, before the database: JSON text PostgreSQL cannot store (the
escape \\u0000, bytes that are not UTF-8), nesting deeper than MAX_JSON_DEPTH,
idempotency keys outside printable ASCII.

Integer fields take any JSON number without a fraction (87 and 87.0, as JSON
Schema's "integer" does) and refuse 87.5 and "87" (decode_hook).

Job ids are 64-bit and exceed what a JSON number holds exactly in many
clients (2^53), so they travel as decimal strings.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct

from minutehand import protocol
from minutehand.protocol import JobId, JobName
from minutehand.protocol.jsontext import MAX_JSON_DEPTH

# A team's name, and a webhook's secret (printable ASCII without spaces):
# what the rules accept (minutehand.rules) and the schema says.
TEAM_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
SECRET_LENGTHS = (16, 200)
SECRET_PATTERN = r"^[\x21-\x7e]{%d,%d}$" % SECRET_LENGTHS

# RFC 3339 with an offset: a naive time is refused, not guessed.
AwareTime = Annotated[dt.datetime, Meta(tz=True, description="RFC 3339 date-time with a UTC offset")]
State = Literal["scheduled", "claimed", "running", "retrying", "succeeded", "dead", "cancelled", "discarded"]


def _doc(description: str, **limits: Any) -> Meta:
    """Documentation for the schema only: the limits are what the procedures
    enforce (sql/functions/submit.sql), shown to clients, not checked here."""
    return Meta(description=description, extra_json_schema=limits or None)


# ---------------------------------------------------------------- integers
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class Integer(int):
    """An integer field of a request body: a JSON number with no fraction,
    87 or 87.0 (JSON Schema calls both an integer; msgspec's int takes only
    the first), within 32 bits (the columns' type). Decoded by decode_hook,
    which every decoder of a body with such a field is given; the schema
    says "integer" (_int_doc)."""


def _int_doc(description: str, **limits: Any) -> Meta:
    return Meta(description=description, extra_json_schema={"type": "integer", **limits})


def decode_hook(kind: type, value: Any) -> Any:
    """msgspec's dec_hook for Integer: refusals read like msgspec's own."""
    if kind is Integer:
        if type(value) is int:
            number = value
        elif type(value) is float and value.is_integer():
            number = int(value)
        elif type(value) is float:
            raise ValueError(f"Expected `int`, got `float` with a fraction ({value!r})")
        else:
            raise ValueError(f"Expected `int`, got `{_json_type(value)}`")
        if not INT32_MIN <= number <= INT32_MAX:
            raise ValueError(f"Expected `int` from {INT32_MIN} to {INT32_MAX}: {number} is out of range")
        return Integer(number)
    return protocol.dec_hook(kind, value)


def _json_type(value: Any) -> str:
    return {bool: "bool", str: "str", list: "array", dict: "object", type(None): "null"}.get(type(value),
                                                                                            type(value).__name__)


def decoder(kind: type) -> msgspec.json.Decoder:
    """The strict decoder of a request body (Integer fields included)."""
    return msgspec.json.Decoder(kind, dec_hook=decode_hook)


def text_problem(what: str, value: str | None) -> str | None:
    """Why a string field cannot be stored (a NUL character); None if it can."""
    if value is not None and "\x00" in value:
        return f"{what} cannot be stored: it contains a NUL character (\\u0000)"
    return None


# ---------------------------------------------------------------- idempotency keys
MAX_KEY_LENGTH = 255
KEY_PATTERN = r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$"
_KEY = re.compile(KEY_PATTERN)
KEY_RULE = (f"1 to {MAX_KEY_LENGTH} characters of printable ASCII (letters, digits, punctuation; spaces only "
            "inside)")
# What key_problem accepts, as the schema of the header and of a batch item's key.
KEY_SCHEMA = {"minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": KEY_PATTERN}


def key_problem(key: str) -> str | None:
    """Why an idempotency key is refused; None if it is fine."""
    if 1 <= len(key) <= MAX_KEY_LENGTH and _KEY.match(key):
        return None
    if not key:
        return f"idempotency key is empty: it must be {KEY_RULE}"
    if len(key) > MAX_KEY_LENGTH:
        return f"idempotency key has {len(key)} characters: it must be {KEY_RULE}"
    bad = next((c for c in key if not " " <= c <= "~"), None)
    if bad is not None:
        return f"idempotency key contains {bad!r} (U+{ord(bad):04X}): it must be {KEY_RULE}"
    return f"idempotency key starts or ends with a space: it must be {KEY_RULE}"


# ---------------------------------------------------------------- requests
# A repeat spec's kind, as the schema of Repeat and SeriesRepeat: exactly one
# of every_s and cron, timezone only with cron. msgspec cannot say so of a
# Struct; repeats.problem refuses the rest (`{}` included) with 422.
REPEAT_KINDS = {"oneOf": [
    {"title": "every_s", "required": ["every_s"],
     "properties": {"every_s": {"type": "integer"}, "cron": {"type": "null"}, "timezone": {"type": "null"}}},
    {"title": "cron", "required": ["cron"], "properties": {"cron": {"type": "string"}, "every_s": {"type": "null"}}},
]}


class Repeat(Struct, forbid_unknown_fields=True):
    """A repeating job: every every_s seconds, or a crontab expression (5
    fields) in a time zone (IANA name, default UTC). Exactly one of every_s
    and cron. The job becomes a series, a chain of ordinary jobs: the first
    run is created now, each later one when the run before it is claimed."""
    schema_extra: ClassVar[dict[str, Any]] = REPEAT_KINDS
    every_s: Annotated[Integer, _int_doc("seconds between runs; the first run is at due_at (or now)",
                                         minimum=1, maximum=31622400)] | None = None
    cron: Annotated[str | None, _doc("5-field crontab expression (minute hour day month weekday); the first "
                                     "run is its first fire time at or after due_at (or now), in timezone")] = None
    timezone: Annotated[str | None, _doc("IANA time zone of cron (like Europe/Berlin), DST included; "
                                         "default UTC. Only with cron")] = None
    misfire: Annotated[Literal["run_once", "skip"], _doc(
        "after an outage: run_once, the run that waited runs once and the fire times missed meanwhile are "
        "folded into it; skip, a run not claimed before the series' next fire time is dropped. Either way "
        "the series goes on at the first fire time after now")] = "run_once"


class JobIn(Struct, forbid_unknown_fields=True):
    """One job to submit. Omitted fields take the defaults of submit_job."""
    name: Annotated[str, _doc("1 to 200 characters from letters, digits and _ . : / -",
                              pattern=r"^[A-Za-z0-9_.:/-]{1,200}$")]
    due_at: Annotated[AwareTime | None, _doc("when to run; omitted or null: now. At most a year ahead. With "
                                            "repeat: the first run (every_s) or the earliest start (cron)")] = None
    # Kept as the request's JSON text (checked to be JSON, not decoded): it
    # goes to the database as it came, where its size is checked; its depth
    # and what jsonb cannot hold are checked before (json_text_problem).
    payload: Annotated[msgspec.Raw | msgspec.UnsetType,
                       _doc(f"any JSON (default {{}}), up to 256 KiB as JSON text and nested at most "
                            f"{MAX_JSON_DEPTH} levels deep (arrays and objects); no \\u0000 escape (jsonb "
                            "cannot hold it); handed to the worker")] = msgspec.UNSET
    priority: Annotated[Integer, _int_doc("higher runs first", minimum=-100, maximum=100)] = 0
    max_attempts: Annotated[Integer, _int_doc("runs before the job is set aside as dead", minimum=1,
                                              maximum=100)] = 3
    flex_s: Annotated[Integer, _int_doc(
        "the job may run anywhere in [due, due + flex_s]; the run time is chosen once, at submission, where "
        "that window is least loaded. Omitted or null: the default window of the job's name (the team's "
        "rule, else the operator's; for a cron series on round minutes with no rule for its name, the "
        "round-cron default; else 0); a strict job's is 0", minimum=0, maximum=86400)] | None = None
    strict: Annotated[bool, _doc("run at the due time exactly (then flex_s must be 0)")] = False
    backoff_base_s: Annotated[float, _doc("retry delay after the first failure, doubling after each",
                                          minimum=0.01, maximum=86400)] = 1.0
    backoff_cap_s: Annotated[float, _doc("longest retry delay; at least backoff_base_s",
                                         minimum=0.01, maximum=604800)] = 3600.0
    repeat: Annotated[Repeat | None, _doc("make it a repeating job (a series); omitted or null: runs once")] = None


class BatchJobIn(JobIn, forbid_unknown_fields=True):
    """A job of a batch: as JobIn, with its own idempotency key."""
    idempotency_key: Annotated[str | None, Meta(
        description=f"as the Idempotency-Key header of POST /v1/jobs: {KEY_RULE}", extra_json_schema=KEY_SCHEMA)] = None


class BatchIn(Struct, forbid_unknown_fields=True):
    """Each item is decoded and checked on its own: one that is refused is
    reported in its place (items[i].error) and the others are submitted."""
    jobs: list[BatchJobIn]


QUOTA_DOC = ("most jobs of the team running at once while other teams have due work waiting (it may borrow "
             "idle capacity beyond it)")
WEIGHT_DOC = "the team's share of the fleet when teams compete (weighted rotation)"
# Omitted (UNSET) is not null: null is refused, as a value of the wrong type.
Quota = Annotated[Integer | msgspec.UnsetType, _int_doc(QUOTA_DOC, minimum=1, maximum=INT32_MAX)]
Weight = Annotated[Integer | msgspec.UnsetType, _int_doc(WEIGHT_DOC, minimum=1, maximum=INT32_MAX)]
RETENTION_DOC = ("seconds the team's finished jobs (succeeded, dead, discarded, cancelled) are kept after they finish, "
                 "1 to 315360000 (10 years); null: the server's job_retention_s (7 days unless set)")
# Here null is a value: back to the server's retention.
Retention = Annotated[Integer, _int_doc(RETENTION_DOC, minimum=1, maximum=315_360_000)] | None | msgspec.UnsetType


SUBMIT_RATE_DOC = ("jobs per second the team may submit (a token bucket refilled at this rate; a batch counts "
                   "its jobs); over it: 429 with Retry-After. null: no rate limit")
SUBMIT_BURST_DOC = ("most jobs the team may submit at once (the bucket's size); omitted with a submit_rate: the "
                    "burst the team had, or one second's worth")
MAX_PENDING_DOC = ("most jobs of the team submitted and not finished; a submission past it: 429. null: the "
                   "server's max_pending_per_team")
# null is a value here: it clears the limit.
SubmitRate = Annotated[Annotated[float, Meta(gt=0, le=1_000_000)] | None | msgspec.UnsetType,
                       Meta(description=SUBMIT_RATE_DOC)]
SubmitBurst = Annotated[Annotated[Integer, _int_doc(SUBMIT_BURST_DOC, minimum=1, maximum=INT32_MAX)] | None
                        | msgspec.UnsetType, Meta(description=SUBMIT_BURST_DOC)]
MaxPending = Annotated[Annotated[Integer, _int_doc(MAX_PENDING_DOC, minimum=1, maximum=INT32_MAX)] | None
                       | msgspec.UnsetType, Meta(description=MAX_PENDING_DOC)]


class TeamIn(Struct, forbid_unknown_fields=True):
    """quota and weight omitted: the server's default_team_quota and
    default_team_weight settings (1000 and 1 unless set); submit_rate
    omitted: default_team_submit_rate (none unless set); max_pending
    omitted: the server's max_pending_per_team applies."""
    name: Annotated[str, _doc("1 to 63 characters: lowercase letters, digits, _ . -", pattern=TEAM_NAME_PATTERN)]
    quota: Quota = msgspec.UNSET
    weight: Weight = msgspec.UNSET
    submit_rate: SubmitRate = msgspec.UNSET
    submit_burst: SubmitBurst = msgspec.UNSET
    max_pending: MaxPending = msgspec.UNSET
    retention_s: Retention = msgspec.UNSET


class TeamSettingsIn(Struct, forbid_unknown_fields=True):
    """At least one field; a field omitted keeps its value. The dispatcher
    applies a new quota or weight within a few seconds; the API a new
    admission limit within admission_cache_s on every server process."""
    schema_extra: ClassVar[dict[str, Any]] = {"minProperties": 1}     # set_team refuses {} (422)
    quota: Quota = msgspec.UNSET
    weight: Weight = msgspec.UNSET
    submit_rate: SubmitRate = msgspec.UNSET
    submit_burst: SubmitBurst = msgspec.UNSET
    max_pending: MaxPending = msgspec.UNSET
    retention_s: Retention = msgspec.UNSET


FLEX_DOC = "seconds of the default flex window, 0 to 86400"


class WindowIn(Struct, forbid_unknown_fields=True):
    """A default flex window."""
    flex_s: Annotated[Integer, _int_doc(FLEX_DOC, minimum=0, maximum=86400)]


# ---------------------------------------------------------------- responses
SeriesId = Annotated[str, Meta(pattern=r"^-?[0-9]{1,19}$",
                                description="a repeating job: its series (64-bit id, as a decimal string)")]


class JobCreated(Struct):
    job_id: JobId                 # with repeat: the series' first run
    run_at: dt.datetime
    created: bool  # False: the Idempotency-Key named an earlier job (status 200)
    series_id: SeriesId | None = None   # None: a job that runs once


class BatchItemOut(Struct):
    idx: int                      # position in the request's jobs
    job_id: JobId | None          # None: refused, see error
    run_at: dt.datetime | None
    created: bool
    error: str | None
    series_id: SeriesId | None = None   # None: a job that runs once


class BatchOut(Struct):
    created: int
    existing: int                 # idempotency keys that named earlier jobs
    rejected: int
    items: list[BatchItemOut]


class JobOut(Struct):
    """The status record of one job."""
    job_id: JobId
    team: str
    name: str
    state: State
    priority: int
    due_at: dt.datetime
    agreed_at: Annotated[dt.datetime, Meta(description="the run time agreed at submission: the due time plus the "
                                                        "spread chosen inside the flex window (never before the "
                                                        "submission)")]
    run_at: Annotated[dt.datetime, Meta(description="the current attempt's run time (after a failure: the retry's)")]
    strict: bool
    flex_s: int
    attempts: int
    max_attempts: int
    claimed_by: str | None
    claim_expires_at: dt.datetime | None
    lateness_s: Annotated[float | None, Meta(
        description="first start - agreed_at once started (lateness_final true; a retry does not change it); "
                    "before the first start, once agreed_at has passed, the lateness so far: now - agreed_at "
                    "(lateness_final false); null before then")]
    lateness_final: bool
    last_error: str | None
    result: Any
    idempotency_key: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    cancel_requested_at: Annotated[dt.datetime | None, Meta(
        description="when a cancel reached the job while a worker held it (claimed, its start not reported): "
                    "it is cancelled if the worker gives it back or its claim expires without a start; if its "
                    "handler had started, the cancel came too late, and the state says how the run ended")] = None
    series_id: SeriesId | None = None   # None: a job that runs once
    repeat: Annotated[Repeat | None, Meta(description="the series' repeat spec; null for a job that runs once")] = None


class JobSummaryOut(Struct):
    job_id: JobId
    team: str
    name: str
    state: State
    priority: int
    due_at: dt.datetime
    run_at: dt.datetime
    attempts: int
    max_attempts: int
    created_at: dt.datetime


class JobPageOut(Struct):
    jobs: list[JobSummaryOut]
    next_cursor: str | None  # pass as ?cursor= for older jobs; None: no older jobs


class CancelledOut(Struct):
    """state cancelled (200): done. state claimed (202): a worker held the
    job, so its cancel is requested: see the job's cancel_requested_at."""
    job_id: JobId
    state: State


class TeamTokenOut(Struct):
    name: str
    token: str  # shown once; only its hash is stored


class TeamOut(Struct):
    name: str
    quota: int
    weight: int
    created_at: dt.datetime
    submit_rate: float | None       # jobs per second; null: no rate limit
    submit_burst: int | None        # most jobs at once; null: no rate limit
    max_pending: int | None         # null: the server's max_pending_per_team (0 there: no ceiling)
    retention_s: int | None  # its finished jobs are kept this long; null: the server's job_retention_s


class TeamPageOut(Struct):
    teams: list[TeamOut]
    next_cursor: str | None  # pass as ?cursor= for the next page (by name); None: no more teams


class BucketOut(Struct):
    le_s: float | None             # upper bound of the bucket in seconds (inclusive); null: no bound
    count: int


class DistributionOut(Struct):
    """A histogram over fixed buckets; quantiles are read from it and given
    as the upper bound of the bucket they fall in (null: no values, or the
    last bucket, over an hour)."""
    count: int
    p50_s: float | None
    p99_s: float | None
    buckets: list[BucketOut]


class CountsOut(Struct):
    submitted: int                 # jobs created
    started: int                   # jobs started for the first time
    succeeded: int
    failed: int                    # failures that were retried
    dead: int                      # failed or claim expired on the last attempt
    cancelled: int
    lateness: DistributionOut      # of first starts: start - agreed run time
    run_time: DistributionOut      # of finished jobs: finish - first start


class NameStatsOut(Struct):
    name: str
    counts: CountsOut


class OtherStatsOut(Struct):
    names: int                     # how many job names are added up here (those past the team's first 50: one)
    counts: CountsOut


class StatsOut(Struct):
    team: str
    window_start: dt.datetime      # the counts cover [window_start, now]
    window_s: int                  # the window asked for (window_start is it rounded down to a minute or an hour)
    running: int                   # claimed or running now
    quota: int
    total: CountsOut
    names: list[NameStatsOut]      # the job names of most volume, most first
    other: OtherStatsOut | None    # the names beyond those, added up


class FleetTeamOut(Struct):
    team: str
    running: int
    quota: int
    counts: CountsOut


class FleetStatsOut(Struct):
    window_start: dt.datetime
    window_s: int
    running: int
    total: CountsOut
    teams: list[FleetTeamOut]      # every team, by name


# ---------------------------------------------------------------- series control
SeriesState = Literal["active", "paused", "cancelled"]
Misfire = Literal["run_once", "skip"]


class SeriesRepeat(Struct, forbid_unknown_fields=True):
    """A series' repeat spec: every every_s seconds, or a crontab expression
    (5 fields) in a time zone (IANA name, default UTC). Exactly one of
    every_s and cron. (Its misfire policy is a field of its own.)"""
    schema_extra: ClassVar[dict[str, Any]] = REPEAT_KINDS
    every_s: Annotated[Integer, _int_doc("seconds between runs, counted from the first due time",
                                         minimum=1, maximum=31622400)] | None = None
    cron: Annotated[str | None, _doc("5-field crontab expression (minute hour day month weekday)")] = None
    timezone: Annotated[str | None, _doc("IANA time zone of cron (like Europe/Berlin), DST included; "
                                         "default UTC. Only with cron")] = None


class SeriesChangeIn(Struct, forbid_unknown_fields=True):
    """A new repeat spec from the next run (and the misfire policy; omitted:
    kept). The waiting run is cancelled if it has not started."""
    repeat: Annotated[SeriesRepeat, _doc("the new spec: every_s, or cron (+ timezone)")]
    misfire: Annotated[Misfire | msgspec.UnsetType,
                       _doc("after an outage: run_once (the waiting run runs once) or skip (a run whose next "
                            "fire time passed before its claim is dropped); omitted: kept")] = msgspec.UNSET


class SeriesRunOut(Struct):
    job_id: JobId
    due_at: dt.datetime
    agreed_at: Annotated[dt.datetime, Meta(description="the run time agreed when the run was created")]
    state: State
    attempts: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str | None


class WaitingRunOut(Struct):
    """The series' newest run."""
    job_id: JobId
    state: State
    due_at: dt.datetime
    run_at: dt.datetime


class SeriesOut(Struct):
    series_id: Annotated[str, Meta(pattern=r"^-?[0-9]{1,19}$", description="64-bit id, as a decimal string")]
    team: str
    name: str
    payload: Any
    priority: int
    max_attempts: int
    flex_s: int
    strict: bool
    backoff_base_s: float
    backoff_cap_s: float
    repeat: SeriesRepeat
    misfire: Misfire
    state: SeriesState
    first_due_at: dt.datetime
    last_due_at: Annotated[dt.datetime, Meta(description="the due time of the newest run")]
    chain_after: Annotated[dt.datetime | None, Meta(
        description="set: the next run is to be created at the first fire time after this")]
    paused_at: dt.datetime | None
    cancelled_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    waiting_run: Annotated[WaitingRunOut | None, Meta(description="the newest run")]
    next_fire_times: Annotated[list[dt.datetime], Meta(
        description="the next 5 fire times after now (within 366 days); empty for a cancelled series")]
    last_runs: Annotated[list[SeriesRunOut], Meta(description="the newest runs, newest first (up to 10)")]


class SeriesSummaryOut(Struct):
    series_id: Annotated[str, Meta(pattern=r"^-?[0-9]{1,19}$", description="64-bit id, as a decimal string")]
    name: str
    repeat: SeriesRepeat
    misfire: Misfire
    state: SeriesState
    first_due_at: dt.datetime
    last_due_at: dt.datetime
    last_job_id: JobId
    created_at: dt.datetime


class SeriesPageOut(Struct):
    series: list[SeriesSummaryOut]
    next_cursor: str | None  # pass as ?cursor= for older series; None: no more


class SeriesControlOut(Struct):
    series_id: Annotated[str, Meta(pattern=r"^-?[0-9]{1,19}$", description="64-bit id, as a decimal string")]
    state: SeriesState
    changed: Annotated[bool, Meta(description="false: the series already was so, nothing was written")]
    cancelled_run: Annotated[JobId | None, Meta(
        description="the waiting run this call cancelled; null: none (a started run is left to finish)")] = None


class HealthOut(Struct):
    status: str


class ReadyOut(Struct):
    status: str
    revision: str | None
    head: str
    version: str           # the release (minutehand --version), whose head revision this is


class Problem(Struct, omit_defaults=True):
    """RFC 9457 problem details. type names the kind of problem (a URI
    reference, listed in docs/reference/http-api.md); detail says what to do about it."""
    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None   # field-level reasons, for 422
    job_id: JobId | None = None                  # cancel refused: the job...
    state: State | None = None                   # ...and its state


class WindowOut(Struct):
    """A default flex window: of job_name, or (job_name null) of cron series
    on round minutes; the team's, or (team null) the operator's, for every team."""
    team: str | None
    job_name: str | None
    flex_s: int
    updated_at: dt.datetime


class WindowPageOut(Struct):
    team: str | None
    windows: list[WindowOut]     # the round-cron rule (job_name null) first, then by job name
    next_cursor: str | None


# ---------------------------------------------------------------- dead jobs
BUDGET_DOC = "the new attempt budget, 1 to 100 (omitted: the job's own max_attempts)"
SETTLE_LIMIT_DOC = "at most this many jobs per call, 1 to 100,000 (default 10,000); `more` says if some are left"


class DeadRequeueIn(Struct, forbid_unknown_fields=True):
    """Every dead job of the team with this name, oldest first per shard."""
    name: JobName
    max_attempts: Annotated[Integer, _int_doc(BUDGET_DOC, minimum=1, maximum=100)] | None = None
    limit: Annotated[Integer, _int_doc(SETTLE_LIMIT_DOC, minimum=1, maximum=100000)] = 10000


class DeadDiscardIn(Struct, forbid_unknown_fields=True):
    name: JobName
    limit: Annotated[Integer, _int_doc(SETTLE_LIMIT_DOC, minimum=1, maximum=100000)] = 10000


class SettledOut(Struct):
    """A job requeued (state scheduled, due now) or discarded."""
    job_id: JobId
    state: State


class DeadRequeuedOut(Struct):
    requeued: int
    more: bool            # some are left past the limit: call again


class DeadDiscardedOut(Struct):
    discarded: int
    more: bool


class EventOut(Struct):
    """A job of the team that became dead: failed on its last attempt, or
    its last claim expired. event_id: unique, for deduplication (delivery is
    at least once)."""
    event_id: str
    kind: Literal["dead"]
    job_id: JobId
    name: str
    attempts: int
    max_attempts: int
    error: str | None
    at: dt.datetime


class EventPageOut(Struct):
    """next_cursor: pass it as ?after= to read on (the same cursor when
    nothing new has come: poll with it)."""
    events: list[EventOut]
    next_cursor: str


class WebhookIn(Struct, forbid_unknown_fields=True):
    url: Annotated[str, Meta(description="http(s) URL the team's events are POSTed to", max_length=2000)]
    secret: Annotated[str | msgspec.UnsetType, Meta(
        description="the HMAC-SHA256 key, 16 to 200 printable ASCII characters, no spaces (omitted: one is made "
                    "and returned)", extra_json_schema={"pattern": SECRET_PATTERN})] = msgspec.UNSET


class WebhookOut(Struct):
    url: str
    failures: int                        # failed attempts of the batch now being delivered
    next_attempt_at: dt.datetime | None  # backing off until then
    updated_at: dt.datetime


class WebhookSetOut(Struct):
    url: str
    secret: str                          # the signing key: shown here, never read back
    updated_at: dt.datetime


class DeliveryOut(Struct):
    at: dt.datetime
    url: str
    events: int
    first_event: str
    last_event: str
    attempt: int                         # of this batch: 1, 2, ... (reset after a success)
    status_code: int | None              # the receiver's answer; null: no answer (error says why)
    error: str | None
    duration_ms: int


class DeliveriesOut(Struct):
    deliveries: list[DeliveryOut]
