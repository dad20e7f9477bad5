import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from slotlake.localpg import LocalPostgres, _postmaster_of, _stop_server
from tests.conftest import _memory_dir


def test_cluster_is_logical_and_matches_version(pg_cluster: LocalPostgres, pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        wal_level, version_num = conn.execute(
            "SELECT current_setting('wal_level'), current_setting('server_version_num')::int"
        ).fetchone()
    assert wal_level == "logical"
    assert version_num // 10000 == pg_cluster.version


def test_a_database_is_dropped_with_its_open_sessions(pg_cluster: LocalPostgres) -> None:
    dsn = pg_cluster.create_database("dropped_while_open")
    with psycopg.connect(dsn) as lingering:
        pg_cluster.drop_database("dropped_while_open")
        assert _is_gone(lingering)
    with psycopg.connect(pg_cluster.dsn()) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = 'dropped_while_open'"
        ).fetchone()
    assert left == (0,)
    pg_cluster.drop_database("dropped_while_open")  # gone already: not an error


def _is_gone(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


# A process that starts a cluster, says where, then waits to be killed.
_STARTER = """
import sys, time
from pathlib import Path
from slotlake.localpg import LocalPostgres
pg = LocalPostgres(version=int(sys.argv[1]), base_dir=Path(sys.argv[2])).start()
print(pg.data_dir.parent, pg.port, flush=True)
time.sleep(600)
"""


def _answers(port: int) -> bool:
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres"):
            return True
    except psycopg.OperationalError:
        return False


def test_a_cluster_left_by_a_killed_process_is_stopped_and_removed(
    pg_cluster: LocalPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILLed, a process leaves its cluster running (in memory, where the tests put
    theirs); the next cluster started in that directory stops and removes it, and leaves
    alone the clusters of live processes and directories it did not make."""
    base = Path(tempfile.mkdtemp(prefix="sweep-", dir=_memory_dir()))
    base.chmod(0o755)  # the server's user reaches its directory through this one
    foreign = base / "slotlake-pg99-notours"
    foreign.mkdir()
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(pg_cluster.version), str(base)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        left_dir, left_port = starter.stdout.readline().split()
    finally:
        starter.kill()
        starter.wait()
    assert _answers(int(left_port)), "the killed process's server runs on"
    first = second = None
    try:
        with caplog.at_level(logging.WARNING, logger="slotlake.localpg"):
            first = LocalPostgres(version=pg_cluster.version, base_dir=base).start()
        assert not Path(left_dir).exists()
        assert not _answers(int(left_port))
        assert f"left by process {starter.pid}" in caplog.text
        assert "stopped" in caplog.text
        assert foreign.is_dir()
        # A live process's cluster is not stale: starting another leaves it running.
        second = LocalPostgres(version=pg_cluster.version, base_dir=base).start()
        assert _answers(first.port) and _answers(second.port)
    finally:
        for cluster in (first, second):
            if cluster is not None:
                cluster.stop()
        server = _postmaster_of(Path(left_dir) / "data")
        if server is not None:  # the sweep failed: no server may outlive the test
            _stop_server(server)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.one_pg_version  # the cluster's start is under test, not the server
def test_a_port_taken_before_the_server_binds_it_is_picked_again(
    pg_cluster: LocalPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes starting clusters at once (the suite's workers) may pick the same
    free port: the one whose server finds it taken picks another."""
    import socket

    from slotlake import localpg

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        real = localpg.free_port
        monkeypatch.setattr(localpg, "free_port", lambda: next(ports, None) or real())
        cluster = LocalPostgres(version=pg_cluster.version, base_dir=_memory_dir()).start()
        try:
            assert cluster.port != busy
            with psycopg.connect(cluster.dsn(), autocommit=True) as c:
                assert c.execute("SHOW port").fetchone() == (str(cluster.port),)
        finally:
            cluster.stop()
