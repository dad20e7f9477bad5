"""pgoutput decoder: hand-built payloads for every message type of protocol 1–4.

The payloads are assembled here field by field from the documented layouts
(PostgreSQL 16 docs, "Logical Replication Message Formats") by a tiny encoder
that shares no code with the decoder. ``VECTORS`` is reused by the malformed-input
and property tests.
"""

from __future__ import annotations

import copy
import pickle
import struct
from datetime import datetime, timezone
from typing import Any

import pytest

import slotlake.pgoutput as pgo
from slotlake.lsn import Lsn
from slotlake.pgoutput import (
    MESSAGE_TYPES,
    MESSAGE_TYPES_BY_CODE,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    DecodeError,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    UnchangedToast,
    Update,
    decode,
    pg_timestamp_to_datetime,
)
from slotlake.pgoutput.checked import decode_checked

# -- a test-side encoder -----------------------------------------------------------------


def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u16(v: int) -> bytes:
    return struct.pack(">H", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def tuple_data(values: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode column values the way pgoutput does (None→n, UNCHANGED_TOAST→u, str→t, bytes→b)."""
    out = [u16(len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif v is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(v, str):
            raw = v.encode()
            out.append(b"t" + i32(len(raw)) + raw)
        else:
            out.append(b"b" + i32(len(v)) + bytes(v))
    return b"".join(out)


def sxid(xid: int | None) -> bytes:
    return b"" if xid is None else u32(xid)


def relation_column(flags: int, name: str, type_oid: int, typmod: int) -> bytes:
    return u8(flags) + cstr(name) + u32(type_oid) + i32(typmod)


# Distinctive values: top bits set, so a signed/unsigned mix-up shows.
LSN_A = 0x0000_0016_B374_D848
LSN_B = 0xFFFF_FFFF_0000_0001
TS = 765_432_109_876_543  # 2024-04-03T04:01:49.876543Z in PostgreSQL µs
XID = 0xFFFF_FFF0
OID = 0x8000_0001

ROW = ("42", None, UNCHANGED_TOAST, "", b"", b"\x00\xff", "Zoë 🐘 ünïcødé", "x" * 300)


def V(
    name: str, payload: bytes, expected: Any, in_stream: bool = False
) -> tuple[str, bytes, bool, Any]:
    return (name, payload, in_stream, expected)


VECTORS: list[tuple[str, bytes, bool, Any]] = [
    V(
        "begin",
        b"B" + u64(LSN_B) + i64(TS) + u32(XID),
        Begin(Lsn(LSN_B), TS, XID),
    ),
    V(
        "begin-negative-ts",
        b"B" + u64(LSN_A) + i64(-1) + u32(1),
        Begin(Lsn(LSN_A), -1, 1),
    ),
    V(
        "commit",
        b"C" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS),
        Commit(0, Lsn(LSN_A), Lsn(LSN_B), TS),
    ),
    V(
        "origin",
        b"O" + u64(LSN_A) + cstr("pg_16385"),
        Origin(Lsn(LSN_A), "pg_16385"),
    ),
    V(
        "relation",
        b"R"
        + u32(OID)
        + cstr("public")
        + cstr("Ünïcode table")
        + b"d"
        + u16(3)
        + relation_column(1, "id", 20, -1)
        + relation_column(0, "name", 1043, 44)
        + relation_column(0, "", 0xFFFF_FFFE, -2147483648),
        Relation(
            None,
            OID,
            "public",
            "Ünïcode table",
            "d",
            (
                RelationColumn(1, "id", 20, -1),
                RelationColumn(0, "name", 1043, 44),
                RelationColumn(0, "", 0xFFFF_FFFE, -2147483648),
            ),
        ),
    ),
    V(
        "relation-no-columns-pg_catalog",
        b"R" + u32(1) + cstr("") + cstr("t") + b"n" + u16(0),
        Relation(None, 1, "", "t", "n", ()),
    ),
    V(
        "relation-full",
        b"R" + u32(2) + cstr("s") + cstr("t") + b"f" + u16(1) + relation_column(1, "a", 23, -1),
        Relation(None, 2, "s", "t", "f", (RelationColumn(1, "a", 23, -1),)),
    ),
    V(
        "relation-index-streamed",
        b"R"
        + u32(XID)
        + u32(3)
        + cstr("s")
        + cstr("t")
        + b"i"
        + u16(1)
        + relation_column(1, "a", 23, -1),
        Relation(XID, 3, "s", "t", "i", (RelationColumn(1, "a", 23, -1),)),
        True,
    ),
    V(
        "type",
        b"Y" + u32(16390) + cstr("public") + cstr("mood"),
        Type(None, 16390, "public", "mood"),
    ),
    V(
        "type-streamed",
        b"Y" + u32(7) + u32(16390) + cstr("") + cstr("citext"),
        Type(7, 16390, "", "citext"),
        True,
    ),
    V(
        "insert",
        b"I" + u32(OID) + b"N" + tuple_data(ROW),
        Insert(None, OID, ROW),
    ),
    V(
        "insert-ascii",
        b"I" + u32(1) + b"N" + tuple_data(["1", "abc", None, b"\x01\x02"]),
        Insert(None, 1, ("1", "abc", None, b"\x01\x02")),
    ),
    V(
        "insert-zero-columns",
        b"I" + u32(1) + b"N" + tuple_data([]),
        Insert(None, 1, ()),
    ),
    V(
        "insert-trailing-null",
        b"I" + u32(1) + b"N" + tuple_data(["a", None]),
        Insert(None, 1, ("a", None)),
    ),
    V(
        "insert-streamed",
        b"I" + u32(XID) + u32(OID) + b"N" + tuple_data(ROW),
        Insert(XID, OID, ROW),
        True,
    ),
    V(
        "update-new-only",
        b"U" + u32(OID) + b"N" + tuple_data(ROW),
        Update(None, OID, None, None, ROW),
    ),
    V(
        "update-key",
        b"U"
        + u32(OID)
        + b"K"
        + tuple_data(["7", None, None])
        + b"N"
        + tuple_data(["8", "b", UNCHANGED_TOAST]),
        Update(None, OID, "K", ("7", None, None), ("8", "b", UNCHANGED_TOAST)),
    ),
    V(
        "update-old",
        b"U"
        + u32(OID)
        + b"O"
        + tuple_data(["7", "é", b"\x00"])
        + b"N"
        + tuple_data(["7", "ê", b""]),
        Update(None, OID, "O", ("7", "é", b"\x00"), ("7", "ê", b"")),
    ),
    V(
        "update-old-streamed",
        b"U" + u32(9) + u32(OID) + b"O" + tuple_data(["1"]) + b"N" + tuple_data(["2"]),
        Update(9, OID, "O", ("1",), ("2",)),
        True,
    ),
    V(
        "update-new-only-streamed",
        b"U" + u32(9) + u32(OID) + b"N" + tuple_data(["2", UNCHANGED_TOAST]),
        Update(9, OID, None, None, ("2", UNCHANGED_TOAST)),
        True,
    ),
    V(
        "delete-key",
        b"D" + u32(OID) + b"K" + tuple_data(["7", None, None]),
        Delete(None, OID, "K", ("7", None, None)),
    ),
    V(
        # The usual DELETE: key columns, then a NULL for every other column.
        "delete-key-null-run",
        b"D" + u32(OID) + b"K" + tuple_data(["7", "k", *[None] * 7]),
        Delete(None, OID, "K", ("7", "k", *[None] * 7)),
    ),
    V(
        # A run of NULLs ending the old tuple, then the 'N' marker, not the payload's end.
        "update-key-null-run",
        b"U"
        + u32(OID)
        + b"K"
        + tuple_data(["7", *[None] * 6])
        + b"N"
        + tuple_data(["8", *[None] * 5, "nnnn"]),
        Update(None, OID, "K", ("7", *[None] * 6), ("8", *[None] * 5, "nnnn")),
    ),
    V(
        "delete-old",
        b"D" + u32(OID) + b"O" + tuple_data(["7", "ü", b"\xff"]),
        Delete(None, OID, "O", ("7", "ü", b"\xff")),
    ),
    V(
        "delete-key-streamed",
        b"D" + u32(XID) + u32(OID) + b"K" + tuple_data(["7"]),
        Delete(XID, OID, "K", ("7",)),
        True,
    ),
    V(
        "truncate-one",
        b"T" + u32(1) + u8(0) + u32(OID),
        Truncate(None, 0, (OID,)),
    ),
    V(
        "truncate-many-cascade-restart",
        b"T" + u32(3) + u8(3) + u32(16384) + u32(16390) + u32(0xFFFF_FFFF),
        Truncate(None, 3, (16384, 16390, 0xFFFF_FFFF)),
    ),
    V(
        "truncate-streamed-restart",
        b"T" + u32(5) + u32(2) + u8(2) + u32(1) + u32(2),
        Truncate(5, 2, (1, 2)),
        True,
    ),
    V(
        "message-transactional",
        b"M" + u8(1) + u64(LSN_A) + cstr("slotlake") + i32(5) + b"hello",
        Message(None, True, Lsn(LSN_A), "slotlake", b"hello"),
    ),
    V(
        "message-non-transactional-binary",
        b"M" + u8(0) + u64(LSN_B) + cstr("pfx/ü") + i32(4) + b"\x00\xff\x00\x80",
        Message(None, False, Lsn(LSN_B), "pfx/ü", b"\x00\xff\x00\x80"),
    ),
    V(
        "message-empty",
        b"M" + u8(0) + u64(1) + cstr("") + i32(0),
        Message(None, False, Lsn(1), "", b""),
    ),
    V(
        "message-streamed",
        b"M" + u32(XID) + u8(1) + u64(LSN_A) + cstr("p") + i32(1) + b"\x00",
        Message(XID, True, Lsn(LSN_A), "p", b"\x00"),
        True,
    ),
    V("stream-start-first", b"S" + u32(XID) + u8(1), StreamStart(XID, True)),
    V("stream-start-next", b"S" + u32(1) + u8(0), StreamStart(1, False)),
    V("stream-stop", b"E", StreamStop()),
    V(
        "stream-commit",
        b"c" + u32(XID) + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS),
        StreamCommit(XID, 0, Lsn(LSN_A), Lsn(LSN_B), TS),
    ),
    V("stream-abort", b"A" + u32(XID) + u32(XID), StreamAbort(XID, XID, None, None)),
    V(
        "stream-abort-subxact",
        b"A" + u32(100) + u32(101),
        StreamAbort(100, 101, None, None),
    ),
    V(
        "stream-abort-v4-parallel",
        b"A" + u32(100) + u32(101) + u64(LSN_B) + i64(TS),
        StreamAbort(100, 101, Lsn(LSN_B), TS),
    ),
    V(
        "begin-prepare",
        b"b" + u64(LSN_A) + u64(LSN_B) + i64(TS) + u32(XID) + cstr("gid-ü"),
        BeginPrepare(Lsn(LSN_A), Lsn(LSN_B), TS, XID, "gid-ü"),
    ),
    V(
        "prepare",
        b"P" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS) + u32(XID) + cstr("g1"),
        Prepare(0, Lsn(LSN_A), Lsn(LSN_B), TS, XID, "g1"),
    ),
    V(
        "commit-prepared",
        b"K" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS) + u32(XID) + cstr("g1"),
        CommitPrepared(0, Lsn(LSN_A), Lsn(LSN_B), TS, XID, "g1"),
    ),
    V(
        "rollback-prepared",
        b"r" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS) + i64(TS + 1) + u32(XID) + cstr(""),
        RollbackPrepared(0, Lsn(LSN_A), Lsn(LSN_B), TS, TS + 1, XID, ""),
    ),
    V(
        "stream-prepare",
        b"p" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS) + u32(XID) + cstr("g2"),
        StreamPrepare(0, Lsn(LSN_A), Lsn(LSN_B), TS, XID, "g2"),
    ),
]

VECTOR_IDS = [v[0] for v in VECTORS]

# in_stream only adds the xid to these; every other type ignores the flag.
STREAMABLE = set(b"RYIUDTM")


@pytest.mark.parametrize(("name", "payload", "in_stream", "expected"), VECTORS, ids=VECTOR_IDS)
def test_decodes_vector(name: str, payload: bytes, in_stream: bool, expected: Any) -> None:
    got = decode(payload, in_stream=in_stream)
    assert got == expected
    assert type(got) is type(expected)
    assert got.type_code == payload[:1]
    # The reference parser agrees on every valid vector.
    assert decode_checked(payload, in_stream) == expected


@pytest.mark.parametrize(("name", "payload", "in_stream", "expected"), VECTORS, ids=VECTOR_IDS)
def test_accepts_bytearray_and_memoryview(
    name: str, payload: bytes, in_stream: bool, expected: Any
) -> None:
    assert decode(bytearray(payload), in_stream) == expected
    assert decode(memoryview(payload), in_stream) == expected
    # A slice of a larger buffer, as from a pyarrow binary column.
    assert decode(memoryview(b"xx" + payload + b"yy")[2:-2], in_stream) == expected


@pytest.mark.parametrize(
    ("name", "payload", "in_stream", "expected"),
    [v for v in VECTORS if v[1][0] not in STREAMABLE],
    ids=[v[0] for v in VECTORS if v[1][0] not in STREAMABLE],
)
def test_in_stream_flag_is_ignored_where_no_xid(
    name: str, payload: bytes, in_stream: bool, expected: Any
) -> None:
    assert decode(payload, in_stream=not in_stream) == expected


def test_every_message_type_has_a_vector() -> None:
    assert {v[1][:1] for v in VECTORS} == set(MESSAGE_TYPES_BY_CODE)
    assert len(MESSAGE_TYPES) == 19
    assert {cls.type_code: cls for cls in MESSAGE_TYPES} == MESSAGE_TYPES_BY_CODE


def test_type_codes() -> None:
    assert {cls.__name__: cls.type_code for cls in MESSAGE_TYPES} == {
        "Begin": b"B",
        "Message": b"M",
        "Commit": b"C",
        "Origin": b"O",
        "Relation": b"R",
        "Type": b"Y",
        "Insert": b"I",
        "Update": b"U",
        "Delete": b"D",
        "Truncate": b"T",
        "StreamStart": b"S",
        "StreamStop": b"E",
        "StreamCommit": b"c",
        "StreamAbort": b"A",
        "BeginPrepare": b"b",
        "Prepare": b"P",
        "CommitPrepared": b"K",
        "RollbackPrepared": b"r",
        "StreamPrepare": b"p",
    }


def test_field_names_are_the_public_contract() -> None:
    assert Begin._fields == ("final_lsn", "commit_ts", "xid")
    assert Message._fields == ("xid", "transactional", "lsn", "prefix", "content")
    assert Commit._fields == ("flags", "commit_lsn", "end_lsn", "commit_ts")
    assert Origin._fields == ("commit_lsn", "name")
    assert RelationColumn._fields == ("flags", "name", "type_oid", "typmod")
    assert Relation._fields == ("xid", "oid", "namespace", "name", "replica_identity", "columns")
    assert Type._fields == ("xid", "oid", "namespace", "name")
    assert Insert._fields == ("xid", "relation_oid", "new")
    assert Update._fields == ("xid", "relation_oid", "old_kind", "old", "new")
    assert Delete._fields == ("xid", "relation_oid", "old_kind", "old")
    assert Truncate._fields == ("xid", "options", "relation_oids")
    assert StreamStart._fields == ("xid", "first_segment")
    assert StreamStop._fields == ()
    assert StreamCommit._fields == ("xid", "flags", "commit_lsn", "end_lsn", "commit_ts")
    assert StreamAbort._fields == ("xid", "subxid", "abort_lsn", "abort_ts")
    assert BeginPrepare._fields == ("prepare_lsn", "end_lsn", "prepare_ts", "xid", "gid")
    for cls in (Prepare, StreamPrepare):
        assert cls._fields == ("flags", "prepare_lsn", "end_lsn", "prepare_ts", "xid", "gid")
    assert CommitPrepared._fields == ("flags", "commit_lsn", "end_lsn", "commit_ts", "xid", "gid")
    assert RollbackPrepared._fields == (
        "flags",
        "prepare_end_lsn",
        "rollback_end_lsn",
        "prepare_ts",
        "rollback_ts",
        "xid",
        "gid",
    )


def test_package_exports() -> None:
    for name in pgo.__all__:
        assert hasattr(pgo, name), name
    assert issubclass(DecodeError, ValueError)


# -- decoded values in detail -------------------------------------------------------------


def test_tuple_values_have_the_documented_python_types() -> None:
    msg = decode(b"I" + u32(1) + b"N" + tuple_data(ROW))
    assert isinstance(msg, Insert)
    assert type(msg.new) is tuple
    assert [type(v).__name__ for v in msg.new] == [
        "str",
        "NoneType",
        "UnchangedToast",
        "str",
        "bytes",
        "bytes",
        "str",
        "str",
    ]
    assert msg.new[2] is UNCHANGED_TOAST
    assert msg.new[3] == ""
    assert msg.new[4] == b""


def test_lsns_are_lsn_instances_and_xids_unsigned() -> None:
    begin = decode(VECTORS[0][1])
    assert isinstance(begin.final_lsn, Lsn)
    assert str(begin.final_lsn) == "FFFFFFFF/1"
    assert begin.xid == XID  # > 2**31: read unsigned
    commit = decode(b"C" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS))
    assert isinstance(commit.commit_lsn, Lsn) and isinstance(commit.end_lsn, Lsn)
    assert str(commit.commit_lsn) == "16/B374D848"


def test_typmod_is_signed_and_key_flag() -> None:
    rel = decode(dict((v[0], v[1]) for v in VECTORS)["relation"])
    assert [c.typmod for c in rel.columns] == [-1, 44, -2147483648]
    assert [c.is_key for c in rel.columns] == [True, False, False]
    assert rel.columns[0].name == "id"


def test_truncate_option_properties() -> None:
    t = decode(b"T" + u32(1) + u8(0) + u32(5))
    assert (t.cascade, t.restart_identity) == (False, False)
    t = decode(b"T" + u32(1) + u8(1) + u32(5))
    assert (t.cascade, t.restart_identity) == (True, False)
    t = decode(b"T" + u32(1) + u8(2) + u32(5))
    assert (t.cascade, t.restart_identity) == (False, True)
    t = decode(b"T" + u32(1) + u8(3) + u32(5))
    assert (t.cascade, t.restart_identity) == (True, True)


def test_large_values_and_many_columns() -> None:
    big = "é" * 100_000
    values = (*(str(i) if i % 3 else None for i in range(1600)), big, b"\x00" * 70_000)
    msg = decode(b"I" + u32(1) + b"N" + tuple_data(values))
    assert msg.new == values


@pytest.mark.parametrize("nulls", [0, 1, 4, 5, 6, 40])
@pytest.mark.parametrize("key", [[], ["1"], ["nnnn", "n"], ["é", None, "x"]])
def test_runs_of_nulls(key: list[Any], nulls: int) -> None:
    # A run of five or more NULLs is taken in one step: it must end exactly where
    # the NULLs end, whatever surrounds it.
    for values in ([*key, *[None] * nulls], [*key, *[None] * nulls, "nn"], [None] * nulls + key):
        body = tuple_data(values)
        assert decode(b"I" + u32(1) + b"N" + body) == Insert(None, 1, tuple(values))
        assert decode(b"D" + u32(1) + b"K" + body) == Delete(None, 1, "K", tuple(values))
        update = b"U" + u32(1) + b"O" + body + b"N" + tuple_data(["z"])
        assert decode(update) == Update(None, 1, "O", tuple(values), ("z",))
        # One more 'n' than there are columns is a trailing byte, not a column.
        err = decode_error_of(b"D" + u32(1) + b"K" + body + b"n")
        assert (err.field, err.offset) == ("end", 6 + len(body))


def decode_error_of(payload: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as e:
        decode(payload)
    with pytest.raises(DecodeError) as ref:
        decode_checked(payload)
    assert str(e.value) == str(ref.value)
    return e.value


def test_more_columns_than_postgresql_sends() -> None:
    # At most 1664 columns come from a server; a wider TupleData is still read
    # (by the reference parser, not a compiled one).
    values = tuple(str(i) if i % 2 else None for i in range(2000))
    payload = b"I" + u32(1) + b"N" + tuple_data(values)
    assert decode(payload) == Insert(None, 1, values)
    err = decode_error_of(payload[:-1])
    assert err.field == "new[1999].value"


def test_a_column_count_the_payload_cannot_hold_compiles_nothing() -> None:
    from slotlake.pgoutput import decoder

    err = decode_error_of(b"I" + u32(1) + b"N" + u16(1500) + b"nnn")
    assert err.field == "new.ncolumns"
    assert 1500 not in decoder._TUPLE_PARSERS


# -- timestamps ---------------------------------------------------------------------------


def test_pg_timestamp_to_datetime() -> None:
    assert pg_timestamp_to_datetime(0) == datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert pg_timestamp_to_datetime(TS) == datetime(
        2024, 4, 3, 4, 1, 49, 876543, tzinfo=timezone.utc
    )
    assert pg_timestamp_to_datetime(-1) == datetime(
        1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc
    )
    assert pg_timestamp_to_datetime(TS).tzinfo is timezone.utc


@pytest.mark.parametrize(
    ("us", "text"),
    [(2**63 - 1, "infinity"), (-(2**63), "-infinity"), (300_000 * 365 * 86400 * 10**6, "µs")],
)
def test_pg_timestamp_out_of_range(us: int, text: str) -> None:
    with pytest.raises(ValueError, match="outside Python's datetime range") as e:
        pg_timestamp_to_datetime(us)
    assert text in str(e.value)


def test_time_properties() -> None:
    when = pg_timestamp_to_datetime(TS)
    assert Begin(Lsn(1), TS, 1).commit_time == when
    assert Commit(0, Lsn(1), Lsn(2), TS).commit_time == when
    assert StreamCommit(1, 0, Lsn(1), Lsn(2), TS).commit_time == when
    assert CommitPrepared(0, Lsn(1), Lsn(2), TS, 1, "g").commit_time == when
    assert BeginPrepare(Lsn(1), Lsn(2), TS, 1, "g").prepare_time == when
    assert Prepare(0, Lsn(1), Lsn(2), TS, 1, "g").prepare_time == when
    assert StreamPrepare(0, Lsn(1), Lsn(2), TS, 1, "g").prepare_time == when
    rb = RollbackPrepared(0, Lsn(1), Lsn(2), TS, 0, 1, "g")
    assert rb.prepare_time == when
    assert rb.rollback_time == datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert StreamAbort(1, 1, Lsn(1), TS).abort_time == when
    assert StreamAbort(1, 1, None, None).abort_time is None


# -- the objects themselves ---------------------------------------------------------------


def test_unchanged_toast_sentinel() -> None:
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert UnchangedToast() is UNCHANGED_TOAST
    assert UNCHANGED_TOAST is not None
    assert UNCHANGED_TOAST != None  # noqa: E711
    assert copy.copy(UNCHANGED_TOAST) is UNCHANGED_TOAST
    assert copy.deepcopy(UNCHANGED_TOAST) is UNCHANGED_TOAST
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST


@pytest.mark.parametrize(("name", "payload", "in_stream", "expected"), VECTORS, ids=VECTOR_IDS)
def test_messages_pickle_and_hash(
    name: str, payload: bytes, in_stream: bool, expected: Any
) -> None:
    msg = decode(payload, in_stream)
    back = pickle.loads(pickle.dumps(msg))
    assert back == msg and type(back) is type(msg)
    assert hash(back) == hash(msg)
    if isinstance(msg, (Insert, Update)):
        assert [v is UNCHANGED_TOAST for v in back.new] == [v is UNCHANGED_TOAST for v in msg.new]


def test_messages_are_immutable() -> None:
    msg = Insert(None, 1, ("a",))
    with pytest.raises(AttributeError):
        msg.relation_oid = 2  # type: ignore[misc]


def test_equality_requires_the_same_class() -> None:
    fields = (0, Lsn(1), Lsn(2), 3, 4, "g")
    assert Prepare(*fields) != StreamPrepare(*fields)
    assert not Prepare(*fields) == CommitPrepared(*fields)  # noqa: SIM201
    assert Prepare(*fields) == Prepare(*fields)
    assert not Prepare(*fields) != Prepare(*fields)  # noqa: SIM202
    assert StreamStop() != ()
    assert Insert(None, 1, ()) != (None, 1, ())
    assert RelationColumn(1, "a", 23, -1) != (1, "a", 23, -1)
    assert len({Prepare(*fields), StreamPrepare(*fields), Prepare(*fields)}) == 2


def test_decode_error_attributes_and_pickle() -> None:
    e = DecodeError("Insert", "relation_oid", 1, "truncated")
    back = pickle.loads(pickle.dumps(e))
    assert (back.message_type, back.field, back.offset, str(back)) == (
        "Insert",
        "relation_oid",
        1,
        "Insert: truncated",
    )


def test_non_bytes_input_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        decode("B")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        decode(21)  # type: ignore[arg-type]
