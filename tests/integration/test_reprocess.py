"""Reprocessing: the sync end-to-end workload rebuilt from raw Parquet alone.

One lake is synced per PostgreSQL version (the batches of test_sync_e2e), then rebuilt
into fresh roots, in place, from the middle, and from damaged raw files. PostgreSQL is
stopped from the reprocessing's point of view: nothing here passes it a DSN.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from slotlake import cli
from slotlake.lake import Lake, read_changes, read_delta, read_state
from slotlake.localpg import LocalPostgres
from slotlake.reprocess import IN_PLACE_MARKER, ReprocessError, parse_range, run_reprocess
from slotlake.sync import run_sync

from ..conftest import ONE_VERSION
from .sync_helpers import assert_mirror, make_config
from .test_sync_e2e import KEYS, SCHEMA, _batch1, _batch2, _batch3, _batch5

TABLES = list(KEYS)


_DB_COUNTER = itertools.count()


@pytest.fixture(scope="module")
def synced_lake(pg_cluster: LocalPostgres, spark, tmp_path_factory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Five committed batches: the e2e workload, an idle batch, and a last one."""
    # Named afresh each time: xdist's work stealing may set a module's fixture up twice
    # in one worker, on the worker's one cluster.
    dbname = f"reprocess_pg{pg_cluster.version}_{next(_DB_COUNTER)}"
    dsn = pg_cluster.create_database(dbname)
    slot = f"s_{dbname}"
    lake = str(tmp_path_factory.mktemp("reprocess") / "lake")
    cfg = make_config(dsn, lake, slot)
    # Batch 3's rewrite of evolve is copied by the next run's batch (4, beside the idle
    # database's progress), not by a batch of its own: the five batches the tests name.
    cfg.lake.copy_wanted_in_same_run = False
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            for step in (_batch1, _batch2, _batch3, None, _batch5):
                if step is None:
                    c.execute("CREATE TABLE unpublished (x int)")
                    c.execute("INSERT INTO unpublished VALUES (1)")
                else:
                    step(c)
                assert run_sync(cfg, spark=spark).status == "committed"
        finally:
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    assert Lake(lake).commit_batches() == [1, 2, 3, 4, 5]
    yield lake


@pytest.fixture
def spark_reads(pg_cluster: LocalPostgres, spark):  # type: ignore[no-untyped-def]
    """The session that reads the rebuilt tables back through Spark, on the newest
    PostgreSQL only (None on the others): what Spark reads depends on the Delta files, not
    on the source's version, and deltalake compares the same tables on every version
    (``assert_batch_files_equal``); each Spark comparison costs ~12 s (see conftest.py's
    ``one_pg_version``)."""
    return spark if pg_cluster.version == ONE_VERSION else None


def _delta(spark, root: str, rel: str, version: int):  # type: ignore[no-untyped-def]
    return spark.read.format("delta").option("versionAsOf", version).load(f"{root}/{rel}")


def _sortable(df):  # type: ignore[no-untyped-def]
    from pyspark.sql.types import MapType

    # Maps cannot be ordered in Spark; every other column takes part in the order.
    return df.orderBy(*[f.name for f in df.schema.fields if not isinstance(f.dataType, MapType)])


def assert_batch_equal(spark, orig: str, new: str, batch: int, first: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Batch ``batch`` of ``new`` (rebuilt from batch ``first`` on) equals the original:
    its record, and every Delta table read as of the versions the two records name.
    Without a session (``spark_reads`` on an older PostgreSQL) only the record."""

    a, b = Lake(orig).read_commit(batch), Lake(new).read_commit(batch)
    assert (b.kind, b.start_lsn, b.end_lsn, b.target_lsn) == (
        "reprocess",
        a.start_lsn,
        a.end_lsn,
        a.target_lsn,
    )
    assert b.transaction_count == a.transaction_count and b.raw_messages == a.raw_messages
    assert sorted(a.tables) == sorted(b.tables)
    for name, ta in a.tables.items():
        tb = b.tables[name]
        assert (tb.change_rows, tb.state_rows, tb.columns, tb.key_columns, tb.renames) == (
            ta.change_rows,
            ta.state_rows,
            ta.columns,
            ta.key_columns,
            ta.renames,
        ), f"batch {batch} {name}"
        assert tb.written == ta.written, f"batch {batch} {name}"
    if spark is not None:
        _assert_spark_reads_equal(spark, a, b, orig, new, first)


def _assert_spark_reads_equal(spark, a, b, orig: str, new: str, first: int) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    for name, ta in a.tables.items():
        tb = b.tables[name]
        assert ta.changes and tb.changes and ta.changes_version is not None
        assert tb.changes_version is not None
        # The change log, in its order (commit_lsn, tx_ordinal); the new root's starts at FIRST.
        old_log = _delta(spark, orig, ta.changes, ta.changes_version).filter(
            F.col("_batch") >= first
        )
        new_log = _delta(spark, new, tb.changes, tb.changes_version)
        assert_df_equality(
            old_log.orderBy("_commit_lsn", "_tx_ordinal"),
            new_log.orderBy("_commit_lsn", "_tx_ordinal"),
        )
        assert ta.state and tb.state and ta.state_version is not None
        assert tb.state_version is not None
        assert_df_equality(
            _sortable(_delta(spark, orig, ta.state, ta.state_version)),
            _sortable(_delta(spark, new, tb.state, tb.state_version)),
        )
    assert a.transactions and b.transactions and a.transactions_version is not None
    assert b.transactions_version is not None
    assert_df_equality(
        _delta(spark, orig, a.transactions, a.transactions_version)
        .filter(F.col("_batch") >= first)
        .orderBy("commit_lsn"),
        _delta(spark, new, b.transactions, b.transactions_version).orderBy("commit_lsn"),
    )


def assert_batch_files_equal(orig: str, new: str, batch: int, first: int = 1) -> None:
    """The same comparison without Spark: the deltalake readers, as of batch ``batch``."""
    a, b = Lake(orig).read_commit(batch), Lake(new).read_commit(batch)
    assert (b.kind, b.start_lsn, b.end_lsn, b.target_lsn) == (
        "reprocess",
        a.start_lsn,
        a.end_lsn,
        a.target_lsn,
    )
    assert sorted(a.tables) == sorted(b.tables)
    for name, ta in a.tables.items():
        tb = b.tables[name]
        assert (tb.change_rows, tb.state_rows, tb.columns, tb.gone_since) == (
            ta.change_rows,
            ta.state_rows,
            ta.columns,
            ta.gone_since,
        ), f"batch {batch} {name}"
        assert _log(new, name, batch) == _log(orig, name, batch, first), f"batch {batch} {name}"
        if ta.gone_since is None:  # (a gone table's state is refused, and unchanged since)
            assert _rows(read_state(new, name, batch)) == _rows(read_state(orig, name, batch)), (
                f"batch {batch} {name}"
            )


def _log(root: str, table: str, batch: int | None = None, first: int = 1) -> list[dict]:
    log = read_changes(root, table, batch)
    return [r for r in log.to_pylist() if r["_batch"] >= first]


def assert_readers_equal(orig: str, new: str, first_batch: int = 1) -> None:
    """What a pandas/pyarrow user reads: the same state, the same change log from FIRST on."""
    for table in TABLES:
        assert _rows(read_state(new, table)) == _rows(read_state(orig, table)), table
        assert _log(new, table) == _log(orig, table, first=first_batch), table


def assert_tables_at_newest_record(root: str) -> None:
    """Each Delta table's newest version holds what the newest commit record names: the
    next sync MERGEs into the newest version, so they must agree."""
    rec = Lake(root).last_commit()
    assert rec is not None
    for name, t in rec.tables.items():
        assert t.state and t.state_version is not None
        assert _rows(read_delta(root, t.state, None)) == _rows(
            read_delta(root, t.state, t.state_version)
        ), name
        assert t.changes and t.changes_version is not None
        assert _rows(read_delta(root, t.changes, None)) == _rows(
            read_delta(root, t.changes, t.changes_version)
        ), name
    assert rec.transactions and rec.transactions_version is not None
    assert _rows(read_delta(root, rec.transactions, None)) == _rows(
        read_delta(root, rec.transactions, rec.transactions_version)
    )


def _rows(t: pa.Table) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in t.to_pylist())


def test_parse_range() -> None:
    assert parse_range("3..7") == (3, 7)
    assert parse_range("3..") == (3, None)
    assert parse_range("..7") == (None, 7)
    assert parse_range("5") == (5, 5)
    assert parse_range(None) == (None, None)
    for bad in ("7..3", "x", ".."):
        with pytest.raises(ValueError):
            parse_range(bad)


# Generous: on two cores shared with other Spark runs a batch can take minutes.
@pytest.mark.timeout(3600)  # includes building the synced lake (five batches)
def test_reprocess_every_batch_into_a_fresh_root(
    synced_lake: str, spark, spark_reads, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "rebuilt")
    conf = tmp_path / "job.toml"
    # A DSN nothing listens on: reprocessing must never need the source.
    conf.write_text(
        f'[source]\ndsn = "host=/nonexistent port=1"\nslot = "x"\n[lake]\npath = "{synced_lake}"\n'
    )
    assert cli.main(["reprocess", "--config", str(conf), "--output", out]) == 0
    assert Lake(out).commit_batches() == [1, 2, 3, 4, 5]
    # Each table a batch wrote, its state's rows as the record counts them: a multiset's
    # are its distinct values.
    printed = capsys.readouterr().out
    first = Lake(out).read_commit(1).tables
    assert first["public.full_t"].multiset and not first["public.kv"].multiset
    for name, t in first.items():
        if t.written:
            line = f"batch 1: {name}: {t.change_rows} changes, {t.state_rows_text()}\n"
            assert line in printed
    assert "batch 1: public.full_t: " in printed and "distinct rows (multiset)" in printed
    # A lake of its own: its own lake_id, so its own Delta txnAppId.
    assert Lake(out).app_id() != Lake(synced_lake).app_id()
    assert {Lake(out).read_commit(b).txn_app_id for b in range(1, 6)} == {Lake(out).app_id()}
    for b in range(1, 6):
        assert_batch_files_equal(synced_lake, out, b)
    # The newest versions, which hold every batch's change rows, once more with Spark.
    assert_batch_equal(spark_reads, synced_lake, out, 5)
    assert_readers_equal(synced_lake, out)
    # The new root is self-contained: its raw and its tables' history rebuild it in turn.
    again = str(tmp_path / "again")
    result = run_reprocess(out, output=again, first=5, spark=spark)
    assert result.from_batch_state == 4 and Lake(again).commit_batches() == [5]
    assert_batch_files_equal(synced_lake, again, 5, first=5)


@pytest.mark.timeout(2400)
@pytest.mark.one_pg_version  # every version's raw is reprocessed by the fresh-root test
def test_reprocess_a_middle_range_continues_from_the_retained_state(
    synced_lake: str, spark, spark_reads, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "from3")
    result = run_reprocess(synced_lake, output=out, first=3, last=4, spark=spark)
    assert result.batches == [3, 4] and result.from_batch_state == 2
    assert Lake(out).commit_batches() == [3, 4]
    # Batch 3 renames, adds, retypes and drops columns of evolve: its log replays them on
    # the columns the source's log had as of batch 2, to the same columns.
    for b in (3, 4):
        assert_batch_files_equal(synced_lake, out, b, first=3)
    # Resuming in the same root continues from its batch 4.
    result = run_reprocess(synced_lake, output=out, first=5, spark=spark)
    assert result.from_batch_state == 4
    assert_batch_equal(spark_reads, synced_lake, out, 5, first=3)
    assert_readers_equal(synced_lake, out, first_batch=3)
    # A root that already holds other batches is refused.
    with pytest.raises(ReprocessError, match=r"already holds batches 3\.\.5"):
        run_reprocess(synced_lake, output=out, first=2, spark=spark)


@pytest.mark.timeout(2400)
@pytest.mark.one_pg_version  # every version's raw is reprocessed by the fresh-root test
def test_reprocess_in_place(synced_lake: str, spark, spark_reads, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from deltalake import DeltaTable

    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    with pytest.raises(ReprocessError, match="must end at the newest commit"):
        run_reprocess(lake, in_place=True, first=2, last=3, spark=spark)
    with pytest.raises(ReprocessError, match="--from-empty would replace"):
        run_reprocess(lake, in_place=True, first=3, from_empty=True, spark=spark)
    before = {b: Lake(lake).read_commit(b) for b in (1, 2, 3, 4, 5)}
    result = run_reprocess(lake, in_place=True, first=3, spark=spark)
    assert result.batches == [3, 4, 5] and result.from_batch_state == 2
    # Under an id of its own: the lake's id already recorded batches 3..5 in every table.
    own = Lake(lake).app_id()
    assert result.txn_app_id.startswith(f"{own}-reprocess-")
    # Every table that batches 3..5 changed was restored to its version as of batch 2.
    assert result.restored["state/public.evolve"] == before[2].tables["public.evolve"].state_version
    after = {b: Lake(lake).read_commit(b) for b in (1, 2, 3, 4, 5)}
    assert after[1] == before[1] and after[2] == before[2]
    for b in (3, 4, 5):
        assert after[b].kind == "reprocess" and after[b].attempt != before[b].attempt
        assert after[b].txn_app_id == result.txn_app_id
        assert after[b].raw == before[b].raw  # raw is the input: never rewritten
        assert_batch_files_equal(synced_lake, lake, b)
    assert_batch_equal(spark_reads, synced_lake, lake, 5)
    assert_readers_equal(synced_lake, lake)
    # The replaced records' versions stay readable (time travel), and the tables' newest
    # versions are the new newest record's: sync goes on from there with the lake's own id,
    # which recorded batch 5 and takes batch 6.
    kv5 = before[5].tables["public.kv"]
    assert kv5.state and kv5.state_version is not None
    assert _rows(read_delta(lake, kv5.state, kv5.state_version)) == _rows(
        read_state(synced_lake, "public.kv")
    )
    assert_tables_at_newest_record(lake)
    assert DeltaTable(f"{lake}/state/public.kv").transaction_version(own) == 5
    assert not (Path(lake) / IN_PLACE_MARKER).exists()


def _raw_file(lake: str, batch: int) -> Path:
    rec = Lake(lake).read_commit(batch)
    assert rec.raw
    return Path(lake) / rec.raw / "part-00000.parquet"


def test_truncated_raw_file_is_named_and_nothing_is_committed(
    synced_lake: str, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    victim = _raw_file(lake, 2)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    with pytest.raises(ReprocessError) as err:
        run_reprocess(lake, output=str(out), spark=spark)
    assert f"batch 2: raw file {victim} is corrupted" in str(err.value)
    # Checked before the first write: batch 1 was not written either.
    assert not out.exists()
    with pytest.raises(ReprocessError, match=f"batch 2: raw file {victim} is corrupted"):
        run_reprocess(lake, in_place=True, first=2, spark=spark)

    victim.unlink()
    with pytest.raises(ReprocessError, match=f"batch 2: raw file {victim} is missing"):
        run_reprocess(lake, output=str(out), spark=spark)
    assert not out.exists()
    shutil.rmtree(victim.parent)
    with pytest.raises(ReprocessError, match=r"batch 2: raw directory .* is missing"):
        run_reprocess(lake, output=str(out), first=2, spark=spark)
    assert not out.exists()
    # The lake itself was not touched.
    assert [r.kind for r in Lake(lake).commits()] == ["sync"] * 5
    assert_tables_at_newest_record(lake)


@pytest.mark.timeout(2400)
def test_undecodable_payload_is_named_and_its_batch_not_committed(
    synced_lake: str, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    victim = _raw_file(lake, 2)
    t = pq.read_table(victim)
    types = t.column("msg_type").to_pylist()
    i = types.index("U")
    data = t.column("data").to_pylist()
    data[i] = data[i][:7]  # cut inside the tuple: the decoder must say where
    t = t.set_column(t.schema.get_field_index("data"), "data", pa.array(data, pa.binary()))
    pq.write_table(t, victim)
    out = str(tmp_path / "out")
    with pytest.raises(ReprocessError) as err:
        run_reprocess(lake, output=out, spark=spark)
    msg = str(err.value)
    assert f"batch 2: raw file {victim}" in msg and "seq" in msg, msg
    assert Lake(out).commit_batches() == [1]
    # The failed attempt's raw is gone; batch 1 reads as it did in the original.
    assert sorted(p.name for p in (Path(out) / "_raw").iterdir()) == [
        Path(Lake(out).read_commit(1).raw or "").name
    ]
    assert_batch_files_equal(synced_lake, out, 1)
    # With the raw mended, the root resumes at batch 2; tables the failed attempt had
    # already written batch 2 into skip it (their txn marker), the others are written.
    shutil.copy(_raw_file(synced_lake, 2), victim)
    result = run_reprocess(lake, output=out, first=2, last=2, spark=spark)
    assert result.from_batch_state == 1
    assert_batch_files_equal(synced_lake, out, 2)
    pq.write_table(t, victim)

    # In place, the damaged batch keeps its old outputs: still readable, still committed,
    # and every table is rolled back to the newest record's versions.
    with pytest.raises(ReprocessError, match="batch 2"):
        run_reprocess(lake, in_place=True, first=2, spark=spark)
    assert [r.kind for r in Lake(lake).commits()] == ["sync"] * 5
    assert_readers_equal(synced_lake, lake)
    assert_tables_at_newest_record(lake)
    assert not (Path(lake) / IN_PLACE_MARKER).exists()


def _vacuum_everything(lake: str) -> None:
    """VACUUM every Delta table of the lake down to its newest version (no retention)."""
    from deltalake import DeltaTable

    for rel in Lake(lake).delta_tables():
        DeltaTable(f"{lake}/{rel}").vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=False
        )


@pytest.mark.timeout(2400)
def test_vacuumed_prior_version_is_refused_unless_from_empty(
    synced_lake: str, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    _vacuum_everything(lake)  # only the newest versions' files survive
    with pytest.raises(
        ReprocessError,
        match=r"the state of public\.\w+ as of batch 2 \(state/public\.\w+, Delta version \d+\) "
        r"is no longer readable: .*VACUUM.* --from-empty",
    ):
        run_reprocess(lake, output=str(tmp_path / "out"), first=3, spark=spark)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ReprocessError, match=r"as of batch 2 .* is no longer readable"):
        run_reprocess(lake, in_place=True, first=3, spark=spark)
    assert [r.kind for r in Lake(lake).commits()] == ["sync"] * 5
    # From nothing it runs: updates of rows it never saw list their TOAST as missing.
    run_reprocess(lake, output=str(tmp_path / "empty"), first=5, from_empty=True, spark=spark)
    kv = read_changes(str(tmp_path / "empty"), "public.kv").to_pylist()
    assert any(r["_missing_toast"] for r in kv)


def test_old_layout_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lake written by the Parquet layout (before Delta Lake) is not reprocessed."""
    old = tmp_path / "old"
    (old / "_commits").mkdir(parents=True)
    (old / "_commits" / f"{1:020d}.json").write_text(
        json.dumps({"batch": 1, "attempt": "a", "raw": "_raw/b00000000000000000001-a"})
    )
    (old / "state" / "public.t").mkdir(parents=True)
    out = tmp_path / "out"
    with pytest.raises(ReprocessError, match="old Parquet layout"):
        run_reprocess(str(old), output=str(out))
    with pytest.raises(ReprocessError, match="old Parquet layout"):
        run_reprocess(str(old), in_place=True)
    conf = tmp_path / "job.toml"
    conf.write_text(f'[source]\nslot = "x"\n[lake]\npath = "{old}"\n')
    assert cli.main(["reprocess", "--config", str(conf), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "old Parquet layout (before Delta Lake)" in err and "bootstrap a new lake.path" in err
    assert not out.exists()
    # Nor is the old layout taken as an output root.
    new = tmp_path / "new"
    (new / "_commits").mkdir(parents=True)
    (new / "_commits" / f"{1:020d}.json").write_text("{}")
    (new / "_slotlake.json").write_text(json.dumps({"layout": "delta", "lake_id": "x"}))
    with pytest.raises(ReprocessError, match="old Parquet layout"):
        run_reprocess(str(new), output=str(old))


@pytest.mark.timeout(2400)
def test_in_place_from_the_first_batch_then_sync_goes_on(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """In place, tables (and the messages table) created inside the range go back to empty,
    and the next sync batch continues on the rebuilt tables. Small tables of a local lake
    need no JVM: the restores, deletes and batches are all the driver's."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot, messages=True)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
        c.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        c.execute("CREATE TABLE t2 (id int PRIMARY KEY, w text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t, t2")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute(
            "INSERT INTO t SELECT g, 'v' || g, repeat(md5(g::text), 400) FROM generate_series(1, 30) g"
        )
        assert run_sync(cfg, spark=spark).status == "committed"
        c.execute("UPDATE t SET v = 'second' WHERE id <= 10")  # leaves big out
        c.execute("DELETE FROM t WHERE id > 25")
        c.execute("INSERT INTO t2 VALUES (1, 'one'), (2, 'two')")
        c.execute("SELECT pg_logical_emit_message(true, 'p', 'hello')")
        assert run_sync(cfg, spark=spark).status == "committed"
        orig = str(tmp_path / "orig")
        shutil.copytree(lake, orig)
        first = Lake(lake).read_commit(1)
        assert "public.t2" not in first.tables and first.messages is None

        def no_spark(*_: object) -> None:
            raise AssertionError("a SparkSession was asked for")

        monkeypatch.setattr("slotlake.spark.build_session", no_spark)
        # Batch 2 created t2's tables and the messages table: they go back to empty.
        result = run_reprocess(lake, in_place=True, first=2)
        assert result.restored["state/public.t2"] == 0 and result.restored["messages"] >= 0
        assert_batch_files_equal(orig, lake, 2)
        assert_tables_at_newest_record(lake)
        rec = Lake(lake).read_commit(2)
        assert rec.messages and rec.messages_version is not None
        assert read_delta(lake, rec.messages, rec.messages_version).column(
            "prefix"
        ).to_pylist() == ["p"]
        # From the first batch: every table, the transactions table too, starts empty.
        result = run_reprocess(lake, in_place=True)
        assert result.batches == [1, 2] and result.from_batch_state is None
        for b in (1, 2):
            assert_batch_files_equal(orig, lake, b)
        assert_tables_at_newest_record(lake)
        tx = Lake(lake).read_commit(2)
        assert read_delta(lake, "transactions", tx.transactions_version).num_rows == sum(
            Lake(orig).read_commit(b).transaction_count for b in (1, 2)
        )

        # The next batch: an update that leaves big out needs the rebuilt state.
        c.execute("UPDATE t SET v = 'third' WHERE id IN (1, 20)")
        c.execute("INSERT INTO t2 VALUES (3, 'three')")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert Lake(lake).read_commit(3).kind == "sync"
        assert_mirror(c, lake, ["public.t", "public.t2"])
        log = read_changes(lake, "public.t").to_pylist()
        assert [r["_op"] for r in log].count("U") == 12
        assert not any(r["_missing_toast"] for r in log)
