"""``slotlake inspect --raw``: what it accepts and the errors for a path that is no batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotlake.inspect import RawPathError, inspect_raw
from slotlake.raw import RawWriter

from .test_raw import begin, commit, dml, relation


def raw_batch(path: Path) -> None:
    w = RawWriter(path)
    payloads = [begin(0x2000, 0, 7), relation(16384), dml("I", 16384), commit(0, 0x2000, 0)]
    w.append([0x1000 + i for i in range(len(payloads))], [7] * len(payloads), payloads)
    w.close()


def test_a_batch_directory_and_its_part_file_print_the_same_lines(tmp_path: Path) -> None:
    raw_batch(tmp_path / "b1")
    lines = list(inspect_raw(str(tmp_path / "b1")))
    assert [line.split(None, 2)[2].split(" ")[0] for line in lines] == [
        "BEGIN",
        "RELATION",
        "table",
        "COMMIT",
    ]
    (part,) = sorted((tmp_path / "b1").glob("part-*.parquet"))
    assert list(inspect_raw(str(part))) == lines
    assert list(inspect_raw(str(tmp_path / "b1"), limit=2)) == lines[:2]


def test_a_lakes_raw_root_names_its_batches(tmp_path: Path) -> None:
    root = tmp_path / "_raw"
    names = [f"b{n:020d}-a{n}" for n in range(1, 6)]
    for name in names:
        raw_batch(root / name)
    (root / "not-a-batch").mkdir()  # no part files: not counted
    with pytest.raises(RawPathError) as err:
        list(inspect_raw(str(root)))
    text = str(err.value)
    assert text.startswith(f"{root} is not one raw batch but holds 5 (")
    assert ", ".join(names[:3]) + " and 2 more" in text
    assert "not-a-batch" not in text and "--batch" in text


def test_a_missing_path_or_a_directory_without_parts(tmp_path: Path) -> None:
    with pytest.raises(RawPathError, match="no such file or directory"):
        list(inspect_raw(str(tmp_path / "gone")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RawPathError, match=r"holds no raw Parquet files \(part-\*\.parquet\)"):
        list(inspect_raw(str(tmp_path / "empty")))
