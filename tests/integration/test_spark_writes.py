"""The commit a write through Spark made, as ``slotlake.delta`` reports it: read from the
commit's own file through the JVM (no Spark job), equal to what ``DeltaTable.history``
says, including for a write its transaction marker skipped and past a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slotlake import delta


def _history(spark: Any, path: str) -> tuple[int, dict[str, str]]:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).history(1).first()
    return int(row["version"]), dict(row["operationMetrics"] or {})


def _jobs(spark: Any) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def _reported(spark: Any, path: str, result: delta.WriteResult) -> None:
    before = _jobs(spark)
    again = delta.last_commit(spark, path)
    assert _jobs(spark) == before  # no Spark job to read a commit
    version, metrics = _history(spark, path)
    assert (result.version, result.metrics) == (again.version, again.metrics) == (version, metrics)


def test_the_commit_of_each_write_is_reported_without_a_spark_job(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    rows = spark.createDataFrame([(i, f"v{i}") for i in range(5)], "id long, v string")

    first = delta.append(rows, path, "app", 1)
    assert first.version == 0 and first.metrics["numOutputRows"] == "5"
    _reported(spark, path, first)

    # A rerun's write of batch 1 is skipped by its marker: the table's newest commit stays.
    assert delta.append(rows, path, "app", 1) == first

    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    source = spark.createDataFrame([(3, "new"), (9, "nine")], "id long, v string")
    merged = delta.merge(
        spark,
        path,
        source,
        "t.id = s.id",
        lambda m: m.whenMatchedUpdateAll().whenNotMatchedInsertAll(),
        "app",
        2,
    )
    assert merged.version == 2  # past the checkpoint written at version 2
    assert (merged.metrics["numTargetRowsUpdated"], merged.metrics["numTargetRowsInserted"]) == (
        "1",
        "1",
    )
    assert any(
        p.name.endswith(".checkpoint.parquet") for p in (Path(path) / "_delta_log").iterdir()
    )
    _reported(spark, path, merged)

    emptied = delta.overwrite(rows.limit(0), path, "app", 3)
    assert emptied.version == 3
    _reported(spark, path, emptied)
    assert spark.read.format("delta").load(path).count() == 0


def test_a_runtime_without_the_open_source_delta_log_reads_the_history(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from py4j.protocol import Py4JError

    path = str(tmp_path / "t")
    written = delta.append(spark.range(3), path, "app", 1)
    assert delta.has_open_source_delta_log(spark)
    # What py4j answers for a class the JVM lacks (here, Databricks Runtime's DeltaLog).
    from py4j.java_gateway import JavaClass

    assert not isinstance(spark._jvm.com.databricks.sql.transaction.tahoe.DeltaLog, JavaClass)
    history = delta.WriteResult(*_history(spark, path))

    def unused(*_: Any) -> delta.WriteResult:
        raise AssertionError("the JVM's DeltaLog read without the class")

    # Databricks Runtime: no org.apache.spark.sql.delta.DeltaLog in the JVM.
    with monkeypatch.context() as m:
        m.setattr(delta, "has_open_source_delta_log", lambda _: False)
        m.setattr(delta, "_commit_from_log", unused)
        assert delta.last_commit(spark, path) == written == history

    def missing(*_: Any) -> delta.WriteResult:
        raise Py4JError("org.apache.spark.sql.delta.DeltaLog.store does not exist in the JVM")

    # Another Delta release, without a method the read calls.
    monkeypatch.setattr(delta, "_commit_from_log", missing)
    assert delta.last_commit(spark, path) == history

    def broken(*_: Any) -> delta.WriteResult:
        raise ValueError("not a lookup failure")

    monkeypatch.setattr(delta, "_commit_from_log", broken)
    with pytest.raises(ValueError, match="not a lookup failure"):
        delta.last_commit(spark, path)
