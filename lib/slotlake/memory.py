"""The driver process's memory: the allocator behind Arrow's buffers, the limit, and the
cyclic garbage collector.

Allocator: jemalloc.

pyarrow's Linux wheels allocate with mimalloc by default. Measured on the 2-core machine
(bench/README.md): reading a 1M-change raw batch into memory the process has not touched
yet takes 1.7 s with mimalloc and 0.6 s with jemalloc (0.4–0.5 s with either once the
memory was used before), and the driver's Arrow replay of that batch 1.4 s against 0.7 s,
with a lower peak RSS. A batch runs in a fresh process, so it always pays the first touch.

A user's own ``ARROW_DEFAULT_MEMORY_POOL`` is left alone.

Collector: what a process holds when its first sync starts (the modules of PySpark,
pyarrow, pandas and slotlake, a session's objects) is frozen (``gc.freeze``), out of
the cyclic collector's reach. Those objects live as long as the process; each full
collection walked them all again: 31-50 ms, in two batches of six of the spread benchmark
(100 small tables in one process, 2026-12-03), landing in the pull (33 -> 87-107 ms) or
the tables. Frozen, a full collection took 3 ms. Objects made later are collected as
before; frozen ones are still freed when no reference is left (only a cycle among them
would stay, and a process freezes once).
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

ENV = "ARROW_DEFAULT_MEMORY_POOL"
PREFERRED = "jemalloc"

log = logging.getLogger(__name__)


def prefer_jemalloc() -> str:
    """Make jemalloc this process's default Arrow pool, and its children's (Spark's
    local Python workers inherit the environment); returns the pool's backend name."""
    import pyarrow as pa

    if os.environ.get(ENV):
        return pa.default_memory_pool().backend_name
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc
        log.debug("pyarrow has no jemalloc: Arrow keeps its default allocator")
        return pa.default_memory_pool().backend_name
    os.environ[ENV] = PREFERRED
    return PREFERRED


# cgroup v2, then v1: a container's limit, which physical memory does not show.
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit() -> int:
    """Bytes this process may use: its cgroup's memory limit when it has one below the
    machine's physical memory, else the physical memory."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < limit:  # "max" (v2) or a huge v1 value: none
            limit = int(text)
    return limit


_FROZEN = False


def freeze_heap() -> None:
    """Freeze what this process holds now, the first time it is called (see above)."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.freeze()
