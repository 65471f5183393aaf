"""Series: repeating jobs stored as a series row plus its first run.

Frozen: the table delta of 0002 as it was made, in schema public (the
layout before revision 0005); functions are not part of revisions.

Revision ID: 0002
Revises: 0001
"""
from pathlib import Path

from minutehand.store import sqlfiles

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE series;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path="public")


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path="public")
