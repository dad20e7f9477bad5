"""Commit metrics read the same whichever writer (Spark or delta-rs) made the commit."""

from __future__ import annotations

from slotlake.delta import spark_metrics


def test_delta_rs_write_and_merge_metrics_get_spark_names() -> None:
    write = spark_metrics({"num_added_files": 1, "num_added_rows": 7})
    assert write["numOutputRows"] == "7"
    merge = spark_metrics(
        {"num_target_rows_inserted": 2, "num_target_rows_deleted": 1, "num_output_rows": 5}
    )
    assert (merge["numTargetRowsInserted"], merge["numTargetRowsDeleted"]) == ("2", "1")


def test_spark_metrics_are_kept_as_they_are() -> None:
    m = {"numOutputRows": "4", "numTargetRowsInserted": "3"}
    assert spark_metrics(m) == m
    assert spark_metrics(None) == {}
