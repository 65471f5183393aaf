"""Fair dispatch: the wheel's rows name their team (rotation between teams
and quotas are decided before a row is claimed), and the running jobs per
shard and team are counted.

Frozen. Revision ID: 0006
Revises: 0005
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE team_running;
DROP INDEX due_minutes_claim;
CREATE INDEX due_minutes_claim ON due_minutes (shard, strict DESC, priority DESC, run_at);
ALTER TYPE due_row DROP ATTRIBUTE team_id;
ALTER TABLE due_far DROP COLUMN team_id;
ALTER TABLE due_hours DROP COLUMN team_id;
ALTER TABLE due_minutes DROP COLUMN team_id;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
