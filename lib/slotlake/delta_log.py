"""A local Delta table's log, read and extended by the driver without delta-rs.

A batch that touches many small tables paid delta-rs's fixed costs per table: measured on
the spread benchmark (10k changes over 100 tables, 2-core machine), 89 % of the driver's
time per table went to opening the change log and the state (~2.5 ms each alone), their
txn reads, ``write_deltalake`` (~13 ms) and ``merge`` (~18 ms) — planning, an object
store and a log replay for files of a few kilobytes. What the driver's writes need from a
log is small: the protocol, the metadata, each writer's txn version and, for a MERGE, the
live files. This module reads exactly that and commits new entries itself:

* **read** (:func:`snapshot`): the newest complete classic checkpoint (one Parquet file
  or all its parts, only the columns asked for) and the JSON entries after it, which must
  follow it without a gap — found from ``_last_checkpoint`` by opening the next entries
  in turn, or by one listing of ``_delta_log`` where that hint cannot be used. A log this reader does not follow
  (V2 checkpoints, a missing entry, a table feature with rules it does not know) raises
  :class:`LookupError` or is refused by :func:`unwritable`; the caller then goes through
  delta-rs as before.
* **write** (:func:`commit`): one JSON entry put-if-absent on the next version, as every
  Delta writer commits; a version taken meanwhile raises :class:`FileExistsError` and the
  caller retries through delta-rs, which resolves conflicts. A classic checkpoint is left
  once every interval of the table's versions, at a phase of its own
  (:func:`checkpoint_phase`: the lake's tables do not all pay theirs in one batch),
  written from the log by :mod:`slotlake.delta_checkpoint` in delta-rs's columns (by
  delta-rs itself where that writer does not follow the log).

Data files are written with the table's physical column names and field ids
(:func:`physical_table`) and Delta statistics (:func:`file_stats`), so Spark, delta-rs
and DuckDB read them as their own. Within :func:`slotlake.delta.reusing_local_tables` a
snapshot is read once per table and batch and advanced by the commits made through it;
between batches :func:`slotlake.delta.local_snapshot` keeps it and reads the entries
written since (:func:`advance`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from slotlake import durability, schema_memo, table_processes
from slotlake.delta import DRIVER_ENGINE, _commit_on_driver, _struct_from_json, open_local

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

PHYSICAL = "delta.columnMapping.physicalName"
FIELD_ID = "delta.columnMapping.id"
# Writer features whose duties a commit of adds, removes and a txn fulfils as written here.
SAFE_WRITER_FEATURES = frozenset(
    {"columnMapping", "deletionVectors", "timestampNtz", "appendOnly", "invariants"}
)
# Stats Delta's readers skip files with: integers, dates and strings whose bounds are short
# (a longer bound would need Spark's truncation rules for a max that stays an upper bound).
STRING_STATS_MAX = 32
# One data file holds at most about this much of a write (delta-rs rolls at ~100 MB too).
FILE_BYTES = 128 << 20
# Files of at most this much are encoded in memory and written with one call.
SMALL_FILE_BYTES = 8 << 20
# Files of fewer rows are written without dictionary encoding.
DICTIONARY_FROM_ROWS = 2048


@dataclass(frozen=True)
class Snapshot:
    """A version of a local Delta table as the log gives it."""

    path: str
    version: int
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    txns: dict[str, int]
    # Live data files (log path → add action); None when not read.
    files: dict[str, dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def configuration(self) -> dict[str, str]:
        return self.metadata.get("configuration") or {}

    @cached_property
    def schema(self) -> StructType:
        return _struct_from_json(self.metadata["schemaString"])

    def file_bytes(self) -> int:
        assert self.files is not None, "snapshot read without files"
        return sum(int(a.get("size") or 0) for a in self.files.values())


def _names(log_dir: str) -> tuple[list[int], dict[int, list[str]]]:
    """The log's JSON versions, and its complete classic checkpoints (version → files)."""
    versions, checkpoints = log_names(os.listdir(log_dir))
    return versions, {v: [os.path.join(log_dir, p) for p in ps] for v, ps in checkpoints.items()}


def log_names(names: Iterable[str]) -> tuple[list[int], dict[int, list[str]]]:
    """Of a ``_delta_log`` directory's file names: its JSON versions, in order, and its
    complete classic checkpoints (version → the names of its parts, in order)."""
    versions: list[int] = []
    parts: dict[int, dict[int, str]] = {}
    wanted: dict[int, int] = {}
    for name in names:
        head = name[:20]
        if not head.isdigit():
            continue
        rest = name[20:]
        if rest == ".json":
            versions.append(int(head))
        elif rest == ".checkpoint.parquet":
            parts.setdefault(int(head), {})[1] = name
            wanted[int(head)] = 1
        elif rest.startswith(".checkpoint.") and rest.endswith(".parquet"):
            bits = rest[len(".checkpoint.") : -len(".parquet")].split(".")
            if len(bits) == 2 and all(b.isdigit() for b in bits):  # part i of n
                parts.setdefault(int(head), {})[int(bits[0])] = name
                wanted[int(head)] = int(bits[1])
            # else: a V2 checkpoint (uuid-named): found through the protocol's feature
    checkpoints = {v: [p[i] for i in sorted(p)] for v, p in parts.items() if len(p) == wanted[v]}
    return sorted(versions), checkpoints


def has_log(path: str) -> bool:
    """Whether a local table has a log entry or checkpoint: a creation cut short (the log
    directory made, its first entry not linked yet) or undone (slotlake.durability's
    repair) leaves an empty ``_delta_log``, which is no table yet."""
    log_dir = os.path.join(path, "_delta_log")
    # Two stats for nearly every table (a log of a month of batches is thousands of
    # entries to list): its first entry, or the checkpoint hint once cleanup removed it.
    if os.path.exists(os.path.join(log_dir, f"{0:020d}.json")) or os.path.exists(
        os.path.join(log_dir, "_last_checkpoint")
    ):
        return True
    try:
        return any(name[:20].isdigit() for name in os.listdir(log_dir))
    except (FileNotFoundError, NotADirectoryError):
        return False


def _from_hint(log_dir: str) -> tuple[int, list[str], list[int]] | None:
    """The checkpoint ``_last_checkpoint`` names and the entries that follow it, found by
    opening them in turn instead of listing a log of thousands of entries (a month of
    batches); None when the hint is missing or its checkpoint is not there, or when no
    entry follows it (the caller then lists: a stale hint whose next entries log cleanup
    removed would otherwise pass for the latest version; cleanup removes the oldest
    entries first, so one that follows the hint means none after it is missing)."""
    try:
        with open(os.path.join(log_dir, "_last_checkpoint"), encoding="utf-8") as f:
            hint = json.loads(f.read())
        since = int(hint["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "v2Checkpoint" in hint:
        raise LookupError(f"{log_dir}: V2 checkpoints")
    n = int(hint.get("parts") or 0)
    names = (
        [f"{since:020d}.checkpoint.{i:010d}.{n:010d}.parquet" for i in range(1, n + 1)]
        if n
        else [f"{since:020d}.checkpoint.parquet"]
    )
    parts = [os.path.join(log_dir, name) for name in names]
    if not all(os.path.exists(p) for p in parts):
        return None
    tail = _entries_after(log_dir, since)
    return (since, parts, tail) if tail else None


def _entries_after(log_dir: str, version: int, limit: int | None = None) -> list[int] | None:
    """The versions of the JSON entries that follow ``version`` without a gap, found by
    opening them in turn (no listing); None when more than ``limit`` follow."""
    after: list[int] = []
    while os.path.exists(os.path.join(log_dir, f"{version + len(after) + 1:020d}.json")):
        if limit is not None and len(after) == limit:
            return None
        after.append(version + len(after) + 1)
    return after


def replay_plan(
    path: str, versions: list[int], checkpoints: dict[int, Any], version: int | None
) -> tuple[int, list[int]]:
    """The checkpoint (its version, -1 for none) and the JSON entries after it that make
    the table's latest version, or ``version``, of the log's ``versions`` and
    ``checkpoints`` (:func:`log_names`). FileNotFoundError: no table; LookupError: that
    version's entries are no longer kept, or some after the checkpoint are missing."""
    if version is not None:
        versions = [v for v in versions if v <= version]
        checkpoints = {v: p for v, p in checkpoints.items() if v <= version}
    since = max(checkpoints, default=-1)
    tail = [v for v in versions if v > since]
    latest = tail[-1] if tail else since
    if latest < 0 and version is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    if version is not None and latest != version:
        raise LookupError(f"Delta table {path}: version {version} is not in its log")
    if tail and tail != list(range(since + 1, latest + 1)):
        raise LookupError(f"Delta table {path}: log entries missing after version {since}")
    return since, tail


def snapshot(path: str, files: bool = False, version: int | None = None) -> Snapshot:
    """The table at a local ``path`` as of its latest version, or of ``version`` (time
    travel: the newest checkpoint at or before it and the entries up to it), with its
    live files too when ``files``. FileNotFoundError: no table there; LookupError: a log
    not followed here, or entries of ``version`` no longer kept."""
    log_dir = os.path.join(path, "_delta_log")
    hinted = _from_hint(log_dir) if version is None else None
    if hinted is not None:
        since, parts, tail = hinted
        checkpoints = {since: parts}
    else:
        versions, checkpoints = _names(log_dir)
        since, tail = replay_plan(path, versions, checkpoints, version)
    latest = tail[-1] if tail else since
    protocol: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    txns: dict[str, int] = {}
    live: dict[str, dict[str, Any]] | None = {} if files else None
    if since >= 0:
        _read_checkpoint(checkpoints[since], protocol, metadata, txns, live)
    for v in tail:
        _read_entry(log_dir, v, protocol, metadata, txns, live)
    if not protocol or not metadata:
        raise LookupError(f"Delta table {path}: no protocol or metadata at version {latest}")
    _check_followed(path, protocol)
    return Snapshot(path, latest, protocol, metadata, txns, live)


def advance(snap: Snapshot, limit: int) -> Snapshot | None:
    """``snap`` brought up to its table's latest version by the entries written after it,
    as Spark's ``DeltaLog.update`` does (``snap`` itself when there are none), or None when
    more than ``limit`` follow it (the newest checkpoint is then the shorter read).

    The caller knows ``snap``'s own entry is still the one it was read from. Log cleanup
    removes the oldest entries first, so with that entry kept every later one is too: the
    entries that follow it without a gap are all there is."""
    log_dir = os.path.join(snap.path, "_delta_log")
    versions = _entries_after(log_dir, snap.version, limit)
    if versions is None:
        return None
    if not versions:
        return snap
    protocol, metadata, txns = dict(snap.protocol), dict(snap.metadata), dict(snap.txns)
    live = dict(snap.files) if snap.files is not None else None
    for v in versions:
        _read_entry(log_dir, v, protocol, metadata, txns, live)
    _check_followed(snap.path, protocol)
    return replace(
        snap, version=versions[-1], protocol=protocol, metadata=metadata, txns=txns, files=live
    )


def _read_entry(
    log_dir: str,
    version: int,
    protocol: dict[str, Any],
    metadata: dict[str, Any],
    txns: dict[str, int],
    live: dict[str, dict[str, Any]] | None,
) -> None:
    for action in entry_actions(log_dir, version):
        _apply(action, protocol, metadata, txns, live)


def entry_actions(log_dir: str, version: int) -> Iterator[dict[str, Any]]:
    """The actions of the log entry ``version``, each as its JSON object."""
    with open(os.path.join(log_dir, f"{version:020d}.json"), encoding="utf-8") as entry:
        for line in entry:
            if line.strip():
                yield json.loads(line)


def _check_followed(path: str, protocol: dict[str, Any]) -> None:
    features = set(protocol.get("readerFeatures") or []) | set(protocol.get("writerFeatures") or [])
    if "v2Checkpoint" in features:
        raise LookupError(f"Delta table {path}: V2 checkpoints")


def _torn(path: str, entry: str) -> bool:
    """Whether a log entry is not whole: empty, a line that is not a JSON action, or a
    file it adds (data or deletion vector) missing or not of the size it says."""
    with open(entry, "rb") as f:
        data = f.read()
    if not data.strip():
        return True
    try:
        actions = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        return True
    if not all(isinstance(a, dict) for a in actions):
        return True
    return any(_not_whole(path, a["add"]) for a in actions if isinstance(a.get("add"), dict))


def _not_whole(path: str, add: dict[str, Any]) -> bool:
    from urllib.parse import unquote, urlparse

    from slotlake import deletion_vector

    where = add.get("path")
    if not isinstance(where, str):
        return True
    url = urlparse(where)
    if url.scheme and url.scheme != "file":
        return False  # not on this disk: not this repair's to judge
    data = unquote(url.path) if url.scheme else os.path.join(path, unquote(where))
    # (file, the size it must have, or at least have)
    files: list[tuple[str, int, bool]] = [(data, int(add.get("size", -1)), True)]
    dv = add.get("deletionVector")
    if isinstance(dv, dict) and dv.get("storageType") in ("u", "p"):
        vector = deletion_vector.descriptor_path(path, dv)
        if vector is not None:
            files.append((vector, int(dv.get("offset") or 0) + int(dv["sizeInBytes"]), False))
    for name, size, exact in files:
        try:
            have = os.path.getsize(name)
        except OSError:
            return True
        if have != size if exact else have < size:
            return True
    return False


def drop_torn_entries(path: str, after: int) -> list[int]:
    """Remove the local table's log entries after ``after`` from the first one that is not
    whole on disk, or adds a file that is not (what a power loss leaves of an unfinished
    batch's writes: slotlake.durability), with the checkpoints and checksums of those
    versions; the versions removed. Entries after a torn one were written on top of it,
    so they go too."""
    log_dir = os.path.join(path, "_delta_log")
    if not os.path.isdir(log_dir):
        return []
    versions, _ = _names(log_dir)
    torn = next(
        (v for v in versions if v > after and _torn(path, os.path.join(log_dir, f"{v:020d}.json"))),
        None,
    )
    if torn is None:
        return []
    gone = [v for v in versions if v >= torn]
    for name in os.listdir(log_dir):
        head = name[:20]
        if head.isdigit() and int(head) >= torn:
            os.unlink(os.path.join(log_dir, name))
    hint = os.path.join(log_dir, "_last_checkpoint")
    try:
        with open(hint, encoding="utf-8") as f:
            hinted = int(json.loads(f.read())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        hinted = None
    if hinted is not None and hinted >= torn:
        os.unlink(hint)  # readers list the log instead
    durability.fsync_path(log_dir)
    return gone


def _dv_id(action: dict[str, Any]) -> str | None:
    dv = action.get("deletionVector")
    if not dv:
        return None
    return f"{dv['storageType']}{dv['pathOrInlineDv']}@{dv.get('offset')}"


def _apply(
    action: dict[str, Any],
    protocol: dict[str, Any],
    metadata: dict[str, Any],
    txns: dict[str, int],
    live: dict[str, dict[str, Any]] | None,
) -> None:
    if "add" in action:
        if live is not None:
            live[action["add"]["path"]] = action["add"]
    elif "remove" in action:
        if live is not None:
            # A logical file is its path and its vector: a commit that re-adds a file with
            # a grown vector removes the old pair, in either order.
            gone = action["remove"]
            have = live.get(gone["path"])
            if have is not None and _dv_id(have) == _dv_id(gone):
                del live[gone["path"]]
    elif "txn" in action:
        txns[action["txn"]["appId"]] = int(action["txn"]["version"])
    elif "metaData" in action:
        metadata.clear()
        metadata.update(action["metaData"])
    elif "protocol" in action:
        protocol.clear()
        protocol.update(action["protocol"])


SMALL_CHECKPOINT_ROWS = 1000


def _read_checkpoint(
    parts: list[str],
    protocol: dict[str, Any],
    metadata: dict[str, Any],
    txns: dict[str, int],
    live: dict[str, dict[str, Any]] | None,
) -> None:
    wanted = ["protocol", "metaData", "txn"] + (["add"] if live is not None else [])
    for part in parts:
        for name, action in checkpoint_actions(part, wanted):
            _apply({name: action}, protocol, metadata, txns, live)


def checkpoint_actions(
    part: str, columns: list[str] | None = None, rows_max: int | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each action of a checkpoint file (of its ``columns``: action kinds; None: all) as
    (kind, its JSON form); LookupError when the file has more than ``rows_max`` rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # Opened once: a small table's checkpoint costs its opening more than its rows
    # (its schema read apart was a second opening, ~0.7 ms a table of every batch).
    with pq.ParquetFile(part, pre_buffer=False) as f:
        if rows_max is not None and f.metadata.num_rows > rows_max:
            raise LookupError(f"{part}: {f.metadata.num_rows} actions, more than {rows_max}")
        have = f.schema_arrow.names
        wanted = have if columns is None else [c for c in columns if c in have]
        table = f.read(columns=wanted, use_threads=False)
    for name in table.column_names:
        column = table.column(name)
        # Each action is one column's row, the others NULL. Filtering a nested column
        # costs ~0.1 ms whatever its rows: a small checkpoint's NULLs are skipped here.
        if table.num_rows > SMALL_CHECKPOINT_ROWS:
            column = column.filter(pc.is_valid(column))
        for row in column.to_pylist():
            if row is not None:
                yield name, _from_checkpoint(name, row)


def _from_checkpoint(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's action row as its JSON action (maps are lists of pairs in Arrow)."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if value is None or name == "stats_parsed" or name == "partitionValues_parsed":
            continue
        if name in ("partitionValues", "tags", "configuration", "options") and isinstance(
            value, list
        ):
            value = dict(value)
        elif name == "deletionVector":
            value = {k: v for k, v in value.items() if v is not None}
        elif name == "format":
            value = {k: dict(v) if isinstance(v, list) else v for k, v in value.items()}
        out[name] = value
    if kind == "metaData":
        out.setdefault("configuration", {})
        out.setdefault("partitionColumns", [])
    return out


def unwritable(snap: Snapshot, deletes: bool = False) -> str | None:
    """Why a commit of adds, a txn and (``deletes``) removes written here would break this
    table's protocol (None: it would not)."""
    if deletes and snap.configuration.get("delta.appendOnly") == "true":
        return "the table is append-only"
    protocol = snap.protocol
    writer = int(protocol.get("minWriterVersion", 0))
    if writer != 7 and writer > 2:
        return f"writer protocol {writer}"
    extra = set(protocol.get("writerFeatures") or []) - SAFE_WRITER_FEATURES
    if extra:
        return f"writer features {sorted(extra)}"
    if snap.configuration.get("delta.columnMapping.mode", "none") not in ("name", "none"):
        return f"column mapping mode {snap.configuration['delta.columnMapping.mode']}"
    if snap.metadata.get("partitionColumns"):
        return "partitioned"
    for f in snap.schema.fields:
        if "delta.invariants" in f.metadata:
            return f"column {f.name!r} has invariants"
    return None


def commit(snap: Snapshot, actions: list[dict[str, Any]]) -> Snapshot:
    """Write ``actions`` as the table's next version, put-if-absent (FileExistsError: a
    writer took it meanwhile); the snapshot after it. A checkpoint at the interval."""
    version = snap.version + 1
    _commit_on_driver(snap.path, version, actions)
    txns = dict(snap.txns)
    live = dict(snap.files) if snap.files is not None else None
    protocol, metadata = dict(snap.protocol), dict(snap.metadata)
    for action in actions:
        _apply(action, protocol, metadata, txns, live)
    after = replace(
        snap, version=version, protocol=protocol, metadata=metadata, txns=txns, files=live
    )
    interval = int(snap.configuration.get("delta.checkpointInterval", "10"))
    if checkpoint_due(snap.path, version, interval):
        checkpoint(snap.path, version)
    return after


# Whether the driver's checkpoints are staggered over the interval (tests that count on a
# checkpoint at a multiple of it turn it off).
STAGGER = True


def checkpoint_phase(path: str, interval: int) -> int:
    """The versions modulo ``interval`` at which the driver checkpoints the table at
    ``path``: set by its place in the lake (its last two path parts, as
    ``state/public.orders``), so that it does not move when the lake does.

    Tables written in the same batches reach the same versions together: checkpointing
    all at multiples of the interval made one batch in thirty pay every table's
    checkpoint (100 tables: 2.4-2.9 s against ~0.9 s), where spread over the interval
    each batch pays a thirtieth of them."""
    if not STAGGER or interval <= 1:
        return 0
    parts = os.path.normpath(path).split(os.sep)[-2:]
    return zlib.crc32("/".join(parts).encode()) % interval


def checkpoint_due(path: str, version: int, interval: int) -> bool:
    """Whether the driver writes a checkpoint after committing ``version``."""
    return interval > 0 and version > 0 and version % interval == checkpoint_phase(path, interval)


def checkpoint(path: str, version: int) -> None:
    """A checkpoint of the table at ``path`` as of ``version``, just committed
    (:mod:`slotlake.delta_checkpoint`; through delta-rs where that writer does not follow
    the log, which a worker without delta-rs leaves to its parent). A failure leaves the
    commit standing: readers replay the log."""
    from slotlake.delta_checkpoint import write_checkpoint

    try:
        # A torn checkpoint that the hint names breaks readers: it is synced with the batch.
        durability.written(*write_checkpoint(path, version))
        return
    except LookupError as exc:
        log.info("%s: checkpoint at version %d through delta-rs (%s)", path, version, exc)
    except Exception as exc:  # a checkpoint never fails the commit it follows
        log.warning(
            "%s: the driver's checkpoint at version %d failed (%s); through delta-rs",
            path,
            version,
            exc,
        )
    if table_processes.checkpoint_here(path, version):
        checkpoint_by_deltalake(path, version)


def checkpoint_by_deltalake(path: str, version: int) -> None:
    """A checkpoint of the table at ``path`` as of its latest version, written by delta-rs
    (after ``version``'s commit; a failure leaves the commit standing)."""
    try:
        open_local(path).create_checkpoint()
    except Exception as exc:
        log.warning("%s: no checkpoint at version %d (%s)", path, version, exc)
        return
    log_dir = os.path.join(path, "_delta_log")
    hint = os.path.join(log_dir, "_last_checkpoint")
    try:
        with open(hint, encoding="utf-8") as f:
            info = json.loads(f.read())
        at, parts = int(info["version"]), info.get("parts")
    except (OSError, ValueError, KeyError, TypeError):
        durability.unlisted()
        return
    names = (
        [f"{at:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
        if parts
        else [f"{at:020d}.checkpoint.parquet"]
    )
    durability.written(*(os.path.join(log_dir, n) for n in names), hint)


def txn(app_id: str, batch: int, now: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": batch, "lastUpdated": now}}


def now_ms() -> int:
    return int(time.time() * 1000)


# --- Data files ---------------------------------------------------------------------------


def _physical_type(arrow: pa.DataType, delta: DataType) -> pa.DataType:
    """``arrow`` (a logical column's type) with the physical names and field ids of the
    struct fields inside it, as column mapping asks of a data file."""
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(delta, StructType):
        return pa.struct(_physical_fields(arrow, delta))
    if isinstance(delta, ArrayType):
        value = arrow.value_field
        return pa.list_(value.with_type(_physical_type(value.type, delta.elementType)))
    if isinstance(delta, MapType):
        return pa.map_(
            _physical_type(arrow.key_type, delta.keyType),
            arrow.item_field.with_type(_physical_type(arrow.item_type, delta.valueType)),
        )
    return arrow


def _physical_fields(arrow: Any, delta: StructType) -> list[pa.Field]:
    import pyarrow as pa

    out = []
    for i, delta_field in enumerate(delta.fields):
        f = arrow.field(i)
        meta = delta_field.metadata
        fid = meta.get(FIELD_ID)
        out.append(
            pa.field(
                meta.get(PHYSICAL, f.name),
                _physical_type(f.type, delta_field.dataType),
                f.nullable,
                {b"PARQUET:field_id": str(fid).encode()} if fid is not None else None,
            )
        )
    return out


def physical_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of the table's data files (physical names, field ids), remembered
    as :func:`slotlake.decode.arrow_schema_for`."""
    hit = schema_memo.get("physical", schema)
    if hit is not None:
        return hit
    import pyarrow as pa

    from slotlake.decode import arrow_schema_for

    logical = arrow_schema_for(schema)
    out = pa.schema(_physical_fields(pa.struct(list(logical)), schema))
    schema_memo.put("physical", schema, out)
    return out


def physical_table(rows: pa.Table, schema: StructType) -> pa.Table:
    """``rows`` (logical names, any subset of the table's columns) as the table's data
    file holds them: every column in the table's order, missing ones NULL (as an insert
    that does not name a column), cast to the physical type."""
    import pyarrow as pa

    target = physical_schema(schema)
    have = set(rows.column_names)
    unknown = have - set(schema.fieldNames())
    if unknown:
        raise ValueError(f"columns {sorted(unknown)} are not in the table's schema")
    columns = []
    for delta_field, f in zip(schema.fields, target, strict=True):
        if delta_field.name in have:
            columns.append(
                _as_physical(rows.column(delta_field.name), delta_field.dataType, f.type)
            )
        else:
            columns.append(pa.nulls(rows.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=target)


def _as_physical(values: Any, delta: DataType, target: pa.DataType) -> Any:
    """A logical column's values as ``target`` (its physical type). Arrow casts struct
    fields by name, and the physical names are not the logical ones: structs (and lists
    of them) are rebuilt field by field, by logical name, missing fields NULL."""
    if values.type == target and not target.num_fields:
        return values  # most columns: nothing to rename or cast
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(values, pa.ChunkedArray):
        chunks = [_as_physical(c, delta, target) for c in values.chunks]
        return pa.chunked_array(chunks, type=target)
    if isinstance(delta, StructType) and pa.types.is_struct(values.type):
        have = {values.type.field(i).name: c for i, c in enumerate(values.flatten())}
        children = [
            _as_physical(have[f.name], f.dataType, t.type)
            if f.name in have
            else pa.nulls(len(values), t.type)
            for f, t in zip(delta.fields, target, strict=True)
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=values.is_null())
    if (
        isinstance(delta, ArrayType)
        and isinstance(delta.elementType, StructType)
        and pa.types.is_list(values.type)
    ):
        element = _as_physical(values.values, delta.elementType, target.value_type)
        return pa.ListArray.from_arrays(values.offsets, element, type=target, mask=values.is_null())
    return values if values.type == target else values.cast(target)


def read_data_file(path: str, columns: list[str] | None = None) -> pa.Table:
    """One small Parquet file whole (or ``columns`` of it): without pyarrow's dataset
    layer, read-ahead or threads, which cost more than a file of a few thousand rows
    (a 200-row file: 0.18 ms this way, 0.57 ms through ``pq.read_table``)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path, pre_buffer=False) as f:
        return f.read(columns=columns, use_threads=False)


def file_stats(data: pa.Table) -> dict[str, Any]:
    """Delta file statistics of a new file (physical names): row count, nulls of the top
    level columns, and min/max where Delta's readers compare them as written."""
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
        if not (
            pa.types.is_integer(t)
            or pa.types.is_date32(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
        ):
            continue
        mm = pc.min_max(col)
        low, high = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(low, str) and max(len(low), len(high)) > STRING_STATS_MAX:
            continue  # only the bounds are kept: the strings between them may be longer
        if pa.types.is_date32(t):
            low, high = low.isoformat(), high.isoformat()
        mins[f.name], maxs[f.name] = low, high
    return {"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def write_files(path: str, data: pa.Table, now: int) -> list[dict[str, Any]]:
    """``data`` (physical) as new data files of the table at ``path``: their ``add``
    actions. Files are written before any commit names them; a failed commit leaves
    them unreferenced (VACUUM's to remove)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = data.nbytes  # ~33 us for a change log's 17 columns: counted once
    parts = max(1, -(-size // FILE_BYTES))
    step = -(-data.num_rows // parts) if data.num_rows else 0
    adds = []
    for i in range(parts):
        piece = data.slice(i * step, step) if parts > 1 else data
        name = f"part-{i:05d}-{uuid.uuid4()}-c000.snappy.parquet"
        target = os.path.join(path, name)
        if (piece.nbytes if parts > 1 else size) <= SMALL_FILE_BYTES:
            # Encoded in memory, written with one call: given a path, pyarrow resolves a
            # file system and opens a stream of its own (~0.15 ms of a small file's 0.8).
            encoded = pa.BufferOutputStream()
            # A dictionary pays for itself over many rows; a small table's file of a few
            # hundred is encoded a fifth faster without (0.57 -> 0.46 ms, 17 columns). Such
            # a file also goes without Parquet's own statistics (one row group, which the
            # log's statistics stand for) and without the Arrow schema pyarrow stores in
            # the footer (no reader of the lake needs it: Spark's and deltalake's files
            # lack it too): a change log file of 100 rows 14.1 -> 8.6 kB, ~0.2 ms less.
            small = piece.num_rows <= DICTIONARY_FROM_ROWS
            pq.write_table(
                piece,
                encoded,
                compression="snappy",
                use_dictionary=not small,
                write_statistics=not small,
                store_schema=not small,
            )
            body = encoded.getvalue()
            with open(target, "xb") as f:
                f.write(body)
            size = body.size
        else:
            pq.write_table(piece, target, compression="snappy")
            size = os.path.getsize(target)
        durability.written(target)
        adds.append(
            {
                "path": name,
                "partitionValues": {},
                "size": size,
                "modificationTime": now,
                "dataChange": True,
                "stats": json.dumps(file_stats(piece)),
            }
        )
    return adds


def remove_files(path: str, adds: list[dict[str, Any]]) -> None:
    """Delete data files a failed commit would have named."""
    from urllib.parse import unquote

    for add in adds:
        target = os.path.join(path, unquote(add["path"]))
        if os.path.exists(target):
            os.remove(target)


def removal(add: dict[str, Any], now: int) -> dict[str, Any]:
    """The ``remove`` action of a live file (its add action), with its vector."""
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
    return {"remove": remove}


def commit_info(
    read_version: int,
    operation: str,
    now: int,
    parameters: dict[str, Any],
    metrics: dict[str, str],
    blind_append: bool = False,
) -> dict[str, Any]:
    """A driver commit's ``commitInfo``, shaped as Spark writes it (history readers)."""
    return {
        "commitInfo": {
            "timestamp": now,
            "operation": operation,
            "operationParameters": parameters,
            "readVersion": read_version,
            "isolationLevel": "Serializable",
            "isBlindAppend": blind_append,
            "operationMetrics": metrics,
            "engineInfo": DRIVER_ENGINE,
            "txnId": str(uuid.uuid4()),
        }
    }


def append(
    snap: Snapshot, data: pa.Table, app_id: str, batch: int, overwrite: bool = False
) -> tuple[Snapshot, dict[str, str]]:
    """Commit ``data`` (logical names) into the table as batch ``batch`` of ``app_id``:
    appended, or replacing every live file (``overwrite``, a snapshot read with files).
    Returns the snapshot after it and the commit's metrics."""
    now = now_ms()
    adds = write_files(snap.path, physical_table(data, snap.schema), now) if data.num_rows else []
    actions: list[dict[str, Any]] = []
    if overwrite:
        assert snap.files is not None, "an overwrite needs the live files"
        actions = [removal(a, now) for a in snap.files.values()]
    metrics = {"numFiles": str(len(adds)), "numOutputRows": str(data.num_rows)}
    if overwrite:
        metrics["numRemovedFiles"] = str(len(actions))
    mode = "Overwrite" if overwrite else "Append"
    info = commit_info(
        snap.version, "WRITE", now, {"mode": mode, "partitionBy": "[]"}, metrics, not overwrite
    )
    try:
        after = commit(snap, [info, txn(app_id, batch, now), *actions, *({"add": a} for a in adds)])
    except BaseException:
        remove_files(snap.path, adds)
        raise
    return after, metrics


def _covers(now: dict[str, Any], then: dict[str, Any]) -> bool:
    """Whether protocol ``now`` asks at least what ``then`` asked (a restore keeps the
    newer protocol, as Delta's RESTORE never downgrades one)."""
    for key in ("minReaderVersion", "minWriterVersion"):
        if int(now.get(key, 0)) < int(then.get(key, 0)):
            return False
    return all(
        set(then.get(key) or []) <= set(now.get(key) or [])
        for key in ("readerFeatures", "writerFeatures")
    )


def restore(path: str, version: int) -> Snapshot:
    """The table at a local ``path`` given back the content and schema of ``version`` as
    its next version (what Delta's ``RESTORE TABLE … TO VERSION AS OF`` commits): the
    files live then and not now added again, those live now and not then removed, a file
    counted as its path and its deletion vector (a MERGE may have grown the vector of a
    file that was live then). Txn markers stay as they are, and so does the protocol,
    which must ask at least what the old one did. Nothing is committed when the table is
    at ``version`` already.

    LookupError: a log or protocol not followed here, or ``version`` no longer in the
    log; FileNotFoundError: a file of ``version`` that VACUUM removed (the caller may try
    Spark's RESTORE, which refuses the same); FileExistsError: a writer took the next
    version meanwhile."""
    from urllib.parse import unquote

    from slotlake.deletion_vector import descriptor_path

    current = snapshot(path, files=True)
    if current.version == version:
        return current
    _removable(current, "restored")
    old = snapshot(path, files=True, version=version)
    if not _covers(current.protocol, old.protocol):
        raise LookupError(
            f"Delta table {path}: not restored on the driver: the old version's protocol "
            "asks for more than the current one"
        )
    assert current.files is not None and old.files is not None

    def key(add: dict[str, Any]) -> tuple[str, str | None]:
        return add["path"], _dv_id(add)

    live = {key(a): a for a in current.files.values()}
    wanted = {key(a): a for a in old.files.values()}
    back = [wanted[k] for k in sorted(wanted.keys() - live.keys(), key=str)]
    for add in back:
        needed = [os.path.join(path, unquote(add["path"]))]
        if add.get("deletionVector"):
            needed.append(descriptor_path(path, add["deletionVector"]))
        for file in needed:
            if file is not None and not os.path.exists(file):
                raise FileNotFoundError(
                    f"Delta table {path}: version {version}'s file {file} is gone (vacuumed)"
                )
    now = now_ms()
    actions: list[dict[str, Any]] = []
    if old.metadata != current.metadata:
        metadata = {**old.metadata, "configuration": dict(old.configuration)}
        # Column mapping ids are never given out twice: keep the highest handed out.
        ids = [
            int(s.configuration.get("delta.columnMapping.maxColumnId", 0)) for s in (current, old)
        ]
        if max(ids):
            metadata["configuration"]["delta.columnMapping.maxColumnId"] = str(max(ids))
        actions.append({"metaData": metadata})
    gone = [removal(live[k], now) for k in sorted(live.keys() - wanted.keys(), key=str)]
    metrics = {
        "numRestoredFiles": str(len(back)),
        "numRemovedFiles": str(len(gone)),
        "tableSizeAfterRestore": str(sum(int(a.get("size") or 0) for a in old.files.values())),
        "numOfFilesAfterRestore": str(len(old.files)),
    }
    parameters = {"version": version, "timestamp": None}
    info = commit_info(current.version, "RESTORE", now, parameters, metrics)
    return commit(
        current, [info, *actions, *gone, *({"add": {**a, "dataChange": True}} for a in back)]
    )


def files_used(snap: Snapshot) -> dict[str, None]:
    """The files the version ``snap`` (read with its files) uses, relative to the table:
    its data files and the deletion vector files they name, once each (a vector file
    serves many), in log order. LookupError: a file named by an absolute path or URI,
    which this reader does not follow."""
    from urllib.parse import unquote

    from slotlake.deletion_vector import descriptor_file

    assert snap.files is not None, "snapshot read without files"
    used: dict[str, None] = {}
    for add in snap.files.values():
        rel = unquote(add["path"])
        vector = add.get("deletionVector") or {}
        if "://" in rel or os.path.isabs(rel) or vector.get("storageType") == "p":
            raise LookupError(f"Delta table {snap.path}: files named by absolute paths")
        used[rel] = None
        if vector.get("storageType") == "u":
            used[descriptor_file(vector)] = None
    return used


def clone(
    source: str,
    target: str,
    version: int,
    marker: tuple[str, int] | None = None,
    with_files: bool = True,
) -> Snapshot:
    """A new table at local ``target`` holding what the table at local ``source`` held as
    of ``version``: its schema (physical column names included), properties and protocol,
    and (``with_files``) its live files and deletion vectors, hard-linked (copied across
    file systems). One commit, version 0, carrying ``marker`` (txn app id, version).

    What Delta's CLONE commits, without rewriting a row, and the target owns its files: a
    VACUUM of the source never breaks it. LookupError: a log or protocol not followed here
    (nothing written: Spark's copy then), or ``version`` no longer in the log;
    FileNotFoundError: a file of ``version`` that VACUUM removed; FileExistsError: a
    table at ``target`` already."""
    from slotlake.lake import link_or_copy

    if has_log(target):
        raise FileExistsError(f"Delta table {target}: there is one already")
    old = snapshot(source, files=with_files, version=version)
    why = unwritable(old)
    if why is not None:
        raise LookupError(f"Delta table {source}: not cloned on the driver: {why}")
    adds = list((old.files or {}).values())
    try:
        needed = files_used(old) if old.files is not None else {}
    except LookupError:
        raise LookupError(
            f"Delta table {source}: not cloned on the driver: absolute paths"
        ) from None
    linked: list[str] = []
    try:
        for rel in needed:
            to = os.path.join(target, rel)
            os.makedirs(os.path.dirname(to), exist_ok=True)
            try:
                link_or_copy(os.path.join(source, rel), to)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"Delta table {source}: version {version}'s file {rel} is gone (vacuumed)"
                ) from None
            linked.append(to)
            durability.written(to)
        now = now_ms()
        metadata = {**old.metadata, "id": str(uuid.uuid4()), "createdTime": now}
        size = sum(int(a.get("size") or 0) for a in adds)
        metrics = {
            "sourceTableSize": str(size),
            "sourceNumOfFiles": str(len(adds)),
            "numCopiedFiles": str(len(adds)),
            "copiedFilesSize": str(size),
        }
        parameters = {"source": source, "sourceVersion": str(version), "isShallow": "false"}
        info = commit_info(-1, "CLONE", now, parameters, metrics)
        del info["commitInfo"]["readVersion"]  # a new table: nothing was read
        txns = dict([marker]) if marker is not None else {}
        actions = [
            info,
            {"protocol": dict(old.protocol)},
            {"metaData": metadata},
            *(txn(app_id, v, now) for app_id, v in txns.items()),
            *({"add": {**a, "dataChange": True}} for a in adds),
        ]
        _commit_on_driver(target, 0, actions)
    except BaseException:
        for to in linked:
            os.remove(to)
        raise
    live = {a["path"]: a for a in adds} if with_files else None
    return Snapshot(target, 0, dict(old.protocol), metadata, txns, live)


def _removable(current: Snapshot, doing: str) -> None:
    """LookupError naming ``doing`` when a commit removing files may not be written here."""
    why = unwritable(current, deletes=True)
    if why is not None:
        raise LookupError(f"Delta table {current.path}: not {doing} on the driver: {why}")


def _delete(current: Snapshot, gone: list[dict[str, Any]], predicate: str) -> Snapshot:
    if not gone:
        return current
    now = now_ms()
    metrics = {"numRemovedFiles": str(len(gone))}
    info = commit_info(current.version, "DELETE", now, {"predicate": predicate}, metrics)
    return commit(current, [info, *(removal(a, now) for a in gone)])


def empty(path: str) -> Snapshot:
    """Every row of the table at a local ``path`` deleted (its live files removed) in one
    commit; LookupError: a log or protocol not followed here."""
    current = snapshot(path, files=True)
    _removable(current, "deleted from")
    assert current.files is not None
    return _delete(current, list(current.files.values()), "[]")


def remove_where_at_least(path: str, column: str, bound: int) -> Snapshot:
    """The rows of the table at a local ``path`` whose integer ``column`` is at least
    ``bound`` deleted by removing whole files, told apart by their statistics, in one
    commit. LookupError when a file's statistics do not put all its rows on one side
    (Spark's DELETE then rewrites it) or the log or protocol is not followed here."""
    current = snapshot(path, files=True)
    _removable(current, "deleted from")
    assert current.files is not None
    field = next((f for f in current.schema.fields if f.name == column), None)
    if field is None:
        raise LookupError(f"Delta table {path}: no column {column!r}")
    physical = field.metadata.get(PHYSICAL, column)
    gone = []
    for add in current.files.values():
        stats = json.loads(add.get("stats") or "{}")
        low = (stats.get("minValues") or {}).get(physical)
        high = (stats.get("maxValues") or {}).get(physical)
        if stats.get("numRecords") == 0 or (high is not None and int(high) < bound):
            continue
        if low is None or int(low) < bound:
            raise LookupError(
                f"Delta table {path}: file {add['path']} may hold rows on both sides of "
                f"{column} = {bound}"
            )
        gone.append(add)
    return _delete(current, gone, f'["({column} >= {bound})"]')
