"""Dispatch: worker tokens, dispatcher membership, duty leases, due-now
wake-ups (NOTIFY), the claim by job names with idempotent replay, and
give-back of unstarted jobs.

Revision ID: 0003
Revises: 0002
"""
from minutehand.store import sqlfiles

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    sqlfiles.apply("008_dispatch.sql")


def downgrade() -> None:
    sqlfiles.apply("undo/0003_dispatch.sql")
