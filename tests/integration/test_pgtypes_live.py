"""slotlake.pgtypes against a real server: every mapped type, text and binary pgoutput.

Each case creates a one-column table, publishes it, inserts edge-case values after the
slot exists and peeks the slot twice (binary=false / binary=true). The pgoutput payloads
are parsed here by a tiny helper, independent of slotlake's decoder. Expected values come
from psycopg (an independent implementation of the type formats) or, where the Spark
mapping is deliberately text, from the server's own output function (``format('%s', c)``;
not ``c::text``, which prints inet masks differently).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from slotlake.pgtypes import Fallback, resolve_type
from tests.unit.test_vector_convert import arrow_type, assert_same, exact

SESSION = (
    "SET DateStyle = 'ISO, YMD'",
    "SET TimeZone = 'UTC'",
    "SET IntervalStyle = 'iso_8601'",
    "SET extra_float_digits = 3",
    "SET bytea_output = 'hex'",
    "SET lc_monetary = 'C'",
    # The test clusters run with synchronous_commit=off: a peek only decodes flushed WAL.
    "SET synchronous_commit = on",
)
UNCHANGED_TOAST = object()

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# --- a deliberately tiny pgoutput reader (proto 1: Y, R and I are all we need) ---------


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\0", pos)
    return data[pos:end].decode(), end + 1


def _read_tuple(data: bytes, pos: int) -> list[object]:
    (ncols,) = _I16.unpack_from(data, pos)
    pos += 2
    values: list[object] = []
    for _ in range(ncols):
        kind = data[pos : pos + 1]
        pos += 1
        if kind == b"n":
            values.append(None)
        elif kind == b"u":
            values.append(UNCHANGED_TOAST)
        elif kind in (b"t", b"b"):
            (length,) = _I32.unpack_from(data, pos)
            raw = data[pos + 4 : pos + 4 + length]
            pos += 4 + length
            values.append(raw.decode() if kind == b"t" else raw)
        else:
            raise AssertionError(f"unknown tuple column kind {kind!r}")
    assert pos == len(data), "trailing bytes after the tuple"
    return values


@dataclass
class Peek:
    type_names: dict[int, tuple[str, str]] = field(default_factory=dict)
    columns: list[tuple[str, int, int]] = field(default_factory=list)  # name, type oid, typmod
    rows: list[list[object]] = field(default_factory=list)


def parse_peek(payloads: list[bytes]) -> Peek:
    peek = Peek()
    for data in payloads:
        kind = data[:1]
        if kind == b"Y":
            (oid,) = _I32.unpack_from(data, 1)
            namespace, pos = _cstring(data, 5)
            name, _ = _cstring(data, pos)
            peek.type_names[oid] = (namespace, name)
        elif kind == b"R":
            pos = 5
            _namespace, pos = _cstring(data, pos)
            _relname, pos = _cstring(data, pos)
            pos += 1  # replica identity
            (ncols,) = _I16.unpack_from(data, pos)
            pos += 2
            peek.columns = []
            for _ in range(ncols):
                pos += 1  # flags
                name, pos = _cstring(data, pos)
                oid, typmod = struct.unpack_from(">iI", data, pos)
                pos += 8
                peek.columns.append((name, oid, struct.unpack(">i", struct.pack(">I", typmod))[0]))
        elif kind == b"I":
            assert data[5:6] == b"N"
            peek.rows.append(_read_tuple(data, 6))
        else:
            assert kind in (b"B", b"C"), f"unexpected message {kind!r}"
    return peek


# --- expectations ----------------------------------------------------------------------

Expect = Callable[[object, str], object]  # (psycopg value, output text) → Python value


def typed(value: object, _text: str) -> object:
    return value


def text(_value: object, output: str) -> object:
    return output


def float4(value: object, _text: str) -> object:
    return _f4(value)


def _f4(value: object) -> object:
    if isinstance(value, list):
        return [_f4(v) for v in value]
    return None if value is None else struct.unpack(">f", struct.pack(">f", value))[0]


def stringified(value: object, _text: str) -> object:
    if isinstance(value, list):
        return [None if v is None else str(v) for v in value]
    return str(value)


def ints_from_text(_value: object, output: str) -> object:
    return int(output)


# Per-element output text of an array, through the element type's output function.
ELEMENT_TEXTS = (
    "coalesce((SELECT array_agg(CASE WHEN e IS NULL THEN NULL ELSE format('%s', e) END"
    " ORDER BY n) FROM unnest(c) WITH ORDINALITY AS u(e, n)), '{}')"
)


@dataclass
class Case:
    id: str
    column: str
    values: list[str]  # SQL expressions that the Spark type holds
    fallbacks: list[str] = field(default_factory=list)  # … and ones it cannot
    expect: Expect = typed
    select: str = "c"  # what psycopg loads as the reference value
    setup: str = ""
    ddl: str | None = None
    binary_same_as_text: bool = True

    def __post_init__(self) -> None:
        if self.expect is text:
            self.select = "NULL"


T = text
CASES = [
    Case("bool", "bool", ["true", "false"]),
    Case("int2", "int2", ["0", "-32768", "32767"]),
    Case("int4", "int4", ["0", "-2147483648", "2147483647"]),
    Case("int8", "int8", ["0", "-9223372036854775808", "9223372036854775807"]),
    Case("oid", "oid", ["0", "4294967295"], expect=ints_from_text),
    Case("xid", "xid", ["'0'", "'4294967295'"], expect=ints_from_text),
    Case("cid", "cid", ["'0'", "'4294967295'"], expect=ints_from_text),
    Case(
        "float4",
        "float4",
        ["'NaN'", "'Infinity'", "'-Infinity'", "1.1", "'-0'", "3.4028235e38", "1e-45", "0.1"],
        expect=float4,
    ),
    Case(
        "float8",
        "float8",
        ["'NaN'", "'Infinity'", "'-Infinity'", "0.1", "'-0'", "1e308", "5e-324", "1e15"],
    ),
    Case("numeric_10_2", "numeric(10,2)", ["12.5", "-99999999.99", "0"], fallbacks=["'NaN'"]),
    Case(
        "numeric_38_10",
        "numeric(38,10)",
        ["1234567890123456789012345678.0123456789", "-0.0000000001"],
        fallbacks=["'NaN'"],
    ),
    Case(
        "numeric",
        "numeric",
        [
            "0",
            "-1.5",
            "1e100",
            "0.000000000000000000001",
            "123.4500",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "-12345678901234567890.123456789012345678901",
            "10000",
            "0.0001",
        ],
        expect=T,
    ),
    Case("numeric_50_5", "numeric(50,5)", ["1.5", "'NaN'"], expect=T),
    Case("numeric_neg_scale", "numeric(5,-2)", ["12345", "-99900"], expect=T),
    Case("numeric_scale_gt_p", "numeric(3,5)", ["0.00123", "-0.00999"], expect=T),
    Case(
        "money",
        "money",
        ["-1234.56", "0", "92233720368547758.07", "-92233720368547758.08", "0.5"],
        select="c::numeric",
    ),
    Case("text", "text", ["''", "'héllo ✓ 😀'", r"E'a\"b\\c\n\td'", "'NULL'", "repeat('x', 3000)"]),
    Case("varchar", "varchar(10)", ["''", "'abc '"]),
    Case("bpchar", "char(5)", ["'ab'", "''", "'abcde'"]),
    Case("name", "name", ["'pg_catalog'"]),
    Case("char", '"char"', ["'a'", "'\\200'", "'\\001'"], expect=T),
    Case(
        "bytea",
        "bytea",
        [r"'\x'::bytea", r"'\x00ff0041'::bytea", "decode(repeat('00', 100), 'hex')"],
    ),
    Case(
        "date",
        "date",
        ["'2000-01-01'", "'0001-01-01'", "'9999-12-31'", "'2024-02-29'"],
        fallbacks=[
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 BC'",
            "'0001-12-31 BC'",
            "'10000-01-01'",
            "'4713-01-01 BC'",
            "'5874897-12-31'",
        ],
    ),
    Case(
        "timestamp",
        "timestamp",
        ["'2024-02-29 12:34:56.789'", "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'"],
        fallbacks=[
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 12:00:00.5 BC'",
            "'10000-01-01 00:00:00'",
            "'294276-12-31 23:59:59.999999'",
            "'4713-01-01 00:00:00 BC'",
        ],
    ),
    Case(
        "timestamptz",
        "timestamptz",
        [
            "'2024-06-01 12:00:00+05:30'",
            "'0001-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59.999999+00'",
            "'2000-01-01 00:00:00.000001-08'",
        ],
        fallbacks=[
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 12:00:00 BC'",
            "'9999-12-31 23:00:00-05'",
            "'4713-01-01 00:00:00+00 BC'",
        ],
    ),
    Case(
        "time", "time", ["'00:00:00'", "'23:59:59.999999'", "'12:00:00.5'", "'24:00:00'"], expect=T
    ),
    Case(
        "timetz",
        "timetz",
        ["'12:00:00+05:30'", "'00:00:00.25-08'", "'23:59:59.999999+15:59'", "'12:00+05:30:15'"],
        expect=T,
    ),
    Case(
        "interval",
        "interval",
        [
            "'1 year 2 months 3 days 04:05:06.5'",
            "'0'",
            "'-1 day'",
            "'-1 year -2 months'",
            "'1 day -1 second'",
            "'-0.5 sec'",
            "'-1 year +2 mons -3 days +04:05:06.000001'",
            "'178000000 years'",
            "'-2147483648 days'",
            "'2562047788:00:54.775807'",
            "'-2562047788:00:54.775807'",
            "'13 months'",
            "'-13 months'",
        ],
        expect=T,
    ),
    Case("uuid", "uuid", ["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"], expect=stringified),
    Case("json", "json", ['\'{"a": [1, 2.50, "x\\u00e9"],  "b": null}\'', "'[]'"], expect=T),
    Case("jsonb", "jsonb", ['\'{"a": [1, 2.50, "x\\u00e9"],  "b": null}\'', "'\"é\"'"], expect=T),
    Case(
        "xml",
        "xml",
        ["'<a b=\"1\">x &amp; y ✓</a>'", "'<?xml version=\"1.0\"?><r/>'", "'txt'"],
        expect=T,
    ),
    Case(
        "inet",
        "inet",
        [
            "'192.168.0.1'",
            "'10.0.0.0/8'",
            "'192.168.0.1/24'",
            "'0.0.0.0/0'",
            "'::1'",
            "'::'",
            "'2001:db8::1/64'",
            "'::ffff:1.2.3.4'",
            "'::1.2.3.4'",
            "'fe80::'",
            "'1:0:0:1:0:0:0:1'",
            "'1:0:1:0:1:0:1:0'",
            "'2001:DB8:0:0:1:0:0:1'",
            "'::ffff:0:102:304'",
        ],
        expect=T,
    ),
    Case(
        "cidr",
        "cidr",
        ["'10.0.0.0/8'", "'192.168.1.5/32'", "'2001:db8::/32'", "'::/0'", "'::1/128'"],
        expect=T,
    ),
    Case("macaddr", "macaddr", ["'08:00:2B:01:02:03'"], expect=T),
    Case("macaddr8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"], expect=T),
    Case("bit", "bit(4)", ["B'1010'", "B'0000'"], expect=T),
    Case("varbit", "varbit", ["B''", "B'101010101'", "B'1'", "B'11111111'"], expect=T),
    Case("pg_lsn", "pg_lsn", ["'16/B374D848'", "'0/0'"], expect=T),
    Case(
        "int4_array",
        "int4[]",
        ["'{1,2,NULL}'", "'{}'", "'{-2147483648}'"],
        fallbacks=["'{{1,2},{3,4}}'", "'[0:1]={1,2}'", "'[2:3][1:1]={{1},{2}}'"],
    ),
    Case(
        "text_array",
        "text[]",
        [
            "ARRAY['a b', 'NULL', NULL, '\"', E'\\\\', '', ',', '{x}', 'é', ' lead', E'tab\\t']",
            "'{}'",
        ],
        fallbacks=["ARRAY[['a','b'],['c',NULL]]", "'[5:5]={\"x y\"}'"],
    ),
    Case("numeric_array", "numeric(10,2)[]", ["'{1.5,NULL}'"], fallbacks=["'{1.5,NaN}'"]),
    Case(
        "float8_array",
        "float8[]",
        ["'{NaN,Infinity,0.1,-0}'"],
        fallbacks=[
            "'{{1e300,1.5},{NaN,-0}}'",
            "'{{1e15,1e16},{0.0001,0.00001}}'",
            "'{{123456789012345678,1}}'",
        ],
    ),
    Case(
        "float4_array",
        "float4[]",
        ["'{1.1,NULL}'"],
        fallbacks=[
            "'{{1.1,3.4028235e38},{1e-45,-0}}'",
            "'{{100000,1000000},{0.0001,0.00001}}'",
            "'{{16777216,0.3}}'",
        ],
        expect=float4,
    ),
    Case(
        "date_array",
        "date[]",
        ["'{2000-01-01,NULL}'"],
        fallbacks=["'{infinity,2000-01-01}'", "'{0044-03-15 BC}'"],
    ),
    Case(
        "timestamptz_array",
        "timestamptz[]",
        ["ARRAY['2024-06-01 12:00:00+05:30'::timestamptz]"],
        fallbacks=[
            "ARRAY[['2024-06-01 12:00:00.5'::timestamptz, NULL]]",
            "ARRAY['10000-01-01'::timestamptz]",
        ],
    ),
    Case(
        "timestamp_array",
        "timestamp[]",
        ["ARRAY['2024-06-01 12:00:00'::timestamp]"],
        fallbacks=["'{{\"2024-06-01 12:00:00\"}}'"],
    ),
    Case(
        "bytea_array",
        "bytea[]",
        [r"ARRAY['\x00'::bytea, NULL, '\x'::bytea]"],
        fallbacks=[r"ARRAY[['\x00ff'::bytea]]"],
    ),
    Case("bool_array", "bool[]", ["'{t,f,NULL}'"], fallbacks=["'{{t},{f}}'"]),
    Case("int8_array", "int8[]", ["'{9223372036854775807}'"], fallbacks=["'[-1:-1]={1}'"]),
    Case("varchar_array", "varchar[]", ["'{a,\"b,c\"}'"], fallbacks=["'{{\"\"}}'"]),
    Case(
        "bpchar_array",
        "char(3)[]",
        ["ARRAY['a'::char(3), 'abc']"],
        fallbacks=["ARRAY[['a'::char(3)]]"],
    ),
    Case(
        "money_array",
        "money[]",
        ["'{1,-2.5,1234.56}'"],
        fallbacks=["'{{1234.56,-2}}'"],
        select="c::numeric[]",
    ),
    Case(
        "uuid_array",
        "uuid[]",
        ["ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL]"],
        fallbacks=["ARRAY[['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]]"],
        expect=stringified,
    ),
    Case(
        "interval_array",
        "interval[]",
        ["ARRAY['1 day -1 sec'::interval, NULL, '0']"],
        fallbacks=["ARRAY[['1 year'::interval, '-0.5 sec']]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "time_array",
        "time[]",
        ["ARRAY['12:00:00.5'::time]"],
        fallbacks=["ARRAY[['12:00'::time]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "timetz_array",
        "timetz[]",
        ["ARRAY['12:00:00.5+05:30'::timetz]"],
        fallbacks=["ARRAY[['12:00-08'::timetz]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "inet_array",
        "inet[]",
        ["ARRAY['::ffff:1.2.3.4'::inet, '10.0.0.1/8', '10.0.0.1']"],
        fallbacks=["ARRAY[['::1'::inet, '1.2.3.4/32']]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "cidr_array",
        "cidr[]",
        ["ARRAY['10.0.0.0/8'::cidr]"],
        fallbacks=["ARRAY[['::/0'::cidr]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "jsonb_array",
        "jsonb[]",
        ["ARRAY['{\"a\": \"b,c\"}'::jsonb, 'null', NULL]"],
        fallbacks=["ARRAY[['[1, 2]'::jsonb]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "json_array",
        "json[]",
        ["ARRAY['{\"a\" :  1}'::json]"],
        fallbacks=["ARRAY[['{}'::json]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "numeric_free_array",
        "numeric[]",
        ["'{1.50,NaN,-Infinity,NULL}'"],
        fallbacks=["'{{1e20,0.001}}'"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "bit_array", "varbit[]", ["'{1,0101,\"\"}'"], fallbacks=["'{{1,01}}'"], select=ELEMENT_TEXTS
    ),
    Case(
        "macaddr_array",
        "macaddr[]",
        ["'{08:00:2b:01:02:03}'"],
        fallbacks=["'{{08:00:2b:01:02:03}}'"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "char_array",
        '"char"[]',
        ['\'{a,"\\\\\\\\200"}\'::"char"[]'],
        fallbacks=["'{{a}}'"],
        select=ELEMENT_TEXTS,
    ),
    Case("oid_array", "oid[]", ["'{0,4294967295}'"], fallbacks=["'{{1}}'"]),
    Case(
        "xml_array",
        "xml[]",
        ["ARRAY['<a x=\"1\"/>'::xml]"],
        fallbacks=["ARRAY[['<b/>'::xml]]"],
        select=ELEMENT_TEXTS,
    ),
    Case(
        "enum",
        "mood",
        ["'sad'", "'ok ✓'"],
        setup="CREATE TYPE mood AS ENUM ('sad', 'ok ✓')",
    ),
    Case(
        "enum_array",
        "mood[]",
        ["'{sad,\"ok ✓\",NULL}'"],
        fallbacks=["'{{sad}}'"],
        select=ELEMENT_TEXTS,
        setup="CREATE TYPE mood AS ENUM ('sad', 'ok ✓')",
    ),
    Case("domain_int4", "di", ["0", "2147483647"], setup="CREATE DOMAIN di AS int4"),
    Case(
        "domain_numeric",
        "dn",
        ["12.5", "-99999999.99", "'NaN'"],
        setup="CREATE DOMAIN dn AS numeric(10,2)",
        expect=T,
    ),
    Case(
        "domain_int4_array",
        "dia",
        ["'{1,NULL}'"],
        fallbacks=["'{{1}}'"],
        setup="CREATE DOMAIN dia AS int4[]",
    ),
    Case(
        "domain_over_enum",
        "dm",
        ["'sad'"],
        setup="CREATE TYPE mood AS ENUM ('sad'); CREATE DOMAIN dm AS mood",
    ),
    Case("unknown_builtin", "point", ["'(1,2.5)'"], expect=T, binary_same_as_text=False),
]


# --- comparison ------------------------------------------------------------------------


def same(a: object, b: object) -> bool:
    """Equal, of the same type, NaN equal to NaN, -0.0 not 0.0, decimals at equal scale."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )  # type: ignore[arg-type]
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime):
        return a == b and a.utcoffset() == b.utcoffset()  # type: ignore[union-attr]
    return a == b


def _setup(conn: psycopg.Connection, case: Case) -> None:
    for statement in SESSION:
        conn.execute(statement)
    if case.setup:
        conn.execute(case.setup)
    conn.execute(f"CREATE TABLE t (id int PRIMARY KEY, c {case.column})")
    conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    # Slot names are cluster-wide, unlike the per-test database.
    conn.execute("SELECT pg_create_logical_replication_slot(current_database(), 'pgoutput')")


@contextmanager
def _source(pg_dsn: str, case: Case) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _setup(conn, case)
        try:
            yield conn
        finally:
            # The cluster allows a limited number of slots, and a slot pins WAL.
            conn.execute("SELECT pg_drop_replication_slot(current_database())")


def _peek(conn: psycopg.Connection, binary: bool) -> Peek:
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(current_database(), NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'pub', 'binary', %s)",
        ("true" if binary else "false",),
    ).fetchall()
    return parse_peek([bytes(r[0]) for r in rows])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_type_round_trip(pg_dsn: str, case: Case) -> None:
    literals = case.values + case.fallbacks
    with _source(pg_dsn, case) as conn:
        for i, literal in enumerate(literals):
            try:
                conn.execute(f"INSERT INTO t VALUES ({i}, {literal})")
            except psycopg.errors.FeatureNotSupported as exc:
                # pgserver's PostgreSQL 16 is built without libxml: it refuses every xml
                # value, which is all there is to check on that server.
                assert "xml" in case.id and "libxml" in str(exc), exc
                return
        conn.execute(f"INSERT INTO t VALUES ({len(literals)}, NULL)")

        outputs = [
            r[0] for r in conn.execute("SELECT format('%s', c) FROM t ORDER BY id").fetchall()
        ]
        text_peek, binary_peek = _peek(conn, binary=False), _peek(conn, binary=True)
        assert len(text_peek.rows) == len(binary_peek.rows) == len(literals) + 1

        _name, oid, typmod = text_peek.columns[1]
        assert binary_peek.columns[1] == text_peek.columns[1]
        pg_type = resolve_type(oid, typmod, text_peek.type_names)
        assert resolve_type(oid, typmod, binary_peek.type_names) is pg_type

        for i, literal in enumerate(literals):
            text_value, binary_value = text_peek.rows[i][1], binary_peek.rows[i][1]
            assert isinstance(text_value, str)
            assert isinstance(binary_value, bytes), "binary=true must send this type in binary"
            from_text = pg_type.convert(text_value)
            from_binary = pg_type.convert(binary_value)
            where = f"{case.id} {literal}: text {text_value!r}"

            if literal in case.fallbacks:
                assert from_text == Fallback(outputs[i]), where
            else:
                assert not isinstance(from_text, Fallback), where
                loaded = (
                    None
                    if case.select == "NULL"
                    else conn.execute(f"SELECT {case.select} FROM t WHERE id = {i}").fetchone()[0]
                )
                expected = case.expect(loaded, outputs[i])
                assert same(from_text, expected), f"{where}: {from_text!r} != {expected!r}"
            if case.binary_same_as_text:
                assert same(from_binary, from_text), f"{where}: binary gave {from_binary!r}"
            else:
                assert from_binary == "\\x" + binary_value.hex()
        # NULL arrives as 'n' in both formats.
        assert text_peek.rows[-1][1] is None and binary_peek.rows[-1][1] is None

        # The whole column at once, as the executors convert it: the per-value results,
        # and the same in both formats.
        target = arrow_type(pg_type)
        columns = []
        for peek in (text_peek, binary_peek):
            values = [row[1] for row in peek.rows]
            assert_same(pg_type, values, target)
            array, fallbacks = pg_type.convert_column(values, target)
            columns.append((exact(array.to_pylist()), fallbacks))
        if case.binary_same_as_text:
            assert columns[0] == columns[1], case.id


def test_timestamptz_values_are_utc(pg_dsn: str) -> None:
    case = Case("tz", "timestamptz", ["'2024-06-01 12:00:00+05:30'"])
    with _source(pg_dsn, case) as conn:
        conn.execute("INSERT INTO t VALUES (1, '2024-06-01 12:00:00+05:30')")
        for binary in (False, True):
            peek = _peek(conn, binary)
            _name, oid, typmod = peek.columns[1]
            value = resolve_type(oid, typmod, peek.type_names).convert(peek.rows[0][1])  # type: ignore[arg-type]
            assert isinstance(value, datetime)
            assert value.utcoffset() == timedelta(0)
            assert value.replace(tzinfo=None) == datetime(2024, 6, 1, 6, 30)


def test_numeric_typmods_and_domains_resolve_as_documented(pg_dsn: str) -> None:
    case = Case(
        "ddl",
        "numeric(10,2)",
        [],
        setup="CREATE DOMAIN di AS int4; CREATE TYPE mood AS ENUM ('a')",
    )
    with _source(pg_dsn, case) as conn:
        conn.execute(
            "ALTER TABLE t ADD COLUMN a numeric(38,0), ADD COLUMN b numeric(39,2),"
            " ADD COLUMN d di, ADD COLUMN e mood, ADD COLUMN f mood[], ADD COLUMN g di[],"
            " ADD COLUMN h numeric(5,-2)"
        )
        conn.execute("INSERT INTO t (id) VALUES (1)")
        peek = _peek(conn, binary=False)
        ddl = {
            name: resolve_type(oid, typmod, peek.type_names).spark_ddl
            for name, oid, typmod in peek.columns
        }
    assert ddl == {
        "id": "int",
        "c": "decimal(10,2)",
        "a": "decimal(38,0)",
        "b": "string",
        "d": "int",
        "e": "string",
        "f": "array<string>",
        "g": "array<string>",
        "h": "string",
    }
