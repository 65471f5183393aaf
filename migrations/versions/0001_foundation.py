"""Foundation: job records, the timing wheel, idempotency keys, claim
reminders, shards (tables, types, indexes, in schema public).

Frozen: the table delta of 0001 as it was made, in schema public (the
layout before revision 0005); functions are not part of revisions.

Revision ID: 0001
Revises: 
"""
from pathlib import Path

from minutehand.store import sqlfiles

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP TABLE due_minutes, due_hours, due_far, wheel, shards, claim_checks, idempotency_keys, jobs, teams;
DROP TYPE submit_result, outcome, due_row, job_state;
DROP SEQUENCE job_id_seq;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path="public")


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path="public")
