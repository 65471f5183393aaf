"""Dead jobs: a team's, by name, each with its last error; requeue or
discard those selected.

    GET  /dead?team=&name=&after_name=&after_id=   the names (with counts) and one page of dead jobs
    POST /dead                                      team, op (requeue|discard), job (each selected id)
    POST /dead/all                                  team, name, op: every dead job of the name (confirmed)

Read from the dead letters (dead_jobs, a row per job while it is dead)
through their (team, name, job) index, a page at a time by keyset; each
job's last error from its record by primary key; the names by a skip scan
of the same index, each counted up to NAME_COUNT_CAP. The selected jobs are
requeued or discarded in one audited transaction through the store methods
the API uses (Store.requeue, Store.discard): if any of them is no longer
dead (another browser or the API got there first), none is changed and the
page says which. Every dead job of one name (an incident's backlog) is
settled BULK at a time by the API's requeue_dead / discard_dead.
"""
from __future__ import annotations

from urllib.parse import urlencode

from litestar import Request, get, post
from litestar.response import Redirect, Template

from minutehand.admin.access import Ctx, Refused, Who, action, render
from minutehand.admin.finding import a_name, an_id, bad, settled, team_in_view, text

PAGE = 50
NAMES = 50
NAME_COUNT_CAP = 1000
BULK = 10_000                  # dead jobs of one name requeued or discarded per click
OPS = {"requeue": "only a dead job can be requeued", "discard": "only a dead job can be discarded"}


@get("/dead", name="admin.dead")
async def dead_page(request: Request, who: Who, ctx: Ctx) -> Template:
    params = request.query_params
    team = team_in_view(who, text(params, "team"))
    name = a_name(text(params, "name"))
    after_id = an_id(text(params, "after_id"), "the page cursor (after_id)")
    after_name = a_name(text(params, "after_name"))
    if (after_id is None) != (after_name is None):
        raise bad("the page cursor needs both after_name and after_id, as the Next link gives them")
    if name is not None and after_name not in (None, name):
        raise bad("the page cursor belongs to another name: start again from the first page")
    done = text(params, "done")
    if team is None:
        return render(request, "dead.html", team=None, name=name, names=[], jobs=[], next_url=None,
                      first_url=None, done=None, cap=NAME_COUNT_CAP)
    if who.is_admin and not await ctx.db(ctx.store.team_exists, team):
        raise Refused(status_code=404, detail=f"no such team {team!r}")
    after = (after_name, after_id) if after_id is not None else None
    names = await ctx.db(ctx.store.dead_names, team, names=NAMES, cap=NAME_COUNT_CAP)
    page = await ctx.db(ctx.store.dead_jobs, team, name=name, after=after, limit=PAGE)
    base = {"team": team, **({"name": name} if name else {})}
    next_url = None
    if page.next_cursor:
        next_url = "?" + urlencode({**base, "after_name": page.next_cursor[0], "after_id": page.next_cursor[1]})
    return render(request, "dead.html", team=team, name=name, names=names, jobs=page.jobs, next_url=next_url,
                  first_url="?" + urlencode(base) if after else None, cap=NAME_COUNT_CAP,
                  done=done if done and done.split(":")[0] in OPS else None)


@post("/dead", name="admin.dead.act", status_code=200)
async def settle(request: Request, who: Who, ctx: Ctx) -> Template | Redirect:
    form = await request.form()
    team = team_in_view(who, text(form, "team"))
    if team is None:
        raise bad("name the team whose dead jobs these are")
    op = text(form, "op")
    if op not in OPS:
        raise bad("choose requeue or discard")
    name = a_name(text(form, "name"))
    ids = [an_id(str(v).strip() or None, "a selected job") for v in form.getall("job", [])]
    ids = sorted({i for i in ids if i is not None})
    if not ids:
        raise bad("select at least one dead job")
    if len(ids) > PAGE:
        raise bad(f"select at most {PAGE} jobs at once (a page)")
    if who.is_admin and not await ctx.db(ctx.store.team_exists, team):
        raise Refused(status_code=404, detail=f"no such team {team!r}")
    store = ctx.store
    call = store.requeue if op == "requeue" else store.discard

    def settle_all() -> int:
        for job_id in ids:
            settled(call(job_id, team), OPS[op])
        return len(ids)

    shown = ids if len(ids) <= 10 else [*ids[:10], f"and {len(ids) - 10} more"]
    count = await action(ctx, who.note(f"{op} dead jobs", ",".join(map(str, ids[:10])), team=team,
                                       jobs=[str(i) for i in shown], count=len(ids)), settle_all)
    back = {"team": team, **({"name": name} if name else {}), "done": f"{op}:{count}"}
    return Redirect(f"/admin/dead?{urlencode(back)}", status_code=303)


@post("/dead/all", name="admin.dead.all", status_code=200)
async def settle_name(request: Request, who: Who, ctx: Ctx) -> Template | Redirect:
    """Every dead job of one name (an incident's backlog), BULK at a time,
    through Store.requeue_dead / discard_dead, after a confirmation."""
    form = await request.form()
    team = team_in_view(who, text(form, "team"))
    name = a_name(text(form, "name"))
    op = text(form, "op")
    if team is None or name is None:
        raise bad("name the team and the job name whose dead jobs these are")
    if op not in OPS:
        raise bad("choose requeue or discard")
    if who.is_admin and not await ctx.db(ctx.store.team_exists, team):
        raise Refused(status_code=404, detail=f"no such team {team!r}")
    if form.get("confirm") != "yes":
        verb = "Requeue" if op == "requeue" else "Discard"
        return render(request, "confirm.html", title=f"{verb} every dead job named {name}?",
                      what=f"{verb} every dead job of team {team} named {name} (up to {BULK:,} now)?",
                      why=("They go back on the wheel, due now, their attempts counted again from 0."
                           if op == "requeue" else "They are set aside for good (state discarded), errors kept."),
                      action_url="/dead/all", button=f"{verb} them",
                      back_url="/dead?" + urlencode({"team": team, "name": name}),
                      danger=op == "discard", fields={"team": [team], "name": [name], "op": [op]})
    call = ctx.store.requeue_dead if op == "requeue" else ctx.store.discard_dead
    done = await action(ctx, who.note(f"{op} dead jobs named", name, team=team, limit=BULK),
                        lambda: call(team, name, limit=BULK))
    back = {"team": team, "name": name, "done": f"{op}:{done.count}" + (":more" if done.more else "")}
    return Redirect(f"/admin/dead?{urlencode(back)}", status_code=303)


HANDLERS: list = [dead_page, settle, settle_name]
