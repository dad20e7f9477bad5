"""How a throwaway cluster's owner is told alive or gone (slotlake.localpg.sweep_stale)."""

import os
import subprocess
import time
from pathlib import Path

from slotlake.localpg import OWNER_FILE, _started_at, sweep_stale


def test_a_process_is_alive_until_it_ends_reaped_or_not() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        start = _started_at(child.pid)
        assert start is not None and start == _started_at(child.pid)
    finally:
        child.kill()
    deadline = time.monotonic() + 5
    while _started_at(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    # Killed and not yet reaped (a zombie): gone all the same.
    assert _started_at(child.pid) is None
    child.wait()
    assert _started_at(child.pid) is None


def test_only_directories_of_ended_owners_are_removed(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    ended = tmp_path / "slotlake-pg16-ended"
    mine = tmp_path / "slotlake-pg16-mine"
    reused = tmp_path / "slotlake-pg16-reused"  # my pid, another start time: not me
    unowned = tmp_path / "slotlake-pg16-unowned"
    other = tmp_path / "unrelated-dir"
    for d in (ended, mine, reused, unowned, other):
        d.mkdir()
    me = os.getpid()
    (ended / OWNER_FILE).write_text(f"{child.pid} 1")
    (mine / OWNER_FILE).write_text(f"{me} {_started_at(me)}")
    (reused / OWNER_FILE).write_text(f"{me} 1")
    (other / OWNER_FILE).write_text(f"{child.pid} 1")
    removed = sweep_stale(tmp_path)
    assert sorted(removed) == sorted([ended, reused])
    assert {p.name for p in tmp_path.iterdir()} == {mine.name, unowned.name, other.name}
