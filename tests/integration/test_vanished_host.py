"""A run whose host vanishes without closing its connections (a node lost, a network cut)
leaves its session on the server, holding the slot's advisory lock: every later run finds
the lock held. The server's TCP keepalives, which slotlake's sessions ask for, end such a
session; without them it stays for the operating system's two hours.

The vanished host is a network namespace joined to this one by a veth pair: a client in
it takes the lock over the pair, then the pair's far end goes down. Nothing closes the
client's socket, and the server's probes go unanswered, as with a host that is gone.
Needs root (``ip netns``), as CI has.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from slotlake.localpg import LocalPostgres
from slotlake.source import SlotSource, lock_key

from ..conftest import PG_VERSIONS

pytestmark = pytest.mark.integration

# The client takes two slots' locks: one session with short keepalives (as slotlake's
# defaults, scaled down so that the test waits seconds, not 90), one with none.
CLIENT = textwrap.dedent(
    """
    import sys, time
    from slotlake.source import SlotSource
    dsn = sys.argv[1]
    short = {"tcp_keepalives_idle": "1", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "2"}
    none = {"tcp_keepalives_idle": "0"}  # 0: the operating system's default (two hours)
    kept = []
    for slot, settings in (("kept_alive", short), ("left_alone", none)):
        src = SlotSource(dsn, slot, ["pub"], session_settings=settings).connect()
        assert src.try_lock()
        kept.append(src)
    print("locked", flush=True)
    time.sleep(600)
    """
)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    near: str  # this side's address on the pair
    far: str  # the host's
    namespace: str
    link: str  # the host's end of the pair

    def run(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *command]

    def settled(self, port: int, timeout: float = 10.0) -> None:
        """Wait until the server's sockets to this host have nothing unacknowledged."""
        deadline = time.monotonic() + timeout
        while True:
            listed = subprocess.run(
                ["ss", "-tnH", "state", "established", f"( sport = :{port} and dst {self.far} )"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            # Without a state column: Recv-Q, Send-Q, local, peer.
            sockets = [listed[i : i + 4] for i in range(0, len(listed), 4)]
            unacked = [s for s in sockets if s[1] != "0"]
            if sockets and not unacked:
                return
            assert time.monotonic() < deadline, unacked
            time.sleep(0.05)

    def vanish(self) -> None:
        """Its end of the pair down: nothing reaches it, and nothing closes its sockets."""
        _ip("-n", self.namespace, "link", "set", self.link, "down")


@contextlib.contextmanager
def vanishing_host() -> Iterator[Host]:
    """A network namespace joined to this one by a veth pair (unique per process)."""
    tag = f"{os.getpid() % 10000:04d}"
    ns, here, there = f"slk{tag}", f"slk{tag}a", f"slk{tag}b"
    octet = 1 + os.getpid() % 250
    near, far = f"10.213.{octet}.1", f"10.213.{octet}.2"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"{near}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", f"{far}/30", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield Host(near, far, ns, there)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", here)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", ns)


def _holder_pid(conn: psycopg.Connection, slot: str) -> int | None:
    # Not slotlake.source.lock_holder: that one answers None on any error, which would let
    # the wait for the release below pass on a failed query.
    key = lock_key(slot) & 0xFFFF_FFFF_FFFF_FFFF
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
        (key >> 32, key & 0xFFFF_FFFF),
    ).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root (CI runs as root)")
def test_the_lock_of_a_run_whose_host_vanished_is_released_by_the_keepalives() -> None:
    with vanishing_host() as host:
        pg = LocalPostgres(
            version=max(PG_VERSIONS), settings={"listen_addresses": f"'127.0.0.1,{host.near}'"}
        ).start()
        client: subprocess.Popen[str] | None = None
        try:
            with open(pg.data_dir / "pg_hba.conf", "a") as fh:
                fh.write(f"host all all {host.far}/32 trust\n")
            local = pg.dsn()
            with psycopg.connect(local, autocommit=True) as c:
                c.execute("SELECT pg_reload_conf()")
                c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
                remote = pg.dsn(host=host.near)
                env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "lib")}
                client = subprocess.Popen(
                    host.run(sys.executable, "-c", CLIENT, remote),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                assert client.stdout is not None
                line = client.stdout.readline()
                assert line.strip() == "locked", client.stderr.read() if client.stderr else line
                kept, left = _holder_pid(c, "kept_alive"), _holder_pid(c, "left_alone")
                assert kept is not None and left is not None
                # Held: a run here is locked out, and told who holds it, from where.
                with SlotSource(local, "kept_alive", ["pub"]) as run:
                    assert not run.try_lock()
                    holder = run.lock_holder()
                    assert holder is not None and holder.pid == kept and holder.client == host.far

                # Once the client has acknowledged all the server sent (delayed ACKs):
                # keepalives probe an idle connection, TCP's retransmissions one with data
                # in flight.
                host.settled(pg.port)
                host.vanish()
                gone_at = time.monotonic()
                while _holder_pid(c, "kept_alive") is not None:
                    assert time.monotonic() - gone_at < 30, "the server kept the session"
                    time.sleep(0.2)
                released = time.monotonic() - gone_at
                # Keepalives of 1 s, 1 s apart, 2 of them: about 3 s.
                assert released < 15, released
                with SlotSource(local, "kept_alive", ["pub"]) as run:
                    assert run.try_lock()
                    run.unlock()
                # The session without keepalives is still there, holding its lock.
                assert _holder_pid(c, "left_alone") == left
                assert client.poll() is None  # the client itself never knew
        finally:
            if client is not None:
                client.kill()
                client.wait()
            pg.stop()
