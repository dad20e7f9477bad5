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
    values = {"k": pa.array(keys, pa.int32()), "v": [str(k) for k in keys]}
    pq.write_table(pa.table(values | {"f": pa.array(keys, pa.float64())}), target)
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
    assert key_index.load(str(tmp_path), add, "f") is None  # floats are not indexed
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


def _text_file(table: Path, name: str, keys: list[str | None]) -> dict[str, object]:
    target = table / name
    pq.write_table(pa.table({"k": pa.array(keys, pa.string())}), target)
    stats = {"numRecords": len(keys)}
    return {"path": name, "size": os.path.getsize(target), "stats": json.dumps(stats)}


def test_text_keys_are_found_exactly(tmp_path: Path) -> None:
    """A text index holds the keys themselves, NUL-padded to the file's longest: a key
    that is another's prefix, differs in a trailing space, or is longer than any key of
    the file is no hit; multi-byte UTF-8 and the empty string are found."""
    rng = np.random.default_rng(5)
    uuids = [bytes(rng.integers(0, 256, 16, dtype=np.uint8)).hex() for _ in range(3000)]
    keys = ["ab", "abc", "a", "a ", "", "é", "zz", *uuids]
    order = rng.permutation(len(keys))
    keys = [keys[i] for i in order]
    add = _text_file(tmp_path, "part-0.parquet", keys)
    made = key_index.load(str(tmp_path), add, "k")
    assert made is not None and key_index.TextIndex(made).width == 32
    index = key_index.load(str(tmp_path), add, "k")  # mapped this time
    assert isinstance(index, np.memmap) or isinstance(getattr(index, "base", None), np.memmap)
    asked = ["a ", "ab\0", "abcd", uuids[7], "b", "", "é", "x" * 40, "ab", uuids[7], "a  "]
    found = key_index.Lookup(pa.array(asked)).find(index)
    assert found is not None
    positions, which = found
    got = sorted(zip(which.tolist(), positions.tolist(), strict=True))
    want = [(i, keys.index(k)) for i, k in enumerate(asked) if k in keys]
    assert got == want
    assert [asked[i] for i, _ in got] == ["a ", uuids[7], "", "é", "ab", uuids[7]]
    # An index of the other kind is not searched with these keys.
    ints = key_index.load(str(tmp_path), _file(tmp_path, "part-1.parquet", [3, 1, 2]), "k")
    assert ints is not None
    assert key_index.Lookup(pa.array(asked)).find(ints) is None
    assert key_index.Lookup(pa.array([2, 9], pa.int64())).find(index) is None
    assert key_index.Lookup(pa.array([2, 9], pa.int64())).find(ints)[0].tolist() == [2]


@pytest.mark.parametrize(
    "keys",
    [["a", "b", "a"], ["a", None], ["x" * (key_index.MAX_TEXT_BYTES + 1), "b"], ["a\0", "b"]],
    ids=["a key twice", "a NULL key", "a key too long", "a NUL in a key"],
)
def test_text_files_that_cannot_be_indexed(tmp_path: Path, keys: list[str | None]) -> None:
    add = _text_file(tmp_path, "part-0.parquet", keys)
    assert key_index.load(str(tmp_path), add, "k") is None
    assert not (tmp_path / key_index.DIRECTORY).exists()


def test_a_text_index_that_does_not_fit_is_made_again(tmp_path: Path, caplog) -> None:
    add = _text_file(tmp_path, "part-0.parquet", ["b", "a", "c"])
    kept = Path(key_index.index_path(str(tmp_path), add, "k"))
    kept.parent.mkdir()
    two = key_index.TextIndex.build(np.array([b"a", b"b"], dtype="S1"), np.arange(2))
    np.save(kept, two)  # a file of two rows
    index = key_index.load(str(tmp_path), add, "k")
    assert index is not None and "does not fit" in caplog.text
    made = key_index.TextIndex(index)
    assert made.keys.tolist() == [b"a", b"b", b"c"] and made.positions.tolist() == [1, 0, 2]
    np.save(kept, index[:-1])  # torn
    assert key_index.TextIndex(key_index.load(str(tmp_path), add, "k")).rows == 3


def test_keys_that_share_their_first_bytes_are_found(tmp_path: Path) -> None:
    """A text index searches the 8 bytes after the prefix all its keys share (their
    head); keys whose heads are alike are searched whole, keys without the shared prefix
    are no hit."""
    alike = [f"tenant-{t}:order-{i:06d}" for t in "ab" for i in range(0, 2000, 3)]
    spread = [f"{i:08x}-order" for i in range(0, 50_000, 7)]
    for name, keys in (("alike", alike), ("spread", spread)):
        order = np.random.default_rng(2).permutation(len(keys))
        keys = [keys[i] for i in order]
        index = key_index.load(str(tmp_path), _text_file(tmp_path, f"{name}.parquet", keys), "k")
        assert index is not None
        shared = key_index.TextIndex(index).shared
        assert shared == {"alike": b"tenant-", "spread": b"0000"}[name]
        asked = keys[::5] + [k + "x" for k in keys[:50]] + ["tenant-c:order-000003", "zz"]
        asked += [keys[0][:-1], "0000000"]
        found = key_index.Lookup(pa.array(asked)).find(index)
        assert found is not None
        got = sorted(zip(found[1].tolist(), found[0].tolist(), strict=True))
        assert got == [(i, keys.index(k)) for i, k in enumerate(asked) if k in keys]
        assert len(got) == len(keys[::5])


@pytest.mark.parametrize("seed", range(4))
def test_random_text_keys_are_found_as_a_dict_finds_them(tmp_path: Path, seed: int) -> None:
    """Keys of a small alphabet and varied lengths (long stretches alike: many heads
    shared, prefixes of one another), asked with keys of the file and others."""
    rng = np.random.default_rng(seed)

    def word() -> str:
        return "".join(rng.choice(list("ab-é"), size=int(rng.integers(0, 14))))

    keys = list(dict.fromkeys(word() for _ in range(3000)))
    at = {k: i for i, k in enumerate(keys)}
    index = key_index.load(str(tmp_path), _text_file(tmp_path, "part.parquet", keys), "k")
    assert index is not None
    asked = [word() for _ in range(2000)]
    found = key_index.Lookup(pa.array(asked)).find(index)
    assert found is not None
    got = sorted(zip(found[1].tolist(), found[0].tolist(), strict=True))
    assert got == [(i, at[k]) for i, k in enumerate(asked) if k in at]
    assert 0 < len(got) < len(asked)
