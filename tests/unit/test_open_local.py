"""Reused deltalake handles and log snapshots (slotlake.delta.open_local, local_snapshot):
one log replay per table and batch, never a stale one; between batches each table's
snapshot is kept and read forward from its own entry."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from slotlake import delta, delta_log
from slotlake.delta import (
    adopt_snapshots,
    arrow_append,
    forget_kept,
    handing_back,
    local_snapshot,
    open_local,
    reusing_local_tables,
    txn_version,
)


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    forget_kept()
    yield
    forget_kept()


def _fields(snap: delta_log.Snapshot) -> tuple:
    return snap.version, snap.protocol, snap.metadata, snap.txns, snap.files


def test_reused_inside_the_block_and_advanced_by_its_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    assert open_local(path) is not open_local(path)  # outside: a fresh handle each time
    assert local_snapshot(path) is local_snapshot(path)  # the kept snapshot, still latest
    with reusing_local_tables():
        first = open_local(path)
        assert open_local(path) is first
        snap = local_snapshot(path)
        assert local_snapshot(path) is snap
        # The append is committed by slotlake.delta_log: the snapshot it returns is kept,
        # and the deltalake handle, now behind, is opened again.
        arrow_append(path, pa.table({"x": [2]}), "app", 1)
        after = local_snapshot(path)
        assert after is not snap and after.version == 1 and after.txns == {"app": 1}
        assert local_snapshot(path) is after
        again = open_local(path)
        assert again is not first and again.version() == 1
        assert txn_version(path, "app") == 1
        # Asking for the files re-reads a snapshot read without them, once.
        with_files = local_snapshot(path, files=True)
        assert with_files.files is not None and len(with_files.files) == 2
        assert local_snapshot(path) is with_files


def test_a_write_by_someone_else_reopens(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    with reusing_local_tables():
        first = open_local(path)
        write_deltalake(DeltaTable(path), pa.table({"x": [2]}), mode="append")  # not via it
        again = open_local(path)
        assert again is not first and again.version() == 1
        assert again.to_pyarrow_table().num_rows == 2


def test_nested_blocks_share_and_the_outermost_drops(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    with reusing_local_tables():
        first = open_local(path)
        with reusing_local_tables():
            assert open_local(path) is first
        assert open_local(path) is first
    assert open_local(path) is not first


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose logs are read afresh (checkpoint and entries) from now on."""
    paths: list[str] = []
    whole = delta_log.snapshot

    def counted(path: str, files: bool = False, version: int | None = None) -> object:
        paths.append(path)
        return whole(path, files, version)

    monkeypatch.setattr(delta_log, "snapshot", counted)
    return paths


def test_kept_between_batches_and_read_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    with reusing_local_tables():
        local_snapshot(path, files=True)
        arrow_append(path, pa.table({"x": [2]}), "app", 1)
    reads = _reads(monkeypatch)
    # Written by others since: deltalake, and the driver outside any batch.
    write_deltalake(DeltaTable(path), pa.table({"x": [3]}), mode="append")
    arrow_append(path, pa.table({"x": [4]}), "app", 2)
    with reusing_local_tables():
        snap = local_snapshot(path, files=True)
    assert reads == []  # the kept snapshot, read forward: no checkpoint, no older entry
    assert snap.version == 3 and snap.txns == {"app": 2} and len(snap.files or {}) == 4
    monkeypatch.undo()
    assert _fields(snap) == _fields(delta_log.snapshot(path, files=True))


def test_a_table_rebuilt_at_its_path_is_read_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    arrow_append(path, pa.table({"x": [2]}), "app", 1)
    assert local_snapshot(path).txns == {"app": 1}
    shutil.rmtree(path)
    # The same versions, another table: its entry 1 is not the kept one's.
    write_deltalake(path, pa.table({"y": ["a"]}))
    write_deltalake(path, pa.table({"y": ["b"]}), mode="append")
    reads = _reads(monkeypatch)
    snap = local_snapshot(path, files=True)
    assert reads == [path]
    assert snap.version == 1 and snap.txns == {} and snap.schema.fieldNames() == ["y"]


def test_many_entries_since_and_files_not_kept_are_read_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    local_snapshot(path)  # kept without its files
    reads = _reads(monkeypatch)
    assert len(local_snapshot(path, files=True).files or {}) == 1
    assert reads == [path]  # files asked for: read afresh, then kept with them
    monkeypatch.setattr(delta, "KEPT_FORWARD_MAX", 2)
    for batch in range(1, 4):
        arrow_append(path, pa.table({"x": [batch]}), "app", batch)
    # Each append advanced the kept snapshot; three entries by someone else are more
    # than two to read forward.
    for _ in range(3):
        write_deltalake(path, pa.table({"x": [0]}), mode="append")
    snap = local_snapshot(path, files=True)
    assert reads == [path, path]
    assert snap.version == 6 and len(snap.files or {}) == 7 and snap.txns == {"app": 3}


def test_a_workers_snapshots_handed_back_are_kept_unless_older(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    stale = local_snapshot(path)
    with handing_back() as handed:
        arrow_append(path, pa.table({"x": [2]}), "app", 1)
    assert [s.version for s, _ in handed] == [1]
    forget_kept()
    adopt_snapshots(handed)
    kept = local_snapshot(path)
    assert kept is handed[0][0]  # taken as it came: nothing read
    adopt_snapshots([(stale, delta._entry_id(stale))])  # older: the newer stays
    assert local_snapshot(path) is kept


def test_read_forward_across_a_checkpoint_is_the_fresh_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    local_snapshot(path, files=True)
    for batch in range(1, 13):  # a checkpoint at 10 meanwhile, written by deltalake
        write_deltalake(
            path,
            pa.table({"x": [batch]}),
            mode="overwrite" if batch == 5 else "append",
            commit_properties=CommitProperties(app_transactions=[Transaction("app", batch)]),
        )
        if batch == 10:
            DeltaTable(path).create_checkpoint()
    reads = _reads(monkeypatch)
    kept = local_snapshot(path, files=True)
    assert reads == []
    monkeypatch.undo()
    fresh = delta_log.snapshot(path, files=True)  # from the checkpoint at 10
    assert (kept.version, kept.txns, kept.protocol) == (fresh.version, fresh.txns, fresh.protocol)
    assert kept.metadata["schemaString"] == fresh.metadata["schemaString"]
    assert kept.files is not None and fresh.files is not None
    assert set(kept.files) == set(fresh.files) and len(kept.files) == 8
    assert {p: a["size"] for p, a in kept.files.items()} == {
        p: a["size"] for p, a in fresh.files.items()
    }
