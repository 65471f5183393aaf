"""Alembic environment. Revisions carry frozen table deltas; the functions
are not in revisions: every run that ends at head applies sql/functions/
(then sql/refresh.sql and sql/grants.sql), and every run that ends below
head leaves no function of ours. A fresh database (no revision, no table
of ours) upgraded to head gets the current sql/tables/ files and is stamped
head, unless the caller asks for the revisions (tests compare the two).
All of it is one transaction, under an advisory lock.

The version table lives in schema minutehand from revision 0005 on, in
public below it (where the releases before 0005 look for it).
"""
from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from minutehand.store import citus, sqlfiles
from minutehand.store.schema import SCHEMA, SEARCH_PATH

FIRST_IN_SCHEMA = "0005"      # the revision that moved everything into SCHEMA

config = context.config
mode = config.attributes.get("mode", "upgrade")                 # "upgrade" or "downgrade"
fresh_allowed = config.attributes.get("fresh", True)
engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=NullPool,
                       connect_args={"options": config.attributes.get("options", SEARCH_PATH)})


def _version_table(pg, below_schema: bool) -> None:
    """Where the version table belongs at the revision the run ended at."""
    pg.execute(f"""
        DO $$
        BEGIN
            IF {'true' if below_schema else 'false'} AND to_regclass('{SCHEMA}.alembic_version') IS NOT NULL THEN
                ALTER TABLE {SCHEMA}.alembic_version SET SCHEMA public;
            ELSIF NOT {'true' if below_schema else 'false'} AND to_regclass('public.alembic_version') IS NOT NULL
                  AND to_regclass('{SCHEMA}.alembic_version') IS NULL THEN
                CREATE SCHEMA IF NOT EXISTS {SCHEMA};
                ALTER TABLE public.alembic_version SET SCHEMA {SCHEMA};
            END IF;
        END $$""")


def _drop_empty_schema(pg) -> None:
    """At base: the version table goes, and the schema if nothing else is in it."""
    pg.execute(f"""
        DO $$
        BEGIN
            DROP TABLE IF EXISTS {SCHEMA}.alembic_version;
            IF to_regnamespace('{SCHEMA}') IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = to_regnamespace('{SCHEMA}'))
               AND NOT EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = to_regnamespace('{SCHEMA}'))
               AND NOT EXISTS (SELECT 1 FROM pg_type WHERE typnamespace = to_regnamespace('{SCHEMA}')) THEN
                DROP SCHEMA {SCHEMA};
            END IF;
        END $$""")


with engine.connect() as connection:
    context.configure(connection=connection, transactional_ddl=True, version_table_schema=SCHEMA)
    script = context.script
    head = script.get_current_head()
    below_schema = {r.revision for r in script.iterate_revisions(
        script.get_revision(FIRST_IN_SCHEMA).down_revision, "base")}
    with context.begin_transaction():
        pg = connection.connection.driver_connection
        sqlfiles.lock(pg)
        citus.before_migrate(pg)
        pg.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        _version_table(pg, below_schema=False)          # Alembic reads it in SCHEMA
        migration = context.get_context()
        start = migration.get_current_revision()
        if (mode == "upgrade" and fresh_allowed and start is None and context.get_revision_argument() in ("head", head)
                and not sqlfiles.has_tables(pg)):
            sqlfiles.create_tables(pg)
            migration.stamp(script, "head")
        else:
            if mode == "downgrade":
                sqlfiles.drop_functions(pg)
                # Functions of the layout before FIRST_IN_SCHEMA use our types: they go first.
                pg.execute(script.get_revision(FIRST_IN_SCHEMA).module.drop_old_functions())
            context.run_migrations()
        end = migration.get_current_revision()
        if end == head:
            sqlfiles.apply_functions(pg)
            sqlfiles.apply_after_functions(pg)
        else:
            sqlfiles.drop_functions(pg)
            if end is None:
                _drop_empty_schema(pg)
            elif end in below_schema:
                _version_table(pg, below_schema=True)
                _drop_empty_schema(pg)
engine.dispose()
