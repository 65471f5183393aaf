"""Dispatchers and shards (the admin's): which dispatcher holds which
shard's lease, until when, at which fencing epoch; the dispatchers'
memberships and duties; the workers holding jobs now, with a few of their
jobs and when they were last heard from (Store.admin_fleet: 256 shard rows,
the dispatchers, the latest claim reminders; never a scan of jobs)."""
from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from litestar import Request, get
from litestar.response import Template

from minutehand.admin.access import Ctx, Who, admin_only, render
from minutehand.store.admin import ShardLease


@dataclass(frozen=True)
class Holding:
    """The shards one holder (None: none) has, in ranges, with their epochs and lease expiries."""
    owner: str | None
    count: int
    ranges: str
    epochs: str
    expires: tuple[dt.datetime | None, dt.datetime | None]      # earliest, latest


def ranges(numbers: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0–2, 5, 7–8"."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def holdings(shards: Sequence[ShardLease]) -> list[Holding]:
    by_owner: dict[str | None, list[ShardLease]] = {}
    for s in shards:
        by_owner.setdefault(s.owner, []).append(s)
    result = []
    for owner, held in sorted(by_owner.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        epochs = sorted({s.epoch for s in held})
        expiries = [s.lease_expires_at for s in held if s.lease_expires_at is not None]
        result.append(Holding(owner, len(held), ranges([s.shard for s in held]),
                              str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}–{epochs[-1]}",
                              (min(expiries), max(expiries)) if expiries else (None, None)))
    return result


@get("/dispatchers", name="admin.dispatchers")
async def dispatchers_page(request: Request, who: Who, ctx: Ctx) -> Template:
    admin_only(who)
    fleet = await ctx.db(ctx.store.admin_fleet)
    held = Counter(s.owner for s in fleet.shards)
    return render(request, "dispatchers.html", fleet=fleet, held=held, free=held.get(None, 0),
                  holdings=holdings(fleet.shards))


HANDLERS: list = [dispatchers_page]
