"""Schema migrations: Alembic revisions in migrations/ (installed as the
package minutehand.migrations) carry the table
changes; every migrate that ends at head applies the functions of
sql/functions/ (migrations/env.py says how)."""
import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from minutehand import packaged
from minutehand.settings import sqlalchemy_url
from minutehand.store import schema

MIGRATIONS_DIR = packaged.folder("minutehand.migrations")


def _config(database_url: str, **attributes) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))   # configparser syntax
    if database_url != "postgresql://":
        cfg.attributes["options"] = schema.options(database_url)
    cfg.attributes.update(attributes)
    return cfg


def upgrade(database_url: str, revision: str = "head", *, through_revisions: bool = False) -> None:
    """Bring the database to `revision` (at head: the current functions
    applied again). An empty database upgraded to head gets the current
    tables and is stamped head; through_revisions runs every revision
    instead."""
    command.upgrade(_config(database_url, mode="upgrade", fresh=not through_revisions), revision)


def downgrade(database_url: str, revision: str = "-1") -> None:
    """Undo revisions down to `revision`; below head the database has no functions of ours."""
    command.downgrade(_config(database_url, mode="downgrade"), revision)


def head() -> str:
    return ScriptDirectory.from_config(_config("postgresql://")).get_current_head()


def current(database_url: str) -> str | None:
    """The revision the database is at (None: not migrated). The version
    table is in schema minutehand, or in public below revision 0005."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        table = conn.execute(f"SELECT coalesce(to_regclass('{schema.SCHEMA}.alembic_version'),"
                             " to_regclass('public.alembic_version'))::text").fetchone()[0]
        if table is None:
            return None
        row = conn.execute(f"SELECT version_num FROM {table}").fetchone()
        return row[0] if row else None
