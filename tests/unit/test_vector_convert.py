"""The vectorised column conversion equals the per-value one (hypothesis).

``PgType.convert_column`` runs a whole column through the type's pyarrow kernel and only
the rows it rejects through ``PgType.convert``. For random columns of every supported
type, as PostgreSQL sends them in both formats — binary datums built with ``struct``, and
their text as the codecs print it (``binary_to_text``, checked against the server by the
live tests) — the result must be exactly ``pa.array([convert(v) …])`` with each Fallback a
null and its text reported: values (floats by their bits), Arrow types and Fallback texts.
Malformed or merely unusual input must fail in both or in neither.
"""

from __future__ import annotations

import math
import struct
from datetime import date as datetime_date
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slotlake.ddltypes import parse_type
from slotlake.pgtypes import Fallback, PgType, resolve_type
from tests.unit.test_pgtypes import array_binary, numeric_binary, pg_days, typmod_numeric

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
USECS_PER_DAY = 86_400_000_000
# PostgreSQL's own ranges: 4714-11-24 BC to 5874897-12-31 (date), to 294276 (timestamp).
PG_MIN_DAYS, PG_MAX_DAYS = -2_451_545, 2_145_031_948
PG_MIN_USECS, PG_MAX_USECS = -211_813_488_000_000_000, 9_223_371_331_200_000_000 - 1
# Python's (and so the typed columns') range: 0001-01-01 to 9999-12-31.
PY_MIN_DAYS, PY_MAX_DAYS = pg_days(1, 1, 1), pg_days(9999, 12, 31)


def reference(
    pg: PgType, values: list[Any], target: pa.DataType, keep_text: bool = False
) -> tuple[pa.Array, dict[int, str]]:
    """What the per-value path gives: ``convert`` each datum, a Fallback is a null."""
    out: list[Any] = []
    fallbacks: dict[int, str] = {}
    for row, raw in enumerate(values):
        if raw is None or (keep_text and isinstance(raw, str)):
            out.append(raw)
            continue
        value = pg.convert(raw)
        if isinstance(value, Fallback):
            fallbacks[row] = value.text
            out.append(None)
        else:
            out.append(str(value) if keep_text else value)
    return pa.array(out, target), fallbacks


def exact(value: Any) -> Any:
    """A Python value with floats replaced by their bits (NaN ≠ NaN, and -0.0 == 0.0)."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, list):
        return [exact(v) for v in value]
    return value


def assert_same(
    pg: PgType, values: list[Any], target: pa.DataType, keep_text: bool = False
) -> None:
    want_array, want_fallbacks = reference(pg, values, target, keep_text)
    got_array, got_fallbacks = pg.convert_column(values, target, keep_text)
    assert got_array.type == want_array.type
    assert len(got_array) == len(values)
    assert exact(got_array.to_pylist()) == exact(want_array.to_pylist())
    assert got_fallbacks == want_fallbacks


def same_failure_or_result(pg: PgType, values: list[Any], target: pa.DataType) -> None:
    """Malformed input: an error in both paths, or the same result."""
    try:
        reference(pg, values, target)
    except (ValueError, OverflowError, pa.ArrowInvalid):
        with pytest.raises((ValueError, OverflowError, pa.ArrowInvalid)):
            pg.convert_column(values, target)
        return
    assert_same(pg, values, target)


# --- datums, as PostgreSQL sends them ---------------------------------------------------


def packed(fmt: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    layout = struct.Struct(fmt)
    return values.map(lambda v: layout.pack(v))


def around(*points: int, spread: int = 2) -> list[int]:
    return [p + d for p in points for d in range(-spread, spread + 1)]


def days() -> st.SearchStrategy[int]:
    edges = [INT32_MIN, INT32_MAX, 0, *around(PY_MIN_DAYS, PY_MAX_DAYS, PG_MIN_DAYS + 2)]
    edges += [pg_days(-43, 3, 15), pg_days(0, 12, 31), pg_days(10000, 1, 1)]
    return st.sampled_from(edges) | st.integers(PG_MIN_DAYS, PG_MAX_DAYS)


def usecs() -> st.SearchStrategy[int]:
    low, high = PY_MIN_DAYS * USECS_PER_DAY, (PY_MAX_DAYS + 1) * USECS_PER_DAY
    edges = [INT64_MIN, INT64_MAX, 0, -1, *around(low, high - 1, PG_MIN_USECS + 2)]
    modern = st.integers(pg_days(1900, 1, 1) * USECS_PER_DAY, pg_days(2100, 1, 1) * USECS_PER_DAY)
    return st.sampled_from(edges) | modern | st.integers(PG_MIN_USECS, PG_MAX_USECS)


def decimal_text(unscaled: int, scale: int) -> str:
    """'-12.34' for (-1234, 2), exactly (Decimal arithmetic would round at 28 digits)."""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    text = digits[: len(digits) - scale] + ("." + digits[len(digits) - scale :] if scale else "")
    return ("-" if unscaled < 0 else "") + text


def decimals(precision: int, scale: int) -> st.SearchStrategy[bytes]:
    """numeric(p,s) datums: values of at most p digits with s decimals, huge and tiny ones,
    NaN and ±Infinity (which numeric(p,s) holds since PostgreSQL 14)."""
    bound = 10**precision - 1
    edges = [0, 1, -1, bound, -bound, 10 ** (precision - 1)]
    unscaled = st.sampled_from(edges) | st.integers(-bound, bound) | st.integers(-999, 999)
    finite = unscaled.map(lambda u: numeric_binary(decimal_text(u, scale), scale))
    return finite | st.sampled_from(["NaN", "Infinity", "-Infinity"]).map(numeric_binary)


PG_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=20,
)
ELEMENT_TEXT = PG_TEXT | st.sampled_from(
    ["NULL", "null", "NuLl", "", " ", "a b", "\\", '"', "{", "}", ",", "\v", "\f", "é", "NULLx"]
)


def array_of(element_oid: int, elements: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """array_send datums: mostly one dimension from 1, sometimes empty, two-dimensional
    or with another lower bound (whole-array Fallbacks)."""
    items = st.lists(st.none() | elements, max_size=6)
    one = items.map(lambda e: array_binary(element_oid, [(len(e), 1)] if e else [], e))
    lower = st.tuples(items.filter(bool), st.integers(-3, 3)).map(
        lambda p: array_binary(element_oid, [(len(p[0]), p[1])], p[0])
    )
    square = st.lists(st.none() | elements, min_size=4, max_size=4).map(
        lambda e: array_binary(element_oid, [(2, 1), (2, 1)], e)
    )
    return st.one_of(one, one, one, lower, square)


TEXT_BYTES = PG_TEXT.map(str.encode)
INT4_BYTES = packed(">i", st.integers(INT32_MIN, INT32_MAX))
INT8_BYTES = packed(">q", st.integers(INT64_MIN, INT64_MAX))
FLOAT4_BYTES = packed(">f", st.floats(width=32)) | packed(">I", st.integers(0, 2**32 - 1))
FLOAT8_BYTES = packed(">d", st.floats()) | packed(">Q", st.integers(0, 2**64 - 1))
BOOL_BYTES = st.sampled_from([b"\x00", b"\x01"])
DATE_BYTES = packed(">i", days())
TIMESTAMP_BYTES = packed(">q", usecs())
N12_2 = typmod_numeric(12, 2)

# (id, oid, typmod, Type-message names, binary datums); the column type is the codec's.
CASES: list[tuple[str, int, int, dict[int, tuple[str, str]] | None, st.SearchStrategy[bytes]]] = [
    ("bool", 16, -1, None, BOOL_BYTES),
    ("int2", 21, -1, None, packed(">h", st.integers(-(2**15), 2**15 - 1))),
    ("int4", 23, -1, None, INT4_BYTES),
    ("int8", 20, -1, None, INT8_BYTES),
    ("oid", 26, -1, None, packed(">I", st.integers(0, 2**32 - 1))),
    ("xid8", 5069, -1, None, packed(">Q", st.integers(0, 2**64 - 1))),
    ("float4", 700, -1, None, FLOAT4_BYTES),
    ("float8", 701, -1, None, FLOAT8_BYTES),
    ("numeric(12,2)", 1700, N12_2, None, decimals(12, 2)),
    ("numeric(18,0)", 1700, typmod_numeric(18, 0), None, decimals(18, 0)),
    ("numeric(18,18)", 1700, typmod_numeric(18, 18), None, decimals(18, 18)),
    ("numeric(38,10)", 1700, typmod_numeric(38, 10), None, decimals(38, 10)),
    ("numeric(38,0)", 1700, typmod_numeric(38, 0), None, decimals(38, 0)),
    ("numeric(30,25)", 1700, typmod_numeric(30, 25), None, decimals(30, 25)),
    ("numeric", 1700, -1, None, decimals(38, 6)),
    ("money", 790, -1, None, INT8_BYTES),
    ("text", 25, -1, None, TEXT_BYTES),
    ("varchar", 1043, 44, None, TEXT_BYTES),
    ("bpchar", 1042, 14, None, TEXT_BYTES),
    ("name", 19, -1, None, TEXT_BYTES),
    ("json", 114, -1, None, TEXT_BYTES),
    ("jsonb", 3802, -1, None, TEXT_BYTES.map(lambda b: b"\x01" + b)),
    ("bytea", 17, -1, None, st.binary(max_size=20)),
    ("uuid", 2950, -1, None, st.binary(min_size=16, max_size=16)),
    ("date", 1082, -1, None, DATE_BYTES),
    ("timestamp", 1114, -1, None, TIMESTAMP_BYTES),
    ("timestamptz", 1184, -1, None, TIMESTAMP_BYTES),
    ("time", 1083, -1, None, packed(">q", st.integers(0, USECS_PER_DAY))),
    ("point (unmapped)", 600, -1, None, st.binary(min_size=16, max_size=16)),
    ("enum", 90001, -1, {90001: ("public", "mood")}, TEXT_BYTES),
    ("text[]", 1009, -1, None, array_of(25, ELEMENT_TEXT.map(str.encode))),
    ("varchar[]", 1015, 24, None, array_of(1043, ELEMENT_TEXT.map(str.encode))),
    ("int4[]", 1007, -1, None, array_of(23, INT4_BYTES)),
    ("int8[]", 1016, -1, None, array_of(20, INT8_BYTES)),
    ("float8[]", 1022, -1, None, array_of(701, FLOAT8_BYTES)),
    ("bool[]", 1000, -1, None, array_of(16, BOOL_BYTES)),
    ("numeric(12,2)[]", 1231, N12_2, None, array_of(1700, decimals(12, 2))),
    ("date[]", 1182, -1, None, array_of(1082, DATE_BYTES)),
    ("timestamptz[]", 1185, -1, None, array_of(1184, TIMESTAMP_BYTES)),
    ("bytea[]", 1001, -1, None, array_of(17, st.binary(max_size=6))),
    ("mood[] (enum array)", 90002, -1, {90002: ("public", "_mood")}, array_of(0, TEXT_BYTES)),
]


def pg_type(case: tuple[Any, ...]) -> PgType:
    _, oid, typmod, names, _ = case
    return resolve_type(oid, typmod, names)


def arrow_type(pg: PgType) -> pa.DataType:
    """The column's Arrow type, as Spark's to_arrow_schema maps the codec's Spark type."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(parse_type(pg.spark_ddl), timezone="UTC")


def in_format(pg: PgType, datum: bytes, binary: bool) -> str | bytes:
    return datum if binary else pg.binary_to_text(datum)


def draw_column(
    data: st.DataObject, case: tuple[Any, ...], binary: bool, size: int
) -> tuple[PgType, list[str | bytes | None]]:
    """The case's type and a column of its datums (NULLs among them) in one format."""
    pg = pg_type(case)
    datums = data.draw(st.lists(st.none() | case[4], max_size=size), label="datums")
    return pg, [None if d is None else in_format(pg, d, binary) for d in datums]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), binary=st.booleans())
def test_vectorised_equals_per_value(
    case: tuple[Any, ...], data: st.DataObject, binary: bool
) -> None:
    pg, values = draw_column(data, case, binary, 40)
    assert_same(pg, values, arrow_type(pg))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), binary=st.booleans())
def test_columns_forced_to_text_keep_their_text(
    case: tuple[Any, ...], data: st.DataObject, binary: bool
) -> None:
    """A column a type change made string: text datums verbatim, binary ones via str()."""
    pg, values = draw_column(data, case, binary, 10)
    assert_same(pg, values, pa.string(), keep_text=True)


@pytest.mark.parametrize(
    ("oid", "typmod", "datums", "target"),
    [
        (21, -1, packed(">h", st.integers(-(2**15), 2**15 - 1)), pa.int64()),
        (23, -1, INT4_BYTES, pa.int64()),
        (700, -1, FLOAT4_BYTES, pa.float64()),
        (1700, typmod_numeric(10, 2), decimals(10, 2), pa.decimal128(12, 3)),
        (1700, typmod_numeric(10, 2), decimals(10, 2), pa.decimal128(38, 2)),
        (1007, -1, array_of(23, INT4_BYTES), pa.list_(pa.field("element", pa.int64()))),
    ],
)
@settings(max_examples=60)
@given(data=st.data(), binary=st.booleans())
def test_widened_columns(
    oid: int,
    typmod: int,
    datums: st.SearchStrategy[bytes],
    target: pa.DataType,
    data: st.DataObject,
    binary: bool,
) -> None:
    """A column whose type widened across Relation versions (int → bigint, float → double,
    decimal(p,s) → decimal(p',s')) converts older rows straight into the wider type."""
    pg = resolve_type(oid, typmod)
    drawn = data.draw(st.lists(st.none() | datums, max_size=20), label="datums")
    assert_same(pg, [None if d is None else in_format(pg, d, binary) for d in drawn], target)


# --- malformed and unusual input ----------------------------------------------------------

NEAR_TEXT = st.text(
    alphabet='0123456789-+:. eExXtfNaIinfyBCuUlL{},"\\\t\v', max_size=14
) | st.sampled_from(
    [
        "0x1F",
        "0X10",
        "1_000",
        " 1",
        "0000-01-01",
        "0000-01-01 00:00:00",
        "0000-01-01 00:00:00+00",
        "2024-02-30",
        "2024-01-01T00:00:00",
        "2024-01-01 24:00:00",
        "2024-01-01 00:00:00Z",
        "2024-01-01 00:00:00+0000",
        "2024-01-01 00:00:00+05:30",
        "9999-12-31 23:00:00-05",
        "2024-01-01 00:00:00.1234567",
        "2024-W01-1",
        "20240101",
        "1e400",
        "-1e400",
        "1e39",
        "nan",
        "-nan",
        "inf",
        "Inf",
        "sNaN",
        "1.005",
        "{1,,2}",
        "{,}",
        "{NULL}",
        "{ 1 }",
        "T",
        "true",
        "",
    ]
)
TEXT_KERNEL_OIDS = [16, 21, 23, 20, 26, 700, 701, 1082, 1114, 1184]
ARRAY_KERNEL_OIDS = [1009, 1007, 1016, 1022, 1000, 1182]


@pytest.mark.parametrize("oid", [*TEXT_KERNEL_OIDS, *ARRAY_KERNEL_OIDS, 1700, 1231])
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.none() | NEAR_TEXT, min_size=1, max_size=6))
def test_unusual_text_fails_or_agrees(oid: int, values: list[str | None]) -> None:
    pg = resolve_type(oid, N12_2 if oid in (1700, 1231) else -1)
    same_failure_or_result(pg, values, arrow_type(pg))


def numeric_datum(
    ndigits: int, weight: int, sign: int, dscale: int, digits: list[int], extra: bytes
) -> bytes:
    return (
        struct.pack(">hhHh", ndigits, weight, sign, dscale)
        + b"".join(struct.pack(">H", d) for d in digits)
        + extra
    )


RAW_NUMERIC = st.builds(
    numeric_datum,
    st.integers(-1, 9),
    st.integers(-8, 8),
    st.sampled_from([0, 0x4000, 0xC000, 0xD000, 0xF000, 0x1234]),
    st.integers(-1, 20),
    st.lists(st.integers(0, 10_050) | st.sampled_from([0, 9999, 5000, 1]), max_size=9),
    st.sampled_from([b"", b"", b"", b"\x00"]),
)


@pytest.mark.parametrize(
    "precision_scale", [(12, 2), (18, 0), (18, 18), (38, 10), (4, 4), (20, 16)]
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.none() | RAW_NUMERIC, min_size=1, max_size=6))
@example(values=[numeric_datum(2, 0, 0, 2, [1, 2345], b"")])  # digits past dscale
@example(values=[numeric_datum(1, -1, 0, 4, [5], b"")])  # dscale 4 into numeric(p,2)
def test_numeric_send_fails_or_agrees(
    precision_scale: tuple[int, int], values: list[bytes]
) -> None:
    pg = resolve_type(1700, typmod_numeric(*precision_scale))
    same_failure_or_result(pg, values, arrow_type(pg))


FIXED_OIDS = [16, 21, 23, 20, 26, 700, 701, 1082, 1114, 1184, 25, 17]


@pytest.mark.parametrize("oid", FIXED_OIDS)
@settings(max_examples=100)
@given(values=st.lists(st.none() | st.binary(max_size=9), min_size=1, max_size=6))
def test_unusual_binary_fails_or_agrees(oid: int, values: list[bytes | None]) -> None:
    """Datums of the wrong width, bytes that are not UTF-8, bools other than 0/1."""
    pg = resolve_type(oid, -1)
    same_failure_or_result(pg, values, arrow_type(pg))


@st.composite
def raw_arrays(draw: st.DrawFn, element_oid: int, elements: st.SearchStrategy[bytes]) -> bytes:
    """array_send datums with their header, dimensions and element lengths perturbed."""
    items = draw(st.lists(st.none() | elements, max_size=4))
    ndim = draw(st.sampled_from([1, 1, 1, 0, 2, -1, 7]))
    count = len(items) + draw(st.sampled_from([0, 0, 0, 1, -1, -5]))
    lower = draw(st.sampled_from([1, 1, 1, 0, 2]))
    dims = struct.pack(">ii", count, lower) * min(max(ndim, 0), 2)
    sizes = [-1 if e is None else len(e) + draw(st.sampled_from([0, 0, 0, 1, -1])) for e in items]
    body = b"".join(struct.pack(">i", n) + (e or b"") for n, e in zip(sizes, items, strict=True))
    datum = struct.pack(">iii", ndim, int(None in items), element_oid) + dims + body
    datum += draw(st.sampled_from([b"", b"", b"\x00"]))
    cut = draw(st.none() | st.integers(0, len(datum)))
    return datum if cut is None else datum[:cut]


@pytest.mark.parametrize(
    ("oid", "typmod", "elements"),
    [
        (1009, -1, st.binary(max_size=4) | TEXT_BYTES),
        (1007, -1, st.binary(min_size=3, max_size=5)),
        (1231, N12_2, decimals(12, 2) | st.binary(max_size=10)),
        (1185, -1, TIMESTAMP_BYTES),
        (1000, -1, st.binary(min_size=1, max_size=1)),
    ],
    ids=["text[]", "int4[]", "numeric(12,2)[]", "timestamptz[]", "bool[]"],
)
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unusual_binary_arrays_fail_or_agree(
    oid: int, typmod: int, elements: st.SearchStrategy[bytes], data: st.DataObject
) -> None:
    pg = resolve_type(oid, typmod)
    element_oid = {1009: 25, 1007: 23, 1231: 1700, 1185: 1184, 1000: 16}[oid]
    datums = st.none() | raw_arrays(element_oid, elements)
    values = data.draw(st.lists(datums, min_size=1, max_size=5), label="datums")
    same_failure_or_result(pg, values, arrow_type(pg))


def test_a_column_mixing_formats_goes_value_by_value() -> None:
    pg = resolve_type(23, -1)
    assert_same(pg, ["1", struct.pack(">i", 2), None], pa.int32())


def test_edge_values_named() -> None:
    """The edges the issue lists, spelled out once (the properties above draw them too)."""
    ts = pa.scalar(1_704_067_200_000_000, pa.timestamp("us", "UTC")).as_py()
    cases: list[tuple[int, int, list[Any], list[Any], dict[int, str]]] = [
        (
            701,
            -1,
            ["NaN", "Infinity", "-Infinity", "-0"],
            [math.nan, math.inf, -math.inf, -0.0],
            {},
        ),
        (
            700,
            -1,
            ["NaN", "-Infinity", "1.1"],
            [math.nan, -math.inf, struct.unpack(">f", struct.pack(">f", 1.1))[0]],
            {},
        ),
        (
            1700,
            N12_2,
            ["NaN", "-Infinity", "1.50"],
            [None, None, Decimal("1.50")],
            {0: "NaN", 1: "-Infinity"},
        ),
        (
            1082,
            -1,
            ["infinity", "0044-03-15 BC", "10000-01-01"],
            [None] * 3,
            {0: "infinity", 1: "0044-03-15 BC", 2: "10000-01-01"},
        ),
        (1184, -1, ["-infinity", "2024-01-01 00:00:00+00"], [None, ts], {0: "-infinity"}),
        (1009, -1, ["{}", '{NULL,"NULL",a}', '{"a,b"}'], [[], [None, "NULL", "a"], ["a,b"]], {}),
        (
            1182,
            -1,
            ["{2024-01-01}", "{infinity}"],
            [[datetime_date(2024, 1, 1)], None],
            {1: "{infinity}"},
        ),
    ]
    for oid, typmod, values, expected, fallbacks in cases:
        pg = resolve_type(oid, typmod)
        assert_same(pg, values, arrow_type(pg))
        got, fell = pg.convert_column(values, arrow_type(pg))
        assert exact(got.to_pylist()) == exact(expected)
        assert fell == fallbacks


COMMON = [
    (20, -1, ["1", "-9223372036854775808", None], [struct.pack(">q", 1), None]),
    (23, -1, ["7", None], [struct.pack(">i", -7), None]),
    (25, -1, ["é", "", None], ["é".encode(), b"", None]),
    (1043, 44, ["v1", None], [b"v1", None]),
    (1700, N12_2, ["12.50", "-0.01", None], [numeric_binary("12.50", 2), None]),
    (701, -1, ["1.5", "NaN", "-Infinity", None], [struct.pack(">d", 1.5), None]),
    (16, -1, ["t", "f", None], [b"\x01", b"\x00", None]),
    (1184, -1, ["2024-01-01 00:00:00.5+00", None], [struct.pack(">q", 0), None]),
    (1082, -1, ["2024-02-29", None], [struct.pack(">i", 0), None]),
    (
        1009,
        -1,
        ["{a,NULL}", "{}", '{"b c",x,""}', None],
        [array_binary(25, [(3, 1)], [b"a", None, b""]), array_binary(25, [], []), None],
    ),
    (
        1185,
        -1,
        ['{"2024-01-01 00:00:00+00",NULL}', None],
        [array_binary(1184, [(2, 1)], [struct.pack(">q", 0), None]), None],
    ),
    (1231, N12_2, ["{1.50,NULL}"], [array_binary(1700, [(1, 1)], [numeric_binary("1.50", 2)])]),
]


@pytest.mark.parametrize(("oid", "typmod", "text", "binary"), COMMON)
def test_kernels_take_the_common_values(
    oid: int,
    typmod: int,
    text: list[Any],
    binary: list[Any] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Well-formed values of the common types never reach the per-value converter."""
    calls: list[object] = []
    monkeypatch.setattr(PgType, "convert", lambda self, value: calls.append(value))
    pg = resolve_type(oid, typmod)
    for values in (text, binary or []):
        pg.convert_column(values, arrow_type(pg))
    assert calls == []


def test_convert_column_takes_an_arrow_string_column() -> None:
    """The bootstrap hands its CSV columns over as Arrow strings: same values, same
    Fallback rows as the Python list."""
    import pyarrow as pa

    from slotlake.pgtypes import resolve_type

    cases = [
        (
            1700,
            (12 << 16 | 2) + 4,
            ["1.50", None, "NaN", "-3.25", "Infinity"],
            pa.decimal128(12, 2),
        ),
        (
            1184,
            -1,
            ["2024-01-02 03:04:05+00", "infinity", None, "0044-03-15 00:00:00+00 BC"],
            pa.timestamp("us", tz="UTC"),
        ),
        (1009, -1, ["{a,b}", None, '{"x,y",z}', "{}", "{{1,2},{3,4}}"], pa.list_(pa.string())),
        (1700, -1, [None, None], pa.decimal128(38, 6)),
    ]
    for oid, typmod, values, target in cases:
        pg_type = resolve_type(oid, typmod, None)
        assert pg_type.convert_column(pa.array(values, pa.string()), target) == (
            pg_type.convert_column(values, target)
        )
