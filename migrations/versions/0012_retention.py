"""Retention of finished jobs: teams.retention_s (a team's own retention),
retention_marks (how far each shard's walk has come) and retention_checks
(jobs the walk passed that are looked at again later).

Frozen. Revision ID: 0012
Revises: 0011
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE retention_checks;
DROP TABLE retention_marks;
ALTER TABLE teams DROP COLUMN retention_s;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
