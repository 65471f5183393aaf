"""Distributing a migrated database over a Citus cluster (`minutehand
migrate --citus`): every table keyed by `shard` is hash-distributed by it,
all colocated, so one shard's rows of every table live on one worker; the
small control tables every node reads are reference tables (a copy on every
node). Idempotent: a table already distributed is left as it is, so running
it again after a later migration added tables distributes only those.

Tables neither keyed by shard nor small (per-team counters: stats, pending,
load, buckets, webhook deliveries), and the wheel's duty row, stay local to
the coordinator: written by procedures that run there, and never read by a
statement Citus pushes down to a worker.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import psycopg
import psycopg.conninfo
import psycopg.rows
import psycopg.sql

from minutehand.store.schema import SCHEMA

# Distributed by shard and colocated with jobs, first the one the others follow.
DISTRIBUTED = ("jobs", "shards", "claim_checks", "idempotency_keys", "series", "due_minutes", "due_hours",
               "due_far", "team_running", "dead_jobs", "job_events", "retention_marks", "retention_checks",
               "job_attempts")
# Small, read by every node, written rarely: a copy on every node.
REFERENCE = ("teams", "worker_tokens", "flex_defaults", "webhooks", "timezone_names")
# Local to the coordinator, where the procedures that write them run: per-team
# rows with no shard column, written with every event (a reference table
# would replicate each write to every node) or read with every event beside
# those (the names the counters keep apart), the admin UI's audit log and
# sessions (no shard column, written with the action they record), and
# `wheel`, whose row the global duties lock with SKIP LOCKED (a row lock on
# a reference table takes a lock Citus holds to commit: the second duty
# would wait, not skip); and the dispatchers' membership and duty leases,
# read only on the coordinator and written every few seconds: a write of a
# reference table needs every node, so one node away would stop every
# dispatcher's renewal.
LOCAL = ("team_stats", "team_stats_names", "team_pending", "team_buckets", "load_minutes", "webhook_deliveries",
         "wheel", "admin_audit", "admin_sessions", "alembic_version", "dispatchers", "duty_leases")

# Functions whose first argument is the shard of everything they touch,
# which Citus would then run whole on that shard's worker
# (create_distributed_function with the shard argument). None yet: a claim
# delegated that way was ~20-30 % faster when nothing was due (measured
# here, noisy), but a delegated call reads the worker's clock (a pinned
# clock does not reach it) and cannot write the coordinator-local counters
# (ops/citus/README.md, "What each call does").
DELEGATED: tuple[str, ...] = ()


@dataclass(frozen=True)
class Distribution:
    """What distribute() did: the tables it distributed, made reference tables or local again now."""
    distributed: list[str] = field(default_factory=list)
    reference: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.distributed and not self.reference and not self.functions and not self.local:
            return "citus: everything already distributed (nothing changed)"
        return (f"citus: distributed {', '.join(self.distributed) or 'none'}; "
                f"reference tables {', '.join(self.reference) or 'none'}; "
                + (f"local to the coordinator again {', '.join(self.local)}; " if self.local else "")
                + f"{len(self.functions)} functions copied to every node")


def is_citus(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')").fetchone()[0]


def _kind(conn: psycopg.Connection, table: str) -> str | None:
    """'h' (hash-distributed), 'n' (reference), other Citus kinds, or None (not in Citus' metadata)."""
    row = conn.execute("SELECT partmethod::text FROM pg_dist_partition WHERE logicalrelid = to_regclass(%s)",
                       (f"{SCHEMA}.{table}",)).fetchone()
    return row[0] if row else None


def is_distributed(conn: psycopg.Connection) -> bool:
    return is_citus(conn) and _kind(conn, DISTRIBUTED[0]) is not None


# A job id's low bits name its shard (mh_shard_of; tests/test_ids.py).
SHARD_BITS = 10


def shard_of(job_id: int) -> int:
    """The shard of a job, read from its id as mh_shard_of reads it."""
    return job_id & ((1 << SHARD_BITS) - 1)


def shard_groups(conn: psycopg.Connection) -> dict[int, int]:
    """{logical shard: the Citus shard of jobs that holds it}, or {} when
    the database is not distributed. Statements that name only logical
    shards of one Citus shard (`shard = ANY (...)`) are router statements
    on one worker. Fixed until a Citus shard is split (a move between
    nodes keeps the ids); after a split, statements named by a stale map
    still work, over more than one shard."""
    lead = f"{SCHEMA}.{DISTRIBUTED[0]}"
    with conn.cursor(row_factory=psycopg.rows.tuple_row) as cur:     # (whatever rows the connection makes)
        distributed = cur.execute("""SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
                                        AND to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL""").fetchone()[0]
        if not distributed or not cur.execute("SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = "
                                              "to_regclass(%s))", (lead,)).fetchone()[0]:
            return {}
        rows = cur.execute(f"""SELECT s, get_shard_id_for_distribution_column(%s, s::smallint)
                                 FROM generate_series(0, {SCHEMA}.mh_shard_count() - 1) s""", (lead,)).fetchall()
    return dict(rows)


def before_migrate(conn: psycopg.Connection) -> None:
    """In the migrate transaction. A Citus database not yet distributed is
    migrated on the coordinator alone (Citus would otherwise copy some of
    the new objects to the workers as it goes, and not the types they
    need): distribute() then places everything. A distributed one is
    migrated with Citus propagating each change to the workers, one shard
    at a time: after a command it ran on many shards at once, Citus refuses
    in the same transaction an index whose shard names are long (the wheel
    partitions' indexes)."""
    if is_citus(conn) and not is_distributed(conn):
        conn.execute("SET LOCAL citus.enable_ddl_propagation = off")
    elif is_citus(conn):
        conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")


def unknown_tables(conn: psycopg.Connection) -> list[str]:
    """Tables of ours that none of the lists above names: a later migration
    added them, and this module must say how they are distributed."""
    known = set(DISTRIBUTED) | set(REFERENCE) | set(LOCAL)
    rows = conn.execute("""SELECT c.relname::text FROM pg_class c
                            WHERE c.relnamespace = to_regnamespace(%s) AND c.relkind IN ('r', 'p')
                              AND NOT c.relispartition ORDER BY 1""", (SCHEMA,)).fetchall()
    return [r[0] for r in rows if r[0] not in known]


def distribute(database_url: str, shard_count: int) -> Distribution:
    """Distribute the migrated database at database_url (its coordinator).
    shard_count: Citus shards per distributed table (a table already
    distributed keeps its count; the colocation group fixes it)."""
    from minutehand.store.schema import conninfo

    with psycopg.connect(conninfo(database_url), autocommit=True) as conn:
        if not is_citus(conn):
            raise RuntimeError("the database has no citus extension: CREATE EXTENSION citus on every node first")
        if unknown := unknown_tables(conn):
            raise RuntimeError(f"tables minutehand.store.citus does not place: {', '.join(unknown)}")
        done = Distribution()
        # Made reference tables by an earlier version: local again.
        for table in LOCAL:
            if _kind(conn, table) == "n":
                conn.execute("SELECT undistribute_table(%s)", (f"{SCHEMA}.{table}",))
                done.local.append(table)
        # Reference tables first: nothing depends on the order, but a later
        # foreign key to one would need it to exist.
        for table in REFERENCE:
            if _kind(conn, table) is None:
                conn.execute("SELECT create_reference_table(%s)", (f"{SCHEMA}.{table}",))
                done.reference.append(table)
        lead = f"{SCHEMA}.{DISTRIBUTED[0]}"
        for table in DISTRIBUTED:
            if _kind(conn, table) is not None:
                continue
            if table == DISTRIBUTED[0]:
                conn.execute("SELECT create_distributed_table(%s, 'shard', shard_count => %s, colocate_with => 'none')",
                             (lead, shard_count))
            else:
                conn.execute("SELECT create_distributed_table(%s, 'shard', colocate_with => %s)",
                             (f"{SCHEMA}.{table}", lead))
            done.distributed.append(table)
        worker_settings(conn)
    # Citus' sessions to the workers opened before the setting keep the old path.
    with psycopg.connect(conninfo(database_url), autocommit=True) as conn:
        done.functions.extend(_propagate_functions(conn))
        _delegate(conn)
        return done


# Set on every worker's database. The small SQL helpers resolve names
# through their caller's path (so that the planner may inline them), and a
# statement Citus pushes down to a worker runs them there, in Citus' own
# sessions: the path names our schema. The workers hold copies of functions
# the coordinator checked; a body naming what exists on the coordinator
# alone (mh_new_id's sequence: ids are made there) is not checked again.
# JIT off, as on our own connections (schema.py): Citus' sessions on the
# workers run the pushed-down statements, so they plan them there.
WORKER_SETTINGS = {"search_path": f"{SCHEMA}, public", "check_function_bodies": "off", "jit": "off"}


def worker_settings(conn: psycopg.Connection) -> None:
    """WORKER_SETTINGS on every worker's database of this name (again after
    a copy: CREATE DATABASE ... TEMPLATE does not copy them)."""
    db = conn.execute("SELECT current_database()").fetchone()[0]
    # (Citus allows ALTER DATABASE on a worker only with its propagation off.)
    command = "SET citus.enable_ddl_propagation = off; " + "; ".join(
        f"ALTER DATABASE {psycopg.sql.Identifier(db).as_string(conn)} SET {k} = {v}"
        for k, v in WORKER_SETTINGS.items())
    failed = conn.execute("SELECT nodename, nodeport, result FROM run_command_on_workers(%s) WHERE NOT success",
                          (command,)).fetchall()
    if failed:
        raise RuntimeError(f"citus: {command} failed on {failed}")


def add_node(database_url: str, host: str, port: int, rebalance: bool = False) -> str:
    """A new worker node into the cluster whose coordinator database_url
    names (the same user and database name on the node). On the node: the
    database, made if missing, with the citus extension and
    WORKER_SETTINGS; these first, as Citus copies our types and functions
    to the node as it joins, and with function bodies checked (the default)
    a function naming a type not yet copied fails the join. Then
    citus_add_node on the coordinator. With rebalance, Citus' rebalancer
    moves shard groups onto it and this waits until it is done
    (block_writes: the wheel partitions and claim reminders have no replica
    identity for a logical copy; writes to the one moving shard wait for
    its copy). Idempotent: a node already in the cluster is left as it is.
    Returns what it did, for the operator."""
    from minutehand.store.schema import conninfo

    coordinator = conninfo(database_url)
    db = psycopg.conninfo.conninfo_to_dict(coordinator).get("dbname") or "postgres"
    with psycopg.connect(psycopg.conninfo.make_conninfo(coordinator, host=host, port=port, dbname="postgres"),
                         autocommit=True) as node:
        if not node.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
            node.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(db)))
    with psycopg.connect(psycopg.conninfo.make_conninfo(coordinator, host=host, port=port),
                         autocommit=True) as node:
        node.execute("CREATE EXTENSION IF NOT EXISTS citus")
        node.execute("SET citus.enable_ddl_propagation = off")
        for k, v in WORKER_SETTINGS.items():
            node.execute(psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                psycopg.sql.Identifier(db), psycopg.sql.Identifier(k), psycopg.sql.SQL(v)))
    with psycopg.connect(coordinator, autocommit=True) as conn:
        done = [f"citus: node {host}:{port} "
                + ("already in the cluster" if conn.execute("SELECT 1 FROM pg_dist_node WHERE nodename = %s AND "
                                                            "nodeport = %s", (host, port)).fetchone()
                   else "added")]
        conn.execute("SELECT citus_add_node(%s, %s)", (host, port))
        if rebalance:
            started = time.monotonic()
            conn.execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
            conn.execute("SELECT citus_rebalance_wait()")
            done.append(f"rebalanced in {time.monotonic() - started:.1f} s: "
                        f"{shard_groups_on(conn, host, port)} shard groups on it")
    return "; ".join(done)


def shard_groups_on(conn: psycopg.Connection, host: str, port: int) -> int:
    """How many Citus shard groups (shards of the lead table) the node holds."""
    return conn.execute("""SELECT count(DISTINCT s.shardid) FROM pg_dist_placement p
                             JOIN pg_dist_shard s USING (shardid) JOIN pg_dist_node n USING (groupid)
                            WHERE n.nodename = %s AND n.nodeport = %s AND s.logicalrelid = %s::regclass""",
                        (host, port, f"{SCHEMA}.{DISTRIBUTED[0]}")).fetchone()[0]


def _propagate_functions(conn: psycopg.Connection) -> list[str]:
    """Every function of ours onto every node (a statement Citus pushes down
    to a worker calls them there): each becomes a Citus distributed object,
    which the workers get now and every later migrate's CREATE OR REPLACE
    reaches."""
    rows = conn.execute("""SELECT p.oid::regprocedure::text FROM pg_proc p
                            WHERE p.pronamespace = to_regnamespace(%s)
                              AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                                               WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
                            ORDER BY p.oid""", (SCHEMA,)).fetchall()
    for (fn,) in rows:
        conn.execute("SELECT create_distributed_function(%s)", (fn,))
    return [r[0] for r in rows]


def _delegate(conn: psycopg.Connection) -> None:
    """Functions run whole on the worker of their shard argument."""
    for name in DELEGATED:
        oid = conn.execute("SELECT p.oid::regprocedure::text FROM pg_proc p "
                           "WHERE p.pronamespace = to_regnamespace(%s) AND p.proname = %s", (SCHEMA, name)).fetchone()
        if oid is not None:
            conn.execute("SELECT create_distributed_function(%s, 'p_shard', colocate_with => %s)",
                         (oid[0], f"{SCHEMA}.{DISTRIBUTED[0]}"))


def placements(conn: psycopg.Connection) -> int:
    """Shard placements of our tables: what Citus' metadata holds, and what planning grows with."""
    return conn.execute("SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid) "
                        "WHERE s.logicalrelid::regclass::text LIKE %s", (f"{SCHEMA}.%",)).fetchone()[0]

