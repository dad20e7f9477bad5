"""``slotlake maintain``: compact and VACUUM the lake's Delta tables, expire raw batches.

One run, under the slot's advisory lock (the lock ``sync`` and ``bootstrap`` take, so it
never runs beside a batch of the same slot; a run that finds it taken does nothing):

1. ``OPTIMIZE`` every Delta table the newest commit record names: small files (one or a
   few per batch) are compacted, and files whose rows are mostly deleted (deletion
   vectors left by MERGE) are rewritten. OPTIMIZE changes no row: it is a commit that
   removes the old files and adds the compacted ones (``dataChange = false``). On a
   local lake a table whose log shows nothing to bin or purge is left out
   (:func:`optimize_may_change`), and so is the VACUUM of one whose files hold nothing
   old enough (:func:`vacuum_may_delete`): their Spark jobs cost ~1 s and ~3 s a table,
   and maintain holds the lock the syncs need meanwhile.
2. ``VACUUM`` every such table with a retention that keeps what readers may still use;
   on a local lake, the key indexes of the files it deleted go too (:mod:`slotlake.key_index`),
   and a keyed state's big files without one get theirs: the files OPTIMIZE wrote would
   otherwise have the next batch make them (~0.1 s a million rows); and the log entries
   and checkpoints past the table's ``delta.logRetentionDuration`` below its newest such
   checkpoint go (:func:`clean_up_log`: the driver's commits are followed by no Spark
   writer's cleanup).
3. Raw batches beyond ``lake.raw_retention_batches`` are deleted (:meth:`Lake.expire_raw`),
   and so are leftovers of attempts that never committed and checkpoint scratch files of
   a killed writer (:meth:`Lake.remove_uncommitted`); then commit records beyond
   ``lake.commit_retention_batches``, but never those of batches the VACUUM above keeps
   readable or that still have raw payloads (:meth:`Lake.expire_commits`).

**Why the VACUUM retention is safe.** VACUUM deletes a file when no commit of the table's
current version references it *and* it was removed (its tombstone's deletion timestamp;
for a file never committed, its modification time) more than ``retention`` hours ago.
Readers of the lake go through commit records and read each table *as of* the version
the record names. A file that version *v* of a table uses is therefore either still in
the table's current version (VACUUM never touches it) or was removed by a commit made
after *v*. Every commit to a lake table is made by a run holding the slot's lock (a
sync batch, bootstrap, or maintain itself), and runs are serial: a commit made while
batch *B* runs happens after record *B-1* was written, and the version record *B* names
for a table is the table's last commit before record *B* exists. So every commit after
a version named in record *B* — and with it every tombstone of a file that version uses —
is younger than the ``created_at`` of record *B-1*. Retaining

    max(lake.vacuum_min_age_hours,
        ceil(hours since the oldest created_at among the newest K+1 records) + 1)

with K = ``lake.state_versions`` keeps every file of the versions the newest K records
name: all tables as of any of those batches stay readable (time travel), and so do the
start points of reprocessing them (the state committed by the batch before). The
``+ 1`` hour absorbs clock skew between the machine that wrote a record and the one whose
clock stamps the Delta commits and runs VACUUM; the ceiling absorbs Delta's rounding of
the retention to whole hours. With fewer than K+1 records, the lake's creation time (its
layout marker) stands in for record *B-1*. Taking the oldest ``created_at`` of the
window, not the record *B-1* alone, covers records replaced by ``reprocess --in-place``.

The argument needs the version the newest record names to be the table's newest, and
maintain's own OPTIMIZE breaks that for a table that no batch writes after it: a batch
carries a quiet table's version forward, whose files the OPTIMIZE removed, and readers
read that version. So maintain says which tables it left at a compacted version past the
one the newest record names, with only OPTIMIZEs between (``_commits/compacted.json``,
:meth:`Lake.write_compacted`), and the next batch's record names those versions, the
same rows (:func:`slotlake.lake.adopt_compacted`). Before that record, the window
argument holds as it is: the OPTIMIZE came after every record of the window. As a net
for a record that still names such a version (a lake whose next batch did not adopt it:
an in-place reprocess drops the note, as it restores the tables), a table whose commits
after the version the newest record names removed a file before the retention's cutoff
is not vacuumed (the run says so), and a table whose newest version is not the one the
newest record names has no expired log entries removed (a checkpoint past that version
would let the cleanup take the entries its readers need). An OPTIMIZE of the same run
removes files now, within any retention: the VACUUM after it runs.

The minimum age protects what the window does not: a reader that pinned a version which
has since left the window (a long job, a dashboard's cached snapshot), or one reading
a table's latest version directly; any file removed less than that many hours ago stays.
Default 24 h (Delta's own default retention is 7 days, which a lake synced every few
minutes does not need once the commit records bound what readers use).

Delta refuses a retention below the table's ``delta.deletedFileRetentionDuration``
(default 7 days) unless ``spark.databricks.delta.retentionDurationCheck.enabled`` is
false, and Delta 4 ignores VACUUM's retention argument altogether (other than 0) while
``spark.databricks.delta.vacuum.retentionWindowIgnore.enabled`` is true, its default,
applying the table property instead. maintain sets both to false in the Spark session
of its own VACUUM only (never the session it was given), after computing the retention
above, and reads back from the VACUUM START commit which retention Delta applied: if a
Delta version no longer honours the flag, the table's longer retention applies, which
keeps more and is reported. A retention *above* that duration is not safe either: Delta drops
tombstones older than it from the table's state, and VACUUM then treats their files as
never committed (deleted by modification time). Such a table is not vacuumed, and the run
says so: keep fewer batches (``lake.state_versions``) or raise the table's
``delta.deletedFileRetentionDuration``. Time travel also needs the table's log entries,
which Delta keeps for ``delta.logRetentionDuration`` (30 days by default).

OPTIMIZE and VACUUM commit to the tables, so maintain also refuses to run while a batch
is unfinished (a plan in ``_pending/``): the next sync finishes that batch first. Pause
maintain, as you pause sync, while ``reprocess --in-place`` runs: reprocessing takes no
lock.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from slotlake import delta_log
from slotlake.config import Config
from slotlake.delta_checkpoint import (
    DEFAULT_TOMBSTONE_RETENTION,
    TOMBSTONE_RETENTION,
    interval_hours,
)
from slotlake.lake import CommitRecord, Lake, is_local, local_path
from slotlake.source import locked_message

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CLOCK_SKEW_HOURS = 1
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
RETENTION_WINDOW_IGNORE = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
SPARK_DEFAULT_LISTING_PARALLELISM = "10000"
# OPTIMIZE bins files below this size together (Delta's default: 1 GiB).
OPTIMIZE_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
DEFAULT_MIN_FILE_SIZE = str(1 << 30)
# A removal this close to VACUUM's cutoff counts as past it (a commit's time and its
# removals' differ by the commit's own duration).
SLACK_S = 600


class MaintainError(RuntimeError):
    pass


@dataclass
class Retention:
    """How long VACUUM keeps removed files, and why."""

    hours: int
    anchor: datetime | None  # files removed after this instant are kept for the window
    min_age_hours: int

    def describe(self) -> str:
        if self.anchor is None:
            return f"{self.hours} h (the minimum age)"
        return (
            f"{self.hours} h (files removed since {self.anchor.isoformat(timespec='seconds')}, "
            f"at least {self.min_age_hours} h)"
        )


@dataclass
class TableMaintenance:
    path: str  # relative to the lake root
    files_compacted: int = 0  # files OPTIMIZE replaced
    files_written: int = 0  # files OPTIMIZE wrote in their place
    vacuumed: bool = False
    files_deleted: int = 0  # files and directories VACUUM deleted
    # Steps a local table's check found nothing for (optimize_may_change, vacuum_may_delete)
    optimize_skipped: bool = False
    gone: bool = False  # a table gone from the source: not compacted (maintain_table)
    # (the version the newest record names, the newest) when only OPTIMIZEs came between:
    # the next batch's record names the newest (Lake.write_compacted).
    compacted_from: tuple[int, int] | None = None
    vacuum_skipped: bool = False
    note: str = ""  # why the table was not vacuumed
    seconds: float = 0.0
    optimize_seconds: float = 0.0
    vacuum_seconds: float = 0.0
    # A state's files with a key index once done (slotlake.key_index: made here for files
    # OPTIMIZE wrote, so the next batch's MERGE need not), and the seconds that took.
    key_indexes: int = 0
    index_seconds: float = 0.0
    # Log entries and checkpoints past the table's delta.logRetentionDuration removed (a
    # local lake's: see clean_up_log).
    log_files_removed: int = 0
    error: str | None = None

    def describe(self) -> str:
        parts = [
            f"compacted {self.files_compacted} files into {self.files_written}"
            if self.files_compacted
            else "nothing to compact" + (" (OPTIMIZE not run)" if self.optimize_skipped else "")
        ]
        if self.gone:
            parts[0] = "gone from the source: not compacted"
        if self.vacuum_skipped:
            parts.append("nothing old enough for VACUUM to delete (not run)")
        elif self.vacuumed:
            parts.append(f"VACUUM deleted {self.files_deleted} files")
            if self.note:
                parts.append(self.note)
        elif self.note:
            parts.append(f"not vacuumed: {self.note}")
        if self.key_indexes:
            parts.append(f"{self.key_indexes} files' key indexes ready")
        if self.log_files_removed:
            parts.append(f"{self.log_files_removed} expired log files removed")
        if self.error:
            parts.append(f"FAILED: {self.error}")
        indexes = f", key indexes {self.index_seconds:.1f} s" if self.key_indexes else ""
        return (
            f"{self.path}: {', '.join(parts)} ({self.seconds:.1f} s: OPTIMIZE "
            f"{self.optimize_seconds:.1f} s, VACUUM {self.vacuum_seconds:.1f} s{indexes})"
        )


@dataclass
class MaintainResult:
    status: str  # done | locked | empty | unfinished
    retention: Retention | None = None
    tables: list[TableMaintenance] = field(default_factory=list)
    raw_expired: list[str] = field(default_factory=list)
    commits_expired: list[str] = field(default_factory=list)
    uncommitted_removed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def files_compacted(self) -> int:
        return sum(t.files_compacted for t in self.tables)

    @property
    def files_written(self) -> int:
        return sum(t.files_written for t in self.tables)

    @property
    def files_deleted(self) -> int:
        return sum(t.files_deleted for t in self.tables)

    def summary(self) -> str:
        if self.status != "done":
            return f"status: {self.status}, nothing done"
        vacuumed = sum(t.vacuumed for t in self.tables)
        clean = sum(t.vacuum_skipped for t in self.tables)
        retention = self.retention.describe() if self.retention else "-"
        return (
            f"status: done, {len(self.tables)} tables: {self.files_compacted} files compacted "
            f"into {self.files_written}; {vacuumed} tables vacuumed ({clean} more had nothing "
            f"old enough to delete), retention {retention}, "
            f"{self.files_deleted} files deleted; {len(self.raw_expired)} raw batches and "
            f"{len(self.commits_expired)} commit records expired ({self.seconds:.1f} s)"
        )


def _parse_ts(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def vacuum_retention(
    created: Sequence[str],
    keep: int,
    min_age_hours: int,
    now: datetime,
    lake_created: str | None = None,
) -> Retention:
    """The VACUUM retention that keeps the versions of the newest ``keep`` commit records.

    ``created``: the ``created_at`` of the newest ``keep + 1`` commit records or more (all
    of them when there are no more), in batch order. See the module
    docstring for why the anchor is the oldest ``created_at`` among the newest ``keep + 1``
    records (the lake's creation when there are no more than ``keep``).
    """
    keep = max(1, keep)
    min_age = max(0, min_age_hours)
    anchors = [_parse_ts(c) for c in created[-(keep + 1) :]]
    if len(created) <= keep and lake_created:
        anchors.append(_parse_ts(lake_created))
    if not anchors:
        return Retention(min_age, None, min_age)
    anchor = min(anchors)
    age_hours = max(0.0, (now - anchor).total_seconds() / 3600)
    hours = max(min_age, math.ceil(age_hours) + CLOCK_SKEW_HOURS)
    return Retention(hours, anchor, min_age)


def _session(cfg: Config) -> SparkSession:
    from slotlake.spark import build_session

    return build_session("slotlake-maintain", cfg.spark)


def _optimize(session: SparkSession, path: str) -> tuple[int, int]:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(session, path).optimize().executeCompaction().first()
    metrics = row["metrics"] if row is not None else None
    if metrics is None:
        return 0, 0
    return int(metrics["numFilesRemoved"] or 0), int(metrics["numFilesAdded"] or 0)


def _tombstone_retention(session: SparkSession, path: str) -> float | None:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(session, path).detail().select("properties").first()
    props = dict(row["properties"] or {}) if row is not None else {}
    return interval_hours(props.get(TOMBSTONE_RETENTION, DEFAULT_TOMBSTONE_RETENTION))


def _vacuum(session: SparkSession, path: str, hours: int) -> tuple[int, float | None]:
    """VACUUM the table keeping ``hours``.

    Returns the number of files and directories deleted and the retention (hours) Delta
    actually applied, None if it used the table's own ``delta.deletedFileRetentionDuration``.
    """
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(session, path)
    before = table.history(1).select("version").first()
    table.vacuum(float(hours))
    # With vacuum logging on, VACUUM START/END commits carry its parameters and metrics.
    deleted, applied = 0, None
    rows = table.history(4).select(
        "version", "operation", "operationParameters", "operationMetrics"
    )
    for row in rows.collect():
        if before is not None and row["version"] <= before[0]:
            continue
        if row["operation"] == "VACUUM END":
            deleted = int((row["operationMetrics"] or {}).get("numDeletedFiles", 0))
        elif row["operation"] == "VACUUM START":
            millis = (row["operationParameters"] or {}).get("specifiedRetentionMillis")
            applied = int(millis) / 3_600_000 if millis is not None else None
    return deleted, applied


def bound_listing(session: SparkSession) -> None:
    """VACUUM repartitions its listing of a table's files into
    ``spark.sql.sources.parallelPartitionDiscovery.parallelism`` partitions: left at
    Spark's default (10000 tasks, a cluster's; slotlake's local sessions set 4), a small
    table's VACUUM takes 20-40 s instead of 3 on two cores. The cluster's parallelism
    suffices; a value set on purpose is kept."""
    if session.conf.get(LISTING_PARALLELISM) == SPARK_DEFAULT_LISTING_PARALLELISM:
        parallelism = max(1, session.sparkContext.defaultParallelism)
        session.conf.set(LISTING_PARALLELISM, str(parallelism))


def maintain_table(
    spark: SparkSession,
    lake: Lake,
    relative: str,
    retention: Retention,
    key_columns: Sequence[str] = (),
    named_version: int | None = None,
    compact: bool = True,
) -> TableMaintenance:
    """OPTIMIZE then VACUUM one Delta table of the lake, in a Spark session of its own;
    a keyed state (``key_columns``) on a local lake then has its big files' key indexes
    made. On a local lake either step is left out when its check finds nothing for it
    (:func:`optimize_may_change`, :func:`vacuum_may_delete`), and expired log files go
    (:func:`clean_up_log`). ``named_version``: the version the newest commit record
    names; no VACUUM while commits after it removed files before the retention's cutoff,
    and no log cleanup while it is not the newest (module docstring).
    ``compact`` False: no OPTIMIZE (a table gone from the source, whose version the
    records name for good)."""
    out = TableMaintenance(relative)
    t0 = time.monotonic()
    session = spark.newSession()
    path = lake.path(relative)
    local = str(local_path(path)) if is_local(path) else None
    try:
        min_size = int(session.conf.get(OPTIMIZE_MIN_FILE_SIZE, DEFAULT_MIN_FILE_SIZE) or 0)
        snap = readable_snapshot(local) if local is not None else None
        out.gone = not compact
        if compact and (local is None or optimize_may_change(snap, min_size)):
            out.files_compacted, out.files_written = _optimize(session, path)
            if local is not None:  # OPTIMIZE committed: VACUUM's check reads the new version
                snap = readable_snapshot(local)
        else:
            out.optimize_skipped = True
        out.optimize_seconds = time.monotonic() - t0
        t1 = time.monotonic()
        since = None
        if named_version is not None:
            newest = snap.version if snap is not None else None
            since = since_named(session, path, local, named_version, newest)
            if since.newest != named_version and since.compactions_only:
                out.compacted_from = (named_version, since.newest)
        removed = since.first_removal if since is not None else None
        if removed is not None and removed < time.time() - retention.hours * 3600 + SLACK_S:
            out.note = (
                f"a commit after version {named_version}, which the newest commit record "
                "names and readers still read, removed files it uses: vacuumed once a "
                "batch writes the table"
            )
        elif local is not None and not vacuum_may_delete(local, snap, retention.hours):
            out.vacuum_skipped = True
        else:
            _vacuum_within(session, path, retention, out)
        out.vacuum_seconds = time.monotonic() - t1
        if key_columns and local is not None:
            from slotlake import dv_merge

            t1 = time.monotonic()
            out.key_indexes = dv_merge.make_key_indexes(local, key_columns)
            out.index_seconds = time.monotonic() - t1
        # Not below a version the records name that is not the newest: a checkpoint past
        # it would let the cleanup take the log entries its readers need.
        if local is not None and (since is None or since.newest == named_version):
            out.log_files_removed = clean_up_log(local)
    except Exception as exc:
        log.debug("maintaining %s failed", path, exc_info=True)
        out.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    out.seconds = time.monotonic() - t0
    return out


@dataclass
class SinceNamed:
    """A table's commits after the version the newest commit record names."""

    newest: int  # the table's newest version
    first_removal: float | None  # when they first removed a file (epoch seconds)
    compactions_only: bool  # all OPTIMIZE: the newest holds the named version's rows


def since_named(
    session: SparkSession | None,
    path: str,
    local: str | None,
    version: int,
    newest: int | None = None,
) -> SinceNamed:
    """What the table's commits after ``version`` did. A local log is read for the
    removals' own times; other file systems, and a local log whose entries since are
    gone, are read through Delta's history (``session``), whose commit times are no
    later. Without a session such a log counts as changed since (not compactions only).
    ``newest``: the local table's newest version when the caller read it already."""
    if newest == version:
        return SinceNamed(version, None, True)
    if local is not None:
        log_dir = os.path.join(local, "_delta_log")
        try:
            if newest is None:
                newest = delta_log.snapshot(local).version
            stamps, operations = [], set()
            for v in range(version + 1, newest + 1):
                for action in delta_log.entry_actions(log_dir, v):
                    if "remove" in action:
                        stamps.append(int(action["remove"].get("deletionTimestamp") or 0))
                    elif "commitInfo" in action:
                        operations.add(action["commitInfo"].get("operation"))
            return SinceNamed(
                newest, min(stamps) / 1000 if stamps else None, operations <= {"OPTIMIZE"}
            )
        except (LookupError, OSError, ValueError):
            if session is None:
                return SinceNamed(version + 1, 0.0, False)
    from slotlake import delta

    assert session is not None, "a table off the local disk is read through Spark"
    newest = delta.last_commit(session, path).version
    if newest == version:
        return SinceNamed(newest, None, True)
    from delta.tables import DeltaTable

    rows = (
        DeltaTable.forPath(session, path)
        .history()
        .where(f"version > {int(version)}")
        .selectExpr("unix_millis(timestamp) AS at", "operation")
        .collect()
    )
    return SinceNamed(
        newest,
        min(r["at"] for r in rows) / 1000 if rows else None,
        all(r["operation"] == "OPTIMIZE" for r in rows),
    )


def _vacuum_within(
    session: SparkSession, path: str, retention: Retention, out: TableMaintenance
) -> None:
    """VACUUM the table at ``path`` keeping ``retention`` where its tombstone retention
    allows that (else ``out.note`` says why not)."""
    allowed = _tombstone_retention(session, path)
    if allowed is None:
        out.note = f"its {TOMBSTONE_RETENTION} is not a plain interval"
        return
    if retention.hours > allowed:
        out.note = (
            f"the retention the kept batches need ({retention.hours} h) exceeds the "
            f"table's {TOMBSTONE_RETENTION} ({allowed:g} h), past which Delta forgets "
            "removed files: keep fewer batches (lake.state_versions) or raise that property"
        )
        return
    if retention.hours < allowed:
        # Safe by the argument in the module docstring; this session only.
        session.conf.set(RETENTION_CHECK, "false")
    # Delta 4 ignores VACUUM's retention argument (other than 0) unless told not to,
    # and applies the table's delta.deletedFileRetentionDuration instead.
    session.conf.set(RETENTION_WINDOW_IGNORE, "false")
    session.conf.set(VACUUM_LOGGING, "true")
    bound_listing(session)
    out.files_deleted, applied = _vacuum(session, path, retention.hours)
    if is_local(path):  # the MERGE's key indexes of files VACUUM deleted
        from slotlake import key_index

        key_index.prune(str(local_path(path)))
    out.vacuumed = True
    if applied != retention.hours:
        # Keeping longer than asked is safe (allowed >= retention.hours); say so.
        out.note = (
            f"Delta applied the table's {TOMBSTONE_RETENTION} ({allowed:g} h), "
            f"not {retention.hours} h"
        )


def readable_snapshot(path: str) -> delta_log.Snapshot | None:
    """The latest version of the local Delta table at ``path`` with its files, or None
    where this reader does not follow its log (maintain's checks then count as a yes)."""
    try:
        return delta_log.snapshot(path, files=True)
    except (LookupError, OSError, ValueError):
        return None


def optimize_may_change(snap: delta_log.Snapshot | None, min_file_size: int) -> bool:
    """Whether OPTIMIZE may change the table whose latest version is ``snap``
    (:func:`readable_snapshot`): it has two files below ``min_file_size`` (what OPTIMIZE
    bins together) or a file with a deletion vector (which it may purge). A table
    untouched since the last maintain has neither, and its OPTIMIZE (a Spark job, ~1 s a
    table here) would find nothing; a log this reader does not follow counts as a yes."""
    if snap is None:
        return True
    assert snap.files is not None
    small = sum(1 for a in snap.files.values() if int(a.get("size") or 0) < min_file_size)
    return small > 1 or any(a.get("deletionVector") for a in snap.files.values())


def vacuum_may_delete(path: str, snap: delta_log.Snapshot | None, retention_hours: float) -> bool:
    """Whether VACUUM with ``retention_hours`` may delete anything from the local Delta
    table at ``path``, whose latest version is ``snap`` (:func:`readable_snapshot`): a file
    in its tree (but the ``_``/``.`` folders and files VACUUM leaves alone) that the
    version does not use, last modified before the retention's cutoff. VACUUM deletes a
    file the version does not use once its removal (never before its last write) or, for
    a file no commit named, its modification is older than the cutoff; so a table whose
    every such file is younger has nothing for it (a table synced since the last
    maintain usually does, and gets it). A log this reader does not follow counts as a
    yes."""
    if snap is None:
        return True
    try:
        used = delta_log.files_used(snap)
    except LookupError:
        return True
    cutoff = time.time() - retention_hours * 3600
    for folder, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            if name.startswith(("_", ".")):
                continue
            full = os.path.join(folder, name)
            if os.path.relpath(full, path) in used:
                continue
            try:
                if os.stat(full).st_mtime < cutoff:
                    return True
            except FileNotFoundError:
                continue
    return False


def clean_up_log(path: str) -> int:
    """Remove the log entries and checkpoints of the local Delta table at ``path`` that
    are older than its ``delta.logRetentionDuration`` (30 days by default) and below its
    newest checkpoint, as Spark's writers do after each checkpoint they write: the files
    deleted. On a local lake the driver writes most commits and checkpoints itself, so
    Spark's cleanup ran only when one of maintain's own commits happened to land on a
    checkpoint version, and a table synced every few minutes gathered ~300 log files a
    day. Time travel keeps every version from the newest checkpoint at or before it on
    (Delta's own bound, docs/reading.md). A table with ``delta.enableExpiredLogCleanup``
    false keeps its log; a failure is a warning, not an error of the run (the log only
    stays longer)."""
    from deltalake import DeltaTable

    log_dir = os.path.join(path, "_delta_log")
    try:
        table = DeltaTable(path)
        settings = table.metadata().configuration
        if settings.get("delta.enableExpiredLogCleanup", "true").lower() == "false":
            return 0
        before = set(os.listdir(log_dir))
        table.cleanup_metadata()
        return len(before - set(os.listdir(log_dir)))
    except Exception as exc:
        log.warning("%s: expired log files not removed (%s)", path, exc)
        return 0


def run_maintain(
    cfg: Config,
    spark: SparkSession | None = None,
    progress: Callable[[str], None] = log.info,
    now: datetime | None = None,
) -> MaintainResult:
    """Compact and VACUUM every Delta table of the lake, then expire raw batches."""
    from slotlake.sync import open_source

    t_start = time.monotonic()
    if spark is None and not is_local(cfg.lake.path):
        spark = _session(cfg)
    lake = Lake(cfg.lake.path)
    layout = lake.layout()
    with open_source(cfg, "maintain") as source:
        if not source.try_lock():
            progress(locked_message(cfg.source.slot, source.lock_holder(), "nothing done"))
            return MaintainResult(status="locked")
        try:
            # Only the records the retention needs: a lake's history grows by a record a
            # batch, each naming every table (1,000 tables: ~0.5 MB, ~7 ms to parse).
            batches = lake.commit_batches()
            window = batches[-(max(1, cfg.lake.state_versions) + 1) :]
            records: list[CommitRecord] = [lake.read_commit(b) for b in window]
            if not records:
                progress(f"lake {lake.uri} has no committed batch; nothing to maintain")
                return MaintainResult(status="empty")
            last = records[-1]
            if last.slot != cfg.source.slot:
                raise MaintainError(
                    f"lake {lake.uri} was written from slot {last.slot!r}, not "
                    f"{cfg.source.slot!r}: its lock would not keep that slot's syncs out"
                )
            if lake.read_plan(last.batch + 1) is not None:
                progress(
                    f"batch {last.batch + 1} is unfinished (a plan in _pending/): run sync to "
                    "finish it first; nothing done"
                )
                return MaintainResult(status="unfinished")
            retention = vacuum_retention(
                [r.created_at for r in records],
                cfg.lake.state_versions,
                cfg.lake.vacuum_min_age_hours,
                now or datetime.now(timezone.utc),
                (layout or {}).get("created_at"),
            )
            result = MaintainResult(status="done", retention=retention)
            result.uncommitted_removed = lake.remove_uncommitted(thorough=True)
            for removed in result.uncommitted_removed:
                progress(f"removed {removed} left by an attempt that never committed")
            tables = lake.delta_tables()
            progress(
                f"maintaining {len(tables)} Delta tables of {lake.uri}, keeping batches "
                f"{records[-max(1, cfg.lake.state_versions) :][0].batch}..{last.batch} "
                f"readable; VACUUM retention {retention.describe()}"
            )
            if spark is None:
                spark = _session(cfg)
            # A multiset kept unique on its key (slotlake.unique_multiset) is MERGEd by it.
            keys = {
                t.state: t.unique_on if t.multiset else t.key_columns
                for t in last.tables.values()
                if t.state and (t.unique_on or not t.multiset)
            }
            workers = max(1, min(cfg.lake.table_workers, len(tables) or 1))
            with ThreadPoolExecutor(workers, thread_name_prefix="slotlake-maintain") as pool:
                named = last.delta_versions()
                # No batch writes a table gone from the source again: compacted, it would
                # keep its old files for good (see maintain_table).
                frozen = {
                    rel
                    for t in last.tables.values()
                    if t.gone_since is not None
                    for rel in (t.changes, t.state)
                    if rel
                }
                futures = [
                    pool.submit(
                        maintain_table,
                        spark,
                        lake,
                        rel,
                        retention,
                        keys.get(rel, ()),
                        named.get(rel),
                        rel not in frozen,
                    )
                    for rel in tables
                ]
                for fut in as_completed(futures):
                    done = fut.result()
                    result.tables.append(done)
                    progress(done.describe())
            result.tables.sort(key=lambda t: t.path)
            lake.write_compacted(
                last.batch, {t.path: t.compacted_from for t in result.tables if t.compacted_from}
            )
            result.raw_expired = lake.expire_raw(cfg.lake.raw_retention_batches)
            for removed in result.raw_expired:
                progress(f"expired raw batch {removed}")
            result.commits_expired = lake.expire_commits(
                cfg.lake.commit_retention_batches, cfg.lake.state_versions
            )
            if result.commits_expired:
                progress(
                    f"expired {len(result.commits_expired)} commit records "
                    f"({result.commits_expired[0]}..{result.commits_expired[-1]})"
                )
            result.seconds = time.monotonic() - t_start
            failed = [t for t in result.tables if t.error]
            if failed:
                raise MaintainError(
                    f"{len(failed)} of {len(result.tables)} tables failed: "
                    + "; ".join(f"{t.path}: {t.error}" for t in failed)
                )
            progress(result.summary())
            return result
        finally:
            source.unlock()
