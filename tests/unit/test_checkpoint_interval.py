"""The lake's tables checkpoint every 30 versions (slotlake.delta.TABLE_PROPERTIES), not
Delta's 10: the driver's commits follow the table's own setting, and readers take it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from slotlake import delta_log
from slotlake.delta import TABLE_PROPERTIES, create_on_driver
from slotlake.lake import query_delta

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


def test_a_new_table_checkpoints_every_30_versions(tmp_path: Path) -> None:
    assert TABLE_PROPERTIES["delta.checkpointInterval"] == "30"
    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    table = DeltaTable(path)
    assert table.metadata().configuration["delta.checkpointInterval"] == "30"
    snap = delta_log.snapshot(path, files=True)
    for batch in range(1, 32):
        rows = pa.table({"id": pa.array([batch], pa.int64()), "v": [f"v{batch}"]})
        snap, _ = delta_log.append(snap, rows, "app", batch)
    log_dir = Path(path) / "_delta_log"
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")) == [
        f"{30:020d}.checkpoint.parquet"
    ]
    read = delta_log.snapshot(path, files=True)
    assert (read.version, read.txns) == (31, {"app": 31})
    table = DeltaTable(path)
    assert table.version() == 31 and table.transaction_version("app") == 31
    ids = query_delta(path, 31, "SELECT id FROM t ORDER BY id").column("id").to_pylist()
    assert ids == list(range(1, 32))
