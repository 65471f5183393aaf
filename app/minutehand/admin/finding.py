"""What the jobs, dead-jobs and series pages share: reading what a browser
sends (ids, team, dates, states, cursors) into values or a 400 page that
says what was wrong, the team a signed-in browser may look at, and a
store Outcome turned into a refusal (so an audited action rolls back).

A team's browser sees only its own team: naming another team, or the id of
another team's job or series, is "not found" (404), as an unknown one, so
it tells nothing of what others have."""
from __future__ import annotations

import datetime as dt
import re

from minutehand.admin.access import Refused, Signed
from minutehand.rules import TEAM_NAME_PATTERN
from minutehand.store import errors
from minutehand.store.records import Outcome

ID_MAX = 2**63 - 1
NAME_MAX = 200
JOB_STATES = ("scheduled", "claimed", "running", "retrying", "succeeded", "dead", "cancelled", "discarded")
_TEAM = re.compile(TEAM_NAME_PATTERN)
_ID = re.compile(r"[0-9]{1,19}")
EPOCH_MS = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)   # ids count milliseconds from here (mh_new_id)


def bad(detail: str) -> Refused:
    return Refused(status_code=400, detail=detail)


def text(params, key: str) -> str | None:
    """A query or form field as stripped text; None when absent or empty."""
    value = params.get(key)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def an_id(value: str | None, what: str) -> int | None:
    """A job or series id (a positive 64-bit integer), or None; 400 otherwise."""
    if value is None:
        return None
    if not _ID.fullmatch(value) or not 0 < int(value) <= ID_MAX:
        raise bad(f"{what} must be a job id as the API gives it: a whole number from 1 to {ID_MAX}, "
                  f"not {value[:40]!r}")
    return int(value)


def a_name(value: str | None) -> str | None:
    if value is not None and len(value) > NAME_MAX:
        raise bad(f"a job name is at most {NAME_MAX} characters")
    return value


def a_state(value: str | None) -> str | None:
    if value is not None and value not in JOB_STATES:
        raise bad(f"state must be one of {', '.join(JOB_STATES)}, not {value[:40]!r}")
    return value


def a_time(value: str | None, what: str) -> dt.datetime | None:
    """An ISO 8601 time (a browser's datetime-local field, no zone: UTC); 400 otherwise."""
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise bad(f"{what} must be a date and time like 2030-01-31T14:05 (UTC), not {value[:40]!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    try:
        return t.astimezone(dt.timezone.utc)
    except OverflowError:
        raise bad(f"{what} is out of range (years 1 to 9999)") from None


def created_at_of(job_id: int) -> dt.datetime:
    """When the job with this id was created (ids are time-ordered: mh_new_id)."""
    return EPOCH_MS + dt.timedelta(milliseconds=job_id >> 23)


def team_in_view(who: Signed, team: str | None) -> str | None:
    """The team a listing shows: a team's browser its own (another name is
    404); the admin the team it names (None: none named yet)."""
    if team is not None and not _TEAM.fullmatch(team):
        raise bad(f"{team[:40]!r} is not a team name (lowercase letters, digits, _ . -)")
    if who.principal.team is not None:
        if team is not None and team != who.principal.team:
            raise Refused(status_code=404, detail=f"no such team {team!r}")
        return who.principal.team
    return team


def scope(who: Signed) -> str | None:
    """The team filter of a read by id: a team's own, the admin's none."""
    return who.principal.team


def settled(outcome: Outcome, what: str) -> Outcome:
    """The outcome of a cancel, requeue or discard, or the refusal it was:
    NotFound (no such job) or Conflict (its state does not allow it), raised
    so that the audited transaction writes nothing of it."""
    if outcome.ok:
        return outcome
    if outcome.state is None:
        raise errors.NotFound(f"no job {outcome.job_id}")
    raise errors.Conflict(f"job {outcome.job_id} is {outcome.state}: {what}; nothing was changed")
