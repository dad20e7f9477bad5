"""The lake's layout, its commit records, and reading committed data without Spark.

Layout under the lake root::

    _slotlake.json                         layout marker: {"layout": "delta", "lake_id": …}
    _commits/00000000000000000007.json     one record per committed batch (the commit point)
    _pending/00000000000000000007.json     batch 7's plan: fixed by its first attempt
    _raw/b00000000000000000007-<attempt>/  raw payloads of batch 7 (plain Parquet, the archive)
    changes/<schema>.<table>/              Delta table: the table's change log (append-only)
    state/<schema>.<table>/                Delta table: the mirror, MERGEd by replica identity
    transactions/, messages/, ddl/         Delta tables

Every Delta table is written at most once per batch: each write carries Delta's
idempotent-transaction marker (``txnAppId`` = the lake's writer id, ``txnVersion`` = the
batch number), so a rerun of batch N skips the tables that already have it. The commit
record is written last and lists, per Delta table, the version that holds batch N: it is
the cross-table commit point. Readers start from a commit record and read each table *as
of* its version (time travel), so a table that already has batch N+1 while its record is
not yet written is never seen half-way. The record is written to a temporary name and
linked/renamed, which is atomic on POSIX file systems and HDFS.

A batch's content is fixed by its first attempt: after the pull, the plan (target LSN,
raw directory, LSNs) is written to ``_pending/`` before any table is touched; a rerun of
an unfinished batch reuses it rather than pulling to a newer target, otherwise the
tables that had already committed the batch would miss the changes in between.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slotlake import __version__, durability
from slotlake.durability import fsync_path
from slotlake.lsn import Lsn

log = logging.getLogger(__name__)

LAYOUT_FILE = "_slotlake.json"
LAYOUT = "delta"
COMMITS = "_commits"
PENDING = "_pending"
# Where maintain says up to which batch it expired commit records (Lake.expire_commits).
EXPIRED_COMMITS = f"{COMMITS}/expired.json"
# The versions maintain's OPTIMIZE committed past those the newest record names
# (Lake.write_compacted): the next batch's record names them instead (adopt_compacted).
COMPACTED = f"{COMMITS}/compacted.json"
RAW = "_raw"
CHANGES = "changes"
STATE = "state"
TRANSACTIONS = "transactions"
MESSAGES = "messages"
DDL = "ddl"
# What a lake holds beside its "_" entries (a root holding anything else is not one).
_DATASETS = frozenset({CHANGES, STATE, TRANSACTIONS, MESSAGES, DDL})
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
_BATCH_DIR = re.compile(r"^b(\d{20})-[0-9a-f]+$")
# The multiset state of a table matched by whole rows (REPLICA IDENTITY FULL, or no key):
# its distinct values, each with how many copies of it the source holds (an INSERT-only
# table's value may be spread over several rows: TableCommit.spread).
COPIES = "_copies"


class LakeError(RuntimeError):
    pass


class OldLayoutError(LakeError):
    pass


class NotALakeError(LakeError):
    """lake.path names a file, or a directory of files that are no lake's."""


@dataclass
class TableCommit:
    """One source table as of one batch: its two Delta tables and their versions."""

    changes: str | None  # Delta table of the change log (relative to the root)
    state: str | None  # Delta table of the state
    change_rows: int = 0  # rows this batch appended to the change log
    state_rows: int = 0  # rows in the state after the batch
    columns: list[list[str]] = field(default_factory=list)  # [name, spark ddl, state|log]
    key_columns: list[str] = field(default_factory=list)
    replica_identity: str = ""
    renames: dict[str, str] = field(default_factory=dict)  # renamed by this batch: old → new
    changes_version: int | None = None  # Delta version of the change log as of this batch
    state_version: int | None = None  # Delta version of the state as of this batch
    written: bool = False  # whether this batch wrote the table
    # attnum of each column when this table was last written (slotlake.fastdefault: a
    # column with a new attnum was added, or dropped and added again, since)
    attnums: dict[str, int] = field(default_factory=dict)
    # pg_class.relnatts then (attnums given so far, dropped columns' too): pins the
    # attnums of columns a later batch adds (slotlake.catalog.ColumnIds.added_in_batch)
    natts: int | None = None
    # The oid of the relation the lake last wrote the table from: another oid under the
    # name later is a table dropped and created again, whose columns are new ones
    # (slotlake.catalog.build_catalogs); None in a record from before it was kept.
    oid: int | None = None
    # The batch from which the name is no longer the source's (dropped, renamed away or
    # removed from the publication): set on a table a batch carries forward unwritten
    # while its published set lacks the name (:func:`mark_gone`); None while it is one.
    gone_since: int | None = None
    # Change rows this batch wrote with an unchanged TOAST value it could not fill from
    # anything the lake had (a keyed table; those of a copied table's rows from its copy's
    # consistent point on): rows the lake never had (slotlake.snapshot.unseen_rows).
    missing_toast: int = 0
    # A multiset's state may hold one value in several rows (their ``_copies`` add up):
    # set by a batch that appended its rows (an INSERT-only table: nothing to match them
    # against), cleared by a batch that rebuilt or overwrote the state. A MERGE on whole
    # rows needs one row per value, so the next batch that must match rows rebuilds it.
    spread: bool = False
    # A FULL-identity table whose state is known to hold each value of these columns once
    # (its primary key when copied; kept by induction, slotlake.unique_multiset): its
    # rows are then matched by them, not whole. Empty: not known.
    unique_on: list[str] = field(default_factory=list)

    @property
    def multiset(self) -> bool:
        return self.replica_identity == "f" or not self.key_columns

    def state_rows_text(self) -> str:
        """:attr:`state_rows` with what they count: a multiset's state rows are its
        distinct values, not the source's rows (those add up their ``_copies``)."""
        if not self.multiset:
            return f"{self.state_rows} rows"
        if self.spread:  # an INSERT-only table's batches, each appended as rows of its own
            return f"{self.state_rows} rows with their copies (multiset)"
        if self.unique_on:  # FULL identity, MERGEd by its primary key
            return f"{self.state_rows} rows (multiset unique on {', '.join(self.unique_on)})"
        return f"{self.state_rows} distinct rows (multiset)"


@dataclass
class CommitRecord:
    batch: int
    attempt: str
    slot: str
    start_lsn: str  # W0: where the slot stood when the batch started
    end_lsn: str  # W: where the slot is advanced to after this commit
    target_lsn: str  # L: the upto_lsn of the peek
    created_at: str
    code_version: str
    raw: str | None
    raw_messages: int = 0
    raw_bytes: int = 0
    transactions: str | None = None
    messages: str | None = None
    transaction_count: int = 0
    tables: dict[str, TableCommit] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    kind: str = "sync"  # sync | bootstrap | reprocess
    transactions_version: int | None = None
    messages_version: int | None = None
    txn_app_id: str = ""  # Delta txnAppId the batch's writes carried
    layout: str = LAYOUT
    ddl: str | None = None  # Delta table of the captured DDL (slotlake.ddl messages)
    ddl_version: int | None = None
    # Per-table snapshots (slotlake.snapshot): the published set and relfilenodes read
    # before the target, the tables copied and re-based in this batch, and those the
    # next run must snapshot ("wanted").
    snapshot: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> Lsn:
        return Lsn.parse(self.end_lsn)

    @property
    def start(self) -> Lsn:
        return Lsn.parse(self.start_lsn)

    def delta_versions(self) -> dict[str, int | None]:
        """Every Delta table the record names (relative path) → the version it names."""
        named = [
            (self.transactions, self.transactions_version),
            (self.messages, self.messages_version),
            (self.ddl, self.ddl_version),
        ]
        for t in self.tables.values():
            named += [(t.changes, t.changes_version), (t.state, t.state_version)]
        return {path: version for path, version in named if path}

    def to_json(self) -> str:
        """The record as JSON, a line per key and per table: ``json`` indents only in
        Python, which took ~25 ms for a record of 100 tables; a value at a time goes
        through its C encoder."""
        top = {f.name: getattr(self, f.name) for f in fields(self)}
        tables = top.pop("tables")
        rows = [f"    {json.dumps(k)}: {_compact(vars(t))}" for k, t in sorted(tables.items())]
        return _by_key(top, {"tables": "{" + ("\n" + ",\n".join(rows) + "\n  }" if rows else "}")})

    @classmethod
    def from_json(cls, text: str) -> CommitRecord:
        raw = json.loads(text)
        if raw.get("layout") != LAYOUT:
            raise OldLayoutError("written by slotlake's Parquet layout (before Delta Lake)")
        raw["tables"] = {k: TableCommit(**v) for k, v in raw.get("tables", {}).items()}
        return cls(**raw)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _by_key(values: dict[str, Any], written: dict[str, str] | None = None) -> str:
    """A JSON object a line per key, in key order, each value compact (``written``: values
    already in their JSON text)."""
    lines = {k: _compact(v) for k, v in values.items()} | (written or {})
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {v}" for k, v in sorted(lines.items())) + "\n}"


@dataclass
class BatchPlan:
    """What batch N is, fixed after its pull and before any table is written."""

    batch: int
    attempt: str
    slot: str
    start_lsn: str
    end_lsn: str
    target_lsn: str
    raw: str
    raw_messages: int
    raw_bytes: int
    txn_app_id: str
    kind: str = "sync"
    created_at: str = ""
    # Tables copied before the target (slotlake.snapshot.Prepared.to_plan): a rerun
    # re-bases them on the same copies at the same consistent points.
    snapshot: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """A line per key, each value compact: indented whole, the published set's names
        (every table, each batch) went through ``json``'s Python encoder (300 tables:
        ~4 ms)."""
        return _by_key({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> BatchPlan:
        return cls(**json.loads(text))


def batch_dir_name(batch: int, attempt: str) -> str:
    return f"b{batch:020d}-{attempt}"


def batch_dirs(fs: Any, folder: str) -> list[tuple[int, str]]:
    """The :func:`batch_dir_name` directories in ``folder`` (raw batches, snapshot
    copies), each with its batch number, in name order."""
    return [
        (int(m.group(1)), name)
        for name in sorted(fs.listdir(folder))
        if (m := _BATCH_DIR.match(name))
    ]


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def table_dir_name(table: str) -> str:
    """A directory name for ``schema.table`` that every file system and Hadoop path accepts.

    PostgreSQL identifiers may hold '/', ':', spaces or quotes; those are replaced, and a
    short hash of the real name keeps two such names apart. Readers go through the commit
    record, which maps the real name to its tables, so this need not be reversible.
    """
    if not _UNSAFE.search(table) and not table.startswith("."):
        return table
    import hashlib

    digest = hashlib.sha1(table.encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', table).lstrip('.')}-{digest}"


def first_names(names: Sequence[str], shown: int = 3) -> str:
    """``a, b, c and 2 more``: the first ``shown`` names, for a message."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def new_attempt() -> str:
    return uuid.uuid4().hex[:12]


def is_local(root: str) -> bool:
    """A plain path (no URI scheme): the lake's files are handled with Python's os."""
    return "://" not in root


def local_path(root: str) -> Path:
    return Path(root[len("file://") :] if root.startswith("file://") else root)


def link_or_copy(source: str, target: str) -> None:
    """``source`` hard-linked as ``target`` (a lake's files never change once written),
    copied where links are impossible (another file system). FileExistsError and
    FileNotFoundError are not for a copy to hide."""
    try:
        os.link(source, target)
    except (FileExistsError, FileNotFoundError):
        raise
    except OSError:
        shutil.copy2(source, target)


@functools.lru_cache(maxsize=8192)
def _local_join(root: str, relative: str) -> str:
    # A batch joins the same few paths per table many times over (a hundred tables: ~1,600
    # joins, 0.26 ms a table through pathlib); Path's normalisation is kept, paid once.
    return str(Path(root) / relative)


class LocalFS:
    """File operations of a lake on the local file system (plain paths)."""

    def join(self, root: str, relative: str) -> str:
        return _local_join(root, relative)

    def exists(self, p: str) -> bool:
        return os.path.exists(p)

    def isdir(self, p: str) -> bool:
        return os.path.isdir(p)

    def listdir(self, p: str) -> list[str]:
        return sorted(os.listdir(p)) if os.path.isdir(p) else []

    def read_text(self, p: str) -> str:
        return Path(p).read_text()

    def _write(self, tmp: Path, text: str, durable: bool = True) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())

    def create_new(self, p: str, text: str, durable: bool = True) -> None:
        """``text`` as the new file ``p``, all or nothing; FileExistsError when it exists.
        Not ``durable``: the caller syncs it later (slotlake.durability)."""
        final = Path(p)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            raise FileExistsError(p)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        self._write(tmp, text, durable)
        try:
            # link fails if the final name appeared meanwhile, where rename would replace it.
            os.link(tmp, final)
        finally:
            os.unlink(tmp)
        if durable:
            fsync_path(final.parent)

    def replace(self, p: str, text: str) -> None:
        final = Path(p)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        self._write(tmp, text)
        os.replace(tmp, final)
        fsync_path(final.parent)

    def rmtree(self, p: str) -> None:
        """Remove a directory tree or a single file; absent is fine."""
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)

    def mkdirs(self, p: str) -> None:
        Path(p).mkdir(parents=True, exist_ok=True)

    def upload_dir(self, local_dir: str, p: str) -> None:
        shutil.copytree(local_dir, p)

    def download_dir(self, p: str, local_dir: str) -> None:
        shutil.copytree(p, local_dir)


class _FileUriFS(LocalFS):
    """file:// URIs without a SparkSession (readers, status): the local file system."""

    def join(self, root: str, relative: str) -> str:
        return root.rstrip("/") + "/" + relative

    def _p(self, p: str) -> str:
        return str(local_path(p))

    def exists(self, p: str) -> bool:
        return super().exists(self._p(p))

    def isdir(self, p: str) -> bool:
        return super().isdir(self._p(p))

    def listdir(self, p: str) -> list[str]:
        return super().listdir(self._p(p))

    def read_text(self, p: str) -> str:
        return super().read_text(self._p(p))

    def create_new(self, p: str, text: str) -> None:
        super().create_new(self._p(p), text)

    def replace(self, p: str, text: str) -> None:
        super().replace(self._p(p), text)

    def rmtree(self, p: str) -> None:
        super().rmtree(self._p(p))

    def mkdirs(self, p: str) -> None:
        super().mkdirs(self._p(p))

    def upload_dir(self, local_dir: str, p: str) -> None:
        super().upload_dir(local_dir, self._p(p))

    def download_dir(self, p: str, local_dir: str) -> None:
        super().download_dir(self._p(p), local_dir)


def _file_system(root: str, fs: Any) -> Any:
    if fs is not None:
        return fs
    if is_local(root):
        return LocalFS()
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    except ImportError:  # pragma: no cover - pyspark is a dependency
        spark = None
    if spark is not None:
        from slotlake.hadoopfs import HadoopFS

        return HadoopFS(spark)
    if root.startswith("file://"):
        return _FileUriFS()
    raise LakeError(f"lake {root}: a Hadoop file system URI needs a running SparkSession")


class Lake:
    """A lake root: a local path, or any Hadoop file system URI (hdfs://, s3a://, file://).

    Plain paths are handled with Python's os; URIs through Spark's Hadoop FileSystem
    (:mod:`slotlake.hadoopfs`) with the active SparkSession's configuration. The readers
    for pandas/pyarrow (``read_changes``, ``read_state``) work on local and file:// roots.
    """

    def __init__(self, root: str | Path, fs: Any = None) -> None:
        self.uri = str(root)
        self.local = is_local(self.uri)
        self.root = local_path(self.uri)
        self.fs = _file_system(self.uri, fs)

    @property
    def on_local_disk(self) -> bool:
        """Whether the lake's files are reachable as local paths (a path or ``file://``):
        then pyarrow and ``deltalake`` can read and write them without Spark."""
        return self.local or self.uri.startswith("file://")

    def _durable_so_far(self) -> None:
        """Everything written to a local lake so far reaches the disk before a record
        naming it (slotlake.durability): raw files before a plan, the tables' data files,
        vectors, entries and checkpoints before a commit record. Writes to object stores
        and HDFS are durable once they return."""
        if not self.on_local_disk:
            return
        if durability.deferring():  # a sync's batch: what it listed (slotlake.durability)
            durability.flush(str(self.root))
        else:
            durability.sync_file_system(str(self.root))

    def _raw_durable(self, plan: BatchPlan) -> None:
        """What a plan names on disk before the plan: its raw files, and the copies of
        the tables it snapshots (written by no listing writer: the file system whole)."""
        if self.on_local_disk and durability.deferring():
            durability.written_tree(str(local_path(self.path(plan.raw))))
            if plan.snapshot.get("tables"):
                durability.unlisted()
        self._durable_so_far()

    # -- paths -----------------------------------------------------------------------------
    def path(self, relative: str) -> str:
        return self.fs.join(self.uri, relative)

    def batch_path(self, kind: str, batch: int, attempt: str) -> str:
        """Relative path of a directory that batch/attempt writes (raw payloads)."""
        return f"{kind}/{batch_dir_name(batch, attempt)}"

    @staticmethod
    def table_path(kind: str, table: str) -> str:
        """Relative path of the Delta table of ``kind`` (changes/state) of source ``table``."""
        return f"{kind}/{table_dir_name(table)}"

    def exists(self, relative: str = "") -> bool:
        return self.fs.exists(self.path(relative) if relative else self.uri)

    # -- layout ----------------------------------------------------------------------------
    def layout(self) -> dict[str, Any] | None:
        """The layout marker, or None for a lake nothing was written to yet.

        Refuses a lake written by the Parquet layout of slotlake before Delta Lake.
        """
        marker = self.path(LAYOUT_FILE)
        if self.fs.exists(marker):
            info = json.loads(self.fs.read_text(marker))
            if info.get("layout") != LAYOUT:
                raise OldLayoutError(self._old_layout_message())
            return info
        if self.fs.listdir(self.path(COMMITS)) or self.fs.isdir(self.path(STATE)):
            raise OldLayoutError(self._old_layout_message())
        self._refuse_foreign_root()
        return None

    def _refuse_foreign_root(self) -> None:
        """A root without a lake must be new, empty or hold only what a first attempt
        leaves before the marker (``_raw`` …): a lake.path naming a file, or a directory of
        other files (a typo, a parent directory), is refused before anything is written
        into it."""
        if self.fs.exists(self.uri) and not self.fs.isdir(self.uri):
            raise NotALakeError(f"lake.path {self.uri} is a file, not a directory")
        foreign = sorted(
            n
            for n in self.fs.listdir(self.uri)
            if not n.startswith(("_", ".")) and n not in _DATASETS
        )
        if foreign:
            raise NotALakeError(
                f"lake.path {self.uri} holds no lake ({LAYOUT_FILE}) but other files "
                f"({first_names(foreign)}): give slotlake a new or empty directory"
            )

    def _old_layout_message(self) -> str:
        return (
            f"lake {self.uri} was written by slotlake's old Parquet layout (before Delta Lake) "
            "and is not migrated: bootstrap a new lake.path (slotlake bootstrap --config …)"
        )

    def ensure_layout(self) -> dict[str, Any]:
        """The layout marker, written on the first batch; its lake_id keys Delta's txnAppId."""
        info = self.layout()
        if info is not None:
            return info
        info = {"layout": LAYOUT, "lake_id": uuid.uuid4().hex, "created_at": utcnow_iso()}
        self.fs.mkdirs(self.uri)
        with contextlib.suppress(FileExistsError):
            self.fs.create_new(self.path(LAYOUT_FILE), json.dumps(info, indent=2))
        result = self.layout()
        assert result is not None
        return result

    def app_id(self, suffix: str = "") -> str:
        """Delta ``txnAppId`` of this lake's writers (a reprocess in place adds a suffix)."""
        base = f"slotlake-{self.ensure_layout()['lake_id']}"
        return f"{base}-{suffix}" if suffix else base

    # -- commit records --------------------------------------------------------------------
    def _commit_path(self, batch: int) -> str:
        return self.path(f"{COMMITS}/{batch:020d}.json")

    def commit_batches(self) -> list[int]:
        names = self.fs.listdir(self.path(COMMITS))
        return sorted(int(m.group(1)) for n in names if (m := _COMMIT_NAME.match(n)))

    def read_commit(self, batch: int) -> CommitRecord:
        path = self._commit_path(batch)
        try:
            return CommitRecord.from_json(self.fs.read_text(path))
        except OldLayoutError:
            raise OldLayoutError(self._old_layout_message()) from None
        except Exception as exc:
            raise LakeError(f"commit record {path} is unreadable: {exc}") from exc

    def last_commit(self) -> CommitRecord | None:
        self.layout()
        batches = self.commit_batches()
        return self.read_commit(batches[-1]) if batches else None

    def commits(self) -> Iterator[CommitRecord]:
        for b in self.commit_batches():
            yield self.read_commit(b)

    def write_commit(self, record: CommitRecord) -> None:
        """Make a batch visible: write the record beside its final name, then move it there.

        A record for an existing batch number is never overwritten: two writers racing
        for the same batch (which the advisory lock prevents) would fail here instead.
        """
        self.ensure_layout()
        final = self._commit_path(record.batch)
        self.fs.mkdirs(self.path(COMMITS))
        self._durable_so_far()
        try:
            self.fs.create_new(final, record.to_json())
        except FileExistsError:
            raise LakeError(f"batch {record.batch} is already committed ({final})") from None

    def replace_commit(self, record: CommitRecord) -> CommitRecord:
        """Swap the record of an already committed batch for ``record`` (in-place reprocessing).

        Written beside the final name, then moved over it (``os.replace`` locally): a reader
        sees the old record or the new one, never a mix.
        """
        old = self.read_commit(record.batch)
        self._durable_so_far()
        self.fs.replace(self._commit_path(record.batch), record.to_json())
        return old

    # -- batch plans -----------------------------------------------------------------------
    def _plan_path(self, batch: int) -> str:
        return self.path(f"{PENDING}/{batch:020d}.json")

    def write_plan(self, plan: BatchPlan) -> None:
        self.fs.mkdirs(self.path(PENDING))
        self._raw_durable(plan)
        try:
            self.fs.create_new(self._plan_path(plan.batch), plan.to_json())
        except FileExistsError:
            raise LakeError(f"batch {plan.batch} already has a plan") from None

    def read_plan(self, batch: int) -> BatchPlan | None:
        path = self._plan_path(batch)
        if not self.fs.exists(path):
            return None
        try:
            return BatchPlan.from_json(self.fs.read_text(path))
        except Exception as exc:
            raise LakeError(f"batch plan {path} is unreadable: {exc}") from exc

    def drop_plans(self, upto: int) -> None:
        """Plans of committed batches are superseded by their commit records."""
        for name in self.fs.listdir(self.path(PENDING)):
            m = _COMMIT_NAME.match(name)
            if m and int(m.group(1)) <= upto:
                self.fs.rmtree(self.path(f"{PENDING}/{name}"))

    def replace_plan(self, plan: BatchPlan) -> None:
        """Point an unfinished batch at a fresh pull of the same range (same target)."""
        self._raw_durable(plan)
        self.fs.replace(self._plan_path(plan.batch), plan.to_json())

    # -- housekeeping ----------------------------------------------------------------------
    def _unreferenced_raw(self, batches: list[int], thorough: bool) -> list[str]:
        """Raw directories no record or plan names. A record names its own batch's raw
        directory (its batch number is in the name), so only the records of batches
        that have raw directories are read: a sync runs this before each batch, and
        reading the whole history there made a batch cost more the longer the lake lived
        (a hundred-table record parses in ~1.5 ms: ten thousand batches, 15 s a sync).

        The quick sweep keeps, unread, the one raw directory of a committed batch: an
        attempt that never got a plan has a batch number above the last commit, and the
        sweep before the next attempt removes it, so a committed batch's lone directory
        is its own. Where that could fail (a sweep skipped by hand) a directory is kept,
        never lost; ``thorough`` (``slotlake maintain``) also reads the record of a lone
        directory and removes those of batches below the last that no record has."""
        dirs = [(b, f"{RAW}/{name}") for b, name in batch_dirs(self.fs, self.path(RAW))]
        by_batch: dict[int, list[str]] = {}
        for b, rel in dirs:
            by_batch.setdefault(b, []).append(rel)
        committed, last = set(batches), (batches[-1] if batches else 0)
        out = []
        for b, rels in sorted(by_batch.items()):
            if b in committed:
                if len(rels) == 1 and not thorough:
                    continue
                named = {self.read_commit(b).raw}
            elif b > last:
                plan = self.read_plan(b)
                named = {plan.raw} if plan is not None else set()
            elif thorough:
                named = set()  # only batch b's record could name it, and there is none
            else:
                continue  # a gap in the history: not this sweep's to judge
            out += [rel for rel in rels if rel not in named]
        return out

    def remove_uncommitted(self, thorough: bool = False) -> list[str]:
        """Delete raw directories of attempts that never got a plan (crashed pulls) and
        temporary files left by a kill between a record's write and its rename
        (``thorough``: also a lone directory judged by its batch's record, see
        :meth:`_unreferenced_raw`, and a local lake's checkpoint scratch files too, see
        :meth:`_checkpoint_leftovers`).

        Delta tables need no such cleanup: a write either committed (and is then skipped
        on rerun) or left files no version references (VACUUM removes them). The caller
        holds the slot's advisory lock, so no attempt is in flight.
        """
        batches = self.commit_batches()
        if batches:
            self.drop_plans(batches[-1])  # a kill between a commit and its plan's removal
        removed = []
        for folder in (COMMITS, PENDING):
            for name in self.fs.listdir(self.path(folder)):
                if name.startswith(".") and name.endswith(".tmp"):
                    self.fs.rmtree(self.path(f"{folder}/{name}"))
                    removed.append(f"{folder}/{name}")
        for rel in self._unreferenced_raw(batches, thorough):
            self.fs.rmtree(self.path(rel))
            removed.append(rel)
        if thorough and self.local:
            removed += self._checkpoint_leftovers()
        return removed

    def _checkpoint_leftovers(self) -> list[str]:
        """Remove the scratch files a checkpoint write killed before its rename left in
        the Delta tables' logs (:func:`slotlake.delta_checkpoint.leftovers`): a listing
        of every table's log, so only the thorough sweep does it."""
        from slotlake import delta_checkpoint

        removed = []
        for rel in self.delta_tables():
            for name in delta_checkpoint.leftovers(str(self.root / rel)):
                os.unlink(name)
                removed.append(os.path.relpath(name, self.root))
        return removed

    def expire_raw(self, keep_batches: int) -> list[str]:
        """Delete raw directories of all but the newest ``keep_batches`` commits.

        The commit records keep naming them (so the history stays readable); reprocessing
        reports a missing raw directory by batch number.
        """
        if keep_batches < 0:
            return []
        batches = self.commit_batches()
        expired = set(batches[: max(0, len(batches) - keep_batches)])
        # Judged by the directories' batch numbers, no record read: a sync expires after
        # every batch, and reading the whole history there grew with the lake's age.
        removed = []
        for b, name in batch_dirs(self.fs, self.path(RAW)):
            if b in expired:
                self.fs.rmtree(self.path(f"{RAW}/{name}"))
                removed.append(f"{RAW}/{name}")
        return removed

    def expire_commits(self, keep_batches: int, state_versions: int) -> list[str]:
        """Delete the commit records of the oldest batches, keeping the newest
        ``keep_batches`` (-1: all), never fewer than ``state_versions`` + 1 (the batches
        maintain's VACUUM keeps readable, and the one before them that a reprocess starts
        from), and every record from the one before the oldest batch that still has raw
        payloads on (reprocessing and ``inspect --batch`` need a batch's record beside its
        raw). What goes is a prefix of the history, oldest first, so a kill meanwhile
        leaves a contiguous one; the newest record, which every run starts from, always
        stays.

        Each record names every table (1,000 tables: ~0.5 MB), and a lake synced every
        few minutes writes hundreds a day."""
        if keep_batches < 0:
            return []
        batches = self.commit_batches()
        cutoff = len(batches) - max(keep_batches, state_versions + 1, 1)
        with_raw = {b for b, _ in batch_dirs(self.fs, self.path(RAW))}
        oldest_raw = next((i for i, b in enumerate(batches) if b in with_raw), None)
        if oldest_raw is not None:
            cutoff = min(cutoff, oldest_raw - 1)  # that batch's record and the one before
        gone = batches[: max(0, cutoff)]
        if not gone:
            return []
        # Said first, so that a kill among the deletions leaves no record missing unsaid:
        # a reprocess must not take the oldest record left for the lake's first batch.
        upto = {"expired_upto": gone[-1], "at": utcnow_iso()}
        self.fs.replace(self.path(EXPIRED_COMMITS), json.dumps(upto) + "\n")
        removed = []
        for b in gone:
            rel = f"{COMMITS}/{b:020d}.json"
            self.fs.rmtree(self.path(rel))
            removed.append(rel)
        return removed

    def commits_expired_upto(self) -> int:
        """The newest batch whose commit record maintain expired (0: none ever was)."""
        path = self.path(EXPIRED_COMMITS)
        if not self.fs.exists(path):
            return 0
        return int(json.loads(self.fs.read_text(path))["expired_upto"])

    def write_compacted(self, batch: int, versions: Mapping[str, tuple[int, int]]) -> None:
        """Say that maintain compacted these tables after ``batch``'s record: relative path
        → (the version that record names, the newest, holding the same rows). Nothing to
        say: whatever an earlier maintain said goes."""
        if not versions:
            self.fs.rmtree(self.path(COMPACTED))
            return
        tables = {rel: list(pair) for rel, pair in sorted(versions.items())}
        self.fs.replace(self.path(COMPACTED), json.dumps({"batch": batch, "tables": tables}) + "\n")

    def compacted(self, batch: int) -> dict[str, tuple[int, int]]:
        """What :meth:`write_compacted` said after ``batch``'s record (nothing when it was
        said after another batch's: that batch's record named those versions or not)."""
        path = self.path(COMPACTED)
        if not self.fs.exists(path):
            return {}
        said = json.loads(self.fs.read_text(path))
        if said.get("batch") != batch:
            return {}
        return {rel: (int(a), int(b)) for rel, (a, b) in said["tables"].items()}

    def drop_compacted(self) -> None:
        self.fs.rmtree(self.path(COMPACTED))

    def delta_tables(self) -> list[str]:
        """Relative paths of every Delta table the newest commit names."""
        rec = self.last_commit()
        if rec is None:
            return []
        return sorted(rec.delta_versions())


def drop_torn_entries(lake: Lake, last: CommitRecord | None) -> dict[str, list[int]]:
    """Before an unfinished batch is redone on a local lake: every Delta table's log
    entries after the version the newest commit record names (all of a table it does not
    name) that a power loss left empty or torn, or naming files that are not whole, are
    removed (slotlake.durability); the versions removed, by table."""
    from slotlake import delta_log

    committed = last.delta_versions() if last is not None else {}
    root = local_path(lake.uri)
    rels = [TRANSACTIONS, MESSAGES, DDL] + [
        f"{kind}/{name}"
        for kind in (CHANGES, STATE)
        if (root / kind).is_dir()
        for name in sorted(os.listdir(root / kind))
    ]
    removed: dict[str, list[int]] = {}
    for rel in rels:
        after = committed.get(rel)
        gone = delta_log.drop_torn_entries(str(root / rel), -1 if after is None else after)
        if gone:
            removed[rel] = gone
            log.warning(
                "%s: log entries %s of an unfinished batch were not whole on disk, or named "
                "files that were not (a power loss before the batch's sync): removed, the "
                "batch writes them again",
                rel,
                ", ".join(map(str, gone)),
            )
    return removed


def utcnow_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def mark_gone(
    tables: dict[str, TableCommit], published: Collection[str] | None, batch: int
) -> None:
    """Mark the tables of a batch's record that left the source: not written by the batch
    and not in its published set (the publications' tables read before its target), from
    this batch on; a published name is the source's again. A table the batch wrote is
    left as it is even when the set lacks it: created and published after the set was
    read, it is not gone; dropped after its last change, the next batch marks it.
    ``published`` None (unknown): nothing changes."""
    if published is None:
        return
    for name, t in tables.items():
        if name in published:
            t.gone_since = None
        elif not t.written and t.gone_since is None:
            t.gone_since = batch


def adopt_compacted(record: CommitRecord, compacted: Mapping[str, tuple[int, int]]) -> list[str]:
    """Have ``record`` name, for each table it carries at a version maintain compacted since
    (:meth:`Lake.write_compacted`: no batch wrote the table after it), the compacted one:
    the same rows. Else the records of a quiet table kept naming the version before its
    OPTIMIZE, whose files that OPTIMIZE removed, for as long as the table stays quiet: a
    VACUUM or a log cleanup past their retention would take what its readers read
    (slotlake.maintain). A table the batch wrote names a version past both. The paths
    adopted."""
    adopted: list[str] = []

    def newest(rel: str | None, version: int | None) -> int | None:
        if rel is not None and rel in compacted and compacted[rel][0] == version:
            adopted.append(rel)
            return compacted[rel][1]
        return version

    for t in record.tables.values():
        t.changes_version = newest(t.changes, t.changes_version)
        t.state_version = newest(t.state, t.state_version)
    record.transactions_version = newest(record.transactions, record.transactions_version)
    record.messages_version = newest(record.messages, record.messages_version)
    record.ddl_version = newest(record.ddl, record.ddl_version)
    return adopted


def make_record(**kwargs: Any) -> CommitRecord:
    kwargs.setdefault("created_at", utcnow_iso())
    kwargs.setdefault("code_version", __version__)
    return CommitRecord(**kwargs)


# -- reading committed data without Spark --------------------------------------------------


def _record(root: str | Path, batch: int | None) -> CommitRecord:
    lake = Lake(root)
    if batch is None:
        rec = lake.last_commit()
        if rec is None:
            raise LakeError(f"lake {root} has no committed batch")
        return rec
    lake.layout()
    if batch not in lake.commit_batches():
        if batch <= lake.commits_expired_upto():
            raise LakeError(
                f"batch {batch}'s commit record in {root} was expired by slotlake maintain "
                "(lake.commit_retention_batches)"
            )
        raise LakeError(f"batch {batch} is not committed in {root}")
    return lake.read_commit(batch)


def table_names(root: str | Path, batch: int | None = None, *, gone: bool = False) -> list[str]:
    """The source tables the lake mirrors as of ``batch`` (default: the last committed);
    ``gone=True`` adds those that left the source (:attr:`TableCommit.gone_since`), whose
    Delta tables and change logs stay."""
    try:
        return sorted(
            n for n, t in _record(root, batch).tables.items() if gone or t.gone_since is None
        )
    except LakeError:
        if batch is None and Lake(root).last_commit() is None:
            return []
        raise


def _plain_types(table):  # type: ignore[no-untyped-def]
    """string_view/binary_view (what DataFusion returns) → string/binary, for every reader."""
    import pyarrow as pa

    def plain(t: pa.DataType) -> pa.DataType:
        if t == pa.string_view() or t == pa.large_string():
            return pa.string()
        if t == pa.binary_view() or t == pa.large_binary():
            return pa.binary()
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return pa.list_(plain(t.value_type))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, plain(f.type)) for f in t])
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), plain(t.item_type))
        return t

    schema = pa.schema([pa.field(f.name, plain(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def read_delta(root: str | Path, relative: str, version: int | None, sql: str | None = None):  # type: ignore[no-untyped-def]
    """A Delta table of the lake as of ``version``, through the ``deltalake`` package.

    deltalake's DataFusion reader handles the table features slotlake writes (deletion
    vectors, column mapping); ``sql`` may filter/project ``t`` (default ``SELECT *``).
    """
    path = (
        str(local_path(str(root)) / relative)
        if str(root).startswith("file://") or is_local(str(root))
        else f"{str(root).rstrip('/')}/{relative}"
    )
    if is_local(path) and not os.path.isdir(os.path.join(path, "_delta_log")):
        raise LakeError(f"committed Delta table {path} is missing")
    return query_delta(path, version, sql)


def query_delta(path: str, version: int | None = None, sql: str | None = None):  # type: ignore[no-untyped-def]
    """``sql`` over the Delta table at ``path`` (``t``; default ``SELECT *``) as of
    ``version`` (None: the latest), through deltalake's DataFusion reader (deletion
    vectors, column mapping), with plain Arrow types."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    from slotlake.table_processes import need_deltalake

    need_deltalake(f"{path}: a query")
    dt = DeltaTable(path, version=version)
    reader = QueryBuilder().register("t", dt).execute(sql or "SELECT * FROM t")
    return _plain_types(pa.table(reader.read_all()))


def read_changes(root: str | Path, table: str, batch: int | None = None):  # type: ignore[no-untyped-def]
    """The committed change log of ``table`` as a ``pyarrow.Table``, in commit order.

    ``batch=N`` reads it as of batch N. Columns renamed by a later batch are read under
    their new name (Delta column mapping); columns dropped at the source stay in the log.
    """
    rec = _record(root, batch)
    t = rec.tables.get(table)
    if t is None:
        raise LakeError(f"table {table!r} is not in the lake at {root}")
    if t.changes is None or t.changes_version is None:
        import pyarrow as pa

        return pa.table({})
    out = read_delta(root, t.changes, t.changes_version)
    return out.sort_by([("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending")])


def read_state(root: str | Path, table: str, batch: int | None = None):  # type: ignore[no-untyped-def]
    """The committed state (mirror) of ``table`` as a ``pyarrow.Table``, one row per source row.

    ``batch=N`` reads it as of batch N. A multiset table (REPLICA IDENTITY FULL or no key)
    is stored as distinct rows with a ``_copies`` count; here each row is repeated that
    many times and the count dropped, so the result always equals ``SELECT *``.
    """
    try:
        rec = _record(root, batch)
    except OldLayoutError:
        raise
    except LakeError:
        if batch is not None:
            raise
        raise LakeError(f"no committed state for table {table!r} in {root}") from None
    t = rec.tables.get(table)
    if t is None or not t.state or t.state_version is None:
        raise LakeError(f"no committed state for table {table!r} in {root}")
    if t.gone_since is not None:
        # The source has no such table: its last state is not the mirror of anything.
        raise LakeError(
            f"table {table!r} left the source in batch {t.gone_since} of {root} (dropped, "
            "renamed or removed from the publication); its last state is read with "
            f"batch={t.gone_since - 1}"
        )
    return expand_copies(read_delta(root, t.state, t.state_version))


def expand_copies(table):  # type: ignore[no-untyped-def]
    """A multiset's stored rows (distinct rows with ``_copies``) as plain rows, each repeated
    its count and the count dropped; a table without ``_copies`` as it is."""
    if COPIES not in table.column_names:
        return table
    import numpy as np

    copies = table.column(COPIES).to_numpy(zero_copy_only=False)
    return table.drop_columns([COPIES]).take(np.repeat(np.arange(len(copies)), copies))


def one_copy_each(table):  # type: ignore[no-untyped-def]
    """Plain rows (a keyed state's) as a multiset's, each counted once; a table with
    ``_copies`` as it is."""
    if COPIES in table.column_names:
        return table
    import pyarrow as pa

    return table.append_column(COPIES, pa.repeat(pa.scalar(1, pa.int64()), table.num_rows))


def _read_dataset(root: str | Path, kind: str, batch: int | None, order: str):  # type: ignore[no-untyped-def]
    rec = _record(root, batch)
    rel, version = {
        TRANSACTIONS: (rec.transactions, rec.transactions_version),
        MESSAGES: (rec.messages, rec.messages_version),
        DDL: (rec.ddl, rec.ddl_version),
    }[kind]
    if rel is None or version is None:
        raise LakeError(f"lake {root} has no committed {kind} dataset")
    return read_delta(root, rel, version).sort_by(order)


def read_transactions(root: str | Path, batch: int | None = None):  # type: ignore[no-untyped-def]
    """Every committed transaction (commit/end LSN, time, xid, origin), in commit order."""
    return _read_dataset(root, TRANSACTIONS, batch, "commit_lsn")


def read_messages(root: str | Path, batch: int | None = None):  # type: ignore[no-untyped-def]
    """Every committed logical decoding message (pg_logical_emit_message), in LSN order."""
    return _read_dataset(root, MESSAGES, batch, "lsn")


def read_ddl(root: str | Path, batch: int | None = None):  # type: ignore[no-untyped-def]
    """Every committed DDL command the capture trigger put into the stream, in LSN order:
    ``event``, ``tag``, ``query``, ``tables`` (name, oid, rewrite), ``columns``,
    ``missing``, the message's ``lsn``/``commit_lsn``/``tx_ordinal``/``xid``, ``_batch``."""
    return _read_dataset(root, DDL, batch, "lsn")
