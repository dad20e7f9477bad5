"""A table dropped and created again under its name is another table: its columns are new
ones, even under the same names and attnums. The state takes the new table's columns and
types; the change log keeps the old table's rows, a same-named column of a type that does
not widen to the new one's moving aside (``v__dropped``), as a dropped column's does.

Before: the lake's attnums and names paired the old columns with the new ones, so a new
``int`` column at an old ``text`` column's attnum (renamed, or the same name) was read as
a type change and kept as text: the mirror held ``'100'`` where the source has 100."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CASES = {
    # case: (statements after the first sync, the new table's value column, where the
    # change log keeps the old table's text v: v, or aside where the new v is an int)
    "other columns": (
        [
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, w int)",
            "INSERT INTO t VALUES (1, 100)",
        ],
        "w",
        "v",
    ),
    "same name, another type": (
        [
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "INSERT INTO t VALUES (1, 100)",
        ],
        "v",
        "v__dropped",
    ),
    "same shape": (
        [
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t VALUES (1, 'n')",
        ],
        "v",
        "v",
    ),
    "in the batch of the old table's changes": (
        [
            "UPDATE t SET v = 'last' WHERE id = 1",
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, v int, z text)",
            "INSERT INTO t VALUES (1, 100, 'z'), (7, 7, 'q')",
        ],
        "v",
        "v__dropped",
    ),
    "no change in its first batch": (
        ["DROP TABLE t", "CREATE TABLE t (id int PRIMARY KEY, v int)"],
        "v",
        "v__dropped",
    ),
}


def _setup(c: Any, slot: str, trigger: bool) -> None:
    from slotlake import ddl

    if trigger:
        ddl.install(c)
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
    c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    c.execute("INSERT INTO t SELECT g, 'old' || g FROM generate_series(1, 5) g")
    c.execute("INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 3) g")


@pytest.mark.parametrize("trigger", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_a_table_created_again_is_mirrored_with_its_own_columns(
    pg_dsn: str, slot: str, tmp_path: Path, case: str, trigger: bool
) -> None:
    import psycopg

    from slotlake.lake import read_changes, read_state
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    statements, column, old_v = CASES[case]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger)
        run_sync(cfg)
        for statement in statements:
            c.execute(statement)
        run_sync(cfg)
        assert_mirror(c, lake, ["public.t", "public.u"])
        new_type = c.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 't'::regclass AND attname = %s",
            (column,),
        ).fetchone()[0]
        value = 50 if new_type == "integer" else "fifty"
        c.execute(f"INSERT INTO t (id, {column}) VALUES (50, %s)", (value,))
        run_sync(cfg)
        assert_mirror(c, lake, ["public.t", "public.u"])

    state = read_state(lake, "public.t")
    assert str(state.schema.field(column).type) == ("int32" if new_type == "integer" else "string")
    changes = read_changes(lake, "public.t").to_pylist()
    # The old table's rows keep their text, under v or, where the new v is an int, aside.
    assert sorted(r[old_v] for r in changes if r["id"] in range(2, 6) and r[old_v] is not None) == [
        f"old{i}" for i in range(2, 6)
    ]
    assert [r[column] for r in changes if r["id"] == 50] == [value]
    if case == "in the batch of the old table's changes":
        assert [r[old_v] for r in changes if r["_op"] == "U"] == ["last"]
    if old_v == "v__dropped":
        assert all(r["v__dropped"] is None for r in changes if r["id"] == 50)


@pytest.mark.one_pg_version
@pytest.mark.parametrize("path", ["driver", "spark"])
def test_two_tables_that_swap_names_are_each_mirrored(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """``t`` and ``u`` swap names (through a third): each name is now another relation,
    copied again; on Spark's writers too, with a type that differs between the two."""
    import psycopg

    from slotlake.lake import read_state
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if path == "spark":
        cfg.lake.driver_write_rows = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger=True)
        c.execute("ALTER TABLE u ALTER COLUMN v TYPE int USING length(v)")
        run_sync(cfg, spark=spark)
        with c.transaction():
            c.execute("ALTER TABLE t RENAME TO tmp")
            c.execute("ALTER TABLE u RENAME TO t")
            c.execute("ALTER TABLE tmp RENAME TO u")
        c.execute("UPDATE t SET v = 9 WHERE id = 2")
        c.execute("UPDATE u SET v = 'moved' WHERE id = 3")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t", "public.u"])
        c.execute("INSERT INTO t VALUES (60, 60)")
        c.execute("INSERT INTO u VALUES (60, 'sixty')")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.t", "public.u"])
    assert str(read_state(lake, "public.t").schema.field("v").type) == "int32"
    assert str(read_state(lake, "public.u").schema.field("v").type) == "string"
