"""A table's replica identity changes: the state's shape changes with it (one row per key,
or distinct rows with ``_copies``), and the events of a batch may carry two identities.

Each table below is one scenario; all of them run in one database and are synced
together: the identity changes between batches, inside a batch between the table's
changes (a batch that first dies after its first table), and once more after that (the
mirror must still be exact). A batch whose events carry two identities is replayed one
identity at a time (:mod:`slotlake.identity_segments`): on the driver in Arrow, through
Spark in Spark SQL; either way the table's state is rewritten whole in one commit, exact
as of that batch, with no copy from the source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake.lake import Lake, read_changes, read_delta
from slotlake.snapshot import waiting
from slotlake.sync import FAULT_ENV, InjectedFault, run_sync
from slotlake.unique_multiset import merged_by

from .sync_helpers import assert_mirror, assert_rows_recorded, make_config

SCHEMA = """
-- keyed, then FULL between batches (the keyed state's rows count once each)
CREATE TABLE to_full (id int PRIMARY KEY, v text);
-- keyed, its key dropped between batches: no identity, a multiset (INSERT only)
CREATE TABLE key_dropped (id int PRIMARY KEY, v text);
-- keyed, then FULL inside a batch: a keyed UPDATE (no old image, TOAST left unchanged)
-- and a key-only DELETE before the change, FULL images after it
CREATE TABLE to_full_inside (id int PRIMARY KEY, v text, big text);
ALTER TABLE to_full_inside ALTER COLUMN big SET STORAGE EXTERNAL;
-- FULL with duplicates, then keyed inside a batch: one copy of two deleted first
CREATE TABLE to_key_inside (id int, v text);
ALTER TABLE to_key_inside REPLICA IDENTITY FULL;
-- keyed by id, then by code inside a batch: deletes and a key change by the old key first
CREATE TABLE key_moved (id int PRIMARY KEY, code text NOT NULL, v text);
CREATE PUBLICATION pub FOR TABLE to_full, key_dropped, to_full_inside, to_key_inside, key_moved;
"""
TABLES = [
    "public.to_full",
    "public.key_dropped",
    "public.to_full_inside",
    "public.to_key_inside",
    "public.key_moved",
]
# Inside one batch, changes of two identities: the state rewritten whole.
INSIDE = {"public.to_full_inside", "public.to_key_inside", "public.key_moved"}

FIRST = """
INSERT INTO to_full VALUES (1, 'a'), (2, 'b');
INSERT INTO key_dropped VALUES (1, 'a'), (2, 'b');
INSERT INTO to_full_inside SELECT g, 'v', repeat(md5(g::text), 100) FROM generate_series(1, 4) g;
INSERT INTO to_key_inside VALUES (1, 'a'), (2, 'b'), (2, 'b');
INSERT INTO key_moved VALUES (1, 'a', 'x'), (2, 'b', 'y'), (3, 'c', 'z');
ALTER TABLE to_full REPLICA IDENTITY FULL;
ALTER TABLE key_dropped DROP CONSTRAINT key_dropped_pkey;
"""
SECOND = """
UPDATE to_full SET v = 'c' WHERE id = 1;
INSERT INTO to_full VALUES (4, 'c');
INSERT INTO key_dropped VALUES (1, 'a');
UPDATE to_full_inside SET v = 'u' WHERE id = 1;
DELETE FROM to_full_inside WHERE id = 2;
ALTER TABLE to_full_inside REPLICA IDENTITY FULL;
UPDATE to_full_inside SET v = 'w' WHERE id = 3;
INSERT INTO to_full_inside VALUES (5, 'w', NULL);
DELETE FROM to_key_inside WHERE ctid = (SELECT min(ctid) FROM to_key_inside WHERE id = 2);
ALTER TABLE to_key_inside ADD PRIMARY KEY (id);
ALTER TABLE to_key_inside REPLICA IDENTITY DEFAULT;
UPDATE to_key_inside SET v = 'c' WHERE id = 1;
DELETE FROM key_moved WHERE id = 2;
UPDATE key_moved SET id = 7 WHERE id = 3;
ALTER TABLE key_moved DROP CONSTRAINT key_moved_pkey;
ALTER TABLE key_moved ADD PRIMARY KEY (code);
UPDATE key_moved SET v = 'q' WHERE id = 1;
"""
THIRD = """
UPDATE to_full SET v = v || '!' WHERE v = 'c';
INSERT INTO key_dropped VALUES (2, 'b');
UPDATE to_full_inside SET v = v || '!';
DELETE FROM to_key_inside WHERE id = 2;
UPDATE key_moved SET code = 'd' WHERE code = 'c';
ALTER TABLE key_moved DROP CONSTRAINT key_moved_pkey;
ALTER TABLE key_moved ADD PRIMARY KEY (id);
UPDATE key_moved SET v = 'r' WHERE id = 7;
"""


def _assert_rewritten_whole(lake: str, batch: int, tables: set[str]) -> None:
    """The tables whose identity changed inside ``batch`` had their state rewritten in one
    commit: an overwrite, by the driver's replay and by Spark's alike."""
    from deltalake import DeltaTable

    record = Lake(lake).read_commit(batch)
    for name in tables:
        t = record.tables[name]
        assert t.state and t.state_version is not None
        history = DeltaTable(f"{lake}/{t.state}").history()
        entry = next(h for h in history if h["version"] == t.state_version)
        assert entry["operation"] == "WRITE", (name, entry)
        assert entry["operationParameters"]["mode"] == "Overwrite", (name, entry)


def _sync_and_check(conn: Any, cfg: Any, spark: Any, exact: list[str]) -> None:
    result = run_sync(cfg, spark=spark)
    assert result.status == "committed"
    assert_mirror(conn, cfg.lake.path, exact)


@pytest.mark.parametrize(
    "writer", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_identity_changes_keep_the_mirror_exact(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, writer: str, monkeypatch: Any
) -> None:
    """The second batch first dies after its first table is written: the rerun finishes
    it, and no change is logged twice. Every batch leaves every table exact, as of that
    batch: nothing is left to a copy."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if writer == "spark":
        cfg.lake.driver_write_rows = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute(FIRST)
        _sync_and_check(c, cfg, spark, TABLES)
        c.execute(SECOND)
        monkeypatch.setenv(FAULT_ENV, "table_written")
        with pytest.raises(InjectedFault):
            run_sync(cfg, spark=spark)
        monkeypatch.delenv(FAULT_ENV)
        # The rerun finishes batch 2 (and may go on with a batch of its own).
        _sync_and_check(c, cfg, spark, TABLES)
        _assert_rewritten_whole(lake, 2, INSIDE)
        # Made FULL, to_full_inside's rebuilt state is still unique on its primary key.
        assert Lake(lake).read_commit(2).tables["public.to_full_inside"].unique_on == ["id"]
        # key_moved's identity moves back inside the third batch.
        c.execute(THIRD)
        result = run_sync(cfg, spark=spark)
        assert_mirror(c, lake, TABLES)
        assert result.followed is None and result.batch is not None
        _assert_rewritten_whole(lake, result.batch, {"public.key_moved"})
        # ... so the next batch MERGEd it by that key, not by whole rows.
        full = Lake(lake).read_commit(result.batch).tables["public.to_full_inside"]
        assert full.unique_on == ["id"] and full.state and full.state_version is not None
        assert merged_by(f"{lake}/{full.state}", full.state_version, ["id"])
        # No table was ever copied from the source.
        for b in Lake(lake).commit_batches():
            assert not Lake(lake).read_commit(b).snapshot.get("tables"), b
        assert not waiting(Lake(lake), None)

    # Every record, the rerun's batch and the copies' among them, counts what was written.
    assert_rows_recorded(lake, Lake(lake).commit_batches())
    # The state's shape follows the final identity.
    last = Lake(lake).last_commit()
    assert last is not None
    for table in TABLES:
        logged = read_changes(lake, table).select(["_commit_lsn", "_tx_ordinal"]).to_pylist()
        assert len(logged) == len({tuple(r.values()) for r in logged}), table
    for table, counted in [
        ("public.to_full", True),
        ("public.key_dropped", True),
        ("public.to_full_inside", True),
        ("public.to_key_inside", False),
        ("public.key_moved", False),
    ]:
        state = last.tables[table]
        columns = read_delta(lake, state.state, state.state_version).column_names
        assert ("_copies" in columns) == counted, (table, columns)
