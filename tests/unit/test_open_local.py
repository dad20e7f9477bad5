"""Reused deltalake handles and log snapshots (slotlake.delta.open_local, local_snapshot):
one log replay per table and batch, never a stale one."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from slotlake.delta import (
    arrow_append,
    local_snapshot,
    open_local,
    reusing_local_tables,
    txn_version,
)


def test_reused_inside_the_block_and_advanced_by_its_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    assert open_local(path) is not open_local(path)  # outside: a fresh handle each time
    assert local_snapshot(path) is not local_snapshot(path)
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
