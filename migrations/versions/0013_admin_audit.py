"""The admin UI: admin_sessions (signed-in browsers) and admin_audit (every
action taken through it).

Frozen. Revision ID: 0013
Revises: 0012
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE admin_audit;
DROP TABLE admin_sessions;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
