"""Dispatch: worker tokens, dispatcher membership, duty leases, due-now
wake-ups (NOTIFY), the claim by job names with idempotent replay, and
give-back of unstarted jobs.

Revision ID: 0003
Revises: 0002
"""
from alembic import op

from app.store import sqlfiles

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _run(name: str) -> None:
    # Through the psycopg connection, as in 0001 (PL/pgSQL bodies hold `:name`).
    op.get_bind().connection.driver_connection.execute(sqlfiles.read(name))


def upgrade() -> None:
    _run("008_dispatch.sql")


def downgrade() -> None:
    _run("undo/0003_dispatch.sql")
