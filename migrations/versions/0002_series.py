"""Series: repeating jobs stored as a series row plus its first run.

Revision ID: 0002
Revises: 0001
"""
from minutehand.store import sqlfiles

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FILES = ("007_series.sql",)


def upgrade() -> None:
    for name in FILES:
        sqlfiles.apply(name)


def downgrade() -> None:
    sqlfiles.apply("undo/0002_series.sql")
