"""Dispatch: worker tokens, dispatcher membership, duty leases.

Frozen: the table delta of 0003 as it was made, in schema public (the
layout before revision 0005); functions are not part of revisions.

Revision ID: 0003
Revises: 0002
"""
from pathlib import Path

from minutehand.store import sqlfiles

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE duty_leases, dispatchers, worker_tokens;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path="public")


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path="public")
