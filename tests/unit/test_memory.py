"""slotlake.memory: jemalloc for the process and its children, unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = (
    "import os, pyarrow as pa; from slotlake.memory import prefer_jemalloc; "
    "got = prefer_jemalloc(); "
    "print(got, pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"
)


def probe(env_pool: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_pool
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_jemalloc_becomes_the_default_pool_and_is_inherited() -> None:
    assert probe(None) == ["jemalloc", "jemalloc", "jemalloc"]


def test_the_users_choice_is_kept() -> None:
    assert probe("system") == ["system", "system", "system"]


def test_memory_limit_is_the_cgroups_when_lower(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import slotlake.memory as memory

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    monkeypatch.setattr(memory, "CGROUP_LIMITS", (str(v2), str(v1)))
    assert memory.memory_limit() == physical  # no cgroup files
    v2.write_text("max\n")
    v1.write_text(str(2**63 - 4096))  # cgroup v1's "no limit"
    assert memory.memory_limit() == physical
    v1.write_text(str(3 << 30))
    assert memory.memory_limit() == 3 << 30
    v2.write_text(str(2 << 30))
    assert memory.memory_limit() == 2 << 30


FREEZE_PROBE = (
    "import gc; from slotlake.memory import freeze_heap; "
    "before = gc.get_freeze_count(); freeze_heap(); frozen = gc.get_freeze_count(); "
    "made = [[i] for i in range(1000)]; freeze_heap(); "
    "print(before, frozen > 0, gc.get_freeze_count() == frozen)"
)


def test_the_heap_is_frozen_once_a_process() -> None:
    """What the process holds at its first sync leaves the collector's reach; what it
    makes later stays collectable (a second call freezes nothing more)."""
    out = subprocess.run(
        [sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "True", "True"]
