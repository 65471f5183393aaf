"""Jobs: search, a job's whole record, and cancel or requeue it.

    GET  /jobs?id=&team=&name=&state=&due_from=&due_to=&before=   search (keyset pages)
    GET  /jobs/{id}                                                the job's record
    POST /jobs/{id}/cancel|requeue|discard                         confirm first, then act

Search by id is one primary-key lookup. Any other search reads one team's
jobs newest first through its (team_id, id DESC) index (Store.list_jobs):
at most SCAN of them per page, filtered by name, state and due range in
that window, never OFFSET. `jobs` has no index on name, state or due time
(each would cost every submit, and one on state would make every state
change a non-HOT update), so a rare filter gives a short page with a link
that reads on further back; the page says how far back it has read. Dead
jobs of a team are listed whole by the dead-jobs page, from their index.

An action takes two POSTs: the first (the job page's button) shows what
will happen, the second (confirm=yes) does it through the store method the
API uses, audited in the same transaction.
"""
from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from litestar import Request, get, post
from litestar.params import FromPath
from litestar.response import Redirect, Template

from minutehand.admin.access import Ctx, Refused, Who, action, render
from minutehand.admin.finding import (JOB_STATES, a_name, a_state, a_time, an_id, bad, created_at_of, scope,
                                      settled, team_in_view, text)
from minutehand.store.admin import JobRecord

PAGE = 50
SCAN = 2000                   # a filtered page reads at most this many of the team's jobs (unfiltered: PAGE)
JSON_CAP = 16_384             # characters of a payload or result shown
CANCELLABLE = ("scheduled", "retrying", "claimed")       # what Store.cancel accepts: not started
ACTIONS = {
    "cancel": ("Cancel", "It will not run; a job that has started cannot be cancelled. A job a worker holds "
                         "(claimed) is asked to cancel: it is cancelled unless its worker had started it."),
    "requeue": ("Requeue", "It goes back on the wheel, due now, its attempts counted again from 0."),
    "discard": ("Discard", "It is set aside for good (state discarded), with its last error kept."),
}


def can(record: JobRecord, op: str) -> bool:
    return record.state in CANCELLABLE if op == "cancel" else record.state == "dead"


@get("/jobs", name="admin.jobs")
async def search(request: Request, who: Who, ctx: Ctx) -> Template:
    params = request.query_params
    job_id = an_id(text(params, "id"), "id")
    team = team_in_view(who, text(params, "team"))
    name, state = a_name(text(params, "name")), a_state(text(params, "state"))
    due_from, due_to = a_time(text(params, "due_from"), "due from"), a_time(text(params, "due_to"), "due to")
    before = an_id(text(params, "before"), "the page cursor (before)")
    if due_from and due_to and due_from >= due_to:
        raise bad("the due range is empty or reversed: 'due from' must be before 'due to'")
    form = {"id": text(params, "id") or "", "team": team or "", "name": name or "", "state": state or "",
            "due_from": text(params, "due_from") or "", "due_to": text(params, "due_to") or ""}
    shown = dict(form=form, states=JOB_STATES, scan=SCAN, page_size=PAGE)
    if job_id is not None:
        found = await ctx.db(ctx.store.job_record, job_id, scope(who), cap=0, deaths=0)
        return render(request, "jobs.html", jobs=[found[0]] if found else [], by_id=job_id, **shown)
    if team is None:
        if name or state or due_from or due_to or before:
            raise bad("a search by name, state, due time or page needs a team: name one (or give a job id)")
        return render(request, "jobs.html", jobs=None, **shown)
    if who.is_admin and not await ctx.db(ctx.store.team_exists, team):
        raise Refused(status_code=404, detail=f"no such team {team!r}")
    filtered = bool(state or name or due_from or due_to)
    page = await ctx.db(ctx.store.list_jobs, team, state=state, name=name, due_before=due_to, due_after=due_from,
                        before_id=before, limit=PAGE, scan=SCAN if filtered else PAGE)
    query = {k: v for k, v in form.items() if v and k != "id"}
    next_url = f"?{urlencode({**query, 'before': page.next_cursor})}" if page.next_cursor else None
    return render(request, "jobs.html", jobs=[_row(j, team) for j in page.jobs], next_url=next_url,
                  first_url=f"?{urlencode(query)}" if before else None,
                  read_to=created_at_of(page.next_cursor) if page.next_cursor else None,
                  read_from=created_at_of(before) if before else None, **shown)


def _row(j, team: str) -> dict:
    return {"job_id": j.job_id, "team": team, "name": j.name, "state": j.state, "due_at": j.due_at,
            "run_at": j.run_at, "attempts": j.attempts, "max_attempts": j.max_attempts, "created_at": j.created_at}


async def _record(ctx, who, job_id: int) -> tuple[JobRecord, list]:
    if not 0 < job_id <= 2**63 - 1:
        raise Refused(status_code=404, detail=f"no job {job_id}")
    found = await ctx.db(ctx.store.job_record, job_id, scope(who), cap=JSON_CAP)
    if found is None:
        raise Refused(status_code=404, detail=f"no job {job_id}")
    return found


def _claim_delay(record: JobRecord) -> dt.timedelta | None:
    """How long after its run time the job was last claimed (run_at moves
    with a retry: this is the latest attempt's; None: never claimed)."""
    return record.claimed_at - record.run_at if record.claimed_at else None


@get("/jobs/{job_id:int}", name="admin.job")
async def job_page(request: Request, who: Who, ctx: Ctx, job_id: FromPath[int]) -> Template:
    record, deaths = await _record(ctx, who, job_id)
    ended = await ctx.db(ctx.store.job_attempts, job_id)
    done = text(request.query_params, "done")
    return render(request, "job.html", job=record, deaths=deaths, ended=ended, claim_delay=_claim_delay(record),
                  json_cap=JSON_CAP, done=done if done in ACTIONS else None,
                  actions=[op for op in ACTIONS if can(record, op)], labels=ACTIONS)


@post("/jobs/{job_id:int}/{op:str}", name="admin.job.act", status_code=200)
async def act(request: Request, who: Who, ctx: Ctx, job_id: FromPath[int],
              op: FromPath[str]) -> Template | Redirect:
    if op not in ACTIONS:
        raise Refused(status_code=404, detail="no such page")
    record, _ = await _record(ctx, who, job_id)
    form = await request.form()
    if form.get("confirm") != "yes":
        if not can(record, op):
            raise Refused(status_code=409, detail=f"job {job_id} is {record.state}: it cannot be "
                                                  f"{'cancelled' if op == 'cancel' else op + 'ed'}")
        return render(request, "confirm.html", title=f"{ACTIONS[op][0]} job {job_id}?",
                      what=f"{ACTIONS[op][0]} job {job_id} ({record.name}, team {record.team}, now "
                           f"{record.state})?", why=ACTIONS[op][1], action_url=f"/jobs/{job_id}/{op}",
                      button=f"{ACTIONS[op][0]} the job", back_url=f"/jobs/{job_id}", danger=op != "requeue",
                      fields={})
    store = ctx.store
    call = {"cancel": store.cancel, "requeue": store.requeue, "discard": store.discard}[op]
    refusal = {"cancel": "only a job that has not started can be cancelled",
               "requeue": "only a dead job can be requeued", "discard": "only a dead job can be discarded"}[op]
    await action(ctx, who.note(f"{op} job", str(job_id), team=record.team),
                 lambda: settled(call(job_id, record.team), refusal))
    return Redirect(f"/admin/jobs/{job_id}?done={op}", status_code=303)


HANDLERS: list = [search, job_page, act]
