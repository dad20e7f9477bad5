"""A lake addressed by a Hadoop file system URI goes through Spark's Hadoop FileSystem.

``file://`` is the Hadoop file system every machine has: with a SparkSession running,
the lake's commit records, listings and raw uploads go through the same JVM API that
serves hdfs:// or s3a:// roots.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from slotlake.batch import DriverWrites
from slotlake.hadoopfs import HadoopFS
from slotlake.lake import Lake, LakeError, TableCommit, make_record, read_changes
from slotlake.sync import run_sync

from .sync_helpers import assert_mirror, make_config, slot_confirmed


def test_hadoop_fs_operations(spark, tmp_path: Path) -> None:
    fs = HadoopFS(spark)
    root = f"file://{tmp_path}/lake"
    lake = Lake(root)
    assert isinstance(lake.fs, HadoopFS)
    record = make_record(
        batch=1,
        attempt="a1",
        slot="s",
        start_lsn="0/1",
        end_lsn="0/2",
        target_lsn="0/2",
        raw="_raw/b00000000000000000001-a1",
        tables={"public.t": TableCommit(changes=None, state="state/public.t", state_version=0)},
    )
    lake.write_commit(record)
    with pytest.raises(LakeError, match="already committed"):
        lake.write_commit(record)
    assert lake.commit_batches() == [1]
    assert lake.read_commit(1) == record
    # Only the record is left in _commits: no temporary file survives the rename.
    assert fs.listdir(f"{root}/_commits") == ["00000000000000000001.json"]

    fs.mkdirs(f"{root}/_raw/b00000000000000000001-a1")
    fs.mkdirs(f"{root}/_raw/b00000000000000000002-dead")
    assert lake.remove_uncommitted() == ["_raw/b00000000000000000002-dead"]
    assert fs.isdir(f"{root}/_raw/b00000000000000000001-a1")
    # Plans and the layout marker go through the same file system.
    assert fs.exists(f"{root}/_slotlake.json") and lake.layout()["layout"] == "delta"  # type: ignore[index]

    local = tmp_path / "upload"
    local.mkdir()
    (local / "part-0.txt").write_text("x")
    fs.upload_dir(str(local), f"{root}/_raw/up")
    assert fs.listdir(f"{root}/_raw/up") == ["part-0.txt"]

    replaced = make_record(**{**record.__dict__, "end_lsn": "0/3", "attempt": "a2"})
    assert lake.replace_commit(replaced).end_lsn == "0/2"
    assert lake.read_commit(1).end_lsn == "0/3"


@pytest.mark.parametrize(
    "state",
    [
        "driver",
        pytest.param("spark", marks=pytest.mark.one_pg_version),
        pytest.param("spark-mid", marks=pytest.mark.one_pg_version),
    ],
)
def test_sync_into_a_file_uri_lake(
    pg_dsn: str, slot: str, spark, tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written by the driver (a file:// root is on the local disk), or by Spark as on an
    object store: the keyed state's size is then read from the JVM's snapshot, and a small
    one's MERGE rewrites the files it touches where a bigger one's (``spark-mid``: any
    size counted as that) writes deletion vectors."""
    if state == "spark-mid":
        monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
    root = f"file://{tmp_path}/lake"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
        cfg = make_config(pg_dsn, root, slot)
        if state != "driver":
            cfg.lake.driver_write_rows = 0
        first = run_sync(cfg, spark=spark)
        c.execute("UPDATE t SET v = 'changed' WHERE id <= 5")
        c.execute("DELETE FROM t WHERE id > 15")
        second = run_sync(cfg, spark=spark)
        assert (first.batch, second.batch) == (1, 2)
        assert slot_confirmed(c, slot) == str(second.end_lsn)
        assert_mirror(c, root, ["public.t"])
    lake = Lake(root)
    assert isinstance(lake.fs, HadoopFS)
    # The raw batch was staged locally and uploaded into the lake.
    raw = lake.read_commit(2).raw
    assert raw and any(n.endswith(".parquet") for n in lake.fs.listdir(lake.path(raw)))
    assert [r["_op"] for r in read_changes(root, "public.t").to_pylist()].count("U") == 5
    state_dir = tmp_path / "lake" / Lake.table_path("state", "public.t")
    vectors = list(state_dir.glob("deletion_vector_*"))
    assert bool(vectors) == (state == "spark-mid"), vectors
    engines = {
        h.get("engineInfo", "")
        for h in DeltaTable(str(state_dir)).history()
        if h.get("operation") == "MERGE"
    }
    assert all(("Spark" in e) == (state != "driver") for e in engines), engines
