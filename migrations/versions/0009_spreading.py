"""Flexible jobs are spread where the planned load is lowest: planned jobs
per run minute (load_minutes), and default flex windows per team and job
name (flex_defaults).

Frozen. Revision ID: 0009
Revises: 0008
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE flex_defaults;
DROP TABLE load_minutes;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
