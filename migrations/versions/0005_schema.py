"""Schema: everything of ours moves from public into the schema `minutehand`
(tables with their partitions, indexes, constraints and owned sequences,
the sequence job_id_seq, the types); the functions the old layout defined
in public are dropped by their known names and owner (every migrate that ends at head
applies the current ones from sql/functions/ into minutehand). On a database
made through revisions 0001-0004 by this release there are no such
functions, and the result is the same.

Frozen. Revision ID: 0005
Revises: 0004
"""
from minutehand.store import sqlfiles

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Every function name the layout before this revision defined in public.
OLD_FUNCTIONS = """
cancel cascade_wheel claim_due claim_for_worker complete complete_many dispatcher_members expire_claims fail
fail_many heartbeat heartbeat_many leave_dispatchers maintain mh_backoff mh_batch_items mh_bucket_has_rows
mh_carry_forward mh_claim mh_claim_filtered_sql mh_claim_named_sql mh_claim_sql mh_due_problem mh_earliest_due
mh_enqueue mh_enqueue_many mh_horizon mh_hour mh_hour_end mh_hour_part mh_hour_slot mh_hour_slots mh_hour_span
mh_id_at mh_idempotency_ttl mh_job_problem mh_job_state mh_key_shard mh_lease_problem mh_max_ahead mh_minute
mh_minute_end mh_minute_part mh_minute_slot mh_minute_slots mh_move_down mh_move_hand mh_new_id mh_now
mh_payload_max_bytes mh_payload_problem mh_pinned_clock mh_random_shard mh_readable mh_refusal mh_repeat_problem
mh_request_hash mh_run_at mh_series_hash mh_shard_count mh_shard_of mh_submit_keyed mh_sweep_after mh_take_key
mh_team_id mh_write_job next_due purge_idempotency_keys release_many release_shard_lease start start_many
submit_job submit_job_detail submit_jobs submit_series sweep_passed take_duty_lease take_shard_lease
""".split()

TABLES = ("teams", "jobs", "claim_checks", "idempotency_keys", "shards", "wheel", "due_minutes", "due_hours",
          "due_far", "series", "worker_tokens", "dispatchers", "duty_leases", "timezone_names")
TYPES = ("job_state", "due_row", "submit_result", "outcome")

# Move our objects from one schema to another: the tables, then the
# partitions of the two wheel rings (SET SCHEMA moves a table's indexes,
# constraints, row type and identity sequence, not its partitions), then
# the free-standing sequence and the types.
MOVE = """
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = '{src}'::regnamespace AND c.relname = ANY (%(tables)s)
                 OR c.oid IN (SELECT i.inhrelid FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                               WHERE p.relnamespace = '{src}'::regnamespace
                                 AND p.relname IN ('due_minutes', 'due_hours'))
    LOOP
        EXECUTE format('ALTER TABLE %%s SET SCHEMA {dst}', r.rel);
    END LOOP;
    ALTER SEQUENCE {src}.job_id_seq SET SCHEMA {dst};
    FOR r IN SELECT unnest(%(types)s) AS name LOOP
        EXECUTE format('ALTER TYPE {src}.%%I SET SCHEMA {dst}', r.name);
    END LOOP;
END $$;
"""


def _array(names) -> str:
    return "ARRAY[" + ", ".join(f"'{n}'" for n in names) + "]"


def move(src: str, dst: str) -> str:
    return MOVE.format(src=src, dst=dst) % {"tables": _array(TABLES), "types": _array(TYPES)}


def drop_old_functions() -> str:
    return f"""
DO $$
DECLARE
    r record;
    v_owner oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = to_regclass('public.jobs'));
BEGIN
    -- Only the old layout's own: owned by the role that owns its jobs table
    -- (a user's function of the same name, owned by another role, stays).
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY ({_array(OLD_FUNCTIONS)})
                AND p.proowner = v_owner
    LOOP
        EXECUTE format('DROP FUNCTION %s', r.fn);
    END LOOP;
END $$;
"""


def upgrade() -> None:
    sqlfiles.execute("CREATE SCHEMA IF NOT EXISTS minutehand;" + drop_old_functions() + move("public", "minutehand"),
                     search_path="public")


def downgrade() -> None:
    # The functions of ours were dropped before the downgrade began (migrations/env.py).
    sqlfiles.execute(move("minutehand", "public"), search_path="public")
