"""A batch of many small tables written by forked worker processes
(slotlake.table_processes), with their Delta log entries synced together at the batch's
end (slotlake.durability): the same mirror and change log as the parent's threads write,
a worker that fails or dies leaves its tables to the parent without a change written
twice, and entries a power loss left torn are redone by the rerun."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from slotlake import batch as batch_module
from slotlake import durability, schema_memo, table_processes
from slotlake.config import Config
from slotlake.delta import local_snapshot
from slotlake.lake import CHANGES, STATE, Lake, LocalFS
from slotlake.sync import FAULT_ENV, InjectedFault, run_sync

from .sync_helpers import (
    AUDIT_SQL,
    assert_log_matches_audit,
    assert_mirror,
    audit,
    make_config,
)

pytestmark = pytest.mark.one_pg_version


@pytest.fixture(autouse=True)
def _checkpoints_every_10(checkpoint_every_10: None) -> None:
    """These tests reach a checkpoint in ten commits (the lake's tables take one every 30)."""


@pytest.fixture(autouse=True)
def _ten_tables_are_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's threshold (16 tables) lowered to these tests' ten."""
    monkeypatch.setattr(table_processes, "MIN_TABLES", 8)


# Eight keyed tables, one with a TOAST column its updates leave unchanged (filled from
# the prior state), and a multiset (its prior state read through deltalake).
TABLES = [f"public.t{i}" for i in range(8)] + ["public.big8", "public.m9"]
KEYS = dict.fromkeys(TABLES, "id")


def setup_source(c: psycopg.Connection[Any], slot: str) -> None:
    c.execute(AUDIT_SQL)
    for qualified in TABLES:
        name = qualified.split(".")[1]
        if name.startswith("m"):
            c.execute(f"CREATE TABLE {name} (id int, v text)")
            c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        elif name.startswith("big"):
            c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text, doc text)")
            c.execute(f"ALTER TABLE {name} ALTER COLUMN doc SET STORAGE EXTERNAL")
        else:
            c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        audit(c, name, "id")
    c.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def workload(c: psycopg.Connection[Any], start: int) -> None:
    for qualified in TABLES:
        name = qualified.split(".")[1]
        with c.transaction():
            c.execute(
                f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                (start + 1, start + 20),
            )
            if name.startswith("big"):
                c.execute(f"UPDATE {name} SET doc = repeat(md5(id::text), 200) WHERE doc IS NULL")
            c.execute(f"UPDATE {name} SET v = 'u' || v WHERE id % 3 = 0")
            c.execute(f"DELETE FROM {name} WHERE id % 7 = 0")


def config(dsn: str, tmp_path: Path, slot: str, processes: int | None = 2) -> Config:
    cfg = make_config(dsn, str(tmp_path / "lake"), slot)
    cfg.lake.table_processes = processes
    return cfg


def check(dsn: str, lake: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        assert_mirror(c, lake, TABLES)
        assert_log_matches_audit(c, lake, KEYS)


def test_many_tables_are_written_by_forked_workers(
    pg_dsn: str, slot: str, tmp_path: Path, caplog: Any
) -> None:
    """Ten batches, each table's Delta tables reaching a checkpoint (version 10). The
    parent reads the lake through deltalake between batches, so its workers cannot use
    deltalake: the multiset (its prior state read through it) is done again by the
    parent; the checkpoints need no deltalake (slotlake.delta_checkpoint): the workers
    write them."""
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        for round_ in range(10):
            workload(c, round_ * 100)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="slotlake.batch"):
                result = run_sync(cfg)
            assert result.status == "committed"
            assert result.timings["batch.table_processes"] == 2
            assert set(result.tables) == set(TABLES)
            again = [r.getMessage() for r in caplog.records if "done again" in r.getMessage()]
            if round_ > 0:  # check() below started deltalake's runtime in this process
                assert again and all("deltalake" in m for m in again), again
                assert any("public.m9" in m for m in again), again
            if round_ == 0:
                # The data files' schemas the workers derived came back: the next
                # batch's workers find them (slotlake.schema_memo).
                for qualified in TABLES[:-1]:
                    for kind in (CHANGES, STATE):
                        path = str(Path(cfg.lake.path) / Lake.table_path(kind, qualified))
                        schema = local_snapshot(path).schema
                        assert schema_memo.get("physical", schema) is not None, path
            check(pg_dsn, cfg.lake.path)
    lake = Path(cfg.lake.path)
    for qualified in TABLES:
        for kind in (CHANGES, STATE):
            log_dir = lake / Lake.table_path(kind, qualified) / "_delta_log"
            written_by = pq.read_metadata(log_dir / f"{10:020d}.checkpoint.parquet").created_by
            assert written_by.startswith("parquet-cpp"), (log_dir, written_by)
            assert DeltaTable(str(log_dir.parent)).version() >= 10
    # Threads only (0): the same lake goes on, with no process.
    cfg.lake.table_processes = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        workload(c, 1000)
    result = run_sync(cfg)
    assert "batch.table_processes" not in result.timings
    check(pg_dsn, cfg.lake.path)


def test_tables_a_worker_does_not_finish_are_done_by_the_parent(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """t3's worker fails after writing both its Delta tables; t5's worker dies while it
    creates t5's change log, between its log directory and its first entry (the pool
    then stops the other worker wherever it is): the parent does all of those again, and
    no change is in a change log twice."""
    parent = os.getpid()
    real = batch_module._process_local
    real_create = LocalFS.create_new
    whole_syncs: list[str] = []
    real_sync = durability.sync_file_system
    t3_failed = tmp_path / "t3-failed"

    def in_workers_fail(spark: Any, lake: Any, cat: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(spark, lake, cat, *args, **kwargs)
        if os.getpid() != parent and cat.name == "public.t3":
            t3_failed.touch()
            raise RuntimeError("t3 failed in its worker")
        return out

    def create_dies(self: LocalFS, p: str, text: str, durable: bool = True) -> None:
        if os.getpid() != parent and "changes/public.t5/_delta_log/" in p:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            # Not before t3's failure is answered: the death breaks the pool, and t3's
            # answer would be that instead.
            deadline = time.monotonic() + 30
            while not t3_failed.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            os._exit(3)
        real_create(self, p, text, durable)

    def sync_whole(root: str) -> None:
        whole_syncs.append(root)
        real_sync(root)

    monkeypatch.setattr(batch_module, "_process_local", in_workers_fail)
    monkeypatch.setattr(LocalFS, "create_new", create_dies)
    monkeypatch.setattr(durability, "sync_file_system", sync_whole)
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    with caplog.at_level(logging.INFO, logger="slotlake.batch"):
        result = run_sync(cfg)
    assert result.status == "committed" and set(result.tables) == set(TABLES)
    again = [r.getMessage() for r in caplog.records if "done again" in r.getMessage()]
    assert any("public.t3" in m and "t3 failed in its worker" in m for m in again), again
    assert any("public.t5" in m and "BrokenProcessPool" in m for m in again), again
    # What the failed workers wrote was made durable with the file system whole (the dead
    # one's files cannot be listed), once.
    assert whole_syncs == [str(Path(cfg.lake.path))]
    check(pg_dsn, cfg.lake.path)


def test_entries_a_power_loss_left_torn_are_written_again(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Every table of batch 2 is written, then the run stops before the commit record
    (its files not yet synced); as after a power loss, one table's newest state entry is
    empty, another's change log entry cut in the middle, and a third's state entry names a
    data file left empty. The rerun removes them and writes the batch again, once."""
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
        run_sync(cfg)
        workload(c, 100)
    monkeypatch.setenv(FAULT_ENV, "changes_written")
    with pytest.raises(InjectedFault):
        run_sync(cfg)
    monkeypatch.delenv(FAULT_ENV)
    lake = Lake(cfg.lake.path)
    state = Path(cfg.lake.path) / Lake.table_path(STATE, "public.t2") / "_delta_log"
    changes = Path(cfg.lake.path) / Lake.table_path(CHANGES, "public.t4") / "_delta_log"
    newest_state, newest_changes = (max(d.glob("*.json")) for d in (state, changes))
    newest_state.write_bytes(b"")
    text = newest_changes.read_text()
    newest_changes.write_text(text[: len(text) // 2])
    # The entry reached the disk, the data file it adds did not (zero length).
    t6 = Path(cfg.lake.path) / Lake.table_path(STATE, "public.t6")
    newest = max((t6 / "_delta_log").glob("*.json")).read_text().splitlines()
    (added,) = [json.loads(line)["add"]["path"] for line in newest if '"add"' in line]
    (t6 / added).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="slotlake.lake"):
        result = run_sync(cfg)
    assert result.status == "committed" and result.resumed == 2
    warned = [r.getMessage() for r in caplog.records if "not whole on disk" in r.getMessage()]
    assert len(warned) == 3, warned
    assert 2 in lake.commit_batches()  # (a later, empty batch may follow: WAL moved on)
    check(pg_dsn, cfg.lake.path)


def _hang_in_worker(monkeypatch: pytest.MonkeyPatch, table: str) -> Any:
    """``table``'s worker blocks forever, as on a lock another thread of the parent held
    at the fork; the stall limit lowered to 3 s. Returns the real ``_process_local``."""
    parent = os.getpid()
    real = batch_module._process_local

    def blocks(spark: Any, lake: Any, cat: Any, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != parent and cat.name == table:
            threading.Event().wait()
        return real(spark, lake, cat, *args, **kwargs)

    monkeypatch.setattr(batch_module, "_process_local", blocks)
    monkeypatch.setattr(table_processes, "STALL_SECONDS", 3.0)
    return real


def _children() -> set[int]:
    """This process's live (not zombie) children, from /proc."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and state != "Z":
            out.add(int(entry.name))
    return out


def test_a_stuck_worker_is_killed_and_its_tables_done_by_the_parent(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """t4's worker never answers: after the stall limit the workers are killed, every
    table they had is done by the parent's threads, and the mirror is right."""
    _hang_in_worker(monkeypatch, "public.t4")
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    before = _children()
    with caplog.at_level(logging.INFO, logger="slotlake"):
        result = run_sync(cfg)
    assert result.status == "committed" and set(result.tables) == set(TABLES)
    messages = [r.getMessage() for r in caplog.records]
    assert any("no worker process answered for 3 s" in m for m in messages), messages
    again = [m for m in messages if "done again" in m]
    assert any("public.t4" in m and "BrokenProcessPool" in m for m in again), again
    assert _children() <= before  # no worker left behind
    check(pg_dsn, cfg.lake.path)


def test_a_failed_batch_does_not_wait_for_a_stuck_worker(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The batch fails (a fault after the first table a worker answered) while big8's
    worker (the batch's biggest table, so the first one out) is stuck: the workers are
    stopped within the stall limit, the error is the batch's own, and the rerun
    completes the batch."""
    real = _hang_in_worker(monkeypatch, "public.big8")
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    before = _children()
    monkeypatch.setenv(FAULT_ENV, "table_written")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="slotlake"), pytest.raises(InjectedFault):
        run_sync(cfg)
    assert time.monotonic() - started < 60
    assert any("still busy after 3 s: killed" in r.getMessage() for r in caplog.records)
    assert _children() <= before
    monkeypatch.delenv(FAULT_ENV)
    monkeypatch.setattr(batch_module, "_process_local", real)
    result = run_sync(cfg)
    assert result.status == "committed" and result.resumed == 1
    check(pg_dsn, cfg.lake.path)


def _spy_syncs(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """From now on: the roots whose file system is synced whole (not done), and the
    files synced by name (done)."""
    whole: list[str] = []
    named: list[str] = []
    real_paths = durability.sync_paths
    monkeypatch.setattr(durability, "sync_file_system", whole.append)

    def by_name(paths: list[str]) -> None:
        named.extend(paths)
        real_paths(paths)

    monkeypatch.setattr(durability, "sync_paths", by_name)
    return whole, named


def test_a_batch_syncs_the_files_it_wrote_by_name(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch done by the driver and its workers lists what it writes: the raw files, and
    each table's data files and log entries are fsynced by name before the records that
    name them, with nothing else of the disk (a PostgreSQL beside it) waited for."""
    whole, named = _spy_syncs(monkeypatch)
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    result = run_sync(cfg)
    assert result.status == "committed" and result.timings["batch.table_processes"] == 2
    assert whole == []
    lake = Path(cfg.lake.path)
    raw = {
        str(p) for p in (lake / Lake(cfg.lake.path).read_commit(1).raw).rglob("*") if p.is_file()
    }
    tables = {
        str(p)
        for kind in (CHANGES, STATE)
        for t in TABLES
        for p in (lake / Lake.table_path(kind, t)).rglob("*")
        if p.is_file() and (p.suffix == ".parquet" or p.parent.name == "_delta_log")
    }
    assert raw and tables and raw | tables <= set(named)
    check(pg_dsn, cfg.lake.path)


def test_a_batch_of_more_files_than_fsync_files_max_syncs_the_file_system_once(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``lake.fsync_files_max`` files, the tables' files are made durable by one
    ``syncfs`` of the lake's file system (before the commit record), not one by one; the
    raw files before the plan, fewer, still by name."""
    whole, named = _spy_syncs(monkeypatch)
    cfg = config(pg_dsn, tmp_path, slot)
    cfg.lake.fsync_files_max = 8
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    result = run_sync(cfg)
    assert result.status == "committed"
    assert whole == [str(Path(cfg.lake.path).resolve())]
    lake = Path(cfg.lake.path)
    raw = {
        str(p) for p in (lake / Lake(cfg.lake.path).read_commit(1).raw).rglob("*") if p.is_file()
    }
    assert raw and raw <= set(named)
    tables = [str(lake / Lake.table_path(kind, t)) for kind in (CHANGES, STATE) for t in TABLES]
    assert not any(p.startswith(t) for p in named for t in tables)
    check(pg_dsn, cfg.lake.path)


def test_an_in_place_reprocess_syncs_what_it_wrote_by_name(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolling the newest batch back and writing it again (no JVM): each table's restore
    and rewrite are not fsynced one by one; the entries are synced by name before the
    batch's record is swapped, with no sync of the whole disk."""
    from slotlake.reprocess import run_reprocess

    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        for round_ in range(2):
            workload(c, round_ * 100)
            assert run_sync(cfg).status == "committed"
    whole, named = _spy_syncs(monkeypatch)
    result = run_reprocess(cfg.lake.path, in_place=True, first=2)
    assert result.batches == [2] and whole == []
    lake = Path(cfg.lake.path)
    newest = {
        str(max((lake / Lake.table_path(kind, t) / "_delta_log").glob("*.json")))
        for kind in (CHANGES, STATE)
        for t in TABLES
    }
    assert newest <= set(named)
    check(pg_dsn, cfg.lake.path)


def test_a_sync_loads_the_tables_imports_while_it_pulls(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run imports what its tables need in a thread of its own (slotlake.preload),
    started before the pull and done before the workers fork: a module that takes a while
    to load is loaded by that thread, completely, by the time the workers answer."""
    from slotlake import preload

    name = "slotlake_test_preloaded"
    (tmp_path / f"{name}.py").write_text(
        "import threading, time\ntime.sleep(0.3)\nIMPORTED_BY = threading.current_thread().name\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preload, "MODULES", (name,))
    monkeypatch.delitem(sys.modules, name, raising=False)
    seen: list[bool] = []
    real_open = table_processes.TableProcesses.open.__func__  # type: ignore[attr-defined]

    def opening(cls: type, processes: int, job: Any) -> Any:
        lane = real_open(cls, processes, job)
        seen.append(hasattr(sys.modules.get(name), "IMPORTED_BY"))
        return lane

    monkeypatch.setattr(table_processes.TableProcesses, "open", classmethod(opening))
    cfg = config(pg_dsn, tmp_path, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 0)
    try:
        result = run_sync(cfg)
        assert result.status == "committed" and result.timings["batch.table_processes"] == 2
        assert seen == [True]
        assert sys.modules[name].IMPORTED_BY == "slotlake-preload"
    finally:
        sys.modules.pop(name, None)
    check(pg_dsn, cfg.lake.path)
