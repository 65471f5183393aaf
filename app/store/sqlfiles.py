"""Where the SQL lives: the sql/ folder of the checkout, the single source of
truth for the schema, the procedures and the named statements."""
import re
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"

# What can hide a ';' that does not end a statement: dollar-quoted bodies,
# quoted strings and identifiers, comments.
_TOKEN = re.compile(r"\$([A-Za-z_]*)\$.*?\$\1\$|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/|;", re.S)
_FUNCTION = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(", re.I)


def read(name: str) -> str:
    return (SQL_DIR / name).read_text()


def statements(text: str) -> list[str]:
    """The statements of a SQL file, each without its ';'."""
    out, start = [], 0
    for m in _TOKEN.finditer(text):
        if m.group(0) == ";":
            out.append(text[start:m.start()])
            start = m.end()
    if text[start:].strip():
        out.append(text[start:])
    return out


def function_definitions(name: str, functions: list[str]) -> str:
    """The CREATE FUNCTION statements of the named functions in a sql/ file,
    as CREATE OR REPLACE: a downgrade puts back the bodies a later revision
    replaced from the file that defined them, instead of a copy of them."""
    found: dict[str, str] = {}
    for stmt in statements(read(name)):
        body = "\n".join(line for line in stmt.splitlines() if not line.lstrip().startswith("--"))
        if (m := _FUNCTION.match(body)) and m.group(1) in functions:
            found[m.group(1)] = _FUNCTION.sub(lambda f: f"CREATE OR REPLACE FUNCTION {f.group(1)}(", body, count=1)
    missing = [f for f in functions if f not in found]
    if missing:
        raise LookupError(f"sql/{name} defines no function {', '.join(missing)}")
    return ";\n".join(found[f] for f in functions) + ";\n"


def apply(name: str) -> None:
    """Run a sql/ file from an Alembic revision."""
    execute(read(name))


def execute(sql: str) -> None:
    """Run SQL from an Alembic revision, through the psycopg connection
    itself: SQLAlchemy's text() would read `:name` inside PL/pgSQL bodies as
    bind parameters; with no parameters psycopg sends the whole text as one
    multi-statement query."""
    from alembic import op
    op.get_bind().connection.driver_connection.execute(sql)
