# Sourced by ops/test and ops/dev: go to the checkout, make sure .venv exists and
# holds this project (editable) with the requested extras, and that some
# PostgreSQL server binaries are available (the pgserver wheel if the machine has none).
#
#   source ops/lib/venv.sh; mh_venv test     # or: mh_venv server (what ops/dev runs); "" for the worker library alone

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# Server binaries on the machine (as app/minutehand/dev/localpg.py looks for them before pgserver).
mh_have_system_pg() {
    command -v pg_ctl >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

mh_venv() {
    local extras="$1"
    # A venv without pip is what `python3 -m venv` leaves behind when python3-venv is missing.
    if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
        rm -rf .venv
        if ! "${PYTHON:-python3}" -m venv .venv; then
            rm -rf .venv
            echo "ops: cannot create .venv; on Debian/Ubuntu: apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    # No server binaries: the `embedded` extra brings the pgserver wheel, which ships them.
    mh_have_system_pg || extras="${extras:+$extras,}embedded"
    # Reinstall only when pyproject.toml changed since the last install with these extras.
    local stamp=".venv/.minutehand-installed${extras:+-$extras}"
    if ! cmp -s pyproject.toml "$stamp"; then
        echo "ops: installing minutehand-scheduler${extras:+[$extras]} into .venv" >&2
        local log=.venv/pip-install.log
        # Output only on failure: the build backend's warnings are noise in test runs.
        if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".${extras:+[$extras]}" >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "ops: pip install failed (full log: $log)" >&2
            exit 1
        fi
        cp pyproject.toml "$stamp"
    fi
}
