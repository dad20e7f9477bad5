"""What build_session sets up in the JVM beyond the Spark conf."""

from __future__ import annotations


def test_deltas_benign_filter_error_is_quiet_and_the_rest_warns(spark) -> None:  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    manager = jvm.org.apache.logging.log4j.LogManager
    delta_format = manager.getLogger("org.apache.spark.sql.delta.DeltaParquetFileFormat")
    assert delta_format.getLevel().toString() == "FATAL"
    # Only that logger: Delta's own errors elsewhere still reach the log.
    assert manager.getLogger("org.apache.spark.sql.delta.DeltaLog").getLevel().toString() in (
        "WARN",
        "ERROR",
    )
    # The local checkpoints' "cannot be recomputed after unpersisting" warning: errors only.
    rdd_logger = manager.getLogger("org.apache.spark.rdd.MapPartitionsRDD")
    assert rdd_logger.getLevel().toString() == "ERROR"
    assert manager.getLogger("org.apache.spark.rdd.RDD").getLevel().toString() in ("WARN", "ERROR")


def test_python_workers_allocate_arrow_buffers_with_jemalloc(spark) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa

    def pool(batches):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"pool": [pa.default_memory_pool().backend_name]})

    assert spark.conf.get("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL") == "jemalloc"
    rows = spark.range(1, numPartitions=1).mapInArrow(pool, "pool string").collect()
    assert [r.pool for r in rows] == ["jemalloc"]
    assert pa.jemalloc_memory_pool().backend_name == "jemalloc"
