"""The store: one class owns every database operation. Each method binds
parameters to a named statement of sql/queries/; the logic is in the
procedures. Store is made of one part per concern, each a module beside
this one with the records only it returns or takes and its statements in
the file of sql/queries/ of the same name: submit, claim, outcomes, jobs,
series, teams, dead, maintenance, stats, spread, admin, dev; base.py holds
the connections they all use (records.py the records several share)."""
from __future__ import annotations

from minutehand.store.admin import AdminStore
from minutehand.store.base import StoreBase
from minutehand.store.claim import ClaimStore
from minutehand.store.dead import DeadJobStore
from minutehand.store.dev import DevStore
from minutehand.store.jobs import JobStore
from minutehand.store.maintenance import MaintenanceStore
from minutehand.store.outcomes import OutcomeStore
from minutehand.store.series import SeriesStore
from minutehand.store.spread import SpreadStore
from minutehand.store.stats import StatsStore
from minutehand.store.submit import SubmitStore
from minutehand.store.teams import TeamStore


class Store(SubmitStore, ClaimStore, OutcomeStore, JobStore, SeriesStore, TeamStore, DeadJobStore, MaintenanceStore,
            StatsStore, SpreadStore, AdminStore, DevStore, StoreBase):
    """Every database operation, one object (a pool of connections): the parts' methods together."""
