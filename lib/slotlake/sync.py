"""One sync run: lock → reconcile → target → pull → decode/write → commit → advance.

The order is the contract (DESIGN.md §1, §3): the slot is advanced only after the commit
record is durable, so a run killed at any instant leaves either an uncommitted attempt
(invisible, removed by the next run, which pulls the same changes again) or a commit
ahead of the slot (the next run advances the slot first). Either way every change lands
exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slotlake import durability, snapshot
from slotlake.batch import BatchOutput, DriverWrites, check_published_columns, process_batch
from slotlake.config import Config
from slotlake.ddl import CATALOG_FILE, catalog_to_json
from slotlake.decode import RawDataError
from slotlake.fastdefault import FAULT_STEP
from slotlake.lake import (
    RAW,
    BatchPlan,
    CommitRecord,
    Lake,
    adopt_compacted,
    drop_torn_entries,
    is_local,
    local_path,
    make_record,
    mark_gone,
    new_attempt,
    utcnow_iso,
)
from slotlake.lsn import Lsn
from slotlake.memory import freeze_heap
from slotlake.preload import Preload
from slotlake.raw import RawWriter
from slotlake.redact import redact_text
from slotlake.reprocess import IN_PLACE_MARKER
from slotlake.source import SlotSource, locked_message
from slotlake.spark import LazySession

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FAULT_ENV = "SLOTLAKE_FAULT"
FAULT_STEPS = (
    "after_pull",
    "decode",
    "table_written",
    "changes_written",
    "before_commit",
    "after_commit",
)
# Reached only by a batch that applies a fast default (tests of slotlake.fastdefault).
FAULT_FASTDEFAULT = FAULT_STEP


class SyncError(RuntimeError):
    """A run that stopped on purpose, with a message saying what to do."""


class SlotAheadError(SyncError):
    pass


class InjectedFault(RuntimeError):
    pass


def fault_point(step: str) -> None:
    """Die here when SLOTLAKE_FAULT names this step (tests of the exactly-once contract).

    ``step`` raises; ``step:exit`` ends the process at once, like a SIGKILL would.
    """
    spec = os.environ.get(FAULT_ENV, "")
    name, _, mode = spec.partition(":")
    if name != step:
        return
    if mode == "exit":
        os._exit(137)
    raise InjectedFault(f"injected fault at step {step}")


@dataclass
class SyncResult:
    status: str  # committed | locked | up_to_date
    batch: int | None = None
    start_lsn: Lsn | None = None
    end_lsn: Lsn | None = None
    target_lsn: Lsn | None = None
    messages: int = 0
    raw_bytes: int = 0
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)  # name → (changes, state rows)
    # name → the state's rows with what they count (TableCommit.state_rows_text)
    state_rows_text: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # Where this run's pull was cut in two peeks decoded at once (None: one peek, or none).
    split_at: Lsn | None = None
    resumed: int | None = None  # an unfinished batch this run completed first
    # The batch before this one in the same run, which named tables this one copied
    # (lake.copy_wanted_in_same_run).
    followed: int | None = None


def _session(cfg: Config) -> SparkSession:
    from slotlake.spark import build_session

    return build_session("slotlake-sync", cfg.spark)


def open_source(cfg: Config, command: str = "sync") -> SlotSource:
    """The configured source; its sessions' application_name says which command holds
    them (``slotlake-sync``, ``slotlake-maintain``…), as a run that finds the slot's lock
    held reports it."""
    src = cfg.source
    return SlotSource(
        src.dsn,
        src.slot,
        src.publications,
        application_name=f"slotlake-{command}",
        proto_version=src.proto_version,
        binary=src.binary,
        messages=src.pulls_messages,
        streaming=src.streaming,
        session_settings=src.settings,
        split_bytes=int(src.split_peek_mb * 1024 * 1024) if src.split_peek_mb > 0 else None,
        adbc_min_bytes=int(src.adbc_min_mb * 1024 * 1024) if src.adbc_min_mb > 0 else None,
        log_snapshots=src.log_snapshots,
    )


def reconcile(
    source: SlotSource, lake: Lake, cfg: Config, accept_slot_ahead: bool
) -> tuple[Lsn, CommitRecord | None]:
    """Bring the slot and the lake's last commit into agreement; returns the batch start W₀
    and that commit (read once: a record lists every table, ~4 ms to parse at 300)."""
    info = source.check()
    confirmed = info.confirmed_flush_lsn
    assert confirmed is not None  # check() refuses invalidated slots
    last = lake.last_commit()
    if last is None:
        log.info(
            "lake %s is empty: starting at the slot's confirmed_flush_lsn %s", lake.uri, confirmed
        )
        return confirmed, None
    if last.slot != cfg.source.slot:
        raise SyncError(
            f"lake {lake.uri} was written from slot {last.slot!r}, not {cfg.source.slot!r}: "
            "use a separate lake.path per slot"
        )
    end = last.end
    if end > confirmed:
        flush = source.current_flush_lsn()
        if end > flush:
            # No run of this source's WAL ends there: the server would stop the slot at its
            # flush LSN, and the changes from there to the lake's end would be skipped.
            raise SyncError(
                f"lake {lake.uri}: batch {last.batch} ends at {end}, past the source's WAL "
                f"(flushed up to {flush}): it was not written from this server's WAL as it "
                "is now (a source restored from a backup, or another server under the same "
                "address?). Re-bootstrap the lake from this source"
            )
        # The previous run committed but died before advancing: finish its job.
        log.info(
            "batch %s is committed up to %s but the slot is at %s: advancing the slot",
            last.batch,
            end,
            confirmed,
        )
        return max(source.advance(end), end), last
    if confirmed > end:
        if not accept_slot_ahead:
            raise SlotAheadError(
                f"slot {cfg.source.slot} is at {confirmed} but the lake's last commit (batch {last.batch}) "
                f"ends at {end}: changes between them were consumed without being written (data loss). "
                "Re-bootstrap the lake, or rerun with --accept-slot-ahead to continue from the slot"
            )
        log.warning("accepting slot ahead of the lake: changes in %s..%s are lost", end, confirmed)
        return confirmed, last
    return end, last


def run_sync(
    cfg: Config,
    target_lsn: Lsn | None = None,
    spark: SparkSession | None = None,
    accept_slot_ahead: bool | None = None,
    progress: Callable[[str], None] = log.info,
) -> SyncResult:
    if spark is None and not is_local(cfg.lake.path):
        # A Hadoop file system lake is reached through the session's JVM from the start.
        spark = _session(cfg)
    lake = Lake(cfg.lake.path)
    lake.layout()  # refuses a lake of the old Parquet layout before touching anything
    if lake.exists(IN_PLACE_MARKER):
        raise SyncError(
            f"lake {lake.uri} has {IN_PLACE_MARKER}: an in-place reprocess is running or was "
            "killed, and its tables may not match the newest commit record; rerun that "
            "reprocess (it rolls back or finishes) before syncing"
        )
    accept = cfg.accept_slot_ahead if accept_slot_ahead is None else accept_slot_ahead
    freeze_heap()  # a long-lived heap's full collections cost a batch 30-50 ms
    t_start = time.monotonic()
    # The tables' imports, meanwhile: the lock, the checks and the pull wait on PostgreSQL.
    preload = Preload()
    try:
        return _run(cfg, lake, target_lsn, spark, accept, progress, t_start)
    finally:
        preload.wait()


def _run(
    cfg: Config,
    lake: Lake,
    target_lsn: Lsn | None,
    spark: SparkSession | None,
    accept: bool,
    progress: Callable[[str], None],
    t_start: float,
) -> SyncResult:
    with open_source(cfg) as source:
        if not source.try_lock():
            progress(locked_message(cfg.source.slot, source.lock_holder(), "nothing done"))
            return SyncResult(status="locked")
        try:
            # The sweeps below remove no record: the last one is still the one read here.
            start, last = reconcile(source, lake, cfg, accept)
            for removed in lake.remove_uncommitted():
                log.info("removed %s left by an attempt that never committed", removed)
            for removed in snapshot.remove_orphans(lake):
                log.info("removed snapshot copy %s (no plan names it, or its raw expired)", removed)
            # What each batch writes to a local lake is listed for the syncs before its
            # plan and its commit record (slotlake.durability).
            with (
                durability.deferred(str(local_path(lake.uri)), cfg.lake.fsync_files_max)
                if lake.on_local_disk
                else contextlib.nullcontext()
            ):

                def after(done: SyncResult, target: Lsn | None) -> SyncResult:
                    """The batch after ``done`` (committed by this run), towards ``target``."""
                    assert done.end_lsn is not None
                    return _run_batch(
                        cfg,
                        source,
                        lake,
                        done.end_lsn,
                        lake.last_commit(),
                        target,
                        spark,
                        progress,
                        t_start,
                    )

                result = _run_batch(
                    cfg, source, lake, start, last, target_lsn, spark, progress, t_start
                )
                if result.resumed is not None and result.status == "committed":
                    # The unfinished batch is done; the run goes on to what arrived since.
                    result.resumed = result.batch
                    following = after(result, target_lsn)
                    if following.status == "committed":
                        following.resumed = result.resumed
                        result = following
                if _copies_wanted(cfg, source, lake, result, target_lsn, progress):
                    repair = after(result, None)
                    if repair.status == "committed":
                        repair.resumed = result.resumed
                        repair.followed = result.batch
                        result = repair
            return result
        except Exception as exc:
            # Errors can quote the DSN (psycopg does): never let a password through.
            if cfg.source.dsn and cfg.source.dsn in str(exc):
                raise SyncError(redact_text(str(exc), [cfg.source.dsn])) from None
            raise
        finally:
            source.unlock()


def _copies_wanted(
    cfg: Config,
    source: SlotSource,
    lake: Lake,
    result: SyncResult,
    target_lsn: Lsn | None,
    progress: Callable[[str], None],
) -> bool:
    """Whether the next batch would copy tables, and the run takes that batch now.

    Such a table is off until its copy: the batch named it (its changes went to another
    name, a rewrite changed its rows unseen, Spark merged it across a replica identity
    change), or it changed between the run's read of its published set and the target
    (:func:`slotlake.snapshot.due`). The next batch copies it, and taking that batch at
    once shrinks the window from the schedule's interval to the length of one batch. Not
    in a --target-lsn run: it must not end past that target, and a copy now is newer."""
    if result.status != "committed":
        return False
    now = target_lsn is None and cfg.lake.copy_wanted_in_same_run
    if not now:
        # What status reports as waiting: the batch's record names them, and any request
        # left came meanwhile (the batch's own honoured ones are gone).
        wanted = snapshot.waiting(lake, None)
    else:
        last = lake.last_commit()
        assert last is not None
        try:
            with source.lock_waits_reported(
                f"batch {result.batch}: reading the published tables again"
            ):
                wanted = snapshot.due(cfg, lake, last, source.connection)
        except snapshot.SnapshotError as exc:
            # The batch is committed and the slot advanced: the run did its work, and the
            # next one makes the same checks.
            log.warning("batch %s: %s; the next run copies what it needs", result.batch, exc)
            return False
    if not wanted:
        return False
    names = ", ".join(f"{n} ({r})" for n, r in sorted(wanted.items()))
    if now:
        progress(f"batch {result.batch}: copying {names} in one more batch now")
    else:
        progress(f"batch {result.batch}: the next run copies {names}")
    return now


def _run_batch(
    cfg: Config,
    source: SlotSource,
    lake: Lake,
    start: Lsn,
    last: CommitRecord | None,
    target_lsn: Lsn | None,
    spark: SparkSession | None,
    progress: Callable[[str], None],
    t_start: float,
) -> SyncResult:
    """One batch from ``start`` after ``last`` (the lake's last commit): the unfinished one
    a plan names, or a fresh pull."""
    timings: dict[str, float] = {}
    split_at: Lsn | None = None
    batch = last.batch + 1 if last else 1
    plan = lake.read_plan(batch)
    if plan is not None:
        # An earlier attempt pulled this batch and may have written some tables:
        # finish exactly that batch, never a newer target.
        if plan.start_lsn != str(start):
            raise SyncError(
                f"batch {batch}'s plan starts at {plan.start_lsn} but the lake and the "
                f"slot are at {start}: remove {lake.path('_pending')} only if you know "
                f"no table holds batch {batch}"
            )
        if target_lsn is not None and str(target_lsn) != plan.target_lsn:
            log.warning(
                "batch %s resumes its first attempt's target %s; --target-lsn %s "
                "applies to the next batch",
                batch,
                plan.target_lsn,
                target_lsn,
            )
        progress(
            f"batch {batch}: resuming an unfinished attempt "
            f"({plan.start_lsn}..{plan.target_lsn}, raw {plan.raw})"
        )
        if lake.on_local_disk:
            # Entries of the attempt that a power loss left empty or torn (their syncs wait
            # for the batch's end: slotlake.durability) go; the tables redo them.
            drop_torn_entries(lake, last)
        timings["pull"] = 0.0
        raw_local = None
        resumed: int | None = batch
    else:
        resumed = None
        attempt = new_attempt()
        # Tables that need a copy are copied now, before the target: the target must not
        # be below their consistent point (slotlake.snapshot).
        with source.lock_waits_reported(f"batch {batch}: reading the published tables"):
            prepared = snapshot.prepare(
                cfg, lake, last, batch, attempt, source.connection, progress
            )
            # So that the slot's restart point moves to this batch's end once it is advanced.
            source.log_restart_point(after=start)
            # The catalog of the target's snapshot: fast-default values (slotlake.fastdefault).
            flush, catalog = source.flush_lsn_and_catalog()
        check_published_columns(catalog)
        target = target_lsn if target_lsn is not None else flush
        if target > flush:
            # WAL not written yet: a batch ending there would have its record and the slot
            # claim changes committed there later, and every later run skip them.
            log.warning(
                "batch %s: --target-lsn %s is past the source's flush LSN: pulling up to %s",
                batch,
                target,
                flush,
            )
            target = flush
        cp = prepared.consistent_point
        if cp is not None and target < cp:
            if target_lsn is not None:
                log.warning(
                    "batch %s: --target-lsn %s raised to the snapshot's %s", batch, target, cp
                )
            target = cp
        if target <= start and not prepared.tables:
            progress(f"slot {cfg.source.slot} is up to date at {start} (target {target})")
            return SyncResult(
                status="up_to_date", start_lsn=start, end_lsn=start, target_lsn=target
            )
        raw_rel = lake.batch_path(RAW, batch, attempt)
        progress(f"batch {batch}: pulling {cfg.source.slot} from {start} up to {target}")
        t0 = time.monotonic()
        # Raw is written with pyarrow: locally in place, or staged and then uploaded.
        staging = None if lake.local else tempfile.mkdtemp(prefix="slotlake-raw-")
        raw_local = lake.path(raw_rel) if staging is None else os.path.join(staging, "raw")
        writer = RawWriter(raw_local)
        pulled = source.pull(
            target, writer, progress=lambda p: progress(f"batch {batch}: pull {p}")
        )
        summary, split_at = pulled.summary, pulled.split_at
        if split_at is not None:
            progress(f"batch {batch}: pulled in two peeks at once, cut at {split_at}")
        os.makedirs(raw_local, exist_ok=True)
        with open(os.path.join(raw_local, CATALOG_FILE), "w") as fh:
            fh.write(catalog_to_json(str(target), catalog))
        # The peek ran to the target uncut, so everything before it is in this batch.
        end = max(start, target, Lsn(summary.last_complete_end_lsn or 0))
        if staging is not None:
            lake.fs.upload_dir(raw_local, lake.path(raw_rel))
            shutil.rmtree(staging, ignore_errors=True)
            raw_local = None
        plan = BatchPlan(
            batch=batch,
            attempt=attempt,
            slot=cfg.source.slot,
            start_lsn=str(start),
            end_lsn=str(end),
            target_lsn=str(target),
            raw=raw_rel,
            raw_messages=summary.messages,
            raw_bytes=summary.payload_bytes,
            txn_app_id=lake.app_id(),
            created_at=utcnow_iso(),
            snapshot=prepared.to_plan(),
        )
        lake.write_plan(plan)
        timings["pull"] = time.monotonic() - t0
        fault_point("after_pull")
    target, end = Lsn.parse(plan.target_lsn), Lsn.parse(plan.end_lsn)
    raw_rel, attempt = plan.raw, plan.attempt
    # Started only if a table of the batch needs it (slotlake.local_table does small ones).
    lazy = LazySession(lambda: _session(cfg), spark)
    driver = DriverWrites.of(cfg.lake)
    log.info("batch %d: tables on the driver: %s", batch, driver.describe())
    t1 = time.monotonic()

    def decode_write(raw: str, local: str | None) -> BatchOutput:
        assert plan is not None
        try:
            out = _process(raw, local)
        finally:
            if lazy.started is not None:  # Spark's files are not listed: the whole disk
                durability.unlisted()
        if lake.on_local_disk:
            # The batch's files made durable together once its tables are written
            # (slotlake.durability): its commit record's sync finds nothing left.
            durability.flush(str(local_path(lake.uri)))
        return out

    def _process(raw: str, local: str | None) -> BatchOutput:
        assert plan is not None
        return process_batch(
            lazy,
            lake,
            raw,
            batch,
            plan.txn_app_id,
            last,
            progress=progress,
            fault=fault_point,
            raw_local=local,
            workers=cfg.lake.table_workers,
            driver=driver,
            snapshots=snapshot.table_snapshots(plan.snapshot),
        )

    try:
        out = decode_write(raw_rel, raw_local)
    except RawDataError:
        if resumed is None:
            raise
        # The raw the first attempt kept does not decode (damaged at rest). The slot has not
        # moved, and a peek to the same target returns exactly the same transactions: pull
        # them again under the plan's target, and finish the batch from the fresh copy
        # (tables that already hold the batch skip it, the others get the same content).
        log.warning("batch %s: raw %s does not decode; pulling it again", batch, plan.raw)
        plan = _repull(cfg, source, lake, plan, progress)
        raw_rel = plan.raw
        out = decode_write(raw_rel, None)
    timings["decode_write"] = time.monotonic() - t1
    if lake.on_local_disk:  # (no deferred sync on other lakes: nothing of this batch's)
        timings["files_synced"] = durability.last_sync_seconds()
    timings.update({f"batch.{k}": v for k, v in out.timings.items()})
    snap_record = snapshot.for_record(
        lazy.started,
        lake,
        plan.snapshot,
        last,
        raw_rel,
        out.relation_changes,
        {n: t.missing_toast for n, t in out.tables.items() if t.written},
        out.streamed,
    )
    mark_gone(out.tables, plan.snapshot.get("published"), batch)
    fault_point("before_commit")
    record = make_record(
        batch=batch,
        attempt=attempt,
        slot=cfg.source.slot,
        start_lsn=str(start),
        end_lsn=str(end),
        target_lsn=str(target),
        raw=raw_rel,
        raw_messages=plan.raw_messages,
        raw_bytes=plan.raw_bytes,
        transactions=out.transactions,
        messages=out.messages,
        transaction_count=out.transaction_count,
        transactions_version=out.transactions_version,
        messages_version=out.messages_version,
        ddl=out.ddl,
        ddl_version=out.ddl_version,
        txn_app_id=plan.txn_app_id,
        tables=out.tables,
        timings={k: round(v, 3) for k, v in timings.items()},
        snapshot=snap_record,
    )
    compacted = lake.compacted(last.batch) if last is not None else {}
    adopt_compacted(record, compacted)
    t2 = time.monotonic()
    lake.write_commit(record)
    if compacted:
        lake.drop_compacted()
    lake.drop_plans(batch)  # the record supersedes the plan
    snapshot.drop_requests(lake, snap_record.get("requests", []))
    if snap_record.get("tables"):
        snapshot.clear_progress(lake)
    fault_point("after_commit")
    source.advance(end)
    timings["commit_advance"] = time.monotonic() - t2
    lake.expire_raw(cfg.lake.raw_retention_batches)
    timings["total"] = time.monotonic() - t_start
    result = SyncResult(
        status="committed",
        resumed=resumed,
        batch=batch,
        start_lsn=start,
        end_lsn=end,
        target_lsn=target,
        messages=plan.raw_messages,
        raw_bytes=plan.raw_bytes,
        tables={n: (t.change_rows, t.state_rows) for n, t in out.tables.items() if t.written},
        state_rows_text={n: t.state_rows_text() for n, t in out.tables.items() if t.written},
        timings=timings,
        split_at=split_at,
    )
    progress(
        f"batch {batch} committed: {plan.raw_messages} messages, {out.transaction_count} transactions, "
        f"slot advanced to {end} ({timings['total']:.1f}s: pull {timings['pull']:.1f}s, "
        f"decode+write {timings['decode_write']:.1f}s)"
    )
    return result


def _repull(
    cfg: Config, source: SlotSource, lake: Lake, plan: BatchPlan, progress: Callable[[str], None]
) -> BatchPlan:
    """Pull batch ``plan.batch`` again, to the same target, into a new raw directory."""
    attempt = new_attempt()
    raw_rel = lake.batch_path(RAW, plan.batch, attempt)
    staging = None if lake.local else tempfile.mkdtemp(prefix="slotlake-raw-")
    raw_local = lake.path(raw_rel) if staging is None else os.path.join(staging, "raw")
    target, start = Lsn.parse(plan.target_lsn), Lsn.parse(plan.start_lsn)
    summary = source.pull(
        target, RawWriter(raw_local), progress=lambda p: progress(f"batch {plan.batch}: pull {p}")
    ).summary
    end = max(start, target, Lsn(summary.last_complete_end_lsn or 0))
    if str(end) != plan.end_lsn:
        raise SyncError(
            f"batch {plan.batch}: pulled again to {plan.target_lsn} it ends at {end}, not at "
            f"{plan.end_lsn} as its first attempt did; the slot changed underneath"
        )
    # The catalog read at the first attempt's target belongs to the batch: keep it.
    old_catalog = lake.path(f"{plan.raw}/{CATALOG_FILE}")
    if lake.fs.exists(old_catalog):
        with open(os.path.join(raw_local, CATALOG_FILE), "w") as fh:
            fh.write(lake.fs.read_text(old_catalog))
    if staging is not None:
        lake.fs.upload_dir(raw_local, lake.path(raw_rel))
        shutil.rmtree(staging, ignore_errors=True)
    fresh = BatchPlan(**{**plan.__dict__, "attempt": attempt, "raw": raw_rel})
    fresh.raw_messages, fresh.raw_bytes = summary.messages, summary.payload_bytes
    lake.replace_plan(fresh)
    lake.fs.rmtree(lake.path(plan.raw))
    return fresh
