"""Sorted keys of the data files of a keyed state MERGEd with deletion vectors, so that
a MERGE finds random keys without reading every key of the table.

A batch of random updates touches every data file of a big state, and Delta's statistics
(one minimum and maximum a file) prune none of them: the driver's MERGE read the whole key
column to find the rows it replaces (5M rows: DuckDB's join 44-58 ms, of which the read is
25 ms), so a batch cost what the table weighs. A Delta data file never changes once
written (a deletion vector hides rows, their positions stay), so the file's keys sorted,
with each key's row position, stay true for as long as the file exists. They are kept
beside the table, one NumPy file a data file, under ``_slotlake_keys/`` (a directory whose
name starts with ``_``: Delta's readers and its VACUUM leave it alone), made the first time
a MERGE looks into the file (the small file each batch adds too: every later batch looks
into it until OPTIMIZE) and then mapped, not read: a batch's keys are found by a binary
search each (10k keys in a 2.5M-row file: well under a millisecond).

An index is named by its data file, that file's size and the key column; it is written
whole and synced before it takes its name, and one that does not fit its file (another
row count, unreadable) is ignored and made again. Only one-column integer keys
without NULLs and without repeats in the file are indexed (the MERGE reads the other keys'
columns). ``slotlake maintain`` removes the indexes of files VACUUM deleted.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

log = logging.getLogger(__name__)

DIRECTORY = "_slotlake_keys"
# A MERGE indexes every file it looks into with at least this many rows. A file of a
# state MERGEd with deletion vectors is looked into again by each later batch whose keys
# its statistics allow (random keys: every batch) until OPTIMIZE replaces it, so even a
# batch's small file repays its index: made once in 1.6-3.4 ms (the fsync most of it),
# then found in 0.12-0.25 ms where reading its key column took 0.24-0.57 ms (5 to 10k
# rows), and DuckDB's join of four or more such files 2.4 ms and more (plus ~36 ms to
# import it in a process that had no other use for it).
MIN_ROWS = 1
# The bootstrap and ``slotlake maintain`` make indexes ahead only for files this big: a
# state they write with smaller files is small enough to be rewritten by a MERGE (no
# lookup of its files) or pays little for the first MERGE making them.
AHEAD_MIN_ROWS = 1 << 18
_SUFFIX = ".keys.npy"


def index_path(table_path: str, add: dict[str, Any], column: str) -> str:
    """Where the index of the live file ``add`` (its ``add`` action) by ``column`` (its
    physical name: a replica identity moved to another column finds no old index) is
    kept."""
    name = quote(unquote(add["path"]), safe="")
    by = quote(column, safe="").replace(".", "%2E")
    return os.path.join(table_path, DIRECTORY, f"{name}.{int(add['size'])}.{by}{_SUFFIX}")


def _records(add: dict[str, Any]) -> int:
    """A file's row count from its statistics (0 when it has none)."""
    stats = add.get("stats")
    return int(json.loads(stats).get("numRecords") or 0) if stats else 0


def _make(table_path: str, add: dict[str, Any], column: str, target: str) -> np.ndarray | None:
    """The file's keys sorted over their row positions, saved at ``target``; None when
    the column cannot be indexed (NULLs, repeats, not integers)."""
    import pyarrow as pa

    from slotlake.delta_log import read_data_file

    keys = read_data_file(os.path.join(table_path, unquote(add["path"])), [column]).column(0)
    if keys.null_count or not pa.types.is_integer(keys.type) or pa.types.is_uint64(keys.type):
        return None
    values = keys.to_numpy().astype(np.int64, copy=False)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return None
    index = np.stack([ordered, order.astype(np.int64)])
    scratch = f"{target}.{uuid.uuid4().hex}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(scratch, "xb") as f:
            np.save(f, index, allow_pickle=False)
            # On disk before its name: a crash leaves no index, never a torn one that
            # would find the wrong rows.
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, target)  # a reader sees a whole index or none
    except OSError as exc:  # a cache: the batch goes on with the index it made
        log.warning("key index %s not kept (%s)", target, exc)
    return index


def load(
    table_path: str, add: dict[str, Any], column: str, min_rows: int | None = None
) -> np.ndarray | None:
    """The index of ``add``'s file (2 × rows: sorted keys, their row positions), made if
    missing; None when the file cannot have one (fewer than ``min_rows``, by default
    :data:`MIN_ROWS`, rows by its statistics: none without them; or a column
    :func:`_make` refuses)."""
    rows = _records(add)
    if rows < max(1, MIN_ROWS if min_rows is None else min_rows):
        return None
    target = index_path(table_path, add, column)
    try:
        index = np.load(target, mmap_mode="r", allow_pickle=False)
        fits = index.ndim == 2 and index.shape[0] == 2 and index.dtype == np.int64
        if fits and index.shape[1] == rows:
            return index
        log.warning("key index %s does not fit its file: made again", target)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("key index %s unreadable (%s): made again", target, exc)
    return _make(table_path, add, column, target)


def find(index: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row positions of ``keys`` (int64) in an index's file, and which of ``keys``
    each is. Sorted keys search a mapped index several times faster (its pages are
    read in order)."""
    ordered = index[0]
    if len(ordered) == 0 or len(keys) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    at = np.searchsorted(ordered, keys)
    np.minimum(at, len(ordered) - 1, out=at)
    hit = np.flatnonzero(ordered[at] == keys)
    return np.asarray(index[1][at[hit]], dtype=np.int64), hit.astype(np.int64)


def prune(table_path: str) -> int:
    """Remove the indexes (and unfinished ones) whose data file is gone; how many."""
    folder = os.path.join(table_path, DIRECTORY)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if name.endswith(".tmp"):
            gone = True
        else:
            data = name[: -len(_SUFFIX)].rsplit(".", 2)[0] if name.endswith(_SUFFIX) else ""
            gone = not data or not os.path.exists(os.path.join(table_path, unquote(data)))
        if gone:
            try:
                os.remove(os.path.join(folder, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed
