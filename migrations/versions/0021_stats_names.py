"""team_stats_names: the job names a team's counters keep apart (its first
50; team_stats counts its later names together as '(other)'). Each team
keeps the 50 of most volume it has counters of, and the rows of its other
names are added up into '(other)' rows.

Frozen. Revision ID: 0021
Revises: 0020
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
# The '(other)' rows stay: they are counts, under a name no job has.
DOWNGRADE = """
DROP TABLE team_stats_names;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
