"""Hardening: the role that may pin the clock, time zone names from a table.

Frozen: the table delta of 0004 as it was made, in schema public (the
layout before revision 0005); functions are not part of revisions.

Revision ID: 0004
Revises: 0003
"""
from pathlib import Path

from minutehand.store import sqlfiles

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
-- The role minutehand_clock is shared by every database of the server and stays.
DROP TABLE timezone_names;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path="public")


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path="public")
