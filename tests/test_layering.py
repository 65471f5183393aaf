"""Who may import whom, read from the source with ast (no module is imported):
the worker library and the client stand alone, the protocol is a leaf both sides share,
the API and the admin UI are siblings over minutehand.web and the rules
(which know no HTTP), the CLI uses neither app, dev-only code stays out of
the runtime, and packages import no cycle.
Plus: the worker imports and runs with the server's dependencies blocked,
and pyproject's package list is app/minutehand/'s folders plus the folders
it maps from the repository's top (sql/, migrations/)."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "app"                      # what a src/ folder is elsewhere
APP = SRC / "minutehand"
SERVER_ONLY = ("litestar", "sqlalchemy", "psycopg", "psycopg_pool", "alembic", "apscheduler", "uvicorn")
# Leaves of minutehand (they import none of it) that any layer may use.
LEAVES = {"minutehand.lifecycle", "minutehand.envconfig", "minutehand.packaged", "minutehand.version"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module the file imports, at any depth (lazy imports count),
    absolute names; `from pkg import name` counts pkg.name when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):         # names defined in base itself
                found.add(base)
    return found


MODULES = {module_name(p): p for p in APP.rglob("*.py")}
IMPORTS = {m: imports(p) for m, p in MODULES.items()}


def internal(names: set[str]) -> set[str]:
    return {n for n in names if n == "minutehand" or n.startswith("minutehand.")}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def of(package: str) -> dict[str, set[str]]:
    return {m: i for m, i in IMPORTS.items() if under(m, package)}


def offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    return {m: sorted(n for n in i if any(under(n, f) for f in forbidden))
            for m, i in of(package).items() if any(under(n, f) for n in i for f in forbidden)}


def test_the_modules_are_found():
    assert {"minutehand.worker.worker", "minutehand.protocol", "minutehand.dispatch.dispatcher",
            "minutehand.serve", "minutehand.api.app"} <= MODULES.keys()


def test_the_worker_library_imports_only_itself_the_protocol_leaves_and_its_libraries():
    stdlib = sys.stdlib_module_names
    allowed_third_party = {"httpx", "msgspec", "prometheus_client"}
    bad = {}
    for m, names in of("minutehand.worker").items():
        for n in names:
            top = n.partition(".")[0]
            ok = (under(n, "minutehand.worker") or under(n, "minutehand.protocol") or n in LEAVES
                  or top in stdlib or top in allowed_third_party or n == "__future__"
                  # job.once drives the caller's own psycopg connection (imported only when used)
                  or (m == "minutehand.worker.effects" and top == "psycopg")
                  # the handler's span, only with the `otel` extra installed
                  or (m == "minutehand.worker.traces" and top == "opentelemetry"))
            if not ok:
                bad.setdefault(m, []).append(n)
    assert not bad, bad


def test_the_client_imports_only_itself_the_protocol_leaves_and_its_libraries():
    # psycopg and SQLAlchemy connections are the caller's: used, never imported
    stdlib = sys.stdlib_module_names
    bad = {}
    for m, names in of("minutehand.client").items():
        for n in names:
            top = n.partition(".")[0]
            ok = (under(n, "minutehand.client") or under(n, "minutehand.protocol") or n in LEAVES
                  or top in stdlib or top in {"httpx", "msgspec"} or n == "__future__"
                  # traces: the caller's trace context, only with the `otel` extra installed
                  or (m == "minutehand.client.traces" and top == "opentelemetry"))
            if not ok:
                bad.setdefault(m, []).append(n)
    assert not bad, bad


def test_the_worker_and_the_client_import_neither_each_other_nor_the_server():
    assert not offenders("minutehand.worker", ("minutehand.client",))
    assert not offenders("minutehand.client", ("minutehand.worker",))


def test_the_protocol_and_the_leaves_import_no_minutehand_module():
    for m, names in IMPORTS.items():
        if under(m, "minutehand.protocol"):
            assert not {n for n in internal(names) if not under(n, "minutehand.protocol")}, m
        if m in LEAVES:
            assert not internal(names), m


def test_the_dispatcher_never_imports_the_api_the_cli_or_dev():
    assert not offenders("minutehand.dispatch", ("minutehand.api", "minutehand.cli", "minutehand.dev"))


def test_the_store_imports_no_layer_above_it():
    assert not offenders("minutehand.store", ("minutehand.api", "minutehand.dispatch", "minutehand.worker",
                                              "minutehand.cli", "minutehand.dev", "minutehand.serve",
                                              "minutehand.maintenance"))


def test_each_part_of_the_store_imports_no_other_part():
    # A part is a concern of Store built on store.base; what parts share lives in base and records.
    parts = {m for m, i in of("minutehand.store").items() if "minutehand.store.base" in i} - {"minutehand.store.store"}
    assert {"minutehand.store.submit", "minutehand.store.claim"} <= parts
    assert not {m: sorted(IMPORTS[m] & parts - {m}) for m in parts if IMPORTS[m] & parts - {m}}


def test_the_api_imports_no_cli_or_dev():
    assert not offenders("minutehand.api", ("minutehand.cli", "minutehand.dev", "minutehand.serve"))


def test_the_admin_ui_and_the_cli_import_no_api():
    # What the admin UI shares with the API is in minutehand.web, the rules all three apply in minutehand.rules.
    assert not offenders("minutehand.admin", ("minutehand.api",))
    assert not offenders("minutehand.cli", ("minutehand.api",))


def test_the_api_imports_no_admin_ui():
    # The composition root (serve) hands create_app the admin UI.
    assert not offenders("minutehand.api", ("minutehand.admin",))


def test_what_both_http_apps_share_imports_neither():
    assert not offenders("minutehand.web", ("minutehand.api", "minutehand.admin", "minutehand.cli", "minutehand.dev",
                                            "minutehand.serve"))


def test_the_rules_import_no_http_framework_and_no_layer_above_the_store():
    assert "minutehand.rules" in MODULES
    above = ("minutehand.api", "minutehand.admin", "minutehand.web", "minutehand.cli", "minutehand.dev",
             "minutehand.serve", "minutehand.dispatch", "minutehand.maintenance", "minutehand.worker")
    http = ("litestar", "uvicorn", "httpx", "anyio")
    assert not offenders("minutehand.rules", above + http)


def test_no_runtime_module_imports_dev_code():
    # The CLI reaches `minutehand dev` through a lazy import in its dev subcommand alone.
    bad = {m: sorted(n for n in internal(i) if under(n, "minutehand.dev"))
           for m, i in IMPORTS.items() if not under(m, "minutehand.dev")}
    bad = {m: n for m, n in bad.items() if n}
    assert bad == {"minutehand.cli.main": ["minutehand.dev.command"]}, bad


def package_of(name: str) -> str:
    """minutehand.api.jobs -> minutehand.api; a top-level module is its own unit."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for m, names in IMPORTS.items():
        src = package_of(m)
        for n in internal(names):
            dst = package_of(n)
            if dst != src and dst != "minutehand":
                graph.setdefault(src, set()).add(dst)
    # Depth-first search for a back edge.
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


BLOCKED_WORKER = textwrap.dedent(f"""
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {SERVER_ONLY!r}:
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, Blocked())
    import asyncio
    from minutehand.protocol import JobId, LeasedJob
    from minutehand.worker import Job, NonRetryable, Worker
    from minutehand.worker.outbox import Outbox
    from minutehand.worker.runner import JobRunner
    from minutehand.worker.slots import Slots
    from minutehand.worker.grace import Grace

    worker = Worker(urls="http://127.0.0.1:9", token="t", concurrency=1)

    @worker.job("double")
    def double(job: Job):
        return {{"twice": job.payload["n"] * 2}}

    class Recording(Outbox):
        def __init__(self):
            super().__init__(None, [], worker_id="w", flush_s=0)
            self.sent = []

        def send(self, kind, item, extend_s=None):
            self.sent.append((kind, item))
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut

    async def main():
        slots = Slots(1)
        runner = JobRunner(worker.handlers, "w", slots, Grace(asyncio.Event()), 1)
        outbox = Recording()
        job = LeasedJob(job_id=JobId(1), team="t", name="double", payload=b'{{"n": 21}}', attempt=1,
                        max_attempts=3, idempotency_key=None, lease_token=__import__("uuid").UUID(int=1),
                        claim_expires_at="2030-01-01T00:00:00Z", claim_s=30.0, due_at="2030-01-01T00:00:00Z",
                        run_at="2030-01-01T00:00:00Z")
        await slots.take(1)
        runner.start_job(job, outbox, __import__("time").monotonic())
        await runner.stop()
        return outbox.sent

    sent = asyncio.run(main())
    assert [kind for kind, _ in sent] == ["start", "complete"], sent
    assert bytes(sent[1][1].result) == b'{{"twice":42}}', sent
    assert not [m for m in sys.modules if m.partition(".")[0] in {SERVER_ONLY!r}]
    print("ok")
""")


def test_the_worker_imports_and_runs_a_handler_without_the_server_dependencies():
    out = subprocess.run([sys.executable, "-c", BLOCKED_WORKER], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


BLOCKED_CLIENT = textwrap.dedent(f"""
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {SERVER_ONLY!r} + ("opentelemetry",):
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, Blocked())
    import dataclasses
    import minutehand.client
    from minutehand.client import Client, job, task, traces
    from minutehand.cli import main

    @dataclasses.dataclass
    class Invoice:
        number: int

    send_invoice = task("send_invoice", Invoice)
    assert send_invoice.decode({{"number": 42}}) == Invoice(42)
    assert bytes(job("send_invoice", Invoice(42)).payload) == b'{{"number":42}}'
    assert traces.headers() == {{}}
    Client("http://127.0.0.1:9", token="t").close()
    main.build_parser().parse_args(["submit", "x", "--payload", "{{}}"])
    assert main.settings_class("submit").__name__ == "ClientSettings"
    assert not [m for m in sys.modules if m.partition(".")[0] in {SERVER_ONLY!r}]
    print("ok")
""")


def test_the_client_and_its_commands_import_without_the_server_dependencies_or_opentelemetry():
    out = subprocess.run([sys.executable, "-c", BLOCKED_CLIENT], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_pyproject_lists_every_package_folder():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    mapped = {name: folder for name, folder in project["tool"]["setuptools"]["package-dir"].items() if name}
    folders = {module_name(p.parent / "__init__.py") for p in APP.rglob("__init__.py")}
    assert mapped == {"minutehand.sql": "sql", "minutehand.migrations": "migrations"}
    assert all((ROOT / folder / "__init__.py").is_file() for folder in mapped.values())
    assert listed == folders | mapped.keys()
