"""Raw Parquet → typed change rows, in parallel on the executors.

The driver reads only the few messages that describe the batch (Relation, Type,
Truncate, Stream Commit/Abort, Origin); the executors decode every DML payload with the
same decoder (:func:`slotlake.pgoutput.decode`) inside ``mapInArrow`` — the Arrow-native
sibling of ``mapInPandas``: both run the shared decoder in Python workers, but Arrow keeps
decimals, nested arrays and structs without a detour through pandas dtypes.

Nothing here talks to PostgreSQL: the raw Parquet of a batch is enough, which is what
reprocessing relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from slotlake.catalog import RelationVersion, TableCatalog, build_catalogs
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
from slotlake.pgtypes import Fallback, resolve_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

DML_TYPES = ("I", "U", "D")
# Metadata columns of the change log; a leading underscore keeps them apart from table
# columns (PostgreSQL identifiers may start with '_' too: a clash is reported, not silently
# shadowed — see check_no_collision).
META_COLUMNS: list[tuple[str, str]] = [
    ("_op", "string"),
    ("_commit_lsn", "bigint"),
    ("_lsn", "bigint"),
    ("_tx_ordinal", "bigint"),
    ("_xid", "bigint"),
    ("_commit_ts", "timestamp"),
    ("_origin", "string"),
    ("_batch", "bigint"),
    ("_old_kind", "string"),
    ("_missing_toast", "array<string>"),
    ("_fallback", "map<string,string>"),
    ("_truncate_options", "int"),
]
# Working columns that only live between decode and the write.
WORK_COLUMNS: list[tuple[str, str]] = [("_seq", "bigint"), ("_unchanged", "array<string>")]


class RawDataError(RuntimeError):
    """A raw payload that does not decode: names the batch, file, seq and LSN."""


@dataclass
class StreamOutcome:
    commits: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # xid → commit, end, ts
    aborted_subxacts: set[tuple[int, int]] = field(default_factory=set)  # (xid, subxid)


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
    for f in raw_files(path):
        try:
            pf = pq.ParquetFile(f)
        except Exception as exc:
            raise RawDataError(f"raw file {f} is unreadable: {exc}") from exc
        with pf:
            for i in range(pf.num_row_groups):
                small = pf.read_row_group(i, columns=["msg_type", "rel_oid"])
                types.update(pc.unique(small.column("msg_type")).to_pylist())
                commits += pc.sum(pc.is_in(small.column("msg_type"), commit_types)).as_py() or 0
                dml = small.filter(pc.is_in(small.column("msg_type"), pa_array_of(DML_TYPES)))
                for vc in pc.value_counts(dml.column("rel_oid")).to_pylist():
                    counts[vc["values"]] += vc["counts"]
                mask = pc.is_in(small.column("msg_type"), wanted)
                if pc.any(mask).as_py():
                    full = pf.read_row_group(i, columns=columns).filter(mask)
                    rows.extend(Row(**r) for r in full.to_pylist())
    rows.sort(key=lambda r: r.seq)
    return RawScan(rows, dict(counts), types, commits)


def pa_array_of(values: tuple[str, ...]):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.array(list(values), type=pa.string())


def collect_catalog(
    rows: list[Any], batch: int, prior_schemas: dict[str, list[tuple[str, str]]] | None = None
) -> BatchCatalog:
    """Decode the batch's descriptive messages on the driver (a few per table)."""
    relations: list[tuple[int, Relation]] = []
    types: list[tuple[int, Type]] = []
    pending_truncates: list[tuple[Any, Truncate]] = []
    streams = StreamOutcome()
    origins: dict[int, str] = {}
    for r in rows:
        where = f"batch {batch}, seq {r.seq}, lsn {Lsn.from_signed(r.lsn)}"
        msg = _decode_or_raise(
            bytes(r.data), r.stream_xid is not None and r.msg_type not in "cA", where
        )
        if isinstance(msg, Relation):
            relations.append((r.seq, msg))
        elif isinstance(msg, Type):
            types.append((r.seq, msg))
        elif isinstance(msg, Truncate):
            pending_truncates.append((r, msg))
        elif isinstance(msg, StreamCommit):
            streams.commits[msg.xid] = (int(msg.commit_lsn), int(msg.end_lsn), msg.commit_ts)
        elif isinstance(msg, StreamAbort):
            streams.aborted_subxacts.add((msg.xid, msg.subxid))
        elif isinstance(msg, Origin) and r.commit_lsn is not None:
            origins[r.commit_lsn] = msg.name
    catalog = BatchCatalog(build_catalogs(relations, types, prior_schemas), [], streams, origins)
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
    """Precomputed per Relation version: output slot and converter of each column."""

    __slots__ = ("converters", "key_slots", "nout", "slots", "text_slots")

    def __init__(self, version: RelationVersion, out_index: dict[str, int], text_columns: set[str]):
        type_names = {oid: (ns, nm) for oid, ns, nm in version.type_names}
        self.slots = [out_index[c.name] for c in version.columns]
        self.converters = [
            resolve_type(c.type_oid, c.typmod, type_names).convert for c in version.columns
        ]
        self.text_slots = {i for i, c in enumerate(version.columns) if c.name in text_columns}
        keys = set(version.key_columns)
        self.key_slots = {i for i, c in enumerate(version.columns) if c.name in keys}
        self.nout = len(out_index)


def _shape(
    tuple_data: tuple,
    shaper: _VersionShaper,
    names: list[str],
    fallback: dict[str, str],
    prefix: str,
    only: set[int] | None = None,
) -> tuple[list[Any], list[int]]:
    """Tuple data → output-ordered values; returns (values, positions of unchanged TOAST)."""
    out: list[Any] = [None] * shaper.nout
    unchanged: list[int] = []
    for i, raw in enumerate(tuple_data):
        if raw is None or (only is not None and i not in only):
            continue
        slot = shaper.slots[i]
        if raw is UNCHANGED_TOAST:
            unchanged.append(i)
            continue
        if i in shaper.text_slots and isinstance(raw, str):
            out[slot] = raw
            continue
        value = shaper.converters[i](raw)
        if isinstance(value, Fallback):
            fallback[prefix + names[slot]] = value.text
        elif i in shaper.text_slots:
            out[slot] = str(value)
        else:
            out[slot] = value
    return out, unchanged


def make_decoder(
    cat: TableCatalog,
    streams: StreamOutcome,
    origins: dict[int, str],
    batch: int,
    arrow_schema: pa.Schema,
):
    """The function mapInArrow runs over raw DML rows of one table."""
    names = [n for n, _ in cat.columns]
    out_index = {n: i for i, n in enumerate(names)}
    versions_by_oid: dict[int, list[RelationVersion]] = {}
    for v in cat.versions:
        versions_by_oid.setdefault(v.oid, []).append(v)
    text_columns = set(cat.text_columns)
    columns_meta = [n for n, _ in META_COLUMNS + WORK_COLUMNS]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import bisect

        import pyarrow as pa

        shapers: dict[int, _VersionShaper] = {}

        def shaper_for(oid: int, seq: int, lsn: int) -> _VersionShaper:
            vs = versions_by_oid[oid]
            i = bisect.bisect_left([v.seq for v in vs], seq) - 1
            if i < 0:
                raise RawDataError(
                    f"batch {batch}, table {cat.name}, seq {seq}, lsn {Lsn.from_signed(lsn)}: "
                    f"no Relation message for relation oid {oid} before this change"
                )
            v = vs[i]
            if v.seq not in shapers:
                shapers[v.seq] = _VersionShaper(v, out_index, text_columns)
            return shapers[v.seq]

        for rb in batches:
            cols = rb.to_pydict()
            data_out: list[list[Any]] = [[] for _ in names]
            old_out: list[dict[str, Any] | None] = []
            meta: dict[str, list[Any]] = {n: [] for n in columns_meta}
            for seq, lsn, xid, data, rel_oid, commit_lsn, commit_ts, ordinal, stream_xid in zip(
                cols["seq"],
                cols["lsn"],
                cols["xid"],
                cols["data"],
                cols["rel_oid"],
                cols["commit_lsn"],
                cols["commit_ts"],
                cols["tx_ordinal"],
                cols["stream_xid"],
                strict=True,
            ):
                in_stream = stream_xid is not None
                try:
                    msg = decode(data, in_stream=in_stream)
                except DecodeError as exc:
                    raise RawDataError(
                        f"batch {batch}, table {cat.name}, seq {seq}, lsn {Lsn.from_signed(lsn)}: {exc}"
                    ) from exc
                if in_stream:
                    outcome = streams.commits.get(stream_xid)
                    if outcome is None or (stream_xid, msg.xid) in streams.aborted_subxacts:
                        continue
                    commit_lsn = Lsn(outcome[0]).to_signed()
                    commit_ts = pg_timestamp_to_datetime(outcome[2])
                shaper = shaper_for(rel_oid, seq, lsn)
                fallback: dict[str, str] = {}
                old_kind = None
                old_vals = None
                if isinstance(msg, Insert):
                    op = "I"
                    new_vals, unchanged = _shape(msg.new, shaper, names, fallback, "")
                elif isinstance(msg, Update):
                    op = "U"
                    new_vals, unchanged = _shape(msg.new, shaper, names, fallback, "")
                    if msg.old_kind is not None:
                        old_kind = msg.old_kind
                        only = shaper.key_slots if old_kind == "K" else None
                        old_vals, _ = _shape(msg.old, shaper, names, fallback, "_old.", only)
                elif isinstance(msg, Delete):
                    op = "D"
                    old_kind = msg.old_kind
                    only = shaper.key_slots if old_kind == "K" else None
                    old_vals, _ = _shape(msg.old, shaper, names, fallback, "_old.", only)
                    new_vals, unchanged = [None] * len(names), []
                else:
                    raise RawDataError(
                        f"batch {batch}, table {cat.name}, seq {seq}, lsn {Lsn.from_signed(lsn)}: "
                        f"expected a DML message, got {type(msg).__name__}"
                    )
                still: list[str] = []
                for i in unchanged:
                    # An old image fills unchanged TOAST: a full row ('O') any column, a key
                    # image ('K') only the key columns it carries.
                    slot = shaper.slots[i]
                    name = names[slot]
                    if old_vals is not None and (old_kind == "O" or i in shaper.key_slots):
                        new_vals[slot] = old_vals[slot]
                        if "_old." + name in fallback:
                            fallback[name] = fallback["_old." + name]
                    else:
                        still.append(name)
                for j, v in enumerate(new_vals):
                    data_out[j].append(v)
                old_out.append(
                    None if old_vals is None else dict(zip(names, old_vals, strict=True))
                )
                meta["_op"].append(op)
                meta["_commit_lsn"].append(commit_lsn)
                meta["_lsn"].append(lsn)
                meta["_tx_ordinal"].append(ordinal)
                meta["_xid"].append(stream_xid if in_stream else xid)
                meta["_commit_ts"].append(commit_ts)
                meta["_origin"].append(origins.get(commit_lsn))
                meta["_batch"].append(batch)
                meta["_old_kind"].append(old_kind)
                meta["_missing_toast"].append([])
                meta["_fallback"].append(list(fallback.items()))
                meta["_truncate_options"].append(None)
                meta["_seq"].append(seq)
                meta["_unchanged"].append(still)
            if not meta["_op"]:
                continue
            arrays = []
            for field_ in arrow_schema:
                if field_.name == "_old":
                    arrays.append(pa.array(old_out, type=field_.type))
                elif field_.name in meta:
                    arrays.append(pa.array(meta[field_.name], type=field_.type))
                else:
                    arrays.append(pa.array(data_out[out_index[field_.name]], type=field_.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    return run


def arrow_schema_for(spark_schema) -> pa.Schema:  # type: ignore[no-untyped-def]
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC", prefers_large_types=False)


_DECIMAL_DDL = re.compile(r"decimal\((\d+),(\d+)\)")


def spark_type(ddl: str):  # type: ignore[no-untyped-def]
    """A pyspark DataType from the DDL vocabulary the catalog and META_COLUMNS use."""
    from pyspark.sql import types as T

    if ddl.startswith("array<") and ddl.endswith(">"):
        return T.ArrayType(spark_type(ddl[6:-1]))
    if ddl == "map<string,string>":
        return T.MapType(T.StringType(), T.StringType())
    if m := _DECIMAL_DDL.fullmatch(ddl):
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    atomic = {
        "boolean": T.BooleanType,
        "smallint": T.ShortType,
        "int": T.IntegerType,
        "bigint": T.LongType,
        "float": T.FloatType,
        "double": T.DoubleType,
        "string": T.StringType,
        "binary": T.BinaryType,
        "date": T.DateType,
        "timestamp": T.TimestampType,
        "timestamp_ntz": T.TimestampNTZType,
    }
    return atomic[ddl]()


def arrow_change_schema(cat: TableCatalog) -> pa.Schema:
    """``arrow_schema_for(change_schema(cat))`` without a Spark session (no DDL parser in
    the JVM): for the decoder run outside Spark, in benchmarks and unit tests."""
    from pyspark.sql import types as T

    def fields(columns: list[tuple[str, str]]) -> list[T.StructField]:
        return [T.StructField(n, spark_type(t)) for n, t in columns]

    data = fields(cat.columns) or [T.StructField("_none", T.IntegerType())]
    return arrow_schema_for(
        T.StructType(
            fields(cat.columns)
            + fields(META_COLUMNS + WORK_COLUMNS)
            + [T.StructField("_old", T.StructType(data))]
        )
    )


def decode_table(
    raw_dml: DataFrame, cat: TableCatalog, bcat: BatchCatalog, batch: int
) -> DataFrame:
    """Typed change rows (I/U/D) of one table, with unchanged TOAST still open."""
    from pyspark.sql import functions as F

    schema = change_schema(cat)
    arrow_schema = arrow_schema_for(schema)
    fn = make_decoder(cat, bcat.streams, bcat.origins, batch, arrow_schema)
    rows = raw_dml.filter(F.col("rel_oid").isin(sorted(cat.oids))).mapInArrow(fn, schema)
    return rows


def raw_dml(raw: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return raw.filter(F.col("msg_type").isin(*DML_TYPES))
