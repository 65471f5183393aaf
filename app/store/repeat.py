"""Repeating jobs in Python: checking a repeat spec and finding its first
fire time, with APScheduler 3 triggers and zoneinfo zones (DST included).

The procedures take fire times as values (sql/functions/series.sql): PostgreSQL
has no cron parser, so what a crontab expression means is decided here, once.
"""
from __future__ import annotations

import datetime as dt
import zoneinfo

from apscheduler.triggers.cron import CronTrigger

from minutehand.store.records import Repeat

MAX_EVERY_S = 366 * 86400
# How far ahead a run may be due: mh_max_ahead() in sql/functions/submit.sql.
HORIZON = dt.timedelta(days=366)
UTC = dt.timezone.utc


def zone(name: str | None) -> zoneinfo.ZoneInfo:
    """The IANA zone (UTC when None); ValueError with a reason if there is none of that name."""
    try:
        return zoneinfo.ZoneInfo(name or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"repeat.timezone {name!r} is not an IANA time zone name (like Europe/Berlin)") from None


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
