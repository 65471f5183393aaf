"""Hardening: due times from 2000 on, whole-length arrays in batches, cancel
for a named team, the clock pinned only by minutehand_clock, rows locked in
one global order, time zones from a table, a claim that answers a stale
lease with a row, names each job's team and can be limited to teams.

Revision ID: 0004
Revises: 0003
"""
from minutehand.store import sqlfiles

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The bodies revision 0004 replaced, by the file that defined them last.
REPLACED = {
    "001_core.sql": ["mh_now"],
    "003_submit.sql": ["mh_job_problem", "submit_jobs"],
    "005_outcomes.sql": ["start_many", "heartbeat_many", "complete_many", "fail_many", "cancel"],
    "006_maintenance.sql": ["expire_claims"],
    "007_series.sql": ["mh_repeat_problem", "submit_series"],
    "008_dispatch.sql": ["release_many", "claim_due", "claim_for_worker"],
}


def upgrade() -> None:
    sqlfiles.apply("009_hardening.sql")


def downgrade() -> None:
    sqlfiles.apply("undo/0004_hardening.sql")
    for name, functions in REPLACED.items():
        sqlfiles.execute(sqlfiles.function_definitions(name, functions))
