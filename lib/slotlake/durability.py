"""When a batch's Delta log entries reach the disk: together, before its commit record.

Every Delta commit the driver writes is put-if-absent: the entry is written to a
temporary file and linked to its version's name. Made durable one by one, each entry
cost a file and a directory fsync where the batch waited, ~2 ms a table for its two
commits (a fifth of a small table's time). What the exactly-once contract needs
durable is narrower: everything the batch's commit record names, before that record
(the slot moves only after it). So a sync run's batch writes its entries without waiting
(:func:`deferred`) and makes them all durable at once when its tables are written: the
fsyncs of hundreds of entries run side by side and the file system journals them
together (200 entries: ~20 ms with 8 threads, ~50 ms one after another, idle machine).

A job killed meanwhile loses nothing (the kernel still writes what it was given). A
machine that loses power before the batch's commit record may come back with entries of
that unfinished batch empty or torn, which no Delta reader accepts: the rerun of the
batch first removes them (:func:`slotlake.delta_log.drop_torn_entries`, called by
``slotlake.sync``), and redoes what they were, as after any crash.
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

_LOCK = threading.Lock()
_PENDING: list[str] | None = None  # entries written since deferred() began, unsynced
_DEPTH = 0
_LAST_SYNC = 0.0
_LOST = False  # entries were written where this process cannot list them (a dead worker)


@contextlib.contextmanager
def deferred(root: str) -> Iterator[None]:
    """Delta log entries written meanwhile (by any thread of this process, or by its
    forked workers: :func:`since`/:func:`adopt`) are not synced one by one; at the end
    they are all made durable, ``root``'s file system whole when some were written by a
    worker that died (:func:`lost`). On an exception too: the batch did not commit, but
    an attempt that follows in the same run (the raw pulled again) keeps what this one
    committed, and its commit record names it."""
    global _PENDING, _DEPTH, _LOST
    with _LOCK:
        _DEPTH += 1
        if _PENDING is None:
            _PENDING = []
    try:
        yield
    except BaseException:
        try:
            _sync_pending(root)
        except Exception:  # the batch's own error is the one to raise
            log.warning("could not sync the failed batch's log entries", exc_info=True)
        raise
    else:
        _sync_pending(root)
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                _PENDING, _LOST = None, False


def _sync_pending(root: str) -> None:
    global _PENDING, _LOST, _LAST_SYNC
    with _LOCK:
        paths, _PENDING = _PENDING or [], []
        whole, _LOST = _LOST, False
    t0 = time.monotonic()
    if whole:
        sync_file_system(root)
    else:
        sync_paths(paths)
    _LAST_SYNC = time.monotonic() - t0


def last_sync_seconds() -> float:
    """How long the last batch's sync at its end took (0 before any)."""
    return _LAST_SYNC


def deferring() -> bool:
    """Whether a batch of this process defers its entries' syncs now."""
    return _PENDING is not None


def register(path: str) -> bool:
    """Whether ``path`` (an entry just linked) is left for the batch's sync; False: no
    batch defers, the caller syncs it now."""
    with _LOCK:
        if _PENDING is None:
            return False
        _PENDING.append(path)
        return True


def mark() -> int:
    with _LOCK:
        return len(_PENDING or [])


def since(mark_: int) -> list[str]:
    """Entries registered after ``mark_`` (a forked worker's, to hand to its parent)."""
    with _LOCK:
        return list((_PENDING or [])[mark_:])


def adopt(paths: list[str]) -> None:
    """A worker's entries, now the parent's to sync."""
    with _LOCK:
        if _PENDING is not None:
            _PENDING.extend(paths)


def lost() -> None:
    """A worker died with entries the parent cannot list: sync the file system whole."""
    global _LOST
    with _LOCK:
        _LOST = True


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
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


def sync_file_system(root: str) -> None:
    """Everything written to ``root``'s file system (Linux ``syncfs``; ``sync`` elsewhere)."""
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
    "adopt",
    "deferred",
    "deferring",
    "fsync_path",
    "last_sync_seconds",
    "lost",
    "mark",
    "register",
    "since",
    "sync_file_system",
    "sync_paths",
]
