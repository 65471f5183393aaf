"""Series: repeating jobs stored as a series row plus its first run.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

from app.store import sqlfiles

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FILES = ("007_series.sql",)


def _run(name: str) -> None:
    # Through the psycopg connection itself, as in 0001: PL/pgSQL bodies
    # hold `:name` text that SQLAlchemy's text() would take for binds.
    op.get_bind().connection.driver_connection.execute(sqlfiles.read(name))


def upgrade() -> None:
    for name in FILES:
        _run(name)


def downgrade() -> None:
    _run("undo/0002_series.sql")
