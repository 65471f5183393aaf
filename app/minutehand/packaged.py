"""What the package carries besides code: the SQL (minutehand.sql), the
Alembic environment and revisions (minutehand.migrations), the admin UI's
templates and static files, the API explorer's files. Found through
importlib.resources, never by a path into a checkout, so an installed wheel
and an editable install (pyproject.toml maps sql/ and migrations/ to their
packages) read the same files."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def folder(package: str, *parts: str) -> Path:
    """A folder of a package, on the file system: Alembic, Jinja and the
    static files router take directories. A wheel is installed unzipped, so
    this holds wherever pip put it."""
    found = resources.files(package).joinpath(*parts)
    if not isinstance(found, Path):
        raise RuntimeError(f"{package} is not installed as files on disk ({found!r}): install the wheel unzipped")
    return found
