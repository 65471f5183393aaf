"""jobs.traceparent: the W3C trace context a job was submitted under, so
that the handler that runs it continues the submitter's trace.

Frozen. Revision ID: 0023
Revises: 0022
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
ALTER TABLE jobs DROP COLUMN traceparent;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
