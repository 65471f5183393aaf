"""The worker pull protocol's routes (bodies in minutehand.protocol), for a process
that runs a Dispatcher. Only a worker credential (a fleet token, stored
hashed) may call them: a team's token or none is 401.

Bodies are typed `data` parameters decoded strictly, like the submitter
API's (app/minutehand/api/bodies.py): malformed JSON 400, wrong shape or out-of-range
values (negative capacity, a wait past the limit, unknown fields) 422. The
one-job forms answer a refusal with a 4xx: 404 for a job that does not
exist, 409 stale-claim for a lease token that is not the job's current
claim (it expired and the job went to another worker, or the job is
finished), 409 not-releasable for a release of a job whose start was
reported; nothing is changed either way.
"""
from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Request, Router, post
from litestar.di import NamedDependency
from litestar.params import JSONBody, PathParameter

from minutehand.api import problems
from minutehand.api.auth import bearer_hash, checked_before_body, unauthorized
from minutehand.api.bodies import StrictBody
from minutehand.api.problems import COMMON
from minutehand.dispatch.dispatcher import Dispatcher
from minutehand.protocol import (CompleteIn, EndPollsIn, EndPollsOut, FailIn, HeldIn, JobId, LeaseIn, LeaseOut,
                                 OutcomeOut, OutcomesIn, OutcomesOut, RecordedOut)
from minutehand.protocol.jsontext import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_text_problem
from minutehand.store.outcomes import STARTED, Complete, Fail, Heartbeat, Record, Recorded, Release, Report, Start
from minutehand.store.records import Outcome
from minutehand.web.auth import TokenCache
from minutehand.web.context import Context
from minutehand.web.problems import INVALID, NOT_FOUND, NOT_RELEASABLE, STALE_CLAIM, TOO_LARGE, ApiProblem, Kind

SECURITY = [{"worker": []}]
JobIdParam = Annotated[int, PathParameter(ge=-(2**63), le=2**63 - 1, description="the job id")]


async def _hung_up(request: Request) -> None:
    """Completes when the client disconnects (the body has been read, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# What a result may be, for the routes' descriptions.
RESULT_RULE = (f"A result is any JSON up to {MAX_JSON_BYTES // 1024} KiB as JSON text (as sent), nested at most "
               f"{MAX_JSON_DEPTH} levels deep, without the escape \\u0000 (jsonb cannot hold it); a result "
               "refused for that leaves the job unchanged, still claimed: fail it, or complete it with a "
               "smaller result.")


class _Refused(Exception):
    """A result that cannot be stored: its kind of problem and why."""

    def __init__(self, kind: Kind, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _result(raw: msgspec.Raw | msgspec.UnsetType) -> bytes | None:
    """The result's JSON text, passed to the database as it is; None for none
    or null. _Refused if it is over the size limit (as a payload is: a
    stored result is served back by every status read), nested too deeply
    (the worker library and clients decode it), or not storable as jsonb."""
    text = b"null" if raw is msgspec.UNSET else bytes(raw)
    if len(text) > MAX_JSON_BYTES:
        raise _Refused(TOO_LARGE, f"result is {len(text):,} bytes of JSON text, over the limit of "
                                  f"{MAX_JSON_BYTES:,} (256 KiB): store it elsewhere and return a reference. "
                                  "The job is unchanged")
    if reason := json_text_problem("result", text):
        raise _Refused(INVALID, f"{reason}. The job is unchanged")
    return None if text == b"null" else text


def _error(text: str) -> str:
    """A failure's error text as PostgreSQL's text can hold it (no NUL)."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _out(o: Outcome) -> OutcomeOut:
    return OutcomeOut(JobId(o.job_id), o.ok, o.state, o.reason)


def _recorded(r: Recorded) -> RecordedOut:
    if r.ok:
        return RecordedOut(JobId(r.job_id), True, msgspec.Raw(r.result.encode()))
    return RecordedOut(JobId(r.job_id), False, reason=r.reason)


def _one(o: Outcome) -> OutcomeOut:
    if o.ok:
        return _out(o)
    if o.state is None:
        raise ApiProblem(NOT_FOUND, f"no job {o.job_id}")
    if o.reason is not None and o.reason.startswith(STARTED):
        raise ApiProblem(NOT_RELEASABLE, o.reason, job_id=str(o.job_id), state=o.state)
    raise ApiProblem(STALE_CLAIM, o.reason or "the lease token is not the current claim's", job_id=str(o.job_id),
                     state=o.state)


def router(ctx: Context, dispatcher: Dispatcher) -> Router:
    tokens = TokenCache(ctx.settings.api_token_cache_s)

    async def write(reports: list[Report], extend_s: float | None = None) -> list:
        return await dispatcher.writer.write(reports, extend_s)

    async def worker_credential(request: Request) -> str:
        token_hash = bearer_hash(request)
        name = tokens.get(token_hash)
        if not isinstance(name, str | None):          # not in the cache
            name = await ctx.db(ctx.store.worker_for_token, token_hash)
            tokens.put(token_hash, name)
        if name is None:
            raise unauthorized("not a worker token: workers use a fleet token (`minutehand worker-token "
                               "create NAME`); team tokens cannot lease jobs")
        return name

    check_first, credential = checked_before_body("credential", worker_credential)
    responses = problems.responses(*COMMON, INVALID)

    @post("/lease", operation_id="leaseJobs", status_code=200, security=SECURITY, tags=["workers"],
          summary="Long-poll for due jobs",
          description="Answers as soon as at least one job is claimed for this worker (at most `capacity`), "
                      "or with an empty list after wait_s. Each job comes with its lease token and claim "
                      "expiry: heartbeat before it, then complete or fail.", responses=responses)
    async def lease(request: Request, data: JSONBody[LeaseIn], credential: NamedDependency[str]) -> LeaseOut:
        body = data
        return LeaseOut(await dispatcher.lease(body.worker, int(body.capacity), body.names, body.wait_s,
                                               gone=_hung_up(request), teams=body.teams))

    @post("/lease/end", operation_id="endLeasePolls", status_code=200, security=SECURITY, tags=["workers"],
          summary="A stopping worker's long-polls answered at once",
          description="The worker's waiting long-polls on this dispatcher are answered now, with no jobs, so "
                      "a stopping worker need not wait out its polls' wait_s (nor hang up on an answer that "
                      "may be on its way: a poll being served when this arrives gets its jobs as usual, to "
                      "give back). `ended`: how many were waiting.", responses=responses)
    async def end_polls(data: JSONBody[EndPollsIn], credential: NamedDependency[str]) -> EndPollsOut:
        return EndPollsOut(dispatcher.end_polls(data.worker))

    @post("/outcomes", operation_id="reportOutcomes", status_code=200, security=SECURITY, tags=["workers"],
          request_max_body_size=ctx.settings.api_max_batch_body_bytes,
          summary="Starts, heartbeats, keyed results recorded, completions, failures and give-backs, in one "
                  "request",
          description="Each item is answered in order: ok, or refused with the reason (a stale lease token "
                      "changes nothing). `record` items (job id and result, no lease token) keep keyed jobs' "
                      "results under their idempotency keys whatever became of their claims, and are written "
                      "before the completions; each is answered with the result the key holds (the first "
                      "recorded), to complete the job with. " + RESULT_RULE + " Here such a completion or "
                      "record alone is refused (ok false, the reason giving the size and the limit); the other "
                      "items are written.",
          responses=responses)
    async def outcomes(data: JSONBody[OutcomesIn], credential: NamedDependency[str]) -> OutcomesOut:
        body = data
        answers: dict[str, list] = {}
        refused: dict[str, dict[int, object]] = {"record": {}, "complete": {}}    # refused here, by position
        records, completions = [], []
        for n, r in enumerate(body.record):
            try:
                records.append(Record(r.job_id, _result(r.result)))
            except _Refused as exc:
                refused["record"][n] = RecordedOut(r.job_id, False, reason=exc.reason)
        for n, c in enumerate(body.complete):
            try:
                completions.append(Complete(c.job_id, c.lease_token, _result(c.result)))
            except _Refused as exc:
                refused["complete"][n] = OutcomeOut(c.job_id, False, None, exc.reason)
        for kind, items in (("start", [Start(s.job_id, s.lease_token) for s in body.start]),
                            ("heartbeat", [Heartbeat(h.job_id, h.lease_token) for h in body.heartbeat]),
                            ("record", records),
                            ("complete", completions),
                            ("fail", [Fail(f.job_id, f.lease_token, _error(f.error), f.retryable)
                                      for f in body.fail]),
                            ("release", [Release(r.job_id, r.lease_token) for r in body.release])):
            answers[kind] = [_recorded(o) if kind == "record" else _out(o) for o in await write(items, body.extend_s)]
        for kind, by_position in refused.items():
            if by_position:
                written = iter(answers[kind])
                answers[kind] = [by_position[n] if n in by_position else next(written)
                                 for n in range(len(getattr(body, kind)))]
        return OutcomesOut(**answers)

    one = problems.responses(*COMMON, INVALID, NOT_FOUND, STALE_CLAIM)

    @post("/jobs/{job_id:int}/start", operation_id="startJob", status_code=200, security=SECURITY,
          tags=["workers"], summary="The worker began running one job (claimed → running)", responses=one)
    async def start(data: JSONBody[HeldIn], credential: NamedDependency[str], job_id: JobIdParam) -> OutcomeOut:
        return _one((await write([Start(job_id, data.lease_token)]))[0])

    @post("/jobs/{job_id:int}/heartbeat", operation_id="heartbeatJob", status_code=200, security=SECURITY,
          tags=["workers"], summary="Extend one job's claim", responses=one)
    async def heartbeat(data: JSONBody[HeldIn], credential: NamedDependency[str], job_id: JobIdParam) -> OutcomeOut:
        return _one((await write([Heartbeat(job_id, data.lease_token)], data.extend_s))[0])

    @post("/jobs/{job_id:int}/complete", operation_id="completeJob", status_code=200, security=SECURITY,
          tags=["workers"], summary="One job succeeded",
          description=RESULT_RULE + " Over the size limit: 413; nested too deeply or not storable: 422.",
          responses=problems.responses(*COMMON, INVALID, NOT_FOUND, STALE_CLAIM, TOO_LARGE))
    async def complete(data: JSONBody[CompleteIn], credential: NamedDependency[str], job_id: JobIdParam) -> OutcomeOut:
        try:
            result = _result(data.result)
        except _Refused as exc:
            raise ApiProblem(exc.kind, exc.reason, job_id=str(job_id)) from None
        return _one((await write([Complete(job_id, data.lease_token, result)]))[0])

    @post("/jobs/{job_id:int}/fail", operation_id="failJob", status_code=200, security=SECURITY,
          tags=["workers"], summary="One job failed (retried after backoff, or dead)", responses=one)
    async def fail(data: JSONBody[FailIn], credential: NamedDependency[str], job_id: JobIdParam) -> OutcomeOut:
        return _one((await write([Fail(job_id, data.lease_token, _error(data.error), data.retryable)]))[0])

    @post("/jobs/{job_id:int}/release", operation_id="releaseJob", status_code=200, security=SECURITY,
          tags=["workers"], summary="Give back a job that was not started",
          description="Due again at once, its attempt not counted. A job whose start was reported cannot be "
                      "given back (409 not-releasable, unchanged): its attempt counts; fail it to have it "
                      "retried.",
          responses=problems.responses(*COMMON, INVALID, NOT_FOUND, STALE_CLAIM, NOT_RELEASABLE))
    async def release(data: JSONBody[HeldIn], credential: NamedDependency[str], job_id: JobIdParam) -> OutcomeOut:
        return _one((await write([Release(job_id, data.lease_token)]))[0])

    return Router("/v1/worker",
                  route_handlers=[lease, end_polls, outcomes, start, heartbeat, complete, fail, release],
                  dto=StrictBody, return_dto=None,             # bodies: msgspec decodes them
                  dependencies={"credential": credential}, before_request=check_first)
