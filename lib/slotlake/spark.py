"""Building the SparkSession the jobs and tests run on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Settings every slotlake session needs, whatever the cluster: UTC so that
# timestamptz values and commit times never shift, Arrow for the pandas UDF.
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

# Defaults for local mode (tests, demo, ad hoc runs); a cluster's spark-submit
# settings and the [spark] table of the configuration override them.
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # Raw files hold up to 1M payloads; smaller splits keep one task's rows (and any block
    # read back from disk) well inside a 2 GB driver heap.
    "spark.sql.files.maxPartitionBytes": "16m",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
    # Adaptive execution re-plans every shuffle as extra jobs: for a batch's small,
    # known-size frames on two local cores that costs more than it saves (17 → 11 jobs
    # for a two-table batch).
    "spark.sql.adaptive.enabled": "false",
}


def build_session(
    app_name: str = "slotlake", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """getOrCreate a session; in local mode the Python workers run this very interpreter.

    Without PYSPARK_PYTHON the workers start whatever ``python3`` is first on PATH,
    which does not have pandas or slotlake installed.
    """
    from pyspark.sql import SparkSession

    settings = dict(REQUIRED_CONF)
    conf = dict(conf or {})
    submitted = "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or bool(
        os.environ.get("SPARK_ENV_LOADED")
    )
    if not submitted:
        settings = {**LOCAL_DEFAULTS, **settings}
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    settings.update(conf)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
