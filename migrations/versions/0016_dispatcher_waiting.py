"""dispatchers.waiting: the teams waiting on a dispatcher's shards with
quota headroom, renewed with its membership.

Frozen. Revision ID: 0016
Revises: 0015
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
ALTER TABLE dispatchers DROP COLUMN waiting;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
