"""One batch, from its raw Parquet into the lake's Delta tables.

Used by sync (right after the pull), bootstrap-free reruns and reprocessing (from retained
raw alone): it reads raw Parquet and the previous commit record, appends each busy table's
change log and MERGEs its state (tables written concurrently, each idempotently for the
batch), and returns what the commit record needs. It never talks to PostgreSQL and never
writes the commit record.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from slotlake import (
    delta_log,
    durability,
    fastdefault,
    schema_memo,
    table_processes,
    unique_multiset,
)
from slotlake.catalog import (
    RESERVED,
    TARGET_SEQ,
    ColumnIds,
    RelationChange,
    TableCatalog,
    another_relation,
    relation_changes,
    target_versions,
)
from slotlake.ddl import (
    BatchDdl,
    DdlMessage,
    TableColumns,
    read_catalog_file,
    write_ddl,
    write_ddl_local,
)
from slotlake.ddltypes import parse_struct
from slotlake.decode import (
    COMMIT_TYPES,
    WORK_COLUMNS,
    BatchCatalog,
    RawDataError,
    RawScan,
    StreamOutcome,
    arrow_schema_for,
    change_schema,
    collect_catalog,
    decode_table,
    raw_dml,
    scan_raw,
)
from slotlake.delta import (
    UNREAD,
    Kept,
    WriteResult,
    adopt_snapshots,
    append,
    arrow_append_creating,
    arrow_merge_keyed,
    arrow_overwrite,
    delta_schema,
    ensure_local,
    ensure_table,
    handing_back,
    local_last_commit,
    merge,
    overwrite,
    quote,
    renames_left,
    renames_marker,
    reusing_local_tables,
    state_bytes,
    swaps,
    table_bytes,
    table_session,
    txn_version,
)
from slotlake.lake import (
    CHANGES,
    COPIES,
    MESSAGES,
    STATE,
    TRANSACTIONS,
    CommitRecord,
    Lake,
    TableCommit,
    local_path,
    read_delta,
)
from slotlake.spark import LazySession
from slotlake.state import (
    align_prior,
    arrow_merge_predicate,
    empty_state,
    fill_keyed,
    merge_condition,
    multiset_condition,
    multiset_delta,
    state_schema_ddl,
    unique_rows,
)
from slotlake.table_processes import NeedsParent, TableProcesses, processes_for
from slotlake.unique_multiset import Broken, unique_key

if TYPE_CHECKING:
    from concurrent.futures import Future

    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from slotlake.local_table import RawRows
    from slotlake.pgoutput import Relation, Type
    from slotlake.snapshot import TableSnapshot

# Who merges a driver-lane table's state, which the driver holds in every case:
# "driver": deltalake (copy-on-write), or the driver with deletion vectors ("driver-dv")
# for a keyed state too big to rewrite per batch; both fit lake.driver_write_state_mb, so
# a snapshot re-base and fast defaults are done on the driver too. Past that bound a
# keyed state is MERGEd by the driver with deletion vectors ("dv") or by Spark ("spark").
# "append": an INSERT-only multiset (:func:`appends_only`), whose state the driver never
# reads, whatever it weighs: the batch's rows are appended to it (or, after a TRUNCATE,
# are all of it).
StateMerge = Literal["driver", "driver-dv", "dv", "spark", "append"]
ON_DRIVER: tuple[StateMerge, ...] = ("driver", "driver-dv")
# Done without Spark, so in a forked worker too (slotlake.table_processes).
SPARKLESS: tuple[StateMerge, ...] = (*ON_DRIVER, "append")

log = logging.getLogger(__name__)


SINGLE_FILE_ROWS = 2_000_000


class SchemaCollisionError(RuntimeError):
    pass


@dataclass
class BatchOutput:
    tables: dict[str, TableCommit]
    transactions: str | None
    messages: str | None
    transaction_count: int
    transactions_version: int | None = None
    messages_version: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ddl: str | None = None
    ddl_version: int | None = None
    # Tables that began to read another relation in the batch (slotlake.snapshot copies
    # them in the next run unless this batch did).
    relation_changes: dict[str, RelationChange] = field(default_factory=dict)
    # The relations the batch's changes were published under: oid → name (the last).
    streamed: dict[int, str] = field(default_factory=dict)


def colliding(columns: Iterable[str]) -> list[str]:
    """The names among ``columns`` that slotlake's own columns take (:data:`RESERVED`)."""
    return sorted(n for n in columns if n in RESERVED)


def collision_error(table: str, clash: Sequence[str], hint: bool = True) -> SchemaCollisionError:
    """The error for ``table`` whose columns ``clash`` with slotlake's; ``hint``: with what
    a sync's user does about it."""
    what = (
        f"table {table} has column(s) {', '.join(clash)} that collide with slotlake's "
        "metadata columns"
    )
    if not hint:
        return SchemaCollisionError(what)
    return SchemaCollisionError(
        f"{what}: rename them at the source, or leave the table out of the publication "
        "(ALTER PUBLICATION … DROP TABLE); a sync then skips its changes the slot holds and "
        "the table leaves the lake (published again, it is copied anew)"
    )


def check_published_columns(catalog: Mapping[str, TableColumns]) -> None:
    """Refuse a sync whose published tables (``catalog``: the source's at the target)
    include one with a column named like slotlake's, before its plan is written: a batch's
    content is fixed by its plan, and a plan holding such a table would stop every rerun.
    Its changes already in the slot are skipped once it is out of the publication
    (:func:`without_collisions`)."""
    for name, table in sorted(catalog.items()):
        # The columns pgoutput sends (a PostgreSQL 15 column list may leave some out).
        rel = table.relation
        clash = colliding(table.attnums if rel is None else (c.name for c in rel.relation.columns))
        if clash:
            raise collision_error(name, clash)


def _check_collisions(cat: TableCatalog) -> None:
    clash = colliding(n for n, _ in cat.columns)
    if clash:
        raise collision_error(cat.name, clash)


def without_collisions(
    busy: list[TableCatalog],
    published: Mapping[int, str] | None,
    copied: Collection[str],
    batch: int,
) -> list[TableCatalog]:
    """``busy`` without the tables whose columns collide with slotlake's metadata columns
    and that are no longer published at the batch's target (``published``: relation oid →
    name): such a table leaves the lake as any table out of the publication does (marked
    gone, slotlake.lake.mark_gone), its changes of the batch not written; without that
    way out, changes the slot holds would stop every sync. A published one, or any when
    the target's relations are unknown, raises :class:`SchemaCollisionError`."""
    kept = []
    for cat in busy:
        clash = colliding(n for n, _ in cat.columns)
        if not clash:
            kept.append(cat)
        elif published is None or cat.oids & published.keys() or cat.name in copied:
            raise collision_error(cat.name, clash)
        else:
            log.warning(
                "batch %d: %s: its changes are left out: its column(s) %s collide with "
                "slotlake's metadata columns and it is no longer published",
                batch,
                cat.name,
                ", ".join(clash),
            )
    return kept


def prior_schemas(prior: CommitRecord | None) -> dict[str, list[tuple[str, str]]]:
    """State columns (name, ddl) of every table as of the previous commit."""
    if prior is None:
        return {}
    return {
        name: [(c[0], c[1]) for c in t.columns if len(c) > 2 and c[2] == "state"]
        for name, t in prior.tables.items()
    }


def new_copies(
    prior: CommitRecord | None, copies: Mapping[str, TableSnapshot] | None
) -> dict[str, TableSnapshot]:
    """The tables copied for the batch that the lake has no state of: their copy stands
    for the lake's columns before the batch (a column renamed, dropped or added between
    the copy and the target is told as one between two batches)."""
    tables = prior.tables if prior is not None else {}
    return {
        n: snap for n, snap in (copies or {}).items() if n not in tables or tables[n].state is None
    }


def column_ids(
    prior: CommitRecord | None,
    target: dict[str, TableColumns] | None,
    messages: Sequence[DdlMessage] = (),
    copies: Mapping[str, TableSnapshot] | None = None,
) -> dict[str, ColumnIds]:
    """Each table's attnums as the lake last wrote it (a table new to the lake: as its copy
    for the batch has them, ``copies``: :func:`new_copies`), after each DDL the capture
    trigger reported in the batch (``messages``) and at the batch's target: what tells a
    rename from a DROP and an ADD (:func:`slotlake.catalog.build_catalogs`)."""
    tables = prior.tables if prior is not None else {}
    before = {n: t.attnums for n, t in tables.items()}
    before.update({n: dict(snap.attnums) for n, snap in (copies or {}).items()})
    after = {n: t.attnums for n, t in target.items()} if target is not None else {}
    sent = {
        n: frozenset(c.name for c in t.relation.relation.columns)
        for n, t in (target or {}).items()
        if t.relation is not None and t.natts is not None
    }
    points: dict[str, list[tuple[int, dict[str, int]]]] = {}
    for m in messages:
        for name, attnums in m.columns.items():
            points.setdefault(name, []).append((m.seq, attnums))
    out = {}
    for n in {*before, *after, *points}:
        kept = tables.get(n)
        oid = kept.oid if kept is not None else None
        if copies and n in copies:
            oid = copies[n].oid
        shape = (target or {}).get(n)
        # Dropped and created again since the lake wrote it: the lake's attnums are
        # another relation's, and say nothing of this one's columns.
        other = (
            shape is not None
            and shape.relation is not None
            and another_relation(oid, shape.relation.relation.oid)
        )
        out[n] = ColumnIds(
            {} if other else before.get(n, {}),
            after.get(n, {}),
            tuple(points.get(n, ())),
            None if other or kept is None else kept.natts,
            sent.get(n),
            oid_before=oid,
        )
    return out


def _relation_oid(
    cat: TableCatalog, prior: TableCommit | None, snap: TableSnapshot | None
) -> int | None:
    """The relation a batch writes the table from: its last version's, else (a table
    re-based on its copy without a change in the batch) the copy's, else the lake's."""
    if cat.versions:
        return cat.versions[-1].oid
    if snap is not None:
        return snap.oid
    return prior.oid if prior is not None else None


def versions_at_target(
    relations: list[tuple[int, Relation]],
    prior: CommitRecord | None,
    schemas: dict[str, list[tuple[str, str]]],
    target: dict[str, TableColumns] | None,
    copies: Mapping[str, TableSnapshot] | None = None,
) -> list[tuple[int, Relation | Type]]:
    """The batch's tables brought to their shape at its target (a column change after a
    table's last change, :func:`slotlake.catalog.target_versions`); nothing for a batch
    whose catalog file predates the Relation shapes in it. ``schemas``:
    :func:`prior_schemas` of ``prior``. ``copies``: :func:`new_copies`, compared by their
    copy's columns (a column added, renamed or dropped after the copy)."""
    if not target:
        return []
    shapes = {n: t.relation for n, t in target.items() if t.relation is not None}
    lake_tables = {
        n: ([c for c, _ in schemas.get(n, [])], t.attnums)
        for n, t in (prior.tables.items() if prior is not None else ())
        if t.state is not None
    }
    oids = {n: t.oid for n, t in (prior.tables.items() if prior is not None else ())}
    for n, snap in (copies or {}).items():
        lake_tables[n] = ([c[0] for c in snap.columns], snap.attnums)
        oids[n] = snap.oid
    attnums = {n: t.attnums for n, t in target.items()}
    return target_versions(relations, shapes, attnums, lake_tables, oids)


def conform(df: DataFrame, target: StructType) -> DataFrame:
    """``df`` with exactly the target table's columns, in its order: columns the batch does
    not have (dropped at the source in an earlier batch) are NULL, ``_old`` is padded alike."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType as ST

    have = set(df.columns)
    cols = []
    for f in target.fields:
        if f.name not in have:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
        elif f.name == "_old" and isinstance(f.dataType, ST):
            old_have = set(df.schema["_old"].dataType.fieldNames())  # type: ignore[attr-defined]
            parts = [
                (F.col("_old").getField(g.name) if g.name in old_have else F.lit(None))
                .cast(g.dataType)
                .alias(g.name)
                for g in f.dataType.fields
            ]
            cols.append(
                F.when(F.col("_old").isNull(), None).otherwise(F.struct(*parts)).alias("_old")
            )
        else:
            cols.append(F.col(quote(f.name)).cast(f.dataType).alias(f.name))
    return df.select(*cols)


def parquet_rows(directory: str) -> int:
    """Rows of the Parquet files of a directory, from their footers (no Spark job)."""
    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(p).metadata.num_rows for p in sorted(Path(directory).glob("*.parquet"))
    )


def marker_rows(cat: TableCatalog, bcat: BatchCatalog, batch: int) -> list[dict[str, Any]]:
    """The change-log rows (``_op`` = 'T') of the table's TRUNCATEs in the batch."""
    truncs = [t for t in bcat.truncates if cat.name in t.tables]
    return [
        {
            "_op": "T",
            "_commit_lsn": t.commit_lsn,
            "_lsn": None,
            "_tx_ordinal": t.tx_ordinal,
            "_xid": t.xid,
            "_commit_ts": t.commit_ts,
            "_origin": bcat.origins.get(t.commit_lsn),
            "_batch": batch,
            "_old_kind": None,
            "_missing_toast": [],
            "_fallback": {},
            "_truncate_options": t.options,
            "_seq": t.seq,
            "_unchanged": [],
            "_old": None,
        }
        for t in truncs
    ]


def _markers(
    spark: SparkSession, cat: TableCatalog, bcat: BatchCatalog, batch: int
) -> DataFrame | None:
    rows = marker_rows(cat, bcat, batch)
    return spark.createDataFrame(rows, change_schema(cat)) if rows else None


def read_prior_state(
    spark: SparkSession, lake: Lake, cat: TableCatalog, prior: TableCommit | None
) -> DataFrame:
    """The table's state as of the previous commit (Delta time travel), aligned to this batch.

    Reading the recorded version, not the latest, keeps a rerun of batch N exact after its
    first attempt already merged N into the state.
    """
    df = _prior_version(spark, lake, prior)
    if df is None:
        return empty_state(spark, cat)
    if COPIES in df.columns:
        df = df.drop(COPIES)
    return align_prior(df, cat)


def _prior_version(spark: SparkSession, lake: Lake, prior: TableCommit | None) -> DataFrame | None:
    """The state's version the previous commit names, as stored (None: no state yet)."""
    if prior is None or not prior.state or prior.state_version is None:
        return None
    return (
        spark.read.format("delta")
        .option("versionAsOf", prior.state_version)
        .load(lake.path(prior.state))
    )


def read_whole_prior(
    spark: SparkSession,
    lake: Lake,
    cat: TableCatalog,
    prior: TableCommit | None,
    defaults: list[fastdefault.FastDefault],
) -> DataFrame:
    """The prior state as plain rows (a multiset's repeated by ``_copies``), aligned to this
    batch, with the fast defaults its rows read: what
    :func:`slotlake.identity_segments.replay_frames` starts from."""
    from pyspark.sql import functions as F

    df = _prior_version(spark, lake, prior)
    if df is None:
        return empty_state(spark, cat)
    if COPIES in df.columns:
        copy = F.explode(F.sequence(F.lit(1), F.col(COPIES).cast("int"))).alias("_copy")
        df = df.select("*", copy).drop("_copy", COPIES)
    return fastdefault.fill_rows(align_prior(df, cat), [d for d in defaults if d.update_prior])


def change_log_columns(
    lake: Lake, spark: LazySession, prior: CommitRecord | None, table: str
) -> dict[str, str]:
    """The columns of ``table``'s change log, name → Spark type, top level and in its old
    image, as the last committed batch left it (none before it exists). It keeps the
    columns dropped at the source, whose names a column added or renamed later may take
    (:meth:`slotlake.catalog._Lineage.settle`), and the ``a__dropped`` an earlier batch's
    replacement of ``a`` left. Read at the version the commit record names, not the
    latest: a rerun of a batch whose first attempt already moved names in it decides as
    the first attempt did."""
    from pyspark.sql.types import StructType

    t = prior.tables.get(table) if prior is not None else None
    if t is None or t.changes is None or t.changes_version is None:
        return {}
    schema = schema_as_of(lake, t.changes, t.changes_version, spark) or schema_as_of(
        lake, t.changes, None, spark
    )
    if schema is None:
        return {}
    out: dict[str, str] = {}
    old = schema["_old"].dataType if "_old" in schema.fieldNames() else None
    for f in [*(old.fields if isinstance(old, StructType) else []), *schema.fields]:
        out[f.name] = f.dataType.simpleString()
    return out


def renames_to_make(
    lake: Lake,
    cat: TableCatalog,
    prior: TableCommit | None,
    spark: Callable[[], SparkSession] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """``cat.renames`` for the table's change log and its state, each less those an
    earlier attempt of the batch made (:func:`slotlake.delta.renames_left`, against the
    versions the last commit record names). A lake elsewhere than on local disk is read
    through ``spark``'s JVM (without a session: all of them, as before)."""
    out = []
    for kind, version in (
        (CHANGES, None if prior is None else prior.changes_version),
        (STATE, None if prior is None else prior.state_version),
    ):
        renames = cat.renames
        if renames and version is not None and (lake.on_local_disk or spark is not None):
            rel = Lake.table_path(kind, cat.name)
            before = schema_as_of(lake, rel, version, spark)
            renames = renames_left(before, schema_as_of(lake, rel, None, spark), renames)
        out.append(renames)
    return out[0], out[1]


def schema_as_of(
    lake: Lake,
    rel: str,
    version: int | None,
    spark: Callable[[], SparkSession] | None = None,
) -> StructType | None:
    """The schema of the lake's Delta table ``rel`` as of ``version`` (None: the latest),
    with its column mapping metadata: from its log on a local lake, else through
    ``spark``'s JVM (a DataFrame's schema, even read with ``versionAsOf``, leaves the
    metadata out). None when the log no longer holds that version (expired by the log's
    retention, a table made anew): the caller then decides by the latest schema, as
    before such versions were read."""
    path = lake.path(rel)
    try:
        if lake.on_local_disk:
            return delta_schema(str(local_path(path)), version)
        assert spark is not None, path
        from slotlake.swap_alters import mapped_schema

        return mapped_schema(spark(), path, version)
    except Exception as exc:  # delta_log's, deltalake's and the JVM's own error types
        if version is None:
            raise
        log.warning("%s: version %d not readable (%s): its latest schema", path, version, exc)
        return None


def swaps_on_driver(lake: Lake) -> bool:
    """Whether the driver makes a swap of names of a table Spark writes (one log entry
    carrying the batch's marker), as it does for the tables it writes: on a local lake.
    Elsewhere Spark's ALTERs make it, one column per commit (:mod:`slotlake.swap_alters`)."""
    return lake.on_local_disk


def _state_schema(cat: TableCatalog, counted: bool | None = None) -> StructType:
    """The state's schema: with ``_copies`` for a multiset (``counted``: with it or
    without, whatever the table's identity)."""
    ddl = state_schema_ddl(cat)
    if cat.is_multiset if counted is None else counted:
        ddl += f", `{COPIES}` bigint"
    return parse_struct(ddl)


def _whole_prior(
    lake: Lake,
    state_rel: str,
    version: int,
    cat: TableCatalog,
    schema: pa.Schema,
    defaults: list[fastdefault.FastDefault],
) -> pa.Table:
    """A state rebuilt on the driver: its prior version whole, in this batch's columns
    (``schema``), with the fast defaults its rows read."""
    from slotlake.local_table import align_prior_arrow

    whole = align_prior_arrow(read_delta(lake.uri, state_rel, version), cat, schema)
    prior_defaults = [d for d in defaults if d.update_prior]
    return fastdefault.apply_arrow(whole, prior_defaults, None) if prior_defaults else whole


def rebased_on_driver(cat: TableCatalog, removes: bool = False) -> bool:
    """Whether the driver may re-base the table on a copy (a small one: DriverWrites.take).
    A multiset is rebuilt whole there (:func:`slotlake.multiset_arrow.multiset_state`), or
    an INSERT-only one's copy stored a row a copy and its later rows appended
    (:attr:`TableCommit.spread`); not one whose identity changed in the batch, nor an
    INSERT-only one that ``removes`` rows after all (:func:`appends_only`): Spark re-bases
    those."""
    if not cat.is_multiset:
        return True
    return not cat.identity_switches and not (removes and insert_only(cat))


def insert_only(cat: TableCatalog) -> bool:
    """A multiset none of whose versions in the batch (nor its latest shape) has a FULL
    identity or a key. PostgreSQL refuses an UPDATE or DELETE of a published table without
    an identity to match rows by (it raises "cannot update table … because it does not
    have a replica identity"), so its stream holds INSERTs and TRUNCATEs only."""
    shapes = [(v.replica_identity, v.key_columns) for v in cat.versions]
    shapes.append((cat.replica_identity, tuple(cat.key_columns)))
    return not any(identity == "f" or key for identity, key in shapes)


def appends_only(
    cat: TableCatalog, prior: TableCommit | None, removes: bool = False, copied: bool = False
) -> bool:
    """Whether the batch can only add rows to the table's state (:func:`insert_only`, with
    rows in the batch), which is then appended to without being read. A state still
    stored keyed (the key dropped since) takes the usual rebuild first. ``removes``: the
    raw batch has an UPDATE or DELETE of the table after all
    (:attr:`slotlake.decode.RawScan.removing`): a partitioned table's root keeps an
    identity of its own while a leaf of FULL identity sends old rows under the root's
    name; then its rows are matched, as any multiset's. ``copied``: the state is re-based
    on a copy in this batch, its rows one copy each, whatever it was before: the rows
    from the copy's consistent point on are appended to it (rows in the batch or not)."""
    if removes or not insert_only(cat):
        return False
    if copied:
        return True
    return bool(cat.versions) and (prior is None or not prior.state or prior.multiset)


def _write_state(
    session: SparkSession,
    lake: Lake,
    cat: TableCatalog,
    state_rel: str,
    source: DataFrame,
    truncated: bool,
    app_id: str,
    batch: int,
    appends: bool = False,
    spread: bool = False,
) -> WriteResult:
    """One Delta commit that brings the state to the batch's end: MERGE, or an overwrite
    when the batch truncated the table (the truncate and what followed it, at once).

    A multiset's: ``appends`` (:func:`appends_only`), its rows appended; ``spread``
    (:attr:`TableCommit.spread`), its state rebuilt whole, each value in one row again,
    as a MERGE on whole rows needs."""
    from pyspark.sql import functions as F

    path = lake.path(state_rel)
    data = [quote(c) for c in cat.state_columns]
    if cat.is_multiset:
        if truncated or appends or spread:
            rows = source
            if spread and not truncated and not appends:
                rows = _with_prior_copies(session, path, cat, source)
            rows = rows.filter(F.col("_d") > 0).select(
                *data,
                "_fallback",
                F.array().cast("array<string>").alias("_missing_toast"),
                F.col("_d").alias(COPIES),
            )
            if appends and not truncated:
                return append(rows, path, app_id, batch)
            return overwrite(rows, path, app_id, batch)
        values = {c: f"s.{c}" for c in data}
        values.update({"_fallback": "s._fallback", "_missing_toast": "array()", COPIES: "s._d"})
        return merge(
            session,
            path,
            source,
            multiset_condition(cat),
            lambda m: (
                m.whenMatchedDelete(f"t.{COPIES} + s._d <= 0")
                .whenMatchedUpdate(set={COPIES: f"t.{COPIES} + s._d"})
                .whenNotMatchedInsert(condition="s._d > 0", values=values)
            ),
            app_id,
            batch,
            vectors=_merged_with_vectors(session, path),
        )
    if truncated:
        rows = source.filter(~F.col("_deleted")).select(*data, "_fallback", "_missing_toast")
        return overwrite(rows, path, app_id, batch)
    values = {c: f"s.{c}" for c in [*data, "_fallback", "_missing_toast"]}
    return merge(
        session,
        path,
        source,
        merge_condition(cat),
        lambda m: (
            m.whenMatchedDelete("s._deleted")
            .whenMatchedUpdate(set=values)
            .whenNotMatchedInsert(condition="NOT s._deleted", values=values)
        ),
        app_id,
        batch,
        vectors=_merged_with_vectors(session, path),
    )


def _merged_with_vectors(session: SparkSession, path: str) -> bool:
    """Whether Spark's MERGE of a state writes deletion vectors: not into a state of at
    most ``DriverWrites.DV_FROM_BYTES``, whose touched files are rewritten, as the driver
    does (a few small files; measured on a 222-row keyed state: 15 Spark jobs with
    vectors, 7 without, ~0.6 s of a 5 s batch). A size not to be had keeps the vectors."""
    size = state_bytes(session, path)
    return size is None or size > DriverWrites.DV_FROM_BYTES


def _merge_unique(
    session: SparkSession,
    lake: Lake,
    cat: TableCatalog,
    state_rel: str,
    delta: DataFrame,
    key: list[str],
    app_id: str,
    batch: int,
) -> tuple[WriteResult, bool]:
    """Spark's MERGE of a multiset unique on ``key`` by that key
    (:func:`slotlake.state.unique_rows` of its net change ``delta``), what its changes
    cost instead of what it weighs, and whether the state's commit of the batch is that
    MERGE (a rerun finds the batch's commit an earlier attempt made, which may have
    matched rows whole); :class:`Broken`, nothing written, when the batch would leave a
    key twice (a key added twice, or added while live in the state: the MERGE's own rows
    raise it, so that the check costs no job of its own)."""
    path = lake.path(state_rel)
    data = [quote(c) for c in cat.state_columns]
    values = {c: f"s.{c}" for c in [*data, "_fallback"]}
    values.update({"_missing_toast": "array()", COPIES: "1"})
    inserted = dict(values)
    inserted[COPIES] = f"CASE WHEN s._bad THEN raise_error('{_NOT_UNIQUE}') ELSE 1 END"
    text = unique_multiset.merged_by_key_text(key)
    try:
        written = merge(
            session,
            path,
            unique_rows(delta, cat, key),
            merge_condition(unique_multiset.keyed_view(cat, key)),
            lambda m: (
                m.whenMatchedUpdate(
                    condition="s._fresh OR s._bad",
                    set={COPIES: f"raise_error('{_NOT_UNIQUE}')"},
                )
                .whenMatchedDelete("s._deleted")
                .whenMatchedUpdate(set=values)
                .whenNotMatchedInsert(condition="NOT s._deleted", values=inserted)
            ),
            app_id,
            batch,
            metadata=text,
            vectors=_merged_with_vectors(session, path),
        )
    except Exception as exc:  # raised in a task, it reaches here wrapped in the write's error
        if _NOT_UNIQUE not in str(exc):
            raise
        raise Broken("a key added twice, or added while live in the state") from None
    return written, written.user_metadata == text


# The message of the error Spark's MERGE of a unique multiset raises from the rows that
# would leave a key twice (_merge_unique).
_NOT_UNIQUE = "slotlake: the batch leaves a key twice"


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _with_prior_copies(
    session: SparkSession, path: str, cat: TableCatalog, delta: DataFrame
) -> DataFrame:
    """A multiset's whole new state, one row per value: its state as it stands (the
    prior, in this batch's columns) grouped by value with ``delta``'s net changes
    (:func:`slotlake.state.multiset_delta`'s columns, ``_d`` the copies)."""
    from pyspark.sql import functions as F

    from slotlake.state import sorted_json

    data = [F.col(quote(c)) for c in cat.state_columns]
    prior = session.read.format("delta").load(path)
    counted = prior.select(
        *data,
        sorted_json(F.col("_fallback")).alias("_fbj"),
        F.col(COPIES).cast("long").alias("_d"),
    )
    typed = [F.col(quote(c)).cast(prior.schema[c].dataType).alias(c) for c in cat.state_columns]
    both = counted.unionByName(delta.select(*typed, "_fbj", F.col("_d").cast("long")))
    grouped = both.groupBy(*data, "_fbj").agg(F.sum("_d").alias("_d"))
    return grouped.select(*data, F.from_json("_fbj", "map<string,string>").alias("_fallback"), "_d")


def _state_rows(prior: TableCommit | None, result: WriteResult, appended: bool = False) -> int:
    m = result.metrics
    base = prior.state_rows if prior is not None else 0
    if "numTargetRowsInserted" in m:
        return base + int(m.get("numTargetRowsInserted", 0)) - int(m.get("numTargetRowsDeleted", 0))
    return (base if appended else 0) + int(m.get("numOutputRows", 0))


class _Steps:
    """Debug timings of one table's steps (``--log-level DEBUG`` shows them)."""

    def __init__(self, what: str, spark: Any = None, logger: logging.Logger = log) -> None:
        self.what, self.t, self.log = what, time.monotonic(), logger
        # Listing the session's job ids crosses py4j once per job ever run (measured: a
        # quarter of a small table's time): only for a debug log.
        debug = spark is not None and logger.isEnabledFor(logging.DEBUG)
        self.tracker = spark.sparkContext.statusTracker() if debug else None
        self.jobs = self._jobs()

    def _jobs(self) -> int:
        return max(self.tracker.getJobIdsForGroup(None) or [0]) if self.tracker else 0

    def __call__(self, step: str) -> None:
        now, jobs = time.monotonic(), self._jobs()
        self.log.debug("%s: %s in %.2fs (%d jobs)", self.what, step, now - self.t, jobs - self.jobs)
        self.t, self.jobs = now, jobs


# DriverWrites.take's ``size`` when the caller does not know the state's bytes.
SIZE_UNREAD = -1


@dataclass(frozen=True)
class DriverWrites:
    """Which tables are done on the driver (:mod:`slotlake.local_table`): tables
    with few changes (``lake.driver_write_rows`` rows, ``lake.driver_write_mb`` of
    payloads for all of them: a table past that is given back to Spark while the raw batch
    is read, see :func:`slotlake.local_table.read_raw_dml`). Their rows stay on the driver: decoded,
    filled and appended to the change log without a Spark job. Their state is merged by
    the driver rewriting the files a MERGE touches while it is small (``DV_FROM_BYTES``,
    or ``lake.driver_write_state_mb`` with deletion vectors off); a bigger keyed state is
    MERGEd by the driver with deletion vectors
    (:mod:`slotlake.dv_merge`; ``lake.driver_deletion_vectors``), or by Spark's MERGE fed
    the driver's final rows when that is off or the table's protocol asks for more than
    the driver writes; a bigger multiset (whose state the driver
    rebuilds whole) is left to Spark altogether. All such tables of a batch together hold at most
    ``TOTAL_FACTOR`` × ``max_rows`` rows in the driver; the rest go to Spark.

    By default (the two settings "auto") the bounds follow the memory the process may
    use (:func:`slotlake.memory.memory_limit`): a quarter of it for the driver's tables,
    at ``PEAK_PER_PAYLOAD_BYTE`` × their payload bytes and ``PEAK_PER_ROW`` bytes a row
    (measured on bench/sync_bench.py's 1M-change table: peak RSS 1.41 GB for 160 MB of
    payloads, ~250 MB of which the process holds anyway). A 24 GiB machine takes up to
    768 MiB of payloads and 1.34M rows a table; a 4 GiB container 128 MiB and 224k rows.
    """

    max_rows: int = 250_000
    max_state_bytes: int = 64 << 20
    max_bytes: int = 64 << 20
    deletion_vectors: bool = True
    # Worker processes for the batch's driver-done tables (slotlake.table_processes);
    # None: one a core, 0 or 1: the parent's threads only.
    processes: int | None = None
    TOTAL_FACTOR = 4
    MEMORY_SHARE = 4  # the driver's tables may take 1/MEMORY_SHARE of the memory limit
    PEAK_PER_PAYLOAD_BYTE = 8
    PEAK_PER_ROW = 1200
    # A keyed state past this is MERGEd with deletion vectors even within max_state_bytes:
    # a rewrite copies every file a key hits. Measured (bench/lake_bench.py's mid step,
    # 2,000 random changes, the driver rewriting vs writing vectors): 100k rows (~6 MiB)
    # 0.15-0.21 s vs 0.10-0.13 s, 500k rows 0.29-0.33 vs 0.11-0.12 s; at 20k rows
    # (~1.5 MiB) the two are even, and a rewrite keeps a small table in a file or two.
    DV_FROM_BYTES = 4 << 20

    @classmethod
    def of(cls, lake_cfg: Any, memory: int | None = None) -> DriverWrites:
        """The lake settings' bounds, "auto" ones worked out from ``memory`` (bytes; by
        default the process's limit)."""
        rows, mb = lake_cfg.driver_write_rows, lake_cfg.driver_write_mb
        if rows is None or mb is None:
            from slotlake.memory import memory_limit

            budget = (memory or memory_limit()) // cls.MEMORY_SHARE
            if rows is None:
                rows = budget // cls.PEAK_PER_ROW // cls.TOTAL_FACTOR
            if mb is None:
                mb = budget // cls.PEAK_PER_PAYLOAD_BYTE >> 20
        return cls(
            rows,
            lake_cfg.driver_write_state_mb << 20,
            mb << 20,
            bool(lake_cfg.driver_deletion_vectors),
            lake_cfg.table_processes,
        )

    def describe(self) -> str:
        head = f"up to {self.max_rows:,} rows a table, {self.max_bytes >> 20} MiB of payloads, "
        if self.deletion_vectors:
            return head + (
                f"a keyed state MERGEd by deltalake up to {self.DV_FROM_BYTES >> 20} MiB, "
                "above that with deletion vectors"
            )
        return head + f"state MERGEd by deltalake up to {self.max_state_bytes >> 20} MiB"

    def holds(self, rows: int) -> bool:
        """Whether ``rows`` rows fit in the driver's total for a batch."""
        return rows <= self.TOTAL_FACTOR * self.max_rows

    def take(
        self,
        lake: Lake,
        cat: TableCatalog,
        state_path: str,
        expected_rows: int,
        size: int | None = SIZE_UNREAD,
        appends: bool = False,
        unique: bool = False,
    ) -> StateMerge | None:
        """None when Spark does the whole table, else who merges its state. ``size``: the
        state's bytes when the caller knows them (a snapshot's copy; None: no state yet),
        else :data:`SIZE_UNREAD`: read here.
        ``appends``: an INSERT-only multiset (:func:`appends_only`), whose state is not
        read, whatever it weighs; ``unique``: a multiset MERGEd by the key its state is
        unique on (:func:`slotlake.unique_multiset.unique_key`), as a keyed table."""
        if expected_rows > self.max_rows or self.max_rows <= 0:
            return None
        if not lake.on_local_disk:
            return None  # object stores and HDFS: Spark's Hadoop file systems write
        if appends and (cat.versions or size != SIZE_UNREAD):  # (a copy's size is known)
            return "append"
        if size == SIZE_UNREAD:
            if not cat.versions:
                return None  # nothing in the batch to write the table from (nor a copy)
            size = table_bytes(str(local_path(state_path)))
        # None: created by this batch.
        if size is None or size <= self.max_state_bytes:
            rebuilt = (cat.is_multiset and not unique) or cat.identity_switches
            if self.deletion_vectors and not rebuilt and (size or 0) > self.DV_FROM_BYTES:
                return "driver-dv"
            return "driver"
        # A multiset's state, and one whose identity changed, is rebuilt whole on the
        # driver: a big one stays with Spark (a unique one is MERGEd by its key).
        if (cat.is_multiset and not (unique and self.deletion_vectors)) or cat.identity_switches:
            return None
        return "dv" if self.deletion_vectors else "spark"

    def pick(
        self,
        lake: Lake,
        cats: list[TableCatalog],
        expected: dict[str, int],
        sizes: dict[str, int] | None = None,
        appends: Collection[str] = (),
        unique: Collection[str] = (),
    ) -> dict[str, StateMerge]:
        """The tables of a batch done on the driver (fewest changes first, within the
        driver's total), each with who merges its state (``sizes``: state bytes known
        already, by table; ``appends``: the INSERT-only multisets; ``unique``: the
        multisets MERGEd by a key)."""
        picked: dict[str, StateMerge] = {}
        total = 0
        for cat in sorted(cats, key=lambda c: (expected[c.name], c.name)):
            rows = expected[cat.name]
            if not self.holds(total + rows):
                break
            state = lake.path(Lake.table_path(STATE, cat.name))
            size = (sizes or {}).get(cat.name, SIZE_UNREAD)
            merge = self.take(lake, cat, state, rows, size, cat.name in appends, cat.name in unique)
            if merge is not None:
                picked[cat.name] = merge
                total += rows
        return picked


def process_table(
    spark: SparkSession | LazySession,
    lake: Lake,
    raw_rel: str,
    cat: TableCatalog,
    bcat: BatchCatalog,
    prior: TableCommit | None,
    batch: int,
    app_id: str,
    expected_rows: int,
    ddl_input: BatchDdl | None = None,
    snap: TableSnapshot | None = None,
    local_raw: RawRows | None = None,
    state_merge: StateMerge = "driver",
    removes: bool = False,
) -> TableCommit:
    """Decode, fill and write one table for batch ``batch``: append its change log, then
    MERGE its state, each in one idempotent Delta commit, from a session of its own.

    ``ddl_input``: the batch's DDL messages and catalog, for fast defaults
    (:mod:`slotlake.fastdefault`: an UPDATE of the state before the MERGE).
    ``snap``: the table was copied for this batch (slotlake.snapshot): its state is first
    replaced by the copy, then the changes from the copy's consistent point are merged.
    ``local_raw``: the table's raw DML rows when :class:`DriverWrites` took it: then it is
    done on the driver without Spark (:mod:`slotlake.local_table`), fast defaults included
    unless the table has its state merged by Spark (then Spark's UPDATE applies them);
    ``state_merge`` says who merges its state. ``removes``: the raw batch has an UPDATE or
    DELETE of the table (see :func:`appends_only`).
    """
    from pyspark.sql import functions as F

    _check_collisions(cat)
    lazy = LazySession.of(spark)
    steps = _Steps(f"batch {batch}: {cat.name}", lazy.started)
    changes_rel = Lake.table_path(CHANGES, cat.name)
    state_rel = Lake.table_path(STATE, cat.name)
    state_set = set(cat.state_columns)
    commit = TableCommit(
        changes=changes_rel,
        state=state_rel,
        columns=[[n, t, "state" if n in state_set else "log"] for n, t in cat.columns],
        key_columns=list(cat.key_columns),
        replica_identity=cat.replica_identity,
        renames=dict(cat.renames),
        written=True,
        oid=_relation_oid(cat, prior, snap),
    )
    defaults = ddl_input.plan(cat, prior, commit, snap is not None) if ddl_input is not None else []
    shape = (
        None if ddl_input is None or ddl_input.catalog is None else ddl_input.catalog.get(cat.name)
    )
    # The copy's attnums say nothing of another relation's (dropped and created again
    # after the copy): that one's columns are matched by names, as before.
    if (
        snap is not None
        and shape is not None
        and (shape.relation is None or not another_relation(snap.oid, shape.relation.relation.oid))
    ):
        from slotlake.snapshot import copy_names

        cat.copy_names = copy_names(snap, shape.attnums)
    truncs = sorted((t.commit_lsn, t.tx_ordinal) for t in bcat.truncates if cat.name in t.tables)
    # An INSERT-only multiset's rows are appended to its state (after a TRUNCATE they are
    # all of it); a spread one that must be matched now is rebuilt (TableCommit.spread).
    # Re-based on a copy (by the driver or Spark), its state becomes the copy's rows one
    # copy each, and those from the copy's consistent point on are appended.
    only_inserts = insert_only(cat)  # (a multiset: no key in its latest shape either)
    spread_base = snap is not None and only_inserts
    appends = appends_only(cat, prior, removes, copied=snap is not None)
    if removes and only_inserts:
        log.info("%s: an UPDATE or DELETE of a table without an identity: rows matched", cat.name)
    # A TRUNCATE before a copy's consistent point is inside the copy.
    overwrites = [t for t in truncs if snap is None or t[0] >= snap.cp_signed]
    commit.spread = appends and not overwrites
    done: list[int | None] = [UNREAD, UNREAD]
    if lake.on_local_disk:
        paths = [str(local_path(lake.path(rel))) for rel in (changes_rel, state_rel)]
        done = [txn_version(p, app_id) for p in paths]
        if all(v is not None and v >= batch for v in done):
            # An earlier attempt of this batch wrote both tables: nothing to recompute.
            c, s = (local_last_commit(p) for p in paths)
            _finish(commit, c, s, prior)
            # A key the earlier attempt's MERGE was done by is still kept; one a state it
            # wrote whole (a copy, a TRUNCATE's batch, an identity change) may be unique
            # on is checked over that state again, as the attempt did.
            key = prior.unique_on if prior is not None and cat.is_multiset else []
            if key and unique_multiset.merged_by(paths[1], s.version, key):
                commit.unique_on = list(key)
            else:
                candidate = _whole_state_key(cat, prior, snap)
                if candidate and _local_unique(lake, state_rel, s.version, candidate):
                    commit.unique_on = candidate
            if snap is not None or commit.spread:  # not a MERGE's delta, maybe not appended
                commit.state_rows = local_table_rows(lake, state_rel, s.version)
            commit.missing_toast = _missing_toast_logged(None, lake, cat, c.version, batch, snap)
            return commit
    steps("txn versions read")
    # process_batch hands a snapshot table its raw rows only for a re-base on the driver.
    # Fast defaults are applied there to a keyed table whose state it merges (a re-based
    # one's only to its final rows: its state becomes the copy).
    driver_defaults = state_merge in ON_DRIVER
    local_done = None
    if local_raw is not None and (not defaults or driver_defaults or snap is not None):
        # None may be a log that could not be read: the writer then reads it again itself.
        held = (
            done[0] if done[0] is not None else UNREAD,
            done[1] if done[1] is not None else UNREAD,
        )
        fault = ddl_input.fault if ddl_input is not None else _no_fault
        # A state Spark MERGEs waits on its jobs, not the GIL: it takes no lane.
        lane = _DRIVER_LANE if state_merge != "spark" else contextlib.nullcontext()
        try:
            with lane:
                # The driver appends exactly when this does (DriverWrites.pick: appends_only).
                assert (state_merge == "append") == appends, cat.name
                local_done = _process_local(
                    lazy,
                    lake,
                    cat,
                    bcat,
                    prior,
                    batch,
                    app_id,
                    local_raw,
                    truncs,
                    held,
                    state_merge,
                    snap,
                    (defaults, fault),
                )
        except Broken as exc:
            # Nothing of the state written: Spark matches the batch's rows whole (the
            # change log's append, if made, is skipped by its txn), then checks the key.
            log.info(
                "batch %d: %s: not MERGEd by %s (%s): its rows are matched whole by Spark",
                batch,
                cat.name,
                ", ".join(prior.unique_on if prior is not None else []),
                exc,
            )
    if local_done is not None:
        c, s, commit.missing_toast, commit.unique_on = local_done
        merged_by = {
            "driver": "",
            "driver-dv": " (state MERGEd with deletion vectors)",
            "dv": " (state MERGEd with deletion vectors)",
            "spark": " (state merged by Spark)",
            "append": " (rows appended to the state)",
        }
        steps("done on the driver" + merged_by[state_merge])
        _finish(commit, c, s, prior)
        if snap is not None:  # the re-based state's rows are not a MERGE's delta
            commit.state_rows = local_table_rows(lake, state_rel, s.version)
        return commit
    # Events of two identities (slotlake.identity_segments): the whole state is rebuilt.
    switched = cat.identity_switches and snap is None
    session = table_session(lazy())
    if cat.versions:
        events = decode_table(raw_dml(session.read.parquet(lake.path(raw_rel))), cat, bcat, batch)
    else:  # a snapshot table without changes in this batch
        events = session.createDataFrame([], change_schema(cat))
    prior_df = read_prior_state(session, lake, cat, prior)
    persisted: list[DataFrame] = []
    truncated = bool(truncs)
    rebased = None
    switched_unique = None  # a rebuilt multiset checked on its key before it was written
    if snap is not None:
        from slotlake.snapshot import rebase

        rebased = rebase(
            session,
            lake,
            cat,
            snap,
            events,
            prior_df,
            truncs,
            expected_rows,
            persisted,
            batch,
            defaults,
            spread_base,
        )
        changes, state_source, truncated = rebased.changes, rebased.state_source, rebased.truncated
    elif switched:
        from slotlake.identity_segments import replay_frames

        whole = read_whole_prior(session, lake, cat, prior, defaults)
        replayed = replay_frames(
            events,
            whole,
            cat,
            truncs,
            defaults,
            expected_rows,
            persisted,
            key=_whole_state_key(cat, prior, snap),
        )
        changes, state_source, switched_unique = replayed
    elif cat.is_multiset:
        changes = events.withColumn("_missing_toast", F.col("_unchanged"))
        state_source = multiset_delta(fastdefault.fill_events(events, defaults), cat, truncs)
    else:
        changes, state_source = fill_keyed(
            events, prior_df, cat, truncs, expected_rows, persisted=persisted
        )
        state_source = fastdefault.fill_finals(state_source, events, cat.key_columns, defaults)
    steps("planned")
    markers = _markers(session, cat, bcat, batch)
    if markers is not None:
        changes = changes.unionByName(markers.select(*changes.columns))
    changes = changes.drop("_seq", "_unchanged")
    # One sorted file for an ordinary batch; a range sort (a sampling pass more) for big ones.
    if expected_rows < SINGLE_FILE_ROWS:
        # repartition, not coalesce: coalesce(1) would pull the replay upstream into one task.
        changes = changes.repartition(1).sortWithinPartitions("_commit_lsn", "_tx_ordinal")
    else:
        changes = changes.orderBy("_commit_lsn", "_tx_ordinal")
    changes_path, state_path = lake.path(changes_rel), lake.path(state_rel)
    try:
        marker = renames_marker(app_id, batch) if swaps(cat.renames) else None
        changes_renames, state_renames = renames_to_make(lake, cat, prior, lambda: session)
        if marker is not None and swaps_on_driver(lake):
            for path, schema, drop, renames in (
                (changes_path, changes.schema, False, changes_renames),
                (state_path, _state_schema(cat), True, state_renames),
            ):
                local = str(local_path(path))
                ensure_local(lambda: session, path, local, schema, renames, drop, marker)
        else:
            ensure_table(session, changes_path, changes.schema, changes_renames, marker=marker)
            ensure_table(
                session,
                state_path,
                _state_schema(cat),
                state_renames,
                drop_missing=True,
                marker=marker,
            )
        target = session.read.format("delta").load(changes_path).schema
        # A copied or rebuilt state is replaced whole (a copy takes the defaults it lacks
        # in rebase, a rebuilt one's prior rows in read_whole_prior): neither needs its
        # stored rows updated first.
        if not switched:
            _count_keyed_rows_once(session, lake, cat, prior, state_path)
        if (
            snap is None
            and not switched
            and fastdefault.update_state(session, state_path, defaults, app_id, batch) is not None
        ):
            assert ddl_input is not None
            ddl_input.fault(fastdefault.FAULT_STEP)
        steps("tables ready")
        if rebased is not None:
            from slotlake.snapshot import write_base

            write_base(session, lake, cat, rebased.base, app_id, batch)
            steps("state re-based on the snapshot")
        logged, observed = _observe_missing_toast(conform(changes, target), cat, snap)
        c = append(logged, changes_path, app_id, batch)
        steps("change log appended")
        counted = _observed_rows(observed)
        if counted is None:  # no job ran: the change log held the batch already
            counted = _missing_toast_logged(session, lake, cat, c.version, batch, snap)
        commit.missing_toast = counted
        # A multiset unique on a key is MERGEd by it (slotlake.unique_multiset).
        by_key = (
            unique_key(cat, prior) if cat.is_multiset and snap is None and not switched else None
        )
        s = None
        if switched:
            data = [quote(c) for c in cat.state_columns]
            meta = [COPIES] if cat.is_multiset else []
            whole_rows = state_source.select(*data, "_fallback", "_missing_toast", *meta)
            s = overwrite(whole_rows, state_path, app_id, batch)
        elif by_key is not None and not truncated:
            try:
                s, kept = _merge_unique(
                    session, lake, cat, state_rel, state_source, by_key, app_id, batch
                )
                commit.unique_on = list(by_key) if kept else []
            except Broken as exc:
                # Spark has logged the task the check failed in as an ERROR already: this
                # line says why, for whoever reads the job's log.
                log.info(
                    "batch %d: %s: not MERGEd by %s (%s): its rows are matched whole (the "
                    "failed Spark task logged above was this check, not a fault)",
                    batch,
                    cat.name,
                    ", ".join(by_key),
                    exc,
                )
        if s is None:
            s = _write_state(
                session,
                lake,
                cat,
                state_rel,
                state_source,
                truncated,
                app_id,
                batch,
                appends=appends,
                spread=spread_base if snap is not None else prior is not None and prior.spread,
            )
        steps("state written")
    finally:
        for df in persisted:
            df.unpersist()
    _finish(commit, c, s, prior)
    # The key a multiset's state may still be unique on (slotlake.unique_multiset): a FULL
    # table's copy is unique on its primary key; a batch matched whole here (a TRUNCATE's,
    # or one that broke the key) leaves the one it had; a state rebuilt across an
    # identity change may be unique on the table's old key. One aggregation over the
    # state, which the copy or this write wrote whole anyway, tells whether later batches
    # can be MERGEd by it.
    key = _whole_state_key(cat, prior, snap) if snap is not None or not commit.unique_on else []
    if switched_unique is not None:  # checked on its rows before they were written
        commit.unique_on = list(key) if switched_unique else []
    elif snap is not None or key:
        from slotlake.snapshot import unique_state_rows

        rows, unique = unique_state_rows(session, lake.path(state_rel), s.version, key)
        if snap is not None:  # the re-based state's rows are not a MERGE's delta
            commit.state_rows = rows
        commit.unique_on = list(key) if unique else []
        if key and not unique and snap is None and not switched:
            log.warning(
                "batch %d: %s: no longer unique on %s: its rows are matched whole from now on",
                batch,
                cat.name,
                ", ".join(key),
            )
    return commit


def _observe_missing_toast(
    rows: DataFrame, cat: TableCatalog, snap: TableSnapshot | None
) -> tuple[DataFrame, Any]:
    """``rows`` (change rows Spark is about to append) counting
    :attr:`TableCommit.missing_toast` in the write's own job (an observed metric), and
    the observation (None: a multiset, which counts nothing)."""
    if cat.is_multiset:
        return rows, None
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observed = Observation()
    counted = F.sum(_missing_toast_row(snap).cast("long")).alias("rows")
    return rows.observe(observed, counted), observed


def _missing_toast_row(snap: TableSnapshot | None) -> Column:
    """A change row that counts for :attr:`TableCommit.missing_toast`: its
    ``_missing_toast`` names a column (a copied table's from the copy's consistent point
    on, the rows before it filled from the state before the copy)."""
    from pyspark.sql import functions as F

    missing = F.size("_missing_toast") > 0
    if snap is not None:
        missing = missing & (F.col("_commit_lsn") >= snap.cp_signed)
    return missing


def _observed_rows(observed: Any) -> int | None:
    """What an observed append counted; None when it ran no job (Delta skipped a write
    whose batch the table held: its metric never comes, and waiting for it would hang) or
    the session cannot tell. The metric is set before the write returns."""
    if observed is None:
        return None
    try:
        if not observed._jo.future().isCompleted():
            return None
        return int(observed.get["rows"] or 0)
    except Exception:  # another Spark's Observation: the log is read instead
        log.debug("the observed count of missing TOAST values is unreadable", exc_info=True)
        return None


def _missing_toast_logged(
    session: SparkSession | None,
    lake: Lake,
    cat: TableCatalog,
    version: int | None,
    batch: int,
    snap: TableSnapshot | None,
) -> int:
    """:attr:`TableCommit.missing_toast` of a batch whose change log an earlier attempt
    wrote: counted in the rows of ``batch`` in the log as of ``version``, by Spark
    (``session``) or deltalake (None: a lake on local disk). Only a rerun reads it; the
    statistics on ``_batch`` skip the other files while the table has few enough columns
    for Delta to keep them (32 with the log's own)."""
    if cat.is_multiset or version is None:
        return 0
    rel = Lake.table_path(CHANGES, cat.name)
    if session is None:  # _missing_toast_row in deltalake's SQL
        since = "" if snap is None else f" AND _commit_lsn >= {snap.cp_signed}"
        sql = f"SELECT count(*) FROM t WHERE _batch = {batch}{since} AND "
        found = read_delta(lake.uri, rel, version, sql + "cardinality(_missing_toast) > 0")
        return int(found.column(0)[0].as_py())
    from pyspark.sql import functions as F

    log_rows = session.read.format("delta").option("versionAsOf", version).load(lake.path(rel))
    return log_rows.where((F.col("_batch") == batch) & _missing_toast_row(snap)).count()


def _count_keyed_rows_once(
    session: SparkSession, lake: Lake, cat: TableCatalog, prior: TableCommit | None, path: str
) -> None:
    """A multiset whose prior state was stored keyed (its identity became FULL, or its key
    was dropped): the ``_copies`` column just added is NULL, and each of those rows is one
    copy. Judged by the prior version, which a rerun reads too; the UPDATE touches only
    NULLs, so a rerun after it committed changes nothing."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not cat.is_multiset or prior is None or not prior.state or prior.state_version is None:
        return
    if prior.multiset:  # stored with _copies already: no schema to read
        return
    before = (
        session.read.format("delta")
        .option("versionAsOf", prior.state_version)
        .load(lake.path(prior.state))
    )
    if COPIES in before.columns:
        return
    log.info("%s: the keyed state's rows counted once each (the table is now a multiset)", path)
    DeltaTable.forPath(session, path).update(F.col(COPIES).isNull(), {COPIES: F.lit(1)})


def _no_fault(step: str) -> None:
    pass


def _finish(
    commit: TableCommit, c: WriteResult, s: WriteResult, prior: TableCommit | None
) -> TableCommit:
    commit.changes_version, commit.state_version = c.version, s.version
    commit.change_rows = int(c.metrics.get("numOutputRows", 0))
    commit.state_rows = _state_rows(prior, s, appended=commit.spread)
    return commit


def _change_log_schema(cat: TableCatalog) -> StructType:
    from pyspark.sql.types import StructType

    work = {n for n, _ in WORK_COLUMNS}
    return StructType([f for f in change_schema(cat).fields if f.name not in work])


def _process_local(
    spark: LazySession,
    lake: Lake,
    cat: TableCatalog,
    bcat: BatchCatalog,
    prior: TableCommit | None,
    batch: int,
    app_id: str,
    raw: RawRows,
    truncs: list[tuple[int, int]],
    held: tuple[int | None, int | None],
    state_merge: StateMerge = "driver",
    snap: TableSnapshot | None = None,
    defaults: tuple[list[Any], Callable[[str], None]] = ([], _no_fault),
) -> tuple[WriteResult, WriteResult, int, list[str]]:
    """A table's batch with few changes on the driver (see :mod:`slotlake.local_table`),
    its :attr:`TableCommit.missing_toast` and :attr:`TableCommit.unique_on`;
    with ``state_merge="spark"`` a keyed table's MERGE runs in Spark from the driver's
    final rows. A multiset's state (small, or it would not be here) is rebuilt whole;
    with ``state_merge="append"`` (:func:`appends_only`) the batch's rows are appended.
    ``defaults``: the table's fast defaults (:mod:`slotlake.fastdefault`) and the fault
    hook to call once a keyed table's UPDATE of its state committed (a multiset's prior
    rows take them in the one overwrite that rebuilds its state). A multiset whose state
    is unique on a key (:mod:`slotlake.unique_multiset`) is MERGEd by that key; when the
    batch cannot be, a small state is rebuilt whole, a big one raises :class:`Broken`
    (nothing of its state written)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert snap is None or (state_merge in SPARKLESS and rebased_on_driver(cat)), cat.name
    # An append leaves the prior rows without the fast defaults; a copy's rows take them.
    assert state_merge != "append" or (cat.is_multiset and not (defaults[0] and snap is None))

    from slotlake import local_table
    from slotlake.replay_duckdb import fill_keyed_local

    changes_rel = Lake.table_path(CHANGES, cat.name)
    state_rel = Lake.table_path(STATE, cat.name)
    changes_path = str(local_path(lake.path(changes_rel)))
    state_path = str(local_path(lake.path(state_rel)))
    # Taken, not shared: the raw rows are freed once decoded (a third of the peak memory).
    events, change_arrow = local_table.decode_local(raw.take(), cat, bcat, batch)
    appends = state_merge == "append"
    state_struct = _state_schema(cat)
    state_arrow = arrow_schema_for(state_struct)
    version = prior.state_version if prior is not None and prior.state else None
    fast, fault = defaults
    # A copy's rows (with the fast defaults of columns added after it) stand for the prior
    # state of the changes from its consistent point on.
    copy = None
    if snap is not None:
        staging = str(local_path(lake.path(snap.staging)))
        copy = local_table.read_copy(staging, cat, state_arrow, fast)
    # Events of two identities (slotlake.identity_segments): the whole state is rebuilt.
    switched = cat.identity_switches and snap is None
    unique: list[str] | None = None
    keyed: unique_multiset.KeyedRows | None = None
    if switched:
        from slotlake.identity_segments import replay

        keyed_arrow = arrow_schema_for(_state_schema(cat, counted=False))
        counted_arrow = arrow_schema_for(_state_schema(cat, counted=True))
        whole = None
        if version is not None:
            whole = _whole_prior(lake, state_rel, version, cat, counted_arrow, fast)
        changes, finals = replay(events, whole, cat, truncs, keyed_arrow, counted_arrow, fast)
        # A table made FULL may be unique on its old key: later batches MERGE by it.
        unique = unique_multiset.switched_key(cat)
        if unique is not None and not unique_multiset.holds(finals, unique):
            unique = None
    elif cat.is_multiset:
        from slotlake.multiset_arrow import multiset_state

        at = events.schema.get_field_index("_missing_toast")
        changes = events.set_column(at, "_missing_toast", events.column("_unchanged"))
        # A state re-based on a copy is rebuilt whole from it, whatever the prior one was.
        unique = unique_key(cat, prior) if snap is None else None
        big = state_merge in ("driver-dv", "dv")  # picked for its key (DriverWrites.take)
        if unique is not None and not truncs:
            try:
                keyed = unique_multiset.keyed_rows(events, unique, state_arrow)
                finals = keyed.rows
            except Broken:
                if big:
                    raise
                unique = None  # a small state: rebuilt whole here instead
        if keyed is None:
            if big and not truncs:
                raise Broken("its key's columns changed")
            whole = None
            images = events
            if snap is not None:
                # Every change is logged; the state becomes the copy's rows (one copy each)
                # with the images from its consistent point on counted onto them, as
                # Spark's re-base does.
                images = events.filter(
                    pc.greater_equal(events.column("_commit_lsn"), snap.cp_signed)
                )
                truncs = [t for t in truncs if t[0] >= snap.cp_signed]
                # A FULL table's copy is unique on its primary key: checked below.
                unique = _whole_state_key(cat, prior, snap) or None
            elif version is not None and not truncs and not appends:
                whole = _whole_prior(lake, state_rel, version, cat, state_arrow, fast)
            images = fastdefault.fill_events_arrow(images, fast)
            if snap is not None and not appends:
                # Grouped once: the base written below and the prior the images count onto.
                copy = whole = multiset_state(images.slice(0, 0), copy, cat, [], state_arrow)
            # An INSERT-only table's copy is its base a row a copy (TableCommit.spread), and
            # the rows from the consistent point on are appended to it.
            finals = multiset_state(images, whole, cat, truncs, state_arrow)
            # The whole new state at hand: whether it is still unique costs a grouping.
            if unique is not None and not unique_multiset.holds(finals, unique):
                unique = None
    elif snap is not None:
        # The changes before the copy's consistent point are logged, filled from the
        # previous state; those from it on are filled from the copy and make the finals.
        assert copy is not None
        cp = snap.cp_signed
        lsn = events.column("_commit_lsn")
        read_prior = local_table.prior_reader(state_path, version, cat, state_arrow)
        logged, _ = fill_keyed_local(
            events.filter(pc.less(lsn, cp)), read_prior, cat, [t for t in truncs if t[0] < cp]
        )
        truncs = [t for t in truncs if t[0] >= cp]
        changes, finals = fill_keyed_local(
            events.filter(pc.greater_equal(lsn, cp)),
            local_table.rows_reader(copy, cat),
            cat,
            truncs,
        )
        changes = pa.concat_tables(
            [logged.select(changes.column_names).cast(changes.schema), changes]
        )
    else:
        read_prior = local_table.prior_reader(state_path, version, cat, state_arrow)
        changes, finals = fill_keyed_local(events, read_prior, cat, truncs)
    markers = marker_rows(cat, bcat, batch)
    if snap is not None:
        from slotlake.snapshot import marker_row

        markers.append(marker_row(snap, batch))
    if markers:
        marks = pa.Table.from_pylist(markers, schema=change_arrow)
        changes = pa.concat_tables(
            [changes, marks.select(changes.column_names).cast(changes.schema)]
        )
    changes = changes.drop_columns([n for n, _ in WORK_COLUMNS if n in changes.column_names])
    changes = local_table.in_commit_order(changes)
    missing = 0
    if not cat.is_multiset:  # a multiset's change rows list what its images left out
        missing = local_table.missing_toast_rows(changes, None if snap is None else snap.cp_signed)
    # A new table is created by the driver, DDL at the source evolved by it (Spark only
    # for a changed type: slotlake.delta.ensure_local).
    changes_renames, state_renames = renames_to_make(lake, cat, prior)
    schemas = [
        ensure_local(
            lambda: table_session(spark()),
            lake.path(rel),
            str(local_path(lake.path(rel))),
            schema,
            renames,
            drop,
            renames_marker(app_id, batch),
        )
        for rel, schema, drop, renames in (
            (changes_rel, _change_log_schema(cat), False, changes_renames),
            (state_rel, state_struct, True, state_renames),
        )
    ]

    if snap is not None:
        # The state becomes the copy: one overwrite under the snapshot's txnAppId (a rerun
        # skips it), then the usual change log and MERGE under the lake's.
        from slotlake.snapshot import _fault, snapshot_app_id

        assert copy is not None
        base = local_table.conform_arrow(copy, arrow_schema_for(schemas[1]))
        arrow_overwrite(state_path, base, snapshot_app_id(app_id), batch)
        del copy, base
        _fault("snapshot_rebased")

    if fast and (not cat.is_multiset or keyed is not None) and not switched:
        assert state_merge in ON_DRIVER, cat.name
        if snap is None:  # a re-based state is the copy: no older row to update
            state_now = arrow_schema_for(schemas[1])
            if fastdefault.update_state_local(state_path, state_now, fast, app_id, batch):
                fault(fastdefault.FAULT_STEP)
        finals = fastdefault.fill_finals_arrow(finals, fast)

    # A multiset kept unique on a key is written as a table keyed by it.
    writes_as = cat if keyed is None else unique_multiset.keyed_view(cat, unique or [])

    def merge_unique(rows: pa.Table) -> WriteResult:
        from slotlake.dv_merge import merge_keyed

        assert keyed is not None
        # A small state's touched files are rewritten, as a keyed one's.
        vectors = state_merge != "driver"
        done = merge_keyed(
            state_path, rows, writes_as, app_id, batch, deletion_vectors=vectors, fresh=keyed.fresh
        )
        if done is None:
            raise Broken("its state's MERGE is left to another writer")
        return done

    def merge_state(rows: pa.Table) -> WriteResult:
        if state_merge != "spark":
            from slotlake.dv_merge import merge_keyed

            # A small state's touched files are rewritten (it stays compact); a bigger
            # one's get deletion vectors.
            vectors = state_merge != "driver"
            done = merge_keyed(state_path, rows, cat, app_id, batch, deletion_vectors=vectors)
            if done is not None:
                return done
        if state_merge in ("driver", "driver-dv"):  # a state deltalake may rewrite
            return arrow_merge_keyed(
                state_path, rows, arrow_merge_predicate(cat), ["_key", "_deleted"], app_id, batch
            )
        session = table_session(spark())
        source = session.createDataFrame(rows)
        return _write_state(session, lake, cat, state_rel, source, False, app_id, batch)

    c, s = local_table.write_local(
        writes_as,
        changes,
        finals,
        bool(truncs),
        changes_path,
        state_path,
        app_id,
        batch,
        held,
        (schemas[0], schemas[1]),
        merge_state if keyed is None else merge_unique,
        concurrent=state_merge != "driver",
        whole=switched,
        append=appends and not truncs,
    )
    return c, s, missing, unique or []


def _whole_state_key(
    cat: TableCatalog, prior: TableCommit | None, snap: TableSnapshot | None
) -> list[str]:
    """The key a multiset's state that this batch may have written whole (not MERGEd by a
    key) may be unique on, to be checked over that state: a copy's primary key (none
    across an identity change), the table's last key after an identity change inside the
    batch, else the key the prior state was unique on (:mod:`slotlake.unique_multiset`)."""
    if not cat.is_multiset:
        return []
    if snap is not None:
        return [] if cat.identity_switches else list(snap.unique_on)
    if cat.identity_switches:
        return unique_multiset.switched_key(cat) or []
    return unique_key(cat, prior) or []


def _local_unique(lake: Lake, rel: str, version: int, key: Sequence[str]) -> bool:
    """Whether a multiset state of a lake on local disk holds each value of ``key`` once
    as of ``version`` (no Spark: its key columns and ``_copies`` read)."""
    names = ", ".join('"' + k.replace('"', '""') + '"' for k in key)
    rows = read_delta(lake.uri, rel, version, f"SELECT {names}, {COPIES} FROM t")
    return unique_multiset.holds(rows, key)


def local_table_rows(lake: Lake, rel: str, version: int) -> int:
    """Rows of a Delta table of a lake on local disk as of ``version`` (no Spark)."""
    return int(read_delta(lake.uri, rel, version, "SELECT count(*) FROM t").column(0)[0].as_py())


TRANSACTIONS_DDL = (
    "commit_lsn bigint, end_lsn bigint, commit_ts timestamp, xid bigint, origin string, "
    "streamed boolean, _batch bigint"
)


def _transactions_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("commit_lsn", pa.int64()),
            ("end_lsn", pa.int64()),
            ("commit_ts", pa.timestamp("us", tz="UTC")),
            ("xid", pa.int64()),
            ("origin", pa.string()),
            ("streamed", pa.bool_()),
            ("_batch", pa.int64()),
        ]
    )


def transaction_rows(
    origins: dict[int, str], batch: int, empty_streams: Set[int] = frozenset()
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``transactions`` rows of raw Commit / Stream Commit rows (``data``, ``xid``):
    run by ``mapInArrow`` on the executors, or on the driver for a small batch. A stream
    in ``empty_streams`` (it delivered nothing) gets no row, like an empty non-streamed
    transaction, which the server leaves out."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from slotlake.lsn import Lsn
        from slotlake.pgoutput import Commit, StreamCommit, decode, pg_timestamp_to_datetime

        schema = _transactions_arrow_schema()
        for rb in batches:
            out: dict[str, list[Any]] = {name: [] for name in schema.names}
            for data, xid in zip(
                rb.column("data").to_pylist(), rb.column("xid").to_pylist(), strict=True
            ):
                msg = decode(data)
                if isinstance(msg, StreamCommit):
                    xid = msg.xid
                    if xid in empty_streams:
                        continue
                elif not isinstance(msg, Commit):
                    continue
                commit_lsn = Lsn(msg.commit_lsn).to_signed()
                out["commit_lsn"].append(commit_lsn)
                out["end_lsn"].append(Lsn(msg.end_lsn).to_signed())
                out["commit_ts"].append(pg_timestamp_to_datetime(msg.commit_ts))
                out["xid"].append(xid)
                out["origin"].append(origins.get(commit_lsn))
                out["streamed"].append(isinstance(msg, StreamCommit))
                out["_batch"].append(batch)
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    return fn


def _transactions(raw: DataFrame, bcat: BatchCatalog, batch: int) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        raw.filter(F.col("msg_type").isin(*COMMIT_TYPES))
        .select("data", "xid")
        .mapInArrow(transaction_rows(bcat.origins, batch, bcat.streams.empty), TRANSACTIONS_DDL)
    )


def _transactions_local(raw_dir: str, bcat: BatchCatalog, batch: int) -> pa.Table:
    """The batch's ``transactions`` rows decoded on the driver from its local raw."""
    import pyarrow as pa

    from slotlake.raw import raw_rows_of_types

    rows = raw_rows_of_types(raw_dir, COMMIT_TYPES, ["data", "xid"])
    fn = transaction_rows(bcat.origins, batch, bcat.streams.empty)
    out = pa.Table.from_batches(list(fn(iter(rows.to_batches()))), _transactions_arrow_schema())
    return out.sort_by("commit_lsn")


MESSAGES_DDL = (
    "lsn bigint, transactional boolean, prefix string, content binary, "
    "commit_lsn bigint, tx_ordinal bigint, xid bigint, _batch bigint"
)
# The raw columns the messages dataset is built from.
MESSAGE_COLUMNS = ["data", "stream_xid", "commit_lsn", "tx_ordinal", "xid"]


def message_rows(
    streams: StreamOutcome, batch: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``messages`` rows of raw 'M' rows (:data:`MESSAGE_COLUMNS`): run by
    ``mapInArrow`` on the executors, or on the driver for a batch of a local lake."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from slotlake.lsn import Lsn
        from slotlake.pgoutput import decode

        schema = arrow_schema_for(parse_struct(MESSAGES_DDL))
        for rb in batches:
            out: dict[str, list[Any]] = {k: [] for k in schema.names}
            for row in rb.to_pylist():
                in_stream = row["stream_xid"] is not None
                msg = decode(row["data"], in_stream=in_stream)
                commit_lsn = row["commit_lsn"]
                if in_stream and msg.transactional:
                    # Unlike DML, pgoutput stamps a streamed message with the top-level xid
                    # even inside a subtransaction, so a message emitted in a savepoint that
                    # is rolled back after it was streamed cannot be told apart and is kept
                    # (a protocol limit; PostgreSQL's own subscriber ignores messages).
                    outcome = streams.commits.get(row["stream_xid"])
                    if outcome is None or (row["stream_xid"], msg.xid) in streams.aborted_subxacts:
                        continue
                    commit_lsn = Lsn(outcome[0]).to_signed()
                out["lsn"].append(Lsn(msg.lsn).to_signed())
                out["transactional"].append(msg.transactional)
                out["prefix"].append(msg.prefix)
                out["content"].append(msg.content)
                out["commit_lsn"].append(commit_lsn if msg.transactional else None)
                out["tx_ordinal"].append(row["tx_ordinal"] if msg.transactional else None)
                out["xid"].append(row["stream_xid"] if in_stream else row["xid"])
                out["_batch"].append(batch)
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    return fn


def _messages(raw: DataFrame, bcat: BatchCatalog, batch: int) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        raw.filter(F.col("msg_type") == "M")
        .select(*MESSAGE_COLUMNS)
        .mapInArrow(message_rows(bcat.streams, batch), MESSAGES_DDL)
    )


def _messages_local(raw_dir: str, bcat: BatchCatalog, batch: int) -> pa.Table:
    """The batch's ``messages`` rows decoded on the driver from its local raw, by LSN."""
    import pyarrow as pa

    from slotlake.raw import raw_rows_of_types

    rows = raw_rows_of_types(raw_dir, ("M",), MESSAGE_COLUMNS)
    fn = message_rows(bcat.streams, batch)
    schema = arrow_schema_for(parse_struct(MESSAGES_DDL))
    return pa.Table.from_batches(list(fn(iter(rows.to_batches()))), schema).sort_by("lsn")


def _raw_on_disk(lake: Lake, raw_rel: str, raw_local: str | None) -> str | None:
    """The raw batch's directory on the driver's disk: the pull's local copy, or the lake's
    own on a local lake (None: it is on a Hadoop file system only)."""
    if raw_local is not None:
        return raw_local
    return str(local_path(lake.path(raw_rel))) if lake.on_local_disk else None


def _scan(lake: Lake, raw_rel: str, raw_local: str | None) -> RawScan:
    """Scan the raw batch on the driver: its local copy, or a download of it."""
    if not lake.exists(raw_rel):
        raise RawDataError(f"raw directory {lake.path(raw_rel)} is missing")
    raw_dir = _raw_on_disk(lake, raw_rel, raw_local)
    if raw_dir is not None:
        return scan_raw(raw_dir)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slotlake-raw-") as tmp:
        local = str(Path(tmp) / "raw")
        lake.fs.download_dir(lake.path(raw_rel), local)
        return scan_raw(local)


# The decoder's RawDataError raised on an executor reaches the driver as Spark's exception,
# whose text is the worker's Python traceback plus the JVM stack: hundreds of lines.
_EXECUTOR_RAW_ERROR = re.compile(r"slotlake\.decode\.RawDataError: ([^\n]+)")


def _raw_errors_in_one_line(fn: Callable[..., BatchOutput]) -> Callable[..., BatchOutput]:
    """A payload that does not decode, on the driver or an executor, raises RawDataError
    with one line naming batch, table, seq, LSN, the decoder's offset and the raw directory.
    """

    @functools.wraps(fn)
    def wrapper(
        spark: SparkSession | LazySession, lake: Lake, raw_rel: str, *args: Any, **kwargs: Any
    ) -> BatchOutput:
        lazy = LazySession.of(spark)
        try:
            with reusing_local_tables():
                return fn(lazy, lake, raw_rel, *args, **kwargs)
        except Exception as exc:
            # A failed batch must not leave its cached raw DML behind in a long-lived
            # session: a retry reading the same path would be served the stale cache.
            with contextlib.suppress(Exception):  # never hide the batch's error behind this
                if lazy.started is not None:
                    lazy.started.catalog.clearCache()
            if isinstance(exc, RawDataError):
                raise RawDataError(f"{exc} (raw {raw_rel})") from exc
            m = _EXECUTOR_RAW_ERROR.search(str(exc))
            if m is None:
                raise
            raise RawDataError(f"{m.group(1).strip()} (raw {raw_rel})") from exc

    return wrapper


# Tables written at once: each is a chain of small Spark jobs whose driver-side gaps
# (planning, Delta log reads, commits) the others fill. More than a few only queue.
TABLE_WORKERS = 4
# Of those, tables done on the driver at once: their work is Python and Arrow calls
# holding the GIL between short waits (fsync, file reads), so two overlap those waits and
# more only contend (100 small tables: 1.12-1.27 s with two, 1.44-1.69 s with four).
_DRIVER_LANE = threading.BoundedSemaphore(2)


# A worker's answer for a table: (name, commit, seconds), the checkpoints it left to the
# parent, the snapshots its commits made (slotlake.delta.handing_back) and the schemas it
# derived (slotlake.schema_memo).
_WorkerDone = tuple[
    tuple[str, "TableCommit", float], list[tuple[str, int]], list[Kept], schema_memo.Learned
]


def _spark_in_worker() -> SparkSession:
    raise NeedsParent("a Spark session (only the parent process has one)")


def _from_worker(
    fut: Future[tuple[bool, Any, durability.HandedBack]],
) -> tuple[_WorkerDone | None, str]:
    """A forked worker's answer for its table, or None and why it did not finish. What it
    wrote goes to the batch's sync either way; the files of a worker that died cannot be
    listed, so the file system is synced whole (slotlake.durability)."""
    exc = fut.exception()
    if exc is not None:  # the worker died (BrokenProcessPool) or the pool shut down
        durability.unlisted()
        return None, f"{type(exc).__name__}: {exc}"
    ok, value, handed = fut.result()
    durability.adopt(handed)
    return (value, "") if ok else (None, str(value))


def _target_names(target: dict[str, TableColumns] | None) -> dict[int, str] | None:
    """Each published relation oid's table name at the batch's target (None: a batch
    pulled before the catalog file was kept, or held the relations)."""
    names = {t.relation.relation.oid: n for n, t in (target or {}).items() if t.relation}
    return names or None


@_raw_errors_in_one_line
def process_batch(
    spark: LazySession,
    lake: Lake,
    raw_rel: str,
    batch: int,
    app_id: str,
    prior: CommitRecord | None,
    progress: Callable[[str], None] = log.info,
    fault: Callable[[str], None] = lambda step: None,
    raw_local: str | None = None,
    workers: int = TABLE_WORKERS,
    driver: DriverWrites = DriverWrites(),
    snapshots: dict[str, TableSnapshot] | None = None,
) -> BatchOutput:
    """Decode one raw batch and write it into the lake's Delta tables (not yet committed).

    Each table's writes carry ``(app_id, batch)`` as Delta's idempotent-transaction marker,
    so calling this again for the same batch (a rerun) writes no table twice.
    ``snapshots``: tables copied for this batch (see slotlake.snapshot), re-based on their
    copies whether or not the batch has changes of theirs.
    """
    import queue
    from concurrent.futures import ThreadPoolExecutor

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    scan = _scan(lake, raw_rel, raw_local)
    target_catalog = read_catalog_file(lake, raw_rel)
    schemas = prior_schemas(prior)
    fresh = new_copies(prior, snapshots)
    schemas.update({n: [(c[0], c[1]) for c in snap.columns] for n, snap in fresh.items()})
    counts, types_seen = scan.dml_counts, scan.types_seen
    has_messages = "M" in types_seen
    raw_dir = _raw_on_disk(lake, raw_rel, raw_local)
    # A local lake's messages (the DDL capture trigger's, a user's heartbeats) are read and
    # written on the driver when they are few, like its transactions: no Spark for them.
    on_driver = lake.on_local_disk and raw_dir is not None
    local_messages = has_messages and on_driver and driver.holds(scan.messages)
    # Before the catalog: the trigger's attnums tell a rename from a DROP and an ADD.
    ddl_input = BatchDdl.read(
        spark() if has_messages and not local_messages else None,
        lake,
        raw_rel,
        {r.stream_xid for r in scan.catalog_rows if r.msg_type == "c"},
        fault,
        raw_dir if local_messages else None,
        catalog=target_catalog,
    )
    bcat = collect_catalog(
        scan.catalog_rows,
        batch,
        schemas,
        stream_content=scan.stream_content,
        column_ids=column_ids(prior, target_catalog, ddl_input.messages, fresh),
        at_target=lambda relations: versions_at_target(
            relations, prior, schemas, target_catalog, fresh
        ),
        log_columns=functools.partial(change_log_columns, lake, spark, prior),
    )
    timings["catalog"] = time.monotonic() - t0
    prior_tables = dict(prior.tables) if prior else {}
    tables: dict[str, TableCommit] = {}
    busy = [
        c
        for c in bcat.tables.values()
        if any(counts.get(o) for o in c.oids)
        or any(c.name in t.tables for t in bcat.truncates)
        or c.name in (snapshots or {})
        or c.versions[-1].seq == TARGET_SEQ
    ]
    if snapshots:
        from slotlake.snapshot import catalog_for

        busy += [
            catalog_for(s, prior_tables.get(n))
            for n, s in sorted(snapshots.items())
            if n not in bcat.tables
        ]
    busy = without_collisions(busy, _target_names(target_catalog), snapshots or {}, batch)
    expected = {c.name: sum(counts.get(o, 0) for o in c.oids) for c in busy}
    # A table re-based on a snapshot is done on the driver when its copy would be (the
    # copy's size standing for its state's), but for the multisets rebased_on_driver
    # leaves to Spark.
    snaps = snapshots or {}
    copies = {
        c.name: _dir_bytes(local_path(lake.path(snaps[c.name].staging)))
        for c in busy
        if lake.on_local_disk
        and c.name in snaps
        and rebased_on_driver(c, bool(c.oids & scan.removing))
    }
    candidates = [c for c in busy if c.name not in snaps or c.name in copies]
    cats = {c.name: c for c in busy}
    t_pick = time.monotonic()
    # A table without an identity whose batch updates or deletes after all (appends_only)
    # has its rows matched: the driver rebuilds its state only if it is small. An
    # INSERT-only table's copy is appended to, whatever its prior state was (process_table),
    # if the copy is small enough to read whole.
    appending = {
        c.name
        for c in candidates
        if appends_only(c, prior_tables.get(c.name), bool(c.oids & scan.removing), c.name in snaps)
        and (c.name not in snaps or copies[c.name] <= driver.max_state_bytes)
    }
    unique = {
        c.name
        for c in candidates
        if c.name not in snaps and unique_key(c, prior_tables.get(c.name)) is not None
    }
    local = driver.pick(lake, candidates, expected, copies, appending, unique)
    timings["pick"] = time.monotonic() - t_pick
    for name in [n for n, who in local.items() if n in snaps and who not in SPARKLESS]:
        del local[name]
    local_raw: dict[str, RawRows] = {}
    if local:
        from slotlake.local_table import RawRows, read_raw_dml

        assert raw_dir is not None  # the driver takes tables of a lake on local disk only
        t_raw = time.monotonic()
        read = read_raw_dml(
            raw_dir,
            {n: cats[n].oids for n in local},
            driver.max_bytes,
            {n: cats[n].shared for n in local},
        )
        local_raw = {name: RawRows(rows) for name, rows in read.items()}
        del read
        timings["local_raw"] = time.monotonic() - t_raw
        for name in [n for n in local if n not in local_raw]:
            log.info(
                "batch %d: %s: its changes' payloads pass lake.driver_write_mb (%d MiB): "
                "done by Spark",
                batch,
                name,
                driver.max_bytes >> 20,
            )
            del local[name]
    fault("decode")

    def core(cat: TableCatalog, session: LazySession = spark) -> tuple[str, TableCommit, float]:
        t1 = time.monotonic()
        out = process_table(
            session,
            lake,
            raw_rel,
            cat,
            bcat,
            prior_tables.get(cat.name),
            batch,
            app_id,
            expected[cat.name],
            ddl_input,
            (snapshots or {}).get(cat.name),
            local_raw.pop(cat.name, None),
            local.get(cat.name, "driver"),
            bool(cat.oids & scan.removing),
        )
        return cat.name, out, time.monotonic() - t1

    def one(cat: TableCatalog) -> tuple[str, TableCommit, float]:
        done = core(cat)
        fault("table_written")
        return done

    # Biggest first, so the long chains start while small tables fill the gaps.
    order = sorted(busy, key=lambda c: (-expected[c.name], c.name))
    # Tables wholly on the driver go to forked workers when there are enough of them
    # (slotlake.table_processes). Not in a batch with DDL: a fast default's fault hook
    # and the catalog's Spark side stay with the parent.
    forkable = [
        c
        for c in order
        if c.name in local_raw and local[c.name] in SPARKLESS and c.name not in snaps
    ]
    n_procs = 0 if ddl_input.messages else processes_for(driver.processes, len(forkable))

    def in_worker(name: str) -> _WorkerDone:
        """In a forked worker: the table's result, the checkpoints it could not write,
        which the parent does, and the snapshots its commits made and the schemas it
        derived, which the parent keeps for the next batch."""
        with handing_back() as made, schema_memo.learning() as learned:
            done = core(cats[name], LazySession(_spark_in_worker))
        return done, table_processes.checkpoints_due(), made, learned

    transactions_on_driver = on_driver and driver.holds(scan.commits)

    def write_side() -> tuple[WriteResult, str | None, int | None, str | None, int | None]:
        """The batch's transactions and messages (and DDL) appended to their tables."""
        t2 = time.monotonic()
        tx_path = lake.path(TRANSACTIONS)
        if transactions_on_driver:
            assert raw_dir is not None
            # A lake's first batch creates the table here too: through Spark that first
            # append was a cold job over the whole raw batch (measured 10.8 s at 1M changes).
            rows = _transactions_local(raw_dir, bcat, batch)
            tx = arrow_append_creating(
                str(local_path(tx_path)), parse_struct(TRANSACTIONS_DDL), rows, app_id, batch
            )
        else:
            tx = append(
                _transactions(spark().read.parquet(lake.path(raw_rel)), bcat, batch)
                .repartition(1)
                .sortWithinPartitions("commit_lsn"),
                tx_path,
                app_id,
                batch,
            )
        msg_rel, msg_version = (prior.messages, prior.messages_version) if prior else (None, None)
        ddl_rel, ddl_version = (prior.ddl, prior.ddl_version) if prior else (None, None)
        if local_messages:
            assert raw_dir is not None
            msg_rows = _messages_local(raw_dir, bcat, batch)
            msg_rel = MESSAGES
            msg_version = arrow_append_creating(
                str(local_path(lake.path(MESSAGES))),
                parse_struct(MESSAGES_DDL),
                msg_rows,
                app_id,
                batch,
            ).version
            if ddl_input.messages:
                ddl_rel, ddl_version = write_ddl_local(msg_rows, lake, app_id, batch)
        elif has_messages:
            raw = spark().read.parquet(lake.path(raw_rel))
            msg_rel = MESSAGES
            msg_version = append(
                _messages(raw, bcat, batch).repartition(1).sortWithinPartitions("lsn"),
                lake.path(MESSAGES),
                app_id,
                batch,
            ).version
            if ddl_input.messages:
                ddl_rel, ddl_version = write_ddl(_messages(raw, bcat, batch), lake, app_id, batch)
        timings["transactions"] = time.monotonic() - t2
        return tx, msg_rel, msg_version, ddl_rel, ddl_version

    # Through Spark the batch's transactions (and messages) are appended beside its tables,
    # not after them: tables of their own that no table's write reads (the commit record,
    # written last, lists every version). Measured: ~1 s of a one-table batch's ~5 s
    # through Spark, their snapshot's job and the append overlapping the table's jobs.
    side_by_spark = not transactions_on_driver
    side: Future[Any] | None = None
    t_tables = time.monotonic()
    with contextlib.ExitStack() as stack:
        lane = TableProcesses.open(n_procs, in_worker) if n_procs else None
        if lane is not None:
            stack.callback(lane.close)
            timings["table_processes"] = lane.processes
        pool = stack.enter_context(
            ThreadPoolExecutor(
                max_workers=max(1, min(workers, len(order) or 1)) + int(side_by_spark)
            )
        )
        # Each future reports itself on one queue when done: a wait(FIRST_COMPLETED) per
        # answer installed and removed a waiter on every future still out, quadratic in
        # the tables (100 tables: ~10,000 lock operations a batch, on the cores the
        # workers use).
        done: queue.SimpleQueue[Future[Any]] = queue.SimpleQueue()

        def watched(fut: Future[Any]) -> Future[Any]:
            fut.add_done_callback(done.put)
            return fut

        # The workers fork on the first submit, before any of this batch's threads run.
        forked = {lane.submit(c.name): c for c in forkable} if lane is not None else {}
        if side_by_spark:
            side = pool.submit(write_side)
        in_lane = {c.name for c in forked.values()}
        threaded = {pool.submit(one, c): c for c in order if c.name not in in_lane}
        for fut in [*forked, *threaded]:
            watched(fut)
        out_in_lane, out_threaded = len(forked), len(threaded)
        due: list[tuple[str, int]] = []
        try:
            while out_in_lane or out_threaded:
                # Only a wait on the lane has a timeout.
                timeout = lane.patience() if lane is not None and out_in_lane else None
                try:
                    fut = done.get(timeout=timeout)
                except queue.Empty:
                    assert lane is not None
                    # Killed when stalled: their tables come back failed, redone below.
                    lane.stalled()
                    continue
                if fut in forked:
                    assert lane is not None
                    out_in_lane -= 1
                    lane.answered()
                    cat = forked[fut]
                    answer, why = _from_worker(fut)
                    if answer is None:
                        log.info(
                            "batch %d: %s: done again by the driver's threads (its "
                            "worker process: %s)",
                            batch,
                            cat.name,
                            why,
                        )
                        threaded[watched(pool.submit(one, cat))] = cat
                        out_threaded += 1
                        continue
                    (name, out, seconds), checkpoints, made, learned = answer
                    due += checkpoints
                    adopt_snapshots(made)
                    schema_memo.adopt(learned)
                    fault("table_written")
                else:
                    out_threaded -= 1
                    name, out, seconds = fut.result()
                tables[name] = out
                timings[f"table:{name}"] = seconds
                progress(
                    f"batch {batch}: {name}: {out.change_rows} changes, state "
                    f"{out.state_rows_text()} ({seconds:.1f}s)"
                )
        except BaseException:
            for f in [*forked, *threaded]:
                f.cancel()
            raise
        # Checkpoints workers without deltalake left (a parent that had started its
        # runtime before the fork): written here, side by side.
        list(pool.map(lambda d: delta_log.checkpoint_by_deltalake(*d), due))
    timings["tables"] = time.monotonic() - t_tables
    fault("changes_written")
    for name, t in prior_tables.items():
        if name not in tables:
            kept = TableCommit(**{**t.__dict__})
            kept.change_rows, kept.written, kept.renames, kept.missing_toast = 0, False, {}, 0
            tables[name] = kept
    # Done by now: the pool's close waited for it.
    side_out = write_side() if side is None else side.result()
    tx, msg_rel, msg_version, ddl_rel, ddl_version = side_out
    tx_count = int(tx.metrics.get("numOutputRows", 0))
    # Every table thread is done: what the replays persisted can go (shared cache manager).
    if spark.started is not None:
        spark.started.catalog.clearCache()
    names = {
        v.oid: cat.name
        for cat in bcat.tables.values()
        for v in cat.versions
        if v.seq < TARGET_SEQ - 1  # the stream's, not the target's shapes
    }
    return BatchOutput(
        tables,
        TRANSACTIONS,
        msg_rel,
        tx_count,
        tx.version,
        msg_version,
        timings,
        ddl=ddl_rel,
        ddl_version=ddl_version,
        relation_changes=relation_changes(
            bcat.tables,
            {n: t.oid for n, t in prior_tables.items()},
            _target_names(target_catalog),
        ),
        # The relations the changes name (not the Relation messages: pgoutput describes
        # a partition beside the root it publishes the partition's changes under).
        streamed={oid: names.get(oid, str(oid)) for oid, n in counts.items() if n},
    )


__all__ = ["BatchOutput", "DriverWrites", "process_batch", "state_schema_ddl"]
