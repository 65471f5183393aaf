"""The dispatcher's maintenance, on an APScheduler schedule.

Per shard, by the shard's owner only (the shards this dispatcher leases):
- continue_series four times a second: each repeating series whose newest
  run was claimed gets its next run, admitted against its team's limits
  (sql/functions/chain.sql). Marks come from claims (and from a cancel of a
  series' run, and the chain's own retries of held runs): while the
  dispatcher claimed nothing and its shards stayed the same, a pass every
  CHAIN_IDLE_S is enough (on Citus a pass is a statement on every node);
- expire_claims every second: claims past their expiry go back to the due pool
  (one statement finds the shards that have any; each of those is then its
  own transaction); on Citus, not on a shard whose worker node was away
  within the last claim period (its workers could not renew their claims);
- purge_idempotency_keys every minute;
- purge_events every minute: events (dead jobs reported to their team) and
  webhook delivery attempts past their retention (7 days).
- retain_jobs every retention_every_s (30 s): finished jobs past their team's
  retention are removed, walking the shard's jobs in id order from a
  low-water mark (sql/functions/retention.sql; docs/operations/retention.md).
For the whole wheel, by one dispatcher at a time (the holder of the
`wheel` duty lease, a row with an expiry: sql/functions/dispatch.sql):
- cascade_wheel and sweep_passed every 30 s: far-future jobs move down as
  the horizon reaches them, passed buckets are carried forward and emptied.
By the holder of the `stats` duty lease:
- roll_up_stats and purge_stats every 5 minutes: per-minute counters older
  than the previous hour are folded into hour rows (reads of long windows
  stay small), counters past their retention (35 days) are dropped.
By the holder of the `load` duty lease:
- purge_load every minute: the planned load (jobs per run minute, which
  placement of flexible jobs reads) of minutes more than an hour back is
  dropped, in bounded batches.
By the holder of the `webhooks` duty lease (given a deliverer):
- deliver_webhooks every second: each team's new events POSTed to its
  webhook (app/minutehand/maintenance/webhooks.py).
Each job runs at most once at a time and a late run is not repeated
(coalesce), so a slow database does not pile runs up.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler

from minutehand.maintenance.webhooks import WebhookDeliverer
from minutehand.store.store import Store

log = logging.getLogger(__name__)
CHAIN_BATCH = 1000
CHAIN_IDLE_S = 2.0
# APScheduler logs every run of every job at INFO: once a second here.
logging.getLogger("apscheduler").setLevel(logging.WARNING)


class MaintenanceSchedule:
    """A Service (minutehand.lifecycle): the duties run from start() to stop()."""

    def __init__(self, store: Store, owner: str, shards: Callable[[], list[int]], *,
                 claimed: Callable[[], int] | None = None,
                 expire_every_s: float = 1.0, purge_every_s: float = 60.0, wheel_every_s: float = 30.0,
                 stats_every_s: float = 300.0, chain_every_s: float = 0.25, load_every_s: float = 60.0,
                 webhooks: WebhookDeliverer | None = None, webhook_every_s: float = 1.0,
                 retention_s: int = 7 * 86400, retention_every_s: float = 30.0, retention_batch: int = 2000,
                 default_ceiling: int = 0, claim_lease_s: float = 30.0):
        self.store = store
        self.claim_lease_s = claim_lease_s
        self._unreached: dict[int, float] = {}      # shard -> when claim expiry last could not reach it
        self.default_ceiling = default_ceiling      # the pending ceiling of a team without its own (series runs)
        self.webhooks = webhooks
        self.webhook_every_s = webhook_every_s
        self.retention_s = retention_s
        self.retention_every_s = retention_every_s
        self.retention_batch = retention_batch
        self.owner = owner
        self.shards = shards
        self.claimed = claimed            # how many jobs the dispatcher has claimed (None: unknown)
        self._chained: tuple[int | None, list[int]] | None = None     # (claimed, shards) at the last pass
        self._chained_at = -float("inf")
        self._held: dict[str, float] = {}   # duty -> when its lease lapses at the earliest (monotonic)
        self.wheel_every_s = wheel_every_s
        self.stats_every_s = stats_every_s
        self.load_every_s = load_every_s
        self.scheduler = BackgroundScheduler(
            daemon=True, timezone="UTC",
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        for duty, every in ((self.continue_series, chain_every_s),
                            (self.expire_claims, expire_every_s), (self.purge_keys, purge_every_s),
                            (self.turn_wheel, wheel_every_s), (self.fold_stats, stats_every_s),
                            (self.purge_load, load_every_s), (self.purge_events, purge_every_s),
                            (self.retain_jobs, retention_every_s),
                            *([(self.deliver_webhooks, webhook_every_s)] if webhooks is not None else [])):
            self.scheduler.add_job(_logged(duty), "interval", seconds=every, id=duty.__name__,
                                   next_run_time=None if duty in (self.purge_keys, self.fold_stats, self.purge_load,
                                                                  self.purge_events)
                                   else _now())

    def _hold(self, duty: str, ttl_s: float) -> bool:
        """Take or renew the duty's lease (sql/functions/dispatch.sql). One
        with more than half its time left is held on without a write: the
        webhooks' duty runs every second, and needs no write as often."""
        now = time.monotonic()
        if self._held.get(duty, -float("inf")) - ttl_s / 2 > now:
            return True
        if self.store.take_duty(duty, self.owner, ttl_s):
            self._held[duty] = now + ttl_s          # (counted from before the call: never later than the lease)
            return True
        self._held.pop(duty, None)
        return False

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.shutdown(wait=True)

    def continue_series(self) -> None:
        seen = (self.claimed() if self.claimed else None, self.shards())
        if seen[0] is not None and seen == self._chained and time.monotonic() - self._chained_at < CHAIN_IDLE_S:
            return
        self._chained, self._chained_at = seen, time.monotonic()
        # At a spike of series, passes of CHAIN_BATCH follow each other at once.
        while (shards := self.shards()) and self.store.continue_series(
                shards, CHAIN_BATCH, default_ceiling=self.default_ceiling) == CHAIN_BATCH:
            pass

    def expire_claims(self) -> None:
        # A shard that could not be reached (on Citus: its worker node away)
        # could not take its workers' heartbeats either: its claims are not
        # expired until it has answered for a whole claim period again.
        now = time.monotonic()
        self._unreached = {s: t for s, t in self._unreached.items() if now - t < self.claim_lease_s}
        if shards := [s for s in self.shards() if s not in self._unreached]:
            away: set[int] = set()
            returned, dead = self.store.expire_claims(shards, away)
            self._unreached.update(dict.fromkeys(away, now))
            if returned or dead:
                log.info("expired claims: %d jobs due again, %d dead after their last attempt", returned, dead)

    def purge_keys(self) -> None:
        if shards := self.shards():
            self.store.purge_keys(shards)

    def retain_jobs(self) -> None:
        # Per shard of this dispatcher's, one statement each, in one round
        # trip. A backlog (a first run over old data, an outage) is worked off
        # in passes that follow each other until the next run is due.
        removed = deferred = 0
        until = time.monotonic() + 0.8 * self.retention_every_s
        while shards := self.shards():
            passed = self.store.retain(shards, self.retention_s, self.retention_batch)
            removed += passed.removed
            deferred += passed.deferred
            if not passed.backlog or time.monotonic() >= until:
                break
        if removed or deferred:
            log.info("retention: %d finished jobs removed, %d filed to be looked at again", removed, deferred)

    def turn_wheel(self) -> None:
        # The lease outlives two periods, so a live holder keeps it between runs.
        if not self._hold("wheel", 3 * self.wheel_every_s):
            return
        from_far, from_hours = self.store.cascade()
        buckets, carried = self.store.sweep()
        if from_far or from_hours or carried:
            log.info("wheel: %d far + %d hour rows moved down, %d buckets swept, %d rows carried forward",
                     from_far, from_hours, buckets, carried)


    def fold_stats(self) -> None:
        if not self._hold("stats", 3 * self.stats_every_s):
            return
        rolled = self.store.roll_up_stats()
        purged = self.store.purge_stats()
        if rolled or purged:
            log.info("stats: %d minute rows folded into hours, %d rows past retention dropped", rolled, purged)


    def purge_load(self) -> None:
        if not self._hold("load", 3 * self.load_every_s):
            return
        # Bounded per call: a backlog (after an outage) goes in several calls.
        purged = total = self.store.purge_load()
        while purged >= 10_000 and total < 100_000:
            purged = self.store.purge_load()
            total += purged
        if total:
            log.info("load: %d rows of planned load older than an hour dropped", total)

    def purge_events(self) -> None:
        if shards := self.shards():
            if purged := self.store.purge_events(shards):
                log.info("events: %d events and delivery attempts past their retention dropped", purged)

    def deliver_webhooks(self) -> None:
        # The lease outlives the POSTs in flight (each ends by its deadline);
        # should it lapse anyway, another holder may send a batch twice (a
        # receiver deduplicates by event_id), never skip one.
        ttl = max(3 * self.webhook_every_s, 2 * self.webhooks.timeout_s + 5)
        if not self._hold("webhooks", ttl):
            return
        # Backlogs (many events, or many teams) go in passes that follow each
        # other at once, for up to a period: a slow receiver's POST goes on
        # past it, and only its own team waits for it.
        until = time.monotonic() + self.webhook_every_s
        for _ in range(10):
            if not self.webhooks.deliver(wait_s=max(0.0, until - time.monotonic())):
                break


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _logged(duty: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            duty()
        except Exception as exc:                  # next run tries again
            log.warning("maintenance %s failed: %s", duty.__name__, exc)
    run.__name__ = duty.__name__
    return run
