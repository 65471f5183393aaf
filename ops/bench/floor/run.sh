#!/usr/bin/env bash
# The floor of any PostgreSQL job queue on this server: a minimal one-table
# queue (schema.sql), driven by pgbench (the C client, -M prepared):
#   - enqueue: one INSERT per transaction (enqueue.sql), 8 clients;
#   - claim: up to 100 due rows per transaction, FOR UPDATE SKIP LOCKED,
#     then one DELETE for the batch (claim_batch100_delete.sql), 4 clients,
#     over a due-now backlog (prefill.sql), counted in the database.
# No real queue can beat these on the same server; the benchmarks in
# ops/bench/ print their own figures as a ratio to them, measured in the same run.
#
#   usage: ops/bench/floor/run.sh DSN [seconds [backlog_rows]]
#     DSN           a database to use; its table q is dropped and recreated
#     seconds       length of each timed pgbench run (default 20)
#     backlog_rows  due-now rows loaded for the claim run (default 3,000,000:
#                   more than 4 clients claim in 20 s at the 65,000-80,000
#                   rows/s measured on a 2-core machine)
#   prints:  floor_enqueue_single_per_s=N
#            floor_claim_delete_batch100_rows_per_s=N
set -euo pipefail
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
dsn=$1; secs=${2:-20}; rows=${3:-3000000}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# pgbench and psql: on PATH, else the newest Debian/Ubuntu server install.
pgbin() {
    command -v "$1" 2>/dev/null && return
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] || { echo "floor: no $1 found (apt-get install postgresql-client)" >&2; exit 1; }
    echo "$found"
}
pgbench=$(pgbin pgbench); psql=$(pgbin psql)

"$psql" "$dsn" -qX -v ON_ERROR_STOP=1 -f "$here/schema.sql" >/dev/null
enq=$("$pgbench" -n -M prepared -c 8 -j 2 -T "$secs" -f "$here/enqueue.sql" "$dsn" 2>/dev/null | awk '/^tps/ {print int($3)}')

"$psql" "$dsn" -qX -v ON_ERROR_STOP=1 -f "$here/schema.sql" >/dev/null
"$psql" "$dsn" -qX -v ON_ERROR_STOP=1 -v n="$rows" -f "$here/prefill.sql" >/dev/null
"$psql" "$dsn" -qX -c "VACUUM ANALYZE q" >/dev/null
before=$("$psql" "$dsn" -qtAX -c "select count(*) from q")
"$pgbench" -n -M prepared -c 4 -j 2 -T "$secs" -f "$here/claim_batch100_delete.sql" "$dsn" >/dev/null 2>&1
after=$("$psql" "$dsn" -qtAX -c "select count(*) from q")
if [ "$after" -eq 0 ]; then
    echo "floor: the claim run emptied its backlog of $rows rows: the figure is too low; give it more rows" >&2
fi
echo "floor_enqueue_single_per_s=$enq"
echo "floor_claim_delete_batch100_rows_per_s=$(( (before - after) / secs ))"
