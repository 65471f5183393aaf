"""Alembic environment: revisions apply the plain SQL files in sql/.

The database URL comes from the Alembic config (set by minutehand.store.migrate from
MINUTEHAND_DATABASE_URL); there are no ORM models to autogenerate from.
"""
from alembic import context
from sqlalchemy import create_engine

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
