"""The named statements of sql/queries.sql, looked up by name."""
import re
from functools import cache

from minutehand.store import sqlfiles

_HEADER = re.compile(r"^-- name: (\w+)\n(?:--[^\n]*\n)*", re.M)


@cache
def all_queries() -> dict[str, str]:
    text = sqlfiles.read("queries.sql")
    parts = _HEADER.split(text)[1:]          # [name, body, name, body, ...]
    return {name: body.strip() for name, body in zip(parts[::2], parts[1::2])}


def q(name: str) -> str:
    return all_queries()[name]
