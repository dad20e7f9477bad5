"""Shared fixtures: real throwaway PostgreSQL clusters (15 and 16) and a local SparkSession."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from slotlake.localpg import LocalPostgres, available_versions

# Integration tests run on every version listed here; a missing one is an error,
# not a skip, because CI installs both (Debian's 15, pgserver's 16).
PG_VERSIONS = [int(v) for v in os.environ.get("SLOTLAKE_PG_VERSIONS", "15,16").split(",")]

_db_counter = itertools.count()

# Room a memory file system needs to take the suite's servers and temporary directories:
# two clusters' live databases and WAL, a run's tmp_path trees (~0.3 GB), Spark's spill.
_MEMORY_DIR_ROOM = 6 << 30


@functools.cache
def _memory_dir() -> Path | None:
    """Where the suite's PostgreSQL clusters and tmp_path trees go: ``SLOTLAKE_TEST_DIR``
    ('' = the system's temporary directory), else /dev/shm when it is there with room.
    Decided once a run, so that the room used meanwhile cannot part the two.

    On this project's machines a disk-backed /tmp made every CREATE DATABASE cost 0.1-0.3 s
    (the template's 7.5 MB written through) and every lake commit a real fsync; the tests
    assert what is written, not how long the disk takes to keep it."""
    given = os.environ.get("SLOTLAKE_TEST_DIR")
    if given is not None:
        return Path(given) if given else None
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if not os.access(shm, os.W_OK) or st.f_bavail * st.f_frsize < _MEMORY_DIR_ROOM:
        return None
    return shm


def pytest_configure(config: pytest.Config) -> None:
    where = _memory_dir()
    # pytest reads its temporary root lazily, on the first tmp_path: numbered runs and
    # their retention work as under the system's temporary directory.
    if where is not None and "PYTEST_DEBUG_TEMPROOT" not in os.environ:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(where)


@pytest.fixture(scope="session", params=PG_VERSIONS, ids=lambda v: f"pg{v}")
def pg_cluster(request: pytest.FixtureRequest) -> Iterator[LocalPostgres]:
    version = request.param
    if version not in available_versions():
        pytest.fail(
            f"PostgreSQL {version} is not installed here; run `make test` (it installs "
            "postgresql-15 and pgserver) or set SLOTLAKE_PG_VERSIONS"
        )
    # A lower max_wal_size than the job's default: the WAL of databases already dropped is
    # recycled sooner, and stays small where the cluster lives in memory.
    cluster = LocalPostgres(
        version=version, base_dir=_memory_dir(), settings={"max_wal_size": "1GB"}
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database per test, so publications and tables never meet.

    Replication slot names are cluster-wide: use the ``slot`` fixture for a unique one.
    At teardown the database's slots are dropped, or they would pin WAL for the session.
    """
    import psycopg

    name = f"t{next(_db_counter)}_{request.node.name}"[:50]
    name = "".join(c if c.isalnum() else "_" for c in name).lower()
    dsn = pg_cluster.create_database(name)
    yield dsn
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        # The timeout waits for each backend to exit: a slot is active until then.
        conn.execute(
            "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall()
        for (slot_name,) in slots:
            # A temporary slot goes with its session, which may be exiting right now.
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
    # Dropped, not kept for the session: ~450 databases of 7.5 MB each a run otherwise.
    try:
        pg_cluster.drop_database(name)
    except psycopg.Error as exc:
        warnings.warn(f"test database {name} not dropped: {exc}", stacklevel=1)


@pytest.fixture
def slot(pg_dsn: str) -> str:
    """A replication slot name unique in the cluster (derived from the test's database)."""
    return "s_" + pg_dsn.rsplit("dbname=", 1)[1].split()[0]


# The tests' session evaluates expressions interpreted, not compiled: a test's frames are a
# few rows, and compiling each query's generated Java (Janino) cost more than running it.
# Measured on four of the slowest Spark-path tests in one JVM: 296-317 s compiled, 211-247 s
# interpreted. The same answers either way (Spark's own suites run both modes); the job's
# sessions keep code generation, and the tests that run the job as users do (spark-submit,
# the demo, the Airflow DAG) build theirs as the job does.
# Its JVM also collects garbage with the throughput collector instead of G1: hundreds of
# small Delta jobs on two cores leave G1's concurrent threads less to spare. Four of the
# slowest Spark-path tests, interleaved twice: 89.5-90.6 s against 94.0-95.6 s with G1
# (2026-12-03). A collector changes no answer.
SPARK_TEST_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from slotlake.spark import build_session

    session = build_session("slotlake-tests", conf=SPARK_TEST_CONF)
    yield session
    session.stop()


@pytest.fixture
def checkpoint_every_10(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables created meanwhile (by the driver or Spark) checkpoint every 10 versions,
    Delta's default, instead of the lake's 30, at multiples of 10 (the driver's stagger
    off, as Spark's own checkpoints): tests that reach a checkpoint stay short and know
    where it is."""
    from slotlake import delta, delta_log

    monkeypatch.setitem(delta.TABLE_PROPERTIES, "delta.checkpointInterval", "10")
    monkeypatch.setattr(delta_log, "STAGGER", False)


_INTEGRATION_FIXTURES = {"pg_cluster", "pg_dsn", "spark"}

# ``@pytest.mark.one_pg_version`` (a test, or one parameter of it): run on the newest
# version listed only. For what sees the decoder's output and not the source's bytes:
# Spark's writers and readers (the driver's run on every version, and the decoder that
# Spark's workers run is the one the driver runs), the driver's other writers beside its
# default one, the lake's upkeep, reprocessing past the first reprocess of each version's
# raw, and the packaging around the job (spark-submit, Airflow, the demo). The source's
# version changes nothing these see, and each run costs a JVM or a spark-submit per step
# (about 5 minutes of a 28-minute suite; the end-to-end workload through Spark alone is
# 45 s a version; the lake-side variants another ~1.5 minutes).
ONE_VERSION = max(PG_VERSIONS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        # Anything that starts a server or a JVM is an integration test, marked or not,
        # so that `pytest -m "not integration"` stays a seconds-long loop.
        if _INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        version = getattr(getattr(item, "callspec", None), "params", {}).get("pg_cluster")
        if item.get_closest_marker("one_pg_version") and version not in (None, ONE_VERSION):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
