"""The commit a write through Spark made, as ``slotlake.delta`` reports it: read from the
commit's own file through the JVM (no Spark job), equal to what ``DeltaTable.history``
says, including for a write its transaction marker skipped and past a checkpoint. And a
table's schema with its column mapping and its properties, read through the JVM or, on a
runtime without open-source Delta's classes, from the log itself."""

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


def test_the_metadata_read_from_the_log_is_the_jvms_at_every_version(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Databricks Runtime has no open-source DeltaLog class: the schema with its column
    mapping and the properties are read from the log through Hadoop's file system, from
    JSON entries and from checkpoints, equal to what the JVM's snapshot says."""
    import json

    from slotlake import delta_log_hadoop
    from slotlake.swap_alters import jvm_metadata, mapped_metadata, mapped_schema

    path = str(tmp_path / "t")
    ref = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {ref} (id INT, a STRING) USING delta TBLPROPERTIES "
        "('delta.columnMapping.mode' = 'name', 'delta.checkpointInterval' = '3')"
    )
    for statement in [
        f"INSERT INTO {ref} VALUES (1, 'x')",  # 1
        f"ALTER TABLE {ref} RENAME COLUMN a TO b",  # 2
        f"INSERT INTO {ref} VALUES (2, 'y')",  # 3: a checkpoint, the metadata in it only
        f"INSERT INTO {ref} VALUES (3, 'z')",  # 4
        f"ALTER TABLE {ref} ADD COLUMNS (c BIGINT)",  # 5
        f"ALTER TABLE {ref} SET TBLPROPERTIES ('slotlake.x' = '1')",  # 6: a checkpoint
        f"ALTER TABLE {ref} DROP COLUMN b",  # 7
    ]:
        spark.sql(statement)
    log_dir = Path(path) / "_delta_log"
    assert {p.name for p in log_dir.glob("*.checkpoint.parquet")} == {
        f"{v:020d}.checkpoint.parquet" for v in (3, 6)
    }
    assert '"metaData"' not in (log_dir / f"{4:020d}.json").read_text()
    monkeypatch.setattr(delta, "has_open_source_delta_log", lambda _: False)

    def unused(*_: Any) -> Any:
        raise AssertionError("the JVM's DeltaLog read without the class")

    seen = []
    for version in [*range(8), None]:
        want = jvm_metadata(spark, path, version)
        with monkeypatch.context() as m:
            m.setattr(delta, "jvm_snapshot", unused)
            got = mapped_metadata(spark, path, version)
            assert mapped_schema(spark, path, version).jsonValue() == got[0]
        assert got == want, version
        seen.append([f["name"] for f in got[0]["fields"]])
    assert seen[1] == ["id", "a"] and seen[4] == ["id", "b"] and seen[7] == ["id", "c"]
    assert mapped_metadata(spark, path)[1]["slotlake.x"] == "1"
    physical = {f["metadata"]["delta.columnMapping.physicalName"] for f in got[0]["fields"]}
    assert "c" not in physical  # the physical names, which a DataFrame's schema leaves out

    # Log cleanup took the oldest entries: what the checkpoints hold stays readable.
    for v in range(3):
        (log_dir / f"{v:020d}.json").unlink()
    with pytest.raises(LookupError, match="version 1 is not in its log"):
        delta_log_hadoop.metadata(spark, path, 1)
    schema, _ = delta_log_hadoop.metadata(spark, path, 4)
    assert [f["name"] for f in json.loads(schema)["fields"]] == ["id", "b"]
    with pytest.raises(FileNotFoundError, match="no Delta table"):
        delta_log_hadoop.metadata(spark, str(tmp_path / "none"))


def test_a_deltalog_without_a_method_is_read_around(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another Delta release whose DeltaLog lacks a method used: the metadata comes from
    the log; an error Delta itself raised (a version gone) is not hidden."""
    from py4j.protocol import Py4JError, Py4JJavaError

    from slotlake.swap_alters import mapped_metadata

    path = str(tmp_path / "t")
    delta.append(spark.range(3), path, "app", 1)
    want = mapped_metadata(spark, path)

    def missing(*_: Any) -> Any:
        raise Py4JError("An error occurred while calling o1.update. Method does not exist")

    with monkeypatch.context() as m:
        m.setattr(delta, "jvm_snapshot", missing)
        assert mapped_metadata(spark, path) == want
    with pytest.raises(Py4JJavaError):
        mapped_metadata(spark, path, 5)
