"""When a local lake's files reach the disk: all at once, before the record naming them.

What the exactly-once contract needs durable is what a record names, before the record:
the raw files before the batch's plan, and every table's data files, deletion vectors,
log entries and checkpoints before its commit record (the slot moves only after it).
Neither Spark's Delta writes nor the data files the driver writes are fsynced one by
one, so :class:`slotlake.lake.Lake` syncs the lake's file system (Linux ``syncfs``)
before it writes a plan or a commit record: one call, the journal takes everything
together (the spread's 100 tables, 200 entries and their data files: a few ms; a 1M-change
batch's ~200 MB: ~0.1 s of writing the kernel would do anyway).

The driver's own Delta commits used to fsync their entry and its directory each: ~2 ms
of waiting a table, a fifth of a small table's time. Inside a sync's batch
(:func:`deferred`) they do not wait; the batch's end syncs the file system, on success or
failure (an attempt that follows in the same run keeps what this one committed).

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

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_DEPTH = 0  # deferred() scopes open; a forked worker inherits its parent's
_LAST_SYNC = 0.0


@contextlib.contextmanager
def deferred(root: str) -> Iterator[None]:
    """Driver Delta commits made meanwhile (by any thread of this process or its forked
    workers) skip their fsyncs; at the end ``root``'s file system is synced whole, on an
    exception too (a sync error there is logged, the exception raised)."""
    global _DEPTH
    with _LOCK:
        _DEPTH += 1
    try:
        yield
    except BaseException:
        try:
            _sync(root)
        except Exception:  # the batch's own error is the one to raise
            log.warning("could not sync the failed batch's files", exc_info=True)
        raise
    else:
        _sync(root)
    finally:
        with _LOCK:
            _DEPTH -= 1


def _sync(root: str) -> None:
    global _LAST_SYNC
    t0 = time.monotonic()
    sync_file_system(root)
    _LAST_SYNC = time.monotonic() - t0


def last_sync_seconds() -> float:
    """How long the last batch's sync at its end took (0 before any)."""
    return _LAST_SYNC


def deferring() -> bool:
    """Whether a batch of this process defers its commits' syncs now."""
    return _DEPTH > 0


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    "deferred",
    "deferring",
    "fsync_path",
    "last_sync_seconds",
    "sync_file_system",
]
