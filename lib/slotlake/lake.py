"""The lake's layout, its commit records, and reading committed data without Spark.

Layout under the lake root::

    _commits/00000000000000000007.json       one record per committed batch (the commit point)
    _raw/b00000000000000000007-<attempt>/     raw payloads of batch 7 (part-*.parquet)
    changes/<schema>.<table>/b…-<attempt>/    change log rows written by batch 7
    state/<schema>.<table>/b…-<attempt>/      a full version of the table's state as of batch 7
    transactions/b…-<attempt>/, messages/b…-<attempt>/

Every batch writes into directories named by its batch number *and* a random attempt id,
so a crashed attempt can never mix its files with a later one. Nothing a batch writes is
part of the lake until its commit record exists; the record names every directory the
batch made visible, and for each table the state version in force. Readers therefore
start from the newest commit record, never from a directory listing. The record is
written to a temporary name and renamed, which is atomic on POSIX file systems and HDFS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slotlake import __version__
from slotlake.lsn import Lsn

COMMITS = "_commits"
RAW = "_raw"
CHANGES = "changes"
STATE = "state"
TRANSACTIONS = "transactions"
MESSAGES = "messages"
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")


class LakeError(RuntimeError):
    pass


@dataclass
class TableCommit:
    """What one batch did to one table."""

    changes: str | None  # directory of this batch's change log rows (relative to the root)
    state: str | None  # directory of the table's state version in force after the batch
    change_rows: int = 0
    state_rows: int = 0
    columns: list[list[str]] = field(default_factory=list)  # [name, spark ddl type]
    key_columns: list[str] = field(default_factory=list)
    replica_identity: str = ""
    renames: dict[str, str] = field(
        default_factory=dict
    )  # columns renamed by this batch: old → new


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

    @property
    def end(self) -> Lsn:
        return Lsn.parse(self.end_lsn)

    @property
    def start(self) -> Lsn:
        return Lsn.parse(self.start_lsn)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CommitRecord:
        raw = json.loads(text)
        raw["tables"] = {k: TableCommit(**v) for k, v in raw.get("tables", {}).items()}
        return cls(**raw)


def batch_dir_name(batch: int, attempt: str) -> str:
    return f"b{batch:020d}-{attempt}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def table_dir_name(table: str) -> str:
    """A directory name for ``schema.table`` that every file system and Hadoop path accepts.

    PostgreSQL identifiers may hold '/', ':', spaces or quotes; those are replaced, and a
    short hash of the real name keeps two such names apart. Readers go through the commit
    record, which maps the real name to its directories, so this need not be reversible.
    """
    if not _UNSAFE.search(table) and not table.startswith("."):
        return table
    import hashlib

    digest = hashlib.sha1(table.encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', table).lstrip('.')}-{digest}"


def new_attempt() -> str:
    return uuid.uuid4().hex[:12]


def is_local(root: str) -> bool:
    """A plain path (no URI scheme): the lake's files are handled with Python's os."""
    return "://" not in root


def local_path(root: str) -> Path:
    return Path(root[len("file://") :] if root.startswith("file://") else root)


class LocalFS:
    """File operations of a lake on the local file system (plain paths)."""

    def join(self, root: str, relative: str) -> str:
        return str(Path(root) / relative)

    def exists(self, p: str) -> bool:
        return os.path.exists(p)

    def isdir(self, p: str) -> bool:
        return os.path.isdir(p)

    def listdir(self, p: str) -> list[str]:
        return sorted(os.listdir(p)) if os.path.isdir(p) else []

    def read_text(self, p: str) -> str:
        return Path(p).read_text()

    def _write(self, tmp: Path, text: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def create_new(self, p: str, text: str) -> None:
        final = Path(p)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            raise FileExistsError(p)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        self._write(tmp, text)
        try:
            # link fails if the final name appeared meanwhile, where rename would replace it.
            os.link(tmp, final)
        finally:
            os.unlink(tmp)
        _fsync_dir(final.parent)

    def replace(self, p: str, text: str) -> None:
        final = Path(p)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        self._write(tmp, text)
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def rmtree(self, p: str) -> None:
        shutil.rmtree(p, ignore_errors=True)

    def mkdirs(self, p: str) -> None:
        Path(p).mkdir(parents=True, exist_ok=True)

    def upload_dir(self, local_dir: str, p: str) -> None:
        shutil.copytree(local_dir, p)

    def download_dir(self, p: str, local_dir: str) -> None:
        shutil.copytree(p, local_dir)


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


class Lake:
    """A lake root: a local path, or any Hadoop file system URI (hdfs://, s3a://, file://).

    Plain paths are handled with Python's os; URIs through Spark's Hadoop FileSystem
    (:mod:`slotlake.hadoopfs`) with the active SparkSession's configuration. The readers
    for pandas/pyarrow/DuckDB (``read_changes``, ``read_state``) work on local roots.
    """

    def __init__(self, root: str | Path, fs: Any = None) -> None:
        self.uri = str(root)
        self.local = is_local(self.uri)
        self.root = local_path(self.uri)
        self.fs = _file_system(self.uri, fs)

    # -- paths -----------------------------------------------------------------------------
    def path(self, relative: str) -> str:
        return self.fs.join(self.uri, relative)

    def batch_path(self, kind: str, batch: int, attempt: str, table: str | None = None) -> str:
        """Relative path of a directory that batch/attempt writes."""
        parts = (
            [kind] + ([table_dir_name(table)] if table else []) + [batch_dir_name(batch, attempt)]
        )
        return "/".join(parts)

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self.path(relative))

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
        except Exception as exc:
            raise LakeError(f"commit record {path} is unreadable: {exc}") from exc

    def last_commit(self) -> CommitRecord | None:
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
        final = self._commit_path(record.batch)
        self.fs.mkdirs(self.path(COMMITS))
        try:
            self.fs.create_new(final, record.to_json())
        except FileExistsError:
            raise LakeError(f"batch {record.batch} is already committed ({final})") from None

    def replace_commit(self, record: CommitRecord) -> CommitRecord:
        """Swap the record of an already committed batch for ``record`` (in-place reprocessing).

        Written beside the final name, then moved over it (``os.replace`` locally): a reader
        sees the old record or the new one, never a mix, and the directories each names
        are complete. Returns the record replaced; deleting the directories only it named
        is the caller's job (after readers had a chance to finish).
        """
        old = self.read_commit(record.batch)
        self.fs.replace(self._commit_path(record.batch), record.to_json())
        return old

    # -- housekeeping ----------------------------------------------------------------------
    def referenced_dirs(self) -> set[str]:
        """Every directory some commit record names (raw, changes, state versions, …)."""
        out: set[str] = set()
        for rec in self.commits():
            for p in (rec.raw, rec.transactions, rec.messages):
                if p:
                    out.add(p)
            for t in rec.tables.values():
                for p in (t.changes, t.state):
                    if p:
                        out.add(p)
        return out

    def remove_uncommitted(self, keep_attempt: str | None = None) -> list[str]:
        """Delete directories left by attempts that never committed (crashed runs).

        Only directories that follow the batch naming and that no commit names are
        removed; the caller holds the slot's advisory lock, so no attempt is in flight.
        """
        referenced = self.referenced_dirs()
        removed = []
        # A commit record's temporary file, left by a kill between its write and its rename.
        for name in self.fs.listdir(self.path(COMMITS)):
            if name.startswith(".") and name.endswith(".tmp"):
                self.fs.rmtree(self.path(f"{COMMITS}/{name}"))
                removed.append(f"{COMMITS}/{name}")
        for kind in (RAW, CHANGES, STATE, TRANSACTIONS, MESSAGES):
            if kind in (RAW, TRANSACTIONS, MESSAGES):
                parents = [kind]
            else:
                parents = [f"{kind}/{t}" for t in self.fs.listdir(self.path(kind))]
            for parent in parents:
                for name in self.fs.listdir(self.path(parent)):
                    if not re.match(r"^b\d{20}-[0-9a-f]+$", name):
                        continue
                    rel = f"{parent}/{name}"
                    if rel in referenced or (keep_attempt and name.endswith(keep_attempt)):
                        continue
                    self.fs.rmtree(self.path(rel))
                    removed.append(rel)
        return removed

    def expire_raw(self, keep_batches: int) -> list[str]:
        """Delete raw directories of all but the newest ``keep_batches`` commits.

        The commit records keep naming them (so the history stays readable); reprocessing
        reports a missing raw directory by batch number.
        """
        if keep_batches < 0:
            return []
        records = list(self.commits())
        removed = []
        for rec in records[: max(0, len(records) - keep_batches)]:
            if rec.raw and self.exists(rec.raw):
                self.fs.rmtree(self.path(rec.raw))
                removed.append(rec.raw)
        return removed

    def expire_states(self, keep_versions: int) -> list[str]:
        """Keep, per table, the state version in force plus ``keep_versions`` older ones.

        Reprocessing starts from the state in force before its first batch, so with
        ``keep_versions = K`` it can start up to K batches back (versions count batches
        that changed the table, so a quiet table keeps older states longer).
        """
        records = list(self.commits())
        removed = []
        in_force: dict[str, list[str]] = {}
        for rec in records:
            for table, t in rec.tables.items():
                versions = in_force.setdefault(table, [])
                if t.state and (not versions or versions[-1] != t.state):
                    versions.append(t.state)
        for versions in in_force.values():
            for old in versions[: max(0, len(versions) - 1 - max(0, keep_versions))]:
                if self.exists(old):
                    self.fs.rmtree(self.path(old))
                    removed.append(old)
        return removed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def utcnow_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def make_record(**kwargs: Any) -> CommitRecord:
    kwargs.setdefault("created_at", utcnow_iso())
    kwargs.setdefault("code_version", __version__)
    return CommitRecord(**kwargs)


# -- reading committed data without Spark --------------------------------------------------


def _parquet_files(directory: Path) -> list[str]:
    if not directory.is_dir():
        raise LakeError(f"committed directory {directory} is missing")
    return sorted(str(p) for p in directory.glob("*.parquet"))


def table_names(root: str | Path) -> list[str]:
    rec = Lake(root).last_commit()
    return sorted(rec.tables) if rec else []


def committed_change_files(root: str | Path, table: str) -> list[str]:
    """Parquet files of the committed change log of ``table``, oldest batch first."""
    return [f for files, _ in _change_files_by_batch(root, table) for f in files]


def _change_files_by_batch(root: str | Path, table: str) -> list[tuple[list[str], dict[str, str]]]:
    """(files, renames made by later batches) per committed batch that logged ``table``."""
    lake = Lake(root)
    out: list[tuple[list[str], dict[str, str]]] = []
    for rec in lake.commits():
        t = rec.tables.get(table)
        if t is None:
            continue
        for _, later in out:
            # Compose renames: a column renamed a→b then b→c maps a→c.
            for old, new in list(later.items()):
                later[old] = t.renames.get(new, new)
            for old, new in t.renames.items():
                later.setdefault(old, new)
        if t.changes:
            out.append((_parquet_files(lake.root / t.changes), {}))
    return out


def committed_state_files(root: str | Path, table: str) -> list[str]:
    """Parquet files of the state version of ``table`` in force at the newest commit."""
    lake = Lake(root)
    rec = lake.last_commit()
    if rec is None or table not in rec.tables or not rec.tables[table].state:
        raise LakeError(f"no committed state for table {table!r} in {root}")
    return _parquet_files(lake.root / rec.tables[table].state)


def _read_files(files: list[str]):  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not files:
        return None
    tables = [pq.read_table(f) for f in files]
    return pa.concat_tables(tables, promote_options="permissive")


def read_changes(root: str | Path, table: str):  # type: ignore[no-untyped-def]
    """The committed change log of ``table`` as a ``pyarrow.Table``, in commit order.

    Columns renamed by a later batch are read under their new name; columns a batch did
    not have are null there (``concat_tables`` with permissive promotion, which also
    widens types that a later batch widened).
    """
    import pyarrow as pa

    rec = Lake(root).last_commit()
    if rec is None or table not in rec.tables:
        raise LakeError(f"table {table!r} is not in the lake at {root}")
    parts = []
    for files, renames in _change_files_by_batch(root, table):
        part = _read_files(files)
        if part is not None:
            if renames:
                part = part.rename_columns([renames.get(n, n) for n in part.column_names])
            parts.append(part)
    if not parts:
        return pa.table({})
    t = pa.concat_tables(parts, promote_options="permissive")
    return t.sort_by([("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending")])


def read_state(root: str | Path, table: str):  # type: ignore[no-untyped-def]
    """The committed state (mirror) of ``table`` as a ``pyarrow.Table``."""
    import pyarrow.parquet as pq

    files = committed_state_files(root, table)
    if not files:
        raise LakeError(f"state of {table!r} has no files")
    return _read_files(files) if len(files) > 1 else pq.read_table(files[0])
