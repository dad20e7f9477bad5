"""Whole columns at a time: pyarrow compute kernels beside the per-value codecs.

The per-value converters (``Codec.from_text`` / ``from_binary``) are the reference: a
kernel here must give exactly what they give, or decline. A kernel takes one column of
raw datums as an Arrow array — ``string`` for the text format, ``binary`` for the binary
one, nulls for SQL NULL — and returns

* the converted values as an Arrow array (its own natural type: the caller casts to the
  column's, which only ever widens), and
* a boolean mask of the rows it *rejects* (or None): values outside what the vectorised
  cast can take — NaN or ±Infinity numerics, ±infinity, BC and year > 9999 dates and
  timestamps, arrays that need the full tokenizer. :func:`convert_column` runs those rows
  through the per-value codec, which also yields their Fallback text.

A kernel that meets anything it does not understand raises :class:`Decline` (or lets
Arrow's ``ArrowInvalid`` out of a cast); the column is then converted value by value,
so malformed input raises exactly the ValueError it raises today, and input Arrow reads
more leniently than Python (hex integers, year 0) never gets through a kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# (values, rejected rows or None)
Kernel = Callable[[pa.Array], tuple[pa.Array, pa.Array | None]]


class Decline(Exception):
    """The kernel cannot take this column: convert it value by value instead."""


# --- text format ----------------------------------------------------------------------


def identity(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """Types whose Python value is the datum itself (text types' text, bytea's bytes)."""
    return values, None


def utf8_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """Binary datums that are UTF-8 text: Arrow validates UTF-8 as strictly as
    ``bytes.decode`` (surrogates, overlong forms and > U+10FFFF are refused)."""
    return values.cast(pa.string()), None


def int_text_kernel(arrow_type: pa.DataType) -> Kernel:
    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        # Arrow also parses '0x1F'; Python's int() does not, so neither may the kernel.
        if pc.any(pc.match_substring(values, "x", ignore_case=True)).as_py():
            raise Decline
        return values.cast(arrow_type), None

    return kernel


def float8_text_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    # Both parsers round correctly, and read 'NaN', 'Infinity', '-Infinity' alike.
    return values.cast(pa.float64()), None


def float4_text_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """As the codec does: parse as a double, then round to float4 (not one direct parse,
    which could round differently). A finite double beyond float4 is an error there."""
    wide = values.cast(pa.float64())
    narrow = wide.cast(pa.float32())
    if pc.any(pc.and_(pc.is_inf(narrow), pc.invert(pc.is_inf(wide)))).as_py():
        raise Decline
    return narrow, None


_BOOL_TEXTS = pa.array(["t", "f"])


def bool_text_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    if not pc.all(pc.or_(pc.is_in(values, _BOOL_TEXTS), values.is_null())).as_py():
        raise Decline
    return pc.equal(values, "t"), None


_NUMERIC_SPECIALS = pa.array(["NaN", "Infinity", "-Infinity"])


def decimal_text_kernel(precision: int, scale: int) -> Kernel:
    """numeric(p,s) text → decimal128(p,s). Arrow's cast refuses to round or overflow,
    as the codec's trapping context does; NaN and ±Infinity are the codec's Fallbacks."""
    arrow_type = pa.decimal128(precision, scale)

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        special = pc.is_in(values, _NUMERIC_SPECIALS)
        if not pc.any(special).as_py():
            return values.cast(arrow_type), None
        return pc.if_else(special, None, values).cast(arrow_type), special

    return kernel


def _masked_cast(
    values: pa.Array, take: pa.Array, arrow_type: pa.DataType
) -> tuple[pa.Array, pa.Array | None]:
    """Cast the rows ``take`` marks; every other non-null row is rejected."""
    take = pc.fill_null(take, False)
    rejected = pc.and_(values.is_valid(), pc.invert(take))
    if not pc.any(rejected).as_py():
        return values.cast(arrow_type), None
    return pc.if_else(take, values, None).cast(arrow_type), rejected


def _not_year_zero(values: pa.Array) -> pa.Array:
    # Arrow reads year 0000, Python's date does not (PostgreSQL prints it as 0001 BC).
    return pc.invert(pc.starts_with(values, "0000"))


def date_text_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """'YYYY-MM-DD'; 'infinity', '-infinity', '… BC' and five-digit years are other
    lengths and go to the codec (their Fallback)."""
    take = pc.and_(pc.equal(pc.binary_length(values), 10), _not_year_zero(values))
    return _masked_cast(values, take, pa.date32())


def timestamp_text_kernel(with_zone: bool) -> Kernel:
    """'YYYY-MM-DD HH:MM:SS[.ffffff]' (+ '+00' for timestamptz, the peek session being
    UTC). The codec parses what has '-' at offset 4 and no ' BC' (so not ±infinity nor a
    year past 9999); timestamptz with another offset is left to it too, as converting
    it to UTC may leave year 9999."""
    arrow_type = pa.timestamp("us", tz="UTC" if with_zone else None)

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        take = pc.and_(
            pc.equal(pc.utf8_slice_codeunits(values, 4, 5), "-"),
            pc.invert(pc.ends_with(values, "C")),
        )
        take = pc.and_(take, _not_year_zero(values))
        if with_zone:
            take = pc.and_(take, pc.ends_with(values, "+00"))
        return _masked_cast(values, take, arrow_type)

    return kernel


# One dimension; each element bare (no quotes, escapes, whitespace, commas or braces) or
# quoted without a quote, backslash or comma inside: commas split it, as the tokenizer
# would. That is what array_out prints for most arrays (it quotes elements with spaces).
_BARE = r'[^{}",\\ \t\n\r\v\f]+'
_QUOTED = r'"[^"\\,]*"'
_SPLITTABLE_ARRAY = rf"^\{{(?:(?:{_BARE}|{_QUOTED})(?:,(?:{_BARE}|{_QUOTED}))*)?\}}$"


def array_text_kernel(element: Kernel) -> Kernel:
    """'{a,"b c",NULL}' → list: the arrays whose elements a comma split finds.

    Anything else (escapes, quotes or commas in quotes, nested braces, bounds, stray
    whitespace) and any row with an element the element kernel rejects is left to the
    codec, which also makes it a Fallback of the whole array when it must.
    """

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        simple = pc.fill_null(pc.match_substring_regex(values, _SPLITTABLE_ARRAY), False)
        rejected = pc.and_(values.is_valid(), pc.invert(simple))
        inner = pc.utf8_slice_codeunits(pc.if_else(simple, values, None), 1, -1)
        items = pc.split_pattern(inner, ",")
        # '{}' splits into one empty item (the only empty one: the pattern has none).
        keep = pc.invert(pc.equal(items.flatten(), ""))
        flat, parents = items.flatten().filter(keep), pc.list_parent_indices(items).filter(keep)
        quoted = pc.starts_with(flat, '"')
        # Only an unquoted NULL (any case) is NULL; no other letters upper-case to N/U/L.
        is_null = pc.and_(
            pc.invert(quoted),
            pc.and_(pc.equal(pc.binary_length(flat), 4), pc.equal(pc.ascii_upper(flat), "NULL")),
        )
        texts = pc.if_else(quoted, pc.utf8_slice_codeunits(flat, 1, -1), flat)
        converted, elem_rejected = element(pc.if_else(is_null, None, texts))
        if elem_rejected is not None:
            bad = pc.unique(pc.filter(parents, elem_rejected))
            row_bad = pc.is_in(pa.array(np.arange(len(values)), pa.int64()), bad)
            rejected = pc.or_(rejected, row_bad)
        lengths = np.bincount(parents.to_numpy(), minlength=len(values))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        out = pa.ListArray.from_arrays(offsets, converted, mask=pc.or_(values.is_null(), rejected))
        return out, rejected if pc.any(rejected).as_py() else None

    return kernel


# --- binary format --------------------------------------------------------------------


def _fixed(values: pa.Array, dtype: str) -> tuple[np.ndarray, pa.Buffer | None]:
    """Fixed-width big-endian datums → native NumPy values (garbage under nulls) and the
    validity bitmap. A datum of another width declines the column."""
    big = np.dtype(dtype)
    try:
        fixed = values.cast(pa.binary(big.itemsize))
    except pa.ArrowInvalid as exc:
        raise Decline from exc
    validity, data = fixed.buffers()
    raw = np.frombuffer(data, dtype=big, count=len(fixed), offset=fixed.offset * big.itemsize)
    return raw.astype(big.newbyteorder("=")), validity


def _from_numpy(
    arrow_type: pa.DataType, native: np.ndarray, validity: pa.Buffer | None, nulls: int
) -> pa.Array:
    return pa.Array.from_buffers(arrow_type, len(native), [validity, pa.py_buffer(native)], nulls)


def fixed_binary_kernel(dtype: str, arrow_type: pa.DataType, via: str | None = None) -> Kernel:
    """int2/int4/int8/oid/float4/float8 send formats: a byte swap. ``via`` is a NumPy type
    the values pass through as the codec's Python value does: float4 becomes a double
    and back, which quiets a signalling NaN."""
    native_dtype = np.dtype(arrow_type.to_pandas_dtype())

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        native, validity = _fixed(values, dtype)
        if via is not None:
            with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as in C
                native = native.astype(via)
        return _from_numpy(
            arrow_type, native.astype(native_dtype), validity, values.null_count
        ), None

    return kernel


def bool_binary_kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    native, _ = _fixed(values, "u1")
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    if (native[valid] > 1).any():
        raise Decline
    return pa.array(native == 1, mask=~valid), None


def _datums(values: pa.Array, pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A binary column as NumPy: (bytes, start and end of each datum, validity). The bytes
    are padded so that reading a ``pad``-byte header of a short datum or a null reads
    zeros instead of going out of bounds (such rows are rejected by their length)."""
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, len(values) + 1, values.offset * 4)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    return (
        np.concatenate([data, np.zeros(pad, np.uint8)]),
        offsets[:-1].astype(np.int64),
        offsets[1:].astype(np.int64),
        valid,
    )


def _big_endian(data: np.ndarray, at: np.ndarray, width: int, signed: bool = True) -> np.ndarray:
    """The ``width``-byte big-endian integers at offsets ``at`` (int64)."""
    value = np.zeros(len(at), np.int64)
    for i in range(width):
        value = (value << 8) | data[at + i]
    if signed:
        half = 1 << (8 * width - 1)
        value = (value ^ half) - half
    return value


# 10**e for the exponents a base-10000 digit can take below int64's range.
_INT64_DIGITS = 18
_POW10 = np.array([10**e for e in range(_INT64_DIGITS + 1)], dtype=np.int64)
# More base-10000 digits than 18 decimal digits (plus alignment) can need: not taken.
_MAX_NDIGITS = 8


def decimal_binary_kernel(precision: int, scale: int) -> Kernel:
    """numeric_send → decimal128(p,s), for the values whose unscaled integer fits int64.

    A datum is ndigits, weight, sign, dscale (int16 each), then base-10000 digits, the
    first worth 10000**weight. The codec prints it with exactly dscale decimals and
    quantizes that text, so a row is taken only when that is plain arithmetic here: sign
    + or −, 0 ≤ dscale ≤ s, no non-zero digit beyond dscale (the text would drop it),
    every term below 10**18 and the result below 10**p. The rest — NaN, ±Infinity and
    anything unusual — is rejected, and the codec gives its Fallback or its error.
    """
    arrow_type = pa.decimal128(precision, scale)
    # The largest weight whose digits stay below 10**18 once scaled to s: any p works,
    # for the values small enough.
    max_weight = (_INT64_DIGITS - scale) // 4 - 1
    limit = 10 ** min(precision, _INT64_DIGITS)

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        if max_weight < -1:
            raise Decline
        data, start, end, valid = _datums(values, 8)
        length = end - start
        ndigits, weight, dscale = (_big_endian(data, start + at, 2) for at in (0, 2, 6))
        sign = _big_endian(data, start + 4, 2, signed=False)
        ok = valid & (length >= 8) & (length == 8 + 2 * ndigits)
        ok &= ((sign == 0) | (sign == 0x4000)) & (dscale >= 0) & (dscale <= scale)
        ok &= (weight <= max_weight) & (ndigits <= _MAX_NDIGITS)
        unscaled = np.zeros(len(values), dtype=np.int64)
        for k in range(int(ndigits[ok].max(initial=0))):
            has = ok & (k < ndigits)
            digit = np.where(has, _big_endian(data, np.where(has, start + 8 + 2 * k, 0), 2), 0)
            ok &= digit <= 9999
            # The digit is worth digit * 10**shift; its decimal places past dscale, which
            # the text drops, must be zeros.
            shift = 4 * (weight - k)
            dropped = np.clip(-(shift + dscale), 0, 4)
            ok &= ~has | (digit % _POW10[dropped] == 0)
            up = np.clip(shift + scale, 0, _INT64_DIGITS)
            down = np.clip(-(shift + scale), 0, 4)
            unscaled += np.where(has & ok, digit // _POW10[down] * _POW10[up], 0)
        ok &= unscaled < limit
        unscaled = np.where(sign == 0x4000, -unscaled, unscaled)
        words = np.stack([unscaled, unscaled >> 63], axis=1)  # int128, little-endian words
        validity = values.buffers()[0]
        out = pa.Array.from_buffers(
            arrow_type, len(values), [validity, pa.py_buffer(words)], values.null_count
        )
        rejected = valid & ~ok
        return out, pa.array(rejected) if rejected.any() else None

    return kernel


# Elements are read position by position across all rows: longer arrays go value by value.
_MAX_ELEMENTS = 64


def array_binary_kernel(element: Kernel) -> Kernel:
    """array_send → list, for one dimension from 1 (or none: empty) and at most
    _MAX_ELEMENTS elements: ndim, has-nulls flag, element type (int32 each), then (length,
    lower bound) per dimension, then each element as its int32 length (-1: NULL) and
    bytes. The elements of all rows become one binary column for the element kernel.
    Other shapes (the codec's Fallbacks), malformed datums and rows with an element the
    element kernel rejects are rejected."""

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        data, start, end, valid = _datums(values, 20)
        ndim = _big_endian(data, start, 4)
        ok = valid & (end - start >= 12 + 8 * ndim) & ((ndim == 0) | (ndim == 1))
        count = np.where(ok & (ndim == 1), _big_endian(data, start + 12, 4), 0)
        lower = np.where(ok & (ndim == 1), _big_endian(data, start + 16, 4), 1)
        ok &= (lower == 1) & (count >= 0) & (count <= _MAX_ELEMENTS)
        at = start + 12 + 8 * ndim  # the next element's length word, row by row
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (row, start, length)
        for k in range(int(count[ok].max(initial=0))):
            has = ok & (k < count)
            ok &= ~has | (at + 4 <= end)
            has &= ok
            size = np.where(has, _big_endian(data, np.where(has, at, 0), 4), 0)
            rows = np.flatnonzero(has)
            found.append((rows, at[rows] + 4, size[rows]))
            at = np.where(has, at + 4 + np.maximum(size, 0), at)
        ok &= at == end  # no element ran past the datum, and nothing follows the last one
        row, first, size = (
            np.concatenate([f[i] for f in found] or [np.zeros(0, np.int64)]) for i in range(3)
        )
        keep = np.flatnonzero(ok[row])
        order = keep[np.argsort(row[keep], kind="stable")]  # row by row, positions in order
        row, first, size = row[order], first[order], size[order]
        nbytes = np.maximum(size, 0)
        offsets = np.zeros(len(size) + 1, np.int64)
        np.cumsum(nbytes, out=offsets[1:])
        gather = np.repeat(first - offsets[:-1], nbytes) + np.arange(offsets[-1])
        elements = pa.Array.from_buffers(
            pa.binary(),
            len(size),
            [
                pa.array(size >= 0).buffers()[1],
                pa.py_buffer(offsets.astype(np.int32)),
                pa.py_buffer(data[gather]),
            ],
        )
        converted, element_rejected = element(elements)
        if element_rejected is not None:
            ok[row[element_rejected.to_numpy(zero_copy_only=False)]] = False
        lengths = np.bincount(row, minlength=len(values))
        list_offsets = np.zeros(len(values) + 1, np.int32)
        np.cumsum(lengths, out=list_offsets[1:])
        rejected = valid & ~ok
        out = pa.ListArray.from_arrays(
            pa.array(list_offsets), converted, mask=pa.array(~valid | rejected)
        )
        return out, pa.array(rejected) if rejected.any() else None

    return kernel


def epoch_binary_kernel(
    dtype: str, arrow_type: pa.DataType, low: int, high: int, shift: int
) -> Kernel:
    """date / timestamp / timestamptz: a count from 2000-01-01 in [low, high] is shifted
    to Arrow's 1970 epoch; anything outside (±infinity, BC, past 9999) is rejected."""

    def kernel(values: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        native, validity = _fixed(values, dtype)
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        inside = (native >= low) & (native <= high)
        # Shifted after masking, so ±infinity (the type's extremes) cannot wrap around.
        shifted = np.where(inside, native, -shift) + shift
        out = _from_numpy(arrow_type, shifted, validity, values.null_count)
        rejected = valid & ~inside
        return out, pa.array(rejected) if rejected.any() else None

    return kernel
