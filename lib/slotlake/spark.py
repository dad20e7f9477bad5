"""Building the SparkSession the jobs and tests run on."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from slotlake.memory import ENV as ARROW_POOL_ENV
from slotlake.memory import PREFERRED as PREFERRED_POOL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Settings every slotlake session needs, whatever the cluster: UTC so that
# timestamptz values and commit times never shift, Arrow for the pandas UDF.
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    # Delta Lake: every output table of the lake is a Delta table.
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
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
    # Delta replays a table's log into this many partitions on every snapshot (default 50):
    # the lake's logs are small, and 50 tasks per snapshot dominate a small batch's time.
    "spark.databricks.delta.snapshotPartitions": "2",
    # VACUUM splits its listing of a table's files into this many tasks (Spark's default
    # 10000): a small table's VACUUM took 20-35 s on two cores, 2.6 s with 4.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
}

log = logging.getLogger(__name__)


def delta_coordinates() -> list[str]:
    """Maven coordinates of the Delta Lake jars matching the installed delta-spark and pyspark."""
    import importlib.metadata

    import pyspark

    delta = importlib.metadata.version("delta-spark")
    line = ".".join(pyspark.__version__.split(".")[:2])
    return [f"io.delta:delta-spark_{line}_2.13:{delta}", f"io.delta:delta-storage:{delta}"]


def delta_jars() -> list[str] | None:
    """The jars tools/setup.sh cached in the venv (or $SLOTLAKE_DELTA_JARS), if all are there."""
    folder = os.environ.get("SLOTLAKE_DELTA_JARS") or os.path.join(
        sys.prefix, "share", "slotlake", "jars"
    )
    paths = []
    for coord in delta_coordinates():
        _, artifact, version = coord.split(":")
        path = os.path.join(folder, f"{artifact}-{version}.jar")
        if not os.path.isfile(path):
            return None
        paths.append(path)
    return paths


def _delta_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """Where the Delta jars come from, unless the cluster's own settings already say so.

    Local sessions use the cached jars; without them, Spark resolves the same coordinates
    from Maven Central (``spark.jars.packages``). A cluster that ships Delta itself
    (Databricks, EMR with Delta enabled) sets ``spark.jars``/``spark.jars.packages`` or
    ``slotlake.delta.jars = "provided"`` and nothing is added.
    """
    if conf.get("slotlake.delta.jars") == "provided":
        return {}
    jars = delta_jars()
    if jars:
        existing = conf.get("spark.jars", "")
        return {"spark.jars": ",".join([p for p in existing.split(",") if p] + jars)}
    existing = conf.get("spark.jars.packages", "")
    return {
        "spark.jars.packages": ",".join([p for p in existing.split(",") if p] + delta_coordinates())
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
    # The executors' Python workers allocate Arrow buffers as the driver does (memory).
    settings[f"spark.executorEnv.{ARROW_POOL_ENV}"] = os.environ.get(ARROW_POOL_ENV, PREFERRED_POOL)
    settings.update(conf)
    if not submitted:
        # spark-submit puts the jars on the JVM's class path itself (--packages/--jars).
        settings.update(_delta_conf(settings))
    settings.pop("slotlake.delta.jars", None)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _quiet_benign_loggers(session)
    return session


# Every MERGE into a table with deletion vectors and column mapping logs, at ERROR, that
# Delta could not push its internal ``__delta_internal_is_row_deleted = 0`` filter down to
# Parquet (the column has no physical name); Delta then applies the filter after the scan,
# so nothing is wrong — but an ERROR line per MERGE in a scheduler's log is an alarm.
#
# The TOAST replay's pointer jumping (replay_sql._resolve_moves) checkpoints its rounds
# locally; when the batch's cached data is released, Spark warns for each such RDD that
# its lineage "cannot be recomputed after unpersisting" — true, and nothing needs it any
# more. RDD.unpersist logs under the RDD's class, and its only other warning there is
# about checkpointing an RDD twice, which slotlake never does: ERROR still shows errors.
_BENIGN_LOGGERS = (
    ("org.apache.spark.sql.delta.DeltaParquetFileFormat", "FATAL"),
    ("org.apache.spark.rdd.MapPartitionsRDD", "ERROR"),
)


def _quiet_benign_loggers(session: SparkSession) -> None:
    try:
        jvm = session.sparkContext._jvm  # type: ignore[attr-defined]
        for name, level in _BENIGN_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.getLevel(level)
            )
    except Exception:  # a cluster's own logging setup: leave it alone
        log.debug("could not quiet Spark's benign log lines", exc_info=True)


class LazySession:
    """A SparkSession built on its first use, once, whichever thread asks first.

    A batch whose tables are all small is done on the driver (:mod:`slotlake.local_table`)
    and needs no JVM: not starting one saves Spark's start-up, 5–10 s on two cores, which
    is most of such a batch.
    """

    def __init__(
        self, build: Callable[[], SparkSession], session: SparkSession | None = None
    ) -> None:
        self._build, self._session = build, session
        self._lock = threading.Lock()

    def __call__(self) -> SparkSession:
        with self._lock:
            if self._session is None:
                self._session = self._build()
            return self._session

    @property
    def started(self) -> SparkSession | None:
        return self._session

    @classmethod
    def of(cls, spark: SparkSession | LazySession) -> LazySession:
        if isinstance(spark, LazySession):
            return spark
        return cls(lambda: spark, spark)
