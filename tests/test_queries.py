"""The named statements: every file of sql/queries/ is read, and a name given
twice, in one file or in two, is refused with where, never one statement
silently replacing another."""
from __future__ import annotations

import pytest

from minutehand.store import queries, sqlfiles


def test_every_file_of_sql_queries_is_read_and_each_names_statements():
    files = sqlfiles.query_files()
    assert files == sorted(f"queries/{p.name}" for p in (sqlfiles.SQL_DIR / "queries").glob("*.sql"))
    read = queries.read_queries(files)
    assert read == queries.all_queries()
    for file in files:
        assert queries.read_queries([file]), file


def test_a_statement_keeps_its_text_and_the_comments_under_its_name_are_left_out():
    assert queries.q("set_clock") == "SELECT set_config('minutehand.now', coalesce(%(now)s::text, ''), false)"


def write(tmp_path, name: str, text: str) -> str:
    (tmp_path / "queries").mkdir(exist_ok=True)
    (tmp_path / "queries" / name).write_text(text)
    return f"queries/{name}"


def test_a_name_in_two_files_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlfiles, "SQL_DIR", tmp_path)
    a = write(tmp_path, "a.sql", "-- name: one\n-- First.\nSELECT 1\n")
    b = write(tmp_path, "b.sql", "-- name: two\n-- Second.\nSELECT 2\n\n-- name: one\n-- Again.\nSELECT 3\n")
    with pytest.raises(ValueError, match=r"one is named in sql/queries/a\.sql and in sql/queries/b\.sql"):
        queries.read_queries([a, b])


def test_a_name_twice_in_one_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlfiles, "SQL_DIR", tmp_path)
    a = write(tmp_path, "a.sql", "-- name: one\nSELECT 1\n\n-- name: one\nSELECT 2\n")
    with pytest.raises(ValueError, match=r"one is named twice in sql/queries/a\.sql"):
        queries.read_queries([a])
