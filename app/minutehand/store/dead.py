"""Dead jobs put back on the wheel (requeue) or set aside for good
(discard), one by one or by name; a team's feed of events and its webhook
(sql/queries/dead.sql)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minutehand.store import errors
from minutehand.store.base import StoreBase
from minutehand.store.records import Outcome


@dataclass(frozen=True)
class DeadSettled:
    """A requeue or discard of a team's dead jobs of one name: how many, and
    whether more remain (call again)."""
    count: int
    more: bool


@dataclass(frozen=True)
class JobEvent:
    """A job of the team that became dead (kind "dead"), from the team's feed.
    position: (xid, id), where the feed goes on after it."""
    id: int
    xid: str
    kind: str
    job_id: int
    name: str
    attempts: int
    max_attempts: int
    error: str | None
    at: dt.datetime


@dataclass(frozen=True)
class Webhook:
    url: str
    failures: int                      # failed attempts of the batch now being delivered
    next_attempt_at: dt.datetime | None
    updated_at: dt.datetime


@dataclass(frozen=True)
class WebhookDelivery:
    """One delivery attempt: its events (ids first..last), the answer or the error."""
    at: dt.datetime
    url: str
    events: int
    first_event: int
    last_event: int
    attempt: int
    status_code: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class PendingDelivery:
    """A webhook with events to deliver: from its position (from_xid,
    from_id), the next events as JSON-ready dicts, oldest first."""
    team_id: int
    team: str
    url: str
    secret: str
    from_xid: str
    from_id: int
    failures: int
    events: list[dict[str, Any]]


class DeadJobStore(StoreBase):
    """Dead jobs, events and webhooks, a part of Store."""

    def requeue(self, job_id: int, team: str | None, max_attempts: int | None = None) -> Outcome:
        """Put a dead job back on the wheel, due now, with a new attempt budget
        (None: its own), as `team` (None: the administrator, through the job's
        own team). Refused (ok False, state None if there is no such job) when
        it is not dead; raises InvalidInput for a bad budget."""
        team = self.team_of(job_id, team)
        if team is None:
            return Outcome(job_id, False, None, "no such job")
        return Outcome(**self._one("requeue_job", {"job_id": job_id, "team": team, "max_attempts": max_attempts}))

    def discard(self, job_id: int, team: str | None) -> Outcome:
        """Set a dead job aside for good (state discarded); refused as requeue."""
        team = self.team_of(job_id, team)
        if team is None:
            return Outcome(job_id, False, None, "no such job")
        return Outcome(**self._one("discard_job", {"job_id": job_id, "team": team}))

    def requeue_dead(self, team: str, name: str, *, max_attempts: int | None = None,
                     limit: int = 10_000) -> DeadSettled:
        """Requeue the team's dead jobs of this name, at most `limit`."""
        row = self._one("requeue_dead", {"team": team, "name": name, "max_attempts": max_attempts, "limit": limit})
        return DeadSettled(row["settled"], row["more"])

    def dead_count(self, team: str, name: str, *, max_attempts: int | None = None, limit: int = 10_000) -> int:
        """How many jobs requeue_dead with these arguments would put back now
        (refused as it would refuse them)."""
        return self._one("dead_count", {"team": team, "name": name, "max_attempts": max_attempts,
                                        "limit": limit})["count"]

    def discard_dead(self, team: str, name: str, *, limit: int = 10_000) -> DeadSettled:
        row = self._one("discard_dead", {"team": team, "name": name, "limit": limit})
        return DeadSettled(row["settled"], row["more"])

    def events(self, team: str, *, after: tuple[str, int] | None = None, limit: int = 100) -> list[JobEvent]:
        """The team's events after the position `after` ((xid, id) of the last
        one read; None: the oldest kept), oldest first."""
        xid, event_id = after or ("0", 0)
        return [JobEvent(**r) for r in self._all("team_events", {"team": team, "xid": xid, "after": event_id,
                                                                 "limit": limit})]

    def team_of(self, job_id: int, team: str | None = None) -> str | None:
        """The team a requeue or discard of the job acts as: `team` if given,
        else the job's own (None: no such job)."""
        if team is not None:
            return team
        row = self._one("job_team", {"job_id": job_id})
        return row["team"] if row else None

    # ------------------------------------------------------------ webhooks
    def set_webhook(self, team: str, url: str, secret: str) -> Webhook:
        """Set the team's webhook; raises NotFound (no such team)."""
        if self._one("set_webhook", {"team": team, "url": url, "secret": secret}) is None:
            raise errors.NotFound(f"no such team {team!r}")
        return self.webhook(team)

    def webhook(self, team: str) -> Webhook | None:
        row = self._one("webhook", {"team": team})
        return Webhook(**row) if row else None

    def delete_webhook(self, team: str) -> bool:
        return self._one("delete_webhook", {"team": team}) is not None

    def webhook_deliveries(self, team: str, *, limit: int = 50) -> list[WebhookDelivery]:
        return [WebhookDelivery(**r) for r in self._all("webhook_deliveries", {"team": team, "limit": limit})]

    def webhooks_due(self, *, batch: int, limit: int, busy: Sequence[int] = ()) -> list[PendingDelivery]:
        """Webhooks with events to deliver and not backing off, each with its
        next batch of events; none of the teams (ids) in busy."""
        return [PendingDelivery(**r) for r in self._all("webhooks_due", {"batch": batch, "limit": limit,
                                                                         "busy": list(busy)})]

    def record_delivery(self, pending: PendingDelivery, *, status: int | None, error: str | None,
                        duration_ms: int, ok: bool, retry_s: float) -> bool:
        """Record an attempt; on success move the position past its events.
        False: the position had moved meanwhile (nothing moved)."""
        first, last = pending.events[0], pending.events[-1]
        return self._one("record_delivery", {
            "team_id": pending.team_id, "url": pending.url, "from_xid": pending.from_xid,
            "from_id": pending.from_id, "xid": last["xid"], "id": last["id"], "events": len(pending.events),
            "first": first["id"], "attempt": pending.failures + 1, "status": status, "error": error,
            "duration_ms": duration_ms, "ok": ok, "retry_s": retry_s})["current"]
