"""Bootstrap of many small tables on the driver, beside a big one copied by Spark.

Thirty small tables (keyed ones, a multiset without a key, a REPLICA IDENTITY FULL one, one
with text[] and numeric columns) and one table big enough for Spark's parallel ranges: the
small ones must be copied and written without Spark (asserted from the Delta logs: who
wrote each commit), their Delta tables must be what Spark would have created (protocol,
configuration, column mapping ids, schema), every state must equal its source, and
syncs afterwards — the driver-side MERGE, Spark's MERGE, a RENAME COLUMN — must work on
them. A bootstrap failing half-way through the small tables leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from slotlake import bootstrap as bootstrap_module
from slotlake import dv_merge, key_index
from slotlake.batch import DriverWrites
from slotlake.bootstrap import multiset_rows, run_bootstrap
from slotlake.delta import DRIVER_ENGINE
from slotlake.lake import COPIES, Lake, read_state
from slotlake.multiset_arrow import multiset_table
from slotlake.sync import run_sync

from .sync_helpers import assert_mirror, key_indexes_made, make_config

KEYED = [f"k_{i:02d}" for i in range(1, 27)]
SCHEMA = (
    "".join(
        f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(10,2), ts timestamp);\n"
        for t in KEYED
    )
    + """
CREATE TABLE arr_t (id bigint PRIMARY KEY, tags text[], amount numeric, price numeric(12,3),
                    f float8);
CREATE TABLE nokey_t (x int, y text, tags int[]);
CREATE TABLE full_t (a int, b text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
-- The big table and its small twin: the same columns, one through each path.
CREATE TABLE big_t (id bigint PRIMARY KEY, payload text, ts timestamp, n numeric(12,2));
CREATE TABLE twin_t (id bigint PRIMARY KEY, payload text, ts timestamp, n numeric(12,2));
CREATE PUBLICATION pub FOR ALL TABLES;
"""
)
SMALL = [*KEYED, "arr_t", "nokey_t", "full_t", "twin_t"]
ALL = [f"public.{t}" for t in [*SMALL, "big_t"]]


def _populate(c: psycopg.Connection) -> None:
    for i, t in enumerate(KEYED):
        c.execute(
            f"INSERT INTO {t} SELECT g, 'v' || g || repeat('é', g % 3), g * 1.25 + {i},"
            " timestamp '2024-01-01' + g * interval '1 hour' FROM generate_series(1, 20) g"
        )
    c.execute(
        "INSERT INTO arr_t VALUES"
        " (1, '{a,b,\"c d\"}', 1e-30, 1.5, 'NaN'), (2, '{}', 'NaN', NULL, -0.0),"
        " (3, NULL, 123456789012345678901234567890.5, 'NaN', 'Infinity'),"
        " (4, '{{x,y},{z,w}}', -1, 2.125, 0.1), (5, ARRAY[NULL, 'q\"uote', ''], 7, -3, 1e300)"
    )
    c.execute(
        "INSERT INTO nokey_t VALUES (1, 'dup', '{1,2}'), (1, 'dup', '{1,2}'), (1, 'dup', '{1,3}'),"
        " (2, NULL, NULL), (2, NULL, NULL), (3, 'one', '{}')"
    )
    c.execute("INSERT INTO full_t VALUES (1, 'a'), (1, 'a'), (2, 'b'), (3, NULL)")
    for t, rows in (("big_t", 40_000), ("twin_t", 10)):
        c.execute(
            f"INSERT INTO {t} SELECT g, repeat(md5(g::text), 2), timestamp '2024-01-01' + g *"
            f" interval '1 minute', g / 7.0 FROM generate_series(1, {rows}) g"
        )


def _log_entries(lake: str, rel: str) -> dict[int, dict[str, Any]]:
    """Version → its commit's actions (by kind), read from the table's Delta log."""
    out: dict[int, dict[str, Any]] = {}
    for f in sorted((Path(lake) / rel / "_delta_log").glob("*.json")):
        out[int(f.stem)] = {
            k: v for line in f.read_text().splitlines() for k, v in json.loads(line).items()
        }
    return out


def _engines(lake: str, rel: str) -> list[str]:
    return [
        e["commitInfo"].get("engineInfo", "") for _, e in sorted(_log_entries(lake, rel).items())
    ]


def _shape(lake: str, rel: str) -> tuple[Any, ...]:
    """What a Delta table is, apart from its ids and files: protocol, configuration, and
    the schema with each field's column mapping id (physical names are random)."""
    v0 = _log_entries(lake, rel)[0]
    proto = dict(v0["protocol"])
    for k in ("readerFeatures", "writerFeatures"):
        proto[k] = sorted(proto[k])

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "delta.columnMapping.physicalName"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(json.loads(v0["metaData"]["schemaString"]))
    return proto, v0["metaData"]["configuration"], schema


def test_small_tables_on_the_driver(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    cfg.lake.bootstrap_driver_mb = 1  # big_t (~3 MB) is not a small table...
    # ... and goes to Spark instead of being streamed on the driver: what Spark creates is
    # compared below with what the driver creates.
    monkeypatch.setattr(bootstrap_module, "streamed_on_driver", lambda plan, limit: False)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        _populate(c)
        lines: list[str] = []
        result = run_bootstrap(cfg, spark=spark, parallel=3, progress=lines.append)
        assert set(result.tables) == set(ALL)
        assert {n for n, t in result.tables.items() if not t.driver} == {"public.big_t"}
        for name in ALL:  # one progress line per table, saying which path
            (line,) = [x for x in lines if x.startswith(f"bootstrap: {name}: ")]
            assert ("on the driver" in line) == (name != "public.big_t"), line
        rec = Lake(lake).last_commit()
        assert rec is not None and rec.kind == "bootstrap"

        # Who wrote what, from the Delta logs: the driver created the small tables' state
        # and change log and wrote their copies (its own commit for a copy held whole,
        # deltalake's for one streamed); Spark did both for big_t.
        for name in ALL:
            t = rec.tables[name]
            assert (t.state_version, t.changes_version) == (1, 0), name
            state, changes = _engines(lake, t.state), _engines(lake, t.changes)
            if name == "public.big_t":
                assert all(e.startswith("Apache-Spark") for e in state + changes), state
            else:
                assert state[0] == DRIVER_ENGINE and len(state) == 2, state
                assert state[1] == DRIVER_ENGINE or state[1].startswith("delta-rs"), state
                assert changes == [DRIVER_ENGINE], changes
            entries = _log_entries(lake, t.state)
            assert entries[1]["commitInfo"]["operationParameters"]["mode"] == "Overwrite"
            txn = entries[1]["txn"]  # the attempt's marker, whichever engine wrote
            assert (txn["appId"], txn["version"]) == (rec.txn_app_id, rec.batch), name
        assert _engines(lake, "transactions") == [DRIVER_ENGINE]
        # The driver's tables are the tables Spark creates: same protocol, configuration,
        # schema and column mapping ids (twin_t has big_t's columns), change logs included.
        big, twin = rec.tables["public.big_t"], rec.tables["public.twin_t"]
        assert _shape(lake, twin.state) == _shape(lake, big.state)
        assert _shape(lake, twin.changes) == _shape(lake, big.changes)
        proto = _log_entries(lake, twin.changes)[0]["protocol"]
        assert set(proto["readerFeatures"]) == {"deletionVectors", "columnMapping", "timestampNtz"}

        assert_mirror(c, lake, ALL)
        # Multisets: one row per distinct value, with its copies (tags compared whole).
        assert read_state(lake, "public.nokey_t").num_rows == 6
        assert rec.tables["public.nokey_t"].state_rows == 4
        arr = {r["id"]: r for r in read_state(lake, "public.arr_t").to_pylist()}
        assert arr[1]["tags"] == ["a", "b", "c d"] and arr[2]["amount"] == "NaN"
        assert dict(arr[3]["_fallback"]) == {"price": "NaN"}
        assert dict(arr[4]["_fallback"]) == {"tags": "{{x,y},{z,w}}"}

        # A sync on the tables the driver wrote: deltalake's MERGE on the keyed ones, a
        # rebuilt state on the (small) multisets, and RENAME COLUMN (column mapping) on
        # one of each (ADD and DROP COLUMN too on the keyed one): columns change in one
        # log entry the driver writes, no Spark.
        c.execute("UPDATE k_01 SET v = 'changed', n = n + 1 WHERE id <= 5")
        c.execute("DELETE FROM k_02 WHERE id % 2 = 0")
        c.execute("ALTER TABLE k_03 RENAME COLUMN v TO v_renamed")
        c.execute("UPDATE k_03 SET v_renamed = 'after rename' WHERE id < 4")
        c.execute("ALTER TABLE k_03 ADD COLUMN extra text, DROP COLUMN ts")
        c.execute("UPDATE k_03 SET extra = 'added' WHERE id > 17")
        c.execute("UPDATE arr_t SET tags = '{again}', f = 2 WHERE id IN (1, 2)")
        c.execute("ALTER TABLE full_t RENAME COLUMN b TO b_renamed")
        c.execute("DELETE FROM full_t WHERE ctid = (SELECT min(ctid) FROM full_t WHERE a = 1)")
        c.execute("INSERT INTO nokey_t VALUES (1, 'dup', '{1,2}')")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, ALL)
        after = Lake(lake).last_commit()
        assert after is not None
        # (table, renamed column, non-null values it has, engine and operation of the write)
        for name, column, values, engine, operation in (
            ("public.k_03", "v_renamed", 20, DRIVER_ENGINE, "MERGE"),
            ("public.full_t", "b_renamed", 2, DRIVER_ENGINE, "WRITE"),
        ):
            state = after.tables[name].state
            assert column in read_state(lake, name).column_names
            for side in (state, after.tables[name].changes):
                assert not any(e.startswith("Apache-Spark") for e in _engines(lake, side))
            ops = [
                (e["commitInfo"].get("engineInfo", ""), e["commitInfo"]["operation"])
                for v, e in sorted(_log_entries(lake, state).items())
                if v > 1
            ]
            assert ops[0] == (DRIVER_ENGINE, "CHANGE COLUMNS"), ops  # column mapping: no Spark
            assert ops[-1][1] == operation and ops[-1][0].startswith(engine), ops
            # Spark reads the renamed column of what the driver wrote, old rows included.
            got = spark.read.format("delta").load(Lake(lake).path(state))
            assert got.filter(f"{column} IS NOT NULL").count() == values, name


def test_failure_among_small_tables_leaves_nothing(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for i in range(6):
            c.execute(f"CREATE TABLE t{i} (id int PRIMARY KEY, v text)")
            c.execute(f"INSERT INTO t{i} SELECT g, 'v' FROM generate_series(1, 10) g")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        real = bootstrap_module._DriverCopies.copy

        def flaky(self, plan, rels):  # type: ignore[no-untyped-def]
            if plan.name == "public.t3":
                raise RuntimeError("injected copy failure")
            return real(self, plan, rels)

        monkeypatch.setattr(bootstrap_module._DriverCopies, "copy", flaky)
        lines: list[str] = []
        with pytest.raises(RuntimeError, match="injected"):
            run_bootstrap(cfg, spark=spark, parallel=2, progress=lines.append)
        # Tables written before the failure were removed, the slot dropped.
        for folder in ("state", "changes", "transactions"):
            assert not list((Path(lake) / folder).glob("*")), folder
        assert any("dropped the slot" in line for line in lines)
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)


def test_rebootstrap_onto_lake_evolves_small_tables(
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    """--onto-existing-lake over small tables whose columns changed at the source: Spark's
    ALTER TABLE evolves the driver's tables first, the copy is written in their order."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, a text, b int, c text)")
        c.execute("INSERT INTO t SELECT g, 'a' || g, g, 'c' FROM generate_series(1, 5) g")
        c.execute("CREATE TABLE same (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO same VALUES (1, 'one')")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        run_bootstrap(cfg, spark=spark)
        c.execute("ALTER TABLE t RENAME COLUMN a TO a2")
        c.execute("ALTER TABLE t DROP COLUMN c")
        c.execute("ALTER TABLE t ADD COLUMN d numeric(5,1) DEFAULT 1.5")
        c.execute("ALTER TABLE t ALTER COLUMN b TYPE text")
        c.execute("INSERT INTO t VALUES (6, 'a6', 'six', 2.5)")
        result = run_bootstrap(cfg, spark=spark, rebootstrap=True, onto_existing_lake=True)
        assert all(t.driver for t in result.tables.values())
        rec = Lake(lake).last_commit()
        assert rec is not None and rec.batch == 2
        state = rec.tables["public.t"].state
        ops = [
            (e["commitInfo"].get("engineInfo", ""), e["commitInfo"]["operation"])
            for _, e in sorted(_log_entries(lake, state).items())
        ]
        assert ops[-1] == (ops[-1][0], "WRITE") and ops[-1][0].startswith("delta-rs"), ops
        assert any(e.startswith("Apache-Spark") for e, _ in ops[2:-1]), ops  # the ALTERs
        # Only the table that changed needed Spark; the other kept its two entries + copy.
        assert all(
            not e.startswith("Apache-Spark")
            for e in _engines(lake, rec.tables["public.same"].state)
        )
        assert set(read_state(lake, "public.t").column_names) == {
            "id",
            "a2",
            "b",
            "d",
            "_fallback",
            "_missing_toast",
        }
        assert_mirror(c, lake, ["public.t", "public.same"])
        c.execute("UPDATE t SET d = 9.5, b = 'x' WHERE id <= 2")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, ["public.t", "public.same"])


def test_multiset_table_groups_as_spark(spark) -> None:
    """The driver's pyarrow grouping of a multiset equals Spark's (multiset_rows)."""
    from pyspark.sql.types import StructType

    from slotlake.decode import arrow_schema_for

    ddl = (
        "f double, r float, d decimal(10,2), s string, a array<double>, ts timestamp,"
        " _fallback map<string,string>, _missing_toast array<string>"
    )
    schema = arrow_schema_for(StructType.fromDDL(ddl))
    nan = float("nan")
    rows = [
        (-0.0, 1.0, "1.00", "x", [-0.0, nan], 1, [("d", "b"), ("s", "a")]),
        (0.0, 1.0, "1.00", "x", [0.0, nan], 1, [("s", "a"), ("d", "b")]),
        (nan, None, None, None, None, None, []),
        (nan, None, None, None, None, None, []),
        (1.5, 2.5, "3.10", "", [], 2, []),
        (1.5, 2.5, "3.10", None, [], 2, []),
        (1.5, 2.5, "3.10", "", None, 2, []),
        (1.5, 2.5, "3.10", "", [], 2, [("f", "NaN")]),
    ]
    from datetime import datetime, timezone
    from decimal import Decimal

    table = pa.Table.from_pylist(
        [
            {
                "f": f,
                "r": r,
                "d": None if d is None else Decimal(d),
                "s": s,
                "a": a,
                "ts": None if ts is None else datetime(2024, 1, ts, tzinfo=timezone.utc),
                "_fallback": fb,
                "_missing_toast": [],
            }
            for f, r, d, s, a, ts, fb in rows
        ],
        schema=schema,
    )
    columns = ["f", "r", "d", "s", "a", "ts"]
    ours = multiset_table(table, columns)
    theirs = multiset_rows(spark.createDataFrame(table), columns).toArrow()
    assert ours.column_names == theirs.column_names
    assert ours.column_names == [*columns, "_fallback", "_missing_toast", COPIES]

    def canon(t: pa.Table) -> list[str]:
        # Map entries in any order; floats by their text (-0.0 and 0.0 differ, NaN is NaN).
        return sorted(
            json.dumps(dict(r, _fallback=sorted(r["_fallback"])), default=repr, sort_keys=True)
            for r in t.to_pylist()
        )

    assert canon(ours) == canon(theirs)
    assert sorted(theirs.column(COPIES).to_pylist()) == [1, 1, 1, 1, 2, 2]


def test_big_table_streamed_on_the_driver(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch
) -> None:
    """A keyed table too big for the small tables' pool is streamed on the driver, its
    ranges copied at once, without starting Spark; a copy failing half-way commits nothing
    and undoes the attempt; the rerun mirrors the source and syncs on from there."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    cfg.lake.bootstrap_driver_mb = 1  # big (~5 MB) is not a small table
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE big (id int8 PRIMARY KEY, v text, n numeric(10,2), at timestamptz)")
        c.execute(
            "INSERT INTO big SELECT g, repeat('x', g % 50), g / 3.0, "
            "timestamptz '2024-01-01 00:00+00' + g * interval '1 minute' "
            "FROM generate_series(1, 60000) g"
        )
        c.execute("UPDATE big SET n = 'NaN' WHERE id = 7")  # a fallback value in a range
        c.execute("CREATE TABLE small (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO small VALUES (1, 'one')")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")

        def no_spark(cfg):  # type: ignore[no-untyped-def]
            raise AssertionError("the bootstrap started Spark")

        monkeypatch.setattr(bootstrap_module, "_session", no_spark)
        real = bootstrap_module.convert_csv
        calls = []

        def flaky(chunk, plan, schema):  # type: ignore[no-untyped-def]
            if plan.name == "public.big":
                calls.append(1)
                if len(calls) == 2:
                    raise RuntimeError("injected failure in the second batch")
            return real(chunk, plan, schema)

        monkeypatch.setattr(bootstrap_module, "convert_csv", flaky)
        lines: list[str] = []
        with pytest.raises(RuntimeError, match="injected failure in the second batch"):
            run_bootstrap(cfg, parallel=3, min_range_blocks=1, progress=lines.append)
        for folder in ("state", "changes", "transactions"):
            assert not list((Path(lake) / folder).glob("*")), folder
        assert any("dropped the slot" in line for line in lines)
        # No copy connection is left behind by the stopped range threads.
        assert c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'slotlake:%'"
        ).fetchone() == (0,)

        monkeypatch.setattr(bootstrap_module, "convert_csv", real)
        # Files this big get key indexes ahead (slotlake.key_index): by the bootstrap.
        monkeypatch.setattr(key_index, "AHEAD_MIN_ROWS", 1000)
        lines.clear()
        result = run_bootstrap(cfg, parallel=3, min_range_blocks=1, progress=lines.append)
        copied = result.tables["public.big"]
        assert copied.driver and copied.ranges == 3 and copied.rows == 60000
        (line,) = [x for x in lines if x.startswith("bootstrap: public.big: ")]
        assert line.endswith("on the driver, 3 range(s))"), line
        rec = Lake(lake).last_commit()
        assert rec is not None and rec.tables["public.big"].state_rows == 60000
        t = rec.tables["public.big"]
        assert _engines(lake, t.state)[1].startswith("delta-rs")
        assert_mirror(c, lake, ["public.big", "public.small"])
        rows = {r["id"]: r for r in read_state(lake, "public.big").to_pylist()}
        assert dict(rows[7]["_fallback"]) == {"n": "NaN"} and rows[7]["n"] is None

        (made,) = [x for x in lines if "key indexes" in x]
        assert made.startswith(f"bootstrap: {t.state}: key indexes of ") and "small" not in made
        indexed = len(list((Path(lake) / str(t.state) / key_index.DIRECTORY).glob("*.npy")))
        assert indexed >= 1 and f"of {indexed} files made" in made

        # The first sync's MERGE (by deletion vectors here) finds every index made.
        monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
        monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)
        making = key_indexes_made(monkeypatch)
        c.execute("UPDATE big SET v = 'changed' WHERE id % 1000 = 0")
        c.execute("DELETE FROM big WHERE id BETWEEN 100 AND 110")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert not making, making
        assert_mirror(c, lake, ["public.big", "public.small"])
