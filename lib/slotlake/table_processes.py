"""A batch's small tables in forked worker processes: every core for work that holds
the GIL.

A small table done on the driver (:mod:`slotlake.local_table`) is a few hundred Python
and Arrow calls: decode, fill, two Parquet files, two Delta log entries. In threads they
take turns on the GIL, so a batch touching a hundred such tables used one core of two
(measured: two threads 1.12 s, one 1.38 s, three or four slower than two). Forked
workers run them side by side.

The workers are forked once per batch, after the batch's raw rows were read, so each
finds the catalogs and raw rows in its copy of the parent's memory; a task is a table's
name, its answer the table's :class:`slotlake.lake.TableCommit`. A worker does only what
needs no JVM: work that asks for Spark raises :class:`NeedsParent`. Whatever a worker
cannot finish (that, any error, a worker killed) is done again by the parent's threads:
each Delta commit carries the batch's transaction marker, so what the worker committed is
not written twice, and a real error is raised by the parent as it would have been.

A worker dies with its parent (``PR_SET_PDEATHSIG``): a job killed mid-batch leaves no
process writing on. A worker that stops answering is killed (:data:`STALL_SECONDS`):
forked from a process with other threads, a child can block forever on a lock one of
them held at the fork, and a batch must not hang on it.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from slotlake import durability, preload

log = logging.getLogger(__name__)

# Below this many tables a batch keeps to the parent's threads: forking costs ~15 ms and
# each worker's first tables run on cold caches. Measured (tables of 100 changes, two
# workers vs two threads): 8 tables 0.18-0.19 vs 0.17-0.18 s, 16 even (0.27-0.28 vs
# 0.26-0.31 s), 32 0.35-0.40 vs 0.42-0.49 s, 100 0.76 vs 1.07 s.
MIN_TABLES = 16
# No answer from any worker for this long and the workers are killed, their tables left
# to the parent's threads (which redo them under the same transaction markers). The
# biggest table a worker gets is bounded by lake.driver_write_rows: a 1M-change table
# takes ~3 s on this project's 2-core machine, so a worker this quiet is stuck, not busy.
STALL_SECONDS = 300.0
_PR_SET_PDEATHSIG = 1


class NeedsParent(RuntimeError):
    """Raised in a worker by work only the parent can do (a Spark session)."""


def available() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def processes_for(setting: int | None, tables: int) -> int:
    """Worker processes for ``tables`` eligible tables: ``setting`` (None: one a core),
    none when there are too few tables to repay the forks or no fork here."""
    wanted = cores() if setting is None else setting
    if wanted < 2 or tables < MIN_TABLES or not available():
        return 0
    return min(wanted, tables // (MIN_TABLES // 2))


# The job of the lane being started: a forked worker finds it in its copy of this module.
_JOB: Callable[[str], Any] | None = None
_ONE_LANE = threading.Lock()
# Process-wide handles a worker must not use (their threads stayed in the parent), kept
# referenced so that no destructor runs on them in the worker.
_ABANDONED: list[Any] = []
# False in a worker whose parent had started deltalake's runtime before the fork: tokio
# does not survive a fork, and deltalake refuses (a panic) to run in such a child. None:
# not tried yet (a worker tries on its first need, ~20 ms if it works, ~80 ms if not:
# told by the parent when its runtime's threads were there, it does not try).
_DELTALAKE: bool | None = True
# Checkpoints a worker without deltalake left to its parent: (table path, version).
_CHECKPOINTS_DUE: list[tuple[str, int]] = []


def deltalake_started() -> bool:
    """Whether deltalake's runtime runs in this process: its threads are there (tokio's
    workers, ``tokio-rt-worker``), as they are once any deltalake call needed it.

    A worker forked after that cannot use deltalake, and finding it out by a try costs
    ~80 ms (the panic); told so, a worker hands such work to its parent at once. Without
    such threads the worker tries, as a runtime without them would still refuse it."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                if f.read().startswith("tokio-"):
                    return True
        except OSError:
            continue  # a thread that ended meanwhile
    return False


def _start_worker(parent: int, deltalake_may_work: bool) -> None:
    import gc

    # What the parent made is never collected here: the collector's passes over it would
    # copy page after page of the parent's memory into the worker (~4 % of the spread).
    gc.freeze()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    # The parent's DuckDB databases run queries on threads that were not forked: the
    # worker opens its own.
    from slotlake import dv_merge, replay_duckdb

    _ABANDONED.extend(replay_duckdb._DB)
    replay_duckdb._DB.clear()
    _ABANDONED.append(dv_merge._duckdb)
    dv_merge._duckdb.cache_clear()
    global _DELTALAKE
    _DELTALAKE = None if deltalake_may_work else False


# The smallest Delta table: loading it runs deltalake's runtime (a missing table does not).
_PROBE_LOG = (
    '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n'
    '{"metaData":{"id":"probe","format":{"provider":"parquet","options":{}},'
    '"schemaString":"{\\"type\\":\\"struct\\",\\"fields\\":[{\\"name\\":\\"x\\",'
    '\\"type\\":\\"long\\",\\"nullable\\":true,\\"metadata\\":{}}]}",'
    '"partitionColumns":[],"configuration":{},"createdTime":0}}\n'
)


def _deltalake_works() -> bool:
    """Whether deltalake runs here, tried on a throwaway table (its panic message
    silenced: a worker that cannot use it hands that work to the parent, no error)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slotlake-probe-") as tmp:
        os.mkdir(os.path.join(tmp, "_delta_log"))
        with open(os.path.join(tmp, "_delta_log", f"{0:020d}.json"), "w") as f:
            f.write(_PROBE_LOG)
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        try:
            from deltalake import DeltaTable

            return DeltaTable(tmp).version() == 0
        except BaseException:  # deltalake's PanicException is a BaseException
            return False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(null)


def _deltalake_here() -> bool:
    global _DELTALAKE
    if _DELTALAKE is None:
        _DELTALAKE = _deltalake_works()
    return _DELTALAKE


def need_deltalake(what: str) -> None:
    """Raise :class:`NeedsParent` in a worker where deltalake cannot run."""
    if not _deltalake_here():
        raise NeedsParent(f"{what} through deltalake (its runtime stayed in the parent)")


def checkpoint_here(path: str, version: int) -> bool:
    """Whether a checkpoint of ``path`` at ``version`` can be written now; if not (a
    worker without deltalake) it is left to the parent (:func:`checkpoints_due`)."""
    if _deltalake_here():
        return True
    _CHECKPOINTS_DUE.append((path, version))
    return False


def checkpoints_due() -> list[tuple[str, int]]:
    """The checkpoints this worker left to its parent since the last call."""
    due = list(_CHECKPOINTS_DUE)
    _CHECKPOINTS_DUE.clear()
    return due


def _run(name: str) -> tuple[bool, Any, durability.HandedBack]:
    """(True, the job's answer) or (False, why it failed), with what the job wrote for the
    batch's sync either way (slotlake.durability). Exceptions stay here, where they may
    not pickle (deltalake's panics are BaseExceptions of a Rust module)."""
    assert _JOB is not None
    mark = durability.mark()
    try:
        return True, _JOB(name), durability.hand_back(mark)
    except BaseException as exc:  # every failure goes back to the parent
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return False, text, durability.hand_back(mark)


class TableProcesses:
    """``processes`` forked workers running ``job(name)`` for the tables submitted, from
    :meth:`open` (None when another lane of this process is running: the module's job
    slot is taken) to :meth:`close`."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._answered = time.monotonic()

    @classmethod
    def open(cls, processes: int, job: Callable[[str], Any]) -> TableProcesses | None:
        if not _ONE_LANE.acquire(blocking=False):
            return None
        preload.settle()  # no fork while a thread imports (slotlake.preload)
        global _JOB
        _JOB = job
        lane = cls(processes)
        try:
            lane._pool = ProcessPoolExecutor(
                processes,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_start_worker,
                initargs=(os.getpid(), not deltalake_started()),
            )
        except BaseException:
            lane.close()
            raise
        return lane

    def submit(self, name: str) -> Future[tuple[bool, Any, durability.HandedBack]]:
        """The first submit forks the workers (in the calling thread, which must outlive
        them: the parent-death signal follows the thread that forked)."""
        assert self._pool is not None
        self._answered = time.monotonic()
        return self._pool.submit(_run, name)

    def answered(self) -> None:
        """A worker answered: the stall clock starts again."""
        self._answered = time.monotonic()

    def patience(self) -> float:
        """Seconds left before the workers count as stalled (see :meth:`stalled`)."""
        return max(0.0, self._answered + STALL_SECONDS - time.monotonic())

    def stalled(self) -> None:
        """When no worker answered for :data:`STALL_SECONDS` while tables were out, the
        workers are killed: the tables they had fail with ``BrokenProcessPool``."""
        if self.patience() > 0:
            return
        log.warning(
            "no worker process answered for %.0f s: stopping them (pids %s); the "
            "parent's threads do their tables",
            STALL_SECONDS,
            ", ".join(str(p.pid) for p in self._workers()) or "none left",
        )
        self.kill()
        self._answered = time.monotonic()

    def kill(self) -> None:
        for process in self._workers():
            process.kill()

    def _workers(self) -> list[multiprocessing.Process]:
        # The pool keeps them private: it has no way to stop a worker that never returns.
        procs = getattr(self._pool, "_processes", None) or {}
        return list(procs.values())

    def close(self) -> None:
        """Stops the workers once their current tables are done, killing those still
        busy after :data:`STALL_SECONDS` (a failed batch must not hang on a stuck one)."""
        global _JOB
        try:
            if self._pool is not None:
                workers = self._workers()
                manager = getattr(self._pool, "_executor_manager_thread", None)
                self._pool.shutdown(wait=False, cancel_futures=True)
                if manager is not None:
                    manager.join(self.patience())
                    if manager.is_alive():
                        log.warning(
                            "worker processes still busy after %.0f s: killed", STALL_SECONDS
                        )
                        for process in workers:
                            process.kill()
                        manager.join()
        finally:
            _JOB = None
            _ONE_LANE.release()


__all__ = [
    "MIN_TABLES",
    "STALL_SECONDS",
    "NeedsParent",
    "TableProcesses",
    "available",
    "checkpoint_here",
    "checkpoints_due",
    "deltalake_started",
    "need_deltalake",
    "processes_for",
]
