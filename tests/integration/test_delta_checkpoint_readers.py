"""A table whose checkpoint the driver wrote (slotlake.delta_checkpoint), read by Spark and
DuckDB once the entries before it are gone, as log cleanup leaves them; Spark's VACUUM
keeps the files whose tombstones the checkpoint carries (removed recently, written long
ago: without the tombstones VACUUM would take them for files never committed)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from slotlake import delta_log
from slotlake.delta_checkpoint import write_checkpoint
from slotlake.delta_log import checkpoint_actions
from slotlake.lake import query_delta
from tests.integration.test_dv_merge import vacuum
from tests.integration.test_readers import duckdb_delta
from tests.unit.test_delta_checkpoint import _data, _history


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
    vacuum(spark, path, 1)
    kept = [p for p in tombstoned if os.path.exists(os.path.join(path, p))]
    assert kept == tombstoned
    assert _rows(spark.read.format("delta").load(path).collect()) == latest


def test_a_checkpoint_replayed_from_sparks_own(
    spark: Any, tmp_path: Path, checkpoint_every_10: None
) -> None:
    """A table Spark wrote and checkpointed (in its own columns: the statistics also as a
    struct, written by parquet-mr), then appended to by the driver until
    the driver's checkpoint falls due: it is replayed from Spark's, equals deltalake's of
    the same version, and Spark reads the table from it."""
    import shutil

    from deltalake import DeltaTable

    from slotlake.delta import create_on_driver
    from tests.unit.test_delta_checkpoint import SCHEMA, _actions, _checkpoint_file

    path = str(tmp_path / "t")
    create_on_driver(path, SCHEMA)
    for i in range(10):  # versions 1-10, Spark's checkpoint at 10
        rows = [(i * 10 + j, f"s{i}", {}, []) for j in range(3)]
        mode = "overwrite" if i == 5 else "append"  # tombstones in Spark's checkpoint
        spark.createDataFrame(rows, SCHEMA).write.format("delta").mode(mode).save(path)
    log_dir = Path(path) / "_delta_log"
    sparks = _checkpoint_file(path, 10)
    assert pq_created_by(sparks).startswith("parquet-mr")
    add_type = pq.read_schema(sparks).field("add").type
    assert "stats_parsed" in [add_type.field(i).name for i in range(add_type.num_fields)]
    snap = delta_log.snapshot(path, files=True)
    for batch in range(1, 11):  # versions 11-20, the driver's checkpoint at 20
        snap, _ = delta_log.append(snap, _data([1000 + batch], "d"), "app", batch)
    written_by = pq_created_by(_checkpoint_file(path, 20))
    assert written_by.startswith("parquet-cpp"), written_by

    theirs = str(tmp_path / "copy")
    shutil.copytree(path, theirs)
    (Path(theirs) / "_delta_log" / f"{20:020d}.checkpoint.parquet").unlink()
    (Path(theirs) / "_delta_log" / "_last_checkpoint").unlink()
    DeltaTable(theirs).create_checkpoint()
    ours, reference = _actions(_checkpoint_file(path, 20)), _actions(_checkpoint_file(theirs, 20))
    assert ours["add"].keys() == reference["add"].keys()
    assert ours["remove"].keys() == reference["remove"].keys() and ours["remove"]
    assert ours["txn"].keys() == reference["txn"].keys() == {"app"}
    assert ours["protocol"] == reference["protocol"]

    for v in range(20):
        (log_dir / f"{v:020d}.json").unlink()
    expected = sorted(
        [(i * 10 + j, f"s{i}") for i in range(5, 10) for j in range(3)]
        + [(1000 + b, f"d{1000 + b}") for b in range(1, 11)]
    )
    assert _rows(spark.read.format("delta").load(path).collect()) == expected
    assert _rows(query_delta(path, 20, "SELECT id, v FROM t").to_pylist()) == expected


def pq_created_by(file: str) -> str:
    return pq.read_metadata(file).created_by
