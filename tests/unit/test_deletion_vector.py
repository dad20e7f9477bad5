"""The deletion vector format, from byte vectors laid out by hand after the Delta protocol."""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np
import pytest

from slotlake.deletion_vector import (
    MAGIC,
    DeletionVectorFile,
    descriptor_file,
    serialize,
    z85_decode,
    z85_encode,
)


def _roaring_header(*containers: tuple[int, int]) -> bytes:
    """Cookie 12346 (no runs), container count, (key, cardinality - 1) pairs."""
    out = struct.pack("<II", 12346, len(containers))
    for key, cardinality in containers:
        out += struct.pack("<HH", key, cardinality - 1)
    return out


def test_array_containers_in_two_32_bit_buckets() -> None:
    positions = np.array([70000, 5, 0, (1 << 32) + 1, 5], dtype=np.int64)  # unsorted, a duplicate
    low = (
        _roaring_header((0, 2), (1, 1))
        + struct.pack("<II", 24, 28)  # offsets: 8 header + 8 descriptive + 8 offsets
        + struct.pack("<HH", 0, 5)
        + struct.pack("<H", 70000 - 65536)
    )
    high = _roaring_header((0, 1)) + struct.pack("<I", 16) + struct.pack("<H", 1)
    expected = (
        struct.pack("<iq", MAGIC, 2) + struct.pack("<i", 0) + low + struct.pack("<i", 1) + high
    )
    assert serialize(positions) == expected


def test_a_dense_container_is_a_bitmap() -> None:
    expected = (
        struct.pack("<iq", MAGIC, 1)
        + struct.pack("<i", 0)
        + _roaring_header((0, 5000))
        + struct.pack("<I", 16)
        + b"\xff" * 625  # positions 0..4999: 625 full bytes, little-endian bit order
        + b"\x00" * (8192 - 625)
    )
    assert serialize(np.arange(5000)) == expected
    # At 4,096 values a container is still an array.
    assert len(serialize(np.arange(4096))) == 4 + 8 + 4 + 8 + 4 + 4 + 2 * 4096


def test_empty_vector() -> None:
    assert serialize(np.array([], dtype=np.int64)) == struct.pack("<iq", MAGIC, 0)


def test_z85_vectors() -> None:
    # ZeroMQ RFC 32's example, and a descriptor Spark 4.2 / Delta 4.4 wrote with its file.
    assert z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"
    assert z85_decode("HelloWorld") == bytes.fromhex("864FD26FB559F75B")
    file_id = uuid.UUID("8c88b004-0b6c-4a3f-9025-2815a88f88ed")
    assert z85_encode(file_id.bytes) == "JejXv3V5B1Kr(p&Se(=4"
    assert descriptor_file({"storageType": "u", "pathOrInlineDv": "JejXv3V5B1Kr(p&Se(=4"}) == (
        f"deletion_vector_{file_id}.bin"
    )
    assert descriptor_file(
        {"storageType": "u", "pathOrInlineDv": "ab" + z85_encode(file_id.bytes)}
    ) == (f"ab/deletion_vector_{file_id}.bin")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: z85_encode(b"abc"), "multiple of 4"),
        (lambda: z85_decode("abcd"), "multiple of 5"),
        (lambda: z85_decode("abc d"), "not a Z85 character"),
        (lambda: descriptor_file({"storageType": "i", "pathOrInlineDv": "x"}), "not a deletion"),
    ],
)
def test_bad_input_is_named(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_file_layout() -> None:
    dv = DeletionVectorFile.new()
    first = dv.add(np.array([3, 1, 2, 2]))
    second = dv.add(np.array([7]))
    body = bytes(dv.body)
    assert body[0] == 1  # format version
    for desc, positions in ((first, [1, 2, 3]), (second, [7])):
        at, size = desc["offset"], desc["sizeInBytes"]
        assert struct.unpack(">i", body[at : at + 4])[0] == size
        data = body[at + 4 : at + 4 + size]
        assert data == serialize(np.array(positions))
        assert struct.unpack(">I", body[at + 4 + size : at + 8 + size])[0] == zlib.crc32(data)
        assert desc["cardinality"] == len(positions)
        assert descriptor_file(desc) == dv.name
    assert first["offset"] == 1
    assert second["offset"] == 1 + 4 + first["sizeInBytes"] + 4
    assert len(body) == second["offset"] + 4 + second["sizeInBytes"] + 4
