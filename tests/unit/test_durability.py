"""A batch's Delta log entries made durable together (slotlake.durability), and what a
power loss may leave of them removed before the batch is redone
(slotlake.delta_log.drop_torn_entries)."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    """The paths fsynced (os.fsync still runs: the spy records which descriptor's path)."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def test_entries_of_a_deferring_batch_are_synced_together_at_its_end(
    tmp_path: Path, synced: list[str]
) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with durability.deferred(str(tmp_path)):
        assert durability.deferring()
        for path in (a, b):
            create_on_driver(path, SCHEMA)
            delta_log.append(delta_log.snapshot(path), _rows(1, 2), "app", 1)
        # Written and readable, not synced yet.
        assert DeltaTable(a).version() == 1 and DeltaTable(b).version() == 1
        assert synced == []
    entries = {str(_entry(p, v)) for p in (a, b) for v in (0, 1)}
    dirs = {str(Path(p) / "_delta_log") for p in (a, b)}
    assert set(synced) == entries | dirs
    # Each file before any directory: a name is made durable after what it names.
    assert set(synced[: len(entries)]) == entries
    assert not durability.deferring()


def test_outside_a_batch_each_commit_is_synced_at_once(tmp_path: Path, synced: list[str]) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    synced.clear()
    delta_log.append(delta_log.snapshot(path), _rows(1), "app", 1)
    # The temporary file (linked to the entry) and the directory holding the entry.
    assert len(synced) == 2 and synced[1] == str(Path(path) / "_delta_log")


def test_a_failed_batch_syncs_what_it_wrote_and_raises_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synced: list[str]
) -> None:
    """A second attempt in the same run (the raw pulled again) keeps what the first one
    committed: those entries are synced when the first fails."""
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


def test_entries_of_a_dead_worker_sync_the_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synced: list[str]
) -> None:
    whole: list[str] = []
    monkeypatch.setattr(durability, "sync_file_system", whole.append)
    path = str(tmp_path / "t")
    with durability.deferred(str(tmp_path)):
        create_on_driver(path, SCHEMA)
        mark = durability.mark()
        delta_log.append(delta_log.snapshot(path), _rows(1), "app", 1)
        # What a forked worker hands back: its entries since the mark.
        assert durability.since(mark) == [str(_entry(path, 1))]
        durability.lost()
    assert whole == [str(tmp_path)] and synced == []


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
    assert sorted(p.name for p in (Path(path) / "_delta_log").iterdir()) == [
        f"{0:020d}.json",
        f"{1:020d}.json",
    ]
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


def test_a_workers_entries_are_synced_by_name_unless_it_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synced: list[str]
) -> None:
    """What the parent makes of a forked worker's answer (slotlake.batch._from_worker):
    the entries a worker wrote, finished or failed, are synced by name; a dead worker's
    cannot be listed, so the file system is synced whole."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from slotlake.batch import _from_worker

    whole: list[str] = []
    monkeypatch.setattr(durability, "sync_file_system", whole.append)
    entry = tmp_path / "t" / "_delta_log" / f"{3:020d}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}\n")
    failed: Future = Future()
    failed.set_result((False, "RuntimeError: boom", [str(entry)]))
    with durability.deferred(str(tmp_path)):
        assert _from_worker(failed) == (None, "RuntimeError: boom")
    assert set(synced) == {str(entry), str(entry.parent)} and whole == []
    done: Future = Future()
    done.set_result((True, (("public.t", None, 0.1), []), [str(entry)]))
    synced.clear()
    with durability.deferred(str(tmp_path)):
        assert _from_worker(done) == ((("public.t", None, 0.1), []), "")
    assert str(entry) in synced and whole == []
    died: Future = Future()
    died.set_exception(BrokenProcessPool("a worker died"))
    synced.clear()
    with durability.deferred(str(tmp_path)):
        answer, why = _from_worker(died)
    assert answer is None and why == "BrokenProcessPool: a worker died"
    assert whole == [str(tmp_path)] and synced == []
