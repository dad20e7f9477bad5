"""The raw store's envelope and files, with crafted pgoutput payloads."""

from __future__ import annotations

import os
import struct
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from slotlake.lsn import Lsn
from slotlake.raw import RAW_SCHEMA, RawWriter, iter_raw, raw_rows_of_types, read_raw

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


# -- crafted payloads (layouts from the PostgreSQL 16 message-format docs) -------------------
def begin(final_lsn: int, ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts, xid)


def commit(commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, ts)


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def relation(oid: int, xid: int | None = None) -> bytes:
    return b"R" + _xid(xid) + struct.pack(">I", oid) + b"public\0t\0d" + struct.pack(">h", 0)


def dml(kind: str, oid: int, xid: int | None = None) -> bytes:
    return kind.encode() + _xid(xid) + struct.pack(">I", oid) + b"N" + struct.pack(">h", 0)


def type_msg(oid: int, xid: int | None = None) -> bytes:
    return b"Y" + _xid(xid) + struct.pack(">I", oid) + b"public\0mood\0"


def logical_message(transactional: bool, xid: int | None = None) -> bytes:
    return b"M" + _xid(xid) + bytes([transactional]) + struct.pack(">Q", 1) + b"p\0\0\0\0\3abc"


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, first)


STREAM_STOP = b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, 0, commit_lsn, end_lsn, ts)


def stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack(">II", xid, subxid)


def write(tmp_path: Path, payloads: list[bytes], **kwargs: int) -> tuple[list[dict], object]:
    w = RawWriter(tmp_path / "raw", **kwargs)
    lsns = [0x1000 + i for i in range(len(payloads))]
    xids = [42] * len(payloads)
    w.append(lsns, xids, payloads)
    summary = w.close()
    return read_raw(tmp_path / "raw").to_pylist(), summary


def ts_of(pg_us: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=pg_us)


# -- envelope --------------------------------------------------------------------------------
def test_non_streamed_transaction_envelope(tmp_path: Path) -> None:
    final_lsn, end_lsn, ts = 0x1_6B37_48A0, 0x1_6B37_48D0, 800_000_000_123_456
    payloads = [
        logical_message(False),  # non-transactional, outside any transaction
        begin(final_lsn, ts, 731),
        type_msg(16390),
        relation(16400),
        dml("I", 16400),
        dml("U", 16400),
        dml("D", 16401),
        logical_message(True),
        commit(final_lsn, end_lsn, ts),
    ]
    rows, summary = write(tmp_path, payloads)

    assert [r["msg_type"] for r in rows] == ["M", "B", "Y", "R", "I", "U", "D", "M", "C"]
    assert [r["seq"] for r in rows] == list(range(9))
    assert [r["data"] for r in rows] == payloads
    assert [r["rel_oid"] for r in rows] == [
        None,
        None,
        None,
        16400,
        16400,
        16400,
        16401,
        None,
        None,
    ]
    assert [r["commit_lsn"] for r in rows] == [None] + [final_lsn] * 8
    assert [r["commit_ts"] for r in rows] == [None] + [ts_of(ts)] * 8
    assert [r["tx_ordinal"] for r in rows] == [None, 0, 1, 2, 3, 4, 5, 6, 7]
    assert all(r["stream_xid"] is None for r in rows)

    assert summary.last_complete_end_lsn == Lsn(end_lsn)
    assert summary.last_commit_lsn == Lsn(final_lsn)
    assert summary.transactions == 1
    assert summary.open_transaction is False
    assert summary.messages == 9
    assert summary.payload_bytes == sum(map(len, payloads))
    assert summary.first_lsn == Lsn(0x1000) and summary.last_lsn == Lsn(0x1008)


def test_commit_ts_is_unix_microseconds_utc(tmp_path: Path) -> None:
    rows, _ = write(tmp_path, [begin(10, 0, 1), commit(10, 20, 0)])
    assert rows[0]["commit_ts"] == PG_EPOCH
    table = read_raw(tmp_path / "raw")
    assert table.column("commit_ts").cast("int64").to_pylist() == [946_684_800_000_000] * 2


def test_streamed_transaction_envelope(tmp_path: Path) -> None:
    top, sub = 700, 701
    payloads = [
        stream_start(top, first=True),  # 0
        relation(16400, xid=top),  # 1
        dml("I", 16400, xid=top),  # 2
        dml("I", 16400, xid=sub),  # 3  a subtransaction's change: its own xid prefix
        STREAM_STOP,  # 4
        begin(0x5000, 5, 800),  # another, small transaction commits meanwhile
        dml("I", 16401),
        commit(0x5000, 0x5030, 5),
        stream_start(top, first=False),  # 5
        type_msg(16390, xid=top),  # 6
        dml("D", 16402, xid=sub),  # 7
        STREAM_STOP,  # 8
        stream_abort(top, sub),  # 9  drops the subtransaction only
        stream_commit(top, 0x6000, 0x6040, 9),  # 10
    ]
    rows, summary = write(tmp_path, payloads)

    assert [r["msg_type"] for r in rows] == list("SRIIEBICSYDEAc")
    assert [r["stream_xid"] for r in rows] == [top] * 5 + [None] * 3 + [top] * 6
    assert [r["tx_ordinal"] for r in rows] == [0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8, 9, 10]
    assert [r["rel_oid"] for r in rows] == [
        None, 16400, 16400, 16400, None, None, 16401, None, None, None, 16402, None, None, None,
    ]  # fmt: skip
    # In-stream rows do not know their commit yet; the 'c' row carries its own.
    assert [r["commit_lsn"] for r in rows] == [None] * 5 + [0x5000] * 3 + [None] * 5 + [0x6000]
    assert rows[-1]["commit_ts"] == ts_of(9)
    assert rows[0]["commit_ts"] is None

    assert summary.last_complete_end_lsn == Lsn(0x6040)
    assert summary.last_commit_lsn == Lsn(0x6000)
    assert summary.transactions == 1
    assert summary.streamed_committed == 1
    assert summary.streamed_aborted == 0
    assert summary.open_streams == []


def test_stream_abort_of_top_level_and_unfinished_streams(tmp_path: Path) -> None:
    payloads = [
        stream_start(900, first=True),
        dml("I", 1, xid=900),
        STREAM_STOP,
        stream_start(901, first=True),
        dml("U", 2, xid=901),
        STREAM_STOP,
        stream_abort(900, 900),
    ]
    rows, summary = write(tmp_path, payloads)
    assert [r["stream_xid"] for r in rows] == [900, 900, 900, 901, 901, 901, 900]
    assert [r["tx_ordinal"] for r in rows] == [0, 1, 2, 0, 1, 2, 3]
    assert summary.streamed_aborted == 1
    assert summary.open_streams == [901]  # must be discarded now; it comes again later
    assert summary.last_complete_end_lsn is None


def test_stream_ordinal_restarts_on_a_first_segment(tmp_path: Path) -> None:
    # xids wrap: a first segment always starts the count afresh for that xid.
    payloads = [
        stream_start(5, first=True),
        STREAM_STOP,
        stream_abort(5, 5),
        stream_start(5, first=True),
        dml("I", 1, xid=5),
        STREAM_STOP,
    ]
    rows, _ = write(tmp_path, payloads)
    assert [r["tx_ordinal"] for r in rows] == [0, 1, 2, 0, 1, 2]


def test_open_transaction_is_recorded(tmp_path: Path) -> None:
    _, summary = write(tmp_path, [begin(10, 0, 1), dml("I", 5)])
    assert summary.open_transaction is True
    assert summary.last_complete_end_lsn is None


def test_begin_inside_open_transaction_is_recorded(tmp_path: Path) -> None:
    _, summary = write(tmp_path, [begin(10, 0, 1), begin(20, 0, 2), commit(20, 30, 0)])
    assert summary.open_transaction is True
    assert summary.last_complete_end_lsn == Lsn(30)


@pytest.mark.parametrize(
    "payload",
    [b"", b"Z", b"B", b"B\x00\x01", b"I\x00", b"C", b"S\x00", b"c\x00\x00", b"A\x00", b"R"],
)
def test_unknown_or_truncated_payloads_never_fail(tmp_path: Path, payload: bytes) -> None:
    rows, summary = write(tmp_path, [payload, dml("I", 7)])
    assert rows[0]["data"] == payload
    assert rows[0]["msg_type"] == payload[:1].decode()
    assert rows[0]["commit_lsn"] is None and rows[0]["tx_ordinal"] is None
    assert rows[1]["rel_oid"] == 7
    assert summary.last_complete_end_lsn is None


def test_truncated_dml_inside_transaction_keeps_transaction_columns(tmp_path: Path) -> None:
    rows, summary = write(tmp_path, [begin(10, 0, 1), b"I\x00", commit(10, 30, 0)])
    assert rows[1]["rel_oid"] is None
    assert rows[1]["commit_lsn"] == 10 and rows[1]["tx_ordinal"] == 1
    assert summary.malformed == 1
    assert summary.last_complete_end_lsn == Lsn(30)


def test_lsn_above_int64_is_stored_signed(tmp_path: Path) -> None:
    high = 0xFFFF_FFFF_0000_0010
    w = RawWriter(tmp_path / "raw")
    w.append([high], [0xFFFF_FFFE], [begin(high, 0, 0xFFFF_FFFE)])
    summary = w.close()
    row = read_raw(tmp_path / "raw").to_pylist()[0]
    assert row["lsn"] == Lsn(high).to_signed() < 0
    assert Lsn.from_signed(row["lsn"]) == high
    assert Lsn.from_signed(row["commit_lsn"]) == high
    assert row["xid"] == 0xFFFF_FFFE
    assert summary.first_lsn == Lsn(high)


def test_signed_lsn_input_is_accepted(tmp_path: Path) -> None:
    # The cursor transport hands pg_lsn over as int64 already.
    high = Lsn(0xFFFF_FFFF_0000_0010)
    w = RawWriter(tmp_path / "raw")
    w.append([high.to_signed()], [1], [b"E"])
    assert w.close().first_lsn == high
    assert read_raw(tmp_path / "raw").column("lsn").to_pylist() == [high.to_signed()]


# -- files -----------------------------------------------------------------------------------
def test_rollover_row_groups_and_chunk_boundaries(tmp_path: Path) -> None:
    # 3 transactions of 4 rows (B I I C) fed in awkward chunks: the envelope state must
    # survive chunk, row-group and file boundaries.
    payloads: list[bytes] = []
    for k in range(3):
        payloads += [
            begin(100 * k, k, k),
            dml("I", 1),
            dml("U", 1),
            commit(100 * k, 100 * k + 8, k),
        ]
    lsns = list(range(len(payloads)))
    w = RawWriter(tmp_path / "raw", rows_per_file=5, row_group_rows=2)
    for a, b in [(0, 1), (1, 8), (8, 8), (8, 12)]:
        w.append(lsns[a:b], [9] * (b - a), payloads[a:b])
    summary = w.close()

    names = sorted(os.listdir(tmp_path / "raw"))
    assert names == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert summary.files == [str(tmp_path / "raw" / n) for n in names]
    rows_per_file = [pq.ParquetFile(tmp_path / "raw" / n).metadata.num_rows for n in names]
    groups_per_file = [pq.ParquetFile(tmp_path / "raw" / n).num_row_groups for n in names]
    assert rows_per_file == [5, 5, 2]
    assert groups_per_file == [3, 3, 1]
    assert summary.row_groups == 7
    meta = pq.ParquetFile(tmp_path / "raw" / names[0]).metadata
    assert meta.row_group(0).column(3).compression == "ZSTD"

    table = read_raw(tmp_path / "raw")
    assert table.schema == RAW_SCHEMA
    assert table.column("seq").to_pylist() == list(range(12))
    assert table.column("data").to_pylist() == payloads
    assert table.column("tx_ordinal").to_pylist() == [0, 1, 2, 3] * 3
    assert table.column("commit_lsn").to_pylist() == [0] * 4 + [100] * 4 + [200] * 4
    assert summary.transactions == 3
    assert summary.last_complete_end_lsn == Lsn(208)


def test_read_back_is_byte_for_byte(tmp_path: Path) -> None:
    rng = __import__("random").Random(7)
    payloads = [b"I" + rng.randbytes(rng.randrange(0, 5000)) for _ in range(3000)]
    payloads += [b"\x00", b"I\x00\x00\x00\x00\xff" * 100_000]
    w = RawWriter(tmp_path / "raw", rows_per_file=1000, row_group_rows=300)
    w.append(list(range(len(payloads))), list(range(len(payloads))), payloads)
    summary = w.close()
    assert len(summary.files) == 4
    assert read_raw(tmp_path / "raw").column("data").to_pylist() == payloads
    batches = list(iter_raw(tmp_path / "raw", batch_size=128))
    assert max(b.num_rows for b in batches) <= 128
    assert [d for b in batches for d in b.column("data").to_pylist()] == payloads
    # A single part reads too.
    assert read_raw(summary.files[0]).num_rows == 1000


def test_rows_of_types_across_files_and_row_groups(tmp_path: Path) -> None:
    # Messages in some row groups only (2 rows a group, 4 a part): the rows found keep
    # the peek's order across row groups and parts.
    payloads = [begin(100, 1, 1), dml("I", 1), commit(100, 108, 1)]
    payloads += [begin(200, 2, 2), logical_message(True), dml("I", 1)]
    payloads += [logical_message(True), commit(200, 208, 2), logical_message(False)]
    w = RawWriter(tmp_path / "raw", rows_per_file=4, row_group_rows=2)
    w.append(list(range(len(payloads))), [7] * len(payloads), payloads)
    w.close()
    got = raw_rows_of_types(tmp_path / "raw", ("M",), ["seq", "data"])
    assert got.column_names == ["seq", "data"]
    assert got.column("seq").to_pylist() == [4, 6, 8]
    commits = raw_rows_of_types(tmp_path / "raw", ("C", "c"), ["seq"])
    assert commits.column("seq").to_pylist() == [2, 7]
    none = raw_rows_of_types(tmp_path / "raw", ("T",), ["seq", "xid"])
    assert none.num_rows == 0 and none.schema.names == ["seq", "xid"]


def test_empty_writer_leaves_one_empty_part_with_the_schema(tmp_path: Path) -> None:
    summary = RawWriter(tmp_path / "raw").close()
    assert summary.messages == 0 and len(summary.files) == 1
    table = read_raw(tmp_path / "raw")
    assert table.num_rows == 0 and table.schema == RAW_SCHEMA
    assert summary.first_lsn is None and summary.last_complete_end_lsn is None


def test_refuses_a_directory_with_parts(tmp_path: Path) -> None:
    RawWriter(tmp_path / "raw").close()
    with pytest.raises(FileExistsError):
        RawWriter(tmp_path / "raw")


def test_failure_leaves_no_half_written_part(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), RawWriter(tmp_path / "raw", row_group_rows=2) as w:
        w.append([1, 2, 3], [1, 1, 1], [b"E", b"E", b"E"])
        raise RuntimeError("peek failed")
    assert os.listdir(tmp_path / "raw") == []


def test_append_checks_lengths_and_close_is_idempotent(tmp_path: Path) -> None:
    w = RawWriter(tmp_path / "raw")
    with pytest.raises(ValueError):
        w.append([1], [1, 2], [b"E"])
    first = w.close()
    assert w.close() is first
    with pytest.raises(RuntimeError):
        w.append([1], [1], [b"E"])


# -- the vectorised envelope must equal the row-by-row one ----------------------------------
def _random_peek(rng: object, n_tx: int) -> list[bytes]:
    """Transactions (sometimes streamed, sometimes odd) in a plausible peek order."""
    import random

    assert isinstance(rng, random.Random)
    out: list[bytes] = []
    lsn = 0x10_0000
    for k in range(n_tx):
        lsn += rng.randrange(1, 5000)
        if rng.random() < 0.1:
            out.append(logical_message(False))
        if rng.random() < 0.15:
            xid = 1000 + k
            out.append(stream_start(xid, True))
            out += [dml(rng.choice("IUD"), 16384, xid=xid) for _ in range(rng.randrange(0, 4))]
            out.append(STREAM_STOP)
            out.append(stream_commit(xid, lsn, lsn + 40, k))
            continue
        out.append(begin(lsn + (1 << 63 if rng.random() < 0.05 else 0), k * 1000, 700 + k))
        for _ in range(rng.randrange(0, 12)):
            r = rng.random()
            if r < 0.1:
                out.append(relation(16384 + rng.randrange(3)))
            elif r < 0.15:
                out.append(type_msg(20000))
            elif r < 0.2:
                out.append(logical_message(True))
            elif r < 0.22:
                out.append(rng.choice([b"I\x00", b"", b"\xc3x", b"B"]))
            else:
                out.append(dml(rng.choice("IUD"), 16384 + rng.randrange(3)))
        if rng.random() < 0.97:
            out.append(commit(lsn, lsn + 24, k * 1000))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_envelope_equals_the_row_loop(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import itertools
    import random

    rng = random.Random(seed)
    payloads = _random_peek(rng, 200)
    cuts = sorted({0, len(payloads), *(rng.randrange(len(payloads)) for _ in range(8))})
    lsns = [rng.randrange(1 << 40) for _ in payloads]
    xids = [rng.randrange(1 << 32) for _ in payloads]

    taken: list[bool] = []

    def run(name: str, fast: bool) -> tuple[list[dict], object]:
        w = RawWriter(tmp_path / name, rows_per_file=300, row_group_rows=64)
        vectorised = w._envelope_fast

        def spy(data: object) -> object:
            out = vectorised(data) if fast else None  # type: ignore[arg-type]
            taken.append(out is not None)
            return out

        monkeypatch.setattr(w, "_envelope_fast", spy)
        for a, b in itertools.pairwise(cuts):
            w.append(lsns[a:b], xids[a:b], payloads[a:b])
        summary = w.close()
        return read_raw(tmp_path / name).to_pylist(), summary

    fast_rows, fast_summary = run("fast", True)
    slow_rows, slow_summary = run("slow", False)
    assert any(taken)  # the corpus exercises the vectorised path…
    assert fast_rows == slow_rows  # …and it agrees with the loop
    assert [r["data"] for r in fast_rows] == payloads
    fs, ss = vars(fast_summary), vars(slow_summary)
    assert {k: v for k, v in fs.items() if k not in ("directory", "files")} == {
        k: v for k, v in ss.items() if k not in ("directory", "files")
    }


def test_writer_thread_error_reaches_the_caller(tmp_path: Path) -> None:
    w = RawWriter(tmp_path / "raw", row_group_rows=2)

    def fail(table: object) -> None:
        raise OSError("disk full")

    w._write = fail  # type: ignore[method-assign]
    with pytest.raises(OSError, match="disk full"):
        for _ in range(10):
            w.append([1, 2], [1, 1], [b"E", b"E"])
        w.close()
    w.abort()
    assert [p for p in os.listdir(tmp_path / "raw") if p.endswith(".parquet")] == []
