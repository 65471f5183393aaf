"""Project-local PostgreSQL cluster: the database behind `minutehand dev` and the tests.

`LocalCluster(data_dir).ensure_started()` makes sure a PostgreSQL server runs on
`data_dir`: initdb if the directory is missing or empty, start it if stopped, reuse
it if it already runs (started by this or another process; a lock file next to the
data dir serialises concurrent callers). It listens on 127.0.0.1 only with trust
auth, and its superuser role is always `postgres` (initdb -U postgres), so the DSN
is postgresql://postgres@127.0.0.1:PORT/DBNAME on every machine.

Binaries: `pg_ctl` on PATH, else the newest /usr/lib/postgresql/*/bin (Debian,
Ubuntu), else those bundled in the `pgserver` wheel (pip install pgserver).

Non-root (a developer's laptop): the binaries run directly as the current user.

Root (containers, CI): PostgreSQL refuses to run as root, so the data dir belongs
to the `postgres` OS user (created with useradd if missing) and every command runs
through `runuser -u postgres --`. That user must be able to reach the data dir,
which a checkout under /root (mode 0700) is not. In that case the data lives in
/var/tmp/minutehand-<hash of data_dir>/pgdata and `data_dir` becomes a symlink to
it: the symlink records where the data is (remove both to start afresh). Likewise,
binaries the postgres user cannot reach (pgserver inside a venv under /root) are
copied once to /var/tmp/minutehand-pgbin-<hash>.

Files in the data dir: minutehand.conf (our settings, rewritten at every start and
included from postgresql.conf, so `settings` and `fsync` apply when the server
starts, not to one already running), minutehand.port (the port picked at the first
start), server.log (the server's log).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVER_USER = "postgres"  # OS user when running as root; always the cluster's superuser role

# Sized for a job queue on a small box; `settings` overrides any of them.
DEFAULT_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "1GB",
    # The schema has ~1000 partitions; planning over a partitioned table locks each one.
    "max_locks_per_transaction": "1024",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
}
# Only for throwaway clusters (tests): a crash may corrupt the data.
NO_DURABILITY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

# A unix socket path must fit in sun_path (104-108 bytes) with "/.s.PGSQL.NNNNN" appended.
MAX_SOCKET_DIR_LEN = 88

INSTALL_HINT = (
    "No PostgreSQL server binaries (pg_ctl, initdb, postgres) found. Install one of: "
    "`apt-get install postgresql-15` (Debian/Ubuntu), `brew install postgresql@15` (macOS), "
    "or `pip install pgserver` into this venv (ops/test and ops/dev do that for you)."
)


class LocalPGError(RuntimeError):
    pass


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def find_bindir() -> Path:
    """Directory holding pg_ctl, initdb and postgres; raises LocalPGError if none."""
    candidates: list[Path] = []
    if pg_ctl := shutil.which("pg_ctl"):
        candidates += [Path(pg_ctl).resolve().parent, Path(pg_ctl).parent]
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    debian.sort(key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else -1)
    candidates += [Path(p) for p in reversed(debian)]
    spec = importlib.util.find_spec("pgserver")  # find, don't import: importing it has side effects
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for d in candidates:
        if all((d / exe).is_file() for exe in ("pg_ctl", "initdb", "postgres")):
            return d
    raise LocalPGError(INSTALL_HINT)


def default_data_dir() -> Path:
    """`minutehand dev`'s data: .minutehand/pgdata in the checkout (the package is installed editable)."""
    return Path(__file__).resolve().parents[3] / ".minutehand" / "pgdata"


def _as_server_user() -> list[str]:
    # runuser is in /usr/sbin, which a minimal PATH may lack.
    return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", SERVER_USER, "--"]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        # Same option the postmaster sets, so our own recently stopped server's
        # TIME_WAIT connections don't make its port look taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    host = "127.0.0.1"
    user = SERVER_USER

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        fsync: bool = True,
        settings: dict[str, str] | None = None,
    ):
        self.requested_dir = Path(data_dir).absolute()
        self.port = port
        self._port_fixed = port is not None
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.as_root = os.geteuid() == 0
        self._bindir: Path | None = None  # looked up lazily: constructing must not need PostgreSQL

    @property
    def data_dir(self) -> Path:
        """Where the data really is (follows the relocation symlink when root)."""
        return self.requested_dir.resolve()

    def dsn(self, dbname: str = "postgres") -> str:
        if self.port is None:
            raise LocalPGError("port not known yet: call ensure_started() first")
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    # -- lifecycle ---------------------------------------------------------------

    def ensure_started(self) -> None:
        with self._lock():
            if self.as_root:
                self._ensure_server_user()
                self._relocate_if_unreachable()
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb()
            running_port = self._running_port()
            if running_port is not None:
                self.port = running_port  # reuse it, whatever port we were asked for
                return
            self._start()

    def running(self) -> bool:
        """Whether a server runs on this data dir now (started by anyone)."""
        return (self.data_dir / "PG_VERSION").exists() and self._running_port() is not None

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop: -m fast ends the sessions cleanly, -m immediate is a crash."""
        with self._lock():
            if self.running():
                self._pg("pg_ctl", "stop", "-D", self.data_dir, "-m", mode, "-w", "-s")

    def restart(self, mode: str = "fast") -> None:
        """pg_ctl restart on the same port: -m fast ends the sessions and
        checkpoints, -m immediate is a crash (no checkpoint: the start
        replays the WAL). What a failover looks like to the clients."""
        with self._lock():
            log = self.data_dir / "server.log"             # -l: as in _start, the server must not hold our pipes
            self._pg("pg_ctl", "restart", "-D", self.data_dir, "-m", mode, "-l", log, "-w", "-t", "60", "-s")

    # -- internals ---------------------------------------------------------------

    def _lock(self):
        # Beside the data dir, not in it: initdb wants an empty directory.
        self.requested_dir.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(self.requested_dir.with_name(self.requested_dir.name + ".lock"), "w")
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file is closed
        return lock_file

    def _bin(self, name: str) -> str:
        if self._bindir is None:
            bindir = find_bindir()
            if self.as_root and not self._reachable(bindir / "postgres"):
                bindir = self._copy_install(bindir)
            self._bindir = bindir
        return str(self._bindir / name)

    def _pg(self, exe: str, *args, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [self._bin(exe), *map(str, args)]
        if self.as_root:
            cmd = [*_as_server_user(), *cmd]
        # cwd=/ because the postgres user may not be allowed into our cwd (e.g. /root/...).
        # Output capture is safe for `pg_ctl start` because -l redirects the server's stdio.
        result = subprocess.run(cmd, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise LocalPGError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result

    def _own(self, path: Path, mode: int) -> None:
        """Give a file or directory we created to the server user."""
        if self.as_root:
            pw = pwd.getpwnam(SERVER_USER)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        path.chmod(mode)

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        self._own(path, 0o600)  # whatever root's umask, the server must be able to read it

    def _ensure_server_user(self) -> None:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:  # e.g. pgserver fallback on a box without the postgresql package
            subprocess.run(
                ["useradd", "--system", "--user-group", "--no-create-home",
                 "--shell", "/usr/sbin/nologin", SERVER_USER],
                check=True,
            )

    def _reachable(self, path: Path) -> bool:
        """Can the server user get to (search/execute) path? Checks every ancestor too."""
        probe = [*_as_server_user(), "test", "-x", str(path)]
        return subprocess.run(probe, cwd="/", stdin=subprocess.DEVNULL).returncode == 0

    def _relocate_if_unreachable(self) -> None:
        wanted = self.requested_dir
        if self._reachable(self.data_dir.parent):
            return
        if wanted.is_symlink():  # dangling: the relocated data was removed (e.g. /var/tmp cleaned)
            wanted.unlink()
        elif wanted.exists():
            if any(wanted.iterdir()):
                raise LocalPGError(f"{wanted} holds data the {SERVER_USER} user cannot reach; move it or fix permissions")
            wanted.rmdir()
        home = Path("/var/tmp") / f"minutehand-{_short_hash(str(wanted))}"
        home.mkdir(exist_ok=True)
        home.chmod(0o755)
        wanted.symlink_to(home / "pgdata")

    def _copy_install(self, bindir: Path) -> Path:
        """Copy a relocatable install (pgserver's pginstall/) where the server user can run it.

        pgserver's binaries find their shared libraries through the rpath
        $ORIGIN/../../../pgserver.libs, so that sibling directory comes along.
        """
        dest = Path("/var/tmp") / f"minutehand-pgbin-{_short_hash(str(bindir))}"
        install = bindir.parent
        if not dest.exists():
            # Copy aside, then rename: a concurrent process never sees half a copy.
            tmp = Path(tempfile.mkdtemp(dir="/var/tmp", prefix=dest.name + "."))
            shutil.copytree(install, tmp / install.parent.name / install.name, symlinks=True)
            if (libs := install.parent.parent / "pgserver.libs").is_dir():
                shutil.copytree(libs, tmp / libs.name, symlinks=True)
            for d in (tmp, tmp / install.parent.name):
                d.chmod(0o755)
            try:
                tmp.rename(dest)
            except OSError:  # another process got there first
                shutil.rmtree(tmp)
        return dest / install.parent.name / install.name / "bin"

    def _initdb(self) -> None:
        d = self.data_dir
        d.mkdir(parents=True, exist_ok=True)
        if any(d.iterdir()):
            raise LocalPGError(f"{d} is neither empty nor a PostgreSQL data directory")
        self._own(d, 0o700)
        args = ["-D", d, "-U", SERVER_USER, "--auth=trust", "--encoding=UTF8", "--locale=C"]
        self._pg("initdb", *args, *([] if self.fsync else ["--no-sync"]))
        with open(d / "postgresql.conf", "a") as f:
            f.write("\n# minutehand: written by app/minutehand/dev/localpg.py at every start\ninclude_if_exists = 'minutehand.conf'\n")

    def _running_port(self) -> int | None:
        if self._pg("pg_ctl", "status", "-D", self.data_dir, check=False).returncode != 0:
            return None
        # postmaster.pid line 4 is the port the running server listens on.
        return int((self.data_dir / "postmaster.pid").read_text().splitlines()[3])

    def _socket_dir(self) -> Path:
        if len(str(self.data_dir)) <= MAX_SOCKET_DIR_LEN:
            return self.data_dir
        d = Path("/tmp") / f"mh-{_short_hash(str(self.data_dir))}"  # literal /tmp: macOS $TMPDIR is long
        d.mkdir(exist_ok=True)
        self._own(d, 0o700)
        return d

    def _choose_port(self) -> int:
        port_file = self.data_dir / "minutehand.port"
        if self._port_fixed:
            port = self.port
        else:
            port = int(port_file.read_text()) if port_file.exists() else None
            if port is None or not _port_is_free(port):  # first start, or someone took our port
                port = _free_port()
        self._write(port_file, f"{port}\n")
        return port

    def _start(self) -> None:
        self.port = self._choose_port()
        conf = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": str(self._socket_dir()),
            **DEFAULT_SETTINGS,
            **({} if self.fsync else NO_DURABILITY),
            **self.settings,
        }
        quoted = {k: str(v).replace("'", "''") for k, v in conf.items()}
        self._write(self.data_dir / "minutehand.conf", "".join(f"{k} = '{v}'\n" for k, v in quoted.items()))
        log = self.data_dir / "server.log"
        result = self._pg("pg_ctl", "start", "-D", self.data_dir, "-l", log, "-w", "-t", "60", "-s", check=False)
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else "(no log)"
            raise LocalPGError(
                f"PostgreSQL did not start on {self.data_dir} (port {self.port}): "
                f"{(result.stdout + result.stderr).strip()}\n--- last lines of {log} ---\n{tail}"
            )
