"""REPLICA IDENTITY FULL tables with a primary key: their state is MERGEd by the key
(slotlake.unique_multiset) while it stays unique, and matched whole once it is not."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake import batch as batch_module
from slotlake import delta, dv_merge, unique_multiset
from slotlake.batch import DriverWrites
from slotlake.bootstrap import run_bootstrap
from slotlake.cli import _table_status
from slotlake.lake import Lake
from slotlake.sync import run_sync

from .sync_helpers import assert_mirror, assert_rows_recorded, make_config

# name → (CREATE TABLE's columns, the row of g, a key moved, the key, its column that is g)
TABLES = {
    "public.fi": (
        "id int PRIMARY KEY, v text, big text",
        "g, 'v' || g, CASE WHEN mod(g, 10) = 0 THEN repeat(md5(g::text), 400) END",
        "id = id + 100000",
        ["id"],
        "id",
    ),
    "public.fc": (
        "a bigint, b text, v text, f float8, PRIMARY KEY (a, b)",
        "g, 'b' || mod(g, 7), 'v' || g, CASE WHEN mod(g, 5) = 0 THEN -0.0 ELSE g / 3.0 END",
        "b = b || 'é'",
        ["a", "b"],
        "a",
    ),
    # A key of a type whose values may be kept as text (dates: infinity): no key index,
    # DuckDB's join finds its rows.
    "public.fd": (
        "d date, n int, v text, PRIMARY KEY (d, n)",
        "date '2000-01-01' + mod(g, 50), g, 'v' || g",
        "d = d + 1000",
        ["d", "n"],
        "n",
    ),
}


def _vectors_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every state MERGEd by the driver with deletion vectors, however small."""
    monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
    monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)


def _bootstrap_full_table(
    c: psycopg.Connection, cfg: Any, spark: Any, rows: int, key_type: str = "int"
) -> None:
    """``public.t (id PRIMARY KEY, v text)`` of REPLICA IDENTITY FULL with ``rows`` rows,
    published and bootstrapped."""
    c.execute(f"CREATE TABLE public.t (id {key_type} PRIMARY KEY, v text)")
    c.execute("ALTER TABLE public.t REPLICA IDENTITY FULL")
    c.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, %s) g", (rows,))
    c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    run_bootstrap(cfg, spark=spark)


def _merged_by_key(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tables whose state a MERGE by a unique key wrote (the driver's, or Spark's:
    ``spark:`` and the name), one entry a MERGE."""
    seen: list[str] = []
    real = dv_merge.merge_keyed

    def spy(path: str, rows: Any, cat: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("fresh") is not None:
            seen.append(cat.name)
        return real(path, rows, cat, *args, **kwargs)

    by_spark = batch_module._merge_unique

    def spark_spy(session: Any, lake: Any, cat: Any, *args: Any) -> Any:
        written = by_spark(session, lake, cat, *args)
        seen.append("spark:" + cat.name)
        return written

    monkeypatch.setattr(dv_merge, "merge_keyed", spy)
    monkeypatch.setattr(batch_module, "_merge_unique", spark_spy)
    return seen


def _random_batch(c: psycopg.Connection, rng: random.Random, batch: int) -> None:
    for name, (_, row, moved, key, g_column) in TABLES.items():
        cols = ", ".join(key)
        rows = c.execute(f"SELECT {cols} FROM {name} ORDER BY {cols}").fetchall()
        picked = rng.sample(rows, 40)
        where = " AND ".join(f"{k} = %s" for k in key)
        g_at = key.index(g_column)
        insert_g = f"INSERT INTO {name} SELECT {row} FROM (SELECT %s::int AS g) s"
        with c.transaction():
            for r in picked[:20]:
                c.execute(f"UPDATE {name} SET v = %s WHERE {where}", (f"b{batch}", *r))
            for r in picked[20:28]:
                c.execute(f"DELETE FROM {name} WHERE {where}", r)
            for r in picked[28:32]:  # the key itself moves
                c.execute(f"UPDATE {name} SET {moved} WHERE {where}", r)
            for r in picked[32:36]:  # deleted and inserted again in the batch
                c.execute(f"DELETE FROM {name} WHERE {where}", r)
                c.execute(insert_g, (r[g_at],))
            c.execute(
                f"INSERT INTO {name} SELECT {row} FROM generate_series(%s::int, %s::int) g",
                (1000 * batch, 1000 * batch + 9),
            )
        # A new row, deleted and inserted again in one transaction: its key goes 0→1→0→1.
        with c.transaction():
            c.execute(insert_g, (900 + batch,))
            c.execute(f"DELETE FROM {name} WHERE {g_column} = %s", (900 + batch,))
            c.execute(insert_g, (900 + batch,))


@pytest.mark.parametrize(
    "mode",
    [
        "vectors",
        # The source's part (whole old rows, TOAST) is the same as above's.
        pytest.param("rewritten", marks=pytest.mark.one_pg_version),
        pytest.param("copied by spark", marks=pytest.mark.one_pg_version),
        pytest.param("by spark", marks=pytest.mark.one_pg_version),
    ],
)
def test_full_tables_with_a_key_are_merged_by_it_until_it_breaks(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """Three FULL tables with a primary key (one integer column; a bigint and a text; a
    date and an integer) and a TOASTed column left unchanged by most UPDATEs: batches of updates, deletes, key moves
    and keys deleted and inserted again keep the mirror exact and the state unique on the
    key (``vectors``: MERGEd by the key with deletion vectors; ``rewritten``: a small
    state, the files the keys hit rewritten; ``copied by spark``: the bootstrap's copy
    made by Spark, not grouped, then ``vectors``; ``by spark``: every table copied and
    MERGEd by Spark, as on a lake off the local disk). A TRUNCATE's batch rebuilds the state
    whole, which is checked to be unique still. Then the key is dropped at the source and a
    row's key repeated: the batch is matched whole, the mirror holds both rows, and the
    table is no longer counted unique (its later batches are matched whole too)."""
    if mode != "rewritten":
        _vectors_always(monkeypatch)
    merged = _merged_by_key(monkeypatch)
    root = str(tmp_path / "lake")
    by = ""
    cfg = make_config(pg_dsn, root, slot)
    if mode in ("copied by spark", "by spark"):
        cfg.lake.bootstrap_driver_mb = 0
    if mode == "by spark":
        cfg.lake.driver_write_rows, by = 0, "spark:"
    rng = random.Random(7)
    lake = Lake(root)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name, (columns, row, *_) in TABLES.items():
            c.execute(f"CREATE TABLE {name} ({columns})")
            c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
            c.execute(f"INSERT INTO {name} SELECT {row} FROM generate_series(1, 300) g")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        run_bootstrap(cfg, spark=spark)
        first = lake.last_commit()
        assert first is not None
        assert _table_status(first.tables["public.fi"])["unique_on"] == ["id"]
        assert first.tables["public.fc"].unique_on == ["a", "b"]
        assert first.tables["public.fd"].unique_on == ["d", "n"]
        batches = 1 if mode == "by spark" else 3  # (Spark's jobs cost seconds a table)
        for batch in range(1, batches + 1):
            _random_batch(c, rng, batch)
            result = run_sync(cfg, spark=spark)
            assert result.status == "committed", result
            assert_mirror(c, root, list(TABLES))
            tables = lake.read_commit(result.batch or 0).tables
            assert {n: tables[n].unique_on for n in TABLES} == {n: t[3] for n, t in TABLES.items()}
        assert sorted(set(merged)) == sorted(by + n for n in TABLES), merged
        assert len(merged) == 3 * batches, merged

        with c.transaction():
            c.execute("TRUNCATE public.fc")
            c.execute(
                f"INSERT INTO public.fc SELECT {TABLES['public.fc'][1]} FROM generate_series(1, 60) g"
            )
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, list(TABLES))
        assert lake.read_commit(result.batch or 0).tables["public.fc"].unique_on == ["a", "b"]
        assert len(merged) == 3 * batches  # rebuilt whole, not MERGEd

        # The key dropped, a row's key repeated (another row, and the same row again).
        low, high = c.execute("SELECT min(id), max(id) FROM public.fi").fetchone() or (0, 0)
        c.execute("ALTER TABLE public.fi DROP CONSTRAINT fi_pkey")
        c.execute("INSERT INTO public.fi VALUES (%s, 'twin', NULL)", (low,))
        c.execute("INSERT INTO public.fi SELECT * FROM public.fi WHERE id = %s", (high,))
        c.execute("UPDATE public.fc SET v = 'still unique' WHERE a < 100")
        caplog.set_level(logging.INFO, logger="slotlake.batch")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, list(TABLES))
        tables = lake.read_commit(result.batch or 0).tables
        assert tables["public.fi"].unique_on == []
        if mode == "by spark":  # Spark's MERGE raised from its task; the log says so
            said = [r.getMessage() for r in caplog.records if "not MERGEd by id" in r.getMessage()]
            assert said and "not a fault" in said[0], said
        assert tables["public.fc"].unique_on == ["a", "b"]
        # From now on fi's rows are matched whole: one of two equal rows deleted.
        c.execute(
            "DELETE FROM public.fi WHERE ctid = (SELECT min(ctid) FROM public.fi WHERE id = %s)",
            (high,),
        )
        c.execute("UPDATE public.fi SET v = 'one twin' WHERE id = %s AND v = 'twin'", (low,))
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, list(TABLES))
        assert lake.read_commit(result.batch or 0).tables["public.fi"].unique_on == []
        assert c.execute("SELECT count(*) FROM public.fi WHERE id = %s", (low,)).fetchone() == (2,)

        # A fast default (ADD COLUMN … DEFAULT): the state's rows take it, then the batch's
        # final rows (those from before the ADD too) are MERGEd by the key.
        c.execute("UPDATE public.fc SET v = 'before d' WHERE a BETWEEN 30 AND 40")
        c.execute("ALTER TABLE public.fc ADD COLUMN d int DEFAULT 5")
        c.execute("UPDATE public.fc SET v = 'with d' WHERE a < 30")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, list(TABLES))
        assert lake.read_commit(result.batch or 0).tables["public.fc"].unique_on == ["a", "b"]
        assert merged[-1] == by + "public.fc"
        # Every record counts what its MERGEs (by the key or whole) and copies wrote.
        assert_rows_recorded(root, lake.commit_batches())


@pytest.mark.one_pg_version  # the batch's own events are under test, not the source
def test_a_batch_that_repeats_a_key_in_itself_is_matched_whole(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key dropped and a key inserted twice in one batch (never live in the state):
    the batch's own events break uniqueness, the rows are matched whole and both kept."""
    _vectors_always(monkeypatch)
    broken: list[str] = []
    real = unique_multiset.keyed_rows

    def spy(*args: Any) -> Any:
        try:
            return real(*args)
        except unique_multiset.Broken as exc:
            broken.append(str(exc))
            raise

    monkeypatch.setattr(unique_multiset, "keyed_rows", spy)
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _bootstrap_full_table(c, cfg, spark, 50)
        c.execute("UPDATE public.t SET v = 'w' WHERE id < 5")
        assert run_sync(cfg, spark=spark).status == "committed"
        c.execute("ALTER TABLE public.t DROP CONSTRAINT t_pkey")
        c.execute("INSERT INTO public.t VALUES (77, 'a'), (77, 'b'), (3, 'w')")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, ["public.t"])
        assert broken, "the batch's events were not found to break the key"
        assert Lake(root).read_commit(result.batch or 0).tables["public.t"].unique_on == []


@pytest.mark.one_pg_version  # the lake's upkeep is under test, not the source
def test_maintain_makes_the_key_indexes_of_a_unique_multiset(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``slotlake maintain`` compacts a FULL table kept unique on its key and makes the
    compacted file's key index on that key, which the next batch's MERGE then uses."""
    from slotlake import key_index
    from slotlake.maintain import run_maintain

    from .sync_helpers import key_indexes_made

    _vectors_always(monkeypatch)
    merged = _merged_by_key(monkeypatch)
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _bootstrap_full_table(c, cfg, spark, 500, "bigint")
        for i in range(3):
            c.execute("UPDATE public.t SET v = %s WHERE id %% 7 = %s", (f"w{i}", i))
            assert run_sync(cfg, spark=spark).status == "committed"
        monkeypatch.setattr(key_index, "AHEAD_MIN_ROWS", 1)
        result = run_maintain(cfg, spark=spark)
        assert result.status == "done"
        (state,) = [t for t in result.tables if t.path == "state/public.t"]
        assert state.key_indexes == 1 and state.files_compacted > 1, state
        made = key_indexes_made(monkeypatch)
        c.execute("UPDATE public.t SET v = 'after' WHERE id < 50")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, root, ["public.t"])
        assert merged == ["public.t"] * 4 and not made, (merged, made)


@pytest.mark.one_pg_version  # the lake's exactly-once path is under test, not the source
@pytest.mark.parametrize(
    ("rewritten", "by_spark"),
    [(False, False), (True, False), (False, True)],
    ids=["merged", "rebuilt", "merged by spark"],
)
def test_a_rerun_after_the_tables_were_written_keeps_the_key_if_merged_by_it(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rewritten: bool,
    by_spark: bool,
) -> None:
    """A run killed after its tables' commits and before its commit record: the rerun
    finds the batch written and knows the key still holds when the state's commit was
    the MERGE by it (the driver's, or Spark's); after a whole rebuild (a TRUNCATE's
    batch) it checks the state whole again, as the first attempt did (before 2026-12-05
    the key was forgotten). The mirror is exact either way."""
    from slotlake.sync import FAULT_ENV, InjectedFault

    _vectors_always(monkeypatch)
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    if by_spark:
        cfg.lake.driver_write_rows = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _bootstrap_full_table(c, cfg, spark, 50)
        if rewritten:
            c.execute("TRUNCATE public.t")
            c.execute("INSERT INTO public.t SELECT g, 'again' FROM generate_series(1, 9) g")
        else:
            c.execute("UPDATE public.t SET v = 'w' WHERE id < 5")
        monkeypatch.setenv(FAULT_ENV, "changes_written")
        with pytest.raises(InjectedFault):
            run_sync(cfg, spark=spark)
        monkeypatch.delenv(FAULT_ENV)
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, ["public.t"])
        kept = Lake(root).read_commit(result.batch or 0).tables["public.t"].unique_on
        assert kept == ["id"]


@pytest.mark.one_pg_version  # the lake's copy is under test, not the source
@pytest.mark.parametrize("by", ["driver", "spark"])
@pytest.mark.parametrize("crash", [False, True], ids=["whole", "rerun"])
def test_a_full_table_added_to_the_publication_is_copied_unique_on_its_key(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crash: bool,
    by: str,
) -> None:
    """A FULL table with a primary key added to the publication is copied for a batch
    (a per-table snapshot; a small one re-based on the driver, ``spark``: through
    Spark): its copy is not grouped, the batch's changes after the copy's consistent
    point are applied, the state is found unique on the key and recorded so, and the next
    batch is MERGEd by the key. A FULL table without a key added with it is copied
    grouped, its equal rows counted. ``rerun``: the copy's batch first dies after its
    tables were written, and the rerun finds the key too."""
    from deltalake import DeltaTable

    from slotlake.delta import DRIVER_ENGINE
    from slotlake.sync import FAULT_ENV, InjectedFault

    _vectors_always(monkeypatch)
    merged = _merged_by_key(monkeypatch)
    if by == "spark":  # as before 2026-12-06: every multiset's copy through Spark
        monkeypatch.setattr(
            batch_module, "rebased_on_driver", lambda cat, removes=False: not cat.is_multiset
        )
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    lake = Lake(root)
    tables = ["public.a", "public.f", "public.g"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE public.a (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE public.f (id int PRIMARY KEY, v text)")
        c.execute("ALTER TABLE public.f REPLICA IDENTITY FULL")
        c.execute("INSERT INTO public.f SELECT g, 'v' || g FROM generate_series(1, 300) g")
        c.execute("CREATE TABLE public.g (x int, v text)")
        c.execute("ALTER TABLE public.g REPLICA IDENTITY FULL")
        c.execute("INSERT INTO public.g SELECT g % 7, 'v' FROM generate_series(1, 50) g")
        c.execute("CREATE PUBLICATION pub FOR TABLE public.a")
        run_bootstrap(cfg, spark=spark)
        c.execute("ALTER PUBLICATION pub ADD TABLE public.f, public.g")
        c.execute("UPDATE public.f SET v = 'after the add' WHERE id < 20")
        c.execute("DELETE FROM public.g WHERE ctid = (SELECT min(ctid) FROM public.g WHERE x = 3)")
        c.execute("INSERT INTO public.g VALUES (3, 'v'), (8, NULL)")
        c.execute("INSERT INTO public.a VALUES (1, 'a')")
        if crash:  # every table written, no record: the rerun finds the copy written
            monkeypatch.setenv(FAULT_ENV, "before_commit")
            with pytest.raises(InjectedFault):
                run_sync(cfg, spark=spark)
            monkeypatch.delenv(FAULT_ENV)
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, tables)
        # A rerun finishes the copy's batch, then takes what arrived since.
        record = lake.read_commit(result.resumed or result.batch or 0)
        assert sorted(record.snapshot["tables"]) == ["public.f", "public.g"]
        copied = record.tables["public.f"]
        assert copied.unique_on == ["id"] and copied.state_rows == 300
        grouped = record.tables["public.g"]
        assert grouped.unique_on == [] and grouped.state_rows == 8  # x = 0-6 and (8, NULL)
        # The copy's batch wrote the state last (the next one is not written yet).
        for name in ("public.f", "public.g"):
            last = DeltaTable(f"{root}/{Lake.table_path('state', name)}").history(1)[0]
            assert (last.get("engineInfo") == DRIVER_ENGINE) is (by == "driver"), (name, last)
        c.execute("UPDATE public.f SET v = 'next' WHERE id > 250")
        c.execute("DELETE FROM public.f WHERE id = 7")
        c.execute("UPDATE public.g SET v = 'w' WHERE x = 5")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, tables)
        assert "public.f" in merged
        assert lake.read_commit(result.batch or 0).tables["public.f"].unique_on == ["id"]


@pytest.mark.one_pg_version  # the lake's paths are under test, not the source
def test_a_batch_past_the_drivers_bounds_is_merged_by_spark_by_the_key(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch with more changes than the driver takes goes to Spark, which MERGEs it by
    the key too (the commit says so, for a rerun); the key is kept and the next small
    batch is MERGEd by it on the driver."""
    _vectors_always(monkeypatch)
    merged = _merged_by_key(monkeypatch)
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    cfg.lake.driver_write_rows = 10
    lake = Lake(root)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _bootstrap_full_table(c, cfg, spark, 50)
        c.execute("UPDATE public.t SET v = 'many' WHERE id <= 30")
        c.execute("DELETE FROM public.t WHERE id > 45")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, ["public.t"])
        assert merged == ["spark:public.t"]
        table = lake.read_commit(result.batch or 0).tables["public.t"]
        assert table.unique_on == ["id"]
        state = f"{root}/{table.state}"
        assert unique_multiset.merged_by(state, table.state_version or 0, ["id"])
        # What tells the MERGE made the batch's commit, not an earlier attempt's.
        made = unique_multiset.merged_by_key_text(["id"])
        assert delta.last_commit(spark, state).user_metadata == made
        c.execute("UPDATE public.t SET v = 'few' WHERE id < 4")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed", result
        assert_mirror(c, root, ["public.t"])
        assert merged == ["spark:public.t", "public.t"]
        assert lake.read_commit(result.batch or 0).tables["public.t"].unique_on == ["id"]
