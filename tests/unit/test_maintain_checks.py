"""maintain's checks on a local table before its Spark steps: OPTIMIZE only where two small
files or a deletion vector are there, VACUUM only where a file the latest version does not
use is older than the retention (slotlake.maintain.optimize_may_change,
vacuum_may_delete). A check that says no must never skip work the step would have done."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from slotlake import delta_log
from slotlake.deletion_vector import DeletionVectorFile
from slotlake.delta import create_on_driver
from slotlake.maintain import optimize_may_change, readable_snapshot, vacuum_may_delete

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
GIB = 1 << 30


def _table(tmp_path: Path, batches: int = 1) -> tuple[str, delta_log.Snapshot]:
    path = str(tmp_path / "state" / "public.t")
    create_on_driver(path, SCHEMA)
    snap = delta_log.snapshot(path, files=True)
    for batch in range(1, batches + 1):
        rows = pa.table({"id": pa.array([batch, batch + 100], pa.int64()), "v": ["a", "b"]})
        snap, _ = delta_log.append(snap, rows, "app", batch)
    return path, delta_log.snapshot(path, files=True)


def _age(path: str, hours: float) -> None:
    stamp = time.time() - hours * 3600
    os.utime(path, (stamp, stamp))


def _with_vector(path: str, snap: delta_log.Snapshot) -> str:
    """The table's one file given a deletion vector of its first row; the vector's file."""
    assert snap.files is not None
    (add,) = snap.files.values()
    dv = DeletionVectorFile.new()
    descriptor = dv.add(np.array([0]))
    target = os.path.join(path, dv.name)
    with open(target, "xb") as out:
        out.write(dv.body)
    now = delta_log.now_ms()
    grown = dict(add) | {"deletionVector": descriptor}
    delta_log.commit(snap, [delta_log.removal(add, now), {"add": grown}])
    return target


def test_optimize_runs_for_two_small_files_or_a_vector(tmp_path: Path) -> None:
    path, snap = _table(tmp_path, batches=1)
    assert not optimize_may_change(
        readable_snapshot(path), GIB
    )  # one file, no vector: nothing to bin
    _with_vector(path, snap)
    assert optimize_may_change(readable_snapshot(path), GIB)  # a vector OPTIMIZE may purge
    two, _ = _table(tmp_path / "two", batches=2)
    assert optimize_may_change(readable_snapshot(two), GIB)
    assert not optimize_may_change(
        readable_snapshot(two), 1
    )  # both files are past the bound: no bin


def test_vacuum_runs_only_for_a_file_old_enough_that_the_version_does_not_use(
    tmp_path: Path,
) -> None:
    path, snap = _table(tmp_path, batches=1)
    assert snap.files is not None
    (live,) = snap.files
    _age(os.path.join(path, live), 100)  # a live file is never VACUUM's, however old
    assert not vacuum_may_delete(path, readable_snapshot(path), 24)
    # An index and scratch beside the data (VACUUM leaves "_" and "." names alone).
    os.makedirs(os.path.join(path, "_slotlake_keys"))
    for name in ("_slotlake_keys/x.keys.npy", ".part-x.parquet.tmp", "_hidden.parquet"):
        Path(path, name).write_bytes(b"x")
        _age(os.path.join(path, name), 100)
    assert not vacuum_may_delete(path, readable_snapshot(path), 24)
    # A file no commit names (a killed writer's): VACUUM's once older than the retention.
    orphan = os.path.join(path, "part-00000-orphan.snappy.parquet")
    Path(orphan).write_bytes(b"x")
    assert not vacuum_may_delete(path, readable_snapshot(path), 24)
    _age(orphan, 25)
    assert vacuum_may_delete(path, readable_snapshot(path), 24)
    assert not vacuum_may_delete(path, readable_snapshot(path), 26)
    os.unlink(orphan)
    # A file in a folder the table's files may live in (random prefixes).
    os.makedirs(os.path.join(path, "ab"))
    nested = os.path.join(path, "ab", "part-00001-old.snappy.parquet")
    Path(nested).write_bytes(b"x")
    _age(nested, 48)
    assert vacuum_may_delete(path, readable_snapshot(path), 24)
    os.unlink(nested)
    # A deletion vector's file the version uses is kept; one it no longer uses goes.
    vector = _with_vector(path, snap)
    _age(vector, 100)
    assert not vacuum_may_delete(path, readable_snapshot(path), 24)
    now = delta_log.snapshot(path, files=True)
    assert now.files is not None
    (add,) = now.files.values()
    bare = {k: v for k, v in add.items() if k != "deletionVector"}
    delta_log.commit(now, [delta_log.removal(add, delta_log.now_ms()), {"add": bare}])
    assert vacuum_may_delete(path, readable_snapshot(path), 24)


def test_a_log_the_reader_does_not_follow_counts_as_work(tmp_path: Path) -> None:
    path = tmp_path / "t"
    (path / "_delta_log").mkdir(parents=True)
    (path / "_delta_log" / f"{3:020d}.json").write_text("{}\n")  # a gap: no version 0
    assert readable_snapshot(str(path)) is None
    assert optimize_may_change(readable_snapshot(str(path)), GIB)
    assert vacuum_may_delete(str(path), readable_snapshot(str(path)), 24)
