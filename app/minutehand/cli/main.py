"""`minutehand` command line: one subcommand per process role or operator task.

Settings come from a TOML file (--config FILE or MINUTEHAND_CONFIG; every
setting in ops/minutehand.example.toml), MINUTEHAND_* environment variables
and the matching flags, each overriding the one before (app/minutehand/settings.py; for
`worker`, app/minutehand/worker/settings.py), given after the subcommand:
`minutehand migrate --database-url URL`.

Each subcommand imports what it needs when it runs: `minutehand worker` and
the client's `submit`, `status`, `cancel`, `jobs` (settings: client_url,
client_token) need only the base install (`pip install minutehand-scheduler`);
the others need the server's (`pip install 'minutehand-scheduler[server]'`).
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys
from typing import NamedTuple

from minutehand.settings import SUBMIT_RATE_MAX, TEAM_LIMIT_MAX, TEAM_LIMIT_MIN, Settings
from minutehand.version import DISTRIBUTION, VERSION

# The server's dependencies (the `server` extra): a subcommand that fails to
# import one of them says how to install them rather than show a traceback.
SERVER_PACKAGES = {"sqlalchemy", "psycopg", "psycopg_pool", "alembic", "litestar", "uvicorn", "apscheduler",
                   "anyio", "httptools", "uvloop"}


def _store(settings: Settings):
    from minutehand.store.store import Store
    if not settings.database_url:
        raise SystemExit("no database: set MINUTEHAND_DATABASE_URL or pass --database-url")
    return Store(settings.database_url, max_size=settings.pool_size)


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store import migrate
    if not settings.database_url:
        raise SystemExit("no database: set MINUTEHAND_DATABASE_URL or pass --database-url")
    if args.downgrade:
        migrate.downgrade(settings.database_url, "-1")
    else:
        migrate.upgrade(settings.database_url)
    print(f"schema at revision {migrate.current(settings.database_url)}")
    if args.citus and not args.downgrade:
        from minutehand.store import citus
        print(citus.distribute(settings.database_url, settings.citus_shard_count))


def cmd_citus_add_node(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store import citus
    if not settings.database_url:
        raise SystemExit("no database: set MINUTEHAND_DATABASE_URL or pass --database-url")
    host, port = args.node
    print(citus.add_node(settings.database_url, host, port, rebalance=args.rebalance))


def _node(text: str) -> tuple[str, int]:
    """An argparse type: HOST:PORT."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def cmd_maintain(settings: Settings, args: argparse.Namespace) -> None:
    with _store(settings) as store:
        print(store.maintain())


def cmd_team_create(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store.errors import StoreError
    quota = settings.default_team_quota if args.quota is None else args.quota
    weight = settings.default_team_weight if args.weight is None else args.weight
    with _store(settings) as store:
        try:
            token = store.create_team(args.name, quota=quota, weight=weight,
                                      submit_rate=settings.default_team_submit_rate or None,
                                      submit_burst=settings.default_team_submit_burst or None)
        except StoreError as exc:
            raise SystemExit(f"team {args.name!r} not created: {exc.message}") from None
    print(f"team {args.name} created (quota {quota}, weight {weight}); its token (shown once, only its hash "
          f"is stored):\n{token}")


def cmd_team_set(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store.errors import StoreError
    from minutehand.store.teams import KEEP
    limits = {k: getattr(args, k) for k in ("submit_rate", "submit_burst", "max_pending")}
    if args.quota is None and args.weight is None and all(v is None for v in limits.values()):
        raise SystemExit("team set: give --quota, --weight, --submit-rate, --submit-burst or --max-pending-jobs")
    with _store(settings) as store:
        try:
            team = store.update_team(args.name, quota=args.quota, weight=args.weight,
                                     **{k: KEEP if v is None else v.value for k, v in limits.items()})
        except StoreError as exc:
            raise SystemExit(f"team {args.name!r} not changed: {exc.message}") from None
    rate = "none" if team.submit_rate is None else f"{team.submit_rate:g}/s, burst {team.submit_burst}"
    ceiling = "the server's" if team.max_pending is None else team.max_pending
    print(f"team {team.name}: quota {team.quota}, weight {team.weight}, submit rate {rate}, max pending "
          f"{ceiling} (the dispatcher applies a quota or weight within a few seconds, other API processes "
          "an admission limit within admission_cache_s)")


def cmd_team_list(settings: Settings, args: argparse.Namespace) -> None:
    with _store(settings) as store:
        page = store.list_teams(after=args.after, limit=args.limit)
    width = max([4, *(len(t.name) for t in page.teams)])
    print(f"{'name':<{width}}  {'quota':>10}  {'weight':>10}  created_at")
    for t in page.teams:
        print(f"{t.name:<{width}}  {t.quota:>10}  {t.weight:>10}  {t.created_at.isoformat()}")
    if page.next_cursor is not None:
        print(f"(more: minutehand team list --after {page.next_cursor})")


def _series_action(settings: Settings, args: argparse.Namespace, action: str) -> None:
    from minutehand.store.errors import StoreError
    with _store(settings) as store:
        try:
            got = getattr(store, f"{action}_series")(args.team, args.series_id)
        except StoreError as exc:
            raise SystemExit(f"series {args.series_id}: {exc.message}") from None
    note = f"; run {got.cancelled_run} cancelled" if got.cancelled_run is not None else ""
    print(f"series {got.series_id}: {got.state}{'' if got.changed else ' (unchanged)'}{note}")


def cmd_series_pause(settings: Settings, args: argparse.Namespace) -> None:
    _series_action(settings, args, "pause")


def cmd_series_resume(settings: Settings, args: argparse.Namespace) -> None:
    _series_action(settings, args, "resume")


def cmd_series_cancel(settings: Settings, args: argparse.Namespace) -> None:
    _series_action(settings, args, "cancel")


def _spec(every_s: int | None, cron: str | None, timezone: str | None) -> str:
    return f"every {every_s} s" if every_s is not None else f"cron {cron!r} in {timezone}"


def cmd_series_list(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store.errors import StoreError
    with _store(settings) as store:
        try:
            page = store.list_series(args.team, after=args.after, limit=args.limit)
        except StoreError as exc:
            raise SystemExit(f"series of {args.team!r}: {exc.message}") from None
    print(f"{'series_id':>20}  {'state':<9}  {'last_due_at':<25}  name  repeat")
    for s in page.series:
        print(f"{s.series_id:>20}  {s.state:<9}  {s.last_due_at.isoformat():<25}  {s.name}  "
              f"{_spec(s.every_s, s.cron, s.timezone)}")
    if page.next_cursor is not None:
        print(f"(more: minutehand series list --team {args.team} --after {page.next_cursor})")


def cmd_series_show(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.store.errors import StoreError
    with _store(settings) as store:
        try:
            s = store.series(args.team, args.series_id)
        except StoreError as exc:
            raise SystemExit(f"series {args.series_id}: {exc.message}") from None
    print(f"series {s.series_id} ({s.team}/{s.name}): {s.state}, {_spec(s.every_s, s.cron, s.timezone)}, "
          f"misfire {s.misfire}")
    print(f"first due {s.first_due_at.isoformat()}, newest run {s.last_job_id} due {s.last_due_at.isoformat()} "
          f"({s.last_job_state})")
    for r in s.runs:
        print(f"  {r.job_id:>20}  {r.due_at.isoformat()}  {r.state:<9}  attempts {r.attempts}"
              f"{'  ' + r.last_error if r.last_error else ''}")


class _Limit(NamedTuple):
    value: float | int | None          # None: cleared


def _or_none(parse):
    """An argparse type: `none` (clears the limit: a _Limit of None) or what `parse` reads."""
    def read(text: str) -> _Limit:
        return _Limit(None if text.lower() == "none" else parse(text))
    return read


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= SUBMIT_RATE_MAX:
        raise argparse.ArgumentTypeError(f"{value:g} is not above 0 and at most {SUBMIT_RATE_MAX:,}")
    return value


def cmd_dead_settle(settings: Settings, args: argparse.Namespace) -> None:
    """requeue or discard one dead job (args.job_id) or every dead job of a name (args.name)."""
    from minutehand.store.errors import StoreError
    requeue = args.action.startswith("requeue")
    with _store(settings) as store:
        try:
            if args.action in ("requeue", "discard"):
                got = (store.requeue(args.job_id, args.team, args.max_attempts) if requeue
                       else store.discard(args.job_id, args.team))
                if not got.ok:
                    raise SystemExit(f"job {args.job_id}: {got.reason}")
                print(f"job {args.job_id}: {got.state}")
                return
            total, more = 0, True
            while more:               # in bounded calls, each its own transaction
                done = (store.requeue_dead(args.team, args.name, max_attempts=args.max_attempts) if requeue
                        else store.discard_dead(args.team, args.name))
                total, more = total + done.count, done.more
        except StoreError as exc:
            raise SystemExit(exc.message) from None
    print(f"{total} dead jobs of {args.team}/{args.name} {'requeued' if requeue else 'discarded'}")


def cmd_dead_events(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.rules import EVENTS_START, NOT_AN_EVENTS_CURSOR, decode_events_cursor, encode_events_cursor
    position = decode_events_cursor(args.after) if args.after else EVENTS_START
    if position is None:
        raise SystemExit(f"--after: {NOT_AN_EVENTS_CURSOR}")
    with _store(settings) as store:
        events = store.events(args.team, after=position, limit=args.limit)
    for e in events:
        print(f"{e.at.isoformat()}  {e.kind}  job {e.job_id}  {e.name}  attempt {e.attempts}/{e.max_attempts}  "
              f"{e.error or ''}")
    last = (events[-1].xid, events[-1].id) if events else position
    print(f"(next: minutehand dead events --team {args.team} --after {encode_events_cursor(*last)})")


def cmd_team_webhook(settings: Settings, args: argparse.Namespace) -> None:
    import secrets
    from minutehand.rules import secret_problem, url_problem
    from minutehand.store.errors import StoreError
    with _store(settings) as store:
        if args.remove:
            print(f"team {args.name}: webhook {'removed' if store.delete_webhook(args.name) else 'none to remove'}")
            return
        if args.url is None:
            hook = store.webhook(args.name)
            print(f"team {args.name}: " + (f"webhook {hook.url}, {hook.failures} failed attempts of the current "
                                           f"batch" if hook else "no webhook"))
            return
        secret = args.secret or secrets.token_urlsafe(32)
        if reason := url_problem(args.url) or secret_problem(secret):
            raise SystemExit(reason)
        try:
            store.set_webhook(args.name, args.url, secret)
        except StoreError as exc:
            raise SystemExit(exc.message) from None
    print(f"team {args.name}: events are POSTed to {args.url}, signed with this secret (shown once):\n{secret}")


def _bounded(low: int, high: int):
    """An argparse type: a whole number within [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}")
        return value
    return parse


def cmd_worker_token(settings: Settings, args: argparse.Namespace) -> None:
    import psycopg.errors
    with _store(settings) as store:
        try:
            token = store.create_worker_token(args.name)
        except psycopg.errors.CheckViolation:
            raise SystemExit(f"worker token {args.name!r} not created: a name is 1 to 63 characters: "
                             "lowercase letters, digits, _ . -") from None
    print(f"worker token {args.name} created (or rotated); the token (shown once, only its hash is stored):\n{token}")


def collect_seldom() -> None:
    """For the long-running roles (serve, dispatcher, worker): they hold tens
    of thousands of live objects (jobs in flight, their tasks, timers and
    futures), and CPython's default collector (every 700 allocations) walks
    the young ones so often that it took a third to a half of a worker's CPU
    per job (ops/bench/README.md, "Sustained"). Collect every 50,000
    allocations, the older generations more seldom still, and keep what
    start-up made (modules, settings) out of the full collections."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.serve import serve
    if not settings.database_url:
        raise SystemExit("no database: set MINUTEHAND_DATABASE_URL or pass --database-url")
    collect_seldom()
    serve(settings)


def cmd_dispatcher(settings: Settings, args: argparse.Namespace) -> None:
    from minutehand.serve import serve
    if not settings.database_url:
        raise SystemExit("no database: set MINUTEHAND_DATABASE_URL or pass --database-url")
    collect_seldom()
    serve(settings, submit_api=False)


def cmd_worker(settings, args: argparse.Namespace) -> None:
    """Import module:attribute (a Worker with its handlers) and run it until SIGTERM/SIGINT."""
    import importlib
    import os
    from minutehand.worker import Worker, logs   # settings: a WorkerSettings (see WORKER_COMMANDS)
    logs.setup(settings.log_level)
    module, _, attr = args.target.partition(":")
    sys.path.insert(0, os.getcwd())
    worker = getattr(importlib.import_module(module), attr or "worker", None)
    if not isinstance(worker, Worker):
        raise SystemExit(f"{args.target}: not a minutehand Worker (expected module.path:attribute)")
    collect_seldom()
    worker.run(settings)


def _client_call(settings, call):
    """Run call(client) on a Client of the client settings; print its answer
    as JSON (a list: one line per item); a refusal exits with its problem."""
    import msgspec
    from minutehand.client import Client, MinutehandError
    from minutehand.protocol import enc_hook
    try:
        with Client(settings=settings) as client:
            answer = call(client)
            for item in (answer if isinstance(answer, list) else [answer]):
                print(msgspec.json.encode(item, enc_hook=enc_hook).decode())
    except MinutehandError as exc:
        raise SystemExit(f"minutehand: {exc}") from None


def cmd_submit(settings, args: argparse.Namespace) -> None:
    import datetime as dt
    import msgspec
    try:
        payload = msgspec.Raw(msgspec.json.encode(msgspec.json.decode(args.payload))) if args.payload else None
    except msgspec.DecodeError as exc:
        raise SystemExit(f"--payload is not JSON: {exc}") from None
    due_at = None
    if args.due_at:
        try:
            due_at = dt.datetime.fromisoformat(args.due_at)
        except ValueError:
            raise SystemExit(f"--due-at {args.due_at!r} is not an RFC 3339 time") from None
        if due_at.tzinfo is None:
            raise SystemExit("--due-at needs a UTC offset (like 2030-01-01T09:00:00+00:00)")
    options = {k: v for k, v in (("due_at", due_at), ("priority", args.priority), ("max_attempts", args.max_attempts),
                                 ("flex_s", args.flex_s), ("idempotency_key", args.idempotency_key)) if v is not None}
    if args.count > 1:
        from minutehand.client import job
        jobs = [job(args.name, payload, strict=args.strict, **options) for _ in range(args.count)]
        _client_call(settings, lambda c: c.submit_many(jobs))
    else:
        _client_call(settings, lambda c: c.submit(args.name, payload, strict=args.strict, **options))


def cmd_status(settings, args: argparse.Namespace) -> None:
    _client_call(settings, lambda c: c.status(args.job_id))


def cmd_cancel(settings, args: argparse.Namespace) -> None:
    _client_call(settings, lambda c: c.cancel(args.job_id))


def cmd_jobs(settings, args: argparse.Namespace) -> None:
    import itertools
    _client_call(settings, lambda c: list(itertools.islice(
        c.jobs(state=args.state, name=args.name, page_size=min(args.limit, 500)), args.limit)))


def cmd_dev(settings: Settings, args: argparse.Namespace) -> None:
    import os
    from minutehand import envconfig
    from minutehand.dev import command as dev
    if args.config:                          # its children (serve, the demo worker) read the same file
        os.environ[envconfig.CONFIG_ENV] = os.path.abspath(args.config)
    dev.run(settings, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minutehand", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"minutehand {VERSION} ({DISTRIBUTION})")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        settings_class(name).parser(p)
        if func is not None:                 # None: its own subcommands name theirs
            p.set_defaults(func=func)
        return p

    p = command("migrate", cmd_migrate, "upgrade the schema to the latest revision (a no-op when current)")
    p.add_argument("--downgrade", action="store_true", help="undo the latest revision instead")
    p.add_argument("--citus", action="store_true",
                   help="then distribute the tables over the Citus cluster the database URL names (its "
                        "coordinator): idempotent, and safe again after a later migration")
    p = command("citus-add-node", cmd_citus_add_node,
                "add a worker node to the Citus cluster the database URL names (its coordinator): the "
                "database and settings made on the node first, then citus_add_node")
    p.add_argument("node", type=_node, help="the new node, HOST:PORT (the same user and database name)")
    p.add_argument("--rebalance", action="store_true",
                   help="then move shard groups onto it (citus_rebalance_start, block_writes) and wait")
    command("maintain", cmd_maintain, "run every maintenance duty once over every shard")
    team = command("team", None, "create a team, set its quota and weight, list teams").add_subparsers(
        dest="action", required=True)

    def team_command(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = team.add_parser(name, help=help_, description=help_)
        Settings.parser(p)                   # settings flags given after the action are the command's too
        p.set_defaults(func=func)
        return p

    limit = _bounded(TEAM_LIMIT_MIN, TEAM_LIMIT_MAX)
    p = team_command("create", cmd_team_create, "create a team and print its API token")
    p.add_argument("name")
    p.add_argument("--quota", type=limit, help="most jobs of the team running at once while other teams have "
                                               "due work waiting (default: the default_team_quota setting)")
    p.add_argument("--weight", type=limit, help="its share of the fleet when teams compete (default: the "
                                                "default_team_weight setting)")
    p = team_command("set", cmd_team_set, "set a team's quota, weight and admission limits")
    p.add_argument("name")
    p.add_argument("--quota", type=limit, help="most jobs of the team running at once while others wait")
    p.add_argument("--weight", type=limit, help="its share of the fleet when teams compete")
    p.add_argument("--submit-rate", type=_or_none(_rate),
                   help="jobs per second it may submit through the API (none: no rate limit)")
    p.add_argument("--submit-burst", type=_or_none(limit), help="most jobs it may submit at once")
    # (Not --max-pending: the settings' flags are read apart, and that is a prefix of --max-pending-per-team.)
    p.add_argument("--max-pending-jobs", dest="max_pending", type=_or_none(limit),
                   help="most jobs submitted and not finished (none: the max_pending_per_team setting)")
    p = team_command("webhook", cmd_team_webhook, "show, set (--url, --secret) or --remove a team's webhook")
    p.add_argument("name")
    p.add_argument("--url", help="where the team's events are POSTed")
    p.add_argument("--secret", help="the HMAC-SHA256 signing key, 16 to 200 characters (default: one is made)")
    p.add_argument("--remove", action="store_true", help="remove the team's webhook")
    p = team_command("list", cmd_team_list, "list teams by name with their quota and weight")
    p.add_argument("--after", help="start after this team name (a page's last)")
    p.add_argument("--limit", type=_bounded(1, 1000), default=1000, help="most teams listed (at most 1000)")
    series = command("series", None, "list, show, pause, resume or cancel a team's repeating series"
                     ).add_subparsers(dest="action", required=True)
    for name, func, help_ in (("show", cmd_series_show, "a series: its spec, state and newest runs"),
                              ("pause", cmd_series_pause, "pause a series (its waiting run is cancelled if it "
                                                          "has not started)"),
                              ("resume", cmd_series_resume, "resume a paused series from its next fire time"),
                              ("cancel", cmd_series_cancel, "cancel a series (its waiting run too if it has "
                                                            "not started)")):
        p = series.add_parser(name, help=help_, description=help_)
        Settings.parser(p)
        p.set_defaults(func=func)
        p.add_argument("series_id", type=_bounded(-(2**63), 2**63 - 1))
        p.add_argument("--team", required=True, help="the team the series belongs to")
    p = series.add_parser("list", help="a team's series, newest first", description="a team's series, newest first")
    Settings.parser(p)
    p.set_defaults(func=cmd_series_list)
    p.add_argument("--team", required=True, help="the team whose series are listed")
    p.add_argument("--after", type=_bounded(-(2**63), 2**63 - 1), help="start after this series id (a page's last)")
    p.add_argument("--limit", type=_bounded(1, 1000), default=100, help="most series listed (at most 1000)")
    dead = command("dead", None, "requeue or discard dead jobs; a team's events").add_subparsers(
        dest="action", required=True)
    budget = _bounded(1, 100)
    for name, help_ in (("requeue", "put a dead job back on the wheel, due now"),
                        ("discard", "set a dead job aside for good (state discarded)"),
                        ("requeue-name", "requeue every dead job of a team and name"),
                        ("discard-name", "discard every dead job of a team and name")):
        p = dead.add_parser(name, help=help_, description=help_)
        Settings.parser(p)
        p.set_defaults(func=cmd_dead_settle)
        if name.endswith("-name"):
            p.add_argument("name", help="the job name")
            p.add_argument("--team", required=True, help="the team of the jobs")
        else:
            p.add_argument("job_id", type=_bounded(-(2**63), 2**63 - 1))
            p.add_argument("--team", help="the team of the job (default: the job's own)")
        if name.startswith("requeue"):
            p.add_argument("--max-attempts", type=budget, help="the new attempt budget (default: the job's own)")
    p = dead.add_parser("events", help="a team's events (dead jobs), oldest first",
                        description="a team's events (dead jobs), oldest first")
    Settings.parser(p)
    p.set_defaults(func=cmd_dead_events)
    p.add_argument("--team", required=True)
    p.add_argument("--after", help="the cursor the previous call printed")
    p.add_argument("--limit", type=_bounded(1, 1000), default=100)
    job_id = _bounded(-(2**63), 2**63 - 1)
    p = command("submit", cmd_submit, "submit a job through the HTTP API (client_url, client_token); prints "
                                      "its id and run time as JSON")
    p.add_argument("name", help="the job's name")
    p.add_argument("--payload", help="its payload, as JSON (default {})")
    p.add_argument("--due-at", help="when it is due, RFC 3339 with an offset (default now)")
    p.add_argument("--flex-s", type=_bounded(0, 86400), help="its flex window in seconds")
    p.add_argument("--priority", type=_bounded(-100, 100))
    p.add_argument("--max-attempts", type=_bounded(1, 100))
    p.add_argument("--strict", action="store_true", help="run at the due time exactly")
    p.add_argument("--idempotency-key", help="a key of your own (default: one made for the call's retries)")
    p.add_argument("--count", type=_bounded(1, 1_000_000), default=1, help="submit this many such jobs")
    command("status", cmd_status, "a job's status record, as JSON").add_argument("job_id", type=job_id)
    command("cancel", cmd_cancel, "cancel a job that has not started").add_argument("job_id", type=job_id)
    p = command("jobs", cmd_jobs, "the team's jobs, newest first, one JSON line each")
    p.add_argument("--state", help="only jobs in this state")
    p.add_argument("--name", help="only jobs of this name")
    p.add_argument("--limit", type=_bounded(1, 1_000_000), default=50, help="most jobs listed")
    command("worker", cmd_worker, "run a worker: minutehand worker module.path:worker").add_argument("target")
    p = command("worker-token", cmd_worker_token, "create (or rotate) a worker credential and print its token")
    p.add_argument("action", choices=["create"])
    p.add_argument("name")
    command("serve", cmd_serve, "the submitter HTTP API and a dispatcher (worker protocol) on "
                                "http_host:http_port, in one process")
    command("dispatcher", cmd_dispatcher, "a dispatcher alone: the worker protocol on http_host:http_port")
    p = command("dev", cmd_dev, "local embedded PostgreSQL, migrated, with a demo workload (Ctrl-C stops)")
    p.add_argument("--rate", type=int, default=200, help="demo jobs submitted per second")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    return parser


CLIENT_COMMANDS = ("submit", "status", "cancel", "jobs")


def settings_class(command: str) -> type:
    """The worker reads the worker library's settings, the client's commands
    the client's; every other command the server's."""
    if command == "worker":
        from minutehand.worker.settings import WorkerSettings
        return WorkerSettings
    if command in CLIENT_COMMANDS:
        from minutehand.client.settings import ClientSettings
        return ClientSettings
    return Settings


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    settings = settings_class(args.command).load(argv[1:])
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        args.func(settings, args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVER_PACKAGES:
            raise
        raise SystemExit(f"minutehand {args.command} needs the server's dependencies ({exc.name} is missing): "
                         f"pip install '{DISTRIBUTION}[server]'") from None


if __name__ == "__main__":
    main()
