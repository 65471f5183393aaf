"""Where the SQL lives: the sql/ folder of the checkout, the single source of
truth for the schema, the procedures and the named statements."""
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


def read(name: str) -> str:
    return (SQL_DIR / name).read_text()
