"""The deletion vector format, from byte vectors laid out by hand after the Delta protocol."""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np
import pytest

from slotlake.deletion_vector import (
    MAGIC,
    DeletionVectorError,
    DeletionVectorFile,
    descriptor_file,
    deserialize,
    isin_positions,
    read,
    serialize,
    union,
    unique_positions,
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


@pytest.mark.parametrize("seed", range(20))
def test_read_back_what_is_written(seed: int) -> None:
    rng = np.random.default_rng(seed)
    high = int(rng.choice([100, 70_000, 1 << 20, 1 << 34]))
    positions = np.unique(rng.integers(0, high, int(rng.integers(0, 20_000))))
    if seed % 4 == 0:  # dense runs: bitmap containers
        positions = np.union1d(positions, np.arange(1000, 9000))
    assert np.array_equal(deserialize(serialize(positions)), positions)


def test_run_containers() -> None:
    """Cookie 12347 with the container count in its high half, the run flags, no offsets
    below four containers; a run is (start, length - 1)."""
    runs = struct.pack("<I", 12347 | (1 << 16)) + bytes([0b01])  # two containers, first has runs
    runs += struct.pack("<HHHH", 0, 3, 1, 0)  # (key 0, 4 values), (key 1, 1 value)
    runs += struct.pack("<H", 2) + struct.pack("<HHHH", 3, 2, 65535, 0)  # 3..5 and 65535
    runs += struct.pack("<H", 7)  # key 1: the array [7]
    data = struct.pack("<iq", MAGIC, 1) + struct.pack("<i", 2) + runs
    base = 2 << 32
    assert deserialize(data).tolist() == [base + v for v in (3, 4, 5, 65535, 65536 + 7)]
    inconsistent = data.replace(struct.pack("<HHHH", 0, 3, 1, 0), struct.pack("<HHHH", 0, 9, 1, 0))
    with pytest.raises(DeletionVectorError, match="run container of key 0 is inconsistent"):
        deserialize(inconsistent)


def test_inline_and_file_vectors_are_checked(tmp_path) -> None:
    positions = np.array([2, 3, 99])
    data = serialize(positions)
    padded = data + b"\0" * (-len(data) % 4)
    inline = {"storageType": "i", "pathOrInlineDv": z85_encode(padded), "sizeInBytes": len(data)}
    assert read(str(tmp_path), inline).tolist() == [2, 3, 99]

    dv = DeletionVectorFile.new()
    desc = dv.add(positions)
    (tmp_path / dv.name).write_bytes(bytes(dv.body))
    assert read(str(tmp_path), desc).tolist() == [2, 3, 99]
    absolute = desc | {"storageType": "p", "pathOrInlineDv": (tmp_path / dv.name).as_uri()}
    assert read("/elsewhere", absolute).tolist() == [2, 3, 99]

    broken = bytearray(dv.body)
    broken[-1] ^= 0xFF
    (tmp_path / dv.name).write_bytes(bytes(broken))
    with pytest.raises(DeletionVectorError, match=f"{dv.name} at offset 1: checksum"):
        read(str(tmp_path), desc)
    with pytest.raises(DeletionVectorError, match="the log says"):
        read(str(tmp_path), desc | {"sizeInBytes": desc["sizeInBytes"] - 4})
    with pytest.raises(DeletionVectorError, match="magic number"):
        deserialize(b"\0" * 12)
    with pytest.raises(DeletionVectorError, match="truncated"):
        deserialize(data[:-1])


@pytest.mark.parametrize("seed", range(6))
def test_position_sets_agree_with_numpys(seed: int) -> None:
    """The MERGE's set operations on positions (sorted, unsorted, repeated, empty) give
    what numpy's general ones give, in the input's integer type."""
    rng = np.random.default_rng(seed)
    size = [0, 1, 2, 50, 3000, 20000][seed]
    base = rng.integers(0, 4 * size + 2, size, dtype=np.int64)
    for a in (base, np.sort(base), np.unique(base)):
        got = unique_positions(a)
        assert got.dtype == a.dtype and got.tolist() == np.unique(a).tolist()
    assert unique_positions(base.astype(np.uint64)).dtype == np.uint64
    other = rng.integers(0, 4 * size + 2, size // 2 + 1, dtype=np.int64)
    assert union(base, other).tolist() == np.union1d(base, other).tolist()
    assert union(base, other).dtype == np.int64
    ordered = np.unique(base)
    probe = np.concatenate([other, [-1, 4 * size + 5]])
    assert isin_positions(probe, ordered).tolist() == np.isin(probe, ordered).tolist()
    assert isin_positions(probe, base).tolist() == np.isin(probe, base).tolist()


def test_sorted_positions_are_kept_as_they_are() -> None:
    """Sorted positions without repeats come back as the same array (nothing copied)."""
    rows = np.arange(0, 10_000, 3, dtype=np.uint64)
    assert unique_positions(rows) is rows
    assert unique_positions(np.array([7, 7, 7])).tolist() == [7]
    assert isin_positions(np.array([1, 2]), np.empty(0, dtype=np.int64)).tolist() == [False, False]
