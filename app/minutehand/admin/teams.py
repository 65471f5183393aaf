"""Teams: quotas, weights, admission limits (rate, burst, pending ceiling)
and retention, listed by name (keyset pages); the admin edits them and
rotates a team's token, through the store methods the /v1/teams API uses
and with its checks (app/minutehand/rules.py). A team's session sees its own team,
read-only. A refused edit re-renders the form with the reason (422) and
writes nothing."""
from __future__ import annotations

import math
import re
from typing import Annotated, Any

from litestar import Request, get, post
from litestar.params import Parameter
from litestar.response import Template

from minutehand.admin.access import Ctx, Refused, Signed, Who, action, admin_only, render
from minutehand.rules import TEAM_NAME_PATTERN, retention_problem
from minutehand.store import errors
from minutehand.store.teams import KEEP, TeamSettings
from minutehand.web.context import Context

PAGE = 50
INT_MAX = 2**31 - 1
FIELDS = ("quota", "weight", "submit_rate", "submit_burst", "max_pending", "retention_s")
WHOLE = re.compile(r"[0-9]{1,12}")                    # ASCII digits only (int() takes any script's)
DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?")
TeamName = Annotated[str, Parameter(pattern=TEAM_NAME_PATTERN)]


class FormProblem(Exception):
    """A field of the edit form that cannot be taken: its name and why."""

    def __init__(self, field: str, reason: str):
        super().__init__(reason)
        self.field, self.reason = field, reason


def _whole(field: str, text: str, *, required: bool) -> int | None:
    if not text:
        if required:
            raise FormProblem(field, f"{field}: give a whole number from 1 to {INT_MAX:,}")
        return None
    if not WHOLE.fullmatch(text) or not 1 <= int(text) <= INT_MAX:
        raise FormProblem(field, f"{field}: {text[:40]!r} is not a whole number from 1 to {INT_MAX:,}")
    return int(text)


def _rate(text: str) -> float | None:
    if not text:
        return None
    rate = float(text) if DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(rate) or not 0 < rate <= 1_000_000:
        raise FormProblem("submit_rate", f"submit_rate: {text[:40]!r} is not a number of jobs per second above 0, "
                                         "at most 1,000,000 (empty: no rate limit)")
    return rate


def parse_edit(form: dict[str, str]) -> dict[str, Any]:
    """update_team's arguments from the edit form; FormProblem for a field
    out of shape. Empty means: submit_rate no limit (and no burst), burst
    the team's own or a second's worth, max_pending and retention_s the
    server's settings."""
    values = {f: (form.get(f) or "").strip() for f in FIELDS}
    rate = _rate(values["submit_rate"])
    burst = _whole("submit_burst", values["submit_burst"], required=False)
    retention = _whole("retention_s", values["retention_s"], required=False)
    if reason := retention_problem(retention):
        raise FormProblem("retention_s", reason)
    return {"quota": _whole("quota", values["quota"], required=True),
            "weight": _whole("weight", values["weight"], required=True),
            "submit_rate": rate,
            "submit_burst": burst if burst is not None else (KEEP if rate is not None else None),
            "max_pending": _whole("max_pending", values["max_pending"], required=False),
            "retention_s": retention}


def _form_of(team: TeamSettings) -> dict[str, str]:
    return {f: "" if getattr(team, f) is None else f"{getattr(team, f):g}" if f == "submit_rate"
            else str(getattr(team, f)) for f in FIELDS}


async def _team(ctx: Context, who: Signed, name: str) -> TeamSettings:
    name = who.principal.own_team(name)        # a team names only itself ("no such team" otherwise)
    team = await ctx.db(ctx.store.team, name)
    if team is None:
        raise Refused(status_code=404, detail=f"no such team {name!r}")
    return team


@get("/teams", name="admin.teams")
async def teams_page(request: Request, who: Who, ctx: Ctx,
                     after: Annotated[str | None, Parameter(pattern=TEAM_NAME_PATTERN, required=False)] = None
                     ) -> Template:
    if not who.is_admin:
        return render(request, "teams.html", teams=[await _team(ctx, who, who.principal.team)], next_after=None,
                      first=True)
    page = await ctx.db(ctx.store.list_teams, after=after, limit=PAGE)
    return render(request, "teams.html", teams=page.teams, next_after=page.next_cursor, first=after is None)


@get("/teams/{name:str}", name="admin.team")
async def team_page(request: Request, who: Who, ctx: Ctx,
                    name: TeamName) -> Template:
    team = await _team(ctx, who, name)
    return render(request, "team.html", team=team, form=_form_of(team))


@post("/teams/{name:str}", name="admin.team.edit", status_code=200)
async def edit_team(request: Request, who: Who, ctx: Ctx,
                    name: TeamName) -> Template:
    admin_only(who)
    team = await _team(ctx, who, name)
    form = {f: v for f, v in (await request.form()).items() if f in FIELDS and isinstance(v, str)}
    try:
        changes = parse_edit(form)
        shown = {k: v for k, v in changes.items() if v is not KEEP}
        team = await action(ctx, who.note("edit team", name, team=name, **shown), ctx.store.update_team, name,
                            **changes)
    except FormProblem as problem:
        return render(request, "team.html", status_code=422, team=team, form=form, error=problem.reason,
                      field=problem.field)
    except errors.InvalidInput as refused:
        return render(request, "team.html", status_code=422, team=team, form=form, error=refused.message)
    ctx.admission.forget(name)
    return render(request, "team.html", team=team, form=_form_of(team), saved=True)


@post("/teams/{name:str}/token", name="admin.team.token", status_code=200)
async def rotate_token(request: Request, who: Who, ctx: Ctx,
                       name: TeamName) -> Template:
    admin_only(who)
    token = await action(ctx, who.note("rotate token", name, team=name), ctx.store.rotate_token, name)
    ctx.tokens.forget_team(name)
    team = await _team(ctx, who, name)
    return render(request, "team.html", team=team, form=_form_of(team), new_token=token)


HANDLERS: list = [teams_page, team_page, edit_team, rotate_token]
