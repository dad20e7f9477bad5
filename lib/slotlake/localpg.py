"""Throwaway local PostgreSQL clusters with ``wal_level=logical``.

Used by the test fixtures, the demo and the benchmarks. Two sources of binaries
are known: Debian's ``postgresql-NN`` packages (``/usr/lib/postgresql/NN/bin``) and
the PyPI wheel ``pgserver`` (PostgreSQL 16). ``initdb`` refuses to run as root, so
when this process is root the server runs as an unprivileged user (``postgres`` if
it exists, else a system user ``slotlake`` created on first use).

A cluster's directory names the process that made it (:data:`OWNER_FILE`). A process
killed before it stopped its clusters (SIGKILL, a timeout) leaves them running, and where
they live in memory (the tests put them on ``/dev/shm``) they hold that memory until
someone stops them: the next cluster started in the same directory does
(:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEBIAN_BIN = "/usr/lib/postgresql/{version}/bin"
SERVER_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "400",
    "max_wal_senders": "40",
    "max_prepared_transactions": "20",
    "max_connections": "100",
    # A throwaway cluster: durability buys nothing and costs test time.
    "fsync": "off",
    # on: the sync job targets pg_current_wal_flush_lsn(), which lags async commits.
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "128MB",
    "max_wal_size": "4GB",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


# In each cluster's directory: "<pid> <start time>" of the process that made it.
OWNER_FILE = "owner"
_PREFIX = "slotlake-pg"


class LocalPostgresError(RuntimeError):
    pass


def _started_at(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat's 22nd field),
    None when there is no such process or it has ended (a zombie not yet reaped): with the
    pid it names one process, never a later one that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The fields after the command's closing parenthesis start at the third (the state).
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _postmaster_of(data_dir: Path) -> int | None:
    """The pid of the server running on ``data_dir``, if one does."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    # A pid reused since by another process has another command line.
    return pid if os.fsencode(str(data_dir)) in cmdline else None


def _stop_server(pid: int, seconds: float = 10.0) -> None:
    """Immediate shutdown (SIGQUIT, as ``pg_ctl -m immediate``), SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + seconds
        while _started_at(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if _started_at(pid) is not None:
            os.kill(pid, signal.SIGKILL)


def sweep_stale(base_dir: Path) -> list[Path]:
    """Stop and remove the clusters in ``base_dir`` whose making process is gone; the
    directories removed.

    Only directories with an owner file are looked at: one being made has none yet, and
    a cluster of a live process (another test run, a demo) is left alone."""
    if _started_at(os.getpid()) is None:  # no /proc here: nothing can be told apart
        return []
    removed = []
    for tmp in sorted(base_dir.glob(f"{_PREFIX}*-*")):
        try:
            pid, start = (tmp / OWNER_FILE).read_text().split()
            owner = int(pid)
        except (OSError, ValueError):
            continue
        if _started_at(owner) == start:
            continue
        server = _postmaster_of(tmp / "data")
        try:
            if server is not None:
                _stop_server(server)
            shutil.rmtree(tmp)
        except OSError as exc:  # another user's cluster: theirs to remove
            log.info("left a stale PostgreSQL cluster in %s: %s", tmp, exc)
            continue
        log.warning(
            "removed a PostgreSQL cluster left by process %d, which ended without stopping "
            "it%s: %s",
            owner,
            f" (its server, pid {server}, stopped)" if server is not None else "",
            tmp,
        )
        removed.append(tmp)
    return removed


def _pgserver_bin() -> Path | None:
    """The binaries of the ``pgserver`` wheel, found without importing it: its import
    asks platformdirs for a runtime directory, which warns on every run of a user
    without ``XDG_RUNTIME_DIR`` (root in a container, a scheduler's worker)."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return candidate if (candidate / "initdb").exists() else None


def _binary_version(bin_dir: Path) -> int:
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    # "postgres (PostgreSQL) 16.2"
    return int(out.split()[-1].split(".")[0])


def available_versions() -> dict[int, Path]:
    """Major version → bin directory, for every PostgreSQL this machine can start."""
    found: dict[int, Path] = {}
    pgs = _pgserver_bin()
    if pgs is not None:
        found[_binary_version(pgs)] = pgs
    debian_root = Path("/usr/lib/postgresql")
    if debian_root.is_dir():
        for entry in sorted(debian_root.iterdir()):
            bin_dir = entry / "bin"
            if (bin_dir / "initdb").exists() and entry.name.isdigit():
                found.setdefault(int(entry.name), bin_dir)
    return found


def find_bin_dir(version: int | None = None) -> tuple[int, Path]:
    versions = available_versions()
    if not versions:
        raise LocalPostgresError(
            "no PostgreSQL server binaries found: install Debian's postgresql-15 "
            "(apt-get install -y postgresql-15) or the PyPI wheel pgserver"
        )
    if version is None:
        version = max(versions)
    if version not in versions:
        raise LocalPostgresError(
            f"PostgreSQL {version} binaries not found (have {sorted(versions)}); "
            + (
                "pip install pgserver"
                if version == 16
                else f"apt-get install -y postgresql-{version}"
            )
        )
    return version, versions[version]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> str | None:
    """The unprivileged account to run the server as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "slotlake"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "slotlake"],
        check=True,
        capture_output=True,
    )
    return "slotlake"


@dataclass
class LocalPostgres:
    """One throwaway cluster. Use as a context manager, or call start()/stop()."""

    version: int | None = None
    settings: dict[str, str] = field(default_factory=dict)
    base_dir: Path | None = None
    port: int = 0
    superuser: str = "postgres"
    bin_dir: Path = field(init=False)
    data_dir: Path = field(init=False)
    _tmp: Path | None = field(init=False, default=None)
    _run_as: str | None = field(init=False, default=None)
    _started: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.version, self.bin_dir = find_bin_dir(self.version)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LocalPostgres:
        self._run_as = _server_user()
        sweep_stale(Path(self.base_dir or tempfile.gettempdir()))
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{self.version}-", dir=self.base_dir))
        me = os.getpid()
        (self._tmp / OWNER_FILE).write_text(f"{me} {_started_at(me)}")
        self.data_dir = self._tmp / "data"
        if self._run_as is not None:
            info = pwd.getpwnam(self._run_as)
            os.chown(self._tmp, info.pw_uid, info.pw_gid)
            # The server user must be able to reach the directory through its parents.
            os.chmod(self._tmp, 0o755)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.superuser,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        conf = dict(SERVER_SETTINGS)
        conf.update(self.settings)
        chosen = not self.port
        self.port = self.port or free_port()
        conf["port"] = str(self.port)
        conf["unix_socket_directories"] = f"'{self._tmp}'"
        with open(self.data_dir / "postgresql.conf", "a") as fh:
            fh.write("\n# slotlake throwaway cluster\n")
            for key, value in conf.items():
                fh.write(f"{key} = {value}\n")
        with open(self.data_dir / "pg_hba.conf", "a") as fh:
            fh.write("host replication all 127.0.0.1/32 trust\n")
        start = [
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-l",
            str(self._tmp / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        ]
        for attempt in range(3):
            try:
                self._run(start)
                break
            except LocalPostgresError as exc:
                # A port picked free can be taken before the server binds it (another
                # process starting a cluster at once): pick another.
                if not chosen or attempt == 2 or "already in use" not in str(exc):
                    raise
                self.port = free_port()
                with open(self.data_dir / "postgresql.conf", "a") as fh:
                    fh.write(f"port = {self.port}\n")
        self._started = True
        log.info("PostgreSQL %s started on 127.0.0.1:%s (%s)", self.version, self.port, self._tmp)
        return self

    def stop(self) -> None:
        if self._started:
            with contextlib.suppress(subprocess.CalledProcessError, LocalPostgresError):
                self._run(
                    [
                        str(self.bin_dir / "pg_ctl"),
                        "-D",
                        str(self.data_dir),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ]
                )
            self._started = False
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- access ----------------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        parts = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": self.superuser,
            "dbname": dbname,
        }
        parts.update(extra)
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def server_log(self) -> str:
        if self._tmp is None:
            return ""
        path = self._tmp / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def create_database(self, name: str) -> str:
        """CREATE DATABASE name; returns its DSN."""
        self._maintenance("CREATE DATABASE {}", name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE name, closing its sessions first (none may linger from a test)."""
        self._maintenance("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)

    def _maintenance(self, statement: str, database: str) -> None:
        """A statement about ``database`` (its name as an identifier), run from ``postgres``
        outside a transaction, as CREATE and DROP DATABASE must be."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(database)))

    def _run(self, argv: list[str]) -> None:
        if self._run_as is not None:
            argv = ["runuser", "-u", self._run_as, "--", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd="/")
        if proc.returncode != 0:
            raise LocalPostgresError(
                f"{Path(argv[-1] if argv[-1] in ('start', 'stop') else argv[0]).name} failed "
                f"(exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}\n"
                f"{self.server_log()[-2000:]}"
            )
