"""Schema migrations: Alembic revisions in migrations/ that apply sql/ files."""
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from minutehand.settings import sqlalchemy_url

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def _config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database to `revision`; at that revision already, a no-op."""
    command.upgrade(_config(database_url), revision)


def downgrade(database_url: str, revision: str = "-1") -> None:
    command.downgrade(_config(database_url), revision)


def head() -> str:
    return ScriptDirectory.from_config(_config("postgresql://")).get_current_head()


def current(database_url: str) -> str | None:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
