"""slotlake.preload: a sync's imports done in a thread, and no fork while it runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from slotlake import preload, table_processes
from slotlake.preload import Preload

# A module that records the thread that imported it, after ``delay`` seconds.
MODULE = """
import threading, time
time.sleep({delay})
IMPORTED_BY = threading.current_thread().name
IMPORTED_AT = time.monotonic()
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Writes throwaway modules on sys.path; they are forgotten again afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def make(name: str, delay: float = 0.0, body: str | None = None) -> str:
        (tmp_path / f"{name}.py").write_text(body or MODULE.format(delay=delay))
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


def test_a_preload_imports_its_modules_in_a_thread_of_its_own(modules) -> None:  # type: ignore[no-untyped-def]
    a, b = modules("preload_a"), modules("preload_b", delay=0.2)
    loading = Preload((a, b))
    assert loading.modules == (a, b)
    loading.wait()
    assert sys.modules[a].IMPORTED_BY == sys.modules[b].IMPORTED_BY == "slotlake-preload"
    assert not preload._RUNNING
    # What is imported already starts no thread.
    again = Preload((a, "json"))
    assert again.modules == () and again._thread is None
    again.wait()


def test_a_failing_import_is_left_to_its_user(modules) -> None:  # type: ignore[no-untyped-def]
    bad = modules("preload_bad", body="raise RuntimeError('no such luck')\n")
    loading = Preload((bad, "json"))
    loading.wait()  # no error here
    assert loading.failed == {bad: "RuntimeError: no such luck"}
    assert bad not in sys.modules
    with pytest.raises(RuntimeError, match="no such luck"):
        __import__(bad)


def test_settle_waits_for_every_running_preload(modules) -> None:  # type: ignore[no-untyped-def]
    slow = modules("preload_slow", delay=0.3)
    Preload((slow,))
    preload.settle()
    assert slow in sys.modules and not preload._RUNNING


def _loaded(name: str) -> bool:
    """Whether the module ran to its end (a module is in sys.modules while it runs)."""
    return hasattr(sys.modules.get(name), "IMPORTED_AT")


def test_workers_fork_only_once_the_preload_is_done(modules) -> None:  # type: ignore[no-untyped-def]
    """A worker forked meanwhile could wait forever on the import's lock: the lane's
    opening waits for the import, and the workers find the module loaded."""
    slow = modules("preload_before_fork", delay=0.4)
    started = time.monotonic()
    Preload((slow,))
    lane = table_processes.TableProcesses.open(2, _loaded)
    assert lane is not None
    try:
        assert _loaded(slow) and time.monotonic() - started >= 0.4
        ok, answer, _ = lane.submit(slow).result(timeout=60)
        assert ok and answer is True
    finally:
        lane.close()
