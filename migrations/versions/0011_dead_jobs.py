"""Dead jobs: requeue and discard (the state `discarded`, the column
jobs.requeued_at), the dead letters by team and name (dead_jobs), the
events reported to teams (job_events) and their webhooks (webhooks,
webhook_deliveries).

Frozen. Revision ID: 0011
Revises: 0010
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
# PostgreSQL cannot drop an enum value: discarded jobs become dead again
# and the type is rebuilt without it (below head there are no functions of
# ours, so only the column and the type `outcome` use it).
DOWNGRADE = """
DROP TABLE webhook_deliveries;
DROP TABLE webhooks;
DROP TABLE job_events;
DROP TABLE dead_jobs;
ALTER TABLE jobs DROP COLUMN requeued_at;
UPDATE jobs SET state = 'dead' WHERE state = 'discarded';
ALTER TYPE job_state RENAME TO job_state_0010;
CREATE TYPE job_state AS ENUM
    ('scheduled', 'claimed', 'running', 'retrying', 'succeeded', 'dead', 'cancelled');
ALTER TABLE jobs ALTER COLUMN state TYPE job_state USING state::text::job_state;
ALTER TYPE outcome ALTER ATTRIBUTE state TYPE job_state;
DROP TYPE job_state_0010;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
