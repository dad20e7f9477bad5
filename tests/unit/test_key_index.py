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
def test_files_that_cannot_be_indexed(tmp_path: Path, keys: list[int | None], monkeypatch) -> None:
    add = _file(tmp_path, "part-0.parquet", keys)
    assert key_index.load(str(tmp_path), add, "k") is None
    assert key_index.load(str(tmp_path), add, "f") is None  # floats are not indexed
    _refusals_are_kept(tmp_path, add, ["k", "f"], monkeypatch)


def _refusals_are_kept(tmp_path: Path, add: dict[str, object], columns, monkeypatch) -> None:
    """The refusals are kept (a marker an index), and the file is not read again."""
    kept = sorted(p.name for p in (tmp_path / key_index.DIRECTORY).iterdir())
    assert kept == sorted(Path(key_index.index_path("", add, c)).name for c in columns)
    monkeypatch.setattr(key_index, "_make", lambda *a: pytest.fail("read again"))
    assert all(key_index.load(str(tmp_path), add, c) is None for c in columns)


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
    return _table_file(table, name, {"k": pa.array(keys, pa.string())})


def _table_file(table: Path, name: str, columns: dict[str, pa.Array]) -> dict[str, object]:
    target = table / name
    pq.write_table(pa.table(columns), target)
    stats = {"numRecords": len(next(iter(columns.values())))}
    return {"path": name, "size": os.path.getsize(target), "stats": json.dumps(stats)}


def _found(index: np.ndarray, asked: list[pa.Array]) -> list[tuple[int, int]]:
    """(which asked key, its row) for each key found, sorted."""
    found = key_index.Lookup(asked).find(index)
    assert found is not None
    return sorted(zip(found[1].tolist(), found[0].tolist(), strict=True))


def test_text_keys_are_found_exactly(tmp_path: Path) -> None:
    """A packed index holds the keys themselves, NUL-padded to the file's longest: a key
    that is another's prefix, differs in a trailing space, or is longer than any key of
    the file is no hit; multi-byte UTF-8 and the empty string are found."""
    rng = np.random.default_rng(5)
    uuids = [bytes(rng.integers(0, 256, 16, dtype=np.uint8)).hex() for _ in range(3000)]
    keys = ["ab", "abc", "a", "a ", "", "é", "zz", *uuids]
    order = rng.permutation(len(keys))
    keys = [keys[i] for i in order]
    add = _text_file(tmp_path, "part-0.parquet", keys)
    made = key_index.load(str(tmp_path), add, "k")
    assert made is not None and key_index.PackedIndex(made).layout == [(1, 32)]
    index = key_index.load(str(tmp_path), add, "k")  # mapped this time
    assert isinstance(index, np.memmap) or isinstance(getattr(index, "base", None), np.memmap)
    asked = ["a ", "ab\0", "abcd", uuids[7], "b", "", "é", "x" * 40, "ab", uuids[7], "a  "]
    got = _found(index, [pa.array(asked)])
    assert got == [(i, keys.index(k)) for i, k in enumerate(asked) if k in keys]
    assert [asked[i] for i, _ in got] == ["a ", uuids[7], "", "é", "ab", uuids[7]]
    # An index of the other kind is not searched with these keys.
    ints = key_index.load(str(tmp_path), _file(tmp_path, "part-1.parquet", [3, 1, 2]), "k")
    assert ints is not None
    assert key_index.Lookup(pa.array(asked)).find(ints) is None
    assert key_index.Lookup(pa.array([2, 9], pa.int64())).find(index) is None
    assert key_index.Lookup(pa.array([2, 9], pa.int64())).find(ints)[0].tolist() == [2]


@pytest.mark.parametrize(
    "keys",
    [["a", "b", "a"], ["a", None], ["x" * (key_index.MAX_KEY_BYTES + 1), "b"], ["a\0", "b"]],
    ids=["a key twice", "a NULL key", "a key too long", "a NUL in a key"],
)
def test_text_files_that_cannot_be_indexed(
    tmp_path: Path, keys: list[str | None], monkeypatch
) -> None:
    add = _text_file(tmp_path, "part-0.parquet", keys)
    assert key_index.load(str(tmp_path), add, "k") is None
    _refusals_are_kept(tmp_path, add, ["k"], monkeypatch)


def test_a_packed_index_that_does_not_fit_is_made_again(tmp_path: Path, caplog) -> None:
    add = _text_file(tmp_path, "part-0.parquet", ["b", "a", "c"])
    kept = Path(key_index.index_path(str(tmp_path), add, "k"))
    kept.parent.mkdir()
    keys = np.array([b"a", b"b"], dtype="S1")
    np.save(kept, key_index.PackedIndex.build([(1, 1)], np.arange(2), np.arange(2), keys))
    index = key_index.load(str(tmp_path), add, "k")  # an index of a file of two rows
    assert index is not None and "does not fit" in caplog.text
    made = key_index.PackedIndex(index)
    assert sorted(zip(made.keys.tolist(), made.positions.tolist(), strict=True)) == [
        (b"a", 1),
        (b"b", 0),
        (b"c", 2),
    ]
    np.save(kept, index[:-1])  # torn
    assert key_index.PackedIndex(key_index.load(str(tmp_path), add, "k")).rows == 3


@pytest.mark.parametrize("seed", range(4))
def test_random_text_keys_are_found_as_a_dict_finds_them(tmp_path: Path, seed: int) -> None:
    """Keys of a small alphabet and varied lengths (long stretches alike, prefixes of
    one another), asked with keys of the file and others."""
    rng = np.random.default_rng(seed)

    def word() -> str:
        return "".join(rng.choice(list("ab-é"), size=int(rng.integers(0, 14))))

    keys = list(dict.fromkeys(word() for _ in range(3000)))
    at = {k: i for i, k in enumerate(keys)}
    index = key_index.load(str(tmp_path), _text_file(tmp_path, "part.parquet", keys), "k")
    assert index is not None
    asked = [word() for _ in range(2000)]
    got = _found(index, [pa.array(asked)])
    assert got == [(i, at[k]) for i, k in enumerate(asked) if k in at]
    assert 0 < len(got) < len(asked)


@pytest.mark.parametrize("weak_hash", [False, True], ids=["hashed", "every hash alike"])
def test_keys_of_several_columns_are_found_as_a_dict_finds_them(
    tmp_path: Path, monkeypatch, weak_hash: bool
) -> None:
    """An (integer, text, integer) key: parts that would run together unpadded
    (("ab", "c") and ("a", "bc")), negative and big integers, a text part longer than the
    file's; and with a hash that every key shares (a collision everywhere), the same."""
    if weak_hash:
        monkeypatch.setattr(key_index, "_hashes", lambda keys: np.zeros(len(keys), np.uint64))
    rng = np.random.default_rng(9)
    texts = ["ab", "a", "bc", "c", "", "é"]
    keys = {
        (int(rng.integers(-(2**62), 2**62)) if i % 7 == 0 else i % 50, t, i % 3 - 1)
        for i in range(400)
        for t in texts[i % 3 : i % 3 + 2]
    }
    rows = sorted(keys)
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    columns = {
        "a": pa.array([r[0] for r in rows], pa.int64()),
        "t": pa.array([r[1] for r in rows], pa.string()),
        "b": pa.array([r[2] for r in rows], pa.int32()),
    }
    add = _table_file(tmp_path, "part.parquet", columns)
    index = key_index.load(str(tmp_path), add, ["a", "t", "b"])
    assert index is not None
    assert key_index.PackedIndex(index).layout == [(0, 8), (1, 2), (0, 8)]
    assert Path(key_index.index_path(str(tmp_path), add, "a,t,b")).exists()
    at = {r: i for i, r in enumerate(rows)}
    asked = rows[::3] + [(a, t + "c", b) for a, t, b in rows[:40]] + [(1, "abc", 0)]
    asked += [(a, t, b + 5) for a, t, b in rows[:20]] + rows[:5]
    arrays = [pa.array([r[i] for r in asked], columns[c].type) for i, c in enumerate("atb")]
    assert _found(index, arrays) == [(i, at[r]) for i, r in enumerate(asked) if r in at]
    assert len(_found(index, arrays)) == len(rows[::3]) + 5 + sum(
        (a, t + "c", b) in at for a, t, b in rows[:40]
    )
    # A text column asked with integers (another layout) is not searched.
    assert key_index.Lookup([arrays[0], arrays[0], arrays[2]]).find(index) is None
    assert key_index.Lookup(arrays[:2]).find(index) is None
    # Keys that repeat across the columns: no index.
    twice = {c: pa.concat_arrays([a, a.slice(0, 1)]) for c, a in columns.items()}
    assert (
        key_index.load(str(tmp_path), _table_file(tmp_path, "t.parquet", twice), list("atb"))
        is None
    )
