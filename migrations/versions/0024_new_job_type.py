"""new_job: a validated job without a key, as submit_jobs works it out
before writing (one INSERT from an array, not an INSERT fed by a query:
on Citus that query's result went to every worker node first, and the
submit committed in two phases on all of them).

Frozen. Revision ID: 0024
Revises: 0023
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TYPE new_job;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
