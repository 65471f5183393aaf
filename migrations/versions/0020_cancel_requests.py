"""jobs.cancel_requested_at: a cancel that reached a claimed job waits for
its worker's answer (given back, or its claim expired, without a start:
cancelled; started: it runs on).

Frozen. Revision ID: 0020
Revises: 0019
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
ALTER TABLE jobs DROP COLUMN cancel_requested_at;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
