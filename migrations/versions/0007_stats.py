"""Truthful lateness and exact statistics: jobs remember the run time agreed
at submission (agreed_at), and counters per team and job name are kept per
minute (team_stats) in the transactions of the events they count.

Frozen. Revision ID: 0007
Revises: 0006
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TYPE stats_delta;
DROP TABLE team_stats;
ALTER TABLE jobs DROP COLUMN agreed_at;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
