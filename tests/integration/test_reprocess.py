"""Reprocessing: the sync end-to-end workload rebuilt from raw Parquet alone.

One lake is synced per PostgreSQL version (the batches of test_sync_e2e), then rebuilt
into fresh roots, in place, from the middle, and from damaged raw files. PostgreSQL is
stopped from the reprocessing's point of view: nothing here passes it a DSN.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from slotlake import cli
from slotlake.lake import Lake, read_changes, read_state
from slotlake.localpg import LocalPostgres
from slotlake.reprocess import ReprocessError, parse_range, run_reprocess
from slotlake.sync import run_sync

from .sync_helpers import make_config
from .test_sync_e2e import KEYS, SCHEMA, _batch1, _batch2, _batch3, _batch5

TABLES = list(KEYS)


@pytest.fixture(scope="module")
def synced_lake(pg_cluster: LocalPostgres, spark, tmp_path_factory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Five committed batches: the e2e workload, an idle batch, and a last one."""
    dbname = f"reprocess_pg{pg_cluster.version}"
    dsn = pg_cluster.create_database(dbname)
    slot = f"s_{dbname}"
    lake = str(tmp_path_factory.mktemp("reprocess") / "lake")
    cfg = make_config(dsn, lake, slot)
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


def _sortable(df):  # type: ignore[no-untyped-def]
    from pyspark.sql.types import MapType

    # Maps cannot be ordered in Spark; every other column takes part in the order.
    return df.orderBy(*[f.name for f in df.schema.fields if not isinstance(f.dataType, MapType)])


def assert_batch_equal(spark, orig: str, new: str, batch: int) -> None:  # type: ignore[no-untyped-def]
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
        assert (ta.changes is None) == (tb.changes is None)
        if ta.changes and tb.changes:
            # The change log has an order: (commit_lsn, tx_ordinal), kept as written.
            assert_df_equality(
                spark.read.parquet(f"{orig}/{ta.changes}"),
                spark.read.parquet(f"{new}/{tb.changes}"),
            )
        assert ta.state and tb.state
        assert_df_equality(
            _sortable(spark.read.parquet(f"{orig}/{ta.state}")),
            _sortable(spark.read.parquet(f"{new}/{tb.state}")),
        )
    assert a.transactions and b.transactions
    assert_df_equality(
        spark.read.parquet(f"{orig}/{a.transactions}"),
        spark.read.parquet(f"{new}/{b.transactions}"),
    )


def assert_batch_files_equal(orig: str, new: str, batch: int) -> None:
    """The same comparison without Spark (pyarrow reads the same committed files)."""
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
        assert (tb.change_rows, tb.state_rows, tb.columns) == (
            ta.change_rows,
            ta.state_rows,
            ta.columns,
        ), f"batch {batch} {name}"
        if ta.changes or tb.changes:
            assert ta.changes and tb.changes
            assert pq.read_table(f"{new}/{tb.changes}").equals(
                pq.read_table(f"{orig}/{ta.changes}")
            ), f"batch {batch} {name}"
        assert ta.state and tb.state
        assert _rows(pq.read_table(f"{new}/{tb.state}")) == _rows(
            pq.read_table(f"{orig}/{ta.state}")
        ), f"batch {batch} {name}"


def assert_readers_equal(orig: str, new: str, first_batch: int = 1) -> None:
    """What a pandas/pyarrow user reads: the same state, the same change log from FIRST on."""
    for table in TABLES:
        assert _rows(read_state(new, table)) == _rows(read_state(orig, table)), table
        old_log = read_changes(orig, table)
        old_log = old_log.filter(pa.compute.greater_equal(old_log["_batch"], first_batch))
        assert read_changes(new, table).to_pylist() == old_log.to_pylist(), table


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


@pytest.mark.timeout(1800)  # includes building the synced lake (five batches)
def test_reprocess_every_batch_into_a_fresh_root(synced_lake: str, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "rebuilt")
    conf = tmp_path / "job.toml"
    # A DSN nothing listens on: reprocessing must never need the source.
    conf.write_text(
        f'[source]\ndsn = "host=/nonexistent port=1"\nslot = "x"\n[lake]\npath = "{synced_lake}"\n'
    )
    assert cli.main(["reprocess", "--config", str(conf), "--output", out]) == 0
    assert Lake(out).commit_batches() == [1, 2, 3, 4, 5]
    for b in range(1, 6):
        assert_batch_equal(spark, synced_lake, out, b)
    assert_readers_equal(synced_lake, out)
    # The new root is self-contained: its raw and states are there to rebuild it in turn.
    again = str(tmp_path / "again")
    run_reprocess(out, output=again, first=5, spark=spark)
    assert_batch_files_equal(synced_lake, again, 5)


def test_reprocess_a_middle_range_continues_from_the_retained_state(
    synced_lake: str, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "from3")
    result = run_reprocess(synced_lake, output=out, first=3, last=4, spark=spark)
    assert result.batches == [3, 4] and result.from_batch_state == 2
    assert Lake(out).commit_batches() == [3, 4]
    for b in (3, 4):
        assert_batch_files_equal(synced_lake, out, b)
    # Resuming in the same root continues from its batch 4.
    result = run_reprocess(synced_lake, output=out, first=5, spark=spark)
    assert result.from_batch_state == 4
    assert_batch_files_equal(synced_lake, out, 5)
    assert_readers_equal(synced_lake, out, first_batch=3)
    # A root that already holds other batches is refused.
    with pytest.raises(ReprocessError, match=r"already holds batches 3\.\.5"):
        run_reprocess(synced_lake, output=out, first=2, spark=spark)


def test_reprocess_in_place(synced_lake: str, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    with pytest.raises(ReprocessError, match="must end at the newest commit"):
        run_reprocess(lake, in_place=True, first=2, last=3, spark=spark)
    before = {b: Lake(lake).read_commit(b) for b in (1, 2, 3, 4, 5)}
    result = run_reprocess(lake, in_place=True, first=3, spark=spark)
    assert result.batches == [3, 4, 5]
    after = {b: Lake(lake).read_commit(b) for b in (1, 2, 3, 4, 5)}
    assert after[1] == before[1] and after[2] == before[2]
    for b in (3, 4, 5):
        assert after[b].kind == "reprocess" and after[b].attempt != before[b].attempt
        assert after[b].raw == before[b].raw  # raw is the input: never rewritten
        assert_batch_files_equal(synced_lake, lake, b)
    assert_readers_equal(synced_lake, lake)
    # Directories only the replaced records named are gone; nothing committed points nowhere.
    assert result.removed and not any((Path(lake) / rel).exists() for rel in result.removed)
    for rel in Lake(lake).referenced_dirs():
        assert (Path(lake) / rel).is_dir(), rel


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
    assert Lake(out).commit_batches() == [] and not out.exists()

    victim.unlink()
    with pytest.raises(ReprocessError, match=f"batch 2: raw file {victim} is missing"):
        run_reprocess(lake, output=str(out), spark=spark)
    assert not out.exists()


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
    # The failed attempt left nothing behind but batch 1's committed directories.
    on_disk = {
        p.relative_to(out).as_posix()
        for p in Path(out).glob("**/b*-*")
        if p.is_dir() and p.name.startswith("b0")
    }
    assert on_disk == Lake(out).referenced_dirs()

    # In place, the damaged batch keeps its old outputs: still readable, still committed.
    with pytest.raises(ReprocessError, match="batch 2"):
        run_reprocess(lake, in_place=True, first=2, spark=spark)
    assert Lake(lake).read_commit(2).kind == "sync"
    for table in TABLES:
        assert read_state(lake, table).num_rows == read_state(synced_lake, table).num_rows


def test_expired_prior_state_is_refused_unless_from_empty(
    synced_lake: str, spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    lake = str(tmp_path / "copy")
    shutil.copytree(synced_lake, lake)
    Lake(lake).expire_states(0)  # only the versions in force survive
    with pytest.raises(
        ReprocessError, match=r"the state of public\.\w+ in force before batch 3 .* has expired"
    ):
        run_reprocess(lake, output=str(tmp_path / "out"), first=3, spark=spark)
    assert not (tmp_path / "out").exists()
    # From nothing it runs: updates of rows it never saw list their TOAST as missing.
    run_reprocess(lake, output=str(tmp_path / "empty"), first=5, from_empty=True, spark=spark)
    kv = read_changes(str(tmp_path / "empty"), "public.kv").to_pylist()
    assert any(r["_missing_toast"] for r in kv)
