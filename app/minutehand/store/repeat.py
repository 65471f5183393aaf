"""Repeating jobs in Python: checking a repeat spec and finding its fire
times, with APScheduler 3 triggers and zoneinfo zones (DST included).

The procedures take fire times as values (sql/functions/series.sql and
chain.sql): PostgreSQL has no cron parser, so what a crontab expression
means is decided here, once, outside any transaction. Every search stops at
the horizon (366 days from now).

DST, as APScheduler 3 defines it for a cron in a zone: a wall time that does
not exist (02:30 on the night clocks go forward) fires once, at that wall
time read with the offset from before the change (03:30 new time); a wall
time that happens twice (02:30 on the night clocks go back) fires twice,
once in each. every_s is plain elapsed seconds, blind to zones.
"""
from __future__ import annotations

import copy
import datetime as dt
import functools
import zoneinfo

from apscheduler.triggers.cron import CronTrigger

from minutehand.store.records import Repeat

MAX_EVERY_S = 366 * 86400
MISFIRE = ("run_once", "skip")
# How far ahead a run may be due: mh_max_ahead() in sql/functions/submit.sql.
HORIZON = dt.timedelta(days=366)
UTC = dt.timezone.utc


def zone(name: str | None) -> zoneinfo.ZoneInfo:
    """The IANA zone (UTC when None); ValueError with a reason if there is none of that name."""
    try:
        return zoneinfo.ZoneInfo(name or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"repeat.timezone {name!r} is not an IANA time zone name (like Europe/Berlin)") from None


@functools.lru_cache(maxsize=4096)
def _parsed(cron: str, timezone: str | None) -> CronTrigger:
    return cron_trigger(cron, timezone)


def cron_trigger(cron: str, timezone: str | None) -> CronTrigger:
    """The trigger of a 5-field crontab expression in a zone; ValueError with a reason."""
    tz = zone(timezone)
    try:
        return CronTrigger.from_crontab(cron, timezone=tz)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"repeat.cron {cron!r} is not a 5-field crontab expression: {exc}") from None


def problem(repeat: Repeat | None) -> str | None:
    """Why the repeat spec is invalid; None if it is valid (or absent)."""
    if repeat is None:
        return None
    if (repeat.every_s is None) == (repeat.cron is None):
        return "repeat needs exactly one of every_s or cron"
    if repeat.misfire not in MISFIRE:
        return f"repeat.misfire must be one of {', '.join(MISFIRE)}"
    if repeat.every_s is not None:
        if repeat.timezone is not None:
            return "repeat.timezone goes with cron, not with every_s"
        if not 1 <= repeat.every_s <= MAX_EVERY_S:
            return f"repeat.every_s must be between 1 and {MAX_EVERY_S} seconds"
        return None
    try:
        cron_trigger(repeat.cron, repeat.timezone)
    except ValueError as exc:
        return str(exc)
    return None


def first_run(repeat: Repeat, due_at: dt.datetime | None, now: dt.datetime
              ) -> tuple[dt.datetime, dt.datetime | None]:
    """The first run's due time (UTC) of a valid repeat spec (first_due),
    and its deadline under misfire skip (the fire time after it; else None)."""
    first = first_due(repeat, due_at, now)
    return first, next_fire(repeat, first, first, now) if repeat.misfire == "skip" else None


def first_due(repeat: Repeat, due_at: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """The first run's due time (UTC) of a valid repeat spec.

    every_s: the due time as given (a past one runs at once, like any job),
    else now. cron: the first fire time of the expression, in its zone, at
    or after the due time (a start, "not before") or now, whichever is later.
    ValueError if the expression does not fire within the horizon (like 0 0 31 2 *)."""
    if repeat.every_s is not None:
        return (due_at or now).astimezone(UTC)
    start = max(due_at, now) if due_at is not None else now
    trigger = cron_trigger(repeat.cron, repeat.timezone)
    # Searched up to the horizon only: unbounded, APScheduler looks as far as
    # year 9999 for an expression that never fires (0.2-0.6 s each).
    trigger.end_date = now + HORIZON
    fire = trigger.get_next_fire_time(None, start)
    if fire is None:
        raise ValueError(f"repeat.cron {repeat.cron!r} does not fire within {HORIZON.days} days "
                         "(the furthest a run may be scheduled)")
    return fire.astimezone(UTC)


def next_fire(repeat: Repeat, anchor: dt.datetime, after: dt.datetime, now: dt.datetime) -> dt.datetime | None:
    """The series' first fire time strictly after `after` (UTC), or None if
    there is none by now + the horizon. every_s counts from the anchor (the
    first run's due time); a cron fires on whole minutes of its zone."""
    limit = now + HORIZON
    if repeat.every_s is not None:
        step = dt.timedelta(seconds=repeat.every_s)
        fire = anchor if after < anchor else anchor + ((after - anchor) // step + 1) * step
    else:
        trigger = copy.copy(_parsed(repeat.cron, repeat.timezone))
        trigger.end_date = limit
        # From the next whole minute, as a UTC instant: searched from "after +
        # 1 µs" in the zone, APScheduler 3.11 returns the same fire time again
        # inside the hour that repeats when clocks go back.
        start = after.astimezone(UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        fire = trigger.get_next_fire_time(None, start)
        fire = fire.astimezone(UTC) if fire is not None else None
    return fire if fire is not None and fire <= limit else None


def next_run(repeat: Repeat, anchor: dt.datetime, after: dt.datetime, now: dt.datetime
             ) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The due time of the run that follows `after` (the run just claimed,
    or the moment the series was resumed or respecified), and its deadline.

    A fire time already past means the chain is behind (an outage, a run
    claimed late): the run that waited stood for the fire times that passed
    meanwhile (misfire run_once), or was dropped at the first of them
    (skip); either way the chain goes on at the first fire time after now.
    The deadline (skip only) is the fire time after the run's: not claimed
    by then, the run is dropped. (None, None): no fire time within the horizon."""
    due = next_fire(repeat, anchor, after, now)
    if due is not None and due < now:
        due = next_fire(repeat, anchor, now, now)
    if due is None:
        return None, None
    return due, next_fire(repeat, anchor, due, now) if repeat.misfire == "skip" else None


def fire_times(repeat: Repeat, after: dt.datetime, count: int, now: dt.datetime, *,
               anchor: dt.datetime | None = None) -> list[dt.datetime]:
    """The next `count` fire times (UTC) of a valid repeat spec strictly after
    `after`, none beyond now + HORIZON (fewer if the spec fires less often):
    next_fire, one after another, so they are the fire times the chain uses.
    every_s counts from `anchor` (the series' first due time; None: `after`)."""
    out: list[dt.datetime] = []
    t = after
    while len(out) < count:
        fire = next_fire(repeat, anchor if anchor is not None else after, t, now)
        if fire is None or fire <= t:
            break
        out.append(fire)
        t = fire
    return out
