"""A table's replica identity changes: the state's shape changes with it (one row per key,
or distinct rows with ``_copies``), and the events of a batch may carry two identities.

Each table below is one scenario; all of them run in one database and are synced
together: the identity changes between batches, inside a batch between the table's
changes (a batch that first dies after its first table), and once more after that (the
mirror must still be exact). The driver
replays a batch whose events carry two identities one identity at a time
(:mod:`slotlake.identity_segments`); Spark, which merges with the final identity, leaves
such a table to a snapshot by the next run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake.lake import Lake, read_changes, read_delta
from slotlake.snapshot import waiting
from slotlake.sync import FAULT_ENV, InjectedFault, run_sync

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
# Inside one batch, changes of two identities: Spark's MERGE leaves these to a snapshot.
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
    it (and, through Spark, re-bases the tables that changed identity inside it), and no
    change is logged twice."""
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
        # The rerun finishes batch 2, then goes on with a batch of its own. Under Spark
        # batch 2 asked for copies of the tables it could not apply exactly, and that
        # batch takes them: either way every table is exact when the run ends.
        _sync_and_check(c, cfg, spark, TABLES)
        last = Lake(lake).last_commit()
        assert last is not None
        copied = set(last.snapshot.get("tables", {}))
        assert copied == (INSIDE if writer == "spark" else set()), copied
        assert not waiting(Lake(lake), None)
        # key_moved's identity moves back inside the third batch: under Spark that batch
        # asks for a copy (a request file), which the run takes in one more batch.
        c.execute(THIRD)
        result = run_sync(cfg, spark=spark)
        assert_mirror(c, lake, TABLES)
        assert (result.followed is not None) == (writer == "spark")
        last = Lake(lake).last_commit()
        assert last is not None
        copied = set(last.snapshot.get("tables", {}))
        assert copied == ({"public.key_moved"} if writer == "spark" else set()), copied
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
