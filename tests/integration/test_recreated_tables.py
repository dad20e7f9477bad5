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
    "after the old table's last change": (
        [
            "UPDATE t SET v = 'last' WHERE id = 1",
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, v int)",
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


def _setup(c: Any, slot: str, trigger: bool, publication: str = "FOR ALL TABLES") -> None:
    from slotlake import ddl

    if trigger:
        ddl.install(c)
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
    c.execute(f"CREATE PUBLICATION pub {publication}")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    c.execute("INSERT INTO t SELECT g, 'old' || g FROM generate_series(1, 5) g")
    c.execute("INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 3) g")


@pytest.mark.parametrize("trigger", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_a_table_created_again_is_mirrored_with_its_own_columns(
    pg_dsn: str, slot: str, tmp_path: Path, case: str, trigger: bool
) -> None:
    import psycopg

    from slotlake.lake import Lake, read_changes, read_state
    from slotlake.snapshot import waiting
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
        # The batch records the new relation, whose copy it took: nothing left to copy.
        oid = c.execute("SELECT 't'::regclass::oid::int").fetchone()[0]
        assert Lake(lake).last_commit().tables["public.t"].oid == oid
        assert waiting(Lake(lake), None) == {}
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
    if "old table's" in case:
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


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_a_table_renamed_between_its_changes_in_one_batch(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, path: str
) -> None:
    """``INSERT`` into ``t``, ``RENAME t TO t2``, ``UPDATE t2`` in one batch: one relation
    oid under two names. Each change goes to the name its Relation message gave: the
    insert to ``t``'s change log, the update to ``t2``'s (before the marker of the copy
    that ``t2``, new to the lake, gets). Before: Spark's writers failed the batch on every
    run (no Relation message before the insert in ``t2``'s versions), the driver's gave
    the update to ``t``."""
    import psycopg

    from slotlake.lake import read_changes
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if path == "spark":
        cfg.lake.driver_write_rows = 0
    session = spark if path == "spark" else None
    batches = [
        [
            "INSERT INTO t VALUES (10, 'ten')",
            "ALTER TABLE t RENAME TO t2",
            "UPDATE t2 SET v = 'after' WHERE id = 2",
        ],
        ["INSERT INTO t2 VALUES (50, 'fifty')"],
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger=True)
        run_sync(cfg, spark=session)
        for statements in batches:
            for statement in statements:
                c.execute(statement)
            run_sync(cfg, spark=session)
            assert_mirror(c, lake, ["public.t2", "public.u"])

    def batch_rows(table: str, batch: int) -> list[tuple[Any, ...]]:
        rows = read_changes(lake, table).to_pylist()
        return [(r["_op"], r["id"], r["v"]) for r in rows if r["_batch"] == batch]

    assert batch_rows("public.t", 2) == [("I", 10, "ten")]
    assert batch_rows("public.t2", 2) == [("U", 2, "after"), ("S", None, None)]
    assert batch_rows("public.t2", 3) == [("I", 50, "fifty")]


FIRST_BATCH = {
    # case: (statements before the lake's first sync, the table to mirror, why it is
    # copied by the second sync)
    "created again": (
        [
            "DROP TABLE t",
            "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "INSERT INTO t VALUES (1, 100)",
        ],
        "public.t",
        "recreated",
    ),
    "rebuilt under its name": (
        [
            "CREATE TABLE t_new (id int PRIMARY KEY, v text)",
            "INSERT INTO t_new SELECT id, v || '!' FROM t",
            "BEGIN",
            "DROP TABLE t",
            "ALTER TABLE t_new RENAME TO t",
            "COMMIT",
            "UPDATE t SET v = 'after' WHERE id = 2",
        ],
        "public.t",
        "recreated",
    ),
    "renamed": (
        ["ALTER TABLE t RENAME TO t2", "UPDATE t2 SET v = 'after' WHERE id = 2"],
        "public.t2",
        "renamed from public.t",
    ),
}


@pytest.mark.parametrize("case", list(FIRST_BATCH))
def test_a_lakes_first_batch_with_a_table_created_again_or_renamed(
    pg_dsn: str, slot: str, tmp_path: Path, case: str
) -> None:
    """A lake's first batch copies nothing (``slotlake bootstrap`` does) and records the
    oids it finds, so the next run's own check (a published oid against the recorded one)
    cannot see a table the batch saw dropped and created again or renamed: the batch
    names it for a copy, which the run takes in one more batch; the mirror equals the
    source from there.
    Before, the lake kept the dropped relation's rows, or missed the rows of the rename's
    old name, for good."""
    import psycopg

    from slotlake.lake import Lake
    from slotlake.snapshot import waiting
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    statements, table, why = FIRST_BATCH[case]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger=True)
        for statement in statements:
            c.execute(statement)
        assert run_sync(cfg).followed == 1
        assert Lake(lake).read_commit(1).snapshot["wanted"][table].startswith(why)
        assert waiting(Lake(lake), None) == {}
        assert_mirror(c, lake, [table, "public.u"])
        c.execute(f"INSERT INTO {table.split('.')[1]} VALUES (50, 50)")
        run_sync(cfg)
        assert_mirror(c, lake, [table, "public.u"])


DURING_THE_RUN = {
    # case: (statements between the run's two reads, the table to mirror, why the batch
    # names it for a copy)
    "created again": (FIRST_BATCH["created again"][0], "public.t", "recreated"),
    "created again, no change": (
        ["DROP TABLE t", "CREATE TABLE t (id int PRIMARY KEY, v int)"],
        "public.t",
        "recreated",
    ),
    "rebuilt under its name": (FIRST_BATCH["rebuilt under its name"][0], "public.t", "recreated"),
    "renamed": (FIRST_BATCH["renamed"][0], "public.t2", "new in the publication"),
    "renamed, no change": (["ALTER TABLE t RENAME TO t2"], "public.t2", "new in the publication"),
    # x: 5 rows, in no publication before (the publication lists t and u)
    "added to the publication": (
        ["ALTER PUBLICATION pub ADD TABLE x", "INSERT INTO x VALUES (100, 'new')"],
        "public.x",
        "new in the publication",
    ),
    "added, no change": (
        ["ALTER PUBLICATION pub ADD TABLE x"],
        "public.x",
        "new in the publication",
    ),
}


@pytest.mark.parametrize("case", list(DURING_THE_RUN))
def test_a_table_changed_while_the_run_reads_the_source_is_copied_by_the_same_run(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Statements run after the run read the published tables (which copies a table new
    in a publication, or created again) and before it read the target's catalog: the
    set it compared showed ``t`` as the lake has it, and no ``x``, so it copied nothing,
    while the batch's catalog (and messages) show another relation under a name, or a
    name it did not read. The batch names it for a copy, which the run takes in one more
    batch: the mirror equals the source when the run ends, and a name the source lost
    is gone from the lake. Before 2026-12-03 only a table with a change of the new
    relation in the batch was named: one renamed or added to the publication lacked its
    rows from before (the old name kept them), and one created again with no change kept
    the old relation's rows, until the next run."""
    import psycopg

    from slotlake.lake import Lake, table_names
    from slotlake.snapshot import waiting
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, before_the_target, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    statements, table, why = DURING_THE_RUN[case]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE x (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO x SELECT g, 'x' || g FROM generate_series(1, 5) g")
        added = case.startswith("added")
        _setup(c, slot, trigger=True, publication="FOR TABLE t, u" if added else "FOR ALL TABLES")
        run_sync(cfg)
        assert_mirror(c, lake, ["public.t", "public.u"])
        ops = [lambda: [c.execute(statement) for statement in statements]]
        c.execute("INSERT INTO u VALUES (10, 'u10')")
        said: list[str] = []
        with before_the_target(ops):
            result = run_sync(cfg, progress=said.append)
        assert not ops and result.followed == 2, result
        assert table not in Lake(lake).read_commit(2).snapshot.get("tables", {}), said
        assert any(line.startswith(f"batch 2: copying {table} ({why}") for line in said), said
        assert table in Lake(lake).read_commit(3).snapshot["tables"]
        assert waiting(Lake(lake), None) == {}
        assert_mirror(c, lake, [table, "public.u"])
        gone = {"public.t"} if case.startswith("renamed") else set()
        assert table_names(lake) == sorted({"public.t", "public.u", table} - gone)
        # Nothing more to copy: the next run is an ordinary batch.
        c.execute(f"INSERT INTO {table} (id) VALUES (60)")
        assert run_sync(cfg).followed is None
        assert_mirror(c, lake, [table, "public.u"])


def test_a_failed_second_read_leaves_the_copy_to_the_next_run(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The run's read of its published set after the batch fails (the source went away,
    say): the batch stays committed and the run ends as it would have; the next run
    copies what the source changed meanwhile (here ``t`` renamed while the run read it)."""
    import logging

    import psycopg

    from slotlake import snapshot
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, before_the_target, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger=True)
        run_sync(cfg)
        read_published = snapshot.published_catalog
        reads: list[int] = []

        def published_once(conn: Any, publications: list[str], since: Any = None) -> Any:
            reads.append(1)
            if len(reads) > 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return read_published(conn, publications, since)

        monkeypatch.setattr(snapshot, "published_catalog", published_once)
        ops = [lambda: c.execute("ALTER TABLE t RENAME TO t2")]
        with caplog.at_level(logging.WARNING, logger="slotlake.sync"), before_the_target(ops):
            result = run_sync(cfg)
        assert result.status == "committed" and result.followed is None, result
        assert "the next run copies what it needs" in caplog.text
        monkeypatch.undo()
        said: list[str] = []
        run_sync(cfg, progress=said.append)
        assert any("snapshot of public.t2 (new in the publication)" in line for line in said), said
        assert_mirror(c, lake, ["public.t2", "public.u"])


GONE = {
    # case: (statements that take t from the source, those that bring it back, the names
    # the lake lists while it is gone)
    "dropped": (
        ["DROP TABLE t"],
        [
            "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "ALTER PUBLICATION pub ADD TABLE t",
            "INSERT INTO t VALUES (1, 'back')",
        ],
        ["public.u"],
    ),
    "unpublished": (
        ["ALTER PUBLICATION pub DROP TABLE t"],
        ["ALTER PUBLICATION pub ADD TABLE t"],
        ["public.u"],
    ),
    "renamed": (
        ["ALTER TABLE t RENAME TO t2"],
        ["ALTER TABLE t2 RENAME TO t"],
        ["public.t2", "public.u"],
    ),
}


@pytest.mark.parametrize("case", list(GONE))
def test_a_table_gone_from_the_source_leaves_the_lakes_tables(
    pg_dsn: str, slot: str, tmp_path: Path, case: str
) -> None:
    """A table dropped, removed from the publication or renamed away is marked in the
    record from the batch that no longer finds it published: ``table_names`` leaves it
    out, ``read_state`` refuses it, naming the batch to read its last state with, and its
    change log stays readable; published again, it is copied and mirrored as before."""
    import psycopg

    from slotlake import ddl
    from slotlake.lake import LakeError, read_changes, read_state, table_names
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    away, back, names = GONE[case]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        ddl.install(c)
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t, u")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t SELECT g, 'old' || g FROM generate_series(1, 5) g")
        run_sync(cfg)
        for statement in away:
            c.execute(statement)
        c.execute("INSERT INTO u VALUES (1, 'u')")
        run_sync(cfg)
        assert table_names(lake) == names
        assert "public.t" in table_names(lake, gone=True)
        with pytest.raises(LakeError, match=r"'public\.t' left the source in batch 2 .*batch=1"):
            read_state(lake, "public.t")
        assert read_state(lake, "public.t", batch=1).num_rows == 5
        assert read_changes(lake, "public.t").num_rows == 5
        c.execute("INSERT INTO u VALUES (2, 'u')")
        run_sync(cfg)  # still gone, from the same batch
        with pytest.raises(LakeError, match="left the source in batch 2"):
            read_state(lake, "public.t")
        for statement in back:
            c.execute(statement)
        run_sync(cfg)
        assert "public.t" in table_names(lake)
        assert_mirror(c, lake, ["public.t", "public.u"])
    if case == "renamed":
        assert table_names(lake) == ["public.t", "public.u"]


@pytest.mark.parametrize("run", ["same run", "next run", "target lsn"])
def test_a_table_renamed_away_and_back_is_copied_by_the_same_run(
    pg_dsn: str, slot: str, tmp_path: Path, run: str
) -> None:
    """``t`` renamed ``t_tmp``, changed, and renamed back, in one batch: the change made
    as ``t_tmp`` goes to ``t_tmp``'s tables (the name its Relation message gave), so the
    batch names ``t`` for a copy (by the target's name of the relation: no change of ``t``
    follows). The run takes it in one more batch (``lake.copy_wanted_in_same_run``, the
    default), so it ends with the mirror equal to the source; with that off, or in a run
    with ``--target-lsn`` (a copy now would be newer than its target), the next run
    does. ``t_tmp`` is gone by then. Before 2026-12-03 the mirror of ``t`` lacked the
    change until the next scheduled run."""
    import psycopg

    from slotlake.lake import Lake, read_changes, table_names
    from slotlake.lsn import Lsn
    from slotlake.snapshot import waiting
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    cfg.lake.copy_wanted_in_same_run = run != "next run"
    around = [
        "ALTER TABLE t RENAME TO t_tmp",
        "UPDATE t_tmp SET v = 'as t_tmp' WHERE id = 2",
        "ALTER TABLE t_tmp RENAME TO t",
    ]
    said: list[str] = []
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _setup(c, slot, trigger=True)
        assert run_sync(cfg).batch == 1
        c.execute("UPDATE t SET v = 'as t' WHERE id = 1")
        with c.transaction():
            for statement in around:
                c.execute(statement)
        target = None
        if run == "target lsn":
            target = Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        result = run_sync(cfg, target_lsn=target, progress=said.append)
        named = Lake(lake).read_commit(2).snapshot.get("wanted")
        assert named == {"public.t": "renamed from public.t_tmp"}
        assert [r["v"] for r in read_changes(lake, "public.t_tmp").to_pylist()] == ["as t_tmp"]
        if run == "same run":
            assert (result.batch, result.followed) == (3, 2)
            assert list(Lake(lake).read_commit(3).snapshot["tables"]) == ["public.t"]
            assert (
                "batch 2: copying public.t (renamed from public.t_tmp) in one more batch now"
                in said
            )
        else:
            assert (result.batch, result.followed) == (2, None)
            assert "batch 2: the next run copies public.t (renamed from public.t_tmp)" in said
            assert waiting(Lake(lake), None) == {"public.t": "renamed from public.t_tmp"}
            run_sync(cfg)
        assert_mirror(c, lake, ["public.t", "public.u"])
        assert waiting(Lake(lake), None) == {}
    assert table_names(lake) == ["public.t", "public.u"]
