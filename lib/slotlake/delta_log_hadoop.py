"""A Delta table's metadata read from its log through Hadoop's ``FileSystem``.

On a lake off local disk slotlake asks Spark's JVM for a table's schema with its column
mapping (a DataFrame's schema leaves the physical names out) and its properties, through
open-source Delta's ``DeltaLog``. Databricks Runtime ships Delta under other class names,
so there the log is read as the protocol lays it out, with the Hadoop file system and
configuration of the session (any root Spark reaches): the newest complete checkpoint at
or before the version and the JSON entries after it, the newest ``metaData`` action
winning. Only a batch with DDL asks, so the listing of ``_delta_log`` and, when no entry
after the checkpoint changed the metadata, the Spark job that reads the checkpoint's
``metaData`` column are paid rarely.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from slotlake import delta_log
from slotlake.hadoopfs import HadoopFS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def metadata(
    spark: SparkSession, path: str, version: int | None = None
) -> tuple[str, dict[str, str]]:
    """The table's schema string and configuration as of its latest version or
    ``version``. FileNotFoundError: no table at ``path``; LookupError: the log no longer
    holds that version, or none of the files it keeps has the metadata."""
    fs = HadoopFS(spark)
    log_dir = fs.join(path, "_delta_log")
    versions, checkpoints = delta_log.log_names(fs.listdir(log_dir))
    since, tail = delta_log.replay_plan(path, versions, checkpoints, version)
    # One metaData action at most per entry; the newest one is the table's.
    for v in reversed(tail):
        for line in fs.read_text(fs.join(log_dir, f"{v:020d}.json")).splitlines():
            if '"metaData"' in line:
                action = json.loads(line)
                if "metaData" in action:
                    meta = action["metaData"]
                    return meta["schemaString"], dict(meta.get("configuration") or {})
    if since >= 0:
        row = (
            spark.read.parquet(*[fs.join(log_dir, p) for p in checkpoints[since]])
            .where("metaData IS NOT NULL")
            .select("metaData.schemaString", "metaData.configuration")
            .first()
        )
        if row is not None:
            return row["schemaString"], dict(row["configuration"] or {})
    latest = tail[-1] if tail else since
    raise LookupError(f"Delta table {path}: no metadata at version {latest}")
