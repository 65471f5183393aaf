"""Where the SQL lives: the sql/ folder of the checkout, the single source of
truth for the schema, the procedures and the named statements."""
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


def read(name: str) -> str:
    return (SQL_DIR / name).read_text()


def apply(name: str) -> None:
    """Run a sql/ file from an Alembic revision, through the psycopg
    connection itself: SQLAlchemy's text() would read `:name` inside
    PL/pgSQL bodies as bind parameters; with no parameters psycopg sends
    the whole file as one multi-statement query."""
    from alembic import op
    op.get_bind().connection.driver_connection.execute(read(name))
