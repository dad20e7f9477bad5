"""Column changes written by the driver (:func:`slotlake.delta.evolve_on_driver`) against
Spark's ALTER TABLE (:func:`slotlake.delta.ensure_table`) on twin tables: the same schema,
the same column mapping ids, and the same rows read back by Spark and by deltalake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from slotlake.delta import (
    DRIVER_ENGINE,
    arrow_append,
    create_on_driver,
    delta_schema,
    ensure_table,
    evolve_on_driver,
    local_version,
)


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])  # type: ignore[arg-type]


IMAGE = _schema(("id", LongType()), ("a", StringType()), ("b", LongType()))
BEFORE = _schema(("id", LongType()), ("a", StringType()), ("b", LongType()), ("_old", IMAGE))
# a → a2 (top level and in the old image), c and d added (d nested: ids inside it), the old
# image gains c; with drop_missing b goes (from the top level only).
AFTER = _schema(
    ("id", LongType()),
    ("a2", StringType()),
    ("c", StringType()),
    ("d", ArrayType(_schema(("x", LongType()), ("y", StringType())))),
    ("_old", _schema(("id", LongType()), ("a2", StringType()), ("c", StringType()))),
)
RENAMES = {"a": "a2"}


def _ids(dtype: Any, prefix: str = "") -> dict[str, tuple[int, bool]]:
    """Field path → (column mapping id, nullable), through structs and arrays."""
    out: dict[str, tuple[int, bool]] = {}
    if isinstance(dtype, ArrayType):
        return _ids(dtype.elementType, prefix + "[]")
    if isinstance(dtype, StructType):
        for f in dtype.fields:
            path = f"{prefix}.{f.name}" if prefix else f.name
            out[path] = (f.metadata["delta.columnMapping.id"], f.nullable)
            out.update(_ids(f.dataType, path))
    return out


def _physical(schema: StructType) -> dict[str, str]:
    return {f.name: f.metadata["delta.columnMapping.physicalName"] for f in schema.fields}


def _twins(tmp_path: Path) -> tuple[str, str]:
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "a": ["one", "two"],
            "b": pa.array([10, 20], pa.int64()),
            "_old": pa.array(
                [{"id": 1, "a": "was one", "b": 9}, None],
                pa.struct([("id", pa.int64()), ("a", pa.string()), ("b", pa.int64())]),
            ),
        }
    )
    paths = []
    for name in ("spark", "driver"):
        path = str(tmp_path / name)
        create_on_driver(path, BEFORE)
        arrow_append(path, rows, "test", 1)
        paths.append(path)
    return paths[0], paths[1]


def _spark_rows(spark, path: str) -> list[Any]:  # type: ignore[no-untyped-def]
    return sorted(spark.read.format("delta").load(path).collect(), key=lambda r: r["id"])


def _deltalake_rows(path: str) -> list[dict[str, Any]]:
    reader = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t ORDER BY id")
    return pa.table(reader.read_all()).to_pylist()


def test_driver_evolution_is_sparks_alter_table(spark, tmp_path: Path) -> None:
    for drop in (False, True):
        spark_path, driver_path = _twins(tmp_path / f"drop_{drop}")
        before = delta_schema(driver_path)
        assert before is not None
        want = AFTER if drop else StructType([*AFTER.fields[:2], BEFORE["b"], *AFTER.fields[2:]])
        ensure_table(spark, spark_path, want, RENAMES, drop_missing=drop)
        assert evolve_on_driver(driver_path, before, want, RENAMES, drop)
        by_spark, by_driver = delta_schema(spark_path), delta_schema(driver_path)
        assert by_spark is not None and by_driver is not None
        assert by_driver.simpleString() == by_spark.simpleString()
        # New columns go last (as ALTER TABLE ADD COLUMNS puts them); the old image keeps
        # every column it had.
        top = ["id", "a2", "_old", "c", "d"] if drop else ["id", "a2", "b", "_old", "c", "d"]
        assert by_driver.fieldNames() == top
        assert by_driver["_old"].dataType.fieldNames() == ["id", "a2", "b", "c"]
        # Spark numbers new columns on from maxColumnId, depth-first: so does the driver.
        assert _ids(by_driver) == _ids(by_spark)
        conf = (DeltaTable(p).metadata().configuration for p in (spark_path, driver_path))
        assert next(conf) == next(conf)
        # A renamed column keeps its physical name (its data), a new one gets its own.
        kept, now = _physical(before), _physical(by_driver)
        assert now["a2"] == kept["a"] and now["id"] == kept["id"]
        assert now["c"] not in kept.values()
        # One commit for the whole change, by the driver (Spark's took one per ALTER).
        assert local_version(driver_path) == 2
        entry = {
            k: v
            for line in (Path(driver_path) / "_delta_log" / f"{2:020d}.json")
            .read_text()
            .splitlines()
            for k, v in json.loads(line).items()
        }
        assert entry["commitInfo"]["engineInfo"] == DRIVER_ENGINE
        params = entry["commitInfo"]["operationParameters"]
        assert json.loads(params["renamed"]) == RENAMES
        assert json.loads(params["dropped"]) == (["b"] if drop else [])
        assert json.loads(params["added"]) == ["c", "d"]
        assert local_version(spark_path) > 2
        # Both engines read the same rows from both tables: the old rows under the new
        # names, new columns empty, the dropped column gone.
        assert _spark_rows(spark, driver_path) == _spark_rows(spark, spark_path)
        got = _deltalake_rows(driver_path)
        assert got == _deltalake_rows(spark_path)
        assert [r["a2"] for r in got] == ["one", "two"]
        assert got[0]["_old"] == {"id": 1, "a2": "was one", "b": 9, "c": None}
        assert all(r["c"] is None and r["d"] is None for r in got)
        assert ("b" in got[0]) is not drop
        # And the table takes Spark's writes under its new schema.
        old = (3, "was three", 29, "old c")
        spark.createDataFrame(
            [(3, "three", old, "new", [(1, "x")])]
            if drop
            else [(3, "three", 30, old, "new", [(1, "x")])],
            by_driver,
        ).write.format("delta").mode("append").save(driver_path)
        last = _deltalake_rows(driver_path)[-1]
        assert last["c"] == "new" and last["d"] == [{"x": 1, "y": "x"}]
        assert last["_old"] == {"id": 3, "a2": "was three", "b": 29, "c": "old c"}


def test_changes_the_driver_leaves_to_spark(tmp_path: Path) -> None:
    """A changed type needs its values rewritten, a timestamp_ntz column a protocol
    feature the table lacks: nothing is written, the caller asks Spark."""
    path = str(tmp_path / "t")
    base = _schema(("id", LongType()), ("a", StringType()))
    create_on_driver(path, base)
    current = delta_schema(path)
    assert current is not None
    retyped = _schema(("id", StringType()), ("a", StringType()))
    assert not evolve_on_driver(path, current, retyped, {}, False)
    ntz = _schema(("id", LongType()), ("a", StringType()), ("t", TimestampNTZType()))
    assert not evolve_on_driver(path, current, ntz, {}, False)
    assert local_version(path) == 0
    # A table whose protocol names a writer feature with rules for every commit (row
    # tracking here, as another engine may have enabled it) is left to Spark as well.
    features = ["columnMapping", "deletionVectors"]
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": features,
        "writerFeatures": [*features, "domainMetadata", "rowTracking"],
    }
    (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").write_text(
        json.dumps({"commitInfo": {"operation": "SET TBLPROPERTIES"}})
        + "\n"
        + json.dumps({"protocol": protocol})
        + "\n"
    )
    added = _schema(("id", LongType()), ("a", StringType()), ("b", StringType()))
    assert not evolve_on_driver(path, current, added, {}, False)
    assert local_version(path) == 1


def _config(dsn: str, lake: str, slot: str, path: str) -> Any:
    """A sync's config; ``path`` "spark": every table through Spark."""
    from .sync_helpers import make_config

    cfg = make_config(dsn, lake, slot)
    if path == "spark":
        cfg.lake.driver_write_rows = 0
    return cfg


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_drop_add_and_rename_in_one_transaction(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """ADD, RENAME and DROP COLUMN in one transaction leave as many columns, each changed
    one of the same type at the same place: the Relation messages alone read renames that
    did not happen. The attnums (bootstrap's, then each batch's catalog) tell them apart,
    in the first batch after the bootstrap and in later ones, on either writer."""
    import psycopg

    from slotlake.bootstrap import run_bootstrap
    from slotlake.lake import Lake, read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, a text, b text)")
        c.execute("INSERT INTO t SELECT g, 'v', 'a' || g, 'b' || g FROM generate_series(1, 6) g")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        run_bootstrap(cfg, spark=spark)
        boot = Lake(lake).last_commit()
        assert boot is not None and boot.tables["public.t"].natts == 4  # relnatts, recorded
        for step, (drop, rename, new) in enumerate((("a", "b", "c"), ("c", "b2", "d"))):
            with c.transaction():
                c.execute(f"ALTER TABLE t ADD COLUMN {new} text")
                c.execute(f"ALTER TABLE t RENAME COLUMN {rename} TO {rename}2")
                c.execute(f"ALTER TABLE t DROP COLUMN {drop}")
                c.execute(f"UPDATE t SET {new} = 'new' || id WHERE id > 4")
            c.execute("UPDATE t SET v = 'later' WHERE id = 1")
            assert run_sync(cfg, spark=spark).status == "committed", step
            assert_mirror(c, lake, ["public.t"])
        rec = Lake(lake).last_commit()
        assert rec is not None
        assert rec.tables["public.t"].natts == 6  # two ADDs since, dropped columns counted
        assert [col[0] for col in rec.tables["public.t"].columns if col[2] == "state"] == [
            "id",
            "v",
            "b22",
            "d",
        ]
        # The change log kept the old values under the column's latest name.
        logged = {r["id"]: r["b22"] for r in read_changes(lake, "public.t").to_pylist()}
        assert logged[1] == "b1" and logged[5] == "b5"


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_a_name_moved_after_the_tables_last_change(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """A row, ``ADD c DEFAULT 7``, then ``c`` and ``r`` swapped, no change of the table
    after (the random workload's seed 9202, with the DDL capture trigger): the name ``r``
    is on the added column at the target, and was taken for the row's Relation message
    too, so the swap read as no rename at all: the state's ``c`` was NULL and its ``r``
    kept the lake's values. The hand-on (``c → r`` for a keyed table and a multiset)
    reaches the state in that batch, the added column's fast default too."""
    import psycopg

    from slotlake import ddl
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    names = ["t", "m"] if path == "driver" else ["t"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        ddl.install(c)
        for name in names:
            key = " PRIMARY KEY" if name == "t" else ""
            c.execute(f"CREATE TABLE {name} (id int{key}, v text, r int DEFAULT 7)")
            if not key:
                c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for name in names:
            c.execute(f"INSERT INTO {name} SELECT g, 'v', g FROM generate_series(1, 5) g")
        run_sync(cfg, spark=spark)
        for name in names:
            c.execute(f"INSERT INTO {name} VALUES (10, 'a', 1)")
            c.execute(f"ALTER TABLE {name} ADD COLUMN c int DEFAULT 7")
            with c.transaction():
                c.execute(f"ALTER TABLE {name} RENAME COLUMN c TO tmp")
                c.execute(f"ALTER TABLE {name} RENAME COLUMN r TO c")
                c.execute(f"ALTER TABLE {name} RENAME COLUMN tmp TO r")
        run_sync(cfg, spark=spark)
        tables = [f"public.{n}" for n in names]
        assert_mirror(c, lake, tables)
        for name in names:
            c.execute(f"UPDATE {name} SET v = 'b' WHERE id = 2")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, tables)


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_column_changes_after_a_tables_last_change(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """pgoutput describes a table only before a change of it: columns added (a fast
    default among them), renamed and dropped after a table's last change of a batch, or
    in a batch without any, reach the state in that batch anyway (the catalog read with
    the target), the change log gets no row for it, and a later batch neither repeats
    nor undoes them."""
    import psycopg

    from slotlake.lake import Lake, read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    tables = ["public.t", "public.q", "public.m"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, w text)")
        c.execute("CREATE TABLE q (id int PRIMARY KEY, v text, w text)")
        c.execute("CREATE TABLE m (a int, b text)")
        c.execute("ALTER TABLE m REPLICA IDENTITY FULL")
        c.execute("CREATE TABLE other (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for t in ("t", "q"):
            c.execute(f"INSERT INTO {t} SELECT g, 'v' || g, 'w' || g FROM generate_series(1, 5) g")
        c.execute("INSERT INTO m VALUES (1, 'x'), (1, 'x'), (2, 'y')")
        run_sync(cfg, spark=spark)
        # t changes, then its columns; q and m only get column changes.
        c.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        c.execute("ALTER TABLE t ADD COLUMN c int DEFAULT 7")
        c.execute("ALTER TABLE t RENAME COLUMN v TO v2")
        c.execute("ALTER TABLE t DROP COLUMN w")
        c.execute("ALTER TABLE t ADD COLUMN d text")
        c.execute("ALTER TABLE q ADD COLUMN e text DEFAULT 'x'")
        c.execute("ALTER TABLE q RENAME COLUMN w TO w2")
        c.execute("ALTER TABLE m ADD COLUMN f int DEFAULT 1")
        c.execute("INSERT INTO other VALUES (1)")
        result = run_sync(cfg, spark=spark)
        assert {"public.t", "public.q", "public.m"} <= set(result.tables)
        assert_mirror(c, lake, tables)
        rec = Lake(lake).last_commit()
        assert rec is not None
        state = {
            n: [col[0] for col in t.columns if col[2] == "state"] for n, t in rec.tables.items()
        }
        assert state["public.t"] == ["id", "v2", "c", "d"]
        assert state["public.q"] == ["id", "v", "w2", "e"]
        assert state["public.m"] == ["a", "b", "f"]
        assert rec.tables["public.q"].change_rows == 0 and rec.tables["public.m"].change_rows == 0
        # The renamed column's older values in the change log, under the latest name.
        assert {r["id"]: r["v2"] for r in read_changes(lake, "public.t").to_pylist()}[
            1
        ] == "changed"
        # A later batch: the same shapes come in Relation messages now; nothing is applied
        # twice, and tables without changes are not written at all.
        c.execute("UPDATE t SET d = 'dd' WHERE id = 2")
        c.execute("UPDATE q SET v = 'again' WHERE id = 3")
        c.execute("INSERT INTO m VALUES (3, 'z', 9)")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, tables)
        c.execute("INSERT INTO other VALUES (2)")
        assert set(run_sync(cfg, spark=spark).tables) == {"public.other"}
        assert_mirror(c, lake, tables)


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_renames_that_chain_and_reuse_a_name_in_one_batch(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """``a → b``, then ``c → a`` (a name given up and taken again), then ``b → b2`` (a
    chain), changes between each: every column keeps its own values in the state and
    the change log, whichever writer evolves the tables. (Found by test_sync_random: a
    chain's older rows lost their values; a reused name took the other column's.) A
    multiset's chain ends after its last change: its prior rows are read under the lake's
    name, not the middle one (they kept NULL there, and its DELETE matched no row)."""
    import psycopg

    from slotlake.lake import Lake, read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, a text, c text, v text)")
        c.execute("CREATE TABLE m (id int, x int, v text)")
        c.execute("ALTER TABLE m REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t SELECT g, 'a' || g, 'c' || g, 'v' FROM generate_series(1, 5) g")
        c.execute("INSERT INTO m SELECT g, g, 'v' FROM generate_series(1, 3) g")
        run_sync(cfg, spark=spark)
        c.execute("ALTER TABLE m RENAME COLUMN x TO x1")
        c.execute("UPDATE m SET v = 'u' WHERE id = 1")
        c.execute("DELETE FROM m WHERE id = 2")
        c.execute("ALTER TABLE m RENAME COLUMN x1 TO x2")
        c.execute("INSERT INTO t VALUES (6, 'a6', 'c6', 'v')")
        c.execute("UPDATE t SET v = 'x' WHERE id = 1")
        c.execute("ALTER TABLE t RENAME COLUMN a TO b")
        c.execute("UPDATE t SET v = 'y' WHERE id = 2")
        c.execute("ALTER TABLE t RENAME COLUMN c TO a")
        c.execute("UPDATE t SET v = 'z' WHERE id = 3")
        c.execute("ALTER TABLE t RENAME COLUMN b TO b2")
        c.execute("UPDATE t SET v = 'w' WHERE id = 4")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t", "public.m"])
        rec = Lake(lake).last_commit()
        assert rec is not None
        columns = rec.tables["public.t"].columns
        assert [col[0] for col in columns if col[2] == "state"] == ["id", "b2", "a", "v"]
        logged = {
            (r["id"], r["v"]): (r["b2"], r["a"]) for r in read_changes(lake, "public.t").to_pylist()
        }
        # Each image under the version in force then, its values under the latest names.
        for key, id_ in ((("x", 1)), ("y", 2), ("z", 3), ("w", 4)):
            assert logged[(id_, key)] == (f"a{id_}", f"c{id_}"), (id_, key)
        assert logged[(6, "v")] == ("a6", "c6")
        c.execute("UPDATE t SET v = 'later' WHERE id = 5")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])


def _handed_on_setup(c: Any, slot: str, names: list[str]) -> None:
    """Keyed tables whose text columns are stored out of line (an UPDATE of ``v`` leaves
    them unchanged TOAST, filled from the prior state) and multisets (``…m``), published,
    a slot, five rows each."""
    for name in names:
        keyed = not name.endswith("m")
        key = " PRIMARY KEY" if keyed else ""
        c.execute(f"CREATE TABLE {name} (id int{key}, a text, c text, v text)")
        if not keyed:
            c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        for col in ("a", "c"):
            c.execute(f"ALTER TABLE {name} ALTER COLUMN {col} SET STORAGE EXTERNAL")
    c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    for name in names:
        c.execute(
            f"INSERT INTO {name} SELECT g, repeat('a' || g, 1500), repeat('c' || g, 1500), 'v' "
            "FROM generate_series(1, 5) g"
        )


def _hand_on_and_swap(c: Any, names: list[str]) -> None:
    """``a → b``, ``c → a`` in h and hm; a swap of a and c through a third name in s and sm;
    no change of the table between the ALTERs, so one Relation message shows them all."""
    for name in names:
        if name.startswith("h"):
            c.execute(f"ALTER TABLE {name} RENAME COLUMN a TO b")
            c.execute(f"ALTER TABLE {name} RENAME COLUMN c TO a")
        else:
            with c.transaction():
                c.execute(f"ALTER TABLE {name} RENAME COLUMN a TO tmp")
                c.execute(f"ALTER TABLE {name} RENAME COLUMN c TO a")
                c.execute(f"ALTER TABLE {name} RENAME COLUMN tmp TO c")
        c.execute(f"UPDATE {name} SET v = 'x' WHERE id = 1")


# Through Spark the keyed tables only: each table there is a chain of Spark jobs.
HANDED_ON = {"driver": ["h", "s", "hm", "sm"], "spark": ["h", "s"]}
# (path, a flag): the driver with it off and on, Spark (slower) with it off.
DRIVER_BOTH_SPARK_ONE = [
    ("driver", False),
    ("driver", True),
    pytest.param("spark", False, marks=pytest.mark.one_pg_version),
]


@pytest.mark.parametrize(("path", "trigger"), DRIVER_BOTH_SPARK_ONE)
def test_names_handed_on_or_swapped_in_one_step(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str, trigger: bool
) -> None:
    """``a → b`` then ``c → a``, and a swap through a third name, with no change between
    the ALTERs: one Relation message shows a name both before and after on another
    column, which names alone read as no rename at all (found in session 31: the state's
    unchanged rows kept the other column's values, and an unchanged TOAST value was
    filled from the wrong column). The attnums (the target's catalog, the trigger's
    reports) tell them; a swap is one change of the lake's schema."""
    import psycopg

    from slotlake import ddl
    from slotlake.lake import read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        if trigger:
            ddl.install(c)
        names = HANDED_ON[path]
        tables = [f"public.{n}" for n in names]
        _handed_on_setup(c, slot, names)
        run_sync(cfg, spark=spark)
        _hand_on_and_swap(c, names)
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, tables)
        for name, first, second in (("h", "b", "a"), ("s", "c", "a")):
            logged = [r for r in read_changes(lake, f"public.{name}").to_pylist() if r["v"] == "x"]
            assert len(logged) == 1, logged
            # The UPDATE's image under the latest names, its unchanged TOAST filled.
            assert logged[0][first] == "a1" * 1500 and logged[0][second] == "c1" * 1500
        c.execute("UPDATE h SET v = 'y' WHERE id = 2")
        c.execute(f"DELETE FROM {names[-1]} WHERE id = 3")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, tables)


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_a_swap_is_made_once_when_its_batch_runs_again(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run killed after the tables' schemas took the swap, before their data: names
    alone cannot tell the swap done, so the evolution carries a transaction of its own
    and the rerun does not swap the names back."""
    import psycopg

    from slotlake import batch, local_table
    from slotlake.delta import delta_schema, renames_done
    from slotlake.lake import STATE, Lake, local_path
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    names = ["s", "sm"] if path == "driver" else ["s"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _handed_on_setup(c, slot, names)
        run_sync(cfg, spark=spark)
        _hand_on_and_swap(c, names)
        first = Lake(lake).last_commit()
        assert first is not None

        def killed(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("killed before the change log's append")

        target = (local_table, "arrow_append") if path == "driver" else (batch, "append")
        with monkeypatch.context() as m:
            m.setattr(*target, killed)
            with pytest.raises(RuntimeError, match="killed before"):
                run_sync(cfg, spark=spark)
        state = str(local_path(Lake(lake).path(Lake.table_path(STATE, "public.s"))))
        swapped = delta_schema(state)
        assert swapped is not None and swapped.fieldNames()[:3] == ["id", "c", "a"]
        app_id = Lake(lake).app_id()
        assert renames_done(state, (f"{app_id}.renames", first.batch + 1))
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, [f"public.{n}" for n in names])
        again = delta_schema(state)
        assert again is not None and again.fieldNames() == swapped.fieldNames()


def _without_open_source_delta_log(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Databricks Runtime: its Delta classes are not open-source Delta's, so nothing may
    ask the JVM for a DeltaLog. Returns the versions then read from the log (None: the
    latest), filled as the test runs."""
    from slotlake import delta, delta_log_hadoop

    def unused(*_: Any) -> Any:
        raise AssertionError("the JVM's DeltaLog read without the class")

    monkeypatch.setattr(delta, "has_open_source_delta_log", lambda _: False)
    monkeypatch.setattr(delta, "jvm_snapshot", unused)
    monkeypatch.setattr(delta, "_commit_from_log", unused)
    read = delta_log_hadoop.metadata
    versions: list[int | None] = []

    def counted(spark: Any, path: str, version: int | None = None) -> Any:
        versions.append(version)
        return read(spark, path, version)

    monkeypatch.setattr(delta_log_hadoop, "metadata", counted)
    return versions


@pytest.mark.one_pg_version
@pytest.mark.parametrize("runtime", ["open-source", "databricks"])
def test_a_swap_by_sparks_alters_is_finished_by_the_rerun(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime: str,
) -> None:
    """Where the driver does not make the swap (a lake on HDFS or an object store), Spark's
    ALTERs make it, one column per commit. A run killed between two of them leaves the
    change log's names half swapped; the rerun finishes the swap by physical name, from
    the plan stored before the first rename, instead of undoing it or renaming by name.
    ``databricks``: the plan and the names read from the log, not the JVM's DeltaLog."""
    import psycopg
    from pyspark.sql import SparkSession

    from slotlake import batch
    from slotlake.delta import delta_schema
    from slotlake.lake import CHANGES, Lake, local_path, read_changes
    from slotlake.swap_alters import PLAN_PROPERTY, TEMP_PREFIX
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, "spark")
    monkeypatch.setattr(batch, "swaps_on_driver", lambda lake: False)
    from_log = _without_open_source_delta_log(monkeypatch) if runtime == "databricks" else []
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _handed_on_setup(c, slot, ["s"])
        run_sync(cfg, spark=spark)
        _hand_on_and_swap(c, ["s"])
        sql = SparkSession.sql
        seen: list[str] = []

        def killed_after_two_renames(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if PLAN_PROPERTY in query or (seen and "RENAME COLUMN" in query):
                seen.append(query)
                if len(seen) == 4:
                    raise RuntimeError("killed between two ALTERs")
            return sql(self, query, *args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(SparkSession, "sql", killed_after_two_renames)
            with pytest.raises(RuntimeError, match="killed between"):
                run_sync(cfg, spark=spark)
        path = str(local_path(Lake(lake).path(Lake.table_path(CHANGES, "public.s"))))
        half = delta_schema(path)
        assert half is not None
        # Two of the three renames: one column under the temporary name, one under its
        # final name (which of the two went first is the order of their physical names).
        assert f"{TEMP_PREFIX}0" in half.fieldNames()[1:3], half.fieldNames()
        assert set(half.fieldNames()[1:3]) & {"a", "c"}, half.fieldNames()
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.s"])
        done = delta_schema(path)
        assert done is not None and done.fieldNames()[:3] == ["id", "c", "a"]
        assert done["_old"].dataType.fieldNames()[:3] == ["id", "c", "a"]
        logged = read_changes(lake, "public.s").to_pylist()
        updated = [(r["c"], r["a"]) for r in logged if r["v"] == "x"]
        assert updated == [("a1" * 1500, "c1" * 1500)]
        # The first batch's insert: its values moved with their columns.
        assert [(r["c"], r["a"]) for r in logged if r["id"] == 2] == [("a2" * 1500, "c2" * 1500)]
        c.execute("UPDATE s SET v = 'y' WHERE id = 2")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.s"])
    if runtime == "databricks":
        assert None in from_log  # the swap's plan and names (the lake's schemas: on disk)


def _columns_a_and_c(c: Any, slot: str, typ: str) -> None:
    """Table t (id, a, c, v) of five rows, published, and a slot: a and c of ``typ``
    (text: ``a1`` / ``c1``, …; int: 1 / 101, …)."""
    c.execute(f"CREATE TABLE t (id int PRIMARY KEY, a {typ}, c {typ}, v text)")
    c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    values = "'a' || g, 'c' || g" if typ == "text" else "g, 100 + g"
    c.execute(f"INSERT INTO t SELECT g, {values}, 'v' FROM generate_series(1, 5) g")


def _text_columns_synced(c: Any, cfg: Any, slot: str, spark: Any, trigger: bool = False) -> None:
    """:func:`_columns_a_and_c` of text (with the DDL capture trigger if asked), synced,
    then row 2 changed (``v = 'before'``) in the next batch."""
    from slotlake import ddl
    from slotlake.sync import run_sync

    if trigger:
        ddl.install(c)
    _columns_a_and_c(c, slot, "text")
    run_sync(cfg, spark=spark)
    c.execute("UPDATE t SET v = 'before' WHERE id = 2")


@pytest.mark.one_pg_version
def test_a_swap_beside_a_type_change(pg_dsn: str, slot: str, spark: Any, tmp_path: Path) -> None:
    """A swap through a third name in the transaction that widens one of the two columns:
    the driver moves the names (one entry, its marker), then Spark rewrites the widened
    column's values, which Spark's one-column-at-a-time ALTERs could not have swapped."""
    import psycopg

    from slotlake.lake import STATE, Lake, local_path
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, "driver")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _columns_a_and_c(c, slot, "int")
        run_sync(cfg, spark=spark)
        with c.transaction():
            c.execute("ALTER TABLE t ALTER COLUMN a TYPE bigint")
            c.execute("ALTER TABLE t RENAME COLUMN a TO tmp")
            c.execute("ALTER TABLE t RENAME COLUMN c TO a")
            c.execute("ALTER TABLE t RENAME COLUMN tmp TO c")
        c.execute("UPDATE t SET v = 'x' WHERE id = 1")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        state = delta_schema(str(local_path(Lake(lake).path(Lake.table_path(STATE, "public.t")))))
        assert state is not None
        assert [(f.name, f.dataType.simpleString()) for f in state.fields][:3] == [
            ("id", "int"),
            ("c", "bigint"),
            ("a", "int"),
        ]
        c.execute("UPDATE t SET v = 'w' WHERE id = 3")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])


def test_timestamp_and_timestamptz_changed_into_each_other_keep_their_instants(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path
) -> None:
    """``ALTER COLUMN … TYPE timestamptz`` of a timestamp column (or back) in a session at
    UTC rewrites nothing: every row reads as its wall clock at UTC. The lake's column
    takes the new type with the values cast under UTC, changes of either type in one
    batch included. Before, the column became string and the earlier values kept the
    old type's text ('2020-01-01 11:00:00', where the source reads '…+00'). In another
    zone PostgreSQL rewrites the table, which is copied by the same run. (The Delta
    tables' rewrite with the column cast is Spark's on either writer; Spark's replay of
    the batch passed too, and was left out to save the suite a minute.)"""
    import psycopg

    from slotlake.bootstrap import run_bootstrap
    from slotlake.lake import Lake, read_state
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, "driver")
    tables = ["public.u", "public.z"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name in ("u", "z"):
            c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, ts timestamp, tz timestamptz)")
            c.execute(
                f"INSERT INTO {name} SELECT g, '2020-01-01 10:00'::timestamp + g * interval '1h', "
                "'2020-01-01 10:00+00'::timestamptz + g * interval '1h' FROM generate_series(1, 4) g"
            )
        c.execute("CREATE PUBLICATION pub FOR TABLE u, z")
        run_bootstrap(cfg)
        c.execute("INSERT INTO u VALUES (9, '2021-01-01', '2021-01-01 03:00+00')")
        c.execute("INSERT INTO z VALUES (9, '2021-01-01', '2021-01-01 03:00+00')")
        run_sync(cfg, spark=spark)
        c.execute("INSERT INTO u VALUES (10, '2021-02-01', '2021-02-01 03:00+00')")
        c.execute("SET TimeZone = 'UTC'")
        node = c.execute("SELECT relfilenode FROM pg_class WHERE relname = 'u'").fetchone()
        c.execute("ALTER TABLE u ALTER COLUMN ts TYPE timestamptz, ALTER COLUMN tz TYPE timestamp")
        c.execute("SET TimeZone = 'Asia/Tokyo'")  # a rewrite: 10:00 there is 01:00 at UTC
        c.execute("ALTER TABLE z ALTER COLUMN ts TYPE timestamptz")
        c.execute("RESET TimeZone")
        assert c.execute("SELECT relfilenode FROM pg_class WHERE relname = 'u'").fetchone() == node
        c.execute("INSERT INTO u VALUES (11, '2022-01-01 05:00+00', '2022-01-01 05:00')")
        c.execute("UPDATE u SET tz = tz + interval '1 minute' WHERE id = 1")
        c.execute("UPDATE z SET tz = tz + interval '1 minute' WHERE id = 1")
        result = run_sync(cfg, spark=spark)
        assert result.batch is not None
        copied = {
            name
            for b in range(result.followed or result.batch, result.batch + 1)
            for name in Lake(lake).read_commit(b).snapshot.get("tables", {})
        }
        assert copied == {"public.z"}
        schema = read_state(lake, "public.u").schema
        assert str(schema.field("ts").type) == "timestamp[us, tz=UTC]"
        assert str(schema.field("tz").type) == "timestamp[us]"
        assert_mirror(c, lake, tables)


@pytest.mark.parametrize(("path", "between"), DRIVER_BOTH_SPARK_ONE)
def test_a_dropped_columns_name_taken_by_a_rename(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str, between: bool
) -> None:
    """``DROP COLUMN a``, then ``RENAME COLUMN c TO a`` (one column replacing another),
    in one step or with a change between, after a row changed under both: the dropped
    column's latest name is ``a__dropped`` (found in session 31: the state's unchanged
    rows kept the dropped column's values under ``a``, and a row decoded under both
    columns put two values in one place and failed the batch)."""
    import psycopg

    from slotlake.lake import read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _text_columns_synced(c, cfg, slot, spark)
        c.execute("ALTER TABLE t DROP COLUMN a")
        if between:
            c.execute("UPDATE t SET v = 'q' WHERE id = 4")
        c.execute("ALTER TABLE t RENAME COLUMN c TO a")
        c.execute("UPDATE t SET v = 'x' WHERE id = 1")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        # Each column's values under its latest name, the first batch's rows too.
        logged = {(r["id"], r["v"]): r for r in read_changes(lake, "public.t").to_pylist()}
        for key, dropped, taken in (((3, "v"), "a3", "c3"), ((2, "before"), "a2", "c2")):
            assert (logged[key]["a__dropped"], logged[key]["a"]) == (dropped, taken)
        assert (logged[(1, "x")]["a__dropped"], logged[(1, "x")]["a"]) == (None, "c1")
        c.execute("UPDATE t SET v = 'w' WHERE id = 3")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        # The same migration again, a later batch: the state has no a__dropped, the change
        # log has (the random workload's seed 9406: the second replacement took the name
        # a__dropped again, the renames found their names taken and every rerun failed).
        c.execute("ALTER TABLE t ADD COLUMN e text")
        c.execute("UPDATE t SET e = 'e' || id")
        run_sync(cfg, spark=spark)
        c.execute("UPDATE t SET v = 'again' WHERE id = 5")
        c.execute("ALTER TABLE t DROP COLUMN a")
        c.execute("ALTER TABLE t RENAME COLUMN e TO a")
        c.execute("UPDATE t SET v = 'y' WHERE id = 1")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        logged = {(r["id"], r["v"]): r for r in read_changes(lake, "public.t").to_pylist()}
        row = logged[(5, "again")]
        assert (row["a__dropped"], row["a__dropped2"], row["a"]) == (None, "c5", "e5")


@pytest.mark.parametrize(("path", "trigger"), DRIVER_BOTH_SPARK_ONE)
@pytest.mark.parametrize("later", [False, True], ids=["one batch", "later batch"])
def test_a_dropped_columns_name_taken_by_another_type(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str, trigger: bool, later: bool
) -> None:
    """``DROP COLUMN a`` (text) and ``ADD COLUMN a int DEFAULT 7``, in one batch or the
    ADD in a later one: the new ``a`` is an int column in the state and the change log,
    the dropped one's values stay under ``a__dropped`` (found by the random workload's
    seed 10004: shared, the column became text; with the ADD in a later batch the change
    log's ``a`` was cast to int and every rerun of the batch failed). Then a column
    renamed to a name only the change log still has (``a`` dropped again, ``RENAME c TO
    a``): the change log's ``a`` moves to ``a__dropped2``; and once more with the
    renamed column dropped in the same batch."""
    import psycopg

    from slotlake.lake import read_changes, read_state
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _text_columns_synced(c, cfg, slot, spark, trigger)
        c.execute("ALTER TABLE t DROP COLUMN a")
        if later:
            c.execute("UPDATE t SET v = 'gone' WHERE id = 3")
            run_sync(cfg, spark=spark)
            assert_mirror(c, lake, ["public.t"])
        c.execute("ALTER TABLE t ADD COLUMN a int DEFAULT 7")
        c.execute("UPDATE t SET a = 40, v = 'new' WHERE id = 4")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        assert str(read_state(lake, "public.t").schema.field("a").type) == "int32"
        changes = read_changes(lake, "public.t")
        assert str(changes.schema.field("a").type) == "int32"
        logged = {(r["id"], r["v"]): r for r in changes.to_pylist()}
        assert (logged[(2, "before")]["a__dropped"], logged[(2, "before")]["a"]) == ("a2", None)
        assert (logged[(4, "new")]["a__dropped"], logged[(4, "new")]["a"]) == (None, 40)
        c.execute("ALTER TABLE t DROP COLUMN a")
        run_sync(cfg, spark=spark)
        c.execute("ALTER TABLE t RENAME COLUMN c TO a")
        c.execute("UPDATE t SET v = 'last' WHERE id = 5")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        logged = {(r["id"], r["v"]): r for r in read_changes(lake, "public.t").to_pylist()}
        assert (logged[(5, "last")]["a__dropped2"], logged[(5, "last")]["a"]) == (None, "c5")
        assert (logged[(4, "new")]["a__dropped2"], logged[(4, "new")]["a"]) == (40, "c4")
        # A column renamed to such a name and dropped in the same batch (seed 10703: its
        # values, logged under a, met the change log's text a as bigint, every rerun failed).
        c.execute("ALTER TABLE t DROP COLUMN a")
        c.execute("ALTER TABLE t ADD COLUMN e bigint")
        c.execute("UPDATE t SET e = id * 1000")
        run_sync(cfg, spark=spark)
        c.execute("ALTER TABLE t RENAME COLUMN e TO a")
        c.execute("UPDATE t SET v = 'brief' WHERE id = 1")
        c.execute("ALTER TABLE t DROP COLUMN a")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        rows = sorted(read_changes(lake, "public.t").to_pylist(), key=lambda r: r["_lsn"])
        fives = [(r["a__dropped3"], r["a"]) for r in rows if (r["id"], r["v"]) == (5, "last")]
        assert fives == [("c5", None), (None, 5000)]  # RENAME c TO a's batch, then SET e
        briefly = [(r["a__dropped3"], r["a"]) for r in rows if r["v"] == "brief"]
        assert briefly == [(None, 1000)]


@pytest.mark.parametrize(
    ("case", "path"),
    [
        ("replaced again", "driver"),
        ("another type", "driver"),
        ("renamed to it", "driver"),
        pytest.param("another type", "spark", marks=pytest.mark.one_pg_version),
        pytest.param("renamed to it", "spark-hdfs", marks=pytest.mark.one_pg_version),
        pytest.param("another type", "spark-hdfs-databricks", marks=pytest.mark.one_pg_version),
    ],
)
def test_a_dropped_columns_own_name_is_kept_by_the_rerun(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    case: str,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run killed after the change log moved a dropped column to its own name
    (``a__dropped…``), before the batch's data: the rerun finds that name taken and the
    change log's ``a`` already the new column's, and must not move it again (it did, and
    the state's new ``a`` was dropped and added again empty). ``spark-hdfs``: the lake
    taken for one off local disk, whose schemas are read through Spark's JVM;
    ``-databricks``: a runtime without open-source Delta's DeltaLog, whose schemas are
    read from the log itself."""
    import psycopg

    from slotlake import batch, local_table
    from slotlake.lake import Lake

    databricks = path.endswith("-databricks")
    from_log: list[int | None] = []
    if path.startswith("spark-hdfs"):
        monkeypatch.setattr(Lake, "on_local_disk", property(lambda self: False))
        if databricks:
            from_log = _without_open_source_delta_log(monkeypatch)
        path = "spark"
    from slotlake.lake import read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _text_columns_synced(c, cfg, slot, spark)
        c.execute("ALTER TABLE t DROP COLUMN a")
        if case == "replaced again":
            c.execute("ALTER TABLE t RENAME COLUMN c TO a")
            run_sync(cfg, spark=spark)
            c.execute("ALTER TABLE t ADD COLUMN c text")
            c.execute("UPDATE t SET c = 'n' || id")
            run_sync(cfg, spark=spark)
            c.execute("ALTER TABLE t DROP COLUMN a")
            c.execute("ALTER TABLE t RENAME COLUMN c TO a")
            own, value = "a__dropped2", "c4"
        elif case == "another type":
            c.execute("ALTER TABLE t ADD COLUMN a int DEFAULT 7")
            own, value = "a__dropped", "a4"
        else:
            run_sync(cfg, spark=spark)
            c.execute("ALTER TABLE t RENAME COLUMN c TO a")
            own, value = "a__dropped", "a4"
        c.execute("UPDATE t SET v = 'kept' WHERE id = 4")

        def killed(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("killed before the change log's append")

        with monkeypatch.context() as m:
            m.setattr(
                *(local_table, "arrow_append") if path == "driver" else (batch, "append"), killed
            )
            with pytest.raises(RuntimeError, match="killed before"):
                run_sync(cfg, spark=spark)
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        changes = read_changes(lake, "public.t")
        first = next(r for r in changes.to_pylist() if (r["id"], r["v"]) == (4, "v"))
        assert first[own] == value, first
        kept = next(r for r in changes.to_pylist() if r["v"] == "kept")
        assert (
            kept[own] is None
            and kept["a"] == c.execute("SELECT a FROM t WHERE id = 4").fetchone()[0]
        )
        assert f"{own}2" not in changes.column_names and "a__dropped3" not in changes.column_names
    if databricks:
        assert any(v is not None for v in from_log)  # schemas as of a batch's versions


@pytest.mark.parametrize("trigger", [False, True])
@pytest.mark.parametrize("case", ["plain", "default", "change between"])
def test_a_drop_and_readd_of_one_name_after_a_row_changed(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, case: str, trigger: bool
) -> None:
    """A row changed, then ``DROP a`` and ``ADD a [DEFAULT 'dd']``: the row's image has the
    first ``a``. Without the trigger the attnums (the lake's 2, the target's 5) now tell
    the new column from the old, so the row reads NULL or the default as at the source
    (before session 31 it kept the first column's value, a documented limit)."""
    import psycopg

    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, "driver")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _text_columns_synced(c, cfg, slot, spark, trigger)
        c.execute("ALTER TABLE t DROP COLUMN a")
        if case == "change between":
            c.execute("UPDATE t SET v = 'mid' WHERE id = 4")
        default = "" if case == "plain" else " DEFAULT 'dd'"
        c.execute(f"ALTER TABLE t ADD COLUMN a text{default}")
        c.execute("UPDATE t SET v = 'x' WHERE id = 1")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
        c.execute("UPDATE t SET v = 'w' WHERE id = 3")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_a_rename_through_a_name_only_the_change_log_has(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """``c1`` (text) dropped in one batch, ``c3 int`` added in the next; then ``RENAME c3
    TO c1``, a row, ``RENAME c1 TO r12`` in one batch. The column only passes through c1:
    the change log's c1 keeps the dropped column's text, and c3's values go to r12.
    Before, both were renamed to r12 and the batch failed on every rerun (a cast of the
    text to int; found by the random workload's seed 17302)."""
    import psycopg

    from slotlake import ddl
    from slotlake.lake import read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    cfg = _config(pg_dsn, lake, slot, path)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        ddl.install(c)
        c.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        batches = [
            "INSERT INTO t SELECT g, 'e' FROM generate_series(1, 3) g; "
            "ALTER TABLE t ADD COLUMN c1 text; UPDATE t SET c1 = 'one' WHERE id = 1",
            "ALTER TABLE t DROP COLUMN c1; ALTER TABLE t ADD COLUMN c3 int; "
            "UPDATE t SET c3 = 3 WHERE id = 2",
            "ALTER TABLE t RENAME COLUMN c3 TO c1; INSERT INTO t (id, s, c1) VALUES (10, 'e', 10); "
            "ALTER TABLE t RENAME COLUMN c1 TO r12; INSERT INTO t (id, s, r12) VALUES (11, 'e', 11)",
        ]
        for statements in batches:
            for statement in statements.split("; "):
                c.execute(statement)
            run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t"])
    rows = {(r["id"], r["_op"]): r for r in read_changes(lake, "public.t").to_pylist()}
    assert str(read_changes(lake, "public.t").schema.field("c1").type) == "string"
    assert rows[(1, "U")]["c1"] == "one"
    assert [rows[(i, op)]["r12"] for i, op in ((2, "U"), (10, "I"), (11, "I"))] == [3, 10, 11]
    assert rows[(10, "I")]["c1"] is None and rows[(1, "U")]["r12"] is None
