"""A keyed state's MERGE on the driver: no Spark, no delta-rs.

A big state (past ``lake.driver_write_state_mb``) took Spark's MERGE even when the batch's
rows were done on the driver, because ``deltalake``'s MERGE rewrites every file a key hits
(random keys hit them all) and cannot write deletion vectors (delta-rs issue #4512).
Measured on the 2-core machine: 9.9 s for 10k changes on a 5M-row table, of which the MERGE
proper (scan for matches, a shuffle of the touched files, the vectors, a snapshot) ~6.5 s
and Spark's scheduling the rest. A small state paid delta-rs's fixed cost instead (~18 ms
a MERGE of a few rows, most of a small table's batch). Yet a MERGE by replica identity in a
table whose keys are unique is three simple steps, which the driver does here in one
Delta commit (the log read and written by :mod:`slotlake.delta_log`):

1. **find** the live rows whose key is one of the batch's final rows' keys: the files whose
   key statistics may hold one (Delta's data skipping), their key columns only, joined in
   DuckDB (``IS NOT DISTINCT FROM``, the Spark MERGE's condition) with their row positions
   (``file_row_number``); rows an earlier deletion vector removed do not count;
2. **delete** them: touched files of a few MB in all are rewritten without those rows
   (copy on write: a small state stays one file); bigger ones are re-added each with its
   deletion vector grown by them (:mod:`slotlake.deletion_vector` reads the old vector
   and writes the new one), as Spark's MERGE with deletion vectors writes it;
3. **insert** the final rows that are not deletions, in the same new Parquet file.

The commit carries the batch's (txnAppId, txnVersion) like every other write and is
put-if-absent on the next version: a table written meanwhile makes this return None and
the caller hands the rows to delta-rs or Spark, which resolve conflicts. Tables whose
protocol asks a writer for more than this knows (row tracking, change data feed, check
constraints, column mapping by id, partitions) go there too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from slotlake import deletion_vector, delta_log, durability
from slotlake.deletion_vector import DeletionVectorFile
from slotlake.delta import WriteResult, local_snapshot, remember
from slotlake.local_table import conform_arrow

if TYPE_CHECKING:
    import pyarrow as pa

    from slotlake.catalog import TableCatalog
    from slotlake.delta_log import Snapshot

log = logging.getLogger(__name__)

# Touched files up to this many bytes are rewritten without the matched rows (copy on
# write: a small state stays one file); bigger ones get deletion vectors instead.
REWRITE_BYTES = 4 << 20
# A MERGE by deletion vectors looks for a one-column key in at most this many files left
# after the key indexes (a big table's newest, small files) with Arrow, reading their key
# column, rather than with DuckDB's join. Measured (files of 9k rows, an integer key):
# Arrow 0.8 ms a file; DuckDB 2.4 ms for one file, 2.9 for four, 4.4 for sixteen (its
# scan runs on every core). A process that never needs DuckDB also never imports it
# (~36 ms once: the import 29, the connection 7): a run a process, a scheduler's.
ARROW_FIND_FILES = 3
# Spark's names of the key types :mod:`slotlake.key_index` indexes (uuid is a string).
_INDEXED_TYPES = frozenset({"byte", "short", "integer", "long", "string"})


def unsupported(snap: Snapshot) -> str | None:
    """Why this table's MERGE cannot be done here (None: it can)."""
    return delta_log.unwritable(snap, deletes=True)


def vectors_allowed(snap: Snapshot) -> bool:
    """Whether the table takes deletion vectors (its protocol and its property)."""
    return (
        "deletionVectors" in (snap.protocol.get("writerFeatures") or [])
        and snap.configuration.get("delta.enableDeletionVectors") == "true"
    )


def merge_keyed(
    path: str,
    rows: pa.Table,
    cat: TableCatalog,
    app_id: str,
    batch: int,
    deletion_vectors: bool = True,
    rewrite_up_to: int | None = None,
    fresh: np.ndarray | None = None,
) -> WriteResult | None:
    """MERGE ``rows`` (a keyed table's final rows: the state's columns, ``_key`` and
    ``_deleted``) into the state at a local ``path`` as batch ``batch``; None, having
    written nothing the table refers to, when another writer must do it.

    The files the keys hit are rewritten without their matched rows when they hold at
    most ``rewrite_up_to`` bytes together, or when ``deletion_vectors`` is off or the
    table does not take them; otherwise each gets a deletion vector (None: the module's
    ``REWRITE_BYTES``). ``fresh``: the rows whose key must not be live in the state (a
    multiset kept unique on the key, :mod:`slotlake.unique_multiset`); one that is
    raises :class:`slotlake.unique_multiset.Broken` before anything is written."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        snap = local_snapshot(path, files=True)
    except LookupError as exc:  # a log this reader does not follow: the caller's writer will
        log.warning("%s: state MERGE left to another writer (%s)", cat.name, exc)
        return None
    why = unsupported(snap)
    if why is not None:
        log.info("%s: state MERGE left to another writer (%s)", cat.name, why)
        return None
    if rewrite_up_to is None:
        rewrite_up_to = REWRITE_BYTES
    started = time.monotonic()
    version = snap.version
    if rows.num_rows == 0:
        # Nothing to MERGE: no commit (as deltalake's MERGE path), a rerun does nothing too.
        return WriteResult(version, {"numTargetRowsInserted": "0", "numTargetRowsDeleted": "0"})
    assert snap.files is not None
    schema = snap.schema
    physical = {f.name: f.metadata.get(delta_log.PHYSICAL, f.name) for f in schema.fields}
    deleted = rows.column("_deleted").to_numpy(zero_copy_only=False)

    opened: dict[str, pa.Table] | None = {} if snap.file_bytes() <= rewrite_up_to else None
    matches = _find(path, snap, rows, cat, physical, opened)
    old_dvs = {
        file: deletion_vector.read(path, snap.files[file]["deletionVector"])
        for file in matches
        if snap.files[file].get("deletionVector")
    }
    touched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    hit = np.zeros(rows.num_rows, dtype=bool)
    for file, (positions, sources) in matches.items():
        old = old_dvs.get(file, np.empty(0, dtype=np.int64))
        live = ~deletion_vector.isin_positions(positions, old)
        if live.any():
            hit[sources[live]] = True
            touched[file] = (old, positions[live])
    if fresh is not None and bool(np.any(hit & fresh)):
        from slotlake.unique_multiset import Broken

        raise Broken(f"{int(np.sum(hit & fresh))} row(s) added whose key is live in the state")
    inserts = rows.filter(pc.invert(rows.column("_deleted")))
    inserts = inserts.drop_columns([c for c in ("_key", "_deleted") if c in inserts.column_names])
    new_rows = delta_log.physical_table(inserts, schema)
    rewrite = (
        not deletion_vectors
        or not vectors_allowed(snap)
        or sum(int(snap.files[f]["size"]) for f in touched) <= rewrite_up_to
    )

    now = delta_log.now_ms()
    written: list[str] = []
    adds: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    try:
        if rewrite:
            kept = [
                _survivors(
                    path, snap.files[f], deletion_vector.union(old, new), new_rows.schema, opened
                )
                for f, (old, new) in touched.items()
            ]
            actions += [delta_log.removal(snap.files[f], now) for f in touched]
            new_rows = pa.concat_tables([*kept, new_rows])
        elif touched:
            dv_file = DeletionVectorFile.new()
            for file, (old, new) in touched.items():
                actions += _regrown(
                    snap.files[file], dv_file.add(deletion_vector.union(old, new)), now
                )
            target = os.path.join(path, dv_file.name)
            with open(target, "xb") as out:
                out.write(dv_file.body)
            written.append(target)
            durability.written(target)
        if new_rows.num_rows:
            adds = delta_log.write_files(path, new_rows, now)
            actions += [{"add": a} for a in adds]
        n_matched = int(hit.sum())
        n_deleted = int((hit & deleted).sum())
        n_inserted = int(inserts.num_rows) - (n_matched - n_deleted)
        metrics = {
            "numSourceRows": str(rows.num_rows),
            "numTargetRowsInserted": str(n_inserted),
            "numTargetRowsUpdated": str(n_matched - n_deleted),
            "numTargetRowsDeleted": str(n_deleted),
            "numTargetDeletionVectorsAdded": str(0 if rewrite else len(touched)),
            "numTargetFilesAdded": str(len(adds)),
            "numTargetFilesRemoved": str(len(touched) if rewrite else 0),
            "executionTimeMs": str(int((time.monotonic() - started) * 1000)),
        }
        head = [_commit_info(cat, version, metrics, now), delta_log.txn(app_id, batch, now)]
        after = delta_log.commit(snap, head + actions)
    except FileExistsError:
        # Another writer took the version: the caller's writer retries against it.
        log.info(
            "%s: version %d was written meanwhile; MERGE left to another writer",
            cat.name,
            version + 1,
        )
        delta_log.remove_files(path, adds)
        for target in written:
            if os.path.exists(target):
                os.remove(target)
        return None
    remember(after)
    log.debug(
        "%s: driver MERGE of %d rows in %.3fs (%d files %s)",
        cat.name,
        rows.num_rows,
        time.monotonic() - started,
        len(touched),
        "rewritten" if rewrite else "got deletion vectors",
    )
    return WriteResult(after.version, metrics)


def _survivors(
    path: str,
    add: dict[str, Any],
    gone: np.ndarray,
    target: pa.Schema,
    opened: dict[str, pa.Table] | None,
) -> pa.Table:
    """A data file's rows but those at ``gone`` (its old vector's and the matched ones)."""

    read = (opened or {}).get(add["path"])
    if read is None:
        read = delta_log.read_data_file(os.path.join(path, unquote(add["path"])))
    keep = np.ones(read.num_rows, dtype=bool)
    keep[gone] = False
    return conform_arrow(read.filter(keep), target)


def _regrown(add: dict[str, Any], vector: dict[str, Any], now: int) -> list[dict[str, Any]]:
    """The actions that give a live file (its ``add``) a grown deletion vector: remove the
    logical file it is (path and old vector), add it back with the new one. Its statistics
    stay, no longer tight (they count the deleted rows too)."""
    grown = dict(add) | {"deletionVector": vector, "dataChange": True}
    if add.get("stats"):
        grown["stats"] = json.dumps(json.loads(add["stats"]) | {"tightBounds": False})
    return [delta_log.removal(add, now), {"add": grown}]


def merge_predicate(key_columns: Sequence[str]) -> str:
    """The ``predicate`` parameter of a MERGE here, as its ``commitInfo`` records it."""
    return json.dumps([f"replica identity {list(key_columns)}"])


def _commit_info(
    cat: TableCatalog, version: int, metrics: dict[str, str], now: int
) -> dict[str, Any]:
    """The commit's ``commitInfo``, shaped as Spark's MERGE writes it (history readers)."""
    parameters = {
        "predicate": merge_predicate(cat.key_columns),
        "matchedPredicates": json.dumps([{"actionType": "delete"}, {"actionType": "update"}]),
        "notMatchedPredicates": json.dumps([{"actionType": "insert"}]),
    }
    return delta_log.commit_info(version, "MERGE", now, parameters, metrics)


def _find(
    path: str,
    snap: Snapshot,
    rows: pa.Table,
    cat: TableCatalog,
    physical: dict[str, str],
    opened: dict[str, pa.Table] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per data file (its log path), the row positions whose key one of ``rows`` has, and
    which row of ``rows`` each matched; live or not (deletion vectors are applied later).

    ``opened``: the state is small; its candidate files are read whole into it (the
    rewrite needs them) and a one-column key is looked up in Arrow, which costs a
    fraction of a DuckDB query's fixed cost."""
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
    files = _candidates(snap, physical[cat.key_columns[0]], source["k0"])
    if not files:
        return {}
    # No key value kept as _fallback text: the key columns alone decide.
    plain = not any(f"f{i}" in source for i in range(len(cat.key_columns)))
    one_plain_key = len(cat.key_columns) == 1 and plain
    if opened is not None and one_plain_key and _arrow_key(source["k0"].type):
        found_in_arrow = _find_in_arrow(
            path, files, physical[cat.key_columns[0]], source["k0"], opened
        )
        if found_in_arrow is not None:
            return found_in_arrow
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if plain and opened is None:
        files, out = _find_in_indexes(
            path,
            snap,
            files,
            [physical[k] for k in cat.key_columns],
            [source[f"k{i}"] for i in range(len(cat.key_columns))],
        )
        if not files:
            return out
        if one_plain_key and len(files) <= ARROW_FIND_FILES and _arrow_key(source["k0"].type):
            found_in_arrow = _find_in_arrow(
                path, files, physical[cat.key_columns[0]], source["k0"], None
            )
            if found_in_arrow is not None:
                return {**out, **found_in_arrow}
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


def make_key_indexes(path: str, key_columns: Sequence[str]) -> int:
    """Make the key indexes a MERGE here would make (:mod:`slotlake.key_index`) for every
    live file of at least ``key_index.AHEAD_MIN_ROWS`` rows of the local state at
    ``path``; how many of them have one. For the bootstrap and ``slotlake maintain``
    (whose OPTIMIZE writes new files): the next batch then finds them made instead of
    paying ~0.1 s a million rows itself (packed keys more), once a file (a table of 500M
    rows: about a minute). A state with a key column of another type than integer or
    text gets none. The indexes are a cache: one not made is a warning (the next MERGE
    makes it, or reads the file)."""
    from slotlake import key_index

    if not key_columns:
        return 0
    try:
        snap = delta_log.snapshot(path, files=True)
        fields = {f.name: f for f in snap.schema.fields}
        if any(
            k not in fields or fields[k].dataType.typeName() not in _INDEXED_TYPES
            for k in key_columns
        ):
            return 0
        physical = [fields[k].metadata.get(delta_log.PHYSICAL, k) for k in key_columns]
        assert snap.files is not None
        return sum(
            key_index.load(path, add, physical, key_index.AHEAD_MIN_ROWS) is not None
            for add in snap.files.values()
        )
    except Exception as exc:
        log.warning("key indexes of %s not made: %s: %s", path, type(exc).__name__, exc)
        return 0


def _find_in_indexes(
    path: str, snap: Snapshot, files: list[str], columns: list[str], values: list[pa.Array]
) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """:func:`_find` in the files of a key of integer and text ``columns`` (physical
    names; the batch's key ``values`` of each) through their key indexes
    (:mod:`slotlake.key_index`): the files left to DuckDB, and what was found."""
    from slotlake import key_index

    if any(v.null_count or not key_index.indexable(v.type) for v in values):
        return files, {}
    assert snap.files is not None
    lookup = key_index.Lookup(values)
    rest: list[str] = []
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f in files:
        index = key_index.load(path, snap.files[f], columns)
        found = None if index is None else lookup.find(index)
        if found is None:
            rest.append(f)
        elif len(found[0]):
            out[f] = found
    return rest, out


def _arrow_key(t: pa.DataType) -> bool:
    """Key types whose equality in Arrow's ``index_in`` is the MERGE condition's."""
    import pyarrow as pa

    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date32(t)
        or pa.types.is_binary(t)
    )


def _find_in_arrow(
    path: str,
    files: list[str],
    key: str,
    values: pa.Array,
    opened: dict[str, pa.Table] | None,
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """:func:`_find` for a one-column key in small files, read whole into ``opened`` (or,
    without it, their key column only); None when a file's key column does not cast to
    the rows' key type (DuckDB then)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f in files:
        file = os.path.join(path, unquote(f))
        if opened is None:
            table = delta_log.read_data_file(file, columns=[key])
        else:
            table = opened[f] = delta_log.read_data_file(file)
        try:
            column = table.column(key).cast(values.type)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        # skip_nulls=False: a NULL key matches a NULL key (IS NOT DISTINCT FROM).
        at = pc.index_in(column, value_set=values, skip_nulls=False)
        hit = pc.is_valid(at).to_numpy(zero_copy_only=False)
        if hit.any():
            out[f] = (
                np.flatnonzero(hit).astype(np.int64),
                pc.filter(at, hit).to_numpy(zero_copy_only=False).astype(np.int64),
            )
    return out


@cache
def _duckdb() -> Any:
    """One in-memory DuckDB per process; each MERGE takes a cursor of its own (threads)."""
    import duckdb

    return duckdb.connect()


def _candidates(snap: Snapshot, key_physical: str, values: pa.Array) -> list[str]:
    """The table's data files whose statistics of the first key column may hold one of
    ``values``; every file whose statistics say nothing, or whose key type's statistics
    may be truncated (timestamps lose their microseconds in Spark's) or are not ordered
    as written (floats, decimals)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert snap.files is not None
    paths = np.asarray(list(snap.files), dtype=object)
    t = values.type
    prunable = pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    if not prunable or values.null_count or len(values) == 0:
        return paths.tolist()  # a NULL key would need nullCount: not worth it, scan all
    lows, highs = [], []
    for add in snap.files.values():
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        lows.append((stats.get("minValues") or {}).get(key_physical))
        highs.append((stats.get("maxValues") or {}).get(key_physical))
    try:
        lo = pa.array(lows).cast(t)
        hi = pa.array(highs).cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
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


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
