"""A table whose checkpoint the driver wrote (slotlake.delta_checkpoint), read by Spark and
DuckDB once the entries before it are gone, as log cleanup leaves them; Spark's VACUUM
keeps the files whose tombstones the checkpoint carries (removed recently, written long
ago: without the tombstones VACUUM would take them for files never committed)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from slotlake import delta_log
from slotlake.delta_checkpoint import checkpoint_actions, write_checkpoint
from slotlake.lake import query_delta
from tests.integration.test_readers import duckdb_delta
from tests.unit.test_delta_checkpoint import _data, _history

VACUUM_SETTINGS = {
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false",
}


def _rows(table: Any) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in table)


def test_spark_and_duckdb_read_a_table_from_the_drivers_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    at_checkpoint = _rows(query_delta(path, version, "SELECT id, v FROM t").to_pylist())
    write_checkpoint(path, version)
    delta_log.append(delta_log.snapshot(path, files=True), _data([30], "c"), "app", 6)
    latest = sorted([*at_checkpoint, (30, "c30")])
    log_dir = Path(path) / "_delta_log"
    for v in range(version):  # Spark's time travel wants the version's own entry
        (log_dir / f"{v:020d}.json").unlink()

    assert _rows(spark.read.format("delta").load(path).collect()) == latest
    assert (
        _rows(spark.read.format("delta").option("versionAsOf", version).load(path).collect())
        == at_checkpoint
    )
    con = duckdb_delta()
    assert _rows(
        con.execute("SELECT id, v FROM delta_scan(?)", [path]).fetch_arrow_table().to_pylist()
    ) == (latest)

    # Every file written a month ago; the tombstones are of this run.
    tombstoned = [
        a["path"]
        for kind, a in checkpoint_actions(str(log_dir / f"{version:020d}.checkpoint.parquet"))
        if kind == "remove"
    ]
    assert len(tombstoned) == 4
    month_ago = time.time() - 30 * 24 * 3600
    for name in os.listdir(path):
        if not name.startswith("_"):
            os.utime(os.path.join(path, name), (month_ago, month_ago))
    before = {k: spark.conf.get(k, None) for k in VACUUM_SETTINGS}
    try:
        for k, v in VACUUM_SETTINGS.items():
            spark.conf.set(k, v)
        spark.sql(f"VACUUM delta.`{path}` RETAIN 1 HOURS")
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    kept = [p for p in tombstoned if os.path.exists(os.path.join(path, p))]
    assert kept == tombstoned
    assert _rows(spark.read.format("delta").load(path).collect()) == latest
