"""Notebook helpers: decode raw payloads in a DataFrame, shape one table's change rows.

Two entry points over a batch's raw Parquet (``spark.read.parquet(raw_dir)``):

* :func:`decode_payload` decodes a column of pgoutput payloads with the shared decoder
  (:func:`slotlake.pgoutput.decode`) into one struct column, :data:`PAYLOAD_SCHEMA`, whose
  fields cover every message type (fields a type does not have are null). It runs a
  ``pandas_udf``; the UDF objects themselves are :data:`decode_payload_udf` and
  :data:`try_decode_payload_udf`, for ``spark.udf.register``.
* :func:`shape_table` is the batch pipeline's table-shaping step as a DataFrame →
  DataFrame function: one table's typed change rows, exactly as the pipeline decodes them
  (:func:`slotlake.decode.decode_table`), before unchanged TOAST is filled from earlier
  rows and before the TRUNCATE markers are added.

Conventions of the payload struct (see docs/udf.md for the full field list):

* LSNs are ``bigint`` holding the 64-bit LSN in two's complement, as the raw Parquet and
  the lake's ``_commit_lsn``/``_lsn`` columns store them, so they join and compare with
  those columns; :func:`lsn_text` formats them as PostgreSQL's ``X/Y``.
* Timestamps are Spark ``timestamp`` (UTC instants); OIDs and xids are ``bigint``
  (they are unsigned 32-bit).
* Tuple values are ``array<string>`` in column order: a text value ('t') as sent, a
  binary value ('b', with ``source.binary = true``) as lowercase hex of the type's send
  format, NULL ('n') and unchanged TOAST ('u') as null. ``old_kinds``/``new_kinds`` keep the kind
  byte of every column (e.g. ``"tnu"``) to tell them apart; ``unchanged`` lists the
  0-based positions of the new tuple's unchanged-TOAST columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slotlake.lsn import Lsn
from slotlake.pgoutput import (
    MESSAGE_TYPES,
    MESSAGE_TYPES_BY_CODE,
    UNCHANGED_TOAST,
    DecodeError,
    Origin,
    Relation,
    Truncate,
    Type,
    decode,
    pg_timestamp_to_datetime,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from slotlake.catalog import ColumnIds, TableCatalog
    from slotlake.decode import BatchCatalog

__all__ = [
    "PAYLOAD_SCHEMA",
    "decode_payload",
    "decode_payload_udf",
    "lsn_text",
    "payload_record",
    "shape_table",
    "table_catalog",
    "try_decode_payload_udf",
]

_COLUMN = StructType(
    [
        StructField("name", StringType()),
        StructField("type_oid", LongType()),
        StructField("typmod", IntegerType()),
        StructField("is_key", BooleanType()),
    ]
)

PAYLOAD_SCHEMA = StructType(
    [
        StructField("type", StringType()),  # the type byte: 'B', 'I', 'U', ...
        StructField("message_name", StringType()),  # the decoder's class: 'Begin', 'Insert', ...
        StructField("xid", LongType()),
        StructField("subxid", LongType()),
        StructField("final_lsn", LongType()),
        StructField("commit_lsn", LongType()),
        StructField("end_lsn", LongType()),
        StructField("lsn", LongType()),
        StructField("prepare_lsn", LongType()),
        StructField("prepare_end_lsn", LongType()),
        StructField("rollback_end_lsn", LongType()),
        StructField("abort_lsn", LongType()),
        StructField("commit_ts", TimestampType()),
        StructField("prepare_ts", TimestampType()),
        StructField("rollback_ts", TimestampType()),
        StructField("abort_ts", TimestampType()),
        StructField("flags", IntegerType()),
        StructField("origin", StringType()),
        StructField("gid", StringType()),
        StructField("relation_oid", LongType()),
        StructField("namespace", StringType()),
        StructField("relation", StringType()),
        StructField("replica_identity", StringType()),
        StructField("columns", ArrayType(_COLUMN)),
        StructField("type_oid", LongType()),
        StructField("type_name", StringType()),
        StructField("old_kind", StringType()),
        StructField("old_values", ArrayType(StringType())),
        StructField("old_kinds", StringType()),
        StructField("new_values", ArrayType(StringType())),
        StructField("new_kinds", StringType()),
        StructField("unchanged", ArrayType(IntegerType())),
        StructField("truncate_options", IntegerType()),
        StructField("relation_oids", ArrayType(LongType())),
        StructField("transactional", BooleanType()),
        StructField("prefix", StringType()),
        StructField("content", BinaryType()),
        StructField("first_segment", BooleanType()),
        StructField("error", StringType()),
        StructField("error_offset", IntegerType()),
    ]
)
"""The struct :func:`decode_payload` returns: one fixed shape for every message type."""

_FIELDS = PAYLOAD_SCHEMA.fieldNames()

# Message fields whose struct field has another name (the struct is shared by all types,
# so a bare ``oid`` or ``name`` would mean different things for different rows).
_RENAMED: dict[tuple[type, str], str] = {
    (Relation, "oid"): "relation_oid",
    (Relation, "name"): "relation",
    (Type, "oid"): "type_oid",
    (Type, "name"): "type_name",
    (Origin, "name"): "origin",
    (Truncate, "options"): "truncate_options",
}
# Per message class: (field index, struct field, converter) for every field.
_PLAN: dict[type, list[tuple[int, str, Any]]] = {}

_KIND = {None: "n", UNCHANGED_TOAST: "u"}


def _lsn(v: Lsn | None) -> int | None:
    return None if v is None else v.to_signed()


def _ts(v: int | None) -> Any:
    return None if v is None else pg_timestamp_to_datetime(v)


def _columns(cols: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [
        {"name": c.name, "type_oid": c.type_oid, "typmod": c.typmod, "is_key": c.is_key}
        for c in cols
    ]


def _tuple(values: tuple[Any, ...] | None) -> tuple[list[str | None] | None, str | None]:
    if values is None:
        return None, None
    out: list[str | None] = []
    kinds: list[str] = []
    for v in values:
        if isinstance(v, str):
            out.append(v)
            kinds.append("t")
        elif isinstance(v, bytes):
            out.append(v.hex())
            kinds.append("b")
        else:
            out.append(None)
            kinds.append(_KIND[v])
    return out, "".join(kinds)


def _plan(cls: type) -> list[tuple[int, str, Any]]:
    plan = []
    for i, name in enumerate(cls._fields):  # type: ignore[attr-defined]
        target = _RENAMED.get((cls, name), name)
        if name in ("old", "new"):
            conv: Any = _tuple
            target = name
        elif name == "columns":
            conv = _columns
        elif name.endswith("_lsn") or name == "lsn":
            conv = _lsn
        elif name.endswith("_ts"):
            conv = _ts
        elif name == "relation_oids":
            conv = list
        else:
            conv = None
        if target not in _FIELDS and name not in ("old", "new"):
            raise AssertionError(f"{cls.__name__}.{name} has no field in PAYLOAD_SCHEMA")
        plan.append((i, target, conv))
    return plan


for _cls in MESSAGE_TYPES:
    _PLAN[_cls] = _plan(_cls)
del _cls


def payload_record(msg: Any) -> dict[str, Any]:
    """One decoded message as a dict of :data:`PAYLOAD_SCHEMA` fields (absent fields omitted).

    The pure-Python half of :func:`decode_payload`, usable without Spark::

        >>> from slotlake.pgoutput import decode
        >>> payload_record(decode(b"I" + bytes.fromhex("00004000") + b"N\\x00\\x02n" + b"t\\x00\\x00\\x00\\x01a"))
        {'type': 'I', 'message_name': 'Insert', 'xid': None, 'relation_oid': 16384, 'new_values': [None, 'a'], 'new_kinds': 'nt', 'unchanged': []}
    """
    cls = type(msg)
    out: dict[str, Any] = {"type": cls.type_code.decode(), "message_name": cls.__name__}
    for i, target, conv in _PLAN[cls]:
        v = msg[i]
        if target in ("old", "new"):
            values, kinds = _tuple(v)
            out[f"{target}_values"] = values
            out[f"{target}_kinds"] = kinds
            if target == "new":
                out["unchanged"] = [j for j, x in enumerate(v) if x is UNCHANGED_TOAST]
        else:
            out[target] = v if conv is None or v is None else conv(v)
    return out


def _error_record(data: bytes, exc: ValueError) -> dict[str, Any]:
    cls = MESSAGE_TYPES_BY_CODE.get(bytes(data[:1]))
    out: dict[str, Any] = {"error": str(exc)}
    if cls is not None:
        out.update(type=cls.type_code.decode(), message_name=cls.__name__)
    if isinstance(exc, DecodeError):
        out["error_offset"] = exc.offset
    return out


def _described(data: bytes, exc: DecodeError) -> DecodeError:
    head = bytes(data[:32]).hex(" ")
    more = "…" if len(data) > 32 else ""
    return DecodeError(
        exc.message_type,
        exc.field,
        exc.offset,
        f"{exc.problem}; payload of {len(data)} bytes: {head}{more} "
        "(decode_payload(..., errors='null') returns the error in a field instead)",
    )


def _true(v: Any) -> bool:
    # A null in_stream arrives as None, pd.NA or NaN depending on the batch's dtype.
    return v is not None and v is not pd.NA and v == v and bool(v)


def _decode_frame(data: pd.Series, in_stream: pd.Series, errors: str) -> pd.DataFrame:
    columns: dict[str, list[Any]] = {name: [None] * len(data) for name in _FIELDS}
    for row, (payload, stream) in enumerate(zip(data, in_stream, strict=True)):
        if payload is None:
            continue  # a null payload gives a struct of nulls
        try:
            record = payload_record(decode(payload, in_stream=_true(stream)))
        except DecodeError as exc:
            if errors == "raise":
                raise _described(payload, exc) from None
            record = _error_record(payload, exc)
        except ValueError as exc:  # a timestamp outside Spark's (and Python's) range
            if errors == "raise":
                raise
            record = _error_record(payload, exc)
        for name, value in record.items():
            columns[name][row] = value
    # object dtype throughout: no int → float64 detour for null bigints, no NaN for null.
    return pd.DataFrame({n: pd.Series(v, dtype=object) for n, v in columns.items()})


@pandas_udf(PAYLOAD_SCHEMA)  # type: ignore[call-overload]
def decode_payload_udf(data: pd.Series, in_stream: pd.Series) -> pd.DataFrame:
    """pandas_udf (payload binary, in_stream boolean) → :data:`PAYLOAD_SCHEMA`; raises on bad input."""
    return _decode_frame(data, in_stream, "raise")


@pandas_udf(PAYLOAD_SCHEMA)  # type: ignore[call-overload]
def try_decode_payload_udf(data: pd.Series, in_stream: pd.Series) -> pd.DataFrame:
    """Like :data:`decode_payload_udf`, but a bad payload gives nulls and an ``error`` field."""
    return _decode_frame(data, in_stream, "null")


def _col(c: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.col(c) if isinstance(c, str) else c


def decode_payload(
    data: Column | str,
    in_stream: Column | str | bool | None = None,
    *,
    errors: Literal["raise", "null"] = "raise",
) -> Column:
    """Decode a column of pgoutput payloads into a :data:`PAYLOAD_SCHEMA` struct column.

    ``in_stream`` (a boolean column or name, or a constant) says which payloads lie
    between Stream Start and Stream Stop, where Relation, Type, Insert, Update, Delete,
    Truncate and Message carry a leading xid; for a raw batch that is
    ``F.col("stream_xid").isNotNull()`` (every other type ignores it). Default: no
    payload is in a stream; a null counts as false.

    ``errors="raise"`` (default): a payload that does not decode fails the Spark job with
    the decoder's DecodeError, which names the message type, field and byte offset.
    ``errors="null"``: such a row gets null fields and ``error``/``error_offset``
    (``type``/``message_name`` too when the type byte is known). A null payload gives a
    struct of nulls in both modes.

    Example (a notebook over one raw batch)::

        from pyspark.sql import functions as F
        from slotlake.lake import Lake
        from slotlake.udf import decode_payload, lsn_text

        lake = Lake("/data/lake")
        raw = spark.read.parquet(lake.path(lake.read_commit(42).raw))  # batch 42's raw
        msgs = raw.select(
            "seq",
            lsn_text("lsn").alias("lsn"),
            decode_payload("data", F.col("stream_xid").isNotNull(), errors="null").alias("m"),
        )
        msgs.where("m.type = 'U'").select("seq", "lsn", "m.relation_oid", "m.new_values").show()
        msgs.where("m.error IS NOT NULL").select("seq", "m.error").show(truncate=False)
    """
    from pyspark.sql import functions as F

    if errors not in ("raise", "null"):
        raise ValueError(f"errors must be 'raise' or 'null', not {errors!r}")
    if in_stream is None or isinstance(in_stream, bool):
        flag = F.lit(bool(in_stream))
    else:
        flag = _col(in_stream)
    udf = decode_payload_udf if errors == "raise" else try_decode_payload_udf
    return udf(_col(data), flag)  # type: ignore[no-any-return]


def lsn_text(lsn: Column | str) -> Column:
    """A bigint LSN column (two's complement, as slotlake stores LSNs) as PostgreSQL's ``X/Y``.

    ``raw.select(lsn_text("lsn").alias("lsn"))`` shows ``16/B374D848`` for the stored
    97500059720; a null stays null.
    """
    from pyspark.sql import functions as F

    c = _col(lsn)
    text = F.format_string("%X/%X", F.shiftrightunsigned(c, 32), c.bitwiseAND(F.lit(0xFFFFFFFF)))
    return F.when(c.isNotNull(), text)


# -- table shaping -----------------------------------------------------------------------


def _catalog_rows(raw_df: DataFrame) -> list[Any]:
    """The batch's descriptive rows (R/Y/T/c/A/O) in seq order, collected to the driver."""
    from collections import namedtuple

    from pyspark.sql import functions as F

    from slotlake.decode import CATALOG_SCAN_COLUMNS, CATALOG_TYPES

    Row = namedtuple("Row", CATALOG_SCAN_COLUMNS)  # type: ignore[misc]
    table = (
        raw_df.where(F.col("msg_type").isin(*CATALOG_TYPES))
        .select(*CATALOG_SCAN_COLUMNS)
        .orderBy("seq")
        .toArrow()
    )
    return [Row(**r) for r in table.to_pylist()]


def table_catalog(
    raw_df: DataFrame,
    batch: int = 0,
    prior_schemas: Mapping[str, list[tuple[str, str]]] | None = None,
    column_ids: Mapping[str, ColumnIds] | None = None,
) -> BatchCatalog:
    """What the pipeline's driver learns from a raw batch: tables, truncates, stream outcomes.

    Collects the few descriptive rows (Relation, Type, Truncate, Stream Commit/Abort,
    Origin) and runs :func:`slotlake.decode.collect_catalog` on them. ``.tables`` maps
    ``"schema.table"`` to its :class:`~slotlake.catalog.TableCatalog`. ``column_ids``
    (the tables' attnums before and after the batch, which tell a rename from a DROP and
    an ADD in one step) is what the pipeline passes:
    ``slotlake.batch.column_ids(lake.read_commit(N - 1), read_catalog_file(lake, raw))``
    (``read_catalog_file`` from :mod:`slotlake.ddl`); without it renames are judged by
    position.
    """
    from slotlake.decode import collect_catalog

    prior = {k: list(v) for k, v in (prior_schemas or {}).items()}
    return collect_catalog(_catalog_rows(raw_df), batch, prior, column_ids=column_ids)


def _pick(tables: Mapping[str, TableCatalog], table: str) -> TableCatalog:
    if table in tables:
        return tables[table]
    matches = [c for n, c in tables.items() if "." not in table and n.split(".", 1)[1] == table]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(sorted(tables)) or "none"
    why = "is ambiguous" if matches else "has no Relation message in this raw batch"
    raise KeyError(f"table {table!r} {why} (tables: {known})")


def shape_table(
    raw_df: DataFrame,
    table: str,
    *,
    batch: int = 0,
    prior_schemas: Mapping[str, list[tuple[str, str]]] | None = None,
    catalog: BatchCatalog | None = None,
    column_ids: Mapping[str, ColumnIds] | None = None,
) -> DataFrame:
    """One table's typed change rows from a raw batch, as the batch pipeline shapes them.

    ``raw_df`` is one batch's raw Parquet (``spark.read.parquet(raw_dir)``, all columns);
    ``table`` is ``"schema.table"`` (a bare name works when it is unique in the batch).
    The result is :func:`slotlake.decode.decode_table` over the batch's DML rows: the
    table's columns with their Spark types (after renames and type changes), the ``_op``
    … ``_truncate_options`` metadata columns, the working columns ``_seq`` (the raw row)
    and ``_unchanged`` (columns whose unchanged TOAST the row's own old image could not
    fill), and ``_old``. Streamed changes get their Stream Commit's LSN and time; aborted
    or uncommitted ones are left out.

    It stops where the pipeline goes on to fill unchanged TOAST from earlier rows and the
    prior state and to add the TRUNCATE markers (``_op = 'T'``; the truncates are in
    ``table_catalog(raw_df).truncates``). ``batch`` is written to ``_batch``;
    ``prior_schemas`` (the state columns of each table before this batch, as
    :func:`slotlake.batch.prior_schemas` reads them from the previous commit record)
    only matters for a rename or type change across batches, ``column_ids`` as for
    :func:`table_catalog`. ``catalog`` reuses a :func:`table_catalog` result instead of
    collecting it again.

    Example::

        from slotlake.batch import prior_schemas
        from slotlake.lake import Lake
        from slotlake.udf import shape_table

        lake = Lake("/data/lake")
        raw = spark.read.parquet(lake.path(lake.read_commit(42).raw))
        rows = shape_table(
            raw, "public.orders", batch=42, prior_schemas=prior_schemas(lake.read_commit(41))
        )
        rows.where("_op = 'U'").select("id", "status", "_old.status", "_unchanged").show()

    Raises KeyError for a table without a Relation message in the batch and
    slotlake.batch.SchemaCollisionError for a table with a column named like slotlake's
    metadata columns (the pipeline refuses those too).
    """
    from slotlake.batch import colliding, collision_error
    from slotlake.decode import decode_table, raw_dml

    bcat = (
        catalog if catalog is not None else table_catalog(raw_df, batch, prior_schemas, column_ids)
    )
    cat = _pick(bcat.tables, table)
    clash = colliding(n for n, _ in cat.columns)
    if clash:
        raise collision_error(cat.name, clash, hint=False)
    return decode_table(raw_dml(raw_df), cat, bcat, batch)
