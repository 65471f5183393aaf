"""The named statements of sql/queries.sql, looked up by name."""
import re
from functools import cache

from minutehand.store import sqlfiles

_HEADER = re.compile(r"^-- name: (\w+)\n(?:--[^\n]*\n)*", re.M)


@cache
def all_queries() -> dict[str, str]:
    text = sqlfiles.read("queries.sql")
    parts = _HEADER.split(text)[1:]          # [name, body, name, body, ...]
    names = parts[::2]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        # a later statement of the same name would silently replace the first
        raise ValueError(f"sql/queries.sql names more than one statement {', '.join(twice)}")
    return {name: body.strip() for name, body in zip(names, parts[1::2])}


def q(name: str) -> str:
    return all_queries()[name]
