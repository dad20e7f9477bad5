"""When a local lake's files reach the disk: all at once, before the record naming them.

What the exactly-once contract needs durable is what a record names, before the record:
the raw files (and any snapshot copy) before the batch's plan, and every table's data
files, deletion vectors, log entries and checkpoints before its commit record (the slot
moves only after it). :class:`slotlake.lake.Lake` makes them durable before it writes a
plan or a commit record.

A sync's batch (:func:`deferred`) lists what it writes: the raw directory, and each data
file, deletion vector, log entry and checkpoint the driver writes (its forked workers
hand theirs back). Those are fsynced side by side before the record, the journal taking
them together. Files written by a writer that does not list them (Spark, deltalake, a
worker that died, a snapshot's copy) make it sync the lake's whole file system instead
(``syncfs``), which also flushes whatever else was written there meanwhile; so do more
than ``FSYNC_FILES_MAX`` files (``lake.fsync_files_max``): a batch of many small tables
lists hundreds, and one ``syncfs`` costs a tenth of their fsyncs here. Even by name, on ext4 an fsync waits for the new blocks of
every file (ordered mode): a PostgreSQL on the same disk makes it ~0.1 s slower after
10k random updates of a 5M-row table. A reprocess lists its files the same way
(``slotlake.reprocess``). Elsewhere (bootstrap, upkeep) the driver fsyncs each file it
writes before the entry naming it, and the lake's file system is synced before each
record (Spark's and deltalake's files).

The driver's own Delta commits used to fsync their entry and its directory each: ~2 ms
of waiting a table, a fifth of a small table's time, while the data files they named
were not synced at all.

A job killed meanwhile loses nothing (the kernel still writes what it was given). A
machine that loses power before the commit record may come back with entries of that
unfinished batch empty or torn, or naming data files that did not reach the disk whole:
the rerun of the batch first removes them (:func:`slotlake.delta_log.drop_torn_entries`,
called by ``slotlake.sync``) and redoes what they were, as after any crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

SYNC_THREADS = 8
# A batch that listed more files than this syncs the lake's file system whole: each
# fsync is a journal commit of its own, and ``syncfs`` is one. Measured on the project's
# 2-core machine (ext4 on a virtual disk), the spread benchmark's 400 files and 200
# directories: 0.09-0.12 s by name, 0.010-0.014 s whole, also with 200 MB of another
# process's writes pending. ``lake.fsync_files_max`` sets it per lake.
FSYNC_FILES_MAX = 64

_LOCK = threading.Lock()
_PENDING: list[str] | None = None  # files written in deferred() scopes, not synced yet
_DEPTH = 0
_LAST_SYNC = 0.0
_UNLISTED = False  # files were written that nobody listed: sync the file system whole
_FILES_MAX: int | None = None  # the running batch's FSYNC_FILES_MAX


@contextlib.contextmanager
def deferred(root: str, files_max: int = FSYNC_FILES_MAX) -> Iterator[None]:
    """Files written meanwhile are listed (:func:`written`, by any thread of this process;
    its forked workers' by :func:`hand_back`/:func:`adopt`), not synced one by one; they are
    made durable by :func:`flush` (a plan, a commit record) and at the end, on an
    exception too (an attempt that follows in the same run keeps what this one
    committed; a sync error there is logged, the exception raised). A flush of more than
    ``files_max`` files syncs ``root``'s file system whole instead."""
    global _PENDING, _DEPTH, _UNLISTED, _FILES_MAX
    with _LOCK:
        _DEPTH += 1
        if _PENDING is None:
            _PENDING = []
            _FILES_MAX = files_max
    try:
        yield
    except BaseException:
        try:
            flush(root)
        except Exception:  # the batch's own error is the one to raise
            log.warning("could not sync the failed batch's files", exc_info=True)
        raise
    else:
        flush(root)
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                _PENDING, _UNLISTED, _FILES_MAX = None, False, None


def flush(root: str) -> None:
    """Everything written since the last flush reaches the disk: the files listed, or
    ``root``'s file system whole when some were not."""
    global _PENDING, _UNLISTED, _LAST_SYNC
    with _LOCK:
        paths = _PENDING or []
        if _PENDING is not None:
            _PENDING = []
        whole, _UNLISTED = _UNLISTED, False
        many = _FILES_MAX is not None and len(paths) > _FILES_MAX
    t0 = time.monotonic()
    if whole or (many and on_file_system_of(root, paths)):
        sync_file_system(root)
    else:
        sync_paths(paths)
    _LAST_SYNC = time.monotonic() - t0


def last_sync_seconds() -> float:
    """How long the last :func:`flush` took (0 before any)."""
    return _LAST_SYNC


def deferring() -> bool:
    """Whether a batch of this process lists its files for a later sync now."""
    return _PENDING is not None


def written(*paths: str) -> None:
    """``paths`` (files just written, before any entry names them): listed for the
    batch's sync, or made durable now when no batch defers."""
    with _LOCK:
        if _PENDING is not None:
            _PENDING.extend(paths)
            return
    sync_paths(list(paths))


def written_tree(directory: str) -> None:
    """Every file under ``directory`` (a pull's raw files), as :func:`written`."""
    written(*(os.path.join(d, f) for d, _, names in os.walk(directory) for f in names))


def unlisted() -> None:
    """Files were written that the batch cannot list (Spark, deltalake, a worker that
    died): its next flush syncs the lake's file system whole."""
    global _UNLISTED
    with _LOCK:
        # Outside a batch, the records' syncs take the file system whole anyway.
        _UNLISTED = _PENDING is not None


# What a forked worker hands back with each answer: the files it listed, and whether it
# wrote files it could not list (its own unlisted(), which stays in its process).
HandedBack = tuple[list[str], bool]


def mark() -> int:
    with _LOCK:
        return len(_PENDING or [])


def hand_back(mark_: int) -> HandedBack:
    """In a forked worker: the files listed after ``mark_``, and whether unlisted ones were
    written since the last hand-back, for its parent (:func:`adopt`)."""
    global _UNLISTED
    with _LOCK:
        whole, _UNLISTED = _UNLISTED, False
        return list((_PENDING or [])[mark_:]), whole


def adopt(handed: HandedBack) -> None:
    """A worker's files (:func:`hand_back`), now the parent's to sync."""
    global _UNLISTED
    paths, whole = handed
    with _LOCK:
        if _PENDING is not None:
            _PENDING.extend(paths)
            _UNLISTED = _UNLISTED or whole


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by its path (gone since: nothing to keep)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_paths(paths: list[str]) -> None:
    """fsync each file, then each directory holding one (the names), side by side."""
    if not paths:
        return
    dirs = sorted({os.path.dirname(p) for p in paths})
    with ThreadPoolExecutor(min(SYNC_THREADS, len(paths))) as pool:
        list(pool.map(fsync_path, paths))
        list(pool.map(fsync_path, dirs))


def on_file_system_of(root: str, paths: list[str]) -> bool:
    """Whether every one of ``paths`` (files, by their directories) is on ``root``'s file
    system: a raw directory or copy elsewhere would not be reached by its ``syncfs``."""
    try:
        device = os.stat(root).st_dev
        return all(os.stat(d).st_dev == device for d in {os.path.dirname(p) for p in paths})
    except OSError:  # a directory gone since (nothing there to keep) or unreadable
        return False


def sync_file_system(root: str) -> None:
    """Everything written to ``root``'s file system (Linux ``syncfs``; ``sync`` elsewhere).
    ``root`` may not exist yet: its nearest existing parent is on the same one."""
    while not os.path.exists(root) and os.path.dirname(root) not in ("", root):
        root = os.path.dirname(root)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(root, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    os.sync()


__all__ = [
    "HandedBack",
    "adopt",
    "deferred",
    "deferring",
    "flush",
    "fsync_path",
    "hand_back",
    "last_sync_seconds",
    "mark",
    "on_file_system_of",
    "sync_file_system",
    "sync_paths",
    "unlisted",
    "written",
    "written_tree",
]
