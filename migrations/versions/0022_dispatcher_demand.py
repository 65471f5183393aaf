"""dispatchers.due, running_teams, running: where each team's due work is
and how many of its jobs run from each dispatcher's shards, renewed with
the membership.

Frozen. Revision ID: 0022
Revises: 0021
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
ALTER TABLE dispatchers DROP COLUMN due, DROP COLUMN running_teams, DROP COLUMN running;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
