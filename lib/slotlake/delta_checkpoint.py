"""Classic checkpoints of a local Delta table, written from its log by the driver.

A checkpoint was delta-rs's ``create_checkpoint``: it opens the table (an object store, a
log replay) to write a file of a few rows, ~12-16 ms a table on the 2-core machine, and
its runtime does not survive a fork, so a forked worker handed its checkpoints to the
parent, which wrote them one after another once every table was done (0.05-0.18 s of a
100-table batch). Written here they cost what their rows cost, in whichever process
committed the version.

The file holds what Delta's protocol asks of a checkpoint: the protocol, the metadata,
each application's latest txn, the live files and the tombstones not yet expired (files
removed less than ``delta.deletedFileRetentionDuration`` ago: VACUUM keeps a removed
file while its tombstone stands, so dropping one early would let VACUUM delete a file
that time travel to a retained version still reads). It is replayed from the newest
checkpoint before the version and the JSON entries after it, in the columns and types
delta-rs writes (which Spark, delta-rs and DuckDB read). A log this writer does not follow,
or a table of more than ``ROWS_MAX`` files and tombstones (whose checkpoint delta-rs
writes faster), raises :class:`LookupError` and the caller lets delta-rs write it.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from slotlake import delta_log

if TYPE_CHECKING:
    import pyarrow as pa

TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"
DEFAULT_TOMBSTONE_RETENTION = "interval 1 week"
# Past this many actions (files, tombstones) a checkpoint is delta-rs's to write: this
# writer goes through Python objects, ~10 us an action, where delta-rs takes 30-60 ms for
# thousands (measured: 10,000 files 72 vs 48 ms, 50,000 files 620 vs 62 ms).
ROWS_MAX = 4000
# Actions a checkpoint leaves out (they describe one commit, not the table).
_NOT_KEPT = frozenset({"commitInfo", "cdc"})
_KEPT = frozenset({"add", "remove", "txn", "metaData", "protocol"})

_INTERVAL_UNITS = {
    "week": 168.0,
    "day": 24.0,
    "hour": 1.0,
    "minute": 1 / 60,
    "second": 1 / 3600,
    "millisecond": 1 / 3_600_000,
    "microsecond": 1 / 3_600_000_000,
}
_INTERVAL_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")
# What write_checkpoint writes beside a name before renaming it onto it.
_SCRATCH = re.compile(r"\.[0-9a-f]{32}\.(?:last_)?checkpoint\.tmp")


def interval_hours(text: str) -> float | None:
    """Hours of a Delta interval property ("interval 1 week", "7 days"); None if unknown."""
    s = text.strip().lower()
    s = s[len("interval") :].strip() if s.startswith("interval") else s
    total, pos = 0.0, 0
    for m in _INTERVAL_PART.finditer(s):
        if s[pos : m.start()].strip() or m.group(2) not in _INTERVAL_UNITS:
            return None
        total += float(m.group(1)) * _INTERVAL_UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or s[pos:].strip():
        return None
    return total


@lru_cache(maxsize=1)
def checkpoint_schema() -> pa.Schema:
    """The checkpoint's columns, as delta-rs writes them."""
    import pyarrow as pa

    s, i64 = pa.string(), pa.int64()

    def req(name: str, t: pa.DataType) -> pa.Field:
        return pa.field(name, t, nullable=False)

    def strings() -> pa.DataType:
        return pa.map_(s, s)

    vector = pa.struct(
        [
            req("storageType", s),
            req("pathOrInlineDv", s),
            pa.field("offset", pa.int32()),
            req("sizeInBytes", pa.int32()),
            req("cardinality", i64),
        ]
    )
    # What an add and a remove both say of a file after their own fields.
    described = [
        pa.field("stats", s),
        pa.field("tags", strings()),
        pa.field("deletionVector", vector),
        pa.field("baseRowId", i64),
        pa.field("defaultRowCommitVersion", i64),
    ]
    add = pa.struct(
        [
            req("path", s),
            req("partitionValues", strings()),
            req("size", i64),
            req("modificationTime", i64),
            req("dataChange", pa.bool_()),
            *described,
            pa.field("clusteringProvider", s),
        ]
    )
    remove = pa.struct(
        [
            req("path", s),
            pa.field("deletionTimestamp", i64),
            req("dataChange", pa.bool_()),
            pa.field("extendedFileMetadata", pa.bool_()),
            pa.field("partitionValues", strings()),
            pa.field("size", i64),
            *described,
        ]
    )
    metadata = pa.struct(
        [
            req("id", s),
            pa.field("name", s),
            pa.field("description", s),
            req("format", pa.struct([req("provider", s), req("options", strings())])),
            req("schemaString", s),
            req("partitionColumns", pa.list_(pa.field("element", s, nullable=False))),
            pa.field("createdTime", i64),
            req("configuration", strings()),
        ]
    )
    features = pa.list_(pa.field("element", s, nullable=False))
    protocol = pa.struct(
        [
            req("minReaderVersion", pa.int32()),
            req("minWriterVersion", pa.int32()),
            pa.field("readerFeatures", features),
            pa.field("writerFeatures", features),
        ]
    )
    txn = pa.struct([req("appId", s), req("version", i64), pa.field("lastUpdated", i64)])
    domain = pa.struct([req("domain", s), req("configuration", s), req("removed", pa.bool_())])
    sidecar = pa.struct(
        [
            req("path", s),
            req("sizeInBytes", i64),
            req("modificationTime", i64),
            pa.field("tags", strings()),
        ]
    )
    return pa.schema(
        [
            pa.field("add", add),
            pa.field("remove", remove),
            pa.field("metaData", metadata),
            pa.field("protocol", protocol),
            pa.field("txn", txn),
            pa.field("domainMetadata", domain),
            pa.field("sidecar", sidecar),
        ]
    )


@dataclass
class TableState:
    """Everything a checkpoint records, as a replay of the log leaves it."""

    protocol: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    txns: dict[str, dict[str, Any]] = field(default_factory=dict)
    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (path, deletion vector id) → remove action: a file is its path and its vector, so a
    # file re-added with a grown vector leaves the tombstone of the old pair.
    tombstones: dict[tuple[str, str | None], dict[str, Any]] = field(default_factory=dict)

    def apply(self, kind: str, action: dict[str, Any], where: str) -> None:
        if kind in _NOT_KEPT:
            return
        if kind not in _KEPT:
            raise LookupError(f"{where}: {kind} actions are not written into checkpoints here")
        if kind == "add":
            self.tombstones.pop((action["path"], delta_log._dv_id(action)), None)
        elif kind == "remove":
            self.tombstones[(action["path"], delta_log._dv_id(action))] = action
        elif kind == "txn":
            self.txns[action["appId"]] = action
        unused: dict[str, int] = {}
        delta_log._apply({kind: action}, self.protocol, self.metadata, unused, self.live)


def replay(path: str, version: int) -> TableState:
    """The table at a local ``path`` as of ``version``, tombstones and txns whole: the
    newest checkpoint before it (the hint's, else found by listing) and the entries after
    it. LookupError when the log does not lead there."""
    log_dir = os.path.join(path, "_delta_log")
    hinted = delta_log._from_hint(log_dir)
    if hinted is not None and hinted[0] < version <= hinted[2][-1]:
        since, parts = hinted[0], hinted[1]
    else:
        versions, checkpoints = delta_log._names(log_dir)
        if version not in versions:
            raise LookupError(f"Delta table {path}: no log entry for version {version}")
        since = max((v for v in checkpoints if v < version), default=-1)
        parts = checkpoints.get(since, [])
        if [v for v in versions if since < v <= version] != list(range(since + 1, version + 1)):
            raise LookupError(f"Delta table {path}: log entries missing after version {since}")
    state = TableState()
    for part in parts:
        for kind, action in delta_log.checkpoint_actions(part, rows_max=ROWS_MAX):
            state.apply(kind, action, part)
    for v in range(since + 1, version + 1):
        for entry in delta_log.entry_actions(log_dir, v):
            ((kind, action),) = entry.items()
            state.apply(kind, action, f"{log_dir}: version {v}")
    if not state.protocol or not state.metadata:
        raise LookupError(f"Delta table {path}: no protocol or metadata at version {version}")
    delta_log._check_followed(path, state.protocol)
    _within_rows(path, len(state.live) + len(state.tombstones))
    return state


def _within_rows(path: str, rows: int) -> None:
    if rows > ROWS_MAX:
        raise LookupError(f"Delta table {path}: {rows} actions, delta-rs checkpoints it faster")


def _tombstone_cutoff(state: TableState, now_ms: int) -> int:
    """Tombstones deleted before this instant (ms) have expired, as Delta's own
    checkpoints drop them; LookupError when the table's retention cannot be read."""
    text = (state.metadata.get("configuration") or {}).get(
        TOMBSTONE_RETENTION, DEFAULT_TOMBSTONE_RETENTION
    )
    hours = interval_hours(text)
    if hours is None:
        raise LookupError(f"{TOMBSTONE_RETENTION} {text!r} not understood")
    return now_ms - int(hours * 3_600_000)


def _as_rows(state: TableState, now_ms: int) -> list[dict[str, Any]]:
    """The checkpoint's rows: one action each. Files are recorded with ``dataChange``
    false, as Spark's checkpoints do (a checkpoint changes no data)."""
    cutoff = _tombstone_cutoff(state, now_ms)
    metadata = {
        "format": {"provider": "parquet", "options": {}},
        "partitionColumns": [],
        "configuration": {},
        **state.metadata,
    }
    rows: list[dict[str, Any]] = [{"protocol": state.protocol}, {"metaData": metadata}]
    rows += [{"txn": t} for t in state.txns.values()]
    rows += [
        {"add": {"partitionValues": {}, **a, "dataChange": False}} for a in state.live.values()
    ]
    rows += [
        {"remove": {**r, "dataChange": False}}
        for r in state.tombstones.values()
        # A tombstone without a time counts as deleted at 0, long expired (as in Delta).
        if int(r.get("deletionTimestamp") or 0) >= cutoff
    ]
    return rows


def write_checkpoint(path: str, version: int, now_ms: int | None = None) -> list[str]:
    """Write the checkpoint of the local table at ``path`` as of ``version`` and point
    ``_last_checkpoint`` at it (unless it names a newer one); the files written.

    Each file is written beside its name and renamed onto it, so a reader sees the whole
    checkpoint or none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    state = replay(path, version)
    rows = _as_rows(state, int(time.time() * 1000) if now_ms is None else now_ms)
    table = pa.Table.from_pylist(rows, schema=checkpoint_schema())
    log_dir = os.path.join(path, "_delta_log")
    name = os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")
    scratch = os.path.join(log_dir, _scratch_name("checkpoint"))
    try:
        pq.write_table(table, scratch, use_dictionary=False, write_statistics=False)
        os.replace(scratch, name)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    hint = os.path.join(log_dir, "_last_checkpoint")
    if _hinted_version(hint) > version:
        return [name]
    info = {
        "version": version,
        "size": table.num_rows,
        "sizeInBytes": os.path.getsize(name),
        "numOfAddFiles": len(state.live),
    }
    scratch = os.path.join(log_dir, _scratch_name("last_checkpoint"))
    with open(scratch, "w", encoding="utf-8") as f:
        f.write(json.dumps(info, separators=(",", ":")))
    os.replace(scratch, hint)
    return [name, hint]


def _scratch_name(kind: str) -> str:
    # Hidden from the log's readers (their names start with a digit or an underscore)
    # until renamed.
    return f".{uuid.uuid4().hex}.{kind}.tmp"


def leftovers(path: str) -> list[str]:
    """The scratch files of checkpoint writes that never reached their rename (a process
    killed mid-write) in the local table at ``path``: nothing reads them, and only a run
    that knows no writer is at work (one holding the slot's lock) may remove them."""
    log_dir = os.path.join(path, "_delta_log")
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    return sorted(os.path.join(log_dir, n) for n in names if _SCRATCH.fullmatch(n))


def _hinted_version(hint: str) -> int:
    try:
        with open(hint, encoding="utf-8") as f:
            return int(json.loads(f.read())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1
