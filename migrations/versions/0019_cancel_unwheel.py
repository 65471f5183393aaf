"""A cancel takes its job's row off the wheel: the wheel's indexes find a
row by run time and job id; rows of jobs that no longer wait are removed.

Frozen. Revision ID: 0019
Revises: 0018
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP INDEX due_far_run_at;
CREATE INDEX due_far_run_at ON due_far (run_at);
DROP INDEX due_hours_job;
DROP INDEX due_minutes_claim;
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, team_id, run_at);
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
