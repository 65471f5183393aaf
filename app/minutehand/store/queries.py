"""The named statements of sql/queries/*.sql, looked up by name.

The Python store sends them; each file holds those of one part of the
store (sql/queries/claim.sql: app/minutehand/store/claim.py's). Each calls
a procedure of sql/functions/: the logic lives there, these only bind
parameters. `-- name: X` starts one; the next line says what it does."""
import re
from functools import cache

from minutehand.store import sqlfiles

_HEADER = re.compile(r"^-- name: (\w+)\n(?:--[^\n]*\n)*", re.M)


@cache
def all_queries() -> dict[str, str]:
    return read_queries(sqlfiles.query_files())


def read_queries(files: list[str]) -> dict[str, str]:
    """{name: statement} of these files of sql/. A name given twice, in one
    file or in two, is an error naming where: a later statement of the same
    name would silently replace the first."""
    found: dict[str, tuple[str, str]] = {}            # name: (file, statement)
    for file in files:
        parts = _HEADER.split(sqlfiles.read(file))[1:]          # [name, body, name, body, ...]
        for name, body in zip(parts[::2], parts[1::2]):
            if name in found:
                where = found[name][0]
                raise ValueError(f"the statement {name} is named twice in sql/{file}" if where == file else
                                 f"the statement {name} is named in sql/{where} and in sql/{file}")
            found[name] = (file, body.strip())
    return {name: statement for name, (_, statement) in found.items()}


def q(name: str) -> str:
    return all_queries()[name]
