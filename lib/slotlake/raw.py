"""The raw batch store: every peeked payload byte-for-byte, plus a cheap envelope.

Raw Parquet is the batch's source of truth (DESIGN.md §3): reprocessing rebuilds
every output from it alone. The driver adds only what it can read from the first
bytes of each payload without decoding tuples — message type, relation OID, the
enclosing transaction's commit LSN/time and the message's ordinal in it — so Spark
can partition and order the work before the real decoder runs on executors.

The envelope code never raises on odd input: unknown or truncated messages get
null envelope columns and the decoder reports them later with a proper offset.

Envelope rules (pinned by tests/unit/test_raw.py):

* ``B``..``C`` (non-streamed transaction): every row, Begin and Commit included,
  carries the Begin's ``final_lsn`` (= the commit LSN) as ``commit_lsn``, its commit
  time, and ``tx_ordinal`` 0, 1, 2, … with Begin = 0.
* ``S``..``E`` (a streamed segment): every row, S and E included, carries
  ``stream_xid`` = the top-level xid from the Stream Start. ``tx_ordinal`` counts per
  top-level xid across segments (first segment's S = 0) and continues onto the
  Stream Commit ``c`` / Stream Abort ``A`` rows, which also carry ``stream_xid``.
  In-stream rows have null ``commit_lsn``/``commit_ts`` — the commit is not known
  when they are read; the ``c`` row itself carries its own commit LSN and time so a
  reader can fill them per ``stream_xid`` without decoding.
* Anything else (non-transactional logical messages, unknown types): nulls.

Speed (the pull's client side, see bench/README.md). Each appended chunk becomes Arrow
columns in bulk: one ``pa.array`` over the payloads, NumPy over lsn/xid, and the
envelope computed with NumPy on the payloads' first bytes whenever the chunk is plain
``B``…``C`` transactions (the common case). A chunk with anything else — a streamed
segment, a truncated or empty payload, a non-ASCII type byte, a Begin inside an open
transaction — takes the row-by-row loop, which is the reference for the rules above.
Parquet encoding and compression (which release the GIL) run on a writer thread
behind a queue of two row groups, so they overlap the network drain while memory
stays bounded.
"""

from __future__ import annotations

import queue
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slotlake.lsn import Lsn

RAW_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("xid", pa.int64(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("msg_type", pa.string(), nullable=False),
        pa.field("rel_oid", pa.int64()),
        pa.field("commit_lsn", pa.int64()),
        pa.field("commit_ts", pa.timestamp("us", tz="UTC")),
        pa.field("tx_ordinal", pa.int64()),
        pa.field("stream_xid", pa.int64()),
    ]
)

PART_GLOB = "part-*.parquet"
# Unix epoch µs of 2000-01-01T00:00:00Z, PostgreSQL's timestamp epoch.
PG_EPOCH_UNIX_US = 946_684_800_000_000

# Precompiled, read with unpack_from on the payload itself: no slicing, no copies.
_BEGIN = struct.Struct(">QqI")  # final_lsn, commit_ts, xid            (at 1)
_COMMIT_END = struct.Struct(">Q")  # C: end_lsn at 10; c: end_lsn at 14
_STREAM_START = struct.Struct(">IB")  # xid, first_segment            (at 1)
_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit_lsn, end_lsn, ts (at 1)
_XID = struct.Struct(">I")  # A: xid at 1, subxid at 5
_OID = struct.Struct(">I")  # R/I/U/D: oid at 1, or at 5 inside a stream

_SIGN = 1 << 63
_WRAP = 1 << 64

_B, _C = ord("B"), ord("C")
# Lookup tables over a payload's first byte.
_IS_DML = np.zeros(256, dtype=bool)
_IS_DML[list(b"IUDR")] = True
_IS_STREAM = np.zeros(256, dtype=bool)
_IS_STREAM[list(b"SEcA")] = True
_TS_TYPE = pa.timestamp("us", tz="UTC")
# Row groups queued for the writer thread: bounds memory to a few row groups.
_WRITE_QUEUE = 2


def _signed(v: int) -> int:
    return v - _WRAP if v >= _SIGN else v


@dataclass
class RawSummary:
    """What one RawWriter wrote, and the transaction bookkeeping the slot advance needs."""

    directory: str
    files: list[str] = field(default_factory=list)
    messages: int = 0
    payload_bytes: int = 0
    row_groups: int = 0
    first_lsn: Lsn | None = None
    last_lsn: Lsn | None = None
    # end_lsn of the last complete transaction ('C' or 'c'): the safe advance target W.
    last_complete_end_lsn: Lsn | None = None
    last_commit_lsn: Lsn | None = None
    transactions: int = 0  # complete non-streamed (B..C)
    streamed_committed: int = 0  # Stream Commit 'c'
    streamed_aborted: int = 0  # Stream Abort 'A' with xid == subxid
    open_transaction: bool = False  # a B without its C at the end: must not happen in a peek
    open_streams: list[int] = field(default_factory=list)  # top-level xids never committed/aborted
    malformed: int = 0  # payloads too short for their envelope (the decoder will say more)


class RawWriter:
    """Writes peek rows to ``directory/part-NNNNN.parquet`` with bounded memory.

    Rows are buffered column-wise up to ``row_group_rows`` and flushed as one Parquet
    row group; a file is closed after ``rows_per_file`` rows. Each file is written
    under a dot-prefixed temporary name and renamed when complete, so a crash never
    leaves a truncated part that looks finished.
    """

    def __init__(
        self,
        directory: str | Path,
        rows_per_file: int = 1_000_000,
        row_group_rows: int = 64_000,
        compression_level: int | None = None,
        background: bool = True,
    ) -> None:
        if rows_per_file < 1 or row_group_rows < 1:
            raise ValueError("rows_per_file and row_group_rows must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.glob(PART_GLOB)):
            # Mixing two peeks in one directory would corrupt seq and the envelope.
            raise FileExistsError(f"raw directory already holds part files: {self.directory}")
        self.rows_per_file = rows_per_file
        self.row_group_rows = min(row_group_rows, rows_per_file)
        self._compression_level = compression_level
        self._summary = RawSummary(directory=str(self.directory))
        self._closed = False
        self._writer: pq.ParquetWriter | None = None
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._file_rows = 0  # rows in the open file (writer side)
        self._planned_rows = 0  # rows handed to the current file (append side)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        # Writer thread: Parquet encoding + compression overlap the drain.
        self._background = background
        self._queue: queue.Queue[pa.Table | None] = queue.Queue(maxsize=_WRITE_QUEUE)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._aborting = False
        # Envelope state carried across append() calls.
        self._seq = 0
        self._tx_commit_lsn: int | None = None  # signed
        self._tx_commit_ts: int | None = None  # unix µs
        self._tx_ordinal = 0
        self._stream_xid: int | None = None  # inside S..E
        self._stream_ordinals: dict[int, int] = {}  # top-level xid → next ordinal

    def append(
        self,
        lsn: Sequence[int] | np.ndarray,
        xid: Sequence[int] | np.ndarray,
        data: Sequence[bytes] | pa.Array,
    ) -> None:
        """Add a chunk of peek rows, in peek order (columnar: three equal-length sequences;
        ``lsn`` and ``xid`` may be NumPy arrays and ``data`` an Arrow binary array)."""
        if self._closed:
            raise RuntimeError("RawWriter is closed")
        self._raise_writer_error()
        n = len(data)
        if len(lsn) != n or len(xid) != n:
            raise ValueError(f"column lengths differ: lsn={len(lsn)} xid={len(xid)} data={n}")
        start = 0
        while start < n:
            # A row group never straddles two files, so every file holds rows_per_file.
            target = min(self.row_group_rows, self.rows_per_file - self._planned_rows)
            stop = min(n, start + target - self._pending_rows)
            self._pending.append(self._segment(lsn, xid, data, start, stop))
            self._pending_rows += stop - start
            if self._pending_rows >= target:
                self._flush_row_group()
            start = stop

    def _segment(
        self,
        lsn: Sequence[int] | np.ndarray,
        xid: Sequence[int] | np.ndarray,
        data: Sequence[bytes] | pa.Array,
        start: int,
        stop: int,
    ) -> pa.Table:
        """Rows [start, stop) of a chunk as a table of RAW_SCHEMA, envelope included."""
        s = self._summary
        n = stop - start
        payloads = None if isinstance(data, pa.Array) else data[start:stop]
        data_arr = data.slice(start, n) if payloads is None else pa.array(payloads, pa.binary())
        envelope = self._envelope_fast(data_arr)
        if envelope is None:
            envelope = self._envelope(data_arr.to_pylist() if payloads is None else payloads)
        lsn_part = lsn[start:stop]
        try:
            lsn_arr = pa.array(lsn_part, pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            # Inputs may be unsigned (COPY) or already signed (the cursor's int8 loader).
            lsn_arr = pa.array([_signed(v) for v in lsn_part], pa.int64())
        if n:
            if s.first_lsn is None:
                s.first_lsn = Lsn(int(lsn_part[0]) % _WRAP)
            s.last_lsn = Lsn(int(lsn_part[-1]) % _WRAP)
        s.messages += n
        seq = np.arange(self._seq, self._seq + n, dtype=np.int64)
        self._seq += n
        return pa.Table.from_arrays(
            [
                pa.array(seq),
                lsn_arr,
                pa.array(xid[start:stop], pa.int64()),
                data_arr,
                *envelope,
            ],
            schema=RAW_SCHEMA,
        )

    def _envelope_fast(self, data: pa.Array) -> list[pa.Array] | None:
        """The envelope of plain B…C transactions, vectorised; None to take the loop.

        Same rules and summary bookkeeping as ``_envelope``; nothing is changed before
        every precondition has been checked, so a None leaves the state untouched.
        """
        n = len(data)
        if n == 0 or self._stream_xid is not None or data.null_count:
            return None
        offsets = np.frombuffer(
            data.buffers()[1], dtype=np.int32, count=n + 1, offset=data.offset * 4
        )
        values_buf = data.buffers()[2]
        if values_buf is None:
            return None
        values = np.frombuffer(values_buf, dtype=np.uint8)
        starts = offsets[:-1]
        sizes = np.diff(offsets)
        if not sizes.all():
            return None
        first = values[starts]
        is_b = first == _B
        is_c = first == _C
        is_dml = _IS_DML[first]
        if (
            (first >= 0x80).any()
            or _IS_STREAM[first].any()
            or (is_b & (sizes < 1 + _BEGIN.size)).any()
            or (is_c & (sizes < 18)).any()
            or (is_dml & (sizes < 5)).any()
        ):
            return None
        open0 = self._tx_commit_lsn is not None
        markers = np.flatnonzero(is_b | is_c)
        # Begin and Commit must alternate (a Begin in an open transaction, a Commit
        # outside one: the loop records those).
        expected = (np.arange(len(markers)) + open0) % 2 == 0
        if not np.array_equal(is_b[markers], expected):
            return None

        rows = np.arange(n)
        b_rows = np.flatnonzero(is_b)
        b_fields = values[starts[b_rows, None] + np.arange(1, 17)].copy().view(">i8")
        b_lsn = b_fields[:, 0].astype(np.int64)  # final_lsn, two's complement = signed
        b_ts = b_fields[:, 1].astype(np.int64) + PG_EPOCH_UNIX_US
        n_b = np.cumsum(is_b)
        in_tx = (open0 + n_b - (np.cumsum(is_c) - is_c)) == 1
        has_b = n_b > 0
        b_index = np.maximum(n_b - 1, 0)
        if len(b_rows):
            clsn = np.where(has_b, b_lsn[b_index], self._tx_commit_lsn or 0)
            cts = np.where(has_b, b_ts[b_index], self._tx_commit_ts or 0)
            ordinal = np.where(has_b, rows - b_rows[b_index], self._tx_ordinal + rows)
        else:
            clsn = np.full(n, self._tx_commit_lsn or 0, dtype=np.int64)
            cts = np.full(n, self._tx_commit_ts or 0, dtype=np.int64)
            ordinal = self._tx_ordinal + rows
        dml_rows = np.flatnonzero(is_dml)
        oid = np.zeros(n, dtype=np.int64)
        oid[dml_rows] = values[starts[dml_rows, None] + np.arange(1, 5)].copy().view(">u4")[:, 0]
        c_rows = np.flatnonzero(is_c)
        c_end = values[starts[c_rows, None] + np.arange(10, 18)].copy().view(">u8")[:, 0]

        # Every check passed: commit the state changes.
        s = self._summary
        s.payload_bytes += int(offsets[-1] - offsets[0])
        for end, commit_lsn in zip(c_end.tolist(), clsn[c_rows].tolist(), strict=True):
            self._complete(end, Lsn.from_signed(commit_lsn))
        s.transactions += len(c_rows)
        if len(markers) and is_b[markers[-1]]:
            last = b_rows[-1]
            self._tx_commit_lsn, self._tx_commit_ts = int(b_lsn[-1]), int(b_ts[-1])
            self._tx_ordinal = n - int(last)
        elif len(markers):
            self._tx_commit_lsn = self._tx_commit_ts = None
        elif open0:
            self._tx_ordinal += n
        not_tx = ~in_tx
        msg_type = pa.StringArray.from_buffers(
            n, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(first.tobytes())
        )
        return [
            msg_type,
            pa.array(oid, mask=~is_dml),
            pa.array(clsn, mask=not_tx),
            pa.array(cts, mask=not_tx).view(_TS_TYPE),
            pa.array(ordinal.astype(np.int64), mask=not_tx),
            pa.nulls(n, pa.int64()),
        ]

    def _envelope(self, data: Sequence[bytes]) -> list[pa.Array]:
        """The envelope row by row: the reference for every rule in the module docstring."""
        s = self._summary
        b_type: list[str] = []
        b_oid: list[int | None] = []
        b_clsn: list[int | None] = []
        b_cts: list[int | None] = []
        b_ord: list[int | None] = []
        b_sxid: list[int | None] = []
        oid_unpack = _OID.unpack_from
        payload_bytes = 0
        for d in data:
            size = len(d)
            payload_bytes += size
            t = chr(d[0]) if size else ""
            oid: int | None = None
            sxid = self._stream_xid
            # Hot path first: DML and relations, inside or outside a stream.
            if t and t in "IUDR":
                off = 5 if sxid is not None else 1
                if size >= off + 4:
                    oid = oid_unpack(d, off)[0]
                else:
                    s.malformed += 1
                if sxid is not None:
                    ordinal = self._next_stream_ordinal(sxid)
                    b_clsn.append(None)
                    b_cts.append(None)
                elif self._tx_commit_lsn is not None:
                    ordinal = self._tx_ordinal
                    self._tx_ordinal += 1
                    b_clsn.append(self._tx_commit_lsn)
                    b_cts.append(self._tx_commit_ts)
                else:
                    ordinal = None
                    b_clsn.append(None)
                    b_cts.append(None)
                b_oid.append(oid)
                b_ord.append(ordinal)
                b_sxid.append(sxid)
                b_type.append(t)
                continue
            clsn: int | None = None
            cts: int | None = None
            ordinal = None
            if t == "B" and size >= 1 + _BEGIN.size:
                if self._tx_commit_lsn is not None:
                    # A Begin inside an open transaction: the previous one never committed.
                    s.open_transaction = True
                final_lsn, ts, _ = _BEGIN.unpack_from(d, 1)
                self._tx_commit_lsn = clsn = _signed(final_lsn)
                self._tx_commit_ts = cts = ts + PG_EPOCH_UNIX_US
                ordinal = 0
                self._tx_ordinal = 1
            elif t == "C" and self._tx_commit_lsn is not None:
                clsn, cts = self._tx_commit_lsn, self._tx_commit_ts
                ordinal = self._tx_ordinal
                self._tx_commit_lsn = self._tx_commit_ts = None
                if size >= 18:
                    self._complete(_COMMIT_END.unpack_from(d, 10)[0], Lsn.from_signed(clsn))
                    s.transactions += 1
                else:
                    s.malformed += 1
            elif t == "S" and size >= 1 + _STREAM_START.size:
                top, first = _STREAM_START.unpack_from(d, 1)
                if first:
                    self._stream_ordinals[top] = 0
                self._stream_xid = sxid = top
                ordinal = self._next_stream_ordinal(top)
            elif t == "E" and sxid is not None:
                ordinal = self._next_stream_ordinal(sxid)
                self._stream_xid = None
            elif t == "c" and size >= 1 + _STREAM_COMMIT.size:
                top, _, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(d, 1)
                sxid = top
                ordinal = self._stream_ordinals.pop(top, 0)
                clsn, cts = _signed(commit_lsn), ts + PG_EPOCH_UNIX_US
                self._complete(end_lsn, Lsn(commit_lsn))
                s.streamed_committed += 1
            elif t == "A" and size >= 9:
                top = _XID.unpack_from(d, 1)[0]
                sub = _XID.unpack_from(d, 5)[0]
                sxid = top
                if top == sub:
                    ordinal = self._stream_ordinals.pop(top, 0)
                    s.streamed_aborted += 1
                else:
                    ordinal = self._next_stream_ordinal(top)
            elif sxid is not None:
                # Y, T, M, O, … inside a streamed segment.
                ordinal = self._next_stream_ordinal(sxid)
            elif self._tx_commit_lsn is not None:
                # Y, T, M, O, … inside B..C; also truncated B/S/c/A land here or below.
                clsn, cts = self._tx_commit_lsn, self._tx_commit_ts
                ordinal = self._tx_ordinal
                self._tx_ordinal += 1
            else:
                sxid = None
            if t in "BCScA" and t and ordinal is None:
                s.malformed += 1
            b_type.append(t)
            b_oid.append(None)
            b_clsn.append(clsn)
            b_cts.append(cts)
            b_ord.append(ordinal)
            b_sxid.append(sxid)

        s.payload_bytes += payload_bytes
        return [
            pa.array(b_type, pa.string()),
            pa.array(b_oid, pa.int64()),
            pa.array(b_clsn, pa.int64()),
            pa.array(b_cts, _TS_TYPE),
            pa.array(b_ord, pa.int64()),
            pa.array(b_sxid, pa.int64()),
        ]

    def _next_stream_ordinal(self, top_xid: int) -> int:
        ordinal = self._stream_ordinals.get(top_xid, 0)
        self._stream_ordinals[top_xid] = ordinal + 1
        return ordinal

    def _complete(self, end_lsn: int, commit_lsn: Lsn) -> None:
        s = self._summary
        end = Lsn(end_lsn)
        # Commits arrive in commit order, so the last one is the highest; max() only
        # guards against a malformed payload moving W backwards.
        if s.last_complete_end_lsn is None or end > s.last_complete_end_lsn:
            s.last_complete_end_lsn = end
            s.last_commit_lsn = commit_lsn

    # -- files -----------------------------------------------------------------------------
    def _flush_row_group(self) -> None:
        if not self._pending_rows:
            return
        table = pa.concat_tables(self._pending)
        self._pending = []
        self._pending_rows = 0
        self._planned_rows += table.num_rows
        if self._planned_rows >= self.rows_per_file:
            self._planned_rows = 0
        if not self._background:
            self._write(table)
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._write_loop, name=f"raw-writer:{self.directory.name}", daemon=True
            )
            self._thread.start()
        self._queue.put(table)  # blocks while _WRITE_QUEUE row groups wait: bounded memory
        self._raise_writer_error()

    def _write_loop(self) -> None:
        while (table := self._queue.get()) is not None:
            if self._error is not None or self._aborting:
                continue  # keep draining so that the producer never blocks
            try:
                self._write(table)
            except BaseException as exc:  # handed to the producer thread
                self._error = exc

    def _join_writer(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            self._open_file()
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._summary.row_groups += 1
        self._file_rows += table.num_rows
        if self._file_rows >= self.rows_per_file:
            self._close_file()

    def _open_file(self) -> None:
        name = f"part-{len(self._summary.files):05d}.parquet"
        self._final_path = self.directory / name
        self._tmp_path = self.directory / f".{name}.inprogress"
        self._writer = pq.ParquetWriter(
            self._tmp_path,
            RAW_SCHEMA,
            compression="zstd",
            compression_level=self._compression_level,
            # Payloads are opaque bytes: dictionary pages only cost time.
            use_dictionary=["msg_type"],
            write_statistics=["seq", "lsn", "commit_lsn", "rel_oid"],
        )
        self._file_rows = 0

    def _close_file(self) -> None:
        assert self._writer is not None and self._tmp_path and self._final_path
        self._writer.close()
        self._tmp_path.replace(self._final_path)
        self._summary.files.append(str(self._final_path))
        self._writer = None
        self._file_rows = 0

    def close(self) -> RawSummary:
        """Flush, close the last file and return the summary. Idempotent."""
        if self._closed:
            return self._summary
        self._flush_row_group()
        self._join_writer()
        self._raise_writer_error()
        if self._writer is None and not self._summary.files:
            # An empty peek still leaves one (empty) part, so readers find the schema.
            self._open_file()
        if self._writer is not None:
            self._close_file()
        self._closed = True
        s = self._summary
        if self._tx_commit_lsn is not None:
            s.open_transaction = True
        s.open_streams = sorted(self._stream_ordinals)
        return s

    def abort(self) -> None:
        """Drop the file being written (after a failed pull); finished parts stay."""
        self._aborting = True
        self._join_writer()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if self._tmp_path is not None:
                self._tmp_path.unlink(missing_ok=True)
        self._pending = []
        self._pending_rows = 0
        self._closed = True

    @property
    def summary(self) -> RawSummary:
        return self._summary

    def __enter__(self) -> RawWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def raw_files(path: str | Path) -> list[Path]:
    """The part files of a raw directory in write order (or ``[path]`` for a single file)."""
    p = Path(path)
    if p.is_dir():
        return sorted(p.glob(PART_GLOB))
    return [p]


def payload_bytes(data: Sequence[bytes] | pa.Array) -> int:
    """Bytes of a chunk of payloads (a sequence of ``bytes`` or an Arrow binary array)."""
    if isinstance(data, pa.Array):
        return int(pc.sum(pc.binary_length(data)).as_py() or 0)
    return sum(map(len, data))


def read_raw(path: str | Path) -> pa.Table:
    """The whole raw batch as one table, rows in peek order."""
    files = raw_files(path)
    if not files:
        return RAW_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=RAW_SCHEMA) for f in files])


def raw_rows_of_types(
    path: str | Path, msg_types: Sequence[str], columns: Sequence[str]
) -> pa.Table:
    """``columns`` of the raw batch's rows whose ``msg_type`` is one of ``msg_types``, in
    peek order. The type column is read first: payloads are read only for the row groups
    that hold such rows (a Parquet filter on ``msg_type`` cannot skip them, every row
    group's statistics span most types)."""
    wanted = pa.array(list(msg_types), pa.string())
    pieces = []
    for f in raw_files(path):
        with pq.ParquetFile(f) as pf:
            for i in range(pf.num_row_groups):
                mask = pc.is_in(pf.read_row_group(i, columns=["msg_type"])[0], wanted)
                if pc.any(mask).as_py():
                    pieces.append(pf.read_row_group(i, columns=list(columns)).filter(mask))
    if not pieces:
        return RAW_SCHEMA.empty_table().select(list(columns))
    return pa.concat_tables(pieces)


def iter_raw(path: str | Path, batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Record batches in peek order, one file and row group at a time (bounded memory)."""
    for f in raw_files(path):
        with pq.ParquetFile(f) as pf:
            yield from pf.iter_batches(batch_size=batch_size)
