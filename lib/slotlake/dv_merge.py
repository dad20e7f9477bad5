"""A keyed state's MERGE on the driver, with deletion vectors: no Spark, no file rewritten.

A big state (past ``lake.driver_write_state_mb``) took Spark's MERGE even when the batch's
rows were done on the driver, because ``deltalake``'s MERGE rewrites every file a key hits
(random keys hit them all) and cannot write deletion vectors (delta-rs issue #4512).
Measured on the 2-core machine: 9.9 s for 10k changes on a 5M-row table, of which the MERGE
proper (scan for matches, a shuffle of the touched files, the vectors, a snapshot) ~6.5 s
and Spark's scheduling the rest. Yet a MERGE by replica identity in a table whose keys are
unique is three simple steps, which the driver does here in one Delta commit:

1. **find** the live rows whose key is one of the batch's final rows' keys: the files whose
   key statistics may hold one (Delta's data skipping), their key columns only, joined in
   DuckDB (``IS NOT DISTINCT FROM``, the Spark MERGE's condition) with their row positions
   (``file_row_number``); rows an earlier deletion vector removed do not count;
2. **delete** them: each touched file is re-added with its deletion vector grown by them
   (:mod:`slotlake.deletion_vector` reads the old vector and writes the new one);
3. **insert** the final rows that are not deletions, as one new Parquet file.

A replaced row is a deletion plus an insertion, as Spark's MERGE with deletion vectors
writes it. The commit carries the batch's (txnAppId, txnVersion) like every other write and
is put-if-absent on the next version: a table written meanwhile makes this return None and
the caller hands the rows to Spark's MERGE, which resolves conflicts. Tables whose
protocol asks a writer for more than this knows (row tracking, change data feed, check
constraints, column mapping by id, partitions, nested structs in the state) go to Spark.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from slotlake import deletion_vector
from slotlake.deletion_vector import DeletionVectorFile
from slotlake.delta import (
    DRIVER_ENGINE,
    WriteResult,
    _commit_on_driver,
    _struct_from_json,
    open_local,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

    from slotlake.catalog import TableCatalog

log = logging.getLogger(__name__)

# Writer features whose duties a commit of adds, removes and a txn fulfils as written here.
_SAFE_WRITER_FEATURES = {
    "columnMapping",
    "deletionVectors",
    "timestampNtz",
    "appendOnly",
    "invariants",
}
_PHYSICAL = "delta.columnMapping.physicalName"
_FIELD_ID = "delta.columnMapping.id"
# Stats Delta's readers skip files with: integers, dates and short strings (longer strings
# would need Spark's truncation rules for a max that stays an upper bound).
_STRING_STATS_MAX = 32


def unsupported(table: Any) -> str | None:
    """Why this table's MERGE cannot be done here (None: it can)."""
    protocol = table.protocol()
    config = table.metadata().configuration
    if protocol.min_writer_version != 7:
        return f"writer protocol {protocol.min_writer_version} has no deletion vectors"
    extra = set(protocol.writer_features or []) - _SAFE_WRITER_FEATURES
    if extra:
        return f"writer features {sorted(extra)}"
    if config.get("delta.enableDeletionVectors") != "true":
        return "delta.enableDeletionVectors is not true"
    if config.get("delta.appendOnly") == "true":
        return "the table is append-only"
    if config.get("delta.columnMapping.mode", "none") not in ("name", "none"):
        return f"column mapping mode {config['delta.columnMapping.mode']}"
    if table.metadata().partition_columns:
        return "partitioned"
    schema = _struct_from_json(table.schema().to_json())
    for f in schema.fields:
        if "delta.invariants" in f.metadata or _has_struct(f.dataType):
            return f"column {f.name!r} (invariants or nested fields)"
    return None


def _has_struct(dtype: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(dtype, StructType):
        return True
    if isinstance(dtype, ArrayType):
        return _has_struct(dtype.elementType)
    if isinstance(dtype, MapType):
        return _has_struct(dtype.keyType) or _has_struct(dtype.valueType)
    return False


def merge_keyed(
    path: str, rows: pa.Table, cat: TableCatalog, app_id: str, batch: int
) -> WriteResult | None:
    """MERGE ``rows`` (a keyed table's final rows: the state's columns, ``_key`` and
    ``_deleted``) into the state at a local ``path`` as batch ``batch``; None, having
    written nothing the table refers to, when Spark must do it."""
    import pyarrow.compute as pc

    table = open_local(path)
    why = unsupported(table)
    if why is not None:
        log.info("%s: state MERGE left to Spark (%s)", cat.name, why)
        return None
    started = time.monotonic()
    version = table.version()
    if rows.num_rows == 0:
        # Nothing to MERGE: no commit (as deltalake's MERGE path), a rerun does nothing too.
        return WriteResult(version, {"numTargetRowsInserted": "0", "numTargetRowsDeleted": "0"})
    schema = _struct_from_json(table.schema().to_json())
    physical = {f.name: f.metadata.get(_PHYSICAL, f.name) for f in schema.fields}
    deleted = rows.column("_deleted").to_numpy(zero_copy_only=False)

    matches = _find(path, table, rows, cat, physical)
    # The files' current vectors, read from their add actions: only the files the keys hit.
    try:
        live_adds = _live_adds(path, version, set(matches)) if matches else {}
    except LookupError as exc:  # a log this reader does not follow: Spark's MERGE will
        log.warning("%s: state MERGE left to Spark (%s)", cat.name, exc)
        return None
    old_dvs = {
        file: deletion_vector.read(path, add["deletionVector"])
        for file, add in live_adds.items()
        if add.get("deletionVector")
    }
    touched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    hit = np.zeros(rows.num_rows, dtype=bool)
    for file, (positions, sources) in matches.items():
        old = old_dvs.get(file, np.empty(0, dtype=np.int64))
        live = ~np.isin(positions, old)
        if live.any():
            hit[sources[live]] = True
            touched[file] = (old, positions[live])
    inserts = rows.filter(pc.invert(rows.column("_deleted")))
    inserts = inserts.drop_columns([c for c in ("_key", "_deleted") if c in inserts.column_names])

    now = int(time.time() * 1000)
    written: list[str] = []
    actions: list[dict[str, Any]] = []
    try:
        if touched:
            dv_file = DeletionVectorFile.new()
            for file, (old, new) in touched.items():
                actions += _regrown(live_adds[file], dv_file.add(np.union1d(old, new)), now)
            target = os.path.join(path, dv_file.name)
            with open(target, "xb") as out:
                out.write(dv_file.body)
            written.append(target)
        if inserts.num_rows:
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            target = os.path.join(path, name)
            written.append(target)
            actions.append({"add": _write_file(target, name, inserts, schema, now)})
        n_matched = int(hit.sum())
        n_deleted = int((hit & deleted).sum())
        n_inserted = int(inserts.num_rows) - (n_matched - n_deleted)
        metrics = {
            "numSourceRows": str(rows.num_rows),
            "numTargetRowsInserted": str(n_inserted),
            "numTargetRowsUpdated": str(n_matched - n_deleted),
            "numTargetRowsDeleted": str(n_deleted),
            "numTargetDeletionVectorsAdded": str(len(touched)),
            "numTargetFilesAdded": str(1 if inserts.num_rows else 0),
            "numTargetFilesRemoved": "0",
            "executionTimeMs": str(int((time.monotonic() - started) * 1000)),
        }
        head = [
            _commit_info(cat, version, metrics, now),
            {"txn": {"appId": app_id, "version": batch, "lastUpdated": now}},
        ]
        _commit_on_driver(path, version + 1, head + actions)
    except FileExistsError:
        # Another writer took the version: Spark's MERGE retries against it.
        log.info("%s: version %d was written meanwhile; MERGE left to Spark", cat.name, version + 1)
        for target in written:
            if os.path.exists(target):
                os.remove(target)
        return None
    _checkpoint(path, version + 1, table.metadata().configuration)
    log.debug(
        "%s: driver MERGE of %d rows in %.3fs (%d files got deletion vectors)",
        cat.name,
        rows.num_rows,
        time.monotonic() - started,
        len(touched),
    )
    return WriteResult(version + 1, metrics)


def _regrown(add: dict[str, Any], vector: dict[str, Any], now: int) -> list[dict[str, Any]]:
    """The actions that give a live file (its ``add``) a grown deletion vector: remove the
    logical file it is (path and old vector), add it back with the new one. Its statistics
    stay, no longer tight (they count the deleted rows too)."""
    grown = dict(add) | {"deletionVector": vector, "dataChange": True}
    if add.get("stats"):
        grown["stats"] = json.dumps(json.loads(add["stats"]) | {"tightBounds": False})
    remove = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": add.get("partitionValues") or {},
        "size": add["size"],
    }
    for name in ("deletionVector", "stats", "tags"):
        if add.get(name) is not None:
            remove[name] = add[name]
    return [{"remove": remove}, {"add": grown}]


def _commit_info(
    cat: TableCatalog, version: int, metrics: dict[str, str], now: int
) -> dict[str, Any]:
    """The commit's ``commitInfo``, shaped as Spark's MERGE writes it (history readers)."""
    return {
        "commitInfo": {
            "timestamp": now,
            "operation": "MERGE",
            "operationParameters": {
                "predicate": json.dumps([f"replica identity {cat.key_columns}"]),
                "matchedPredicates": json.dumps(
                    [{"actionType": "delete"}, {"actionType": "update"}]
                ),
                "notMatchedPredicates": json.dumps([{"actionType": "insert"}]),
            },
            "readVersion": version,
            "isolationLevel": "Serializable",
            "isBlindAppend": False,
            "operationMetrics": metrics,
            "engineInfo": DRIVER_ENGINE,
        }
    }


def _find(
    path: str, table: Any, rows: pa.Table, cat: TableCatalog, physical: dict[str, str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per data file (its log path), the row positions whose key one of ``rows`` has, and
    which row of ``rows`` each matched; live or not (deletion vectors are applied later)."""
    import pyarrow as pa

    types = dict(cat.columns)
    keys = rows.column("_key").combine_chunks()
    source: dict[str, Any] = {}
    conds = []
    for i, k in enumerate(cat.key_columns):
        source[f"k{i}"] = keys.field(k)
        conds.append(f't.{_ident(physical[k])} IS NOT DISTINCT FROM s."k{i}"')
        if types.get(k) != "string" and cat.may_fall_back(k):
            source[f"f{i}"] = keys.field("~" + k)
            conds.append(
                f't.{_ident(physical["_fallback"])}[{_string(k)}] IS NOT DISTINCT FROM s."f{i}"'
            )
    source["_s"] = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    files = _candidates(table, physical[cat.key_columns[0]], source["k0"])
    if not files:
        return {}
    by_abs = {os.path.join(path, unquote(f)): f for f in files}
    con = _duckdb().cursor()
    try:
        con.register("src", pa.table(source))
        found = con.execute(
            f"SELECT t.filename, t.file_row_number, s._s FROM read_parquet($files, "
            f"filename = true, file_row_number = true) t JOIN src s ON {' AND '.join(conds)}",
            {"files": list(by_abs)},
        ).fetch_arrow_table()
    finally:
        con.close()
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if found.num_rows == 0:
        return out
    found = found.sort_by("filename")
    names = found.column("filename").to_numpy(zero_copy_only=False)
    positions = found.column("file_row_number").to_numpy().astype(np.int64)
    sources = found.column("_s").to_numpy()
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    ends = np.r_[starts[1:], len(names)]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        out[by_abs[names[a]]] = (positions[a:b], sources[a:b])
    return out


@cache
def _duckdb() -> Any:
    """One in-memory DuckDB per process; each MERGE takes a cursor of its own (threads)."""
    import duckdb

    return duckdb.connect()


def _candidates(table: Any, key_physical: str, values: pa.Array) -> list[str]:
    """The table's data files whose statistics of the first key column may hold one of
    ``values``; every file whose statistics say nothing, or whose key type's statistics
    may be truncated (timestamps lose their microseconds in Spark's) or are not ordered
    as written (floats, decimals)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    adds = pa.table(table.get_add_actions(flatten=True))
    paths = np.asarray(adds.column("path").to_pylist(), dtype=object)
    lo_name, hi_name = f"min.{key_physical}", f"max.{key_physical}"
    t = values.type
    prunable = pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    if not prunable or lo_name not in adds.column_names or hi_name not in adds.column_names:
        return paths.tolist()
    if values.null_count or len(values) == 0:
        return paths.tolist()  # a NULL key would need nullCount: not worth it, scan all
    try:
        lo = adds.column(lo_name).cast(t)
        hi = adds.column(hi_name).cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return paths.tolist()
    valid = pc.and_(pc.is_valid(lo), pc.is_valid(hi))
    known = valid.to_numpy(zero_copy_only=False)
    ordered = np.sort(values.to_numpy(zero_copy_only=False))
    los = lo.filter(valid).to_numpy(zero_copy_only=False)
    his = hi.filter(valid).to_numpy(zero_copy_only=False)
    keep = ~known
    if len(los):
        at = np.searchsorted(ordered, los, side="left")
        inside = at < len(ordered)
        hit = np.zeros(len(los), dtype=bool)
        hit[inside] = ordered[at[inside]] <= his[inside]
        keep[known] = hit
    return paths[keep].tolist()


def _live_adds(path: str, version: int, files: set[str]) -> dict[str, dict[str, Any]]:
    """The ``add`` actions that put ``files`` (live at ``version``) in the table: the newest
    of each in the log's JSON entries back to the last checkpoint, else the checkpoint's."""
    import pyarrow.parquet as pq

    log_dir = os.path.join(path, "_delta_log")
    checkpoints: dict[int, list[str]] = {}
    for name in os.listdir(log_dir):
        head, _, rest = name.partition(".checkpoint")
        if rest.endswith(".parquet") and head.isdigit() and int(head) <= version:
            checkpoints.setdefault(int(head), []).append(os.path.join(log_dir, name))
    since = max(checkpoints, default=-1)
    found: dict[str, dict[str, Any]] = {}
    for v in range(version, since, -1):
        with open(os.path.join(log_dir, f"{v:020d}.json"), encoding="utf-8") as entry:
            for line in entry:
                if not line.startswith('{"add"'):
                    continue
                add = json.loads(line)["add"]
                if add["path"] in files and add["path"] not in found:
                    found[add["path"]] = add
        if len(found) == len(files):
            return found
    if since >= 0:
        import pyarrow.compute as pc

        adds = pq.read_table(checkpoints[since], columns=["add"]).column("add")
        adds = adds.filter(pc.is_valid(adds))
        for add in adds.to_pylist():
            if add["path"] in files and add["path"] not in found:
                found[add["path"]] = _from_checkpoint(add)
    missing = files - set(found)
    if missing:
        raise LookupError(
            f"Delta table {path}: no add action for live file(s) {sorted(missing)[:3]} "
            f"at version {version}"
        )
    return found


def _from_checkpoint(add: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``add`` row as its JSON action (maps are lists of pairs in Arrow)."""
    out: dict[str, Any] = {}
    for name, value in add.items():
        if value is None or name == "stats_parsed":
            continue
        if name in ("partitionValues", "tags") and isinstance(value, list):
            value = dict(value)
        if name == "deletionVector":
            value = {k: v for k, v in value.items() if v is not None}
        out[name] = value
    return out


def _write_file(
    target: str, name: str, rows: pa.Table, schema: StructType, now: int
) -> dict[str, Any]:
    """``rows`` as a new data file of the table (physical names, field ids); its ``add``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slotlake.decode import arrow_schema_for

    logical = arrow_schema_for(schema)
    fields = []
    columns = []
    for f, delta_field in zip(logical, schema.fields, strict=True):
        meta = delta_field.metadata
        fid = meta.get(_FIELD_ID)
        fields.append(
            pa.field(
                meta.get(_PHYSICAL, f.name),
                f.type,
                f.nullable,
                {b"PARQUET:field_id": str(fid).encode()} if fid is not None else None,
            )
        )
        if f.name in rows.column_names:
            columns.append(rows.column(f.name).cast(f.type))
        else:  # a column the rows do not carry (none today): NULL, as a MERGE would insert
            columns.append(pa.nulls(rows.num_rows, f.type))
    data = pa.Table.from_arrays(columns, schema=pa.schema(fields))
    pq.write_table(data, target, compression="snappy")
    return {
        "path": name,
        "partitionValues": {},
        "size": os.path.getsize(target),
        "modificationTime": now,
        "dataChange": True,
        "stats": json.dumps(_stats(data)),
    }


def _stats(data: pa.Table) -> dict[str, Any]:
    """Delta file statistics of a new file: row count, nulls, and min/max where Delta's
    readers compare them as written (integers, dates, short strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in data.schema:
        col = data.column(f.name)
        t = f.type
        if pa.types.is_nested(t):
            continue
        nulls[f.name] = col.null_count
        if col.null_count == len(col):
            continue
        if pa.types.is_integer(t) or pa.types.is_date32(t):
            mm = pc.min_max(col)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            if pc.max(pc.utf8_length(col)).as_py() > _STRING_STATS_MAX:
                continue
            mm = pc.min_max(col)
        else:
            continue
        low, high = mm["min"].as_py(), mm["max"].as_py()
        if pa.types.is_date32(t):
            low, high = low.isoformat(), high.isoformat()
        mins[f.name], maxs[f.name] = low, high
    return {"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _checkpoint(path: str, version: int, config: dict[str, str]) -> None:
    """A checkpoint at the table's interval, as Delta's writers leave one (readers replay
    the log from the newest checkpoint)."""
    interval = int(config.get("delta.checkpointInterval", "10"))
    if version % interval == 0:
        open_local(path).create_checkpoint()


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
