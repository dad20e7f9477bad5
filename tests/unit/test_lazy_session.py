"""slotlake.spark.LazySession: built once, on first use, whichever thread asks."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slotlake.spark import LazySession


def test_not_built_until_asked_then_once() -> None:
    built: list[int] = []
    lock = threading.Lock()

    def build() -> Any:
        time.sleep(0.05)  # a slow JVM start: other threads arrive meanwhile
        with lock:
            built.append(1)
        return object()

    lazy = LazySession(build)
    assert lazy.started is None and not built
    with ThreadPoolExecutor(8) as pool:
        sessions = list(pool.map(lambda _: lazy(), range(8)))
    assert len(built) == 1
    assert all(s is sessions[0] for s in sessions)
    assert lazy.started is sessions[0]


def test_of_wraps_a_session_or_keeps_a_lazy_one() -> None:
    session = object()
    wrapped = LazySession.of(session)  # type: ignore[arg-type]
    assert wrapped.started is session and wrapped() is session
    lazy = LazySession(object)
    assert LazySession.of(lazy) is lazy
