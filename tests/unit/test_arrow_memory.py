"""slotlake.arrow_memory: jemalloc for the process and its children, unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = (
    "import os, pyarrow as pa; from slotlake.arrow_memory import prefer_jemalloc; "
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
