"""End to end: a varied workload in several batches against a real PostgreSQL and local Spark.

After every batch the state of every table equals ``SELECT *`` of the source, and the
change log holds exactly the operations an audit trigger recorded, in order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from slotlake import delta_log, dv_merge
from slotlake.batch import DriverWrites
from slotlake.delta import DRIVER_ENGINE
from slotlake.lake import (
    TRANSACTIONS,
    Lake,
    read_changes,
    read_state,
    read_transactions,
    table_names,
)
from slotlake.lsn import Lsn
from slotlake.sync import open_source, run_sync

from .sync_helpers import (
    AUDIT_SQL,
    assert_log_matches_audit,
    assert_mirror,
    assert_rows_recorded,
    audit,
    audited_schema,
    make_config,
    slot_confirmed,
)

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE kv (
    id int PRIMARY KEY, txt text, big text, num numeric(12,3), ts timestamptz, flag bool,
    arr int[], j jsonb, u uuid, d date, f float8, by bytea, m mood
);
ALTER TABLE kv ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (a int, b text, big text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
ALTER TABLE full_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE idx_t (id int NOT NULL, code text NOT NULL, val text, big text);
CREATE UNIQUE INDEX idx_t_code ON idx_t (code);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_code;
ALTER TABLE idx_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE parent (id int PRIMARY KEY, name text);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent, note text);
CREATE TABLE evolve (id int PRIMARY KEY, a int, b text);
CREATE TABLE inserts_only (x int, y text);
ALTER TABLE inserts_only REPLICA IDENTITY NOTHING;
CREATE PUBLICATION pub FOR TABLE kv, full_t, idx_t, parent, child, evolve, inserts_only;
"""

KEYS = {
    "public.kv": "id",
    "public.full_t": "a",
    "public.idx_t": "code",
    "public.parent": "id",
    "public.child": "id",
    "public.evolve": "id",
    "public.inserts_only": "x",
}


def big(seed: int, n: int = 9000) -> str:
    # md5 chains are incompressible enough to be stored out of line.
    return "".join(f"{(seed * 7919 + i) % 1_000_003:07d}" for i in range(n // 7))


def _batch1(c: psycopg.Connection) -> None:
    with c.transaction():  # a multi-table transaction
        for i in range(1, 21):
            c.execute(
                "INSERT INTO kv VALUES (%s, %s, %s, %s, now(), %s, %s, %s, gen_random_uuid(), %s, %s, %s, %s)",
                (
                    i,
                    None if i % 5 == 0 else f"zeile {i} — ünïcödé ✓ 🐘",
                    big(i),
                    f"{i}.125" if i != 3 else "NaN",
                    i % 2 == 0,
                    [i, None, -i] if i % 4 else [],
                    Jsonb({"i": i, "s": 'q"uote'}),
                    "infinity" if i == 7 else f"2024-01-{i:02d}",
                    float("inf") if i == 8 else i / 3,
                    bytes([0, i, 255]),
                    "ok" if i % 3 else None,
                ),
            )
        c.execute("INSERT INTO parent VALUES (1, 'p1'), (2, 'p2')")
        c.execute("INSERT INTO child VALUES (10, 1, 'c10'), (11, 2, 'c11')")
    c.execute(
        "INSERT INTO full_t VALUES (1, 'dup', %s), (1, 'dup', %s), (2, 'two', NULL)",
        (big(100), big(100)),
    )
    c.execute(
        "INSERT INTO idx_t VALUES (1, 'A', 'va', %s), (2, 'B', 'vb', %s), (3, 'C', NULL, NULL)",
        (big(200), big(201)),
    )
    c.execute("INSERT INTO evolve SELECT g, g * 10, 'b' || g FROM generate_series(1, 5) g")
    c.execute("INSERT INTO inserts_only VALUES (1, 'x'), (1, 'x')")


def _batch2(c: psycopg.Connection) -> None:
    # Updates that leave the TOAST column out (filled from the prior state).
    c.execute("UPDATE kv SET txt = 'touched' WHERE id <= 4")
    # Several updates of one row, in one transaction and across transactions.
    with c.transaction():
        c.execute("UPDATE kv SET flag = NOT flag WHERE id = 6")
        c.execute("UPDATE kv SET num = num + 1 WHERE id = 6")
    c.execute("UPDATE kv SET big = %s WHERE id = 6", (big(600),))
    c.execute("UPDATE kv SET txt = 'again' WHERE id = 6")
    # A key change, then an update of the moved row that leaves big out.
    c.execute("UPDATE kv SET id = 105 WHERE id = 5")
    c.execute("UPDATE kv SET txt = 'moved' WHERE id = 105")
    c.execute("DELETE FROM kv WHERE id IN (9, 10)")
    # Rolled back: nothing of it may appear.
    with pytest.raises(psycopg.errors.RaiseException), c.transaction():
        c.execute("UPDATE kv SET txt = 'rolled back' WHERE id = 1")
        c.execute("DO $$ BEGIN RAISE EXCEPTION 'rollback'; END $$")
    # A savepoint rolled back inside a committed transaction.
    with c.transaction():
        c.execute("UPDATE kv SET txt = 'kept' WHERE id = 11")
        with pytest.raises(psycopg.errors.UniqueViolation), c.transaction():
            c.execute("UPDATE kv SET txt = 'lost' WHERE id = 12")
            c.execute("INSERT INTO kv (id) VALUES (11)")
        c.execute("UPDATE kv SET txt = 'kept too' WHERE id = 13")
    # Multiset: one of two identical rows changes, another is deleted.
    c.execute(
        "UPDATE full_t SET b = 'changed' WHERE ctid = (SELECT min(ctid) FROM full_t WHERE a = 1)"
    )
    c.execute("DELETE FROM full_t WHERE a = 2")
    # USING INDEX identity: a change of the index key, and an update leaving big out.
    c.execute("UPDATE idx_t SET code = 'A2' WHERE code = 'A'")
    c.execute("UPDATE idx_t SET val = 'vb2' WHERE code = 'B'")
    c.execute("DELETE FROM idx_t WHERE code = 'C'")


def _batch3(c: psycopg.Connection) -> None:
    # Schema changes in the middle of a batch.
    c.execute("INSERT INTO evolve VALUES (6, 60, 'b6')")
    c.execute("ALTER TABLE evolve ADD COLUMN c text")
    c.execute("INSERT INTO evolve VALUES (7, 70, 'b7', 'c7')")
    c.execute("ALTER TABLE evolve RENAME COLUMN b TO bb")
    c.execute("UPDATE evolve SET bb = 'renamed' WHERE id = 1")
    c.execute("ALTER TABLE evolve ALTER COLUMN a TYPE bigint")
    c.execute("UPDATE evolve SET a = 5000000000 WHERE id = 2")
    c.execute("ALTER TABLE evolve DROP COLUMN c")
    c.execute("INSERT INTO evolve VALUES (8, 80, 'b8')")
    # TRUNCATE with CASCADE (both tables), then new rows after it in the same batch.
    c.execute("TRUNCATE parent CASCADE")
    c.execute("INSERT INTO parent VALUES (3, 'p3')")
    c.execute("INSERT INTO child VALUES (12, 3, 'c12')")
    c.execute("TRUNCATE full_t RESTART IDENTITY")
    c.execute("INSERT INTO full_t VALUES (3, 'after truncate', NULL)")


def _batch5(c: psycopg.Connection) -> None:
    # Inside one batch: insert then update leaving big out (filled from the same batch),
    # and a chain of key changes followed by an update (followed through the lineage).
    c.execute("INSERT INTO kv (id, txt, big) VALUES (200, 'new', %s)", (big(2000),))
    c.execute("UPDATE kv SET txt = 'new, updated' WHERE id = 200")
    c.execute("UPDATE kv SET id = 300 WHERE id = 1")
    c.execute("UPDATE kv SET id = 301 WHERE id = 300")
    c.execute("UPDATE kv SET txt = 'twice moved' WHERE id = 301")
    c.execute("DELETE FROM kv WHERE id = 2")
    c.execute("INSERT INTO kv (id, txt) VALUES (2, 'reinserted')")


def _history(root: str, rel: str) -> list[dict[str, Any]]:
    """The commits of the Delta table at ``rel`` in the lake (from its log)."""
    from deltalake import DeltaTable

    return DeltaTable(f"{root}/{rel}").history()


def _writers(root: str, table: str, kind: str = "state") -> set[str]:
    """Which engines wrote the data commits of a Delta table (from its log)."""
    return _engines(_history(root, Lake.table_path(kind, table)))


def _engines(history: list[dict[str, Any]]) -> set[str]:
    """Which engines made the data commits (MERGE, WRITE) of ``history``."""
    return {
        "delta-rs"
        if "delta-rs" in str(h.get("clientVersion", ""))
        else "slotlake"
        if h.get("engineInfo") == DRIVER_ENGINE
        else "spark"
        for h in history
        if h.get("operation") in ("MERGE", "WRITE")
    }


@pytest.mark.parametrize(
    "writer",
    [
        "driver",
        # The other writers see the decoder's output, not the source's bytes: "driver"
        # covers each PostgreSQL version (conftest.py: one_pg_version).
        pytest.param("driver-deltalake", marks=pytest.mark.one_pg_version),
        pytest.param("driver-dv", marks=pytest.mark.one_pg_version),
        pytest.param("dv-merge", marks=pytest.mark.one_pg_version),
        pytest.param("spark-merge", marks=pytest.mark.one_pg_version),
        pytest.param("spark", marks=pytest.mark.one_pg_version),
    ],
)
def test_varied_workload_in_batches(
    pg_dsn: str, slot: str, spark, tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same workload with small keyed tables written from the driver (its own Delta
    commits, the files a key hits rewritten: the default for them; ``driver-deltalake``:
    every table refused by that writer, so ``deltalake`` writes them as it does a table
    whose protocol asks for more), with the driver's rows merged with deletion vectors by
    the driver (the default for a big state; ``driver-dv``: for a mid-sized one, whose
    snapshot re-base stays on the driver), or by Spark (that turned off), and with every
    table through Spark."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if writer == "spark":
        cfg.lake.driver_write_rows = 0
    if writer == "driver-deltalake":
        monkeypatch.setattr(
            delta_log, "unwritable", lambda snap, deletes=False: "refused by the test"
        )
    if writer in ("driver-dv", "dv-merge"):
        monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)  # vectors, not rewrites
    if writer == "driver-dv":
        monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
    if writer in ("dv-merge", "spark-merge"):
        cfg.lake.driver_write_state_mb = 0
        cfg.lake.driver_deletion_vectors = writer == "dv-merge"
    tables = list(KEYS)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        audited_schema(c, SCHEMA, KEYS)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))

        for step in (_batch1, _batch2, _batch3):
            step(c)
            lines: list[str] = []
            result = run_sync(cfg, spark=spark, progress=lines.append)
            assert result.status == "committed"
            if step is _batch1:
                # A state's rows say what they count: a multiset's are its distinct values.
                rec = Lake(lake).read_commit(result.batch).tables  # type: ignore[arg-type]
                texts = {n: t.state_rows_text() for n, t in rec.items() if t.written}
                assert result.state_rows_text == texts
                assert texts["public.kv"] == f"{rec['public.kv'].state_rows} rows"
                assert "(multiset" in texts["public.full_t"]
                full = rec["public.full_t"]
                line = f"batch 1: public.full_t: {full.change_rows} changes, state {texts['public.full_t']} ("
                assert any(x.startswith(line) for x in lines), lines
            if step is _batch3:
                # Batch 3's ALTER COLUMN TYPE rewrote evolve (a new relfilenode, no
                # TRUNCATE): the run re-bases it on a snapshot in one more batch, which
                # writes no other table.
                assert (result.followed, result.batch) == (3, 4)
                assert set(result.tables) == {"public.evolve"}
                assert Lake(lake).last_commit().snapshot["tables"]["public.evolve"]  # type: ignore[union-attr]
            assert slot_confirmed(c, slot) == str(result.end_lsn)
            assert_mirror(c, lake, tables)
            assert_log_matches_audit(c, lake, KEYS)

        # An idle database still commits its progress and advances the slot.
        before = Lsn(slot_confirmed(c, slot))
        c.execute("CREATE TABLE unpublished (x int)")
        c.execute("INSERT INTO unpublished VALUES (1)")
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed" and result.tables == {}
        assert Lsn(slot_confirmed(c, slot)) > before
        assert_mirror(c, lake, tables)

        _batch5(c)
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, tables)
        assert_log_matches_audit(c, lake, KEYS)
        # Every batch's record counts the rows its tables held, whichever writer wrote them.
        assert_rows_recorded(lake, Lake(lake).commit_batches())

    # Nothing was ever left unknown: the prior state always had the TOAST values.
    for table in tables:
        changes = read_changes(lake, table)
        assert not any(changes.column("_missing_toast").to_pylist()), table
    # The change log keeps the schema history; the state only the current columns.
    evolve_log = read_changes(lake, "public.evolve")
    assert {"a", "bb", "c"} <= set(evolve_log.column_names)
    assert "b" not in evolve_log.column_names  # renamed: older values live under bb
    assert set(read_state(lake, "public.evolve").column_names) == {
        "id",
        "a",
        "bb",
        "_fallback",
        "_missing_toast",
    }
    # Values kept as text where the Spark type cannot hold them.
    kv_state = {r["id"]: r for r in read_state(lake, "public.kv").to_pylist()}
    assert dict(kv_state[3]["_fallback"])["num"] == "NaN" and kv_state[3]["num"] is None
    assert dict(kv_state[7]["_fallback"])["d"] == "infinity"
    # Truncate markers are in the change log of both tables of the CASCADE.
    for table in ("public.parent", "public.child"):
        ops = read_changes(lake, table).column("_op").to_pylist()
        assert ops.count("T") == 1
    assert len(list(Lake(lake).commits())) == 6
    # Every batch's transactions, whichever writer appended them (through Spark, beside
    # the tables): one row each, as its commit record counts them, in commit order.
    records = list(Lake(lake).commits())
    listed = read_transactions(lake)
    assert listed.num_rows == sum(r.transaction_count for r in records) > 0
    assert listed.column("_batch").to_pylist() == sorted(listed.column("_batch").to_pylist())
    tx_writers = _engines(_history(lake, TRANSACTIONS))
    assert ("spark" in tx_writers) == (writer == "spark"), tx_writers
    state_writers = {
        "driver": {"slotlake"},
        "driver-deltalake": {"delta-rs"},
        "driver-dv": {"slotlake"},
        "dv-merge": {"slotlake"},
        # The first batch creates the table: an empty state is written on the driver.
        "spark-merge": {"slotlake", "spark"},
        "spark": {"spark"},
    }[writer]
    assert _writers(lake, "public.kv", "changes") == (
        {"spark"} if writer == "spark" else state_writers - {"spark"}
    )
    assert _writers(lake, "public.kv") == state_writers
    kv_rel = Lake.table_path("state", "public.kv")
    kv_state = Path(lake) / kv_rel
    if writer in ("spark", "spark-merge"):
        # Spark's MERGE rewrites the files it touches in a state this small (under
        # DriverWrites.DV_FROM_BYTES), as the driver does: no deletion vector.
        assert not list(kv_state.glob("deletion_vector_*.bin"))
        assert "MERGE" in [h.get("operation") for h in _history(lake, kv_rel)]
    if writer in ("driver-dv", "dv-merge"):
        assert list(kv_state.glob("deletion_vector_*.bin")), "no deletion vector written"
        # Spark reads what the driver's deletion vectors and files left, as deltalake does.
        path = f"{lake}/{Lake.table_path('state', 'public.kv')}"
        by_spark = spark.read.format("delta").load(path).select("id", "txt").collect()
        assert sorted((r["id"], r["txt"]) for r in by_spark) == sorted(
            zip(
                *read_state(lake, "public.kv").select(["id", "txt"]).to_pydict().values(),
                strict=True,
            )
        )
    # A multiset's small state is rebuilt on the driver; with a bigger one (here: any but
    # the first batch's new table) the whole table goes through Spark, change log too.
    multiset_writers = {"dv-merge": {"slotlake", "spark"}, "driver-dv": {"slotlake"}}.get(
        writer, state_writers
    )
    assert _writers(lake, "public.full_t") == multiset_writers
    assert _writers(lake, "public.full_t", "changes") == multiset_writers


ODD_NAMES = """
CREATE SCHEMA "Sales Dept";
CREATE TABLE "Sales Dept"."Order Items" (
    "Id" int PRIMARY KEY, "select" text, "a.b" int, "naïve col" text,
    "with space" numeric(8, 2), "quo""te" text
);
CREATE TABLE public."weird.name" (id int PRIMARY KEY, "Group" text);
CREATE PUBLICATION pub FOR TABLE "Sales Dept"."Order Items", public."weird.name";
"""


@pytest.mark.parametrize(
    "writer", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_names_that_need_quoting_are_mirrored(
    pg_dsn: str, slot: str, spark, tmp_path: Path, writer: str
) -> None:
    """Schema, table and column names with spaces, dots, capitals, a quote, non-ASCII
    letters and a reserved word: written and read as PostgreSQL has them, through a
    rename and an added column, by either writer."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if writer == "spark":
        cfg.lake.driver_write_rows = 0
    tables = ["Sales Dept.Order Items", "public.weird.name"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(ODD_NAMES)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        items = '"Sales Dept"."Order Items"'
        c.execute(
            f"INSERT INTO {items} VALUES (1, 's', 2, 'ï', 1.50, 'q1'), (2, NULL, NULL, NULL, NULL, NULL)"
        )
        c.execute("""INSERT INTO public."weird.name" VALUES (1, 'g'), (2, 'h')""")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, tables)

        c.execute(f"""UPDATE {items} SET "select" = 'u', "naïve col" = 'é' WHERE "Id" = 1""")
        c.execute(f'ALTER TABLE {items} RENAME COLUMN "a.b" TO "b.c"')
        c.execute(f'ALTER TABLE {items} ADD COLUMN "New Col" int DEFAULT 3')
        c.execute(f"""UPDATE {items} SET "b.c" = 9, "quo""te" = 'q2' WHERE "Id" = 2""")
        c.execute(f"INSERT INTO {items} VALUES (3, 'x', 4, 'n', 2.25, 'q3', 7)")
        c.execute("""DELETE FROM public."weird.name" WHERE id = 1""")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, tables)
    assert table_names(lake) == sorted(tables)
    # An added column comes after slotlake's (Delta's schema evolution appends).
    assert read_state(lake, "Sales Dept.Order Items").column_names == [
        "Id", "select", "b.c", "naïve col", "with space", 'quo"te',
        "_fallback", "_missing_toast", "New Col",
    ]  # fmt: skip
    log = read_changes(lake, "Sales Dept.Order Items")
    # Renamed: the older values live under the new name (README: Schema changes).
    assert {"b.c", "New Col"} <= set(log.column_names) and "a.b" not in log.column_names
    assert log.column("_op").to_pylist() == ["I", "I", "U", "U", "I"]


def test_tables_that_inherit_are_mirrored_each_with_its_own_rows(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """Plain inheritance (not partitioning): ``FOR TABLE parent`` publishes the parent
    and the table inheriting from it, each with its own rows, as pgoutput sends them and
    the bootstrap copies them (``ONLY``); a column added to the parent reaches both, and
    the child's rows stay its own when it stops inheriting."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    keys = {"public.parent": "id", "public.child": "id"}
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(AUDIT_SQL)
        c.execute("CREATE TABLE parent (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE child (w int) INHERITS (parent)")
        c.execute("ALTER TABLE child ADD PRIMARY KEY (id)")
        c.execute("CREATE PUBLICATION pub FOR TABLE parent")
        c.execute("INSERT INTO parent SELECT g, 'p' FROM generate_series(1, 3) g")
        c.execute("INSERT INTO child SELECT g, 'c', g FROM generate_series(11, 13) g")
        run_bootstrap(cfg)
        for table in ("parent", "child"):  # the changes after the copy
            audit(c, table, "id")
        c.execute("UPDATE parent SET v = v || '!' WHERE id IN (1, 11)")  # both tables
        c.execute("DELETE FROM parent WHERE id IN (2, 12)")
        c.execute("INSERT INTO child VALUES (14, 'c', 14)")
        c.execute("ALTER TABLE parent ADD COLUMN z int DEFAULT 7")
        c.execute("UPDATE parent SET z = 8 WHERE id = 13")
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, lake, list(keys))
        assert read_state(lake, "public.parent").num_rows == 2
        c.execute("ALTER TABLE child NO INHERIT parent")
        c.execute("UPDATE child SET v = 'free'")
        c.execute("TRUNCATE parent")  # no longer the child's rows
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, lake, list(keys))
        assert read_state(lake, "public.child").num_rows == 3
        assert_log_matches_audit(c, lake, keys)


def test_update_without_prior_state_lists_missing_toast(
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
        c.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("INSERT INTO t VALUES (1, 'before the slot', %s)", (big(1),))
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("UPDATE t SET v = 'after' WHERE id = 1")
        run_sync(make_config(pg_dsn, lake, slot), spark=spark)
    changes = read_changes(lake, "public.t").to_pylist()
    assert [(r["_op"], r["id"], r["v"], r["big"], r["_missing_toast"]) for r in changes] == [
        ("U", 1, "after", None, ["big"])
    ]
    state = read_state(lake, "public.t").to_pylist()
    assert [(r["id"], r["v"], r["big"], r["_missing_toast"]) for r in state] == [
        (1, "after", None, ["big"])
    ]


def _audited_toast_tables(c: psycopg.Connection, slot: str, names: dict[str, str]) -> None:
    """Tables ``(key int PRIMARY KEY, v text, big text)`` with ``big`` stored out of line,
    each audited, all in publication ``pub``, and the slot created after them."""
    c.execute(AUDIT_SQL)
    for qualified, key in names.items():
        t = qualified.split(".")[1]
        c.execute(f"CREATE TABLE {t} ({key} int PRIMARY KEY, v text, big text)")
        c.execute(f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL")
        audit(c, t, key)
    tables = ", ".join(q.split(".")[1] for q in names)
    c.execute(f"CREATE PUBLICATION pub FOR TABLE {tables}")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def test_small_tables_batch_starts_no_spark(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its tables exist, a batch of small keyed tables is done on the driver
    (slotlake.local_table): TOAST filled from the prior state, a key change, a TRUNCATE,
    and not a single SparkSession asked for."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    names = {"public.a": "id", "public.b": "id", "public.c": "k"}
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _audited_toast_tables(c, slot, names)
        for t, key in (("a", "id"), ("b", "id"), ("c", "k")):
            c.execute(
                f"INSERT INTO {t} ({key}, v, big) SELECT g, 'v', repeat(md5(g::text), 200) "
                "FROM generate_series(1, 5) g"
            )
        run_sync(cfg, spark=spark)  # creates the Delta tables

        def no_spark(_cfg: object) -> None:
            raise AssertionError("a SparkSession was asked for")

        monkeypatch.setattr("slotlake.sync._session", no_spark)
        c.execute("UPDATE a SET v = 'w' WHERE id <= 3")  # big unchanged: from the prior state
        c.execute("UPDATE a SET id = 10 WHERE id = 4")  # a key change, big unchanged
        c.execute("DELETE FROM b WHERE id = 2")
        c.execute("INSERT INTO b VALUES (6, 'new', 'x')")
        c.execute("TRUNCATE c")
        c.execute("INSERT INTO c VALUES (1, 'again', 'y')")
        result = run_sync(cfg, spark=None)
        assert result.status == "committed"
        assert slot_confirmed(c, slot) == str(result.end_lsn)
        assert_mirror(c, lake, list(names))
        assert_log_matches_audit(c, lake, names)
    changes = read_changes(lake, "public.a")
    assert not any(changes.column("_missing_toast").to_pylist())
    assert read_changes(lake, "public.c").column("_op").to_pylist().count("T") == 1
    assert _writers(lake, "public.a") == {"slotlake"}


@pytest.mark.one_pg_version
def test_driver_gives_a_table_past_its_byte_bound_to_spark(
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    """``lake.driver_write_mb`` bounds the payloads the driver holds: a table whose
    changes carry more (wide rows) is given back to Spark while the raw batch is read;
    the small one stays on the driver, and both mirror the source."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    cfg.lake.driver_write_mb = 1
    names = {"public.wide": "id", "public.narrow": "id"}
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _audited_toast_tables(c, slot, names)
        for rounds in range(2):
            # wide: 60 rows of ~30 kB (1.8 MB of payloads); narrow: a few bytes a row.
            c.execute(
                "INSERT INTO wide SELECT g, 'v', repeat(md5(g::text), 950) "
                "FROM generate_series(%s::int, %s::int) g",
                (rounds * 100 + 1, rounds * 100 + 60),
            )
            c.execute(
                "INSERT INTO narrow SELECT g, 'v', 'x' FROM generate_series(%s::int, %s::int) g",
                (rounds * 100 + 1, rounds * 100 + 60),
            )
            c.execute("UPDATE wide SET v = 'w' WHERE id % 7 = 0")  # big: from the state
            c.execute("UPDATE narrow SET v = 'w' WHERE id % 7 = 0")
            result = run_sync(cfg, spark=spark)
            assert result.status == "committed"
            assert_mirror(c, lake, list(names))
            assert_log_matches_audit(c, lake, names)
    assert _writers(lake, "public.wide", "changes") == {"spark"}
    assert _writers(lake, "public.narrow", "changes") == {"slotlake"}


def _restart_lsn(c: psycopg.Connection, slot: str) -> Lsn:
    row = c.execute(
        "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def _wait_for_the_wal_writer(c: psycopg.Connection) -> None:
    """Until all WAL inserted is flushed (records not of a commit wait for the WAL writer)."""
    deadline = time.monotonic() + 10
    while c.execute(
        "SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()"
    ).fetchone() == (True,):
        assert time.monotonic() < deadline, "the WAL writer did not flush within 10 s"
        time.sleep(0.02)


def test_the_slot_restart_point_follows_the_batches(
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    """Every peek and advance decodes from the slot's restart point. On PostgreSQL 16 a
    batch over enough WAL logs the running transactions before reading its target, so
    the next batch's advance moves the restart point to about this batch's end (the
    server's own such records come every 15 s at most: back-to-back batches decoded
    earlier ones again). An idle source still comes to rest: its runs end up to date.
    PostgreSQL 15 has no such function: the batches are the same, nothing is logged."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        # Autovacuum would analyze r's 6,000 new rows whenever its naptime ends: WAL.
        c.execute("CREATE TABLE r (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = off)")
        c.execute("CREATE PUBLICATION pub FOR TABLE r")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        created = _restart_lsn(c, slot)
        pg16 = c.info.server_version >= 160000
        targets = []
        for n in range(3):
            # ~300 KiB of WAL a batch: past source.LOG_SNAPSHOT_MIN_BYTES.
            c.execute(
                "INSERT INTO r SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s::int) g",
                (n * 2000 + 1, n * 2000 + 2000),
            )
            result = run_sync(cfg, spark=spark)
            assert result.status == "committed"
            targets.append(Lsn(result.target_lsn))
        assert_mirror(c, lake, ["public.r"])
        restart = _restart_lsn(c, slot)
        if pg16:
            # The first batch's record lies past its target; the second batch's advance
            # passed it, the third's the second's.
            assert restart > targets[0], (restart, targets)
        else:
            assert restart >= created
        # The last batch's record lies past its target and the WAL writer flushes it
        # within wal_writer_delay: the run after that takes it as a batch of no change;
        # then the source is at rest. Runs faster than the WAL writer met it one or two
        # runs later (CI once saw up to date, up to date, committed), so each run here
        # waits for the flush first. The server's own WAL (a checkpoint; autovacuum is
        # off for r) can still make one more run a batch of no change: rest is two runs
        # up to date in a row, which a run that logged a record for the next never reaches.
        statuses: list[str] = []
        while statuses[-2:] != ["up_to_date", "up_to_date"] and len(statuses) < 6:
            _wait_for_the_wal_writer(c)
            statuses.append(run_sync(cfg, spark=spark).status)
        assert statuses[-2:] == ["up_to_date", "up_to_date"], statuses
        assert set(statuses) <= {"committed", "up_to_date"}, statuses
        (rest,) = c.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()  # type: ignore[misc]
    # At rest a run logs nothing: the WAL since the slot's position is below the threshold.
    with open_source(cfg) as src:
        assert src.log_restart_point(after=Lsn.parse(rest)) is None
    # The setting reaches the source: off, nothing is logged, however much WAL there is.
    cfg.source.log_snapshots = False
    with open_source(cfg) as src:
        assert src.log_restart_point(after=Lsn(0)) is None
    cfg.source.log_snapshots = True
    with open_source(cfg) as src:
        assert (src.log_restart_point(after=Lsn(0)) is not None) == pg16
