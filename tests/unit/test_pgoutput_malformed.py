"""pgoutput decoder on malformed input: always a DecodeError naming type, field and offset."""

from __future__ import annotations

from typing import Any

import pytest

from slotlake.pgoutput import MESSAGE_TYPES_BY_CODE, DecodeError, StreamAbort, decode
from tests.unit.test_pgoutput_decode import (
    OID,
    VECTOR_IDS,
    VECTORS,
    cstr,
    i32,
    i64,
    relation_column,
    tuple_data,
    u8,
    u16,
    u32,
    u64,
)


def decode_error(payload: bytes, in_stream: bool = False) -> DecodeError:
    with pytest.raises(DecodeError) as e:
        decode(payload, in_stream)
    err = e.value
    assert isinstance(err.offset, int) and 0 <= err.offset <= len(payload)
    # Raised cleanly: no half-related internal exception chained to it.
    assert err.__context__ is None and err.__cause__ is None
    return err


@pytest.mark.parametrize(("name", "payload", "in_stream", "expected"), VECTORS, ids=VECTOR_IDS)
def test_truncation_at_every_offset(
    name: str, payload: bytes, in_stream: bool, expected: Any
) -> None:
    cls_name = MESSAGE_TYPES_BY_CODE[payload[:1]].__name__
    for k in range(len(payload)):
        prefix = payload[:k]
        if isinstance(expected, StreamAbort) and k == 9:
            # The protocol-4 abort cut after the subxid is exactly the short shape.
            assert decode(prefix) == StreamAbort(expected.xid, expected.subxid, None, None)
            continue
        err = decode_error(prefix, in_stream)
        if k == 0:
            assert err.message_type is None and err.field == "type"
            continue
        assert err.message_type == cls_name, (k, str(err))
        assert str(err).startswith(f"{cls_name}: "), str(err)
        assert f"offset {err.offset}" in str(err)
        assert err.field and f"'{err.field}'" in str(err), str(err)


@pytest.mark.parametrize(("name", "payload", "in_stream", "expected"), VECTORS, ids=VECTOR_IDS)
@pytest.mark.parametrize("extra", [b"\x00", b"N", b"\xff\xff\xff\xff", b"x" * 17])
def test_trailing_bytes(
    name: str, payload: bytes, in_stream: bool, expected: Any, extra: bytes
) -> None:
    err = decode_error(payload + extra, in_stream)
    if isinstance(expected, StreamAbort) and expected.abort_lsn is None and len(extra) < 16:
        # 10..24 bytes: a protocol-4 abort cut short, not a short abort with extra bytes.
        assert err.field in ("abort_lsn", "abort_ts")
        return
    if isinstance(expected, StreamAbort) and expected.abort_lsn is None:
        assert err.field == "end" and err.offset == 25
        return
    assert err.field == "end"
    assert err.offset == len(payload)
    assert f"{len(extra)} trailing byte(s) after the message at offset {len(payload)}" in str(err)


def test_representative_error_messages() -> None:
    err = decode_error(b"I\x00\x00")
    assert str(err) == "Insert: truncated reading 'relation_oid' at offset 1 (need 4 bytes, 2 left)"
    assert (err.message_type, err.field, err.offset) == ("Insert", "relation_oid", 1)

    err = decode_error(b"I\x00\x00\x00\x07", in_stream=True)
    assert str(err) == "Insert: truncated reading 'relation_oid' at offset 5 (need 4 bytes, 0 left)"

    err = decode_error(b"I\x00\x00", in_stream=True)
    assert (err.field, err.offset) == ("xid", 1)

    err = decode_error(b"C" + u8(0) + u64(1) + u64(2) + b"\x00" * 3)
    assert str(err) == "Commit: truncated reading 'commit_ts' at offset 18 (need 8 bytes, 3 left)"

    payload = b"I" + u32(1) + b"N" + u16(3) + b"t" + i32(2) + b"ab" + b"n" + b"t" + i32(10) + b"abc"
    err = decode_error(payload)
    assert (
        str(err) == "Insert: truncated reading 'new[2].value' at offset 21 (need 10 bytes, 3 left)"
    )
    assert (err.field, err.offset) == ("new[2].value", 21)


def test_empty_payload() -> None:
    err = decode_error(b"")
    assert "empty payload" in str(err)
    assert (err.message_type, err.field, err.offset) == (None, "type", 0)


@pytest.mark.parametrize("code", sorted(set(range(256)) - {c[0] for c in MESSAGE_TYPES_BY_CODE}))
def test_unknown_type_byte(code: int) -> None:
    err = decode_error(bytes([code]) + b"\x00" * 30)
    assert (err.message_type, err.field, err.offset) == (None, "type", 0)
    assert f"unknown message type byte {bytes([code])!r} at offset 0" in str(err)


@pytest.mark.parametrize("kind", [b"x", b"N", b"T", b"\x00", b"\xff"])
def test_unknown_tuple_kind(kind: bytes) -> None:
    payload = b"I" + u32(1) + b"N" + u16(3) + b"t" + i32(1) + b"a" + b"n" + kind + b"\x00" * 8
    err = decode_error(payload)
    assert (err.message_type, err.field, err.offset) == ("Insert", "new[2].kind", 15)
    assert "unknown tuple value kind" in str(err)


def test_unknown_tuple_kind_in_old_tuple() -> None:
    payload = b"U" + u32(1) + b"O" + u16(1) + b"q" + b"N" + tuple_data(["a"])
    err = decode_error(payload)
    assert (err.field, err.offset) == ("old[0].kind", 8)


@pytest.mark.parametrize("marker", [b"X", b"n", b"\x00", b"I"])
def test_update_bad_sub_message_byte(marker: bytes) -> None:
    err = decode_error(b"U" + u32(OID) + marker + tuple_data(["a"]))
    assert (err.message_type, err.field, err.offset) == ("Update", "tuple_kind", 5)
    assert f"unexpected byte {marker.decode('latin-1')!r} for 'tuple_kind' at offset 5" in str(err)


@pytest.mark.parametrize("marker", [b"K", b"O", b"X"])
def test_update_old_tuple_not_followed_by_new(marker: bytes) -> None:
    # K or O, then something else than N: both parts present, or garbage.
    payload = b"U" + u32(OID) + b"K" + tuple_data(["a"]) + marker + tuple_data(["b"])
    err = decode_error(payload)
    assert (err.field, err.offset) == ("new_tuple_kind", 14)


def test_update_old_tuple_only() -> None:
    err = decode_error(b"U" + u32(OID) + b"O" + tuple_data(["a"]))
    assert (err.field, err.offset) == ("new_tuple_kind", 14)


@pytest.mark.parametrize("marker", [b"N", b"X"])
def test_delete_needs_k_or_o(marker: bytes) -> None:
    err = decode_error(b"D" + u32(OID) + marker + tuple_data(["a"]))
    assert (err.message_type, err.field, err.offset) == ("Delete", "tuple_kind", 5)


@pytest.mark.parametrize("marker", [b"K", b"O", b"X"])
def test_insert_needs_n(marker: bytes) -> None:
    err = decode_error(b"I" + u32(OID) + marker + tuple_data(["a"]))
    assert (err.message_type, err.field, err.offset) == ("Insert", "tuple_kind", 5)


def test_streamed_payload_decoded_as_not_streamed_fails() -> None:
    err = decode_error(b"I" + u32(0x8000_0000) + u32(OID) + b"N" + tuple_data(["a"]))
    assert err.field == "tuple_kind"


def test_relation_column_count_larger_than_payload() -> None:
    payload = (
        b"R" + u32(1) + cstr("s") + cstr("t") + b"d" + u16(500) + relation_column(1, "a", 23, -1)
    )
    err = decode_error(payload)
    assert (err.message_type, err.field, err.offset) == ("Relation", "ncolumns", 10)
    assert "column count 500" in str(err)


def test_relation_column_count_one_too_many() -> None:
    payload = (
        b"R"
        + u32(1)
        + cstr("s")
        + cstr("t")
        + b"d"
        + u16(2)
        + relation_column(1, "a_long_name", 23, -1)
    )
    err = decode_error(payload)
    assert err.field.startswith("columns[1].")


def test_tuple_column_count_larger_than_payload() -> None:
    payload = b"I" + u32(1) + b"N" + u16(65535) + b"n" * 10
    err = decode_error(payload)
    assert (err.field, err.offset) == ("new.ncolumns", 6)


@pytest.mark.parametrize("kind", [b"t", b"b"])
@pytest.mark.parametrize("length", [-1, -2147483648])
def test_negative_value_length(kind: bytes, length: int) -> None:
    payload = b"I" + u32(1) + b"N" + u16(2) + b"n" + kind + i32(length) + b"abc"
    err = decode_error(payload)
    assert (err.field, err.offset) == ("new[1].length", 10)
    assert f"negative length {length}" in str(err)


@pytest.mark.parametrize("kind", [b"t", b"b"])
@pytest.mark.parametrize("length", [4, 5, 8, 2147483647])
def test_oversized_value_length(kind: bytes, length: int) -> None:
    payload = b"I" + u32(1) + b"N" + u16(1) + kind + i32(length) + b"abc"
    err = decode_error(payload)
    assert (err.field, err.offset) == ("new[0].value", 13)


def test_value_length_overrunning_into_next_column() -> None:
    # Length too large by one swallows the next kind byte: the count is then wrong.
    payload = b"I" + u32(1) + b"N" + u16(2) + b"t" + i32(4) + b"abc" + b"n"
    err = decode_error(payload)
    assert err.field == "new[1].kind"


@pytest.mark.parametrize("length", [-1, 6, 2147483647])
def test_message_content_length(length: int) -> None:
    payload = b"M" + u8(1) + u64(1) + cstr("p") + i32(length) + b"hello"
    err = decode_error(payload)
    assert err.message_type == "Message"
    assert err.field in ("content_length", "content")


def test_message_flags_must_be_0_or_1() -> None:
    err = decode_error(b"M" + u8(2) + u64(1) + cstr("p") + i32(0))
    assert (err.field, err.offset) == ("flags", 1)


def test_stream_start_first_segment_must_be_0_or_1() -> None:
    err = decode_error(b"S" + u32(1) + u8(7))
    assert (err.field, err.offset) == ("first_segment", 5)


@pytest.mark.parametrize("code", [b"x", b"\x00", b"D", b"F"])
def test_relation_bad_replica_identity(code: bytes) -> None:
    err = decode_error(b"R" + u32(1) + cstr("s") + cstr("t") + code + u16(0))
    assert (err.field, err.offset) == ("replica_identity", 9)


@pytest.mark.parametrize("count", [0, 2, 4, 0xFFFF_FFFF])
def test_truncate_wrong_relation_count(count: int) -> None:
    err = decode_error(b"T" + u32(count) + u8(0) + u32(1) + u32(2) + u32(3))
    assert err.message_type == "Truncate"
    assert err.field in ("nrelations", "end")


@pytest.mark.parametrize("size", [*range(1, 9), *range(10, 25), 26, 33])
def test_stream_abort_lengths(size: int) -> None:
    payload = (b"A" + u32(1) + u32(2) + u64(3) + i64(4) + b"\x00" * 8)[:size]
    decode_error(payload)


BAD_UTF8 = b"\xc3\x28"  # invalid continuation byte


@pytest.mark.parametrize(
    ("payload", "field", "offset"),
    [
        (b"R" + u32(1) + BAD_UTF8 + b"\0" + cstr("t") + b"d" + u16(0), "namespace", 5),
        (b"R" + u32(1) + cstr("s") + b"ok" + BAD_UTF8 + b"\0" + b"d" + u16(0), "name", 9),
        (
            b"R"
            + u32(1)
            + cstr("s")
            + cstr("t")
            + b"d"
            + u16(1)
            + u8(0)
            + BAD_UTF8
            + b"\0"
            + u32(1)
            + i32(-1),
            "columns[0].name",
            13,
        ),
        (b"Y" + u32(1) + cstr("s") + b"\xff\0", "name", 7),
        (b"O" + u64(1) + b"\x80\0", "name", 9),
        (b"M" + u8(0) + u64(1) + b"\xfe\0" + i32(0), "prefix", 10),
        (b"b" + u64(1) + u64(2) + i64(3) + u32(4) + BAD_UTF8 + b"\0", "gid", 29),
        (b"K" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + BAD_UTF8 + b"\0", "gid", 30),
        (b"I" + u32(1) + b"N" + u16(1) + b"t" + i32(3) + b"a" + BAD_UTF8, "new[0].value", 14),
        (
            b"U" + u32(1) + b"O" + u16(1) + b"t" + i32(1) + b"\xff" + b"N" + u16(0),
            "old[0].value",
            13,
        ),
    ],
)
def test_invalid_utf8(payload: bytes, field: str, offset: int) -> None:
    err = decode_error(payload)
    assert (err.field, err.offset) == (field, offset)
    assert "invalid UTF-8" in str(err)


def test_binary_values_are_not_utf8_checked() -> None:
    msg = decode(b"I" + u32(1) + b"N" + u16(1) + b"b" + i32(2) + BAD_UTF8)
    assert msg.new == (BAD_UTF8,)


@pytest.mark.parametrize(
    "payload",
    [
        b"O" + u64(1) + b"no-nul",
        b"Y" + u32(1) + cstr("s") + b"t",
        b"R" + u32(1) + b"s",
        b"P" + u8(0) + u64(1) + u64(2) + i64(3) + u32(4) + b"gid",
    ],
)
def test_missing_nul_terminator(payload: bytes) -> None:
    err = decode_error(payload)
    assert "no NUL terminator" in str(err)
