"""Admission control: per-team submission rate limits (token buckets) and
pending ceilings, and the count of unfinished jobs per team they need.

Frozen. Revision ID: 0010
Revises: 0009
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE team_pending;
DROP TABLE team_buckets;
ALTER TABLE teams DROP CONSTRAINT teams_submit_limit_check, DROP COLUMN max_pending, DROP COLUMN submit_burst,
    DROP COLUMN submit_rate;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
