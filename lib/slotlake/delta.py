"""Writing the lake's Delta tables: creation, schema evolution, idempotent writes.

Every data write of batch N carries Delta's idempotent-transaction marker: ``txnAppId``
(the lake's writer id) and ``txnVersion`` = N. Delta records the pair in the table's log
with the commit and silently skips a later write with a version not above it, so a rerun
of batch N never writes a table twice. DataFrame writes take the pair as options; MERGE
takes it from the session's SQL configuration, which is why each table is written from a
session of its own (:func:`table_session`), never from a session shared between threads.

Schema changes (DDL at the source) are separate Delta commits made *before* the data
commit, and each checks the table's current schema first, so they are idempotent too.
Column mapping (``name`` mode) makes RENAME and DROP COLUMN metadata-only; deletion
vectors make MERGE mark replaced rows instead of rewriting whole files.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slotlake import durability, schema_memo

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from slotlake.delta_log import Snapshot

log = logging.getLogger(__name__)

TABLE_PROPERTIES: dict[str, str] = {
    "delta.enableDeletionVectors": "true",
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "3",
    "delta.minWriterVersion": "7",
    # A checkpoint every 30 versions, not Delta's 10: a batch commits each table it
    # touches, and a checkpoint (deltalake reopening the table, ~7 ms a small table) in
    # every tenth batch, then its read in every batch after (~2 ms, against ~0.1 ms an
    # entry replayed), cost more than the entries. Measured over 30 batches of 100 small
    # tables (lake_bench's spread, interleaved runs): mean 1.71-1.78 s vs 2.01-2.07 s.
    "delta.checkpointInterval": "30",
}
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# Whether a MERGE writes deletion vectors (the table's property allowing them) or rewrites
# the files it touches: a session setting of open-source Delta and Databricks alike.
MERGE_VECTORS = "spark.databricks.delta.merge.deletionVectors.persistent"


@dataclass
class WriteResult:
    version: int  # the table's version holding this batch
    metrics: dict[str, str]  # operationMetrics of that commit
    # The commit's userMetadata (:func:`merge`'s ``metadata``), where Spark wrote it.
    user_metadata: str | None = None


# --- Reused table handles -----------------------------------------------------------------
#
# Opening a Delta table with ``deltalake`` replays its log (~2.5 ms for a small table);
# the driver lane asked that seven times per table and batch (size, txn versions, schema,
# the two writes). Within :func:`reusing_local_tables` each local path is opened once: the
# writes below advance the very object they were given. A handle is checked before reuse
# (one stat): if the table's next log entry exists, something else wrote it (Spark's
# ALTER or MERGE of the same batch) and the table is opened again.
_OPEN: dict[str, Any] | None = None
_OPEN_DEPTH = 0
_OPEN_LOCK = threading.Lock()


@contextmanager
def reusing_local_tables() -> Iterator[None]:
    """Open each local Delta table at most once inside the block (one batch's writes)."""
    global _OPEN, _OPEN_DEPTH
    with _OPEN_LOCK:
        _OPEN_DEPTH += 1
        if _OPEN is None:
            _OPEN = {}
    try:
        yield
    finally:
        with _OPEN_LOCK:
            _OPEN_DEPTH -= 1
            if _OPEN_DEPTH == 0:
                _OPEN = None


def open_local(path: str) -> Any:
    """``deltalake.DeltaTable(path)``, reused inside :func:`reusing_local_tables`."""
    import os

    from deltalake import DeltaTable

    from slotlake.table_processes import need_deltalake

    need_deltalake(f"{path}: a Delta table read")
    cache = _OPEN
    if cache is None:
        return DeltaTable(path)
    table = cache.get(path)
    if table is not None:
        following = os.path.join(path, "_delta_log", f"{table.version() + 1:020d}.json")
        if not os.path.exists(following):
            return table
    table = cache[path] = DeltaTable(path)
    return table


def local_snapshot(path: str, files: bool = False) -> Snapshot:
    """:func:`slotlake.delta_log.snapshot`, reused inside :func:`reusing_local_tables`
    while the table's next log entry does not exist (the commits made through
    :mod:`slotlake.delta_log` advance it: :func:`remember`); outside it, or on the first
    read of a batch, the snapshot this process kept from an earlier batch is read forward
    (:func:`_kept_forward`)."""
    import os

    from slotlake import delta_log

    cache = _OPEN
    key = "log:" + path
    if cache is not None:
        snap = cache.get(key)
        if snap is not None and (snap.files is not None or not files):
            following = os.path.join(path, "_delta_log", f"{snap.version + 1:020d}.json")
            if not os.path.exists(following):
                return snap
    snap = _kept_forward(path, files)
    if snap is None:
        snap = delta_log.snapshot(path, files)
        _keep(snap)
    if cache is not None:
        cache[key] = snap
    return snap


def remember(snap: Snapshot) -> None:
    """Keep the snapshot a commit made through :mod:`slotlake.delta_log` returned."""
    cache = _OPEN
    if cache is not None:
        cache["log:" + snap.path] = snap
    _keep(snap)


# --- Snapshots kept between batches -------------------------------------------------------
#
# A process that runs batch after batch (a library caller, the benchmarks) read every
# table's log afresh each batch: its checkpoint and up to an interval of entries, for the
# pick of the driver's tables (each state's size, in the parent, one table after another)
# and again for each write. It now keeps each table's latest snapshot and reads only the
# entries written since, as Spark's DeltaLog and delta-rs's DeltaTable.update do. A kept
# snapshot is trusted only while its own entry is the file it was read from (inode, size,
# checksum): a table removed, rebuilt, or its entries repaired after a crash is
# read afresh. Forked workers hand back the snapshots their commits made
# (:func:`handing_back`), so the parent's are current for the next batch's pick and fork.
# A log entry told apart from any other file at its name (:func:`_entry_id`), and a
# snapshot with the id of its own entry.
EntryId = tuple[int, int, int]
Kept = tuple["Snapshot", EntryId]
_KEPT: OrderedDict[str, Kept] = OrderedDict()
_KEPT_LOCK = threading.Lock()
# Tables whose snapshots a process keeps (the oldest used go first): a big table's live
# files are a few hundred bytes each, a lake's hundreds of small tables a few kB each.
KEPT_TABLES = 4096
# More entries than this since the kept snapshot: its checkpoint is the shorter read.
KEPT_FORWARD_MAX = 32
# Snapshots kept inside handing_back(), for the parent (None: not collecting).
_HANDED: list[Kept] | None = None


def _entry_id(snap: Snapshot) -> EntryId | None:
    """What tells the snapshot's own log entry from another file at its name: its inode
    and size, and a checksum of its bytes (a table rebuilt at the same path can reuse the
    inode within the file system's clock tick; its entry's commitInfo differs)."""
    import os
    import zlib

    try:
        with open(os.path.join(snap.path, "_delta_log", f"{snap.version:020d}.json"), "rb") as f:
            st = os.fstat(f.fileno())
            return st.st_ino, st.st_size, zlib.crc32(f.read())
    except OSError:
        return None  # a checkpoint whose entry log cleanup removed: not kept


def _keep(snap: Snapshot, entry: EntryId | None = None) -> None:
    entry = entry or _entry_id(snap)
    if entry is None:
        return
    with _KEPT_LOCK:
        had = _KEPT.get(snap.path)
    if had is not None:
        kept = had[0]
        if had[1] == entry and kept.files is not None and snap.files is None:
            return  # the same entry's snapshot with its files: the better one to keep
        if kept.version > snap.version and _entry_id(kept) == had[1]:
            return  # a newer one is kept (a worker's, handed back)
    with _KEPT_LOCK:
        _KEPT[snap.path] = (snap, entry)
        _KEPT.move_to_end(snap.path)
        while len(_KEPT) > KEPT_TABLES:
            _KEPT.popitem(last=False)
        if _HANDED is not None:
            _HANDED.append((snap, entry))


def _kept_forward(path: str, files: bool) -> Snapshot | None:
    """The kept snapshot of ``path`` read forward to the latest version, or None (none
    kept, not with the files asked for, or no longer the table's log)."""
    from slotlake import delta_log

    with _KEPT_LOCK:
        had = _KEPT.get(path)
    if had is None or (files and had[0].files is None):
        return None
    snap, entry = had
    if _entry_id(snap) != entry:
        with _KEPT_LOCK:
            if _KEPT.get(path) is had:
                del _KEPT[path]
        return None
    after = delta_log.advance(snap, KEPT_FORWARD_MAX)
    if after is not None and after is not snap:
        _keep(after)
    return after


@contextmanager
def handing_back() -> Iterator[list[Kept]]:
    """In a forked worker: collects the snapshots kept inside the block (its commits'),
    for the parent to :func:`adopt_snapshots`; they would die with the worker."""
    global _HANDED
    handed: list[Kept] = []
    _HANDED = handed
    try:
        yield handed
    finally:
        _HANDED = None


def adopt_snapshots(handed: list[Kept]) -> None:
    """Keep the snapshots a worker handed back (:func:`handing_back`)."""
    for snap, entry in handed:
        _keep(snap, entry)


def forget_kept() -> None:
    """Drop every kept snapshot (tests that rewrite logs by hand)."""
    with _KEPT_LOCK:
        _KEPT.clear()


def _has_log(path: str) -> bool:
    from slotlake.delta_log import has_log

    return has_log(path)


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_ref(path: str) -> str:
    return f"delta.{quote(path)}"


def table_session(spark: SparkSession) -> SparkSession:
    """A session of its own for one table's writes: same SparkContext, own SQL conf."""
    return spark.newSession()


def is_delta_table(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def ensure_table(
    spark: SparkSession,
    path: str,
    schema: StructType,
    renames: dict[str, str] | None = None,
    drop_missing: bool = False,
    marker: tuple[str, int] | None = None,
) -> None:
    """Create the Delta table at ``path`` with ``schema``, or evolve it to ``schema``.

    ``renames`` (old → new) are applied first (top level and inside the ``_old`` struct),
    then missing columns are added; with ``drop_missing`` columns the schema no longer has
    are dropped. A column whose type changed needs a rewrite of the table: its values are
    cast (the catalog only ever asks for lossless widenings or string). ``marker``
    (txnAppId, batch) is given when ``renames`` form a cycle (names swapped): the cycle is
    made too, planned by physical name so that a rerun finishes it rather than undoing it
    (:mod:`slotlake.swap_alters`).
    """
    from delta.tables import DeltaTable

    if not is_delta_table(spark, path):
        # Delta compares locations in Hadoop's form: file:///x and file:/x would clash.
        location = "file:/" + path[len("file:///") :] if path.startswith("file:///") else path
        builder = DeltaTable.createIfNotExists(spark).location(location).addColumns(schema)
        for key, value in TABLE_PROPERTIES.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    ref = table_ref(path)
    current = spark.read.format("delta").load(path).schema
    if marker is None and not needs_evolution(current, schema, renames or {}, drop_missing):
        return  # the usual batch: no DDL since the last one, no schema read more
    names = set(current.fieldNames())
    taken = names_taken(renames or {}, names) if drop_missing else set()
    if taken:
        spark.sql(f"ALTER TABLE {ref} DROP COLUMNS ({', '.join(quote(n) for n in sorted(taken))})")
        names -= taken
    for old, new in rename_order(renames or {}, names):
        spark.sql(f"ALTER TABLE {ref} RENAME COLUMN {quote(old)} TO {quote(new)}")
    if "_old" in names:
        old_fields = set(_struct_fields(current, "_old"))
        for old, new in rename_order(renames or {}, old_fields):
            spark.sql(f"ALTER TABLE {ref} RENAME COLUMN _old.{quote(old)} TO {quote(new)}")
    if marker is not None:
        from slotlake.swap_alters import swap_by_alters

        swap_by_alters(spark, path, ref, renames or {}, marker)
    current = spark.read.format("delta").load(path).schema
    names = set(current.fieldNames())
    adds = [f for f in schema.fields if f.name not in names]
    if adds:
        cols = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in adds)
        spark.sql(f"ALTER TABLE {ref} ADD COLUMNS ({cols})")
    if "_old" in schema.fieldNames() and "_old" in names:
        have = _struct_fields(current, "_old")
        want = _struct_fields(schema, "_old")
        nested = [(n, t) for n, t in want.items() if n not in have]
        if nested:
            cols = ", ".join(f"_old.{quote(n)} {t.simpleString()}" for n, t in nested)
            spark.sql(f"ALTER TABLE {ref} ADD COLUMNS ({cols})")
    if drop_missing:
        gone = [n for n in current.fieldNames() if n not in set(schema.fieldNames())]
        if gone:
            spark.sql(f"ALTER TABLE {ref} DROP COLUMNS ({', '.join(quote(n) for n in gone)})")
    current = spark.read.format("delta").load(path).schema
    want_types = {f.name: f.dataType for f in schema.fields}
    if "_old" in want_types and "_old" in current.fieldNames():
        # A change log's old image keeps every column it ever had (as the table does):
        # only the types of the fields both name can change, not the struct's field list.
        want_types["_old"] = _old_image_type(current["_old"].dataType, want_types["_old"])
    changed = [
        f.name
        for f in current.fields
        if f.name in want_types and _type_key(f.dataType) != _type_key(want_types[f.name])
    ]
    if changed:
        _rewrite_with_types(spark, path, current, want_types, changed)


def rename_order(renames: dict[str, str], names: set[str]) -> list[tuple[str, str]]:
    """The renames of ``names`` one ALTER at a time, each new name free when its turn
    comes: ``a → b`` before ``c → a``. A rename whose new name stays taken is left out,
    a cycle (``a → b``, ``b → a``) too: by names alone a rerun could not tell it done
    from not done. The one decision of which renames apply, for Spark's ALTERs and the
    driver's one entry (:func:`renamed_names`)."""
    pending = {old: new for old, new in renames.items() if old in names and old != new}
    have, out = set(names), []
    while ready := sorted(old for old, new in pending.items() if new not in have):
        for old in ready:
            new = pending[old]
            if new in have:  # an earlier rename of this round took it
                continue
            del pending[old]
            have.discard(old)
            have.add(new)
            out.append((old, new))
    return out


def renames_left(
    before: StructType | None, now: StructType | None, renames: dict[str, str]
) -> dict[str, str]:
    """``renames`` (old → new) less those an earlier attempt of the batch made already:
    told by physical name (column mapping) between the table's schema ``before`` the batch
    (the version the last commit record names) and ``now``. Names alone cannot tell
    ``a → a__dropped`` done once another column took ``a``: a rerun would move that one
    too. A rename is kept where some level (top, ``_old``) still has the column it meant
    under the old name; one whose name the table did not have before is not for it (a
    table without column mapping keeps them all, as before)."""
    from slotlake.delta_log import PHYSICAL
    from slotlake.swap_alters import levels

    def mapped(schema: StructType | None) -> bool:
        return schema is not None and any(PHYSICAL in (f.metadata or {}) for f in schema.fields)

    if not renames or not mapped(before) or not mapped(now):
        return renames
    assert before is not None and now is not None
    was = {
        level: {name: physical for physical, name in names.items()}
        for level, names in levels(before.jsonValue()).items()
    }
    is_now = levels(now.jsonValue())
    return {
        old: new
        for old, new in renames.items()
        if any(is_now.get(level, {}).get(names.get(old, "")) == old for level, names in was.items())
    }


def names_taken(renames: dict[str, str], names: set[str]) -> set[str]:
    """The columns of ``names`` whose name another of them is renamed to while they keep
    it (``DROP a``, ``RENAME c TO a``): the source dropped them. A state drops them before
    its renames, else the rename would find its new name taken and the state's ``a``
    would keep the dropped column's values."""
    targets = {new for old, new in renames.items() if old in names and old != new}
    return {n for n in names & targets if renames.get(n, n) == n}


def renamed_names(renames: dict[str, str], names: set[str], cycles: bool = False) -> dict[str, str]:
    """Each of ``names`` that :func:`rename_order` renames → its name after all of them;
    with ``cycles`` also the columns of a cycle (``a → b``, ``b → a``), which one change
    of the schema renames at once."""
    origin = {n: n for n in names}  # current name → the name it started as
    for old, new in rename_order(renames, names):
        origin[new] = origin.pop(old)
    out = {start: now for now, start in origin.items() if start != now}
    if cycles:
        out |= {origin[old]: new for old, new in cycles_of(renames, set(origin)).items()}
    return out


def cycles_of(renames: dict[str, str], names: set[str]) -> dict[str, str]:
    """The renames of ``names`` that form cycles (each new name is the old name of the
    next), which :func:`rename_order` leaves out."""
    pending = {old: new for old, new in renames.items() if old in names and old != new}
    out: dict[str, str] = {}
    for start in sorted(pending):
        path, at = [start], pending[start]
        while at in pending and at not in path:
            path.append(at)
            at = pending[at]
        if at == start and len(path) > 1:
            out |= {old: pending[old] for old in path}
    return out


def swaps(renames: dict[str, str]) -> bool:
    """Whether some of ``renames`` form a cycle (names swapped)."""
    return bool(cycles_of(renames, set(renames)))


def renames_marker(app_id: str, batch: int) -> tuple[str, int]:
    """The transaction an evolution that renames a cycle carries: the batch's writers'
    txnAppId with a suffix, so that it does not count as the batch's data."""
    return f"{app_id}.renames", batch


def renames_done(path: str, marker: tuple[str, int]) -> bool:
    """Whether the table at a local ``path`` already took the cycles of renames of batch
    ``marker[1]`` (its evolution carries ``marker`` as a transaction of its own): names
    alone cannot tell a swap done from one not done."""
    held = txn_version(path, marker[0])
    return held is not None and held >= marker[1]


def needs_evolution(
    current: StructType, schema: StructType, renames: dict[str, str], drop_missing: bool
) -> bool:
    """Whether :func:`ensure_table` would change a table whose schema is ``current``."""
    names = set(current.fieldNames())
    want = set(schema.fieldNames())
    if any(old in names and new not in names for old, new in renames.items()):
        return True
    if "_old" in names:
        have_old = _struct_fields(current, "_old")
        if any(old in have_old and new not in have_old for old, new in renames.items()):
            return True
        if "_old" in want and set(_struct_fields(schema, "_old")) - set(have_old):
            return True
    if want - names or (drop_missing and names - want):
        return True
    have = {f.name: f.dataType for f in current.fields}
    for f in schema.fields:
        wanted = f.dataType
        if f.name == "_old" and "_old" in have:
            wanted = _old_image_type(have["_old"], wanted)  # as ensure_table compares it
        if f.name in have and _type_key(have[f.name]) != _type_key(wanted):
            return True
    return False


def delta_schema(path: str, version: int | None = None) -> StructType | None:
    """The schema of the Delta table at a local ``path`` from its log (no Spark), as of
    ``version`` (None: the latest), or None."""
    from slotlake import delta_log

    if not _has_log(path):
        return None
    try:
        if version is None:
            return local_snapshot(path).schema
        return delta_log.snapshot(path, version=version).schema
    except LookupError:  # a log delta_log does not follow: delta-rs reads it
        from deltalake import DeltaTable

        table = open_local(path) if version is None else DeltaTable(path, version=version)
        return _struct_from_json(table.schema().to_json())


def _struct_from_json(text: str) -> StructType:
    """Shared, never to be mutated: the same schema is read for each batch of a table
    (kept as :func:`slotlake.ddltypes.parse_struct` keeps its own)."""
    hit = schema_memo.parsed("delta", text)
    if hit is not None:
        return hit
    from pyspark.sql.types import StructType

    out = StructType.fromJson(json.loads(text))
    schema_memo.keep_parsed("delta", text, out)
    return out


def _old_image_type(have: Any, want: Any) -> Any:
    """The ``_old`` struct ``have`` with the types ``want`` gives its fields."""
    from pyspark.sql.types import StructField
    from pyspark.sql.types import StructType as ST

    if not isinstance(have, ST) or not isinstance(want, ST):
        return want
    types = {f.name: f.dataType for f in want.fields}
    return ST([StructField(f.name, types.get(f.name, f.dataType), f.nullable) for f in have.fields])


def _struct_fields(schema: StructType, name: str) -> dict[str, Any]:
    from pyspark.sql.types import StructType as ST

    dtype = schema[name].dataType
    return {f.name: f.dataType for f in dtype.fields} if isinstance(dtype, ST) else {}


def _type_key(dtype: Any) -> str:
    # Nullability and field metadata (column mapping ids) do not count as a type change.
    return dtype.simpleString()


def _rewrite_with_types(
    spark: SparkSession, path: str, current: StructType, want: dict[str, Any], changed: list[str]
) -> None:
    """ALTER COLUMN TYPE at the source: rewrite the table with the columns cast (rare DDL)."""
    from pyspark.sql import functions as F

    log.info("rewriting %s: column type changed for %s", path, ", ".join(changed))
    df = spark.read.format("delta").load(path)
    cols = [
        F.col(quote(f.name)).cast(want[f.name]).alias(f.name)
        if f.name in changed
        else F.col(quote(f.name))
        for f in current.fields
    ]
    (
        df.select(*cols)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(path)
    )


# delta-rs names its commits' operationMetrics in snake case; slotlake reads Spark's names.
_DELTA_RS_METRICS = {
    "num_added_rows": "numOutputRows",
    "num_target_rows_inserted": "numTargetRowsInserted",
    "num_target_rows_deleted": "numTargetRowsDeleted",
}


def spark_metrics(metrics: dict[str, Any] | None) -> dict[str, str]:
    """A commit's operationMetrics under Spark's names, whichever writer made it."""
    out = {str(k): str(v) for k, v in (metrics or {}).items()}
    for rs, name in _DELTA_RS_METRICS.items():
        if rs in out and name not in out:
            out[name] = out[rs]
    return out


def jvm_snapshot(spark: SparkSession, path: str, version: int | None = None) -> Any:
    """The table's Delta snapshot in Spark's JVM: a fresh one, or as of ``version``."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    table_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)  # type: ignore[attr-defined]
    none = jvm.scala.Option.empty()
    if version is None:
        return table_log.update(False, none, none)
    return table_log.getSnapshotAt(version, none, none, False)


def last_commit(spark: SparkSession, path: str) -> WriteResult:
    """The table's newest commit: its version, operationMetrics and userMetadata.

    Read from the commit's own file through the JVM's DeltaLog and log store (any file
    system Spark reaches): ``DeltaTable.history(1)`` runs a Spark job for it, 0.4-0.5 s a
    write in local mode against 0.13-0.2 s. A runtime without the open-source Delta
    classes (Databricks ships its own), or whose DeltaLog lacks a method used here (another
    Delta release), is read through ``history(1)`` as before."""
    from py4j.protocol import Py4JError

    if has_open_source_delta_log(spark):
        try:
            return _commit_from_log(spark, path)
        except Py4JError as exc:
            log.debug("commit of %s read through DeltaTable.history: %s", path, exc)
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history(1)
    row = history.select("version", "operationMetrics", "userMetadata").first()
    assert row is not None
    return WriteResult(
        int(row["version"]), spark_metrics(row["operationMetrics"]), row["userMetadata"]
    )


def has_open_source_delta_log(spark: SparkSession) -> bool:
    """Whether Spark's JVM has open-source Delta's DeltaLog class (py4j answers a name it
    cannot find as a package, which is not callable)."""
    from py4j.java_gateway import JavaClass

    jvm = spark._jvm  # type: ignore[attr-defined]
    return isinstance(jvm.org.apache.spark.sql.delta.DeltaLog, JavaClass)


def _commit_from_log(spark: SparkSession, path: str) -> WriteResult:
    jvm = spark._jvm  # type: ignore[attr-defined]
    snapshot = jvm_snapshot(spark, path)
    delta_log = snapshot.deltaLog()
    version = int(snapshot.version())
    commit = jvm.org.apache.hadoop.fs.Path(delta_log.logPath(), f"{version:020d}.json")
    info = jvm.org.apache.spark.sql.delta.DeltaHistoryManager.getCommitInfoOpt(
        delta_log.store(), commit, delta_log.newDeltaHadoopConf()
    )
    metrics: dict[str, Any] = {}
    user_metadata = None
    if info.isDefined():
        if info.get().operationMetrics().isDefined():
            as_java = jvm.scala.jdk.javaapi.CollectionConverters.asJava
            metrics = dict(as_java(info.get().operationMetrics().get()))
        if info.get().userMetadata().isDefined():
            user_metadata = str(info.get().userMetadata().get())
    return WriteResult(version, spark_metrics(metrics), user_metadata)


def txn_version(path: str, app_id: str) -> int | None:
    """The last batch ``app_id`` wrote into the table at a local ``path`` (None if never).

    Read with the ``deltalake`` package from the table's log, no Spark job. Only an
    optimisation (a rerun skips tables that already hold the batch): the txn marker on
    every write is what guarantees a table never gets a batch twice.
    """

    if not _has_log(path):
        return None

    try:
        try:
            return local_snapshot(path).txns.get(app_id)
        except LookupError:
            return open_local(path).transaction_version(app_id)
    except Exception:  # a reader that cannot tell must not stop the batch
        log.debug("could not read txn versions of %s", path, exc_info=True)
        return None


def append(df: DataFrame, path: str, app_id: str, batch: int) -> WriteResult:
    return _write(df, path, "append", app_id, batch)


def overwrite(df: DataFrame, path: str, app_id: str, batch: int) -> WriteResult:
    """Replace the table's rows in one commit (a TRUNCATE in the batch)."""
    return _write(df, path, "overwrite", app_id, batch)


def _write(df: DataFrame, path: str, mode: str, app_id: str, batch: int) -> WriteResult:
    (
        df.write.format("delta")
        .mode(mode)
        .option("txnAppId", app_id)
        .option("txnVersion", str(batch))
        .save(path)
    )
    return last_commit(df.sparkSession, path)


def merge(
    session: SparkSession,
    path: str,
    source: DataFrame,
    condition: str,
    build: Any,
    app_id: str,
    batch: int,
    metadata: str | None = None,
    vectors: bool = True,
) -> WriteResult:
    """MERGE ``source`` (alias ``s``) into the table (alias ``t``) as batch ``batch``.

    ``build`` adds the WHEN clauses to the merge builder. ``session`` must be the
    table's own session: the txn pair (and ``metadata``, the commit's ``userMetadata``)
    lives in its SQL conf for the duration of the MERGE, and so does ``vectors=False``
    (the files the MERGE touches rewritten instead of given deletion vectors).
    """
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(session, path)
    session.conf.set(TXN_APP_ID, app_id)
    session.conf.set(TXN_VERSION, str(batch))
    if metadata is not None:
        session.conf.set(USER_METADATA, metadata)
    if not vectors:
        session.conf.set(MERGE_VECTORS, "false")
    try:
        build(target.alias("t").merge(source.alias("s"), condition)).execute()
    finally:
        for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA, MERGE_VECTORS):
            session.conf.unset(key)
    return last_commit(session, path)


def state_bytes(spark: SparkSession, path: str) -> int | None:
    """Bytes of the live data files of the Delta table at ``path``, or None when they are
    not to be had cheaply: read from the log on a local disk, elsewhere from the JVM's
    snapshot, whose file list the MERGE that asks then reuses (a runtime without
    open-source Delta's classes: None)."""
    from py4j.protocol import Py4JError

    from slotlake.lake import is_local, local_path

    if is_local(path):
        return table_bytes(str(local_path(path)))
    if not has_open_source_delta_log(spark):
        return None
    try:
        return int(jvm_snapshot(spark, path).sizeInBytes())
    except Py4JError as exc:
        log.debug("size of %s not read: %s", path, exc)
        return None


# --- The driver-side writer for small tables -------------------------------------------
#
# A Delta commit through Spark costs a chain of jobs however few its rows: measured on the
# 2-core machine, a MERGE of 50 keys into a 200-row state takes 14 Spark jobs and 3–4 s, an
# append 1–2 s. A batch that touches a hundred small tables would pay that a hundred times.
# The ``deltalake`` package (delta-rs, the same transaction log protocol, with deletion
# vectors and column mapping) writes such a table from the driver in tens of milliseconds.
# It rewrites the files a MERGE touches instead of writing deletion vectors, which is why
# it is used only below a state size where rewriting the touched files is cheap; bigger
# states keep Spark's MERGE with deletion vectors. Both writers record the same
# (txnAppId, txnVersion) pair in the table's log; the driver-side writer checks it before
# writing (slotlake holds the lake's lock, so nothing writes between check and commit).


def table_bytes(path: str) -> int | None:
    """Bytes of the live data files of the Delta table at a local ``path`` (None: no table)."""

    if not _has_log(path):
        return None
    try:  # read once: the state's MERGE uses the same snapshot of its files
        return local_snapshot(path, files=True).file_bytes()
    except LookupError:
        pass
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(open_local(path).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0


def _commit_properties(app_id: str, batch: int) -> Any:
    from deltalake.transaction import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app_id, batch)])


# ``held`` of the writers below: the txn version of ``app_id`` the table holds, when the
# caller has read it already (reading it costs a log replay); UNREAD reads it.
UNREAD = -2


def written_already(
    path: str, app_id: str, batch: int, held: int | None = UNREAD
) -> WriteResult | None:
    """The table's last commit if ``app_id`` already wrote ``batch`` into it (a rerun)."""

    if held == UNREAD:
        held = txn_version(path, app_id)
    if held is None or held < batch:
        return None
    # Nothing writes the table between its batch and the commit record (the lake lock).
    return _last(open_local(path))


def local_last_commit(path: str) -> WriteResult:
    """:func:`last_commit` of a table at a local ``path``, read by deltalake (no Spark)."""
    return _last(open_local(path))


def _last(table: Any) -> WriteResult:
    last = table.history(1)[0]
    return WriteResult(table.version(), spark_metrics(last.get("operationMetrics")))


def arrow_append(
    path: str, data: Any, app_id: str, batch: int, held: int | None = UNREAD
) -> WriteResult:
    """Append a ``pyarrow.Table`` as batch ``batch`` (skipped if the table holds it)."""
    return _arrow_write(path, data, "append", app_id, batch, held)


def arrow_append_creating(
    path: str, schema: StructType, data: Any, app_id: str, batch: int
) -> WriteResult:
    """:func:`arrow_append` to a table at a local ``path``, which the driver creates first
    (:func:`create_on_driver`, as Spark would) when there is none."""
    if delta_schema(path) is None:
        create_on_driver(path, schema)
    return arrow_append(path, data, app_id, batch)


def arrow_overwrite(
    path: str, data: Any, app_id: str, batch: int, held: int | None = UNREAD
) -> WriteResult:
    """Replace the table's rows with a ``pyarrow.Table`` in one commit, as batch ``batch``."""
    return _arrow_write(path, data, "overwrite", app_id, batch, held)


def arrow_overwrite_stream(
    path: str,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    app_id: str,
    batch: int,
    held: int | None = UNREAD,
) -> WriteResult:
    """:func:`arrow_overwrite` from a stream of batches, written as they come (delta-rs
    rolls files of ~100 MB), so that a table of any size costs the driver a few batches of
    memory. An error raised by the stream is raised as itself, not as delta-rs's wrapper;
    the overwrite commits only after the stream ended."""
    import pyarrow as pa
    from deltalake import write_deltalake

    done = written_already(path, app_id, batch, held)
    if done is not None:
        return done
    rows = 0
    failed: list[BaseException] = []

    def counted() -> Iterator[pa.RecordBatch]:
        nonlocal rows
        try:
            for rb in batches:
                rows += rb.num_rows
                yield rb
        except BaseException as exc:
            failed.append(exc)
            raise

    table = open_local(path)
    durability.unlisted()  # deltalake's files: the batch's sync takes the file system
    try:
        write_deltalake(
            table,
            pa.RecordBatchReader.from_batches(schema, counted()),
            mode="overwrite",
            commit_properties=_commit_properties(app_id, batch),
        )
    except Exception:
        if failed:
            raise failed[0] from None
        raise
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a generator stopped early must release what it holds (connections)
    return WriteResult(table.version(), {"numOutputRows": str(rows)})


def _arrow_write(
    path: str, data: Any, mode: str, app_id: str, batch: int, held: int | None
) -> WriteResult:
    from deltalake import write_deltalake

    done = written_already(path, app_id, batch, held)
    if done is not None:
        return done
    written = _write_on_driver(path, data, mode == "overwrite", app_id, batch)
    if written is not None:
        return written
    # One log read: the write advances the table object it is given.
    table = open_local(path)
    durability.unlisted()  # deltalake's files: the batch's sync takes the file system
    write_deltalake(table, data, mode=mode, commit_properties=_commit_properties(app_id, batch))
    return WriteResult(table.version(), {"numOutputRows": str(data.num_rows)})


def _write_on_driver(
    path: str, data: Any, overwrite: bool, app_id: str, batch: int
) -> WriteResult | None:
    """The append or overwrite committed by :mod:`slotlake.delta_log` (a few ms where
    delta-rs takes tens); None, having committed nothing, where delta-rs must do it: a log
    or protocol that module does not follow, or a version taken meanwhile."""
    from slotlake import delta_log

    try:
        snap = local_snapshot(path, files=overwrite)
    except LookupError as exc:
        log.debug("%s: written by delta-rs (%s)", path, exc)
        return None
    why = delta_log.unwritable(snap, deletes=overwrite)
    if why is not None:
        log.debug("%s: written by delta-rs (%s)", path, why)
        return None
    try:
        after, metrics = delta_log.append(snap, data, app_id, batch, overwrite)
    except FileExistsError:
        log.info("%s: version %d was written meanwhile; delta-rs retries", path, snap.version + 1)
        return None
    remember(after)
    return WriteResult(after.version, metrics)


def sql_ident(name: str) -> str:
    """A column name in the SQL dialect of ``deltalake`` (DataFusion): double quotes."""
    return '"' + name.replace('"', '""') + '"'


def arrow_merge_keyed(
    path: str,
    source: Any,
    predicate: str,
    helper_columns: list[str],
    app_id: str,
    batch: int,
    held: int | None = UNREAD,
) -> WriteResult:
    """MERGE a keyed table's final rows (``s``, with ``_deleted``) into its state (``t``).

    The same clauses as the Spark MERGE: a deleted key's row goes, a matched key's row is
    replaced, a new key is inserted; ``helper_columns`` of the source are not table columns.
    """

    done = written_already(path, app_id, batch, held)
    if done is not None:
        return done
    table = open_local(path)  # the MERGE advances it
    if source.num_rows == 0:
        # deltalake would scan every file of the table to commit nothing.
        return WriteResult(table.version(), {"numTargetRowsInserted": "0"})
    durability.unlisted()  # deltalake's files: the batch's sync takes the file system
    metrics = (
        table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=_commit_properties(app_id, batch),
        )
        .when_matched_delete("s._deleted")
        .when_matched_update_all(except_cols=helper_columns)
        .when_not_matched_insert_all(predicate="NOT s._deleted", except_cols=helper_columns)
        .execute()
    )
    return WriteResult(
        table.version(),
        {
            "numTargetRowsInserted": str(metrics.get("num_target_rows_inserted", 0)),
            "numTargetRowsDeleted": str(metrics.get("num_target_rows_deleted", 0)),
        },
    )


# --- Tables created from the driver ------------------------------------------------------
#
# The bootstrap creates a Delta table per published table (state and change log). Through
# Spark each creation is a JVM round of its own (DeltaTable.createIfNotExists, then a
# history read for the version: 0.2–0.5 s and a job or two on two cores), which a database
# of hundreds of small tables paid hundreds of times. The ``deltalake`` package cannot
# stand in: delta-rs 1.6 ``DeltaTable.create`` with ``delta.columnMapping.mode = name``
# leaves ``columnMapping`` out of the protocol (Spark then refuses the table:
# DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH), and with ``delta.minReaderVersion = 3`` /
# ``delta.minWriterVersion = 7`` in its configuration it lists ``variantType`` as a reader
# feature (plus ``invariants`` and ``appendOnly`` writer features) and keeps both keys in
# the table's configuration: a reader that does not know ``variantType`` would refuse a
# table that has no variant column. Creating a table is one log entry (Delta protocol:
# version 0 holds ``protocol`` and ``metaData``), so the driver writes it itself, exactly
# as Spark's ``ensure_table`` does: the same protocol and features, the same
# configuration, column mapping ids numbered depth-first from 1 with ``col-<uuid>``
# physical names and ``delta.columnMapping.maxColumnId``. Data then goes in through
# ``deltalake`` (which writes the physical names and field ids of a mapped table).

# Table property → the table feature Spark's Delta lists for it (reader and writer alike).
_PROPERTY_FEATURES = {
    ("delta.enableDeletionVectors", "true"): "deletionVectors",
    ("delta.columnMapping.mode", "name"): "columnMapping",
}
DRIVER_ENGINE = "slotlake (driver)"


def local_version(path: str) -> int | None:
    """The latest version of the Delta table at a local ``path`` (None: there is none)."""

    if not _has_log(path):
        return None
    try:
        return local_snapshot(path).version
    except LookupError:
        return int(open_local(path).version())


def ensure_local(
    spark: Callable[[], SparkSession],
    uri: str,
    path: str,
    schema: StructType,
    renames: dict[str, str] | None = None,
    drop_missing: bool = False,
    marker: tuple[str, int] | None = None,
) -> StructType:
    """:func:`ensure_table` for a table on local disk (``uri`` as Spark names it, ``path``
    on disk), without Spark unless a column's values must be rewritten: a new table's first
    log entry is written by the driver (:func:`create_on_driver`), so are renamed, added
    and dropped columns (:func:`evolve_on_driver`); a table that already has the columns
    is left as it is, and only a changed column type asks ``spark`` for a session to
    rewrite it. ``marker`` (txnAppId, batch): renames that form a cycle are made too, in
    one entry that carries it, unless the table holds it already. Returns the table's
    schema."""
    current = delta_schema(path)
    swap = None
    if (
        current is not None
        and marker is not None
        and cycles_of(renames or {}, set(current.fieldNames()))
        and not renames_done(path, marker)
    ):
        swap = marker
    if current is None:
        create_on_driver(path, schema)
    elif swap is None and not needs_evolution(current, schema, renames or {}, drop_missing):
        return current
    elif not evolve_on_driver(path, current, schema, renames or {}, drop_missing, swap):
        if swap is not None:
            # A type changed too: the names move first, in the driver's entry that carries
            # the marker (Spark's ALTERs rename one column at a time and would leave a
            # cycle as it is), then Spark rewrites the values.
            moved = _names_moved(current, renames or {})
            evolve_on_driver(path, current, moved, renames or {}, False, swap)
        ensure_table(spark(), uri, schema, renames, drop_missing)
    out = delta_schema(path)
    assert out is not None
    return out


def _renamed_fields(fields: list[Any], renames: dict[str, str], cycles: bool) -> list[Any]:
    """``fields`` with the renames Spark's ALTERs would make (and, with ``cycles``, those
    of a cycle), as one change of the schema: each keeps its type and metadata."""
    from pyspark.sql.types import StructField

    to = renamed_names(renames, {f.name for f in fields}, cycles)
    return [
        StructField(to[f.name], f.dataType, f.nullable, f.metadata) if f.name in to else f
        for f in fields
    ]


def _names_moved(current: StructType, renames: dict[str, str]) -> StructType:
    """``current`` with ``renames`` made, cycles included (top level and inside ``_old``),
    nothing else changed."""
    from pyspark.sql.types import StructField
    from pyspark.sql.types import StructType as ST

    out = _renamed_fields(list(current.fields), renames, cycles=True)
    for i, f in enumerate(out):
        if f.name == "_old" and isinstance(f.dataType, ST):
            old = _renamed_fields(list(f.dataType.fields), renames, cycles=True)
            out[i] = StructField("_old", ST(old), f.nullable, f.metadata)
    return ST(out)


def create_on_driver(path: str, schema: StructType) -> int:
    """Create the Delta table at a local ``path`` as Spark's :func:`ensure_table` would
    (see above), writing its version 0 directly; returns 0."""
    import time
    import uuid

    mapped, max_id = _column_mapped(schema)
    features = sorted(
        {f for (key, value), f in _PROPERTY_FEATURES.items() if TABLE_PROPERTIES.get(key) == value}
        | ({"timestampNtz"} if _has_timestamp_ntz(schema) else set())
    )
    configuration = {k: v for k, v in TABLE_PROPERTIES.items() if not k.startswith("delta.min")} | {
        "delta.columnMapping.maxColumnId": str(max_id)
    }
    now = int(time.time() * 1000)
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "CREATE TABLE",
                "operationParameters": {
                    "partitionBy": "[]",
                    "properties": json.dumps(configuration),
                },
                "isBlindAppend": True,
                "engineInfo": DRIVER_ENGINE,
            }
        },
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": mapped.json(),
                "partitionColumns": [],
                "configuration": configuration,
                "createdTime": now,
            }
        },
        {
            "protocol": {
                "minReaderVersion": int(TABLE_PROPERTIES["delta.minReaderVersion"]),
                "minWriterVersion": int(TABLE_PROPERTIES["delta.minWriterVersion"]),
                "readerFeatures": features,
                "writerFeatures": features,
            }
        },
    ]
    # A table created meanwhile is an error (put-if-absent).
    _commit_on_driver(path, 0, actions)
    return 0


def _commit_on_driver(path: str, version: int, actions: list[dict[str, Any]]) -> None:
    """Write ``actions`` as the local table's log entry ``version``, put-if-absent as every
    Delta writer commits: FileExistsError when another writer committed that version."""
    from slotlake.lake import LocalFS

    entry = f"{path}/_delta_log/{version:020d}.json"
    text = "".join(json.dumps(a) + "\n" for a in actions)
    if durability.deferring():
        # A sync's batch makes its files durable together (slotlake.durability).
        LocalFS().create_new(entry, text, durable=False)
        durability.written(entry)
    else:
        LocalFS().create_new(entry, text)


def _column_mapped(schema: StructType, last_id: int = 0) -> tuple[StructType, int]:
    """``schema`` with column mapping ids and physical names on every struct field, numbered
    depth-first (a struct before its fields) from ``last_id`` + 1 as Delta assigns them;
    returns the last id."""
    import uuid

    from pyspark.sql.types import ArrayType, DataType, MapType, StructField
    from pyspark.sql.types import StructType as ST

    last = last_id

    def walk(dtype: DataType) -> DataType:
        nonlocal last
        if isinstance(dtype, ST):
            fields = []
            for f in dtype.fields:
                last += 1
                metadata = {
                    **f.metadata,
                    "delta.columnMapping.id": last,
                    "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}",
                }
                fields.append(StructField(f.name, walk(f.dataType), f.nullable, metadata))
            return ST(fields)
        if isinstance(dtype, ArrayType):
            return ArrayType(walk(dtype.elementType), dtype.containsNull)
        if isinstance(dtype, MapType):
            return MapType(walk(dtype.keyType), walk(dtype.valueType), dtype.valueContainsNull)
        return dtype

    mapped = walk(schema)
    assert isinstance(mapped, ST)
    return mapped, last


# Writer features under which a commit of a metaData action alone is all a writer owes:
# those of slotlake's tables (as the driver or Spark creates them) and two legacy ones.
_METADATA_ONLY_SAFE = {
    "columnMapping",
    "deletionVectors",
    "timestampNtz",
    "appendOnly",
    "invariants",
}


def evolve_on_driver(
    path: str,
    current: StructType,
    schema: StructType,
    renames: dict[str, str],
    drop_missing: bool,
    swap: tuple[str, int] | None = None,
) -> bool:
    """:func:`ensure_table`'s renames, added columns (top level and inside ``_old``) and
    dropped columns for the table at a local ``path``, as one log entry the driver writes;
    with ``swap`` (txnAppId, batch) the renames that form a cycle too, the entry carrying
    that transaction (:func:`renames_done`).

    With column mapping in name mode all three are changes of the schema alone (Delta
    protocol: a column's data is found by its physical name, which a rename keeps and a
    new column gets afresh), so the entry is a ``metaData`` action with the new schema,
    numbered on from ``delta.columnMapping.maxColumnId`` as Spark numbers it. Spark's
    ALTER TABLE would take a JVM and one commit per statement; this is one commit, so a
    reader never sees half of a DDL's change. Returns False, writing nothing, when Spark
    must do it: a column's type changed (its values are rewritten), or a new column needs
    a table feature the table's protocol lacks (``timestampNtz``)."""
    import time

    from pyspark.sql.types import StructField
    from pyspark.sql.types import StructType as ST

    table = open_local(path)
    meta = table.metadata()
    protocol = table.protocol()
    configuration = dict(meta.configuration)
    if configuration.get("delta.columnMapping.mode") != "name" or meta.partition_columns:
        return False
    if not set(protocol.writer_features or []) <= _METADATA_ONLY_SAFE:
        return False  # a feature with rules for every commit (in-commit timestamps, …)
    last_id = int(configuration.get("delta.columnMapping.maxColumnId", "0"))

    def renamed(fields: list[Any]) -> list[Any]:
        return _renamed_fields(fields, renames, cycles=swap is not None)

    def added(fields: list[Any], wanted: list[Any]) -> list[Any]:
        nonlocal last_id
        have = {f.name for f in fields}
        new = [StructField(f.name, f.dataType, True) for f in wanted if f.name not in have]
        if not new:
            return fields
        mapped, last_id = _column_mapped(ST(new), last_id)
        return fields + list(mapped.fields)

    taken = names_taken(renames, set(current.fieldNames())) if drop_missing else set()
    kept = [f for f in current.fields if f.name not in taken]
    fields = added(renamed(kept), list(schema.fields))
    if "_old" in schema.fieldNames() and "_old" in current.fieldNames():
        at = [f.name for f in fields].index("_old")
        old = fields[at]
        old_fields = added(renamed(list(old.dataType.fields)), list(schema["_old"].dataType.fields))
        fields[at] = StructField("_old", ST(old_fields), old.nullable, old.metadata)
    if drop_missing:
        keep = set(schema.fieldNames())
        fields = [f for f in fields if f.name in keep]
    evolved = ST(fields)
    if needs_evolution(evolved, schema, {}, drop_missing):
        return False  # a changed type: Spark rewrites the values
    if _has_timestamp_ntz(evolved) and "timestampNtz" not in (protocol.writer_features or []):
        return False
    configuration["delta.columnMapping.maxColumnId"] = str(last_id)
    before, after = set(current.fieldNames()), set(evolved.fieldNames())
    parameters = {
        "renamed": json.dumps({o: n for o, n in renames.items() if o in before and n in after}),
        "added": json.dumps(sorted(after - before - set(renames.values()))),
        "dropped": json.dumps(sorted((before - after - set(renames)) | taken)),
    }
    now = int(time.time() * 1000)
    metadata: dict[str, Any] = {
        "id": meta.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": evolved.json(),
        "partitionColumns": [],
        "configuration": configuration,
    }
    if meta.created_time is not None:
        metadata["createdTime"] = meta.created_time
    if meta.name is not None:
        metadata["name"] = meta.name
    if meta.description is not None:
        metadata["description"] = meta.description
    version = int(table.version()) + 1
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "CHANGE COLUMNS",
                "operationParameters": parameters,
                "readVersion": version - 1,
                "isBlindAppend": False,
                "engineInfo": DRIVER_ENGINE,
            }
        },
        {"metaData": metadata},
    ]
    if swap is not None:
        from slotlake.delta_log import txn

        actions.append(txn(swap[0], swap[1], now))
    # A concurrent writer's commit of this version fails this one.
    _commit_on_driver(path, version, actions)
    log.info("%s: columns changed on the driver (%s)", path, parameters)
    return True


def _has_timestamp_ntz(dtype: Any) -> bool:
    from pyspark.sql.types import ArrayType, MapType, TimestampNTZType
    from pyspark.sql.types import StructType as ST

    if isinstance(dtype, TimestampNTZType):
        return True
    if isinstance(dtype, ST):
        return any(_has_timestamp_ntz(f.dataType) for f in dtype.fields)
    if isinstance(dtype, ArrayType):
        return _has_timestamp_ntz(dtype.elementType)
    if isinstance(dtype, MapType):
        return _has_timestamp_ntz(dtype.keyType) or _has_timestamp_ntz(dtype.valueType)
    return False
