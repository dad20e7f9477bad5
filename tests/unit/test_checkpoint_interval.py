"""The lake's tables checkpoint every 30 versions (slotlake.delta.TABLE_PROPERTIES), not
Delta's 10: the driver's commits follow the table's own setting, each table at a phase of
its own (so that tables written together do not all checkpoint in one batch), and
readers take its checkpoints wherever they fall."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from slotlake import delta_log
from slotlake.delta import TABLE_PROPERTIES, create_on_driver
from slotlake.lake import query_delta

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


def _table_at_its_phase(tmp_path: Path, wanted: int) -> str:
    """A table path (under ``tmp_path``) whose checkpoint phase is ``wanted`` (of 30)."""
    for i in range(10_000):
        path = str(tmp_path / "state" / f"public.t{i}")
        if delta_log.checkpoint_phase(path, 30) == wanted:
            return path
    raise AssertionError(f"no table name of phase {wanted}")


@pytest.mark.parametrize("phase", [0, 7])
def test_a_new_table_checkpoints_every_30_versions_at_its_phase(tmp_path: Path, phase: int) -> None:
    assert TABLE_PROPERTIES["delta.checkpointInterval"] == "30"
    path = _table_at_its_phase(tmp_path, phase)
    create_on_driver(path, SCHEMA)
    table = DeltaTable(path)
    assert table.metadata().configuration["delta.checkpointInterval"] == "30"
    snap = delta_log.snapshot(path, files=True)
    last = 62
    for batch in range(1, last + 1):
        rows = pa.table({"id": pa.array([batch], pa.int64()), "v": [f"v{batch}"]})
        snap, _ = delta_log.append(snap, rows, "app", batch)
    log_dir = Path(path) / "_delta_log"
    expected = [v for v in range(1, last + 1) if v % 30 == phase]
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")) == [
        f"{v:020d}.checkpoint.parquet" for v in expected
    ]
    read = delta_log.snapshot(path, files=True)
    assert (read.version, read.txns) == (last, {"app": last})
    table = DeltaTable(path)
    assert table.version() == last and table.transaction_version("app") == last
    ids = query_delta(path, last, "SELECT id FROM t ORDER BY id").column("id").to_pylist()
    assert ids == list(range(1, last + 1))
    # Time travel to a version between two checkpoints reads from the older one.
    back = expected[0] + 3
    ids = query_delta(path, back, "SELECT id FROM t ORDER BY id").column("id").to_pylist()
    assert ids == list(range(1, back + 1))


def test_the_phases_of_a_lakes_tables_spread_over_the_interval() -> None:
    """A hundred tables' change logs and states written in the same batches: no batch
    checkpoints more than a few of them, where at multiples of 30 every one of the 200
    did in the same batch."""
    paths = [f"/lake/{kind}/public.t_{i:03d}" for i in range(100) for kind in ("changes", "state")]
    per_version = Counter(delta_log.checkpoint_phase(p, 30) for p in paths)
    assert len(per_version) >= 25
    assert max(per_version.values()) <= 16
    # A table's phase is its place in the lake, wherever the lake is.
    assert delta_log.checkpoint_phase("/a/state/public.t_001", 30) == (
        delta_log.checkpoint_phase("s3a://b/lake/state/public.t_001/", 30)
    )
    assert delta_log.checkpoint_due("/a/state/public.t_001", 30, 30) is (
        delta_log.checkpoint_phase("/a/state/public.t_001", 30) == 0
    )


def test_without_the_stagger_checkpoints_fall_on_multiples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _table_at_its_phase(tmp_path, 11)
    monkeypatch.setattr(delta_log, "STAGGER", False)
    assert delta_log.checkpoint_phase(path, 30) == 0
    assert [v for v in range(1, 91) if delta_log.checkpoint_due(path, v, 30)] == [30, 60, 90]
    assert not delta_log.checkpoint_due(path, 0, 30)


@pytest.mark.parametrize("enabled", [True, False])
def test_maintain_removes_expired_log_files_below_the_newest_checkpoint(
    tmp_path: Path, enabled: bool
) -> None:
    """The driver writes the commits and checkpoints, so no Spark writer's cleanup follows
    them: maintain removes the entries and checkpoints past the table's
    delta.logRetentionDuration below its newest checkpoint, and every version from that
    checkpoint on reads as before (unless the table turned cleanup off)."""
    import os
    import time

    from slotlake.maintain import clean_up_log

    path = _table_at_its_phase(tmp_path, 5)
    create_on_driver(path, SCHEMA)
    snap = delta_log.snapshot(path, files=True)
    if not enabled:
        metadata = dict(snap.metadata)
        config = {**metadata["configuration"], "delta.enableExpiredLogCleanup": "false"}
        snap = delta_log.commit(snap, [{"metaData": {**metadata, "configuration": config}}])
    for batch in range(1, 71):
        rows = pa.table({"id": pa.array([batch], pa.int64()), "v": [f"v{batch}"]})
        snap, _ = delta_log.append(snap, rows, "app", batch)
    last = snap.version
    log_dir = Path(path) / "_delta_log"
    checkpoints = sorted(int(p.name[:20]) for p in log_dir.glob("*.checkpoint.parquet"))
    assert checkpoints[-1] >= 60, checkpoints
    # Entries before version 50 are 40 days old; the newer ones are recent.
    stamp = time.time() - 40 * 86400
    aged = {p.name for p in log_dir.iterdir() if p.name[:20].isdigit() and int(p.name[:20]) < 50}
    for name in aged:
        os.utime(log_dir / name, (stamp, stamp))
    before = {p.name for p in log_dir.iterdir()}
    removed = clean_up_log(path)
    left = {p.name for p in log_dir.iterdir()}
    if not enabled:
        assert removed == 0 and left == before
        return
    # The aged files below the newest aged checkpoint go (that checkpoint stays: every
    # version after it, the aged ones too, still has one to read from); nothing else.
    base = max(c for c in checkpoints if c < 50)
    gone = {n for n in aged if int(n[:20]) < base}
    assert gone and removed == len(gone) and before - gone == left
    assert DeltaTable(path).version() == last
    ids = query_delta(path, last, "SELECT id FROM t ORDER BY id").column("id").to_pylist()
    assert ids == list(range(1, 71))
    for at in (base, base + 1, 49):  # time travel from the kept checkpoint on
        got = query_delta(path, at, "SELECT count(*) AS n FROM t").column("n").to_pylist()
        assert got == [at - (last - 70)], at
    snap = delta_log.snapshot(path, files=True)
    snap, _ = delta_log.append(
        snap, pa.table({"id": pa.array([71], pa.int64()), "v": ["v"]}), "app", 71
    )
    assert DeltaTable(path).version() == last + 1
