"""series.held_due_at: a series' next run held back by its team's pending
ceiling.

Frozen. Revision ID: 0018
Revises: 0017
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
ALTER TABLE series DROP COLUMN held_due_at;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
