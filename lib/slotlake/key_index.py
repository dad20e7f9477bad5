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

An index is named by its data file, that file's size and the key columns; it is written
whole and synced before it takes its name, and one that does not fit its file (another
row count, unreadable) is ignored and made again. Keys without NULLs and without repeats
in the file are indexed: a one-column integer key as its sorted values, and a text key
(uuid included: it is stored as text) or a key of several integer and text columns,
packed as bytes of at most :data:`MAX_KEY_BYTES`, in the order of a hash of theirs
(:class:`PackedIndex`: the key found is compared whole, so a hit is exact). Other keys
are read from their files; a file whose keys cannot be indexed gets a marker in place of
its index, so that it is not read for nothing again. ``slotlake maintain`` removes the indexes of files VACUUM
deleted.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

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
# A text or several-column key's index holds the keys packed (each text NUL-padded to
# the file's longest; PostgreSQL's text holds no NUL byte, and a file with one gets no
# index), beside a hash and the row position: a uuid's 36 characters make 52 bytes a row
# (Parquet stores them in about 40). Longer keys would make an index far bigger than the
# column it replaces reading: their files are read instead.
MAX_KEY_BYTES = 128
_SUFFIX = ".keys.npy"
# Kept in place of the index of a file whose keys cannot have one (:func:`_make`).
_REFUSED = np.zeros(1, dtype=np.int8)


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


def indexable(t: pa.DataType) -> bool:
    """Key column types an index is made for: integers NumPy holds as int64, and text."""
    import pyarrow as pa

    return (pa.types.is_integer(t) and not pa.types.is_uint64(t)) or _is_text(t)


def _is_text(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _integer_index(keys: pa.ChunkedArray) -> np.ndarray | None:
    """2 × rows: the keys sorted, their row positions; None if a key repeats."""
    values = keys.to_numpy().astype(np.int64, copy=False)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return None
    return np.stack([ordered, order.astype(np.int64)])


# A packed key's parts: an integer column (8 bytes) or a text column (its width).
_INTEGER, _TEXT = 0, 1


def _layout(columns: Sequence[pa.Array]) -> list[tuple[int, int]] | None:
    """Each key column's part of a file's packed keys (kind, bytes), or None when a
    column cannot be packed (a NULL, a NUL in a text: PostgreSQL's text never holds one,
    and padded it would match a shorter key; a type not indexed) or the keys would be
    longer than :data:`MAX_KEY_BYTES`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    layout = []
    for column in columns:
        if column.null_count or not indexable(column.type):
            return None
        if not _is_text(column.type):
            layout.append((_INTEGER, 8))
            continue
        binary = column.cast(pa.large_binary())
        if len(binary) and pc.any(pc.match_substring(binary, "\0")).as_py():
            return None
        layout.append((_TEXT, max(1, pc.max(pc.binary_length(binary)).as_py() or 0)))
    return layout if sum(w for _, w in layout) <= MAX_KEY_BYTES else None


def _pack(columns: Sequence[pa.Array], layout: Sequence[tuple[int, int]]) -> np.ndarray:
    """Keys of ``columns`` (none NULL, of ``layout``'s kinds and no longer than its
    widths) packed as NumPy's ``S<width>``: each integer as 8 big-endian bytes, each text
    NUL-padded to its width; equal keys, and only they, pack equal."""
    import pyarrow as pa

    rows = len(columns[0]) if columns else 0
    width = sum(w for _, w in layout)
    matrix = np.zeros((rows, width), dtype=np.uint8)
    at = 0
    for column, (kind, w) in zip(columns, layout, strict=True):
        if kind == _INTEGER:
            values = column.to_numpy(zero_copy_only=False).astype(">i8")
            matrix[:, at : at + 8] = values.view(np.uint8).reshape(rows, 8)
        else:
            padded = _padded(column.cast(pa.large_binary()), w)
            matrix[:, at : at + w] = padded.view(np.uint8).reshape(rows, w)
        at += w
    return matrix.view(f"S{width}").reshape(rows)


def _hashes(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each packed key, in NumPy's vector arithmetic (wrapping
    multiplications): the order an index keeps its keys in, whatever their shape
    (shared prefixes, small integers), with a repeat once in 2^64."""
    rows, width = len(keys), keys.dtype.itemsize
    matrix = keys.view(np.uint8).reshape(rows, width)
    h = np.full(rows, 0x9E3779B97F4A7C15 ^ width, dtype=np.uint64)
    for at in range(0, width, 8):
        # 8 bytes of every key at a time: a copy of 8 bytes a row, not of the keys
        lane = np.zeros((rows, 8), dtype=np.uint8)
        lane[:, : min(8, width - at)] = matrix[:, at : at + 8]
        h ^= lane.view("<u8").reshape(rows)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
    # splitmix64's finish: every bit of every word reaches every bit of the hash
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def _packed_index(columns: Sequence[pa.Array]) -> np.ndarray | None:
    """A text or several-column key's index (:class:`PackedIndex`'s bytes); None if the
    keys cannot be packed (:func:`_layout`) or a key repeats."""
    layout = _layout(columns)
    if layout is None:
        return None
    keys = _pack(columns, layout)
    hashes = _hashes(keys)
    order = np.argsort(hashes, kind="stable")
    same = hashes[order[1:]] == hashes[order[:-1]]
    if same.any():  # a hash that several keys have: those keys in key order
        tied = np.flatnonzero(np.r_[same, False] | np.r_[False, same])
        among = order[tied]
        order[tied] = among[np.lexsort((keys[among], hashes[among]))]
        ordered = keys[order[tied]]  # the keys of a hash of their own are not repeated
        if bool((ordered[1:] == ordered[:-1]).any()):
            return None  # a key twice (equal keys hash alike, now side by side)
    return PackedIndex.build(layout, hashes[order], order, keys, order)


class PackedIndex:
    """The index of a text key or of a key of several columns: one flat byte array
    (saved and mapped as one NumPy file) holding its row count and the key's
    :func:`_layout`, then per row in the order of their hashes the key's hash, its row
    position and the key packed (:func:`_pack`). A key asked for is packed as the file's
    keys are, its hash searched as a number (9k uuids in 2.5M: ~2 ms, where NumPy's
    search of the 36-byte strings took 8 ms), and the key found there compared whole: the
    hash only orders, it never decides."""

    def __init__(self, flat: np.ndarray) -> None:
        header = flat[:24].view("<i8")
        rows, width, parts = (int(v) for v in header)
        head = 24 + 16 * parts
        self.rows, self.width = rows, width
        self.layout = [
            (int(k), int(w)) for k, w in flat[24:head].view("<i8").reshape(parts, 2).tolist()
        ]
        # Views of the mapped file, not copies: a batch reads the pages it searches.
        self.hashes = flat[head : head + 8 * rows].view("<u8")
        self.positions = flat[head + 8 * rows : head + 16 * rows].view("<i8")
        self.keys = flat[head + 16 * rows :].view(f"S{width}")

    @staticmethod
    def fits(flat: np.ndarray, rows: int) -> bool:
        """Whether ``flat`` is a packed index of a file of ``rows`` rows."""
        if flat.ndim != 1 or flat.dtype != np.uint8 or len(flat) < 24:
            return False
        n, width, parts = (int(v) for v in flat[:24].view("<i8"))
        if n != rows or not 1 <= parts <= 64 or len(flat) < 24 + 16 * parts:
            return False
        layout = flat[24 : 24 + 16 * parts].view("<i8").reshape(parts, 2)
        return (
            bool(np.isin(layout[:, 0], (_INTEGER, _TEXT)).all())
            and int(layout[:, 1].sum()) == width
            and 1 <= width <= MAX_KEY_BYTES
            and len(flat) == 24 + 16 * parts + n * (16 + width)
        )

    @staticmethod
    def build(
        layout: Sequence[tuple[int, int]],
        hashes: np.ndarray,
        positions: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None = None,
    ) -> np.ndarray:
        """The flat bytes of an index of ``keys`` (packed, in ``hashes`` order, or put
        in it by ``order``: taken straight into the index, no copy between) at row
        ``positions``."""
        rows, width, head = len(keys), keys.dtype.itemsize, 24 + 16 * len(layout)
        flat = np.empty(head + rows * (16 + width), dtype=np.uint8)
        flat[:24].view("<i8")[:] = (rows, width, len(layout))
        flat[24:head].view("<i8")[:] = np.asarray(layout, dtype=np.int64).ravel()
        flat[head : head + 8 * rows].view("<u8")[:] = hashes
        flat[head + 8 * rows : head + 16 * rows].view("<i8")[:] = positions
        into = flat[head + 16 * rows :].view(keys.dtype)
        if order is None:
            into[:] = keys
        else:
            np.take(keys, order, out=into)
        return flat

    def find(
        self, keys: np.ndarray, hashes: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:func:`find` for keys packed as this index's (sorted by hash: faster), and
        their ``hashes`` if known."""
        none = np.empty(0, dtype=np.int64)
        if self.rows == 0 or len(keys) == 0:
            return none, none
        if hashes is None:
            hashes = _hashes(keys)
        last = self.rows - 1
        at = np.minimum(np.searchsorted(self.hashes, hashes), last)
        hit = self.keys[at] == keys
        # Not the first key of its hash, and the next key has that hash too: the keys of
        # a hash are few (once in 2^64), looked at one by one.
        for i in np.flatnonzero(~hit & (self.hashes[at] == hashes)).tolist():
            j = int(at[i]) + 1
            while j <= last and self.hashes[j] == hashes[i]:
                if self.keys[j] == keys[i]:
                    at[i], hit[i] = j, True
                    break
                j += 1
        found = np.flatnonzero(hit)
        return np.asarray(self.positions[at[found]], dtype=np.int64), found.astype(np.int64)


def _padded(binary: pa.Array, width: int) -> np.ndarray:
    """``binary`` keys (large_binary, none NULL or longer than ``width``) as NumPy's
    ``S<width>``, NUL-padded, in Arrow kernels (a row at a time would be seconds)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fill = pc.binary_repeat(
        pa.scalar(b"\0", pa.large_binary()), pc.subtract(width, pc.binary_length(binary))
    )
    whole = pc.binary_join_element_wise(binary, fill, pa.scalar(b"", pa.large_binary()))
    start = int(np.frombuffer(whole.buffers()[1], dtype=np.int64)[whole.offset])
    return np.frombuffer(whole.buffers()[2], dtype=f"S{width}", count=len(whole), offset=start)


def _make(
    table_path: str, add: dict[str, Any], columns: Sequence[str], target: str
) -> np.ndarray | None:
    """The file's keys in ``columns`` sorted over their row positions, saved at
    ``target``; None when they cannot be indexed (NULLs, repeats, a type or a length not
    indexed)."""
    from slotlake.delta_log import read_data_file

    read = read_data_file(os.path.join(table_path, unquote(add["path"])), list(columns))
    keys = [read.column(c).combine_chunks() for c in columns]
    index: np.ndarray | None = None
    if not any(k.null_count or not indexable(k.type) for k in keys):
        if len(keys) == 1 and not _is_text(keys[0].type):
            index = _integer_index(read.column(0))
        else:
            index = _packed_index(keys)
    # A file refused is marked so, or every batch would read its keys twice (here and
    # for the MERGE's join): a long text key, a NUL, a repeat stay for the file's life.
    _save(_REFUSED if index is None else index, target)
    return index


def _save(index: np.ndarray, target: str) -> None:
    """Keep ``index`` at ``target``, whole or not at all."""
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


def load(
    table_path: str,
    add: dict[str, Any],
    columns: str | Sequence[str],
    min_rows: int | None = None,
) -> np.ndarray | None:
    """The index of ``add``'s file by its key ``columns`` (physical names), made if
    missing; None when the file cannot have one (fewer than ``min_rows``, by default
    :data:`MIN_ROWS`, rows by its statistics: none without them; or keys :func:`_make`
    refuses)."""
    columns = [columns] if isinstance(columns, str) else list(columns)
    rows = _records(add)
    if rows < max(1, MIN_ROWS if min_rows is None else min_rows):
        return None
    target = index_path(table_path, add, ",".join(columns))
    try:
        index = np.load(target, mmap_mode="r", allow_pickle=False)
        if index.dtype == _REFUSED.dtype and index.shape == _REFUSED.shape:
            return None
        if _fits(index, rows):
            return index
        log.warning("key index %s does not fit its file: made again", target)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("key index %s unreadable (%s): made again", target, exc)
    return _make(table_path, add, columns, target)


def _fits(index: np.ndarray, rows: int) -> bool:
    """Whether ``index`` is an index (integer or packed) of a file of ``rows`` rows."""
    if index.dtype == np.uint8:
        return PackedIndex.fits(index, rows)
    return index.ndim == 2 and index.shape == (2, rows) and index.dtype == np.int64


def find(
    index: np.ndarray, keys: np.ndarray, hashes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The row positions of ``keys`` in an index's file, and which of ``keys`` each is.
    ``keys``: int64, or for a packed index packed as its own (:meth:`Lookup.keys`; and
    their ``hashes``, if known). Sorted keys search a mapped index several times faster
    (its pages are read in order)."""
    if index.dtype == np.uint8:
        return PackedIndex(index).find(keys, hashes)
    ordered = index[0]
    if len(ordered) == 0 or len(keys) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    at = np.searchsorted(ordered, keys)
    np.minimum(at, len(ordered) - 1, out=at)
    hit = np.flatnonzero(ordered[at] == keys)
    return np.asarray(index[1][at[hit]], dtype=np.int64), hit.astype(np.int64)


# A batch's keys in one index's form: the keys, where each is in the batch, their hashes.
_Form = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


class Lookup:
    """A batch's keys (Arrow arrays without NULLs of :func:`indexable` types, one a key
    column), put once in the form of each index they are looked up in: sorted (9k random
    keys in a 2.5M-key mapped index: 4.1 ms in their own order, 0.97 ms sorted, the sort
    included), packed as the file's keys are for a packed index."""

    def __init__(self, values: pa.Array | Sequence[pa.Array]) -> None:
        self._columns = [values] if not isinstance(values, Sequence) else list(values)
        self._integer = len(self._columns) == 1 and not _is_text(self._columns[0].type)
        self._forms: dict[tuple[tuple[int, int], ...], _Form | None] = {}

    def keys(self, index: np.ndarray) -> _Form | None:
        """The keys in ``index``'s form, sorted, where each is in the values, and their
        hashes for a packed index; None when the index is not of the values' kind."""
        if index.dtype != np.uint8:
            if not self._integer:
                return None
            layout: tuple[tuple[int, int], ...] = ()
        else:
            layout = tuple(PackedIndex(index).layout)
        if layout not in self._forms:
            self._forms[layout] = self._form(layout)
        return self._forms[layout]

    def _form(self, layout: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, np.ndarray] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not layout:
            keys = self._columns[0].to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            order = np.argsort(keys, kind="stable")
            return keys[order], order.astype(np.int64), None
        if len(layout) != len(self._columns):
            return None
        fit = np.ones(len(self._columns[0]), dtype=bool)
        for column, (kind, width) in zip(self._columns, layout, strict=True):
            if (kind == _TEXT) != _is_text(column.type):
                return None
            if kind == _TEXT:
                # A key longer than the file's longest is not in it (and would be cut
                # short), nor one with a NUL (a file with one has no index).
                binary = column.cast(pa.large_binary())
                fits = pc.and_(
                    pc.less_equal(pc.binary_length(binary), width),
                    pc.invert(pc.match_substring(binary, "\0")),
                )
                fit &= fits.to_numpy(zero_copy_only=False)
        which = np.flatnonzero(fit).astype(np.int64)
        keep = pa.array(fit)
        keys = _pack([c.filter(keep) for c in self._columns], layout)
        hashes = _hashes(keys)
        order = np.argsort(hashes, kind="stable")
        return keys[order], which[order], hashes[order]

    def find(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:func:`find` with these keys: row positions, and which of the values each is;
        None when the index is not of the values' kind."""
        form = self.keys(index)
        if form is None:
            return None
        keys, which, hashes = form
        positions, hit = find(index, keys, hashes)
        return positions, which[hit]


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
