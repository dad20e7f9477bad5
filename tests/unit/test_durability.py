"""A batch's Delta log entries made durable together (slotlake.durability), and what a
power loss may leave of them removed before the batch is redone
(slotlake.delta_log.drop_torn_entries)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from slotlake import delta_log, durability
from slotlake.delta import create_on_driver
from slotlake.lake import query_delta

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _entry(path: str, version: int) -> Path:
    return Path(path) / "_delta_log" / f"{version:020d}.json"


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What was synced, in order: a path fsynced (os.fsync still runs: the spy records
    which descriptor's path), or ``fs:<root>`` for the file system of ``root``."""
    seen: list[str] = []
    real_fsync, real_fs = os.fsync, durability.sync_file_system

    def spy(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def spy_fs(root: str) -> None:
        seen.append(f"fs:{root}")
        real_fs(root)

    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(durability, "sync_file_system", spy_fs)
    return seen


def _data_files(path: str) -> set[str]:
    return {str(p) for p in Path(path).glob("*.parquet")}


def test_a_deferring_batch_syncs_what_it_listed_at_its_end(
    tmp_path: Path, synced: list[str]
) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with durability.deferred(str(tmp_path)):
        assert durability.deferring()
        for path in (a, b):
            create_on_driver(path, SCHEMA)
            delta_log.append(delta_log.snapshot(path), _rows(1, 2), "app", 1)
        # Written and readable, nothing synced yet.
        assert DeltaTable(a).version() == 1 and DeltaTable(b).version() == 1
        assert synced == []
    files = {str(_entry(p, v)) for p in (a, b) for v in (0, 1)} | _data_files(a) | _data_files(b)
    dirs = {str(Path(p)) for p in (a, b)} | {str(Path(p) / "_delta_log") for p in (a, b)}
    assert len(files) == 6 and set(synced) == files | dirs
    # Each file before any directory: a name is made durable after what it names.
    assert set(synced[: len(files)]) == files
    assert not durability.deferring() and durability.last_sync_seconds() >= 0


def test_a_batch_of_many_files_syncs_its_file_system_once(
    tmp_path: Path, synced: list[str]
) -> None:
    """More files listed than the batch's ``files_max`` (a batch of many small tables):
    one ``syncfs`` of the lake's file system instead of an fsync each; up to it, by name."""
    paths = [str(tmp_path / f"t{i}") for i in range(3)]
    with durability.deferred(str(tmp_path), files_max=5):
        for path in paths:
            create_on_driver(path, SCHEMA)  # three entries: by name
        durability.flush(str(tmp_path))
        assert set(synced) == {str(_entry(p, 0)) for p in paths} | {
            str(_entry(p, 0).parent) for p in paths
        }
        synced.clear()
        for path in paths:  # three data files and three entries: six, past five
            delta_log.append(delta_log.snapshot(path), _rows(1, 2), "app", 1)
    assert synced == [f"fs:{tmp_path}"]


def test_files_off_the_lakes_file_system_are_synced_by_name(
    tmp_path: Path, synced: list[str]
) -> None:
    """A listed file on another file system than the lake root's (a raw directory
    elsewhere) would not be reached by the root's ``syncfs``: all are fsynced by name."""
    # The suite's tmp_path may itself be on /dev/shm (tests/conftest.py): then the disk's.
    other = [
        Path(d)
        for d in ("/dev/shm", tempfile.gettempdir())
        if Path(d).is_dir() and os.stat(d).st_dev != os.stat(tmp_path).st_dev
    ]
    assert other, f"no directory on another file system than {tmp_path}"
    other_fs = other[0]
    elsewhere = other_fs / f"slotlake-test-{os.getpid()}"
    elsewhere.write_bytes(b"raw")
    try:
        assert not durability.on_file_system_of(str(tmp_path), [str(elsewhere)])
        local = [str(tmp_path / f"f{i}") for i in range(3)]
        for p in local:
            Path(p).write_bytes(b"x")
        assert durability.on_file_system_of(str(tmp_path), local)
        with durability.deferred(str(tmp_path), files_max=2):
            durability.written(*local, str(elsewhere))
        assert set(synced) == {*local, str(elsewhere), str(tmp_path), str(other_fs)}
    finally:
        elsewhere.unlink()


def test_outside_a_batch_a_commit_syncs_what_it_names_before_its_entry(
    tmp_path: Path, synced: list[str]
) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    synced.clear()
    delta_log.append(delta_log.snapshot(path), _rows(1), "app", 1)
    # The data file and its directory before the entry exists; then the entry's temporary
    # file (linked to its name) and the directory holding it.
    assert synced[:2] == [*_data_files(path), path] and len(synced) == 4
    assert synced[3] == str(Path(path) / "_delta_log")


def test_files_nobody_listed_sync_the_file_system(tmp_path: Path, synced: list[str]) -> None:
    """Spark or deltalake wrote, or a worker died: the next flush syncs the file system
    whole (and is done: the one after it syncs what was listed since)."""
    path = str(tmp_path / "t")
    with durability.deferred(str(tmp_path)):
        create_on_driver(path, SCHEMA)
        durability.unlisted()
        durability.flush(str(tmp_path))
        assert synced == [f"fs:{tmp_path}"]
        delta_log.append(delta_log.snapshot(path), _rows(1), "app", 1)
    listed = {str(_entry(path, 1)), *_data_files(path)}
    assert set(synced[1:]) == listed | {path, str(Path(path) / "_delta_log")}


def test_a_failed_batch_syncs_what_it_wrote_and_raises_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synced: list[str]
) -> None:
    """A second attempt in the same run (the raw pulled again) keeps what the first one
    committed: it is synced when the first fails, and a sync error does not hide the
    batch's own."""
    path = str(tmp_path / "t")
    with pytest.raises(RuntimeError, match="boom"), durability.deferred(str(tmp_path)):
        create_on_driver(path, SCHEMA)
        raise RuntimeError("boom")
    assert set(synced) == {str(_entry(path, 0)), str(_entry(path, 0).parent)}
    assert not durability.deferring()

    def broken(paths: list[str]) -> None:
        raise OSError("EIO")

    monkeypatch.setattr(durability, "sync_paths", broken)
    with pytest.raises(RuntimeError, match="boom"), durability.deferred(str(tmp_path)):
        delta_log.append(delta_log.snapshot(path), _rows(1), "app", 1)
        raise RuntimeError("boom")
    assert not durability.deferring()


def test_plans_and_commit_records_come_after_what_they_name_is_on_disk(
    tmp_path: Path, synced: list[str]
) -> None:
    """Before a plan: its raw files (in a sync's batch, by name; a plan with snapshot
    copies, and anything outside a batch, with the file system whole); before a commit
    record: what the batch listed. Each time the record is not there yet."""
    from slotlake.lake import BatchPlan, Lake, make_record

    root = tmp_path / "lake"
    lake = Lake(str(root))
    lake.ensure_layout()
    raw = root / "raw" / "batch=1"
    raw.mkdir(parents=True)
    (raw / "part-0.parquet").write_bytes(b"raw")
    (raw / "catalog.json").write_text("{}")
    plan = BatchPlan(1, "a1", "s", "0/10", "0/20", "0/20", "raw/batch=1", 0, 0, "app")
    record = make_record(
        batch=1,
        attempt="a1",
        slot="s",
        start_lsn="0/10",
        end_lsn="0/20",
        target_lsn="0/20",
        raw="raw/batch=1",
    )
    with durability.deferred(str(root)):
        synced.clear()
        lake.write_plan(plan)
        # The raw files and their directory, then the plan's own file and directory.
        assert set(synced[:3]) == {str(raw / "part-0.parquet"), str(raw / "catalog.json"), str(raw)}
        assert synced[3].endswith(".tmp") and synced[4:] == [str(root / "_pending")]
        synced.clear()
        with_copies = BatchPlan(**{**plan.__dict__, "snapshot": {"tables": {"public.t": {}}}})
        lake.replace_plan(with_copies)
        assert synced[0] == f"fs:{root}"
        synced.clear()
        lake.write_commit(record)
        assert synced[0].endswith(".tmp")  # nothing listed since the plan: the record
    synced.clear()
    lake.replace_commit(record)  # outside a sync's batch (in-place reprocessing)
    assert synced[0] == f"fs:{root}"
    assert lake.read_plan(1) == with_copies and lake.read_commit(1).batch == 1


def _table(path: str, versions: int) -> None:
    create_on_driver(path, SCHEMA)
    for v in range(1, versions):
        delta_log.append(delta_log.snapshot(path), _rows(v), "app", v)


def test_an_empty_entry_after_the_committed_version_is_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path, 4)  # versions 0..3
    _entry(path, 3).write_bytes(b"")
    assert delta_log.drop_torn_entries(path, after=2) == [3]
    assert DeltaTable(path).version() == 2
    assert query_delta(path, 2, "SELECT id FROM t ORDER BY id").column("id").to_pylist() == [1, 2]
    # The batch writes it again as version 3.
    after, _ = delta_log.append(delta_log.snapshot(path), _rows(3), "app", 3)
    assert after.version == 3 and DeltaTable(path).transaction_version("app") == 3


def test_a_torn_entry_goes_with_every_entry_after_it(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path, 5)  # versions 0..4
    whole = _entry(path, 2).read_text()
    _entry(path, 2).write_text(whole[: len(whole) // 2])  # a line cut in the middle
    assert delta_log.drop_torn_entries(path, after=1) == [2, 3, 4]
    names = sorted(p.name for p in (Path(path) / "_delta_log").iterdir())
    assert [n for n in names if n.endswith(".json")] == [f"{0:020d}.json", f"{1:020d}.json"]
    # A checkpoint the driver left (at the table's phase) may stay only if it is kept's.
    assert all(int(n[:20]) <= 1 for n in names if n[:1].isdigit()), names
    assert delta_log.snapshot(path).version == 1


def test_whole_entries_and_committed_ones_stay(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path, 3)
    assert delta_log.drop_torn_entries(path, after=0) == []
    # An entry at or before the committed version is never looked at: not the batch's.
    _entry(path, 1).write_bytes(b"")
    assert delta_log.drop_torn_entries(path, after=1) == []
    assert _entry(path, 1).exists()
    assert delta_log.drop_torn_entries(str(tmp_path / "none"), after=-1) == []


def test_a_checkpoint_of_a_removed_version_goes_too(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _table(path, 3)
    DeltaTable(path).create_checkpoint()  # at version 2, with the hint naming it
    delta_log.append(delta_log.snapshot(path), _rows(9), "app", 9)
    _entry(path, 2).write_bytes(b"\0\0\0")
    assert delta_log.drop_torn_entries(path, after=1) == [2, 3]
    names = sorted(p.name for p in (Path(path) / "_delta_log").iterdir())
    assert not [n for n in names if "checkpoint" in n]
    assert DeltaTable(path).version() == 1
    assert json.loads(_entry(path, 1).read_text().splitlines()[0])


def test_a_table_whose_creation_was_undone_is_created_again(tmp_path: Path) -> None:
    """A torn first entry removed (or a kill between the log directory and its first
    entry) leaves an empty ``_delta_log``: no table yet, created as new."""
    from slotlake.delta import delta_schema, ensure_local, local_version, table_bytes, txn_version

    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    _entry(path, 0).write_bytes(b"")
    assert delta_log.drop_torn_entries(path, after=-1) == [0]
    assert (Path(path) / "_delta_log").is_dir() and not delta_log.has_log(path)
    assert delta_schema(path) is None and local_version(path) is None
    assert table_bytes(path) is None and txn_version(path, "app") is None
    got = ensure_local(lambda: pytest.fail("no Spark for a new table"), path, path, SCHEMA)
    assert [f.name for f in got.fields] == ["id", "v"]
    assert delta_log.snapshot(path).version == 0


def _added(path: str, version: int) -> list[dict[str, object]]:
    lines = _entry(path, version).read_text().splitlines()
    return [json.loads(line)["add"] for line in lines if '"add"' in line]


def test_an_entry_naming_a_data_file_cut_short_is_removed(tmp_path: Path) -> None:
    """A power loss can leave the entry on disk and not the data file it adds (written
    before it, synced only with the batch): empty, or shorter than the entry says."""
    path = str(tmp_path / "t")
    _table(path, 4)  # versions 0..3
    (add,) = _added(path, 2)
    data = Path(path) / str(add["path"])
    data.write_bytes(data.read_bytes()[:10])
    assert delta_log.drop_torn_entries(path, after=1) == [2, 3]
    assert DeltaTable(path).version() == 1
    _table(str(tmp_path / "u"), 3)
    (add,) = _added(str(tmp_path / "u"), 2)
    (tmp_path / "u" / str(add["path"])).unlink()
    assert delta_log.drop_torn_entries(str(tmp_path / "u"), after=1) == [2]


def test_an_entry_naming_a_deletion_vector_not_on_disk_is_removed(tmp_path: Path) -> None:
    """A state MERGEd with deletion vectors (slotlake.dv_merge): the vector file a power
    loss did not keep makes its entry not whole."""
    from slotlake import deletion_vector

    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    # A table with a vector: the first file's row 0 deleted by an entry written by hand.
    delta_log.append(delta_log.snapshot(path), _rows(1, 2, 3), "app", 1)
    (add,) = _added(path, 1)
    vectors = deletion_vector.DeletionVectorFile.new()
    descriptor = vectors.add(np.array([0], dtype=np.uint64))
    vector_file = deletion_vector.descriptor_path(path, descriptor)
    assert vector_file is not None
    Path(vector_file).write_bytes(bytes(vectors.body))
    with_vector = {**add, "deletionVector": descriptor}
    remove = delta_log.removal(add, 0)
    _entry(path, 2).write_text(json.dumps(remove) + "\n" + json.dumps({"add": with_vector}) + "\n")
    ids = "SELECT id FROM t ORDER BY id"
    assert delta_log.drop_torn_entries(path, after=1) == []  # whole
    assert query_delta(path, 2, ids).column("id").to_pylist() == [2, 3]
    Path(vector_file).unlink()
    assert delta_log.drop_torn_entries(path, after=1) == [2]
    assert DeltaTable(path).version() == 1
    assert query_delta(path, 1, ids).column("id").to_pylist() == [1, 2, 3]


def test_a_workers_files_are_synced_by_name_unless_it_died(
    tmp_path: Path, synced: list[str]
) -> None:
    """What the parent makes of a forked worker's answer (slotlake.batch._from_worker):
    the files a worker wrote, finished or failed, are synced by name; a dead worker's
    cannot be listed, nor those of a worker that wrote unlisted ones (through deltalake),
    so the file system is synced whole."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from slotlake.batch import _from_worker

    entry = tmp_path / "t" / "_delta_log" / f"{3:020d}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}\n")
    failed: Future = Future()
    failed.set_result((False, "RuntimeError: boom", ([str(entry)], False)))
    with durability.deferred(str(tmp_path)):
        assert _from_worker(failed) == (None, "RuntimeError: boom")
    assert set(synced) == {str(entry), str(entry.parent)}
    done: Future = Future()
    done.set_result((True, (("public.t", None, 0.1), []), ([str(entry)], False)))
    synced.clear()
    with durability.deferred(str(tmp_path)):
        assert _from_worker(done) == ((("public.t", None, 0.1), []), "")
    assert str(entry) in synced and f"fs:{tmp_path}" not in synced
    died: Future = Future()
    died.set_exception(BrokenProcessPool("a worker died"))
    synced.clear()
    with durability.deferred(str(tmp_path)):
        answer, why = _from_worker(died)
    assert answer is None and why == "BrokenProcessPool: a worker died"
    assert synced == [f"fs:{tmp_path}"]
    unlisted: Future = Future()
    unlisted.set_result((True, (("public.t", None, 0.1), []), ([str(entry)], True)))
    synced.clear()
    with durability.deferred(str(tmp_path)):
        assert _from_worker(unlisted) == ((("public.t", None, 0.1), []), "")
    assert synced == [f"fs:{tmp_path}"]


def test_a_worker_hands_back_its_files_and_its_unlisted_writes(tmp_path: Path) -> None:
    """In a forked worker, unlisted() stays in its process: hand_back() carries it to
    the parent, once."""
    with durability.deferred(str(tmp_path)):
        mark = durability.mark()
        durability.written(str(tmp_path / "a"))
        assert durability.hand_back(mark) == ([str(tmp_path / "a")], False)
        durability.unlisted()
        assert durability.hand_back(mark) == ([str(tmp_path / "a")], True)
        assert durability.hand_back(mark + 1) == ([], False)


def test_an_added_file_given_by_an_absolute_uri_is_checked_where_it_is(tmp_path: Path) -> None:
    """Delta allows absolute paths in add actions: a file:// one is checked on this disk,
    an object store's is not this repair's to judge."""
    data = tmp_path / "elsewhere" / "part-0.parquet"
    data.parent.mkdir()
    data.write_bytes(b"0123456789")
    assert not delta_log._not_whole(str(tmp_path), {"path": data.as_uri(), "size": 10})
    assert delta_log._not_whole(str(tmp_path), {"path": data.as_uri(), "size": 11})
    assert not delta_log._not_whole(str(tmp_path), {"path": "s3://bucket/t/part-0.parquet"})
    assert delta_log._not_whole(str(tmp_path), {"path": "part-9.parquet", "size": 1})
