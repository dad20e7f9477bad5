"""Reprocessing: rebuild committed batches from their raw Parquet alone.

No PostgreSQL connection and no slot: each batch of FIRST..LAST is decoded again by
:func:`slotlake.batch.process_batch` (the code sync runs) and committed with the same
batch number and LSNs (``kind = "reprocess"``), starting from the state the lake had
committed as of batch FIRST-1, or from nothing.

Two modes:

* **into a new root** (``output``): a lake of its own (own ``lake_id``, so its own Delta
  ``txnAppId``). Its state tables start as clones of the source lake's states *as of*
  batch FIRST-1, at the versions commit record FIRST-1 names (their files hard-linked);
  its change logs start empty, with the columns the source's logs had then (so later
  renames and added columns replay exactly as they did). Raw directories are hard-linked
  (copied across file systems): the new root is self-contained and can be read,
  reprocessed again or take over from the old one. A run that failed part-way resumes:
  an output root whose last commit is FIRST-1 continues from that commit (tables that
  already hold the failed batch skip it, by their txn marker).
* **in place** (``in_place``): the range must end at the newest commit (later batches
  were built on the states being replaced) and no sync attempt may be unfinished. Every
  Delta table the newest commit names is first brought back to its version as of batch
  FIRST-1 (Delta's ``RESTORE … TO VERSION AS OF``, one commit per table that changed
  since, written by the driver on a local lake: :func:`slotlake.delta_log.restore`);
  the batches then run again under a fresh ``txnAppId`` (``lake.app_id("reprocess-…")``:
  the lake's own id has recorded those batch numbers already, so Delta would skip every
  write) and each batch's commit record is swapped atomically (:meth:`Lake.replace_commit`).
  A reader sees every batch wholly old or wholly new: the old records' versions stay in
  the tables' history. If a batch fails, every table is restored to the version the newest
  commit record names, so sync can go on as if nothing had been tried. Sync must not run
  meanwhile: without PostgreSQL there is no advisory lock to take (give both Airflow DAGs
  the same one-slot ``pool``). While it runs, ``_reprocess_in_place.json`` at the lake
  root names the run; it is left behind only by a run that was killed (see
  :data:`IN_PLACE_MARKER`).

What must still be there: the raw directory of every batch in the range
(``lake.raw_retention_batches``) and, unless starting from nothing, the Delta versions
as of batch FIRST-1. Time travel reaches as far back as VACUUM left the files:
``slotlake maintain`` keeps those of the newest ``lake.state_versions`` batches' versions,
so a reprocess can start that many batches back; an older start point is refused, before
anything is written, with the table and version that are gone.

Every raw file is checked (footer, schema, row count against the commit record) before
anything is written; a file that fails to read or decode later is named in the error
with its batch, and the batch is not committed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from slotlake import delta_log, durability
from slotlake.batch import TABLE_WORKERS, process_batch
from slotlake.delta import (
    ensure_table,
    last_commit,
    overwrite,
    table_ref,
    table_session,
)
from slotlake.lake import (
    MESSAGES,
    TRANSACTIONS,
    CommitRecord,
    Lake,
    OldLayoutError,
    TableCommit,
    adopt_compacted,
    link_or_copy,
    local_path,
    make_record,
    mark_gone,
    new_attempt,
    utcnow_iso,
)
from slotlake.spark import LazySession

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_PART = re.compile(r"^part-(\d{5})\.parquet$")

# Written at the root of a lake while an in-place reprocess runs; removed when it
# finishes or has rolled the tables back. Left behind, it means the run was killed and the
# tables' newest versions may not be what the newest commit record names: run the same
# in-place reprocess again (it restores the tables first) before syncing.
IN_PLACE_MARKER = "_reprocess_in_place.json"


class ReprocessError(RuntimeError):
    """Reprocessing refused or failed; the message names the batch (and file) and what to do."""


@dataclass
class ReprocessResult:
    output: str
    in_place: bool
    batches: list[int] = field(default_factory=list)
    from_batch_state: int | None = None  # the commit whose state the run started from
    tables: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    # batch → name → the state's rows with what they count (TableCommit.state_rows_text)
    state_rows_text: dict[int, dict[str, str]] = field(default_factory=dict)
    txn_app_id: str = ""  # the Delta txnAppId the rebuilt batches were written with
    # In place: Delta table → the version it was restored to before the first batch.
    restored: dict[str, int] = field(default_factory=dict)


def parse_range(text: str | None) -> tuple[int | None, int | None]:
    """``"3..7"``, ``"3.."``, ``"..7"`` or ``"5"`` → (first, last); None = open end."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d*)\s*(?:\.\.\s*(\d*))?\s*", text)
    if not m or (not m.group(1) and not m.group(2)):
        raise ValueError(f"--batches expects FIRST..LAST (e.g. 3..7, 3.., ..7 or 5), got {text!r}")
    first = int(m.group(1)) if m.group(1) else None
    if m.group(2) is None:
        return first, first
    last = int(m.group(2)) if m.group(2) else None
    if first is not None and last is not None and first > last:
        raise ValueError(f"--batches {text}: FIRST is after LAST")
    return first, last


# -- raw checks -----------------------------------------------------------------------------


def check_raw(lake: Lake, rec: CommitRecord) -> list[Path]:
    """The raw part files of a committed batch, after cheap checks (footers and row counts).

    Reads Parquet footers only, so a range of big batches is checked in seconds before
    the first one is written.
    """
    import pyarrow.parquet as pq

    from slotlake.raw import RAW_SCHEMA

    b = rec.batch
    if not rec.raw:
        raise ReprocessError(
            f"batch {b} ({rec.kind}) has no raw data to decode: start the range after it"
        )
    directory = lake.root / rec.raw
    if not directory.is_dir():
        raise ReprocessError(
            f"batch {b}: raw directory {directory} is missing (expired by "
            "lake.raw_retention_batches, or deleted): this batch cannot be reprocessed"
        )
    files = sorted(p for p in directory.iterdir() if _PART.match(p.name))
    for i, f in enumerate(files):
        if f.name != f"part-{i:05d}.parquet":
            missing = directory / f"part-{i:05d}.parquet"
            raise ReprocessError(f"batch {b}: raw file {missing} is missing")
    if not files:
        raise ReprocessError(
            f"batch {b}: raw file {directory / 'part-00000.parquet'} is missing "
            f"(the directory holds no part file)"
        )
    rows = 0
    expected_names = set(RAW_SCHEMA.names)
    for f in files:
        try:
            meta = pq.read_metadata(f)
            schema = pq.read_schema(f)
        except Exception as exc:
            raise ReprocessError(f"batch {b}: raw file {f} is corrupted: {exc}") from exc
        if not expected_names <= set(schema.names):
            raise ReprocessError(
                f"batch {b}: raw file {f} is not a raw batch file (columns {schema.names})"
            )
        rows += meta.num_rows
    if rows != rec.raw_messages:
        raise ReprocessError(
            f"batch {b}: raw files in {directory} hold {rows} messages but the commit record "
            f"says {rec.raw_messages}: the last raw file(s) after {files[-1].name} are missing "
            "or were replaced"
        )
    return files


def _diagnose(files: list[Path], batch: int, exc: BaseException) -> ReprocessError:
    """Turn a failure inside Spark into an error naming the raw file and the batch."""
    import pyarrow.parquet as pq

    from slotlake.decode import RawDataError

    for f in files:
        try:
            pq.read_table(f)
        except Exception as read_exc:
            return ReprocessError(f"batch {batch}: raw file {f} is corrupted: {read_exc}")
    text = str(exc)
    # A Python worker's error arrives inside Spark's message, traceback and all: the
    # "…RawDataError: batch …, seq …" line is the one that says what and where.
    raised = [
        ln.strip() for ln in text.splitlines() if re.search(r"(RawDataError|DecodeError): ", ln)
    ]
    if raised:
        detail = raised[-1]
    elif isinstance(exc, RawDataError):
        detail = text.strip()
    else:
        # Not the raw data's fault (memory, the file system, a bug): say so, briefly.
        return ReprocessError(f"batch {batch}: {type(exc).__name__}: {_first_line(exc)}")
    m = re.search(r"\bseq (\d+)", detail)
    if m:
        seq = int(m.group(1))
        for f in files:
            seqs = pq.read_table(f, columns=["seq"]).column("seq")
            if len(seqs) and seqs[0].as_py() <= seq <= seqs[-1].as_py():
                return ReprocessError(f"batch {batch}: raw file {f}: {detail}")
    names = ", ".join(str(f) for f in files)
    return ReprocessError(f"batch {batch}: raw files {names}: {detail}")


# -- Delta versions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Version:
    """One Delta table of the lake at the version a commit record names."""

    rel: str  # the table's path relative to the lake root
    version: int
    what: str  # e.g. "the state of public.kv"


def _record_versions(rec: CommitRecord) -> dict[str, _Version]:
    """Every Delta table a commit record names, at the version it names (by relative path)."""
    out: dict[str, _Version] = {}
    for name, t in sorted(rec.tables.items()):
        if t.changes and t.changes_version is not None:
            out[t.changes] = _Version(t.changes, t.changes_version, f"the change log of {name}")
        if t.state and t.state_version is not None:
            out[t.state] = _Version(t.state, t.state_version, f"the state of {name}")
    if rec.transactions and rec.transactions_version is not None:
        out[rec.transactions] = _Version(
            rec.transactions, rec.transactions_version, "the transactions table"
        )
    if rec.messages and rec.messages_version is not None:
        out[rec.messages] = _Version(rec.messages, rec.messages_version, "the messages table")
    if rec.ddl and rec.ddl_version is not None:
        out[rec.ddl] = _Version(rec.ddl, rec.ddl_version, "the ddl table")
    return out


def _unreadable(lake: Lake, v: _Version) -> str | None:
    """Why version ``v`` can no longer be read (None when it can).

    Time travel needs the table's log to reach the version and every file the version
    uses: its data files and deletion vectors. VACUUM deletes those that no retained
    version uses; log cleanup drops old commits once a checkpoint covers them.
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    path = lake.path(v.rel)
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return f"the Delta table {path} is missing"
    try:
        dt = DeltaTable(path, version=v.version)
    except Exception as exc:
        return f"its Delta log no longer reaches version {v.version} ({_first_line(exc)})"
    missing = [f for f in dt.file_uris() if not os.path.exists(_local(f))]
    if missing:
        return f"{len(missing)} of its data files are gone (VACUUMed), e.g. {_local(missing[0])}"
    try:
        pa.table(dt.deletion_vectors())  # reads every deletion vector file of the version
    except Exception as exc:
        return f"a deletion vector file of it is gone (VACUUMed): {_first_line(exc)}"
    return None


def _local(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_versions(lake: Lake, versions: list[_Version], batch: int, hint: str) -> None:
    """Refuse, before anything is written, when a version as of ``batch`` is gone."""
    for v in versions:
        why = _unreadable(lake, v)
        if why is not None:
            raise ReprocessError(
                f"{v.what} as of batch {batch} ({v.rel}, Delta version {v.version}) is no longer "
                f"readable: {why}. VACUUM (slotlake maintain) keeps the files of the newest "
                f"lake.state_versions batches' versions only: {hint}"
            )


def _current_version(lake: Lake, rel: str) -> int | None:
    from deltalake import DeltaTable

    from slotlake.delta_log import has_log

    path = lake.path(rel)
    if not has_log(path):
        return None
    return int(DeltaTable(path).version())


def _version0_is_empty(lake: Lake, rel: str) -> bool:
    """Whether the table's first version holds no rows (created empty by ``ensure_table``)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    try:
        return pa.table(DeltaTable(lake.path(rel), version=0).get_add_actions()).num_rows == 0
    except Exception:
        return False


# -- a new root -----------------------------------------------------------------------------


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link a directory's files into ``dst`` (copy where links are impossible)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, copy_function=link_or_copy)


def _seed_output(
    spark: LazySession,
    src: Lake,
    out: Lake,
    prior: CommitRecord,
    app_id: str,
    workers: int,
    progress: Callable[[str], None],
) -> CommitRecord:
    """Start the new root from the source lake as of batch ``prior.batch``.

    Each table's state is a clone of its version ``prior`` names: the files live then
    hard-linked, in one commit carrying ``(app_id, prior.batch)``, by the driver (no row is
    read: as fast for 100M rows as for ten); Spark reads that version (time travel) and
    writes it where the driver declines. Each change log is created empty with the columns
    it had then. Returns the record the first rebuilt batch continues from (it is not
    written: the new root's first commit is batch FIRST).
    """
    from concurrent.futures import ThreadPoolExecutor

    def cloned(rel: str, version: int, with_files: bool) -> int | None:
        """The new root's table ``rel`` as the source's ``version`` by the driver, files
        hard-linked (:func:`slotlake.delta_log.clone`): its version, or None when Spark
        must copy it (a log or protocol the driver does not follow)."""
        try:
            marker = (app_id, prior.batch) if with_files else None
            return delta_log.clone(
                str(local_path(src.path(rel))),
                str(local_path(out.path(rel))),
                version,
                marker,
                with_files,
            ).version
        except LookupError as exc:
            log.debug("%s: copied by Spark: %s", rel, exc)
            return None

    def one(name: str, t: TableCommit) -> tuple[str, TableCommit]:
        seeded = replace(t, change_rows=0, written=False, renames={})
        if t.state and t.state_version is not None:
            seeded.state_version = cloned(t.state, t.state_version, True)
            if seeded.state_version is None:
                session = table_session(spark())
                df = (
                    session.read.format("delta")
                    .option("versionAsOf", t.state_version)
                    .load(src.path(t.state))
                )
                ensure_table(session, out.path(t.state), df.schema)
                seeded.state_version = overwrite(df, out.path(t.state), app_id, prior.batch).version
        if t.changes and t.changes_version is not None:
            # Empty, with the columns it had then.
            seeded.changes_version = cloned(t.changes, t.changes_version, False)
            if seeded.changes_version is None:
                session = table_session(spark())
                try:  # the log's metadata as of the version: no data file is read
                    schema = (
                        session.read.format("delta")
                        .option("versionAsOf", t.changes_version)
                        .load(src.path(t.changes))
                        .schema
                    )
                except Exception as exc:
                    # Log entries cleaned up (delta.logRetentionDuration): the first batch
                    # that changes the table creates its log, from that batch's columns.
                    log.warning(
                        "%s: change log columns as of batch %s unknown: %s",
                        name,
                        prior.batch,
                        _first_line(exc),
                    )
                    seeded.changes, seeded.changes_version = None, None
                else:
                    ensure_table(session, out.path(t.changes), schema)
                    seeded.changes_version = last_commit(session, out.path(t.changes)).version
        progress(f"{name}: starting state as of batch {prior.batch} ({t.state_rows_text()})")
        return name, seeded

    items = sorted(prior.tables.items(), key=lambda kv: (-kv[1].state_rows, kv[0]))
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items) or 1))) as pool:
        tables = dict(f.result() for f in [pool.submit(one, n, t) for n, t in items])
    return replace(
        prior,
        tables=tables,
        raw=None,
        transactions=None,
        transactions_version=None,
        messages=None,
        messages_version=None,
        ddl=None,
        ddl_version=None,
        txn_app_id=app_id,
    )


# -- in place -----------------------------------------------------------------------------------


def _compacted_since(spark: LazySession, lake: Lake, rel: str, version: int, current: int) -> bool:
    """Whether every commit of the table after ``version`` up to ``current`` (its newest)
    is an OPTIMIZE."""
    from slotlake.maintain import since_named

    path = lake.path(rel)
    local = str(local_path(path)) if lake.on_local_disk else None
    session = spark() if local is None else None
    return since_named(session, path, local, version, current).compactions_only


def _restore_all(
    spark: LazySession,
    lake: Lake,
    targets: dict[str, _Version | None],
    first: int,
    progress: Callable[[str], None],
) -> dict[str, int]:
    """Bring each Delta table back: to its target version, or (None: created at batch
    ``first`` or later) to empty. Tables already at their target are left alone.

    A lake on local disk has each table's commit written by the driver
    (:func:`slotlake.delta_log.restore`: measured 3.5-7 s a table with Spark's RESTORE, a
    few milliseconds this way, so a lake of hundreds of tables is rolled back in seconds);
    Spark's RESTORE and DELETE do what the driver declines (see :func:`_on_driver`)."""
    out: dict[str, int] = {}
    for rel, target in sorted(targets.items()):
        current = _current_version(lake, rel)
        if current is None:
            continue  # never created: the batches will create it
        ref = table_ref(lake.path(rel))
        path = str(local_path(lake.path(rel))) if lake.on_local_disk else None
        if target is not None:
            if current != target.version and _compacted_since(
                spark, lake, rel, target.version, current
            ):
                # Only maintain's OPTIMIZE since: the newest holds the target's rows, and
                # the records go on naming it (slotlake.lake.adopt_compacted).
                out[rel] = current
                continue
            if current != target.version:
                done = _on_driver(path, delta_log.restore, target.version)
                if done is None:
                    spark().sql(f"RESTORE TABLE {ref} TO VERSION AS OF {target.version}")
                progress(f"{rel}: restored to version {target.version}")
            out[rel] = target.version
        elif rel in (TRANSACTIONS, MESSAGES):
            # Created by the first batch's append: its rows of batch FIRST on go.
            done = _on_driver(path, delta_log.remove_where_at_least, "_batch", first)
            if done is None:
                spark().sql(f"DELETE FROM {ref} WHERE _batch >= {first}")
                done = last_commit(spark(), lake.path(rel)).version
            progress(f"{rel}: rows of batch {first} on deleted")
            out[rel] = done
        elif _version0_is_empty(lake, rel):
            # Created empty, by the batch that first saw the table: back to that.
            if current != 0:
                if _on_driver(path, delta_log.restore, 0) is None:
                    spark().sql(f"RESTORE TABLE {ref} TO VERSION AS OF 0")
                progress(f"{rel}: restored to its empty version 0")
            out[rel] = 0
        else:
            done = _on_driver(path, delta_log.empty)
            if done is None:
                spark().sql(f"DELETE FROM {ref}")
                done = last_commit(spark(), lake.path(rel)).version
            progress(f"{rel}: emptied")
            out[rel] = done
    return out


def _on_driver(
    path: str | None, change: Callable[..., delta_log.Snapshot], *args: object
) -> int | None:
    """The version ``change`` (a :mod:`slotlake.delta_log` commit) made of the local table
    at ``path``; None when it declined — a log or protocol it does not follow, a file
    VACUUM removed, a file its statistics do not place, a writer meanwhile — and Spark is
    to do it (declining commits nothing)."""
    if path is None:
        return None
    try:
        return change(path, *args).version
    except (LookupError, FileNotFoundError, FileExistsError) as exc:
        log.info("%s: left to Spark (%s)", path, exc)
        return None


def _write_marker(lake: Lake, info: dict[str, object]) -> None:
    path = lake.path(IN_PLACE_MARKER)
    if lake.fs.exists(path):
        lake.fs.replace(path, json.dumps(info, indent=2))
    else:
        lake.fs.create_new(path, json.dumps(info, indent=2))


# -- the run ----------------------------------------------------------------------------------


def run_reprocess(
    source: str,
    output: str | None = None,
    first: int | None = None,
    last: int | None = None,
    in_place: bool = False,
    from_empty: bool = False,
    spark: SparkSession | None = None,
    spark_conf: dict[str, str] | None = None,
    progress: Callable[[str], None] = log.info,
    workers: int = TABLE_WORKERS,
) -> ReprocessResult:
    if "://" in str(source) or (output is not None and "://" in output):
        # The raw checks, hard links and version checks below use the local file system.
        raise ReprocessError("reprocess works on local lake roots (plain paths) only for now")
    if in_place == (output is not None):
        raise ReprocessError("give either an output root or in_place=True")
    src = Lake(source)
    try:
        src.layout()  # refuses the old Parquet layout
        committed = src.commit_batches()
    except OldLayoutError as exc:
        raise ReprocessError(f"cannot reprocess: {exc}") from None
    if not committed:
        raise ReprocessError(f"lake {source} has no committed batch to reprocess")
    first = committed[0] if first is None else first
    last = committed[-1] if last is None else last
    missing = sorted(set(range(first, last + 1)) - set(committed))
    if missing:
        raise ReprocessError(
            f"batches {first}..{last}: batch {missing[0]} is not committed in {source} "
            f"(committed: {committed[0]}..{committed[-1]})"
        )
    has_prior = first != committed[0]  # the range is contiguous: FIRST-1 is committed
    if (
        not has_prior
        and 1 <= first - 1 <= src.commits_expired_upto()
        and (in_place or not from_empty)
    ):
        # The oldest record left is not the lake's first batch: FIRST-1's state is unknown.
        raise ReprocessError(
            f"batch {first - 1}'s commit record, which names the state batch {first} starts "
            f"from, was expired by slotlake maintain (lake.commit_retention_batches): start "
            f"the range at batch {first + 1} or later"
            + ("" if in_place else ", or pass --from-empty")
        )

    def build() -> SparkSession:
        from slotlake.spark import build_session

        return build_session("slotlake-reprocess", spark_conf)

    # Started only if a table needs it: batches done on the driver and restores of a
    # local lake need no JVM.
    session = LazySession(build, spark)
    if in_place:
        if last != committed[-1]:
            raise ReprocessError(
                f"in place, the range must end at the newest commit (batch {committed[-1]}): "
                f"batches after {last} were built on the states being replaced"
            )
        if from_empty and has_prior:
            raise ReprocessError(
                f"in place, --from-empty would replace the lake's tables with states that "
                f"lack every row not changed since batch {first}: reprocess into a new root "
                "(--output) instead"
            )
        plan = src.read_plan(last + 1)
        if plan is not None:
            raise ReprocessError(
                f"batch {last + 1} has an unfinished sync attempt (plan {src.path('_pending')}, "
                f"raw {plan.raw}): its tables may already hold it. Run sync to finish it first"
            )
        # Its commits are not fsynced one by one: what each record names is, before it.
        with durability.deferred(str(src.root)):
            return _in_place(src, first, last, has_prior, session, progress, workers)
    assert output is not None
    out = Lake(output)
    if out.root.resolve() == src.root.resolve():
        raise ReprocessError("the output root is the source lake: use in_place instead")
    try:
        resumed = out.commit_batches() if out.layout() is not None else []
    except OldLayoutError as exc:
        raise ReprocessError(f"cannot reprocess into it: {exc}") from None
    if resumed and (resumed[-1] != first - 1 or from_empty):
        raise ReprocessError(
            f"output {out.uri} already holds batches {resumed[0]}..{resumed[-1]}: "
            f"use an empty root (or resume with FIRST = {resumed[-1] + 1})"
        )
    if not resumed and out.root.exists() and any(out.root.iterdir()):
        raise ReprocessError(f"output root {out.uri} is not empty")

    records = [src.read_commit(b) for b in range(first, last + 1)]
    # Every raw file of the range, and every version the start needs, is checked before
    # anything is written.
    raw_files = {rec.batch: check_raw(src, rec) for rec in records}
    prior: CommitRecord | None = None
    start: CommitRecord | None = None  # the source's record whose state the run starts from
    if resumed:
        prior = out.read_commit(first - 1)
        progress(f"resuming in {out.uri} after its batch {prior.batch}")
    elif has_prior and not from_empty:
        start = src.read_commit(first - 1)
        states = [v for v in _record_versions(start).values() if v.what.startswith("the state")]
        check_versions(
            src,
            states,
            start.batch,
            "start the range at a later batch, or pass --from-empty to start from nothing",
        )

    created = not resumed
    app_id = out.app_id()  # writes the new root's layout marker (its own lake_id)
    result = ReprocessResult(output=out.uri, in_place=False, txn_app_id=app_id)
    # What each batch writes is listed for the sync before its record (slotlake.durability).
    with durability.deferred(str(out.root)):
        try:
            if start is not None:
                progress(f"copying the state as of batch {start.batch} from {src.uri}")
                prior = _seed_output(session, src, out, start, app_id, workers, progress)
            result.from_batch_state = prior.batch if prior else None
            for rec in records:
                assert rec.raw is not None  # check_raw refused records without raw
                _link_tree(src.root / rec.raw, out.root / rec.raw)
                for snap in rec.snapshot.get("tables", {}).values():
                    # A batch that re-based a table on a copy replays it from the same copy.
                    if (src.root / snap["staging"]).is_dir():
                        _link_tree(src.root / snap["staging"], out.root / snap["staging"])
                try:
                    record = _rebuild(
                        session, out, rec, app_id, prior, raw_files, progress, workers
                    )
                except BaseException:
                    shutil.rmtree(out.root / rec.raw, ignore_errors=True)
                    raise
                # The raw and copies linked in (no list has them; the clones listed
                # theirs), and any state Spark seeded: the whole disk.
                durability.unlisted()
                out.write_commit(record)
                created = False
                prior = record
                _account(result, record)
        except BaseException:
            if created:
                # Nothing was committed in a root this run created: leave no half-made lake.
                shutil.rmtree(out.root, ignore_errors=True)
            raise
        return result


def _rebuild(
    spark: LazySession,
    lake: Lake,
    rec: CommitRecord,
    app_id: str,
    prior: CommitRecord | None,
    raw_files: dict[int, list[Path]],
    progress: Callable[[str], None],
    workers: int,
) -> CommitRecord:
    """Batch ``rec.batch`` decoded again from its raw into ``lake``: the record to commit."""
    b = rec.batch
    assert rec.raw is not None
    t0 = time.monotonic()
    attempt = new_attempt()
    progress(f"reprocessing batch {b} ({rec.start_lsn}..{rec.end_lsn}) as attempt {attempt}")
    from slotlake.snapshot import table_snapshots

    snapshots = table_snapshots(rec.snapshot)
    for name, snap in snapshots.items():
        if not lake.exists(snap.staging):
            raise ReprocessError(
                f"batch {b} re-based {name} on a snapshot whose copy {lake.path(snap.staging)} "
                "is gone (expired with the batch's raw): it cannot be reprocessed"
            )
    try:
        built = process_batch(
            spark,
            lake,
            rec.raw,
            b,
            app_id,
            prior,
            progress=progress,
            workers=workers,
            snapshots=snapshots,
        )
    except Exception as exc:
        raise _diagnose(raw_files[b], b, exc) from exc
    seconds = time.monotonic() - t0
    progress(f"batch {b} reprocessed ({seconds:.1f}s)")
    mark_gone(built.tables, rec.snapshot.get("published"), b)
    return make_record(
        batch=b,
        attempt=attempt,
        slot=rec.slot,
        start_lsn=rec.start_lsn,
        end_lsn=rec.end_lsn,
        target_lsn=rec.target_lsn,
        raw=rec.raw,
        raw_messages=rec.raw_messages,
        raw_bytes=rec.raw_bytes,
        transactions=built.transactions,
        messages=built.messages,
        transaction_count=built.transaction_count,
        transactions_version=built.transactions_version,
        messages_version=built.messages_version,
        ddl=built.ddl,
        ddl_version=built.ddl_version,
        txn_app_id=app_id,
        tables=built.tables,
        timings={
            "reprocess": round(seconds, 3),
            **{f"batch.{k}": round(v, 3) for k, v in built.timings.items()},
        },
        kind="reprocess",
        snapshot=rec.snapshot,
    )


def _account(result: ReprocessResult, record: CommitRecord) -> None:
    result.batches.append(record.batch)
    result.tables[record.batch] = {
        n: (t.change_rows, t.state_rows) for n, t in record.tables.items() if t.written
    }
    result.state_rows_text[record.batch] = {
        n: t.state_rows_text() for n, t in record.tables.items() if t.written
    }


def _in_place(
    lake: Lake,
    first: int,
    last: int,
    has_prior: bool,
    spark: LazySession,
    progress: Callable[[str], None],
    workers: int,
) -> ReprocessResult:
    records = [lake.read_commit(b) for b in range(first, last + 1)]
    raw_files = {rec.batch: check_raw(lake, rec) for rec in records}
    prior = lake.read_commit(first - 1) if has_prior else None
    # Every Delta table the newest commit names goes back to its version as of FIRST-1;
    # one that did not exist then goes back to empty.
    before = _record_versions(prior) if prior is not None else {}
    targets: dict[str, _Version | None] = {
        rel: before.get(rel) for rel in _record_versions(records[-1])
    }
    if prior is not None:
        check_versions(
            lake,
            [v for v in targets.values() if v is not None],
            prior.batch,
            "start the range at a later batch",
        )
    if lake.fs.exists(lake.path(IN_PLACE_MARKER)):
        progress(
            f"{IN_PLACE_MARKER}: an earlier in-place reprocess did not finish; "
            "its tables are restored like the others"
        )
    run = new_attempt()
    app_id = lake.app_id(f"reprocess-{run}")
    result = ReprocessResult(
        output=lake.uri,
        in_place=True,
        from_batch_state=prior.batch if prior else None,
        txn_app_id=app_id,
    )
    _write_marker(
        lake,
        {"first": first, "last": last, "txn_app_id": app_id, "started_at": utcnow_iso()},
    )
    # The tables go back to older versions: no compacted one is the newest any more.
    lake.drop_compacted()
    try:
        result.restored = _restore_all(spark, lake, targets, first, progress)
        # Tables left at a compacted version (only OPTIMIZE since their target): the
        # rebuilt records name it where they carry the target.
        compacted = {
            rel: (target.version, result.restored[rel])
            for rel, target in targets.items()
            if target is not None and result.restored.get(rel, target.version) != target.version
        }
        for rec in records:
            record = _rebuild(spark, lake, rec, app_id, prior, raw_files, progress, workers)
            adopt_compacted(record, compacted)
            if spark.started is not None:  # Spark's files are not listed: the whole disk
                durability.unlisted()
            lake.replace_commit(record)
            prior = record
            _account(result, record)
    except BaseException as exc:
        _roll_back(spark, lake, last, first, progress, exc)
        raise
    Path(lake.path(IN_PLACE_MARKER)).unlink(missing_ok=True)
    return result


def _roll_back(
    spark: LazySession,
    lake: Lake,
    last: int,
    first: int,
    progress: Callable[[str], None],
    exc: BaseException,
) -> None:
    """After a failed batch: every table back to the version the newest record names.

    The newest record is still the old one (or, if the failure came after its swap, the
    new one): either way the tables then hold exactly what it says, and sync can go on.
    """
    try:
        newest = lake.read_commit(last)
        _restore_all(spark, lake, dict(_record_versions(newest)), first, progress)
    except Exception:
        log.exception("in-place reprocess: rolling the tables back failed")
        with contextlib.suppress(Exception):
            exc.add_note(
                f"the tables could not be rolled back to batch {last}'s versions: do not sync "
                f"before an in-place reprocess of batches {first}..{last} succeeds "
                f"({lake.path(IN_PLACE_MARKER)} marks the lake meanwhile)"
            )
        return
    Path(lake.path(IN_PLACE_MARKER)).unlink(missing_ok=True)
    progress(f"in-place reprocess failed; every table is back at batch {last}'s version")


__all__ = [
    "IN_PLACE_MARKER",
    "ReprocessError",
    "ReprocessResult",
    "check_raw",
    "check_versions",
    "parse_range",
    "run_reprocess",
]
