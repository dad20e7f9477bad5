"""Reading the lake without slotlake, as docs/reading.md shows: Spark, deltalake (and
pandas, polars through it), DuckDB.

The state tables use deletion vectors (MERGE marks replaced rows) and column mapping in
name mode (RENAME COLUMN is metadata only), so each reader is checked after updates,
deletes and a rename, and against :func:`slotlake.lake.read_state`, for the latest batch
and as of an earlier one (time travel to the version its commit record names). A
multiset table (REPLICA IDENTITY FULL, no key) stores distinct rows with ``_copies``:
the expansion each reader needs is checked too.

First, a sync runs in a thread, paused once every table holds its batch and before its
commit record is written (the ``changes_written`` step of SLOTLAKE_FAULT: a pause
instead of a crash, so the reader really runs beside a live sync), and the test reads
meanwhile: a reader that goes through the commit records sees the previous batch, whole;
each table's latest version, read directly, already holds the uncommitted one.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaProtocolError

import slotlake.sync
from slotlake import dv_merge
from slotlake.batch import DriverWrites
from slotlake.lake import Lake, read_changes, read_state
from slotlake.sync import run_sync

from .sync_helpers import assert_mirror, make_config

SCHEMA = """
CREATE TABLE kv (id int PRIMARY KEY, txt text, n int);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE kv, bag;
"""
TABLES = ["public.bag", "public.kv"]


def duckdb_delta() -> Any:
    """A DuckDB connection with the delta extension of the duckdb-ext-delta wheel loaded."""
    duckdb = pytest.importorskip("duckdb")
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("duckdb-ext-delta is not installed (pip install -e '.[dev]')")
    con = duckdb.connect()
    con.execute(
        "SET extension_directory = ?",
        [os.path.join(next(iter(spec.submodule_search_locations)), "extensions")],
    )
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("LOAD delta")
    return con


def plain_types(table: pa.Table) -> pa.Table:
    """string_view (what DataFusion returns) → string, as docs/reading.md shows for pandas."""

    def plain(t: pa.DataType) -> pa.DataType:
        if t == pa.string_view():
            return pa.string()
        if t == pa.binary_view():
            return pa.binary()
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return pa.list_(plain(t.value_type))
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), plain(t.item_type))
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(plain(f.type)) for f in t])
        return t

    return table.cast(pa.schema([f.with_type(plain(f.type)) for f in table.schema]))


def _norm(value: Any) -> Any:
    """One form for a map or list, whichever reader returned it (dict, pairs, list, numpy)."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars (pandas)
        value = value.tolist()
    if isinstance(value, dict):
        if set(value) == {"key", "value"} and isinstance(value["key"], list):
            value = dict(zip(value["key"], value["value"], strict=True))
        return tuple(sorted(value.items()))
    if isinstance(value, (list, tuple)):
        items = [_norm(v) for v in value]
        return tuple(sorted(items)) if all(isinstance(v, tuple) for v in items) else tuple(items)
    return value


def _rows(rows: Any) -> list[tuple]:
    """Rows as sorted tuples of normalised values (column names aside)."""
    if isinstance(rows, pa.Table):
        rows = [tuple(r.values()) for r in rows.to_pylist()]
    return sorted((tuple(_norm(v) for v in r) for r in rows), key=repr)


def _delta(path: str, version: int | None = None) -> pa.Table:
    """A Delta table (latest, or as of ``version``) through deltalake's QueryBuilder."""
    dt = DeltaTable(path, version=version)
    return pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())


def _state_rel(root: str, table: str, batch: int | None = None) -> tuple[str, int]:
    lake = Lake(root)
    rec = lake.read_commit(batch) if batch is not None else lake.last_commit()
    assert rec is not None
    t = rec.tables[table]
    assert t.state is not None and t.state_version is not None
    return lake.path(t.state), t.state_version


def _workload(c: psycopg.Connection, batch: int) -> None:
    if batch == 1:
        c.execute("INSERT INTO kv SELECT g, 'v' || g, g FROM generate_series(1, 30) g")
        c.execute("INSERT INTO bag SELECT g % 4, 'b' || (g % 4) FROM generate_series(1, 12) g")
    elif batch == 2:
        c.execute("UPDATE kv SET txt = 'updated', n = -n WHERE id % 3 = 0")
        c.execute("DELETE FROM kv WHERE id % 5 = 0")
        c.execute("DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 1 LIMIT 2)")
        c.execute("INSERT INTO bag VALUES (7, 'seven'), (7, 'seven'), (7, 'seven')")
    elif batch == 3:
        c.execute("ALTER TABLE kv RENAME COLUMN txt TO label")
        c.execute("UPDATE kv SET label = 'renamed' WHERE id IN (1, 2, 3)")
        c.execute("DELETE FROM kv WHERE id = 4")
        c.execute("DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 7 LIMIT 1)")
        c.execute("INSERT INTO kv VALUES (100, 'new', 100)")


@pytest.mark.parametrize(
    "writer",
    [
        "driver",
        pytest.param("vectors", marks=pytest.mark.one_pg_version),
        pytest.param("spark", marks=pytest.mark.one_pg_version),
    ],
)
def test_readers_without_slotlake(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch, writer: str
) -> None:
    """Every reader on each writer's tables: ``deltalake`` from the driver (files
    rewritten by MERGE), the driver's own MERGE with deletion vectors (the keyed table's
    state counted as mid-sized), and Spark (deletion vectors: the state counted as
    mid-sized too, as Spark's MERGE rewrites a small one's files)."""
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    if writer == "spark":
        cfg.lake.driver_write_rows = 0
    if writer in ("vectors", "spark"):
        monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
    if writer == "vectors":
        monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)  # vectors, not rewrites
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        states: dict[int, dict[str, list[tuple]]] = {}
        for batch in (1, 2):
            _workload(c, batch)
            assert run_sync(cfg, spark=spark).batch == batch
            states[batch] = {t: _rows(read_state(root, t)) for t in TABLES}

        # -- a reader during a sync: batch 3 paused once every table holds it (the
        # changes_written step of SLOTLAKE_FAULT), before its commit record is written.
        _workload(c, 3)
        paused, resume = threading.Event(), threading.Event()
        real_fault = slotlake.sync.fault_point

        def pause(step: str) -> None:
            if step == "changes_written":
                paused.set()
                assert resume.wait(600), "the test never resumed the sync"
            real_fault(step)

        monkeypatch.setattr(slotlake.sync, "fault_point", pause)
        outcome: dict[str, Any] = {}

        def sync() -> None:
            try:
                outcome["result"] = run_sync(cfg, spark=spark)
            except BaseException as exc:  # pragma: no cover - reported below
                outcome["error"] = exc

        worker = threading.Thread(target=sync, name="sync-batch-3")
        worker.start()
        try:
            assert paused.wait(600), outcome.get("error")
            assert Lake(root).last_commit().batch == 2  # type: ignore[union-attr]
            for t in TABLES:
                path, version = _state_rel(root, t)
                # The table's latest version holds the uncommitted batch 3 ...
                assert DeltaTable(path).version() > version, t
                assert _rows(_delta(path)) != _rows(_delta(path, version)), t
                changes = Lake(root).path(Lake(root).last_commit().tables[t].changes)  # type: ignore[union-attr, arg-type]
                assert 3 in _delta(changes).column("_batch").to_pylist(), t
                # ... a reader through the commit records sees batch 2, whole.
                assert _rows(read_state(root, t)) == states[2][t], t
                assert set(read_changes(root, t).column("_batch").to_pylist()) == {1, 2}, t
        finally:
            resume.set()
            worker.join(600)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"].batch == 3
        monkeypatch.setattr(slotlake.sync, "fault_point", real_fault)
        states[3] = {t: _rows(read_state(root, t)) for t in TABLES}
        assert_mirror(c, root, TABLES)
        assert states[3] != states[2]

    lake = Lake(root)
    kv_path, kv_v3 = _state_rel(root, "public.kv", 3)
    _, kv_v2 = _state_rel(root, "public.kv", 2)
    bag_path, bag_v3 = _state_rel(root, "public.bag", 3)
    # The features every reader must handle are in play.
    config = DeltaTable(kv_path).metadata().configuration
    assert config.get("delta.columnMapping.mode") == "name"
    dvs = any(n.startswith("deletion_vector_") for n in os.listdir(kv_path))
    assert dvs == (writer in ("vectors", "spark")), os.listdir(kv_path)
    assert "label" in read_state(root, "public.kv").column_names

    # -- deltalake: QueryBuilder (DataFusion) reads them; to_pyarrow_table() does not.
    with pytest.raises(DeltaProtocolError, match=r"deletionVectors|columnMapping"):
        DeltaTable(kv_path).to_pyarrow_table()
    kv_as_of = {b: _delta(kv_path, version) for b, version in ((2, kv_v2), (3, kv_v3))}
    for b, kv_table in kv_as_of.items():
        assert _rows(kv_table) == states[b]["public.kv"]
    expand = "SELECT * EXCLUDE (_i) FROM (SELECT * EXCLUDE (_copies), unnest(range(_copies)) AS _i FROM bag)"
    bag = QueryBuilder().register("bag", DeltaTable(bag_path, version=bag_v3))
    assert _rows(pa.table(bag.execute(expand).read_all())) == states[3]["public.bag"]
    # pandas: repeat each distinct row _copies times (after the cast pandas needs).
    bag_table = pa.table(bag.execute("SELECT * FROM bag").read_all())
    with pytest.raises(pa.ArrowNotImplementedError, match="string_view"):
        bag_table.to_pandas()
    df = plain_types(bag_table).to_pandas()
    df = df.loc[df.index.repeat(df["_copies"])].drop(columns="_copies")
    assert _rows(df.itertuples(index=False)) == states[3]["public.bag"]

    # -- polars: its own Delta scanner refuses column mapping; deltalake's QueryBuilder
    # hands it the rows as Arrow (string views and maps as they come).
    import polars as pl

    with pytest.raises(DeltaProtocolError, match="columnMapping"):
        pl.read_delta(kv_path)
    kv = pl.from_arrow(kv_as_of[3])
    assert isinstance(kv, pl.DataFrame)
    assert kv.columns == read_state(root, "public.kv").column_names
    assert _rows(kv.rows()) == states[3]["public.kv"]
    bag_pl = pl.from_arrow(bag_table)
    assert isinstance(bag_pl, pl.DataFrame)
    bag_rows = bag_pl.select(pl.exclude("_copies").repeat_by("_copies")).explode(pl.all())
    assert _rows(bag_rows.rows()) == states[3]["public.bag"]

    # -- Spark: all tables as of one batch, at the versions its commit record names.
    from pyspark.sql import functions as F

    for b in (2, 3):
        rec = lake.read_commit(b)
        for name, t in rec.tables.items():
            df = (
                spark.read.format("delta")
                .option("versionAsOf", t.state_version)
                .load(f"{root}/{t.state}")
            )
            if "_copies" in df.columns:
                df = df.withColumn("_i", F.explode(F.sequence(F.lit(1), "_copies")))
                df = df.drop("_i", "_copies")
            assert _rows(df.collect()) == states[b][name], (b, name)

    # -- DuckDB's delta extension: latest through delta_scan, a batch through ATTACH VERSION.
    con = duckdb_delta()
    scan = con.sql(f"SELECT * FROM delta_scan('{kv_path}')")
    assert scan.columns == read_state(root, "public.kv").column_names
    assert _rows(scan.fetchall()) == states[3]["public.kv"]
    con.execute(f"ATTACH '{kv_path}' AS kv_b2 (TYPE delta, VERSION {kv_v2})")
    assert _rows(con.sql("SELECT * FROM kv_b2").fetchall()) == states[2]["public.kv"]
    assert "txt" in con.sql("SELECT * FROM kv_b2").columns  # the name as of batch 2
    expanded = con.sql(
        f"SELECT t.* EXCLUDE (_copies) FROM delta_scan('{bag_path}') t, range(t._copies)"
    )
    assert _rows(expanded.fetchall()) == states[3]["public.bag"]
