"""slotlake.pgtypes on crafted text and binary datums (no server; see the live tests)."""

from __future__ import annotations

import ipaddress
import math
import pickle
import struct
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotlake.pgtypes import (
    Fallback,
    PgType,
    parse_array_text,
    render_array_text,
    resolve_type,
    spark_ddl_for,
)

UTC = timezone.utc


def typmod_numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def t(oid: int, typmod: int = -1, names: dict[int, tuple[str, str]] | None = None) -> PgType:
    return resolve_type(oid, typmod, names)


# --- independent encoders of the binary send formats ------------------------------------


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def numeric_binary(text: str, dscale: int | None = None) -> bytes:
    """numeric_send of a plain decimal literal (normalised like PostgreSQL: no zero groups at ends)."""
    special = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}
    if text in special:
        return struct.pack(">hhHh", 0, 0, special[text], 0)
    sign = 0x4000 if text.startswith("-") else 0
    whole, _, frac = text.lstrip("-").partition(".")
    whole = whole.lstrip("0")
    whole = whole.zfill(-(-len(whole) // 4) * 4)
    frac_padded = frac.ljust(-(-len(frac) // 4) * 4, "0")
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    groups += [int(frac_padded[i : i + 4]) for i in range(0, len(frac_padded), 4)]
    weight = len(whole) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        sign, weight = 0, 0
    scale = len(frac) if dscale is None else dscale
    return struct.pack(f">hhHh{len(groups)}H", len(groups), weight, sign, scale, *groups)


def array_binary(elem_oid: int, dims: list[tuple[int, int]], elements: list[bytes | None]) -> bytes:
    out = [i32(len(dims)), i32(int(None in elements)), i32(elem_oid)]
    out += [i32(length) + i32(lower) for length, lower in dims]
    out += [i32(-1) if e is None else i32(len(e)) + e for e in elements]
    return b"".join(out)


def date2j(year: int, month: int, day: int) -> int:
    """PostgreSQL's date2j (the inverse of the j2date the module ports); year ≤ 0 is BC."""
    if month > 2:
        month += 1
        year += 4800
    else:
        month += 13
        year += 4799
    century = year // 100
    julian = year * 365 - 32167 + year // 4 - century + century // 4
    return julian + 7834 * month // 256 + day


def pg_days(year: int, month: int, day: int) -> int:
    return date2j(year, month, day) - date2j(2000, 1, 1)


USECS_PER_DAY = 86_400_000_000


# --- resolution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "typmod", "ddl", "name"),
    [
        (16, -1, "boolean", "bool"),
        (21, -1, "smallint", "int2"),
        (23, -1, "int", "int4"),
        (20, -1, "bigint", "int8"),
        (26, -1, "bigint", "oid"),
        (28, -1, "bigint", "xid"),
        (29, -1, "bigint", "cid"),
        (700, -1, "float", "float4"),
        (701, -1, "double", "float8"),
        (1700, -1, "string", "numeric"),
        (1700, typmod_numeric(10, 2), "decimal(10,2)", "numeric"),
        (1700, typmod_numeric(38, 38), "decimal(38,38)", "numeric"),
        (1700, typmod_numeric(39, 2), "string", "numeric"),
        (1700, typmod_numeric(5, -2), "string", "numeric"),
        (1700, typmod_numeric(3, 5), "string", "numeric"),
        (790, -1, "decimal(19,2)", "money"),
        (25, -1, "string", "text"),
        (1043, 14, "string", "varchar"),
        (1042, 9, "string", "bpchar"),
        (19, -1, "string", "name"),
        (18, -1, "string", "char"),
        (17, -1, "binary", "bytea"),
        (1082, -1, "date", "date"),
        (1114, -1, "timestamp_ntz", "timestamp"),
        (1184, -1, "timestamp", "timestamptz"),
        (1083, -1, "string", "time"),
        (1266, -1, "string", "timetz"),
        (1186, -1, "string", "interval"),
        (2950, -1, "string", "uuid"),
        (114, -1, "string", "json"),
        (3802, -1, "string", "jsonb"),
        (142, -1, "string", "xml"),
        (869, -1, "string", "inet"),
        (650, -1, "string", "cidr"),
        (829, -1, "string", "macaddr"),
        (774, -1, "string", "macaddr8"),
        (1560, 4, "string", "bit"),
        (1562, -1, "string", "varbit"),
        (1007, -1, "array<int>", "_int4"),
        (1009, -1, "array<string>", "_text"),
        (1231, typmod_numeric(10, 2), "array<decimal(10,2)>", "_numeric"),
        (1185, -1, "array<timestamp>", "_timestamptz"),
        (1001, -1, "array<binary>", "_bytea"),
        (600, -1, "string", "oid600"),  # point: a builtin without a mapping
    ],
)
def test_builtin_mapping(oid: int, typmod: int, ddl: str, name: str) -> None:
    resolved = t(oid, typmod)
    assert (resolved.oid, resolved.typmod, resolved.name, resolved.spark_ddl) == (
        oid,
        typmod,
        name,
        ddl,
    )
    assert spark_ddl_for(oid, typmod) == ddl


def test_type_messages_resolve_enums_domains_and_user_arrays() -> None:
    names = {
        16400: ("public", "mood"),
        16401: ("public", "_mood"),
        16402: ("", "int4"),  # a domain over int4 carries its base type's name
        16403: ("pg_catalog", "numeric"),
        16404: ("", "_int4"),  # a domain over int4[]
        16405: ("public", "int4"),  # a user type that merely shares a builtin's name
        16406: ("public", "citext"),
    }
    assert t(16400, -1, names).spark_ddl == "string"
    assert t(16400, -1, names).name == "mood"
    assert t(16401, -1, names).spark_ddl == "array<string>"
    assert t(16402, -1, names).spark_ddl == "int"
    assert t(16402, -1, names).convert(i32(-5)) == -5
    assert t(16403, typmod_numeric(10, 2), names).spark_ddl == "decimal(10,2)"
    assert t(16403, -1, names).spark_ddl == "string"
    assert t(16404, -1, names).spark_ddl == "array<int>"
    assert t(16405, -1, names).spark_ddl == "string"
    assert t(16406, -1, names).convert(b"Hello") == "Hello"
    # Without its Type message a user type is unknown: text kept, binary as hex.
    assert t(16400).spark_ddl == "string"
    assert t(16400).convert(b"sad") == "\\x736164"
    # Builtin OIDs never consult the Type messages.
    assert t(23, -1, {23: ("public", "mood")}).spark_ddl == "int"


def test_resolution_is_cached_per_type_message() -> None:
    a = t(16500, -1, {16500: ("", "int8")})
    assert t(16500, -1, {16500: ("", "int8")}) is a
    # The same OID described differently (dropped and recreated) resolves afresh.
    assert t(16500, -1, {16500: ("public", "mood")}).spark_ddl == "string"
    assert t(23, -1) is t(23, -1)


def test_resolved_types_and_their_converters_pickle() -> None:
    names = {16600: ("", "numeric")}
    numeric = t(16600, typmod_numeric(10, 2), names)
    assert pickle.loads(pickle.dumps(numeric)) is numeric
    convert = pickle.loads(pickle.dumps(t(1007).convert))
    assert convert("{1,NULL}") == [1, None]


# --- scalars ------------------------------------------------------------------------------


def check(pg_type: PgType, text: str, binary: bytes, expected: object) -> None:
    """Both formats give `expected`, of the same type, and binary renders PostgreSQL's text."""
    for got in (pg_type.from_text(text), pg_type.from_binary(binary), pg_type.convert(binary)):
        assert type(got) is type(expected), (got, expected)
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got)  # type: ignore[arg-type]
        else:
            assert got == expected, (got, expected)
        if isinstance(expected, Decimal):
            assert str(got) == str(expected)
        if isinstance(expected, datetime):
            assert got.tzinfo is expected.tzinfo  # type: ignore[union-attr]
    assert pg_type.convert(text) == pg_type.from_text(text) or isinstance(expected, float)
    assert pg_type.binary_to_text(binary) == text


@pytest.mark.parametrize(
    ("oid", "text", "binary", "expected"),
    [
        (16, "t", b"\x01", True),
        (16, "f", b"\x00", False),
        (21, "-32768", i16(-32768), -32768),
        (21, "32767", i16(32767), 32767),
        (23, "-2147483648", i32(-(2**31)), -(2**31)),
        (23, "2147483647", i32(2**31 - 1), 2**31 - 1),
        (20, "-9223372036854775808", i64(-(2**63)), -(2**63)),
        (20, "9223372036854775807", i64(2**63 - 1), 2**63 - 1),
        (26, "4294967295", b"\xff\xff\xff\xff", 4294967295),
        (28, "4294967295", b"\xff\xff\xff\xff", 4294967295),
        (29, "0", b"\x00\x00\x00\x00", 0),
        (5069, "9223372036854775807", struct.pack(">Q", 2**63 - 1), 2**63 - 1),
        (5069, "18446744073709551615", b"\xff" * 8, Fallback("18446744073709551615")),
        (701, "0.1", struct.pack(">d", 0.1), 0.1),
        (701, "1e+15", struct.pack(">d", 1e15), 1e15),
        (701, "100000000000000", struct.pack(">d", 1e14), 1e14),
        (
            701,
            "1.7976931348623157e+308",
            struct.pack(">d", 1.7976931348623157e308),
            1.7976931348623157e308,
        ),
        (701, "5e-324", struct.pack(">d", 5e-324), 5e-324),
        (701, "0.0001", struct.pack(">d", 0.0001), 0.0001),
        (701, "1e-05", struct.pack(">d", 1e-05), 1e-05),
        (701, "-0", struct.pack(">d", -0.0), -0.0),
        (
            701,
            "1.2345678901234568e+17",
            struct.pack(">d", 123456789012345678.0),
            1.2345678901234568e17,
        ),
        (701, "NaN", struct.pack(">d", math.nan), math.nan),
        (701, "Infinity", struct.pack(">d", math.inf), math.inf),
        (701, "-Infinity", struct.pack(">d", -math.inf), -math.inf),
        (700, "1.1", struct.pack(">f", 1.1), struct.unpack(">f", struct.pack(">f", 1.1))[0]),
        (700, "1e+06", struct.pack(">f", 1e6), 1e6),
        (700, "123456", struct.pack(">f", 123456), 123456.0),
        (700, "1.234567e+06", struct.pack(">f", 1234567), 1234567.0),
        (
            700,
            "3.4028235e+38",
            struct.pack(">f", 3.4028235e38),
            struct.unpack(">f", struct.pack(">f", 3.4028235e38))[0],
        ),
        (700, "1e-45", struct.pack(">f", 1e-45), struct.unpack(">f", struct.pack(">f", 1e-45))[0]),
        (700, "-0", struct.pack(">f", -0.0), -0.0),
        (700, "NaN", struct.pack(">f", math.nan), math.nan),
        (700, "-Infinity", struct.pack(">f", -math.inf), -math.inf),
        (790, "$0.00", i64(0), Decimal("0.00")),
        (790, "-$1,234.56", i64(-123456), Decimal("-1234.56")),
        (790, "-$0.50", i64(-50), Decimal("-0.50")),
        (790, "$92,233,720,368,547,758.07", i64(2**63 - 1), Decimal("92233720368547758.07")),
        (790, "-$92,233,720,368,547,758.08", i64(-(2**63)), Decimal("-92233720368547758.08")),
        (25, "", b"", ""),
        (25, "héllo ✓ 😀", "héllo ✓ 😀".encode(), "héllo ✓ 😀"),
        (1042, "ab   ", b"ab   ", "ab   "),
        (1043, "a\tb\n", b"a\tb\n", "a\tb\n"),
        (19, "pg_catalog", b"pg_catalog", "pg_catalog"),
        (18, "a", b"a", "a"),
        (18, "", b"\x00", ""),
        (18, "\\200", b"\x80", "\\200"),
        (18, "\\377", b"\xff", "\\377"),
        (17, "\\x", b"", b""),
        (17, "\\x00ff0041", b"\x00\xff\x00\x41", b"\x00\xff\x00\x41"),
        (
            2950,
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            bytes.fromhex("a0eebc999c0b4ef8bb6d6bb9bd380a11"),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        ),
        (114, '{"a" : [1, 2.50]}', b'{"a" : [1, 2.50]}', '{"a" : [1, 2.50]}'),
        (3802, '{"a": [1, 2.50]}', b'\x01{"a": [1, 2.50]}', '{"a": [1, 2.50]}'),
        (142, "<a>é</a>", "<a>é</a>".encode(), "<a>é</a>"),
        (829, "08:00:2b:01:02:03", bytes.fromhex("08002b010203"), "08:00:2b:01:02:03"),
        (
            774,
            "08:00:2b:01:02:03:04:05",
            bytes.fromhex("08002b0102030405"),
            "08:00:2b:01:02:03:04:05",
        ),
        (1560, "1010", i32(4) + b"\xa0", "1010"),
        (1562, "", i32(0), ""),
        (1562, "101010101", i32(9) + b"\xaa\x80", "101010101"),
        (1562, "11111111", i32(8) + b"\xff", "11111111"),
        (3220, "16/B374D848", struct.pack(">Q", 0x16_B374D848), "16/B374D848"),
        (3220, "0/0", struct.pack(">Q", 0), "0/0"),
    ],
)
def test_scalar(oid: int, text: str, binary: bytes, expected: object) -> None:
    check(t(oid), text, binary, expected)


@pytest.mark.parametrize(
    ("typmod", "text", "expected"),
    [
        (typmod_numeric(10, 2), "12.50", Decimal("12.50")),
        (typmod_numeric(10, 2), "-99999999.99", Decimal("-99999999.99")),
        (typmod_numeric(10, 2), "0.00", Decimal("0.00")),
        (typmod_numeric(10, 2), "NaN", Fallback("NaN")),
        (
            typmod_numeric(38, 10),
            "1234567890123456789012345678.0123456789",
            Decimal("1234567890123456789012345678.0123456789"),
        ),
        (
            typmod_numeric(38, 0),
            "-99999999999999999999999999999999999999",
            Decimal("-99999999999999999999999999999999999999"),
        ),
        (typmod_numeric(5, 5), "0.00001", Decimal("0.00001")),
        (-1, "0", "0"),
        (-1, "-1.5", "-1.5"),
        (-1, "123.4500", "123.4500"),
        (-1, "10000", "10000"),
        (-1, "0.0001", "0.0001"),
        (-1, "0.000000000000000000001", "0.000000000000000000001"),
        (-1, "1" + "0" * 100, "1" + "0" * 100),
        (
            -1,
            "-12345678901234567890.123456789012345678901",
            "-12345678901234567890.123456789012345678901",
        ),
        (-1, "NaN", "NaN"),
        (-1, "Infinity", "Infinity"),
        (-1, "-Infinity", "-Infinity"),
        (typmod_numeric(5, -2), "12300", "12300"),
        (typmod_numeric(3, 5), "0.00123", "0.00123"),
        (typmod_numeric(50, 5), "1.50000", "1.50000"),
    ],
)
def test_numeric(typmod: int, text: str, expected: object) -> None:
    check(t(1700, typmod), text, numeric_binary(text), expected)


def test_numeric_constrained_infinity_and_unnormalised_binary() -> None:
    numeric = t(1700, typmod_numeric(10, 2))
    assert numeric.convert("Infinity") == Fallback("Infinity")
    assert numeric.convert(numeric_binary("-Infinity")) == Fallback("-Infinity")
    # Leading and trailing zero digit groups are legal in the wire format.
    unnormalised = struct.pack(">hhHh4H", 4, 1, 0, 2, 0, 12, 5000, 0)
    assert numeric.convert(unnormalised) == Decimal("12.50")
    assert t(1700).convert(unnormalised) == "12.50"


def test_numeric_never_rounds_silently() -> None:
    numeric = t(1700, typmod_numeric(4, 2))
    with pytest.raises(ValueError, match="numeric"):
        numeric.convert("1.234")
    with pytest.raises(ValueError, match="numeric"):
        numeric.convert("123.45")


def test_money_text_variants() -> None:
    money = t(790)
    assert money.convert("($1,234.56)") == Decimal("-1234.56")
    assert str(money.convert("$1.5")) == "1.50"
    with pytest.raises(ValueError, match="money"):
        money.convert("$1.234")


# --- date and time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "days", "expected"),
    [
        ("2000-01-01", 0, date(2000, 1, 1)),
        ("2024-02-29", pg_days(2024, 2, 29), date(2024, 2, 29)),
        ("0001-01-01", pg_days(1, 1, 1), date(1, 1, 1)),
        ("9999-12-31", pg_days(9999, 12, 31), date(9999, 12, 31)),
        ("1970-01-01", -10957, date(1970, 1, 1)),
        ("infinity", 2**31 - 1, Fallback("infinity")),
        ("-infinity", -(2**31), Fallback("-infinity")),
        ("0001-12-31 BC", pg_days(0, 12, 31), Fallback("0001-12-31 BC")),
        ("0044-03-15 BC", pg_days(-43, 3, 15), Fallback("0044-03-15 BC")),
        ("4713-01-01 BC", pg_days(-4712, 1, 1), Fallback("4713-01-01 BC")),
        ("10000-01-01", pg_days(10000, 1, 1), Fallback("10000-01-01")),
        ("5874897-12-31", pg_days(5874897, 12, 31), Fallback("5874897-12-31")),
    ],
)
def test_date(text: str, days: int, expected: object) -> None:
    check(t(1082), text, i32(days), expected)


@pytest.mark.parametrize(
    ("text", "usecs", "expected"),
    [
        ("2000-01-01 00:00:00", 0, datetime(2000, 1, 1)),
        (
            "2024-02-29 12:34:56.789",
            pg_days(2024, 2, 29) * USECS_PER_DAY + 45296789000,
            datetime(2024, 2, 29, 12, 34, 56, 789000),
        ),
        ("1999-12-31 23:59:59.999999", -1, datetime(1999, 12, 31, 23, 59, 59, 999999)),
        ("0001-01-01 00:00:00", pg_days(1, 1, 1) * USECS_PER_DAY, datetime(1, 1, 1)),
        (
            "9999-12-31 23:59:59.999999",
            pg_days(10000, 1, 1) * USECS_PER_DAY - 1,
            datetime(9999, 12, 31, 23, 59, 59, 999999),
        ),
        ("infinity", 2**63 - 1, Fallback("infinity")),
        ("-infinity", -(2**63), Fallback("-infinity")),
        (
            "10000-01-01 00:00:00",
            pg_days(10000, 1, 1) * USECS_PER_DAY,
            Fallback("10000-01-01 00:00:00"),
        ),
        (
            "0044-03-15 12:00:00.5 BC",
            pg_days(-43, 3, 15) * USECS_PER_DAY + 43200500000,
            Fallback("0044-03-15 12:00:00.5 BC"),
        ),
        (
            "0001-12-31 23:59:59.999999 BC",
            pg_days(1, 1, 1) * USECS_PER_DAY - 1,
            Fallback("0001-12-31 23:59:59.999999 BC"),
        ),
        (
            "294276-12-31 23:59:59.999999",
            pg_days(294277, 1, 1) * USECS_PER_DAY - 1,
            Fallback("294276-12-31 23:59:59.999999"),
        ),
    ],
)
def test_timestamp(text: str, usecs: int, expected: object) -> None:
    check(t(1114), text, i64(usecs), expected)
    # timestamptz: the same instants, printed with the session's UTC offset.
    if isinstance(expected, datetime):
        tz_expected: object = expected.replace(tzinfo=UTC)
        tz_text = text + "+00"
    elif "infinity" in text:
        tz_expected, tz_text = expected, text
    else:
        tz_text = text.replace(" BC", "") + "+00" + (" BC" if text.endswith("BC") else "")
        tz_expected = Fallback(tz_text)
    check(t(1184), tz_text, i64(usecs), tz_expected)


def test_timestamptz_text_with_other_offsets_is_normalised_to_utc() -> None:
    tstz = t(1184)
    got = tstz.convert("2024-06-01 12:00:00+05:30")
    assert got == datetime(2024, 6, 1, 6, 30, tzinfo=UTC)
    assert got.tzinfo is UTC  # type: ignore[union-attr]
    assert tstz.convert("2000-01-01 00:00:00.000001-08") == datetime(
        2000, 1, 1, 8, 0, 0, 1, tzinfo=UTC
    )
    # 9999-12-31 23:00-05 is in year 10000 in UTC: kept as text.
    assert tstz.convert("9999-12-31 23:00:00-05") == Fallback("9999-12-31 23:00:00-05")


@pytest.mark.parametrize(
    ("text", "usecs"),
    [
        ("00:00:00", 0),
        ("23:59:59.999999", USECS_PER_DAY - 1),
        ("12:00:00.5", 43_200_500_000),
        ("01:02:03.04", 3_723_040_000),
        ("24:00:00", USECS_PER_DAY),
    ],
)
def test_time(text: str, usecs: int) -> None:
    check(t(1083), text, i64(usecs), text)


@pytest.mark.parametrize(
    ("text", "usecs", "zone_west"),
    [
        ("12:00:00+05:30", 43_200_000_000, -19800),
        ("00:00:00.25-08", 250_000, 28800),
        ("23:59:59.999999+15:59", USECS_PER_DAY - 1, -57540),
        ("12:00:00+05:30:15", 43_200_000_000, -19815),
        ("12:00:00+00", 43_200_000_000, 0),
        ("12:00:00-00:00:01", 43_200_000_000, 1),
    ],
)
def test_timetz(text: str, usecs: int, zone_west: int) -> None:
    check(t(1266), text, i64(usecs) + i32(zone_west), text)


H, M, S = 3_600_000_000, 60_000_000, 1_000_000


@pytest.mark.parametrize(
    ("text", "usecs", "days", "months"),
    [
        ("PT0S", 0, 0, 0),
        ("P1Y2M3DT4H5M6.5S", 4 * H + 5 * M + 6 * S + 500_000, 3, 14),
        ("P-1Y-2M-3DT-4H-5M-6.5S", -(4 * H + 5 * M + 6 * S + 500_000), -3, -14),
        ("P-1D", 0, -1, 0),
        ("P1DT-1S", -S, 1, 0),
        ("PT-0.5S", -500_000, 0, 0),
        ("PT-0.000001S", -1, 0, 0),
        ("P1MT0.000001S", 1, 0, 1),
        ("P1Y", 0, 0, 12),
        ("P1Y1M", 0, 0, 13),
        ("P-1Y-1M", 0, 0, -13),
        ("P-10M-3DT4H5M6.000001S", 4 * H + 5 * M + 6 * S + 1, -3, -10),
        ("P-1Y-10M", 0, 0, -22),
        ("P178000000Y", 0, 0, 178000000 * 12),
        ("P-2147483648D", 0, -(2**31), 0),
        ("PT2562047788H54.775807S", 2**63 - 1 - 5 * M + 5 * M, 0, 0),
        ("PT-2562047788H-54.775808S", -(2**63), 0, 0),
        ("PT1M", M, 0, 0),
        ("PT1H0.1S", H + 100_000, 0, 0),
        ("infinity", 2**63 - 1, 2**31 - 1, 2**31 - 1),
        ("-infinity", -(2**63), -(2**31), -(2**31)),
    ],
)
def test_interval(text: str, usecs: int, days: int, months: int) -> None:
    check(t(1186), text, i64(usecs) + i32(days) + i32(months), text)


# --- network types ----------------------------------------------------------------------------


def inet_binary(address: str, bits: int | None = None, cidr: bool = False) -> bytes:
    ip = ipaddress.ip_address(address)
    family = 2 if ip.version == 4 else 3
    packed = ip.packed
    return (
        bytes([family, ip.max_prefixlen if bits is None else bits, int(cidr), len(packed)]) + packed
    )


@pytest.mark.parametrize(
    ("oid", "text", "binary"),
    [
        (869, "192.168.0.1", inet_binary("192.168.0.1")),
        (869, "192.168.0.1/24", inet_binary("192.168.0.1", 24)),
        (869, "0.0.0.0/0", inet_binary("0.0.0.0", 0)),
        (869, "::1", inet_binary("::1")),
        (869, "::", inet_binary("::")),
        (869, "1::", inet_binary("1::")),
        (869, "fe80::", inet_binary("fe80::")),
        (869, "2001:db8::1/64", inet_binary("2001:db8::1", 64)),
        (869, "::ffff:1.2.3.4", inet_binary("::ffff:1.2.3.4")),
        (869, "::1.2.3.4", inet_binary("::1.2.3.4")),
        (869, "::102", inet_binary("::0.0.1.2")),
        (869, "::ffff:0:102:304", inet_binary("::ffff:0:102:304")),
        (869, "1:0:0:1::1", inet_binary("1:0:0:1:0:0:0:1")),
        (869, "1:0:1:0:1:0:1:0", inet_binary("1:0:1:0:1:0:1:0")),
        (869, "1::1:0:0:1", inet_binary("1:0:0:0:1:0:0:1")),
        (869, "2001:db8::1:0:0:1", inet_binary("2001:db8:0:0:1:0:0:1")),
        (650, "10.0.0.0/8", inet_binary("10.0.0.0", 8, cidr=True)),
        (650, "192.168.1.5/32", inet_binary("192.168.1.5", 32, cidr=True)),
        (650, "2001:db8::/32", inet_binary("2001:db8::", 32, cidr=True)),
        (650, "::/0", inet_binary("::", 0, cidr=True)),
        (650, "::1/128", inet_binary("::1", 128, cidr=True)),
    ],
)
def test_inet(oid: int, text: str, binary: bytes) -> None:
    check(t(oid), text, binary, text)


@given(st.binary(min_size=16, max_size=16))
def test_ipv6_matches_rfc5952_outside_embedded_ipv4(address: bytes) -> None:
    # PostgreSQL's (BIND's) compression agrees with Python's except where it prints an
    # IPv4 tail (::a.b.c.d and ::ffff:a.b.c.d), which happens only with 5+ leading zero words.
    if address[:10] == bytes(10):
        return
    expected = ipaddress.IPv6Address(address).compressed
    assert t(869).convert(bytes([3, 128, 0, 16]) + address) == expected


# --- user and unknown types ---------------------------------------------------------------


def test_user_and_unknown_binary_formats() -> None:
    names = {16400: ("public", "mood"), 16401: ("public", "hstore")}
    assert t(16400, -1, names).convert(b"ok \xe2\x9c\x93") == "ok ✓"
    assert t(16400, -1, names).convert("ok ✓") == "ok ✓"
    # A binary structure (hstore's send format holds NULs) is not text: hex it.
    assert t(16401, -1, names).convert(b"\x00\x00\x00\x01") == "\\x00000001"
    assert t(16401, -1, names).convert(b"\xff\xfe") == "\\xfffe"
    assert t(600).convert("(1,2.5)") == "(1,2.5)"
    assert t(600).convert(b"\x3f\xf0") == "\\x3ff0"


# --- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "typmod", "value"),
    [
        (23, -1, "12x"),
        (23, -1, b"\x00\x01"),
        (16, -1, "yes"),
        (16, -1, b"\x02"),
        (701, -1, "one"),
        (1700, typmod_numeric(10, 2), "abc"),
        (1700, -1, b"\x00\x01"),
        (17, -1, "plain"),
        (17, -1, "\\xZZ"),
        (1082, -1, "2024/01/01"),
        (1082, -1, "2024-13-01"),
        (1114, -1, "2024-01-01 25:00:00"),
        (1114, -1, "2024-01-01 00:00:00+00"),
        (1184, -1, "2024-01-01 00:00:00"),
        (1184, -1, "garbage BC"),
        (1266, -1, b"\x00" * 8),
        (1186, -1, b"\x00" * 15),
        (2950, -1, b"\x00" * 15),
        (3802, -1, b"\x02{}"),
        (869, -1, b"\x09\x20\x00\x04\x01\x02\x03\x04"),
        (1562, -1, i32(9) + b"\xff"),
        (1007, -1, "{1,2"),
        (1007, -1, "{1,,2}"),
        (1007, -1, "{1}x"),
        (1007, -1, "1,2"),
        (1009, -1, '{"a"b}'),
        (1009, -1, "{{a},b}x"),
        (1007, -1, array_binary(23, [(2, 1)], [i32(1)])),
        (1007, -1, array_binary(23, [(1, 1)], [i32(1)]) + b"\x00"),
        (25, -1, b"\xff"),
    ],
)
def test_malformed_values_raise_value_error(oid: int, typmod: int, value: str | bytes) -> None:
    pg_type = t(oid, typmod)
    with pytest.raises(ValueError, match=f"type {pg_type.name} "):
        pg_type.convert(value)


def test_error_message_truncates_the_value() -> None:
    with pytest.raises(ValueError) as info:
        t(23).convert("9" * 500 + "x")
    message = str(info.value)
    assert "int4" in message
    assert "9" * 60 in message and "9" * 200 not in message


# --- arrays ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "typmod", "text", "expected"),
    [
        (1007, -1, "{}", []),
        (1007, -1, "{1,2,NULL}", [1, 2, None]),
        (1007, -1, "{1,2,null}", [1, 2, None]),
        (1007, -1, " { 1 , 2 } ", None),  # whitespace around the braces: not PG output, but legal
        (1007, -1, "{{1,2},{3,4}}", Fallback("{{1,2},{3,4}}")),
        (1007, -1, "[0:1]={1,2}", Fallback("[0:1]={1,2}")),
        (1007, -1, "[1:2]={1,2}", [1, 2]),
        (1007, -1, "[2:3][1:1]={{1},{2}}", Fallback("[2:3][1:1]={{1},{2}}")),
        (
            1009,
            -1,
            '{"a b","NULL",NULL,"\\"","\\\\","",",","{x}",é}',
            ["a b", "NULL", None, '"', "\\", "", ",", "{x}", "é"],
        ),
        (
            1009,
            -1,
            '{" lead","tab\t", a b ,a\\,b,\\ x\\ ,"\\t"}',
            [" lead", "tab\t", "a b", "a,b", " x ", "t"],
        ),
        (1009, -1, '{"\\n"}', ["n"]),
        (1014, -1, '{"a  ",abc}', ["a  ", "abc"]),
        (1231, typmod_numeric(10, 2), "{1.50,NULL}", [Decimal("1.50"), None]),
        (1231, typmod_numeric(10, 2), "{1.50,NaN}", Fallback("{1.50,NaN}")),
        (1231, -1, "{1.50,NaN}", ["1.50", "NaN"]),
        (1182, -1, "{2000-01-01,NULL}", [date(2000, 1, 1), None]),
        (1182, -1, "{infinity,2000-01-01}", Fallback("{infinity,2000-01-01}")),
        (1185, -1, '{"2024-06-01 12:00:00+00"}', [datetime(2024, 6, 1, 12, tzinfo=UTC)]),
        (1001, -1, '{"\\\\x00ff",NULL}', [b"\x00\xff", None]),
        (1000, -1, "{t,f,NULL}", [True, False, None]),
        (1022, -1, "{NaN,-0,1e+300}", None),
        (
            791,
            -1,
            '{$1.00,-$2.50,"$1,234.56"}',
            [Decimal("1.00"), Decimal("-2.50"), Decimal("1234.56")],
        ),
    ],
)
def test_array_text(oid: int, typmod: int, text: str, expected: object) -> None:
    got = t(oid, typmod).convert(text)
    if oid == 1022:
        assert isinstance(got, list) and math.isnan(got[0]) and got[1:] == [-0.0, 1e300]
        return
    if expected is None:
        assert got == [1, 2]
        return
    assert got == expected
    if isinstance(expected, list):
        assert [type(x) for x in got] == [type(x) for x in expected]  # type: ignore[union-attr]


def test_array_binary_one_dimension() -> None:
    int4s = t(1007)
    assert int4s.convert(array_binary(23, [], [])) == []
    assert int4s.convert(array_binary(23, [(3, 1)], [i32(1), None, i32(-3)])) == [1, None, -3]
    texts = t(1009)
    assert texts.convert(array_binary(25, [(2, 1)], [b"a b", b""])) == ["a b", ""]
    numerics = t(1231, typmod_numeric(10, 2))
    binary = array_binary(1700, [(2, 1)], [numeric_binary("1.50"), None])
    assert numerics.convert(binary) == [Decimal("1.50"), None]
    assert str(numerics.convert(binary)[0]) == "1.50"  # type: ignore[index]


@pytest.mark.parametrize(
    ("oid", "typmod", "dims", "elements", "text"),
    [
        (1007, -1, [(2, 1), (2, 1)], [i32(1), i32(2), i32(3), i32(4)], "{{1,2},{3,4}}"),
        (1007, -1, [(2, 0)], [i32(1), None], "[0:1]={1,NULL}"),
        (1007, -1, [(2, 2), (1, 1)], [i32(1), i32(2)], "[2:3][1:1]={{1},{2}}"),
        (1007, -1, [(1, -1)], [i32(1)], "[-1:-1]={1}"),
        (
            1009,
            -1,
            [(1, 1), (4, 1)],
            [b"a b", b"NULL", None, b'"\\'],
            '{{"a b","NULL",NULL,"\\"\\\\"}}',
        ),
        (1009, -1, [(1, 1), (2, 1)], [b"", b"{x},y"], '{{"","{x},y"}}'),
        (
            1231,
            typmod_numeric(10, 2),
            [(2, 1)],
            [numeric_binary("1.50"), numeric_binary("NaN")],
            "{1.50,NaN}",
        ),
        (1182, -1, [(2, 1)], [i32(2**31 - 1), i32(0)], "{infinity,2000-01-01}"),
        (1185, -1, [(1, 1), (2, 1)], [i64(500_000), None], '{{"2000-01-01 00:00:00.5+00",NULL}}'),
        (
            1022,
            -1,
            [(2, 1), (2, 1)],
            [struct.pack(">d", x) for x in (1e300, 1.5, math.nan, -0.0)],
            "{{1e+300,1.5},{NaN,-0}}",
        ),
        (1021, -1, [(1, 1), (2, 1)], [struct.pack(">f", x) for x in (1.1, 1e-45)], "{{1.1,1e-45}}"),
        (1001, -1, [(1, 1), (1, 1)], [b"\x00\xff"], '{{"\\\\x00ff"}}'),
        (1000, -1, [(1, 1), (2, 1)], [b"\x01", b"\x00"], "{{t,f}}"),
        (
            1187,
            -1,
            [(1, 1), (2, 1)],
            [i64(-500_000) + i32(0) + i32(12), i64(0) + i32(0) + i32(0)],
            "{{P1YT-0.5S,PT0S}}",
        ),
        (1041, -1, [(1, 1), (1, 1)], [inet_binary("::ffff:1.2.3.4")], "{{::ffff:1.2.3.4}}"),
        (791, -1, [(1, 1), (2, 1)], [i64(123456), i64(-5)], '{{"$1,234.56",-$0.05}}'),
    ],
)
def test_array_binary_fallback_renders_postgres_text(
    oid: int, typmod: int, dims: list[tuple[int, int]], elements: list[bytes | None], text: str
) -> None:
    pg_type = t(oid, typmod)
    binary = array_binary(0, dims, elements)
    assert pg_type.convert(binary) == Fallback(text)
    assert pg_type.convert(text) == Fallback(text)


# --- property tests of the array text syntax --------------------------------------------

PG_SPACE = " \t\n\r\v\f"
element_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
) | st.sampled_from(["NULL", "null", "", " ", "\\", '"', "{", "}", ",", "a b", "NuLl"])
leaf = st.none() | element_text


def pg_quote(value: str | None) -> str:
    """array_out's quoting, written out independently of the module."""
    if value is None:
        return "NULL"
    needs = (
        value == "" or value.lower() == "null" or any(c in '{}",\\' or c in PG_SPACE for c in value)
    )
    if not needs:
        return value
    escaped = "".join("\\" + c if c in '"\\' else c for c in value)
    return f'"{escaped}"'


def pg_render(value: list) -> str:  # type: ignore[type-arg]
    return "{" + ",".join(pg_render(v) if isinstance(v, list) else pg_quote(v) for v in value) + "}"


nested = st.recursive(
    st.lists(leaf, max_size=5), lambda inner: st.lists(inner, min_size=1, max_size=3), max_leaves=20
)


@given(nested)
def test_array_text_round_trip(value: list) -> None:  # type: ignore[type-arg]
    bounds, parsed = parse_array_text(pg_render(value))
    assert bounds is None
    assert parsed == value


@given(st.lists(leaf, max_size=8))
def test_text_array_one_dimension_converts_like_its_elements(value: list[str | None]) -> None:
    assert t(1009).convert(pg_render(value)) == value
    binary = array_binary(
        25, [(len(value), 1)] if value else [], [None if v is None else v.encode() for v in value]
    )
    assert t(1009).convert(binary) == value


@given(
    st.lists(st.lists(leaf, min_size=1, max_size=3), min_size=1, max_size=3).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
def test_render_matches_postgres_quoting(rows: list[list[str | None]]) -> None:
    flat = [v for row in rows for v in row]
    assert render_array_text([(len(rows), 1), (len(rows[0]), 1)], flat) == pg_render(rows)
    binary = array_binary(
        25, [(len(rows), 1), (len(rows[0]), 1)], [None if v is None else v.encode() for v in flat]
    )
    assert t(1009).convert(binary) == Fallback(pg_render(rows))


ints = st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(st.lists(ints, max_size=10), st.sampled_from(["", " ", "\t"]))
def test_int_array_round_trip(value: list[int | None], space: str) -> None:
    text = "{" + ",".join(f"{space}{'NULL' if v is None else v}{space}" for v in value) + "}"
    assert t(1007).convert(text) == value
    binary = array_binary(
        23, [(len(value), 1)] if value else [], [None if v is None else i32(v) for v in value]
    )
    assert t(1007).convert(binary) == value


@given(st.lists(st.lists(ints, min_size=2, max_size=2), min_size=1, max_size=3), st.integers(-3, 3))
def test_multidimensional_int_arrays_fall_back_identically(
    rows: list[list[int | None]], lower: int
) -> None:
    text = pg_render([[None if v is None else str(v) for v in row] for row in rows])
    if lower != 1:
        text = f"[{lower}:{lower + len(rows) - 1}][1:2]=" + text
    flat = [v for row in rows for v in row]
    binary = array_binary(
        23, [(len(rows), lower), (2, 1)], [None if v is None else i32(v) for v in flat]
    )
    assert t(1007).convert(text) == Fallback(text)
    assert t(1007).convert(binary) == Fallback(text)


# --- float text rendering and shortest digits ------------------------------------------


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float8_rendering_round_trips(x: float) -> None:
    text = t(701).binary_to_text(struct.pack(">d", x))
    assert float(text) == x
    assert t(701).convert(text) == x


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float4_rendering_is_shortest_and_round_trips(x: float) -> None:
    text = t(700).binary_to_text(struct.pack(">f", x))
    assert t(700).convert(text) == x
    mantissa = text.lstrip("-").split("e")[0].replace(".", "").strip("0")
    assert len(mantissa) <= 9


def _significant_digits(text: str) -> tuple[str, int]:
    """('12621775', -29) from '1.2621775e-29' / '0.000123' / '1234' etc."""
    value = Decimal(text.lstrip("-")).normalize()
    _sign, digits, exponent = value.as_tuple()
    return "".join(map(str, digits)), exponent + len(digits) - 1  # type: ignore[operator]


def _numpy_shortest_float4(x: float) -> str:
    np = pytest.importorskip("numpy")  # Dragon4: an independent shortest-digits reference
    return np.format_float_scientific(np.float32(x), unique=True)


@pytest.mark.parametrize("exponent", range(-149, 128))
def test_float4_powers_of_two_render_like_ryu(exponent: int) -> None:
    # At a power of two the rounding interval is lopsided: the shortest float4 text is
    # then not always the correctly rounded one (e.g. 2**-96 prints as 1.2621775e-29).
    x = 2.0**exponent
    text = t(700).binary_to_text(struct.pack(">f", x))
    assert _significant_digits(text) == _significant_digits(_numpy_shortest_float4(x))


@given(st.floats(width=32, allow_nan=False, allow_infinity=False).filter(bool))
def test_float4_digits_match_numpy(x: float) -> None:
    text = t(700).binary_to_text(struct.pack(">f", x))
    assert _significant_digits(text) == _significant_digits(_numpy_shortest_float4(x))


def test_float4_lopsided_interval_examples() -> None:
    for x, text in [
        (2.0**-96, "1.2621775e-29"),
        (2.0**87, "1.5474251e+26"),
        (2.0**90, "1.2379401e+27"),
    ]:
        assert t(700).binary_to_text(struct.pack(">f", x)) == text


def test_bc_and_large_year_rendering_matches_date2j() -> None:
    for year in (-4712, -100, -1, 0, 1, 1582, 2000, 9999, 10000, 123456):
        for month, day in ((1, 1), (2, 28), (12, 31)):
            text = t(1082).binary_to_text(i32(pg_days(year, month, day)))
            label = f"{year if year > 0 else 1 - year:04d}-{month:02d}-{day:02d}"
            assert text == (label if year > 0 else label + " BC")


@given(st.dates())
def test_dates_agree_with_python(value: date) -> None:
    days = (value - date(2000, 1, 1)).days
    assert t(1082).convert(i32(days)) == value
    assert t(1082).binary_to_text(i32(days)) == value.isoformat()


def test_timestamp_fallback_render_is_utc_suffixed() -> None:
    assert (
        t(1184).binary_to_text(i64(pg_days(10000, 1, 1) * USECS_PER_DAY))
        == "10000-01-01 00:00:00+00"
    )
    assert t(1184).convert(i64(pg_days(-43, 3, 15) * USECS_PER_DAY)) == Fallback(
        "0044-03-15 00:00:00+00 BC"
    )
    assert t(1114).convert(i64(pg_days(1, 1, 1) * USECS_PER_DAY - 1)) == Fallback(
        "0001-12-31 23:59:59.999999 BC"
    )
    assert t(1184).convert(i64(0)) == datetime(2000, 1, 1, tzinfo=UTC)
    assert t(1184).convert(i64(-1)) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert t(1114).convert(i64(-1)) == datetime(2000, 1, 1) - timedelta(microseconds=1)
