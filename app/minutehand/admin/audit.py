"""The audit page: every action taken through the admin UI, newest first,
keyset-paginated on the entry id (the admin sees all; a team, the entries
concerning it)."""
from __future__ import annotations

from typing import Annotated

from litestar import Request, get
from litestar.params import Parameter
from litestar.response import Template

from minutehand.admin.access import Ctx, Who, render

PAGE = 50


@get("/audit", name="admin.audit")
async def audit_page(request: Request, who: Who, ctx: Ctx,
                     before: Annotated[int | None, Parameter(ge=1, required=False)] = None) -> Template:
    entries, next_before = await ctx.db(ctx.store.audit_page, who.principal.team, before=before, limit=PAGE)
    return render(request, "audit.html", entries=entries, next_before=next_before, first=before is None)


HANDLERS: list = [audit_page]
