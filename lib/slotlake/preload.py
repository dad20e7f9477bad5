"""The modules a batch's tables import, loaded in a thread while the batch is pulled.

A sync is a process of its own for each run (spark-submit, the CLI), and the tables'
code imports what it needs on first use: PySpark's types for the Delta schemas (all of
``pyspark.sql``, ~0.15 s on 2026-11-28's 2-core machine), ``deltalake``, Arrow's Acero.
Measured on 40 small tables in a fresh process: each forked worker paid ~0.13-0.17 s of
imports before its first table, and the parent paid them again writing the
``transactions`` table (0.15-0.21 s), ~0.3 s of a ~1 s batch. The run waits on
PostgreSQL most of the time before its tables, so the same imports done meanwhile cost
little: the pull took up to ~0.1 s longer (the thread takes turns on the GIL), the
batch 0.62-0.75 s instead of 0.78-1.13 s.

The thread starts with the run, so that the lock, the slot's checks and the target's
catalog overlap it too (each a round trip to PostgreSQL). Every fork waits for it
(:func:`settle`, called by :mod:`slotlake.table_processes`): a child forked while another
thread holds an import lock would wait on it forever. An import that fails here is not an
error of the batch: it fails again where it is needed, with its message.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading

log = logging.getLogger(__name__)

# What nearly every batch's small tables import (their schemas, the Delta writes, the
# decoder's column path, the replay's grouping), not what only some batches need.
MODULES = (
    "pyspark.sql.types",
    "pyspark.sql.functions",
    "deltalake",
    "pyarrow.acero",
    "slotlake.pgoutput.columnar",
    "slotlake.local_table",
    "slotlake.replay_arrow",
    "slotlake.dv_merge",
    # A table's every tenth commit writes a checkpoint: a batch of a hundred tables has
    # some, and each batch's forked workers imported it again (1.5 % of their time).
    "slotlake.delta_checkpoint",
)


# Preloads still running: a fork waits for them (settle).
_RUNNING: set[Preload] = set()
_LOCK = threading.Lock()


class Preload:
    """Imports ``modules`` (None: :data:`MODULES`) in a daemon thread, from construction
    to :meth:`wait`; those imported already are left out (no thread if none is left)."""

    def __init__(self, modules: tuple[str, ...] | None = None) -> None:
        wanted = MODULES if modules is None else modules
        self.modules = tuple(m for m in wanted if m not in sys.modules)
        self.failed: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        if self.modules:
            self._thread = threading.Thread(target=self._run, name="slotlake-preload", daemon=True)
            with _LOCK:
                _RUNNING.add(self)
            self._thread.start()

    def _run(self) -> None:
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # raised again, with its context, where it is used
                self.failed[name] = f"{type(exc).__name__}: {exc}"

    def wait(self) -> None:
        """Return once every import finished."""
        thread = self._thread
        if thread is None:
            return
        thread.join()
        with _LOCK:
            _RUNNING.discard(self)
            self._thread = None
        for name, why in self.failed.items():
            log.debug("preload of %s failed (%s)", name, why)


def settle() -> None:
    """Wait for every preload still running (before a fork)."""
    with _LOCK:
        running = list(_RUNNING)
    for preload in running:
        preload.wait()


__all__ = ["MODULES", "Preload", "settle"]
