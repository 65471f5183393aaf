"""The worker pull protocol over HTTP: bodies and responses, as msgspec
Structs shared by the dispatcher's routes (app/minutehand/api/workers.py) and the
worker library (app/minutehand/worker/). What JSON text a payload or a result may be
is in jsontext.py, next to them: the server accepts only what a worker reads.

    POST /v1/worker/lease      long-poll for up to `capacity` jobs
    POST /v1/worker/lease/end  a stopping worker's long-polls answered at once
    POST /v1/worker/outcomes   starts, heartbeats, keyed results recorded, completions, failures and
                               give-backs, batched
    POST /v1/worker/jobs/{id}/{start|heartbeat|complete|fail|release}
                               one job: a refusal is a 4xx (404 no such job,
                               409 stale lease token, 409 a started job's
                               release), not a per-item answer

Every call carries `Authorization: Bearer <worker token>` (a fleet token,
`minutehand worker-token create NAME`; only its hash is stored). Job ids
are decimal strings (64-bit ids exceed what many JSON readers hold exactly).
"""
from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

class JobId(int):
    """A job's id: one type from the database to the handler. In Python an
    int (64 bits, made by the database); in JSON a decimal string, as 64-bit
    ids exceed what many JSON readers hold exactly. Every encoder and decoder
    of the protocol takes enc_hook / dec_hook below; schema_hook documents it."""
    __slots__ = ()


JOB_ID_PATTERN = r"^-?[0-9]{1,19}$"
_JOB_ID = re.compile(JOB_ID_PATTERN)


def enc_hook(value: Any) -> Any:
    if isinstance(value, JobId):
        return int.__repr__(value)
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def dec_hook(kind: type, value: Any) -> Any:
    """JobId from its decimal string; refusals read like msgspec's own."""
    if kind is JobId:
        if not isinstance(value, str) or not _JOB_ID.fullmatch(value):
            raise ValueError("Expected a job id: a string of decimal digits")
        number = int(value)
        if not -(2**63) <= number < 2**63:
            raise ValueError(f"Expected a 64-bit job id: {value} is out of range")
        return JobId(number)
    raise NotImplementedError(kind)


def schema_hook(kind: type) -> dict[str, Any]:
    if kind is JobId:
        return {"type": "string", "pattern": JOB_ID_PATTERN, "description": "64-bit job id, as a decimal string"}
    raise NotImplementedError(kind)


# The lease token: the claim's own type, a UUID (a string in JSON).
Token = Annotated[uuid.UUID, Meta(description="the lease token of the job's current claim")]
Worker = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@/-]+$",
                             description="the worker's id, recorded as the job's claimer")]
# The job-name rule of submission (mh_job_problem in sql/functions/submit.sql):
# a worker asks only for names a job can have.
JOB_NAME_PATTERN = r"^[A-Za-z0-9_.:/-]{1,200}$"
JobName = Annotated[str, Meta(pattern=JOB_NAME_PATTERN, description="a job name: 1 to 200 characters from "
                                                                    "letters, digits and _ . : / -")]
TeamName = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$", description="a team's name")]

MAX_CAPACITY = 1000
MAX_WAIT_S = 60.0
MAX_ITEMS = 10_000


# ---------------------------------------------------------------- lease
class LeaseIn(Struct, forbid_unknown_fields=True):
    """Ask for jobs: at most `capacity`, of the given names and teams (null:
    any), waiting up to wait_s seconds for the first one."""
    worker: Worker
    # A JSON number with no fraction (3 or 3.0): the schema's "integer".
    capacity: Annotated[float, Meta(ge=1, le=MAX_CAPACITY, multiple_of=1, extra_json_schema={"type": "integer"},
                                    description="how many jobs the worker has room for")]
    names: Annotated[list[JobName], Meta(min_length=1, max_length=100,
                                         description="the job names it handles; null: any")] | None = None
    wait_s: Annotated[float, Meta(ge=0, le=MAX_WAIT_S, description="long-poll limit")] = 20.0
    teams: Annotated[list[TeamName], Meta(min_length=1, max_length=100,
                                          description="only jobs submitted by these teams; null: any team's. "
                                                      "Job names are not owned by a team: a worker that acts "
                                                      "on trusted payloads names the teams it trusts")] | None = None


class Replay(Struct):
    """A result stored under the job's idempotency key within 24 h: the
    worker reports it as the job's result without running the handler."""
    result: msgspec.Raw


class LeasedJob(Struct):
    job_id: JobId
    team: str                          # the team that submitted it
    name: str
    payload: msgspec.Raw
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    lease_token: uuid.UUID
    claim_expires_at: dt.datetime
    claim_s: float                     # the claim period: heartbeat well within it
    due_at: dt.datetime
    run_at: dt.datetime
    replay: Replay | None = None
    # The W3C trace context the job was submitted under (jobs.traceparent),
    # when it has one: the worker's span of the handler is its child. Absent
    # from a dispatcher older than schema revision 0023.
    traceparent: str | None = None


class LeaseOut(Struct):
    jobs: list[LeasedJob]


class EndPollsIn(Struct, forbid_unknown_fields=True):
    """A stopping worker's long-polls are answered at once."""
    worker: Worker


class EndPollsOut(Struct):
    ended: int                          # the polls of this worker that were waiting, answered with no jobs


# ---------------------------------------------------------------- outcomes
class Held(Struct, forbid_unknown_fields=True):
    job_id: JobId
    lease_token: Token


# A job's result: any JSON, kept as its text (it goes into the database as
# it came); a job with no result leaves it out or sends null.
Result = Annotated[msgspec.Raw | msgspec.UnsetType, Meta(description="any JSON: the job's result")]


class Completed(Struct, forbid_unknown_fields=True):
    job_id: JobId
    lease_token: Token
    result: Result = msgspec.UNSET


class Recorded(Struct, forbid_unknown_fields=True):
    """A keyed job's handler returned this result: recorded under the job's
    idempotency key whatever became of the claim (no lease token), before
    the completion is sent, so that a redelivery replays it."""
    job_id: JobId
    result: Result = msgspec.UNSET


class Failed(Struct, forbid_unknown_fields=True):
    job_id: JobId
    lease_token: Token
    error: Annotated[str, Meta(max_length=10_000)] = "failed"
    retryable: bool = True


ExtendS = Annotated[float, Meta(ge=1, le=86400, description="a heartbeat extends the claim to now + extend_s")]


class OutcomesIn(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Many outcomes in one request (each list may be empty, and is then
    left out: a dispatcher of an earlier release, which refuses fields it
    does not know, reads a request without `record`); the dispatcher
    writes them in batches, one transaction for many jobs. start marks
    claimed jobs running (a completion or failure of a job whose start was
    not reported records its start at the claim); heartbeat extends claims;
    release gives back claimed jobs that were not started (they are due
    again at once, the attempt not counted): a job whose start was reported
    is refused (its attempt counts: fail it to have it retried); record
    keeps keyed jobs' results under their keys, written before the
    completions."""
    start: Annotated[list[Held], Meta(max_length=MAX_ITEMS)] = []
    heartbeat: Annotated[list[Held], Meta(max_length=MAX_ITEMS)] = []
    record: Annotated[list[Recorded], Meta(max_length=MAX_ITEMS)] = []
    complete: Annotated[list[Completed], Meta(max_length=MAX_ITEMS)] = []
    fail: Annotated[list[Failed], Meta(max_length=MAX_ITEMS)] = []
    release: Annotated[list[Held], Meta(max_length=MAX_ITEMS)] = []
    extend_s: ExtendS | None = None


class OutcomeOut(Struct):
    """ok false: the outcome was refused and changed nothing; reason says why
    (no such job, the lease token is not the current claim's, or a release
    of a job that has started)."""
    job_id: JobId
    ok: bool
    state: str | None
    reason: str | None = None


class RecordedOut(Struct):
    """ok: the result the key holds (the first recorded: complete the job
    with it). ok false: nothing to record it under (no such job, no key, or
    the key no longer names the job), and why."""
    job_id: JobId
    ok: bool
    result: Result = msgspec.UNSET
    reason: str | None = None


class OutcomesOut(Struct):
    heartbeat: list[OutcomeOut]
    complete: list[OutcomeOut]
    fail: list[OutcomeOut]
    release: list[OutcomeOut]
    start: list[OutcomeOut] = []
    record: list[RecordedOut] = []


# ---------------------------------------------------------------- one job
class HeldIn(Struct, forbid_unknown_fields=True):
    lease_token: Token
    extend_s: ExtendS | None = None


class CompleteIn(Struct, forbid_unknown_fields=True):
    lease_token: Token
    result: Result = msgspec.UNSET


class FailIn(Struct, forbid_unknown_fields=True):
    lease_token: Token
    error: Annotated[str, Meta(max_length=10_000)] = "failed"
    retryable: bool = True
