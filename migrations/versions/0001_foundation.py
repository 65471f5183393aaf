"""Foundation: job records, the timing wheel, submission, claim, outcomes, maintenance.

Revision ID: 0001
Revises:
"""
from alembic import op

from app.store import sqlfiles

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FILES = ("001_core.sql", "002_wheel.sql", "003_submit.sql", "004_claim.sql",
         "005_outcomes.sql", "006_maintenance.sql")


def _run(name: str) -> None:
    # Through the psycopg connection itself: SQLAlchemy's text() would read
    # `:name` inside PL/pgSQL bodies as bind parameters; with no parameters
    # psycopg sends the whole file as one multi-statement query.
    op.get_bind().connection.driver_connection.execute(sqlfiles.read(name))


def upgrade() -> None:
    for name in FILES:
        _run(name)


def downgrade() -> None:
    _run("undo/0001_foundation.sql")
