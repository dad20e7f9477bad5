"""Key indexes of state files (:mod:`slotlake.key_index`), on Parquet files written
here: what they find, what they refuse, and what ``prune`` removes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotlake import key_index


def _file(table: Path, name: str, keys: list[int | None]) -> dict[str, object]:
    """A data file of ``keys`` (and a value column) and its ``add`` action."""
    target = table / name
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"k": pa.array(keys, pa.int32()), "v": [str(k) for k in keys]}), target)
    stats = {"numRecords": len(keys)}
    return {"path": name, "size": os.path.getsize(target), "stats": json.dumps(stats)}


def test_positions_of_the_keys_asked_for(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys = rng.permutation(50_000).tolist()
    add = _file(tmp_path, "sub/part-0.parquet", keys)
    index = key_index.load(str(tmp_path), add, "k")
    assert index is not None
    asked = np.array([keys[17], -5, keys[0], 10**9, keys[-1], keys[17]], dtype=np.int64)
    positions, which = key_index.find(index, asked)
    assert positions.tolist() == [17, 0, 49_999, 17]
    assert which.tolist() == [0, 2, 4, 5]
    # Kept beside the table, named by the file (its directory included) and its size.
    kept = Path(key_index.index_path(str(tmp_path), add, "k"))
    assert kept.parent == tmp_path / key_index.DIRECTORY
    assert kept.name.startswith("sub%2Fpart-0.parquet.") and kept.exists()
    assert kept.name.endswith(".k.keys.npy")
    # Another key column (a replica identity moved) has an index of its own.
    assert key_index.index_path(str(tmp_path), add, "a.b").endswith(".a%2Eb.keys.npy")
    again = key_index.load(str(tmp_path), add, "k")
    assert isinstance(again, np.memmap) or isinstance(getattr(again, "base", None), np.memmap)
    empty = key_index.find(index, np.empty(0, dtype=np.int64))
    assert [len(a) for a in empty] == [0, 0]


@pytest.mark.parametrize("keys", [[1, 2, 2, 3], [1, None, 3]], ids=["a key twice", "a NULL key"])
def test_files_that_cannot_be_indexed(tmp_path: Path, keys: list[int | None]) -> None:
    add = _file(tmp_path, "part-0.parquet", keys)
    assert key_index.load(str(tmp_path), add, "k") is None
    assert key_index.load(str(tmp_path), add, "v") is None  # not an integer column
    assert not (tmp_path / key_index.DIRECTORY).exists() or not list(
        (tmp_path / key_index.DIRECTORY).iterdir()
    )


def test_an_index_that_does_not_fit_is_made_again(tmp_path: Path, caplog) -> None:
    add = _file(tmp_path, "part-0.parquet", [5, 3, 9])
    kept = Path(key_index.index_path(str(tmp_path), add, "k"))
    kept.parent.mkdir()
    kept.write_bytes(b"not numpy")
    index = key_index.load(str(tmp_path), add, "k")
    assert index is not None and np.asarray(index).tolist() == [[3, 5, 9], [1, 0, 2]]
    assert "unreadable" in caplog.text
    np.save(kept, np.zeros((2, 7), dtype=np.int64))
    assert np.asarray(key_index.load(str(tmp_path), add, "k")).tolist() == [[3, 5, 9], [1, 0, 2]]
    assert "does not fit" in caplog.text


def test_files_below_the_bound_are_not_indexed(tmp_path: Path, monkeypatch) -> None:
    """A MERGE indexes a file of any size by default; the bootstrap and ``maintain`` ask
    for big ones only (``AHEAD_MIN_ROWS``); a file without a row count gets none."""
    add = _file(tmp_path, "part-1.parquet", list(range(100)))
    no_stats = {k: v for k, v in add.items() if k != "stats"}
    assert key_index.load(str(tmp_path), no_stats, "k") is None  # no row count
    assert key_index.load(str(tmp_path), add, "k", key_index.AHEAD_MIN_ROWS) is None
    assert not (tmp_path / key_index.DIRECTORY).exists()
    monkeypatch.setattr(key_index, "MIN_ROWS", 100)
    small = _file(tmp_path, "part-0.parquet", list(range(99)))
    assert key_index.load(str(tmp_path), small, "k") is None  # no index made
    assert key_index.load(str(tmp_path), small, "k", 99) is not None  # asked for
    monkeypatch.undo()
    one = _file(tmp_path, "part-2.parquet", [7])
    assert np.asarray(key_index.load(str(tmp_path), one, "k")).tolist() == [[7], [0]]
    assert key_index.load(str(tmp_path), add, "k") is not None
    assert len(list((tmp_path / key_index.DIRECTORY).iterdir())) == 3


def test_prune_removes_the_indexes_of_deleted_files_and_leftovers(tmp_path: Path) -> None:
    kept = _file(tmp_path, "sub/keep.parquet", [1, 2])
    gone = _file(tmp_path, "gone.parquet", [3, 4])
    for add in (kept, gone):
        assert key_index.load(str(tmp_path), add, "k") is not None
    folder = tmp_path / key_index.DIRECTORY
    (folder / "x.keys.npy.0123.tmp").write_bytes(b"")  # a write that did not finish
    os.remove(tmp_path / "gone.parquet")
    assert key_index.prune(str(tmp_path)) == 2
    assert [p.name for p in folder.iterdir()] == [Path(key_index.index_path("", kept, "k")).name]
    assert key_index.prune(str(tmp_path / "no table")) == 0
