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
row count, unreadable) is ignored and made again. Only one-column keys without NULLs and
without repeats in the file are indexed (the MERGE reads the other keys' columns): integers,
and text (uuid included: it is stored as text) of at most :data:`MAX_TEXT_BYTES` bytes,
whose index holds the keys themselves, so that a hit is exact (a hash would have to be
checked against the file). ``slotlake maintain`` removes the indexes of files VACUUM
deleted.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
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
# A text key's index holds each key NUL-padded to the file's longest one (PostgreSQL text
# holds no NUL byte, so no two keys become equal; a file with one gets no index), beside
# its row position: a uuid's 36
# characters make 44 bytes a row (Parquet stores them in about 40). Longer keys would make
# an index far bigger than the column it replaces reading: their files are read instead.
MAX_TEXT_BYTES = 128
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


def indexable(t: pa.DataType) -> bool:
    """Key types an index is made for (integers NumPy holds as int64, and text)."""
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


def _text_index(keys: pa.Array) -> np.ndarray | None:
    """A text key's index (:class:`TextIndex`'s bytes); None if a key repeats, holds a
    NUL or is longer than :data:`MAX_TEXT_BYTES`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    binary = keys.cast(pa.large_binary())
    width = max(1, pc.max(pc.binary_length(binary)).as_py() or 0)
    if width > MAX_TEXT_BYTES or pc.any(pc.match_substring(binary, "\0")).as_py():
        return None  # (a NUL in a key, which PostgreSQL's text never holds, would pad alike)
    padded = _padded(binary, width)
    low, high = pc.min_max(binary).values()
    skip = len(_common(low.as_py(), high.as_py()))
    # Sorted by their heads, then the keys whose head another key has by the whole key
    # (uuids: a few hundred in millions): 2.5M uuids 0.4 s, where NumPy's sort of the
    # strings took 1.5 times that and Arrow's three times.
    heads = _heads(padded, skip)
    order = np.argsort(heads, kind="stable")
    same = heads[order[1:]] == heads[order[:-1]]
    if same.any():
        tied = np.flatnonzero(np.r_[same, False] | np.r_[False, same])
        among = order[tied]
        order[tied] = among[np.argsort(padded[among], kind="stable")]
    ordered = padded[order]
    if len(ordered) > 1 and not bool((ordered[1:] > ordered[:-1]).all()):
        return None  # a key twice
    return TextIndex.build(ordered, order, heads[order])


class TextIndex:
    """A text key's index: one flat byte array (saved and mapped as one NumPy file)
    holding the row count and the width, then per row in key order a *head*, the row
    position and the key NUL-padded to the width. A head is the 8 bytes of a key after
    the prefix all keys of the file share, as a number: NumPy's binary search of 36-byte
    strings took 8 ms for 9k keys in 2.5M, of numbers 1-1.7 ms, and a head seldom
    leaves more than one key to compare (a uuid's is its first 8 hex digits: ~700 pairs
    of 2.5M uuids share one). Heads that more keys share send the keys asked for to a
    search of the whole keys."""

    def __init__(self, flat: np.ndarray) -> None:
        rows, width = (int(v) for v in flat[:16].view("<i8"))
        self.rows, self.width = rows, width
        # Views of the mapped file, not copies: a batch reads the pages it searches.
        self.heads = flat[16 : 16 + 8 * rows].view("<u8")
        self.positions = flat[16 + 8 * rows : 16 + 16 * rows].view("<i8")
        self.keys = flat[16 + 16 * rows :].view(f"S{width}")
        self.shared = _shared_prefix(self.keys) if rows else b""

    @staticmethod
    def fits(flat: np.ndarray, rows: int) -> bool:
        """Whether ``flat`` is a text index of a file of ``rows`` rows."""
        if flat.ndim != 1 or flat.dtype != np.uint8 or len(flat) < 16:
            return False
        n, width = (int(v) for v in flat[:16].view("<i8"))
        return n == rows and 1 <= width <= MAX_TEXT_BYTES and len(flat) == 16 + n * (16 + width)

    @staticmethod
    def build(
        ordered: np.ndarray, positions: np.ndarray, heads: np.ndarray | None = None
    ) -> np.ndarray:
        """The flat bytes of the index of ``ordered`` keys (``S<width>``, strictly
        increasing) at row ``positions`` (``heads``: theirs, if already known)."""
        rows, width = len(ordered), ordered.dtype.itemsize
        flat = np.empty(16 + rows * (16 + width), dtype=np.uint8)
        flat[:16].view("<i8")[:] = (rows, width)
        if heads is None:
            heads = _heads(ordered, len(_shared_prefix(ordered)) if rows else 0)
        flat[16 : 16 + 8 * rows].view("<u8")[:] = heads
        flat[16 + 8 * rows : 16 + 16 * rows].view("<i8")[:] = positions
        flat[16 + 16 * rows :].view(ordered.dtype)[:] = ordered
        return flat

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`find` for keys padded to this index's width (sorted: faster)."""
        none = np.empty(0, dtype=np.int64)
        if self.rows == 0 or len(keys) == 0:
            return none, none
        skip = len(self.shared)
        asked = np.arange(len(keys), dtype=np.int64)
        if skip:  # a key without the file's shared prefix is not in the file
            matrix = keys.view(np.uint8).reshape(len(keys), self.width)
            shared = np.frombuffer(self.shared, dtype=np.uint8)
            asked = np.flatnonzero((matrix[:, :skip] == shared).all(axis=1))
            if len(asked) == 0:
                return none, none
        wanted = keys[asked]
        heads = _heads(wanted, skip)
        last = self.rows - 1
        at = np.minimum(np.searchsorted(self.heads, heads), last)
        hit = self.keys[at] == wanted
        # Not found at the first key of its head, and the next key has that head too: a
        # head shared by several keys (a common stretch of characters), searched whole.
        tied = ~hit & (self.heads[at] == heads)
        tied &= self.heads[np.minimum(at + 1, last)] == heads
        tied &= at < last
        if tied.any():
            again = np.minimum(np.searchsorted(self.keys, wanted[tied]), last)
            at[tied] = again
            hit[tied] = self.keys[again] == wanted[tied]
        found = np.flatnonzero(hit)
        return np.asarray(self.positions[at[found]], dtype=np.int64), asked[found]


def _shared_prefix(ordered: np.ndarray) -> bytes:
    """The bytes every one of ``ordered`` keys (sorted, NUL-padded) starts with: those the
    first and the last share."""
    return _common(bytes(ordered[0]), bytes(ordered[-1]))


def _common(first: bytes, last: bytes) -> bytes:
    """The bytes ``first`` and ``last`` start with alike."""
    n = 0
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        n += 1
    return first[:n]


def _heads(keys: np.ndarray, skip: int) -> np.ndarray:
    """The 8 bytes of each padded key after ``skip``, big-endian as uint64: their order is
    the keys' among keys that share the first ``skip`` bytes."""
    width = keys.dtype.itemsize
    take = max(0, min(8, width - skip))
    head = np.zeros((len(keys), 8), dtype=np.uint8)
    head[:, :take] = keys.view(np.uint8).reshape(len(keys), width)[:, skip : skip + take]
    return head.view(">u8").ravel().astype("<u8")


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


def _make(table_path: str, add: dict[str, Any], column: str, target: str) -> np.ndarray | None:
    """The file's keys sorted over their row positions, saved at ``target``; None when
    the column cannot be indexed (NULLs, repeats, a type or a length not indexed)."""
    from slotlake.delta_log import read_data_file

    keys = read_data_file(os.path.join(table_path, unquote(add["path"])), [column]).column(0)
    if keys.null_count or not indexable(keys.type):
        return None
    index = _text_index(keys.combine_chunks()) if _is_text(keys.type) else _integer_index(keys)
    if index is None:
        return None
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
    """The index of ``add``'s file (its sorted keys and their row positions), made if
    missing; None when the file cannot have one (fewer than ``min_rows``, by default
    :data:`MIN_ROWS`, rows by its statistics: none without them; or a column
    :func:`_make` refuses)."""
    rows = _records(add)
    if rows < max(1, MIN_ROWS if min_rows is None else min_rows):
        return None
    target = index_path(table_path, add, column)
    try:
        index = np.load(target, mmap_mode="r", allow_pickle=False)
        if _fits(index, rows):
            return index
        log.warning("key index %s does not fit its file: made again", target)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("key index %s unreadable (%s): made again", target, exc)
    return _make(table_path, add, column, target)


def _fits(index: np.ndarray, rows: int) -> bool:
    """Whether ``index`` is an index (integer or text) of a file of ``rows`` rows."""
    if index.dtype == np.uint8:
        return TextIndex.fits(index, rows)
    return index.ndim == 2 and index.shape == (2, rows) and index.dtype == np.int64


def find(index: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row positions of ``keys`` in an index's file, and which of ``keys`` each is.
    ``keys``: int64, or for a text index its ``S<width>`` (:meth:`Lookup.keys`). Sorted
    keys search a mapped index several times faster (its pages are read in order)."""
    if index.dtype == np.uint8:
        return TextIndex(index).find(keys)
    ordered = index[0]
    if len(ordered) == 0 or len(keys) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    at = np.searchsorted(ordered, keys)
    np.minimum(at, len(ordered) - 1, out=at)
    hit = np.flatnonzero(ordered[at] == keys)
    return np.asarray(index[1][at[hit]], dtype=np.int64), hit.astype(np.int64)


class Lookup:
    """A batch's keys (an Arrow array without NULLs of an :func:`indexable` type), put
    once in the form of each index they are looked up in: sorted (9k random keys in a
    2.5M-key mapped index: 4.1 ms in their own order, 0.97 ms sorted, the sort included),
    text padded to the index's width."""

    def __init__(self, values: pa.Array) -> None:
        self._values = values
        self._text = _is_text(values.type)
        self._forms: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def keys(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys in ``index``'s form, sorted, and where each is in the values; None
        when the index is not of the values' kind."""
        if (index.dtype == np.uint8) != self._text:
            return None
        width = int(index[8:16].view("<i8")[0]) if self._text else 0
        if width not in self._forms:
            self._forms[width] = self._form(width)
        return self._forms[width]

    def _form(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self._text:
            keys = self._values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            which = np.arange(len(keys), dtype=np.int64)
        else:
            # A key longer than the file's longest is not in it (and would be cut short),
            # nor one with a NUL (a file with one has no index; padded, it would match).
            binary = self._values.cast(pa.large_binary())
            fit = pc.and_(
                pc.less_equal(pc.binary_length(binary), width),
                pc.invert(pc.match_substring(binary, "\0")),
            )
            which = np.flatnonzero(fit.to_numpy(zero_copy_only=False)).astype(np.int64)
            keys = _padded(binary.filter(fit), width)
        order = np.argsort(keys, kind="stable")
        return keys[order], which[order]

    def find(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:func:`find` with these keys: row positions, and which of the values each is;
        None when the index is not of the values' kind."""
        form = self.keys(index)
        if form is None:
            return None
        keys, which = form
        positions, hit = find(index, keys)
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
