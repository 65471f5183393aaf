"""Dispatchers and shards (the admin's): which dispatcher holds which
shard's lease, until when, at which fencing epoch; the dispatchers'
memberships and duties; the workers holding jobs now, with a few of their
jobs and when they were last heard from (Store.admin_fleet: 256 shard rows,
the dispatchers, the latest claim reminders; never a scan of jobs)."""
from __future__ import annotations

from collections import Counter

from litestar import Request, get
from litestar.response import Template

from minutehand.admin.access import Ctx, Who, admin_only, render


@get("/dispatchers", name="admin.dispatchers")
async def dispatchers_page(request: Request, who: Who, ctx: Ctx) -> Template:
    admin_only(who)
    fleet = await ctx.db(ctx.store.admin_fleet)
    held = Counter(s.owner for s in fleet.shards)
    return render(request, "dispatchers.html", fleet=fleet, held=held, free=held.get(None, 0))


HANDLERS: list = [dispatchers_page]
