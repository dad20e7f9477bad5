"""Raw Parquet → typed change rows, in parallel on the executors.

The driver reads only the few messages that describe the batch (Relation, Type,
Truncate, Stream Commit/Abort, Origin); the executors decode every DML payload with the
same decoder (:func:`make_decoder`: column-wise with :mod:`slotlake.pgoutput.columnar`,
else message by message with :func:`slotlake.pgoutput.decode`) inside ``mapInArrow`` —
the Arrow-native sibling of ``mapInPandas``: both run the shared decoder in Python
workers, but Arrow keeps decimals, nested arrays and structs without a detour through
pandas dtypes. The driver runs the very same function for the tables it does itself.

Nothing here talks to PostgreSQL: the raw Parquet of a batch is enough, which is what
reprocessing relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from slotlake import schema_memo
from slotlake.catalog import (
    META_COLUMNS,
    WORK_COLUMNS,
    ColumnIds,
    RelationVersion,
    TableCatalog,
    build_catalogs,
)
from slotlake.ddltypes import parse_struct
from slotlake.lsn import Lsn
from slotlake.pgoutput import (
    UNCHANGED_TOAST,
    DecodeError,
    Delete,
    Insert,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    Truncate,
    Type,
    Update,
    decode,
    pg_timestamp_to_datetime,
)
from slotlake.pgtypes import resolve_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

DML_TYPES = ("I", "U", "D")
# Record batches of fewer rows are decoded message by message: the column-wise split's
# NumPy and Arrow calls cost ~2 ms whatever the rows, so a small table's batch of a hundred
# changes decoded in 2.9-3.7 ms column-wise and in 1.5 ms message by message (4 columns;
# even at ~200-400 rows, twice as fast from ~750).
COLUMNAR_FROM_ROWS = 256


class RawDataError(RuntimeError):
    """A raw payload that does not decode: names the batch, file, seq and LSN."""


@dataclass
class StreamOutcome:
    commits: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # xid → commit, end, ts
    aborted_subxacts: set[tuple[int, int]] = field(default_factory=set)  # (xid, subxid)
    # Committed streams that delivered no change and no message: pgoutput sends Stream
    # Start/Stop/Commit for every streamed transaction, e.g. a big one on unpublished
    # tables, where it leaves an empty non-streamed transaction out (PostgreSQL 15+).
    empty: set[int] = field(default_factory=set)


@dataclass
class TruncateEvent:
    seq: int
    commit_lsn: int
    tx_ordinal: int
    xid: int
    options: int
    tables: list[str]
    commit_ts: datetime | None


@dataclass
class BatchCatalog:
    """What the driver learnt about a batch from its descriptive messages."""

    tables: dict[str, TableCatalog]
    truncates: list[TruncateEvent]
    streams: StreamOutcome
    origins: dict[int, str]  # commit_lsn → origin name

    def table_of_oid(self, oid: int, seq: int) -> str | None:
        best: tuple[int, str] | None = None
        for cat in self.tables.values():
            for v in cat.versions:
                if v.oid == oid and v.seq < seq and (best is None or v.seq > best[0]):
                    best = (v.seq, cat.name)
        return best[1] if best else None


def _decode_or_raise(data: bytes, in_stream: bool, where: str) -> Any:
    try:
        return decode(data, in_stream=in_stream)
    except DecodeError as exc:
        raise RawDataError(f"{where}: {exc}") from exc


CATALOG_TYPES = ("R", "Y", "T", "c", "A", "O")
COMMIT_TYPES = ("C", "c")  # Commit, Stream Commit
# What a streamed segment delivers that makes its transaction worth a row of its own.
CONTENT_TYPES = ("I", "U", "D", "T", "M")
# The raw columns the driver-side catalog pass reads.
CATALOG_SCAN_COLUMNS = [
    "seq",
    "lsn",
    "msg_type",
    "data",
    "stream_xid",
    "commit_lsn",
    "tx_ordinal",
    "xid",
    "commit_ts",
    "rel_oid",
]


@dataclass
class RawScan:
    """What one pass over a raw batch on the driver yields: descriptive rows and counts."""

    catalog_rows: list[Any]  # rows of CATALOG_TYPES with the envelope columns, in seq order
    dml_counts: dict[int, int]  # relation oid → DML rows
    types_seen: set[str]
    commits: int = 0  # Commit and Stream Commit messages
    stream_content: set[int] = field(default_factory=set)  # stream xids with CONTENT_TYPES rows
    messages: int = 0  # logical decoding messages ('M')
    removing: set[int] = field(default_factory=set)  # relation oids with UPDATE or DELETE rows


def scan_raw(path: str) -> RawScan:
    """Read the raw batch's descriptive messages and counts with pyarrow, no Spark job.

    The driver wrote the raw files itself, so it can read them back; only the small
    ``msg_type``/``rel_oid`` columns are read in full, payloads only for catalog rows.
    Memory stays bounded by one row group at a time.
    """
    from collections import Counter, namedtuple

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from slotlake.raw import raw_files

    columns = CATALOG_SCAN_COLUMNS
    Row = namedtuple("Row", columns)  # type: ignore[misc]
    rows: list[Any] = []
    counts: Counter[int] = Counter()
    types: set[str] = set()
    wanted = pa_array_of(CATALOG_TYPES)
    commit_types, commits = pa_array_of(COMMIT_TYPES), 0
    content_types, stream_content = pa_array_of(CONTENT_TYPES), set()
    messages = 0
    removing: set[int] = set()
    for f in raw_files(path):
        try:
            pf = pq.ParquetFile(f)
        except Exception as exc:
            raise RawDataError(f"raw file {f} is unreadable: {exc}") from exc
        with pf:
            for i in range(pf.num_row_groups):
                small = pf.read_row_group(i, columns=["msg_type", "rel_oid", "stream_xid"])
                types.update(pc.unique(small.column("msg_type")).to_pylist())
                in_stream = small.filter(
                    pc.and_(
                        pc.is_valid(small.column("stream_xid")),
                        pc.is_in(small.column("msg_type"), content_types),
                    )
                )
                stream_content.update(pc.unique(in_stream.column("stream_xid")).to_pylist())
                commits += pc.sum(pc.is_in(small.column("msg_type"), commit_types)).as_py() or 0
                messages += pc.sum(pc.equal(small.column("msg_type"), "M")).as_py() or 0
                dml = small.filter(pc.is_in(small.column("msg_type"), pa_array_of(DML_TYPES)))
                for vc in pc.value_counts(dml.column("rel_oid")).to_pylist():
                    counts[vc["values"]] += vc["counts"]
                removes = dml.filter(pc.not_equal(dml.column("msg_type"), "I"))
                removing.update(pc.unique(removes.column("rel_oid")).to_pylist())
                mask = pc.is_in(small.column("msg_type"), wanted)
                if pc.any(mask).as_py():
                    full = pf.read_row_group(i, columns=columns).filter(mask)
                    rows.extend(Row(**r) for r in full.to_pylist())
    rows.sort(key=lambda r: r.seq)
    return RawScan(rows, dict(counts), types, commits, stream_content, messages, removing)


def pa_array_of(values: tuple[str, ...]):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.array(list(values), type=pa.string())


def collect_catalog(
    rows: list[Any],
    batch: int,
    prior_schemas: dict[str, list[tuple[str, str]]] | None = None,
    stream_content: set[int] | None = None,
    column_ids: Mapping[str, ColumnIds] | None = None,
    at_target: Callable[[list[tuple[int, Relation]]], list[tuple[int, Relation | Type]]]
    | None = None,
    log_columns: Callable[[str], Mapping[str, str]] | None = None,
) -> BatchCatalog:
    """Decode the batch's descriptive messages on the driver (a few per table).

    ``stream_content`` (:attr:`RawScan.stream_content`): the streams that delivered
    something; the other committed ones become ``streams.empty``. None: none is empty.
    ``column_ids``: the tables' attnums before and after the batch
    (:func:`slotlake.catalog.build_catalogs`). ``at_target``: given the batch's Relation
    messages, the messages that bring each table to its shape at the batch's target
    (:func:`slotlake.catalog.target_versions`). ``log_columns``: a table's change log's
    columns, name → type (:func:`slotlake.catalog.build_catalogs`).
    """
    # (seq, message, stream xid): a stream's descriptions count only if it commits here.
    relations_seen: list[tuple[int, Relation, int | None]] = []
    types_seen: list[tuple[int, Type, int | None]] = []
    pending_truncates: list[tuple[Any, Truncate]] = []
    streams = StreamOutcome()
    origins: dict[int, str] = {}
    for r in rows:
        where = f"batch {batch}, seq {r.seq}, lsn {Lsn.from_signed(r.lsn)}"
        msg = _decode_or_raise(
            bytes(r.data), r.stream_xid is not None and r.msg_type not in "cA", where
        )
        if isinstance(msg, Relation):
            relations_seen.append((r.seq, msg, r.stream_xid))
        elif isinstance(msg, Type):
            types_seen.append((r.seq, msg, r.stream_xid))
        elif isinstance(msg, Truncate):
            pending_truncates.append((r, msg))
        elif isinstance(msg, StreamCommit):
            streams.commits[msg.xid] = (int(msg.commit_lsn), int(msg.end_lsn), msg.commit_ts)
        elif isinstance(msg, StreamAbort):
            streams.aborted_subxacts.add((msg.xid, msg.subxid))
        elif isinstance(msg, Origin) and r.commit_lsn is not None:
            origins[r.commit_lsn] = msg.name
    if stream_content is not None:
        streams.empty = {x for x in streams.commits if x not in stream_content}
    # A stream that does not commit in the batch (still open at the target, or aborted)
    # describes tables as its own uncommitted DDL left them: an ADD COLUMN there must not
    # reach the state or the change log. pgoutput tracks the descriptions it sent per
    # stream, so nothing outside that stream decodes by them, and the transaction comes
    # again, whole and with them, in the batch of its commit. (A rolled-back savepoint's
    # descriptions stay: later changes of its transaction may rely on them.)
    relations = [(seq, m) for seq, m, sx in relations_seen if sx is None or sx in streams.commits]
    types = [(seq, m) for seq, m, sx in types_seen if sx is None or sx in streams.commits]
    for seq, extra in at_target(relations) if at_target is not None else ():
        if isinstance(extra, Relation):
            relations.append((seq, extra))
        else:
            types.append((seq, extra))
    catalog = BatchCatalog(
        build_catalogs(relations, types, prior_schemas, column_ids, log_columns),
        [],
        streams,
        origins,
    )
    for r, msg in pending_truncates:
        commit_lsn, commit_ts, ordinal = r.commit_lsn, r.commit_ts, r.tx_ordinal
        if r.stream_xid is not None:
            outcome = streams.commits.get(r.stream_xid)
            if outcome is None or (r.stream_xid, msg.xid) in streams.aborted_subxacts:
                continue  # aborted, or streamed and not committed in this batch
            commit_lsn = Lsn(outcome[0]).to_signed()
            commit_ts = pg_timestamp_to_datetime(outcome[2])
        names = [n for oid in msg.relation_oids if (n := catalog.table_of_oid(oid, r.seq))]
        catalog.truncates.append(
            TruncateEvent(r.seq, commit_lsn, ordinal, r.xid, msg.options, names, commit_ts)
        )
    return catalog


# -- executor side -----------------------------------------------------------------------


def spark_schema_ddl(cat: TableCatalog, extra: list[tuple[str, str]]) -> str:
    data = ddl_columns(cat.columns)
    old = f"`_old` struct<{data}>" if cat.columns else "`_old` struct<`_none`: int>"
    return ", ".join([data, ddl_columns(extra), old] if cat.columns else [ddl_columns(extra), old])


def ddl_columns(columns: list[tuple[str, str]]) -> str:
    """``name type, …`` with each name backtick-quoted (a backtick in it doubled)."""
    return ", ".join("`" + n.replace("`", "``") + "` " + t for n, t in columns)


def change_schema(cat: TableCatalog):  # type: ignore[no-untyped-def]

    return parse_struct(spark_schema_ddl(cat, META_COLUMNS + WORK_COLUMNS))


class _VersionShaper:
    """Precomputed per Relation version: output slot and type of each column."""

    __slots__ = ("key_slots", "ncols", "nulls", "slots", "text_slots", "types")

    def __init__(self, version: RelationVersion, out_index: dict[str, int], text_columns: set[str]):
        type_names = {oid: (ns, nm) for oid, ns, nm in version.type_names}
        self.slots = [out_index[c.name] for c in version.columns]
        self.types = [resolve_type(c.type_oid, c.typmod, type_names) for c in version.columns]
        self.text_slots = {i for i, c in enumerate(version.columns) if c.name in text_columns}
        keys = set(version.key_columns)
        self.key_slots = {i for i, c in enumerate(version.columns) if c.name in keys}
        self.ncols = len(version.columns)
        self.nulls: tuple[None, ...] = (None,) * self.ncols

    def fit(self, values: tuple, where: str) -> tuple:
        """A tuple of this version's width: a short one is padded with NULLs."""
        if len(values) > self.ncols:
            raise RawDataError(
                f"{where}: the tuple has {len(values)} columns, its Relation message {self.ncols}"
            )
        return values + self.nulls[len(values) :]


@dataclass
class _Rows:
    """One Relation version's rows of a record batch, as the decoder split them: raw
    datums only (str, bytes or None), full width, no unchanged-TOAST markers."""

    at: list[int] = field(default_factory=list)  # output row of each
    new: list[tuple] = field(default_factory=list)
    old: list[tuple] = field(default_factory=list)


def _fill_unchanged(
    new: tuple, old: tuple | None, old_kind: str | None, shaper: _VersionShaper, names: list[str]
) -> tuple[tuple, list[str], set[int]]:
    """Unchanged TOAST in a new image: (new image, names still open, positions filled).

    An old image fills it: a full row ('O') any column, a key image ('K') only the key
    columns it carries; the filled datum converts (and falls back) as the old one does.
    """
    values = list(new)
    still: list[str] = []
    filled: set[int] = set()
    for i, raw in enumerate(values):
        if raw is not UNCHANGED_TOAST:
            continue
        if old is not None and (old_kind == "O" or i in shaper.key_slots):
            values[i] = None if old[i] is UNCHANGED_TOAST else old[i]
            filled.add(i)
        else:
            values[i] = None
            still.append(names[shaper.slots[i]])
    return tuple(values), still, filled


def _without_markers(column: tuple) -> tuple | list:
    # An old image never carries 'u' from PostgreSQL; if one did, it would read as NULL.
    if UNCHANGED_TOAST in column:
        return [None if raw is UNCHANGED_TOAST else raw for raw in column]
    return column


def _place(
    pieces: list[tuple[Sequence[int], pa.Array]], nrows: int, arrow_type: pa.DataType
) -> pa.Array:
    """One output column from each version's piece (its output rows, its values)."""
    import numpy as np
    import pyarrow as pa

    if len(pieces) == 1 and len(pieces[0][0]) == nrows:
        return pieces[0][1]  # one version, every row: rows are in output order already
    at = [row for rows, _ in pieces for row in rows]
    missing = sorted(set(range(nrows)) - set(at))
    arrays = [array for _, array in pieces] + [pa.nulls(len(missing), arrow_type)]
    pick = np.empty(nrows, dtype=np.int64)
    pick[at + missing] = np.arange(nrows)
    return pa.concat_arrays(arrays).take(pa.array(pick))


def sparse_lists(nrows: int, rows: dict[int, list[Any]], arrow_type: pa.DataType) -> pa.Array:
    """A list (or map) column that is empty except at ``rows``."""
    import numpy as np
    import pyarrow as pa

    lengths = np.zeros(nrows + 1, dtype=np.int32)
    flat: list[Any] = []
    for row in sorted(rows):
        lengths[row + 1] = len(rows[row])
        flat.extend(rows[row])
    offsets = pa.array(np.cumsum(lengths, dtype=np.int32))
    if pa.types.is_map(arrow_type):
        keys = pa.array([k for k, _ in flat], arrow_type.key_type)
        items = pa.array([v for _, v in flat], arrow_type.item_type)
        return pa.MapArray.from_arrays(offsets, keys, items, type=arrow_type)
    return pa.ListArray.from_arrays(offsets, pa.array(flat, arrow_type.value_type), type=arrow_type)


def make_decoder(
    cat: TableCatalog,
    streams: StreamOutcome,
    origins: dict[int, str],
    batch: int,
    arrow_schema: pa.Schema,
    columnar: bool = True,
):
    """The function mapInArrow runs over raw DML rows of one table.

    Python only splits bytes. A record batch of one Relation version, nothing streamed
    (nearly every batch, text or binary datums), is split column-wise with NumPy
    (:mod:`slotlake.pgoutput.columnar`); any other batch is decoded message by message
    (:func:`slotlake.pgoutput.decode`: the envelope and the raw column datums, gathered
    per column). Either way each column is then converted at once by its type's pyarrow
    kernel (:meth:`slotlake.pgtypes.PgType.convert_column`); only the values a kernel
    cannot take (NaN, infinities, BC, years past 9999, unknown types…) go through the
    per-value codec, which keeps their lossless Fallback text. A batch of fewer than
    ``COLUMNAR_FROM_ROWS`` rows goes message by message (the split's fixed cost is more than
    such a batch's messages); ``columnar=False`` decodes every batch message by message
    (the reference the tests compare with).

    Measured on the 1M-change batch of bench/sync_bench.py (8 columns): splitting the
    payloads column-wise takes ~2 s where decoding them one by one took ~5 s, and the
    columns go to the kernels as Arrow arrays instead of Python lists.
    """
    names = [n for n, _ in cat.columns]
    out_index = {n: i for i, n in enumerate(names)}
    versions_by_oid: dict[int, list[RelationVersion]] = {}
    for v in cat.versions:
        versions_by_oid.setdefault(v.oid, []).append(v)
    seqs_by_oid = {oid: [v.seq for v in vs] for oid, vs in versions_by_oid.items()}
    text_columns = set(cat.text_columns)
    data_types = {f.name: f.type for f in arrow_schema if f.name in out_index}
    old_field = arrow_schema.field("_old")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import bisect

        shapers: dict[int, _VersionShaper] = {}

        def shaper_for(oid: int, seq: int) -> tuple[_VersionShaper | None, float]:
            """The version that shapes (oid, seq), and the seq up to which it does."""
            seqs = seqs_by_oid[oid]
            i = bisect.bisect_left(seqs, seq) - 1
            if i < 0:
                return None, seq
            v = versions_by_oid[oid][i]
            if v.seq not in shapers:
                shapers[v.seq] = _VersionShaper(v, out_index, text_columns)
            return shapers[v.seq], seqs[i + 1] if i + 1 < len(seqs) else float("inf")

        for rb in batches:
            out = None
            if columnar and rb.num_rows >= COLUMNAR_FROM_ROWS:
                out = _decode_columnar(rb, shaper_for)
            if out is None:
                out = _decode_batch(rb, shaper_for)
            if out is not None:
                yield out

    def _decode_columnar(
        rb: pa.RecordBatch,
        shaper_for: Callable[[int, int], tuple[_VersionShaper | None, float]],
    ) -> pa.RecordBatch | None:
        """The batch split column-wise (:mod:`slotlake.pgoutput.columnar`) when it is
        what nearly every batch is — well-formed datums of one Relation version, nothing
        streamed — else None, and :func:`_decode_batch` decodes it message by message."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from slotlake.pgoutput.columnar import (
            KIND_UNCHANGED,
            OP_INSERT,
            OP_UPDATE,
            split_dml,
        )

        nrows = len(rb)
        oids, seqs = rb.column("rel_oid"), rb.column("seq")
        if not nrows or rb.column("stream_xid").null_count < nrows or oids.null_count:
            return None
        oid_min, oid_max = pc.min_max(oids).values()
        if oid_min != oid_max or oid_min.as_py() not in seqs_by_oid:
            return None
        seq_min, seq_max = (v.as_py() for v in pc.min_max(seqs).values())
        shaper, seq_to = shaper_for(oid_min.as_py(), seq_min)
        if shaper is None or seq_max > seq_to:
            return None
        split = split_dml(rb.column("data"), shaper.ncols)
        if split is None:
            return None
        op_codes = np.select([split.op == OP_INSERT, split.op == OP_UPDATE], [0, 1], 2)
        ops = pa.DictionaryArray.from_arrays(
            pa.array(op_codes.astype(np.int8)), pa.array(["I", "U", "D"])
        ).cast(pa.string())
        key_image = split.old_kind == ord("K")
        full_image = split.old_kind == ord("O")
        old_kinds = pa.DictionaryArray.from_arrays(
            pa.array(key_image.astype(np.int8), mask=split.old_kind == 0), pa.array(["O", "K"])
        ).cast(pa.string())
        any_key_image = bool(key_image.any())
        every_row = range(nrows)
        still_open: dict[int, list[str]] = {}
        fallbacks: dict[int, list[tuple[int, int, str, str]]] = {}
        new_pieces: dict[int, list[tuple[Sequence[int], pa.Array]]] = {}
        old_pieces: dict[int, list[tuple[Sequence[int], pa.Array]]] = {}
        for i in range(shaper.ncols):
            slot = shaper.slots[i]
            name, is_key = names[slot], i in shaper.key_slots
            old = split.old[i]
            unchanged = split.new_kinds[i] == KIND_UNCHANGED
            new, filled = split.new[i], np.zeros(0, bool)
            if unchanged.any():
                # An old image fills it: a full row ('O') any column, a key image ('K')
                # only the key columns it carries; else it stays open (NULL for now).
                filled = unchanged & (full_image | (key_image & is_key))
                if filled.any():
                    if new.type != old.type:
                        if new.null_count < nrows:
                            return None  # text in one image, binary in the other
                        new = pa.nulls(nrows, old.type)
                    new = pc.if_else(pa.array(filled), old, new)
                for row in np.flatnonzero(unchanged & ~filled).tolist():
                    still_open.setdefault(row, []).append(name)
            if any_key_image and not is_key and shaper.key_slots and old.null_count < nrows:
                # A key image carries no non-key column (PostgreSQL sends NULLs). Of a
                # table without key columns it is a whole old row: a partitioned root
                # published for a leaf of FULL identity flags the leaf's old rows 'K'
                # under the root's identity. Kept, a multiset's row is matched by it.
                old = pc.if_else(pa.array(key_image), pa.scalar(None, old.type), old)
            keep_text = i in shaper.text_slots
            for image, column, pieces in ((0, new, new_pieces), (1, old, old_pieces)):
                array, fell = shaper.types[i].convert_column(
                    column, data_types[name], keep_text=keep_text
                )
                pieces[slot] = [(every_row, array)]
                for row, text in fell.items():
                    if image:
                        entry = (1, i, "_old." + name, text)
                    else:
                        entry = (2 if len(filled) and filled[row] else 0, i, name, text)
                    fallbacks.setdefault(row, []).append(entry)
        return _assemble(
            rb, None, None, ops, old_kinds, still_open, fallbacks, new_pieces, old_pieces
        )

    def _decode_batch(
        rb: pa.RecordBatch,
        shaper_for: Callable[[int, int], tuple[_VersionShaper | None, float]],
    ) -> pa.RecordBatch | None:
        import pyarrow as pa

        datas = rb.column("data").to_pylist()
        seqs = rb.column("seq").to_pylist()
        oids = rb.column("rel_oid").to_pylist()
        lsns = rb.column("lsn")
        stream_col = rb.column("stream_xid")
        stream_xids = stream_col.to_pylist() if stream_col.null_count < len(rb) else None
        groups: dict[int, _Rows] = {}  # id(shaper) → its rows
        group_shapers: dict[int, _VersionShaper] = {}
        kept: list[int] | None = None if stream_xids is None else []  # None: every row
        ops: list[str] = []
        old_kinds: list[str | None] = []  # None: no old image
        still_open: dict[int, list[str]] = {}  # output row → unchanged TOAST left open
        filled: dict[int, set[int]] = {}  # output row → positions filled from its old image

        def where(k: int) -> str:
            lsn = Lsn.from_signed(lsns[k].as_py())
            return f"batch {batch}, table {cat.name}, seq {seqs[k]}, lsn {lsn}"

        # Rows of one oid and version come in runs: the lookup is done once per run.
        run_oid, run_from, run_to = None, 0, -1.0
        shaper: _VersionShaper | None = None
        rows = _Rows()
        for k, data in enumerate(datas):
            stream_xid = None if stream_xids is None else stream_xids[k]
            try:
                msg = decode(data, stream_xid is not None)
            except DecodeError as exc:
                raise RawDataError(f"{where(k)}: {exc}") from exc
            if stream_xid is not None:
                outcome = streams.commits.get(stream_xid)
                if outcome is None or (stream_xid, msg.xid) in streams.aborted_subxacts:
                    continue
            oid, seq = oids[k], seqs[k]
            if oid != run_oid or not run_from < seq <= run_to:
                shaper, run_to = shaper_for(oid, seq)
                if shaper is None:
                    raise RawDataError(
                        f"{where(k)}: no Relation message for relation oid {oid} before this change"
                    )
                run_oid, run_from = oid, seq - 1
                rows = groups.setdefault(id(shaper), _Rows())
                group_shapers[id(shaper)] = shaper
            kind = type(msg)
            if kind is Insert:
                op, new, old_kind, old = "I", msg.new, None, None
            elif kind is Update:
                op, new, old_kind = "U", msg.new, msg.old_kind
                old = None if old_kind is None else msg.old
            elif kind is Delete:
                op, new, old_kind, old = "D", None, msg.old_kind, msg.old
            else:
                raise RawDataError(f"{where(k)}: expected a DML message, got {kind.__name__}")
            row = len(ops)
            if old is not None and len(old) != shaper.ncols:
                old = shaper.fit(old, where(k))
            if new is None:
                new = shaper.nulls
            else:
                if len(new) != shaper.ncols:
                    new = shaper.fit(new, where(k))
                if UNCHANGED_TOAST in new:
                    new, still, fill = _fill_unchanged(new, old, old_kind, shaper, names)
                    if still:
                        still_open[row] = still
                    if fill:
                        filled[row] = fill
            rows.at.append(row)
            rows.new.append(new)
            rows.old.append(shaper.nulls if old is None else old)
            if kept is not None:
                kept.append(k)
            ops.append(op)
            old_kinds.append(old_kind)
        nrows = len(ops)
        if not nrows:
            return None

        # Column by column: each version's datums converted at once, then placed.
        fallbacks: dict[int, list[tuple[int, int, str, str]]] = {}  # row → (phase, pos, key, text)
        new_pieces: dict[int, list[tuple[list[int], pa.Array]]] = {}
        old_pieces: dict[int, list[tuple[list[int], pa.Array]]] = {}
        any_key_image = "K" in old_kinds
        for gid, rows in groups.items():
            shaper = group_shapers[gid]
            key_only = [old_kinds[row] == "K" for row in rows.at] if any_key_image else []
            for image, pieces in ((rows.new, new_pieces), (rows.old, old_pieces)):
                is_old = pieces is old_pieces
                for i, column in enumerate(zip(*image, strict=True)):
                    slot = shaper.slots[i]
                    name = names[slot]
                    if is_old:
                        column = _without_markers(column)
                        if (
                            any_key_image
                            and i not in shaper.key_slots
                            and shaper.key_slots
                            and column.count(None) < len(column)
                        ):
                            # A key image carries no non-key column (see the column-wise
                            # path above).
                            column = [
                                None if k else raw for raw, k in zip(column, key_only, strict=True)
                            ]
                    array, fell = shaper.types[i].convert_column(
                        column, data_types[name], keep_text=i in shaper.text_slots
                    )
                    pieces.setdefault(slot, []).append((rows.at, array))
                    for pos, text in fell.items():
                        row = rows.at[pos]
                        if is_old:
                            entry = (1, i, "_old." + name, text)
                        else:
                            entry = (2 if i in filled.get(row, ()) else 0, i, name, text)
                        fallbacks.setdefault(row, []).append(entry)

        return _assemble(
            rb,
            kept,
            stream_xids,
            pa.array(ops, pa.string()),
            pa.array(old_kinds, pa.string()),
            still_open,
            fallbacks,
            new_pieces,
            old_pieces,
        )

    def _assemble(
        rb: pa.RecordBatch,
        kept: list[int] | None,
        stream_xids: list[int | None] | None,
        ops: pa.Array,
        old_kinds: pa.Array,
        still_open: dict[int, list[str]],
        fallbacks: dict[int, list[tuple[int, int, str, str]]],
        new_pieces: dict[int, list[tuple[Sequence[int], pa.Array]]],
        old_pieces: dict[int, list[tuple[Sequence[int], pa.Array]]],
    ) -> pa.RecordBatch:
        """The output batch from the converted columns and the row metadata.

        ``fallbacks``: row → (phase, position, key, text) of each value that fell back;
        a row's keys go in the row-by-row order: new image, old image, filled TOAST.
        """
        import pyarrow as pa

        nrows = len(ops)
        fallback_rows = {
            row: [(key, text) for _, _, key, text in sorted(entries)]
            for row, entries in fallbacks.items()
        }
        data = {
            name: _place(new_pieces[j], nrows, data_types[name])
            if j in new_pieces
            else pa.nulls(nrows, data_types[name])
            for j, name in enumerate(names)
        }
        meta = _meta_columns(rb, kept, stream_xids, ops, old_kinds, still_open, fallback_rows)
        arrays = []
        for field_ in arrow_schema:
            if field_.name == "_old":
                arrays.append(_old_struct(old_pieces, meta["_old_kind"], nrows))
            elif field_.name in meta:
                value = meta[field_.name]
                arrays.append(value if value.type == field_.type else value.cast(field_.type))
            else:
                arrays.append(data[field_.name])
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    def _old_struct(
        pieces: dict[int, list[tuple[list[int], pa.Array]]], old_kinds: pa.Array, nrows: int
    ) -> pa.Array:
        """The old images; a row without one (its _old_kind is null) is a null struct."""
        import pyarrow as pa
        import pyarrow.compute as pc

        children = [
            _place(pieces[out_index[f.name]], nrows, f.type)
            if f.name in out_index and out_index[f.name] in pieces
            else pa.nulls(nrows, f.type)
            for f in old_field.type
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(old_field.type), mask=pc.is_null(old_kinds)
        )

    def _meta_columns(
        rb: pa.RecordBatch,
        kept: list[int] | None,
        stream_xids: list[int | None] | None,
        ops: pa.Array,
        old_kinds: pa.Array,
        still_open: dict[int, list[str]],
        fallback_rows: dict[int, list[tuple[str, str]]],
    ) -> dict[str, pa.Array]:
        import numpy as np
        import pyarrow as pa

        nrows = len(ops)
        rows = rb if kept is None else rb.take(pa.array(kept, pa.int64()))
        meta: dict[str, pa.Array] = {
            "_lsn": rows.column("lsn"),
            "_seq": rows.column("seq"),
            "_tx_ordinal": rows.column("tx_ordinal"),
            "_commit_lsn": rows.column("commit_lsn"),
            "_commit_ts": rows.column("commit_ts"),
            "_xid": rows.column("xid"),
        }
        if kept is not None and stream_xids is not None:
            # Streamed rows take the commit LSN and time their Stream Commit gave the driver.
            commit_lsns = meta["_commit_lsn"].to_pylist()
            commit_tss = meta["_commit_ts"].to_pylist()
            xids = meta["_xid"].to_pylist()
            for row, k in enumerate(kept):
                stream_xid = stream_xids[k]
                if stream_xid is not None:
                    outcome = streams.commits[stream_xid]
                    commit_lsns[row] = Lsn(outcome[0]).to_signed()
                    commit_tss[row] = pg_timestamp_to_datetime(outcome[2])
                    xids[row] = stream_xid
            meta["_commit_lsn"] = pa.array(commit_lsns, pa.int64())
            meta["_commit_ts"] = pa.array(commit_tss, arrow_schema.field("_commit_ts").type)
            meta["_xid"] = pa.array(xids, pa.int64())
        if origins:
            commit_lsns = meta["_commit_lsn"].to_pylist()
            meta["_origin"] = pa.array([origins.get(c) for c in commit_lsns], pa.string())
        else:
            meta["_origin"] = pa.nulls(nrows, pa.string())
        schema_type = arrow_schema.field
        meta.update(
            _op=ops,
            _old_kind=old_kinds,
            _batch=pa.array(np.full(nrows, batch, dtype=np.int64)),
            _missing_toast=sparse_lists(nrows, {}, schema_type("_missing_toast").type),
            _fallback=sparse_lists(nrows, fallback_rows, schema_type("_fallback").type),
            _truncate_options=pa.nulls(nrows, schema_type("_truncate_options").type),
            _unchanged=sparse_lists(nrows, still_open, schema_type("_unchanged").type),
        )
        return meta

    return run


def arrow_schema_for(spark_schema) -> pa.Schema:  # type: ignore[no-untyped-def]
    """The Arrow schema of a Spark schema, remembered (:mod:`slotlake.schema_memo`: by the
    text of the shared ones of :func:`slotlake.ddltypes.parse_struct` and
    :func:`slotlake.delta.delta_schema`)."""
    hit = schema_memo.get("arrow", spark_schema)
    if hit is not None:
        return hit
    from pyspark.sql.pandas.types import to_arrow_schema

    out = to_arrow_schema(spark_schema, timezone="UTC", prefers_large_types=False)
    schema_memo.put("arrow", spark_schema, out)
    return out


def decode_table(
    raw_dml: DataFrame, cat: TableCatalog, bcat: BatchCatalog, batch: int
) -> DataFrame:
    """Typed change rows (I/U/D) of one table, with unchanged TOAST still open."""

    schema = change_schema(cat)
    arrow_schema = arrow_schema_for(schema)
    fn = make_decoder(cat, bcat.streams, bcat.origins, batch, arrow_schema)
    rows = raw_dml.filter(rows_of(cat)).mapInArrow(fn, schema)
    return rows


def rows_of(cat: TableCatalog):  # type: ignore[no-untyped-def]
    """The condition on raw rows that picks the table's DML rows: its relation oids, and of
    an oid another table of the batch named too, only the rows in its seq ranges."""
    from functools import reduce

    from pyspark.sql import functions as F

    oid, seq = F.col("rel_oid"), F.col("seq")
    whole = sorted(cat.oids - cat.shared.keys())
    parts = [oid.isin(whole)] if whole else []
    parts += [
        (oid == o) & (seq > after) & (seq < before)
        for o, spans in sorted(cat.shared.items())
        for after, before in spans
    ]
    return reduce(lambda a, b: a | b, parts) if parts else F.lit(False)


def raw_dml(raw: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return raw.filter(F.col("msg_type").isin(*DML_TYPES))
