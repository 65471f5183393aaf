"""The admin UI's indexes: dead_jobs by (team, name, job), job_events by
(shard, job).

Frozen. Revision ID: 0014
Revises: 0013
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP INDEX job_events_job;
DROP INDEX dead_jobs_by_team;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
