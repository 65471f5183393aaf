"""job_attempts: attempts that ended without success, one row each (a
job's record keeps only its latest).

Frozen. Revision ID: 0015
Revises: 0014
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE job_attempts;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
