"""MkDocs hook (mkdocs.yml): the reference pages that are read from the code,
so they cannot drift from it. A page asks with a marker on a line of its own:

    <!-- generated: settings -->   every setting of the server and the worker (names, types,
                                   defaults, ranges from the code; what each does from the
                                   comments of the example file, else of the code)
    <!-- generated: cli -->        `minutehand --help` and each subcommand's
    <!-- generated: openapi -->    every operation of the served OpenAPI document
    <!-- include: PATH -->         a file of the repository (its headings one level down
                                   on a page that has a title of its own)
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- (generated|include): (\S+) -->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    titled = re.search(r"^# ", markdown, re.M) is not None
    return MARKER.sub(lambda m: _expand(m.group(1), m.group(2), titled), markdown)


def _expand(kind: str, what: str, titled: bool) -> str:
    if kind == "include":
        text = (ROOT / what).read_text()
        return _demoted(text) if titled else text
    return {"settings": settings, "cli": cli, "openapi": openapi}[what]()


def _demoted(text: str) -> str:
    """A file's headings one level down, so it sits under the page's own title."""
    out, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        out.append("#" + line if not fenced and re.match(r"#{1,5} ", line) else line)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- settings
def _comments(path: Path, cls: str) -> dict[str, str]:
    """Each field's comment: the comment lines right above it (a comment
    above a group of fields is shown with the first of them)."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            same_line = lines[node.lineno - 1].partition("#")[2].strip()
            out[node.target.id] = " ".join([*above, *([same_line] if same_line else [])])
    return out


def _example_notes(section: str) -> dict[str, str]:
    """Each key's comment in ops/minutehand.example.toml (tests/test_config.py
    holds it to the settings: every one shown, nothing else)."""
    notes, table, above = {}, None, []
    for raw in (ROOT / "ops" / "minutehand.example.toml").read_text().splitlines():
        line = raw.strip()
        if m := re.fullmatch(r"\[(\w+)\]", line):
            table, above = m.group(1), []
        elif m := re.fullmatch(r"#?\s*(\w+)\s*=.*", line):
            if table == section and above:
                notes[m.group(1)] = " ".join(above)
            above = []
        elif line.startswith("#"):
            above.append(line.lstrip("#").strip())
        else:
            above = []
    return notes


def _range(field: dataclasses.Field, hints: dict) -> str:
    for meta in getattr(hints[field.name], "__metadata__", ()):
        if hasattr(meta, "low"):
            return f"{meta.low:g} to {meta.high:g}" + (f" ({meta.note})" if meta.note else "")
        if hasattr(meta, "values"):
            return ", ".join(meta.values)
    return ""


def _settings_table(cls: type, path: Path, env_prefix: str) -> str:
    hints = typing.get_type_hints(cls, include_extras=True)
    notes = {**_comments(path, cls.__name__), **_example_notes(cls.CONFIG_SECTION)}
    rows = ["| setting | environment, flag | type | default | range | what |", "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        kind = typing.get_args(hints[f.name])[0] if hasattr(hints[f.name], "__metadata__") else hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = default if isinstance(default, Path) else repr(default)
        rows.append(f"| `{f.name}` | `{env_prefix}{f.name.upper()}`, `--{f.name.replace('_', '-')}` | "
                    f"{getattr(kind, '__name__', str(kind))} | `{shown}` | {_range(f, hints)} | "
                    f"{notes.get(f.name, '').replace('|', '&#124;')} |")
    return "\n".join(rows)


def settings() -> str:
    from minutehand.settings import Settings
    from minutehand.worker.settings import WorkerSettings
    app = ROOT / "app" / "minutehand"
    return (f"## Server (`[{Settings.CONFIG_SECTION}]`: every command but `worker`)\n\n"
            + _settings_table(Settings, app / "settings.py", "MINUTEHAND_")
            + f"\n\n## Worker (`[{WorkerSettings.CONFIG_SECTION}]`: `minutehand worker`, `Worker()`)\n\n"
            + _settings_table(WorkerSettings, app / "worker" / "settings.py", "MINUTEHAND_"))


# ---------------------------------------------------------------- CLI
def cli() -> str:
    from minutehand.cli.main import build_parser
    os.environ["COLUMNS"] = "100"           # argparse wraps to the terminal: the same page everywhere
    out = []

    def walk(parser: argparse.ArgumentParser, name: str, depth: int) -> None:
        out.append(f"{'#' * depth} `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}", min(depth + 1, 4))

    walk(build_parser(), "minutehand", 2)
    return "\n".join(out)


# ---------------------------------------------------------------- HTTP API
def openapi() -> str:
    from minutehand.api.app import create_app
    from minutehand.settings import Settings
    # The schema is made from the routes alone: no database, no dispatcher runs.
    schema = create_app(Settings(), None, head="head", dispatcher=object()).openapi_schema.to_schema()
    by_tag: dict[str, list[str]] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            if method in ("get", "post", "put", "patch", "delete"):
                tag = (op.get("tags") or ["other"])[0]
                summary = (op.get("summary") or "").replace("|", "&#124;")
                by_tag.setdefault(tag, []).append(f"| `{method.upper()}` | `{path}` | {summary} |")
    parts = [f"OpenAPI document version {schema['info']['version']}."]
    for tag, rows in by_tag.items():
        parts.append(f"### {tag}\n\n| method | path | what |\n|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts)
