"""Series: a team's repeating jobs, one series' next and last runs, and
pause / resume / cancel.

    GET  /series?team=&after=             a team's series, newest first (keyset pages)
    GET  /series/{id}                      spec, state, next fire times, waiting run, last runs
    POST /series/{id}/pause|resume|cancel  confirm first, then act

The reads and the controls are the store methods behind /v1/series
(Store.list_series, Store.series, Store.pause_series ...), the next fire
times computed as the API computes them (app/minutehand/rules.py); each control
is audited in its own transaction. The admin reaches a series through its
team (Store.series_team, one primary-key lookup).
"""
from __future__ import annotations

from urllib.parse import urlencode

import anyio.to_thread
from litestar import Request, get, post
from litestar.params import FromPath
from litestar.response import Redirect, Template

from minutehand.admin.access import Ctx, Refused, Who, action, render
from minutehand.admin.finding import an_id, team_in_view, text
from minutehand.rules import next_fire_times
from minutehand.store import errors
from minutehand.store.series import SeriesDetail

PAGE = 50
RUNS = 20
CONTROLS = {
    "pause": ("Pause", "No further run is created until it is resumed; its waiting run is cancelled if it has "
                       "not started."),
    "resume": ("Resume", "Its next run is created at the first fire time after now."),
    "cancel": ("Cancel", "No further run is ever created; its waiting run is cancelled if it has not started. "
                         "A cancelled series cannot be resumed."),
}
ALLOWED = {"active": ("pause", "cancel"), "paused": ("resume", "cancel"), "cancelled": ()}


@get("/series", name="admin.series")
async def series_list(request: Request, who: Who, ctx: Ctx) -> Template:
    params = request.query_params
    team = team_in_view(who, text(params, "team"))
    after = an_id(text(params, "after"), "the page cursor (after)")
    if team is None:
        return render(request, "series_list.html", team=None, series=[], next_url=None, first_url=None)
    if who.is_admin and not await ctx.db(ctx.store.team_exists, team):
        raise Refused(status_code=404, detail=f"no such team {team!r}")
    page = await ctx.db(ctx.store.list_series, team, after=after, limit=PAGE)
    next_url = "?" + urlencode({"team": team, "after": page.next_cursor}) if page.next_cursor else None
    return render(request, "series_list.html", team=team, series=page.series, next_url=next_url,
                  first_url="?" + urlencode({"team": team}) if after else None)


async def _series(ctx, who, series_id: int) -> SeriesDetail:
    """The series, if the browser may see it; 404 otherwise (another team's too)."""
    missing = Refused(status_code=404, detail=f"no such series {series_id}")
    if not 0 < series_id <= 2**63 - 1:
        raise missing
    team = who.principal.team or await ctx.db(ctx.store.series_team, series_id)
    if team is None:
        raise missing
    try:
        return await ctx.db(ctx.store.series, team, series_id, runs=RUNS)
    except errors.NotFound:
        raise missing from None


@get("/series/{series_id:int}", name="admin.series.one")
async def series_page(request: Request, who: Who, ctx: Ctx, series_id: FromPath[int]) -> Template:
    s = await _series(ctx, who, series_id)
    fire_times = await anyio.to_thread.run_sync(next_fire_times, s)
    done = text(request.query_params, "done")
    return render(request, "series.html", s=s, fire_times=fire_times, controls=ALLOWED.get(s.state, ()),
                  labels=CONTROLS, done=done if done in CONTROLS else None)


@post("/series/{series_id:int}/{op:str}", name="admin.series.act", status_code=200)
async def control(request: Request, who: Who, ctx: Ctx, series_id: FromPath[int],
                  op: FromPath[str]) -> Template | Redirect:
    if op not in CONTROLS:
        raise Refused(status_code=404, detail="no such page")
    s = await _series(ctx, who, series_id)
    if op not in ALLOWED.get(s.state, ()):
        raise Refused(status_code=409, detail=f"series {series_id} is {s.state}: it cannot be "
                                              f"{'paused' if op == 'pause' else op + 'd'}; nothing was changed")
    form = await request.form()
    if form.get("confirm") != "yes":
        return render(request, "confirm.html", title=f"{CONTROLS[op][0]} series {series_id}?",
                      what=f"{CONTROLS[op][0]} series {series_id} ({s.name}, team {s.team}, now {s.state})?",
                      why=CONTROLS[op][1], action_url=f"/series/{series_id}/{op}",
                      button=f"{CONTROLS[op][0]} the series", back_url=f"/series/{series_id}",
                      danger=op == "cancel", fields={})
    call = {"pause": ctx.store.pause_series, "resume": ctx.store.resume_series, "cancel": ctx.store.cancel_series}[op]
    await action(ctx, who.note(f"{op} series", str(series_id), team=s.team), call, s.team, series_id)
    return Redirect(f"/admin/series/{series_id}?done={op}", status_code=303)


HANDLERS: list = [series_list, series_page, control]
