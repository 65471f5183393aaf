"""Repeating series keep running: the chain's state (chain_after), pause and
the misfire policy on series, and a deadline on jobs (a run that misfired
under the skip policy is dropped by the claim).

Frozen. Revision ID: 0008
Revises: 0007
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
DOWNGRADE = """
DROP INDEX series_team;
DROP INDEX series_chain;
ALTER TABLE series DROP COLUMN chain_after;
ALTER TABLE series DROP COLUMN paused_at;
ALTER TABLE series DROP COLUMN misfire;
ALTER TABLE jobs DROP COLUMN deadline;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
