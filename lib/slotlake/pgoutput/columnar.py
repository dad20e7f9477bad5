"""Insert/Update/Delete payloads of one relation, split column-wise with NumPy.

:func:`slotlake.pgoutput.decode` reads one payload at a time; at ~1–2 µs of Python per
message it was most of a million-change table's batch. This module reads a whole Arrow
column of DML payloads at once: it walks every payload's TupleData in lockstep, one
column at a time, with NumPy gathers over the payload bytes (the kind byte and the
big-endian value length of column *c* of every row in one step), and hands back, per
image and column, the kind of each row's datum and the datums as an Arrow column taken
from the payloads' own bytes. No Python runs per row or per value.

It covers what nearly every batch holds: protocol messages outside a streamed
transaction, every datum text (``t``), binary (``b``, with ``binary`` on), NULL
(``n``) or unchanged TOAST (``u``). Anything else — a type byte other than I/U/D, any
malformed payload, invalid UTF-8, a column with text in some rows and binary in others
— makes :func:`split_dml` return ``None`` rather than guess: the caller then decodes that batch message by message, and the reference
decoder raises its error naming the message, field and offset. Both paths must give
the same values; the property tests in tests/unit/test_columnar_decode.py pin that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["KIND_BINARY", "KIND_NULL", "KIND_TEXT", "KIND_UNCHANGED", "DmlColumns", "split_dml"]

KIND_TEXT, KIND_NULL, KIND_UNCHANGED, KIND_BINARY = 0x74, 0x6E, 0x75, 0x62  # 't', 'n', 'u', 'b'
OP_INSERT, OP_UPDATE, OP_DELETE = 0x49, 0x55, 0x44  # 'I', 'U', 'D'
_MARK_NEW, _MARK_KEY, _MARK_OLD = 0x4E, 0x4B, 0x4F  # 'N', 'K', 'O'
_HEAD = 8  # type byte, relation oid, tuple marker, column count: an Insert's TupleData at 6
_PAD = 8  # zero bytes after the last payload: every clipped read stays inside
_R2, _R4 = np.arange(2), np.arange(4)


@dataclass(frozen=True)
class DmlColumns:
    """A batch of DML payloads of one relation, column-wise.

    ``op``: the type byte of each row (``OP_INSERT``…). ``old_kind``: ``K``/``O`` of the
    old image, 0 where there is none. ``new_kinds``/``old_kinds``: ``(ncols, rows)``
    kind bytes, ``KIND_NULL`` for a row without that image and for the columns a short
    tuple leaves out. ``new``/``old``: per column, the datums: a string column of texts
    or a binary column of binary-format datums (null unless the kind is ``KIND_TEXT`` or
    ``KIND_BINARY``).
    """

    op: np.ndarray
    old_kind: np.ndarray
    new_kinds: np.ndarray
    old_kinds: np.ndarray
    new: list[pa.Array]
    old: list[pa.Array]


def _be(buf: np.ndarray, at: np.ndarray, width: np.ndarray, dtype: str) -> np.ndarray:
    # One fancy index gathers each row's bytes contiguously; viewing them as a
    # big-endian integer reads them all at once.
    return buf[at[:, None] + width].view(dtype).ravel()


def _tuple_data(
    buf: np.ndarray, at: np.ndarray, present: np.ndarray, ncols: int, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk the TupleData at ``at`` (its column count) of every ``present`` row:
    (kinds, value starts, value lengths, end, ok) per row.

    A row without the image reads as all NULL, its values empty at ``at``: the value
    starts of a column then rise from row to row, which :func:`_datums` relies on.
    """
    rows = len(at)
    kinds = np.full((ncols, rows), KIND_NULL, np.uint8)
    starts = np.repeat(at[None, :], ncols, axis=0)
    lengths = np.zeros((ncols, rows), np.int64)
    end, ok = at.copy(), np.ones(rows, bool)
    idx = np.flatnonzero(present)
    if not len(idx) or not ncols:
        if len(idx):
            end[idx] = at[idx] + 2
            ok[idx] = _be(buf, np.minimum(at[idx], limit), _R2, ">u2") == 0
        return kinds, starts, lengths, end, ok
    every = len(idx) == rows
    pos = at if every else at[idx]
    count = _be(buf, np.minimum(pos, limit), _R2, ">u2")
    short = not (count == ncols).all()  # a tuple may leave out trailing columns
    pos = pos + 2
    for c in range(ncols):
        # Reads are clipped into the buffer: a row gone past its payload is caught by
        # the end check, whatever it read meanwhile.
        safe = np.minimum(pos, limit)
        kind = buf[safe]
        if short:
            kind = np.where(count > c, kind, KIND_NULL)
        valued = (kind == KIND_TEXT) | (kind == KIND_BINARY)
        size = np.where(valued, _be(buf, safe + 1, _R4, ">u4"), 0)
        step = np.where(valued, size + 5, 1)
        if short:
            step = np.where(count > c, step, 0)
        if every:
            kinds[c], starts[c], lengths[c] = kind, pos + 5, size
        else:
            kinds[c, idx], starts[c, idx], lengths[c, idx] = kind, pos + 5, size
        pos = pos + step
    end[idx] = pos
    known = (
        (kinds == KIND_TEXT)
        | (kinds == KIND_BINARY)
        | (kinds == KIND_NULL)
        | (kinds == KIND_UNCHANGED)
    )
    ok[idx] = count <= ncols
    ok &= known.all(axis=0)
    return kinds, starts, lengths, end, ok


class _Mixed(Exception):
    """A column with text datums in some rows and binary ones in others."""


def _datums(buf: pa.Buffer, kinds: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The datums of one column: a string column of text datums, or a binary column of
    binary-format ones (null where there is no datum).

    Within a batch, row *i*'s datum ends before row *i + 1*'s begins, so the offsets
    ``start₀, end₀, start₁, end₁, …`` rise: over the payload bytes they make a column of
    twice the rows whose even entries are the datums (the odd ones the bytes between).
    Arrow's ``take`` of the even entries copies the datums into a column of their own,
    in C++ (the cast to string then validates the UTF-8); a row without a datum is an
    empty null entry at its kind byte.
    """
    rows = len(kinds)
    text, binary = kinds == KIND_TEXT, kinds == KIND_BINARY
    is_text = bool(text.any())
    if is_text and binary.any():
        raise _Mixed
    valued = text | binary
    if not is_text and not binary.any():
        return pa.nulls(rows, pa.string())
    size = np.where(valued, lengths, 0)
    offsets = np.empty(2 * rows + 1, np.int32)
    offsets[0:-1:2] = starts
    offsets[1::2] = starts + size
    offsets[-1] = offsets[-2]
    valid = np.zeros(2 * rows, bool)
    valid[0::2] = valued
    both = pa.Array.from_buffers(
        pa.binary(),
        2 * rows,
        [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets), buf],
    )
    datums = both.take(pa.array(np.arange(0, 2 * rows, 2)))
    return datums.cast(pa.string()) if is_text else datums


def split_dml(data: pa.Array, ncols: int) -> DmlColumns | None:
    """Split ``data`` (non-streamed Insert/Update/Delete payloads of one relation whose
    Relation message has ``ncols`` columns), or ``None`` when a payload is anything
    else (see the module docstring): then decode it message by message."""
    rows = len(data)
    if data.type != pa.binary() or data.null_count:
        return None
    _, offsets_buf, data_buf = data.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, rows + 1, data.offset * 4).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    raw = np.zeros(last - first + _PAD, np.uint8)
    if data_buf is not None and last > first:
        raw[: last - first] = np.frombuffer(data_buf, np.uint8, last - first, first)
    start, end = offsets[:-1] - first, offsets[1:] - first
    limit = len(raw) - _PAD  # every clipped read of up to 12 bytes stays in the buffer

    op = raw[np.minimum(start, limit)]
    marker = raw[np.minimum(start + 5, limit)]
    is_insert, is_update, is_delete = op == OP_INSERT, op == OP_UPDATE, op == OP_DELETE
    keyed = (marker == _MARK_KEY) | (marker == _MARK_OLD)
    has_old = (is_update | is_delete) & keyed
    ok = (end - start >= _HEAD) & (
        (is_insert & (marker == _MARK_NEW))
        | (is_update & (keyed | (marker == _MARK_NEW)))
        | has_old
    )
    old_kinds, old_starts, old_lengths, old_end, old_ok = _tuple_data(
        raw, start + 6, has_old, ncols, limit
    )
    # After an Update's old image: an 'N', then the new image.
    ok &= ~(is_update & has_old) | (raw[np.minimum(old_end, limit)] == _MARK_NEW)
    has_new = is_insert | is_update
    new_at = np.where(has_old, old_end + 1, start + 6)
    new_kinds, new_starts, new_lengths, new_end, new_ok = _tuple_data(
        raw, new_at, has_new, ncols, limit
    )
    ok &= old_ok & new_ok & (np.where(has_new, new_end, old_end) == end)
    if not ok.all():
        return None
    buf = pa.py_buffer(raw)
    try:
        new = [_datums(buf, new_kinds[c], new_starts[c], new_lengths[c]) for c in range(ncols)]
        old = [_datums(buf, old_kinds[c], old_starts[c], old_lengths[c]) for c in range(ncols)]
    except (pa.ArrowInvalid, _Mixed):  # invalid UTF-8: the reference decoder names it
        return None
    return DmlColumns(
        op=op,
        old_kind=np.where(has_old, marker, 0).astype(np.uint8),
        new_kinds=new_kinds,
        old_kinds=old_kinds,
        new=new,
        old=old,
    )
