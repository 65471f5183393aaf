"""The planned load (load_minutes) counted per team as well as per minute
and stripe.

Frozen. Revision ID: 0017
Revises: 0016
"""
from pathlib import Path

from minutehand.store import sqlfiles
from minutehand.store.schema import SCHEMA

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = Path(__file__).with_suffix(".sql").read_text()
# The teams' counts of a minute and stripe added up again into one row.
DOWNGRADE = """
ALTER TABLE load_minutes RENAME TO load_minutes_0017;
ALTER TABLE load_minutes_0017 RENAME CONSTRAINT load_minutes_pkey TO load_minutes_0017_pkey;
CREATE TABLE load_minutes (
    minute  timestamptz NOT NULL,
    stripe  smallint    NOT NULL,
    jobs    int         NOT NULL,
    PRIMARY KEY (minute, stripe)
);
INSERT INTO load_minutes (minute, stripe, jobs)
SELECT n.minute, n.stripe, sum(n.jobs)::int FROM load_minutes_0017 n GROUP BY n.minute, n.stripe;
DROP TABLE load_minutes_0017;
"""


def upgrade() -> None:
    sqlfiles.execute(UPGRADE, search_path=SCHEMA)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE, search_path=SCHEMA)
