"""Foundation: job records, the timing wheel, submission, claim, outcomes, maintenance.

Revision ID: 0001
Revises:
"""
from minutehand.store import sqlfiles

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FILES = ("001_core.sql", "002_wheel.sql", "003_submit.sql", "004_claim.sql",
         "005_outcomes.sql", "006_maintenance.sql")


def upgrade() -> None:
    for name in FILES:
        sqlfiles.apply(name)


def downgrade() -> None:
    sqlfiles.apply("undo/0001_foundation.sql")
