"""The overview: the last hour minute by minute (started, succeeded,
failed, dead; jobs planned to run), running vs quota per team, lateness
p50/p99, and the next 24 hours of planned run minutes as a histogram.
Read from counters (team_stats, team_running, load_minutes) and planner
estimates, never the jobs (Store.admin_overview). The live part is a
fragment htmx reloads every REFRESH_S seconds."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from litestar import Request, get
from litestar.response import Template

from minutehand.admin import charts
from minutehand.admin.access import Ctx, Signed, Who, render
from minutehand.store.admin import Overview
from minutehand.store.stats import quantile_bound
from minutehand.web.context import Context

REFRESH_S = 10
MINUTE = dt.timedelta(minutes=1)
SERIES = ("started", "succeeded", "failed", "dead")


def _minutes(start: dt.datetime, count: int) -> list[dt.datetime]:
    return [start + i * MINUTE for i in range(count)]


def _by_minute(times: Sequence[dt.datetime], pairs: dict[dt.datetime, int]) -> list[int]:
    return [pairs.get(t, 0) for t in times]


def _bound(seconds: float | None, total: int) -> str:
    if total == 0:
        return "—"
    return "over 1 h" if seconds is None else f"≤ {seconds:g} s"


def view(overview: Overview) -> dict[str, Any]:
    """What the live fragment shows, from one Overview."""
    now = overview.now.astimezone(dt.timezone.utc)
    now_minute = now.replace(second=0, microsecond=0)
    hour = _minutes(now_minute - 59 * MINUTE, 60)
    counted = {m.minute: m for m in overview.minutes}
    series = [(name, [getattr(counted[t], name) if t in counted else 0 for t in hour]) for name in SERIES]
    planned = dict(overview.planned)
    if overview.depth is not None:
        series.append(("planned to run", _by_minute(hour, planned)))
    lateness = [sum(col) for col in zip(*(m.lateness_hist for m in overview.minutes))] or [0]
    total = sum(lateness)
    ahead = _minutes(now_minute - 60 * MINUTE, 60 + 24 * 60)
    return {
        "hour_chart": charts.line_chart(hour, series, label="jobs per minute over the last hour"),
        "legend": charts.legend([name for name, _ in series]),
        "totals": {name: sum(values) for name, values in series},
        "due_now": planned.get(now_minute, 0),
        "last_minute": {name: values[-2] if len(values) > 1 else 0 for name, values in series},
        "lateness_p50": _bound(quantile_bound(lateness, 0.5), total),
        "lateness_p99": _bound(quantile_bound(lateness, 0.99), total),
        "lateness_n": total,
        "running": [(team, running, quota, min(100, round(100 * running / quota)) if quota else 0)
                    for team, running, quota in overview.running],
        "day_chart": charts.histogram(ahead, _by_minute(ahead, planned), now_index=60,
                                      label="jobs planned per run minute, from an hour back to 24 hours ahead")
        if overview.depth is not None else None,
        "day_peak": max(((n, t) for t in ahead[60:] if (n := planned.get(t, 0))),     # the first of the busiest
                        key=lambda p: (p[0], -p[1].timestamp()), default=(0, None)),
        "depth": overview.depth,
        "now": now,
        "refresh_s": REFRESH_S,
    }


async def _overview(ctx: Context, who: Signed) -> dict[str, Any]:
    return view(await ctx.db(ctx.store.admin_overview, who.principal.team))


@get("/", name="admin.overview")
async def overview_page(request: Request, who: Who, ctx: Ctx) -> Template:
    return render(request, "overview.html", **await _overview(ctx, who))


@get("/overview/live", name="admin.overview.live")
async def overview_live(request: Request, who: Who, ctx: Ctx) -> Template:
    return render(request, "overview_live.html", **await _overview(ctx, who))


HANDLERS: list = [overview_page, overview_live]
