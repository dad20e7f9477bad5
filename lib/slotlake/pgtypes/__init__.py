"""PostgreSQL column values → the Python values of their Spark types.

Pure Python over the values of a pgoutput tuple: ``str`` when the slot is read with
``binary=false`` (type output functions), ``bytes`` with ``binary=true`` (type send
functions). Both give identical results. The text formats assumed are those of the peek
session: ``DateStyle='ISO, YMD'``, ``TimeZone='UTC'``, ``IntervalStyle='iso_8601'``,
``extra_float_digits=3``, ``bytea_output='hex'``, ``lc_monetary='C'``, database encoding
UTF8.

No value is ever silently changed. A value the column's Spark type cannot hold becomes
:class:`Fallback` carrying PostgreSQL's exact text for it (rendered from the binary datum
when needed); malformed input raises ``ValueError`` naming the type and the value.
Types mapped to string keep the server's text as is: it is PostgreSQL's own output, so
it is not re-validated (their binary datums are checked while rendered).

Type mapping (Markdown, for the README)
---------------------------------------

| PostgreSQL | Spark | Kept as Fallback text / notes |
|---|---|---|
| bool | boolean | |
| int2, int4, int8 | smallint, int, bigint | |
| oid, xid, cid | bigint | unsigned 32-bit |
| xid8 | bigint | values > 2^63-1 (theoretical) |
| float4, float8 | float, double | NaN and ±Infinity are floats |
| numeric(p,s), p ≤ 38 and 0 ≤ s ≤ p | decimal(p,s) | NaN, Infinity, -Infinity |
| numeric, numeric(p > 38), numeric with s < 0 or s > p | string | PostgreSQL's exact text |
| money | decimal(19,2) | '-$1,234.56' → -1234.56 |
| text, varchar, bpchar, name, "char" | string | bpchar keeps its padding |
| bytea | binary | |
| date | date | ±infinity, BC, year > 9999 |
| timestamp | timestamp_ntz | ±infinity, BC, year > 9999 |
| timestamptz | timestamp (UTC) | ±infinity, BC, year > 9999 |
| time, timetz | string | '12:00:00.5', '12:00:00+05:30' |
| interval | string | ISO 8601 as PostgreSQL prints it: 'P1Y2M3DT4H5M6.5S', 'PT0S' |
| uuid | string | lowercase, dashed |
| json, jsonb, xml | string | |
| inet, cidr | string | as PostgreSQL prints them |
| macaddr, macaddr8 | string | lowercase, colon-separated |
| bit, varbit | string | '0101' |
| pg_lsn | string | '16/B374D848' |
| T[] for T above | array<T's Spark type> | the whole array when it has more than one dimension, a lower bound other than 1, or an element that falls back |
| enum | string | the label |
| domain | its base type | a domain column's typmod is -1, so a domain over numeric(10,2) is unconstrained numeric → string |
| anything else (extension types, point, tsvector, ranges, …) | string | text format verbatim; binary: see below |

Types PostgreSQL does not ship in pg_catalog, and builtin types without a mapping, are
strings. Their text format is kept verbatim, but their binary send formats are opaque: a
builtin unmapped type, or an extension type whose binary datum is not NUL-free UTF-8
(hstore, PostGIS…), becomes ``'\\x'`` + hex of the bytes. Enums and text-like extension
types (citext) send their text, so they come out the same either way. Arrays of domains
or of extension types are ``array<string>``: the elements' text with binary=false, their
send format by the same rule with binary=true (a domain over int4 sends 4 binary bytes,
so hex). **Replicate extension types, and arrays of domains, with binary=false.**

Usage: ``resolve_type(oid, typmod, type_names).convert(value)``. ``resolve_type`` is
cached and does all lookups up front; the converters it returns do no name lookups.
``.convert_column(values, arrow_type)`` converts a whole column: through the type's
pyarrow kernel (``_vector``) where it has one, value by value for the rest, with the
same results.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import DecimalException
from typing import TYPE_CHECKING

from . import _datetime as dt
from . import _scalars as sc
from ._arrays import array_codec, parse_array_text, quote_element, render_array_text
from ._codec import Codec, Fallback
from ._vector import Decline

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Fallback",
    "PgType",
    "parse_array_text",
    "quote_element",
    "render_array_text",
    "resolve_type",
    "spark_ddl_for",
]

# name → (oid, array oid, codec factory taking the typmod)
_CodecFactory = Callable[[int], Codec]


def _const(codec: Codec) -> _CodecFactory:
    return lambda _typmod: codec


_BUILTINS: dict[str, tuple[int, int, _CodecFactory]] = {
    "bool": (16, 1000, _const(sc.BOOL)),
    "bytea": (17, 1001, _const(sc.BYTEA)),
    "char": (18, 1002, _const(sc.CHAR)),
    "name": (19, 1003, _const(sc.TEXT)),
    "int8": (20, 1016, _const(sc.INT8)),
    "int2": (21, 1005, _const(sc.INT2)),
    "int4": (23, 1007, _const(sc.INT4)),
    "text": (25, 1009, _const(sc.TEXT)),
    "oid": (26, 1028, _const(sc.UINT4)),
    "xid": (28, 1011, _const(sc.UINT4)),
    "cid": (29, 1012, _const(sc.UINT4)),
    "json": (114, 199, _const(sc.JSON)),
    "xml": (142, 143, _const(sc.XML)),
    "cidr": (650, 651, _const(sc.INET)),
    "float4": (700, 1021, _const(sc.FLOAT4_CODEC)),
    "float8": (701, 1022, _const(sc.FLOAT8_CODEC)),
    "macaddr8": (774, 775, _const(sc.MACADDR8)),
    "money": (790, 791, _const(sc.MONEY)),
    "macaddr": (829, 1040, _const(sc.MACADDR)),
    "inet": (869, 1041, _const(sc.INET)),
    "bpchar": (1042, 1014, _const(sc.TEXT)),
    "varchar": (1043, 1015, _const(sc.TEXT)),
    "date": (1082, 1182, _const(dt.DATE)),
    "time": (1083, 1183, _const(dt.TIME)),
    "timestamp": (1114, 1115, _const(dt.TIMESTAMP)),
    "timestamptz": (1184, 1185, _const(dt.TIMESTAMPTZ)),
    "interval": (1186, 1187, _const(dt.INTERVAL)),
    "timetz": (1266, 1270, _const(dt.TIMETZ)),
    "bit": (1560, 1561, _const(sc.BIT)),
    "varbit": (1562, 1563, _const(sc.BIT)),
    "numeric": (1700, 1231, sc.numeric_codec),
    "uuid": (2950, 2951, _const(sc.UUID)),
    "pg_lsn": (3220, 3221, _const(sc.PG_LSN)),
    "jsonb": (3802, 3807, _const(sc.JSONB)),
    "xid8": (5069, 271, _const(sc.XID8)),
}
_BY_OID: dict[int, tuple[str, _CodecFactory]] = {}
for _name, (_oid, _array_oid, _factory) in _BUILTINS.items():
    _BY_OID[_oid] = (_name, _factory)
    _BY_OID[_array_oid] = (
        "_" + _name,
        (lambda factory: lambda typmod: array_codec(factory(typmod)))(_factory),
    )
_BY_NAME: dict[str, tuple[str, _CodecFactory]] = {entry[0]: entry for entry in _BY_OID.values()}
_CATALOG_NAMESPACES = ("", "pg_catalog")

# Everything a converter can raise on malformed input; reported as one ValueError.
_CONVERSION_ERRORS = (
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    DecimalException,
    struct.error,
)


def _describe(value: str | bytes) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


@dataclass(frozen=True)
class PgType:
    """A resolved column type: its Spark type and converters for both tuple formats."""

    oid: int
    typmod: int
    name: str
    spark_ddl: str
    _codec: Codec = field(repr=False, compare=False)
    _described: tuple[str, str] | None = field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Converters are closures; ship the resolution key instead (e.g. to Spark
        # executors) and resolve again on arrival.
        names = None if self._described is None else {self.oid: self._described}
        return resolve_type, (self.oid, self.typmod, names)

    @property
    def may_fall_back(self) -> bool:
        """Whether some value of the type is kept as a lossless text fallback."""
        return self._codec.may_fall_back

    def _error(self, value: str | bytes, exc: Exception) -> ValueError:
        kind = "text" if isinstance(value, str) else "binary"
        return ValueError(
            f"cannot convert {kind} value {_describe(value)} of PostgreSQL type "
            f"{self.name} (oid {self.oid}): {exc}"
        )

    def from_text(self, value: str) -> object:
        """A text-format datum → the Python value of ``spark_ddl``, or a Fallback."""
        try:
            return self._codec.from_text(value)
        except _CONVERSION_ERRORS as exc:
            raise self._error(value, exc) from exc

    def from_binary(self, value: bytes) -> object:
        """A binary (send) datum → the same result ``from_text`` gives for that datum."""
        try:
            return self._codec.from_binary(value)
        except _CONVERSION_ERRORS as exc:
            raise self._error(value, exc) from exc

    def convert(self, value: str | bytes) -> object:
        try:
            if type(value) is str:
                return self._codec.from_text(value)
            return self._codec.from_binary(value)  # type: ignore[arg-type]
        except _CONVERSION_ERRORS as exc:
            raise self._error(value, exc) from exc

    def convert_column(
        self,
        values: Sequence[str | bytes | None] | pa.Array,
        target: pa.DataType,
        keep_text: bool = False,
    ) -> tuple[pa.Array, dict[int, str]]:
        """A column of datums → (Arrow array of ``target``, {row: Fallback text}).

        The same values as ``pa.array([convert(v) …], target)`` with every Fallback a
        null (its text in the dict), but through the type's vectorised kernel (see
        ``_vector``) where it has one: only the rows the kernel rejects — NaN,
        infinities, BC, years past 9999, arrays needing the tokenizer — and columns it
        declines go value by value. ``target`` may widen the type (a column whose type
        changed). ``keep_text`` is a column forced to string by a type change: text
        datums are kept as they are, binary ones converted and printed with ``str``.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        arrow_in: pa.Array | None = None
        if isinstance(values, pa.Array):
            # A column already in Arrow (the bootstrap's CSV reader, the column-wise
            # decoder): straight to the text or binary kernel; only its rejected rows are
            # read back into Python.
            if values.null_count == len(values):
                return pa.nulls(len(values), target), {}
            if keep_text or not (
                pa.types.is_string(values.type) or pa.types.is_binary(values.type)
            ):
                values = values.to_pylist()
            else:
                arrow_in = values
        if arrow_in is not None:
            kinds = {str} if pa.types.is_string(arrow_in.type) else {bytes}
        else:
            kinds = set(map(type, values))
        kinds.discard(type(None))
        everything = range(len(values))
        if not kinds:
            return pa.nulls(len(values), target), {}
        if keep_text:
            if kinds == {str}:
                return pa.array(values, pa.string()).cast(target), {}
            return self._per_value(values, everything, target, keep_text)
        kernel = (
            self._codec.vector_text
            if kinds == {str}
            else self._codec.vector_binary
            if kinds == {bytes}
            else None
        )
        if kernel is None:
            return self._per_value(_pylist(values), everything, target)
        try:
            converted, rejected = kernel(
                arrow_in
                if arrow_in is not None
                else pa.array(values, pa.string() if kinds == {str} else pa.binary())
            )
        except (Decline, pa.ArrowInvalid):
            return self._per_value(_pylist(values), everything, target)
        converted = converted.cast(target)
        rows = (
            np.flatnonzero(rejected.to_numpy(zero_copy_only=False)) if rejected is not None else ()
        )
        if not len(rows):
            return converted, {}
        if arrow_in is not None:
            patch, fallbacks = self._per_value(
                dict(zip(rows.tolist(), arrow_in.take(pa.array(rows)).to_pylist(), strict=True)),
                rows,
                target,
            )
        else:
            patch, fallbacks = self._per_value(values, rows, target)
        # Row r of the result is row r of `converted`, or the per-value result of a rejected row.
        pick = np.arange(len(values))
        pick[rows] = len(values) + np.arange(len(rows))
        return pc.take(pa.concat_arrays([converted, patch]), pa.array(pick)), fallbacks

    def _per_value(
        self,
        values: Sequence[str | bytes | None] | Mapping[int, str | None],
        rows: Sequence[int],
        target: pa.DataType,
        keep_text: bool = False,
    ) -> tuple[pa.Array, dict[int, str]]:
        """The reference path over ``rows``: (their values as ``target``, {row: Fallback text})."""
        import pyarrow as pa

        out: list[object] = []
        fallbacks: dict[int, str] = {}
        for row in rows:
            raw = values[row]
            if raw is None:
                out.append(None)
            elif keep_text and type(raw) is str:
                out.append(raw)
            else:
                value = self.convert(raw)
                if isinstance(value, Fallback):
                    fallbacks[int(row)] = value.text
                    out.append(None)
                else:
                    out.append(str(value) if keep_text else value)
        return pa.array(out, target), fallbacks

    def binary_to_text(self, value: bytes) -> str:
        """PostgreSQL's text for a binary datum (what a Fallback of it carries)."""
        try:
            return self._codec.binary_text(value)
        except _CONVERSION_ERRORS as exc:
            raise self._error(value, exc) from exc


def _pylist(values: Sequence[str | bytes | None] | pa.Array) -> Sequence[str | bytes | None]:
    """The datums as a Python sequence (an Arrow column read back, for the per-value path)."""
    import pyarrow as pa

    return values.to_pylist() if isinstance(values, pa.Array) else values


def _resolve_name(namespace: str, name: str) -> tuple[str, _CodecFactory]:
    """A type known only by its Type message: an enum, a domain's base type, an extension."""
    if namespace in _CATALOG_NAMESPACES and name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith("_") and len(name) > 1:
        # An array of a user type (enum, domain, extension): elements are kept as text.
        return name, lambda _typmod: array_codec(sc.USER)
    return name, lambda _typmod: sc.USER


_CACHE: dict[tuple[int, int, tuple[str, str] | None], PgType] = {}


def resolve_type(
    type_oid: int, typmod: int, type_names: Mapping[int, tuple[str, str]] | None = None
) -> PgType:
    """The PgType of a Relation message column.

    ``type_names`` maps oid → (namespace, name) from the Type messages seen so far; only
    the entry for ``type_oid`` matters, and it is part of the cache key.
    """
    described = type_names.get(type_oid) if type_names and type_oid not in _BY_OID else None
    key = (type_oid, typmod, described)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    if type_oid in _BY_OID:
        name, factory = _BY_OID[type_oid]
    elif described is not None:
        name, factory = _resolve_name(*described)
    else:
        # A builtin we do not map (point, tsvector, ranges…), or a user type whose
        # Type message was not passed: kept as text, binary as hex.
        name, factory = f"oid{type_oid}", lambda _typmod: sc.UNKNOWN
    codec = factory(typmod)
    resolved = PgType(type_oid, typmod, name, codec.spark_ddl, codec, described)
    _CACHE[key] = resolved
    return resolved


def spark_ddl_for(
    type_oid: int, typmod: int, type_names: Mapping[int, tuple[str, str]] | None = None
) -> str:
    return resolve_type(type_oid, typmod, type_names).spark_ddl
