"""Bootstrap: slot + initial copy in its exported snapshot, then syncs continue from it.

Tables with existing rows (TOAST-sized values, every replica identity, a column list, a
row filter, a partitioned table published via its root and one published as its leaves,
a schema publication), writes running while the copy runs, then bootstrap + syncs: the
state equals the source after every batch, no change-log row misses a TOAST value, and
no row arrives twice. Then every refusal.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from slotlake import bootstrap as bootstrap_module
from slotlake import cli
from slotlake.bootstrap import BootstrapError, read_plan, run_bootstrap, split_ranges
from slotlake.config import Config
from slotlake.ddl import installed as ddl_installed
from slotlake.lake import COPIES, Lake, OldLayoutError, read_changes, read_delta, read_state
from slotlake.localpg import LocalPostgres
from slotlake.lsn import Lsn
from slotlake.source import lock_key
from slotlake.sync import run_sync
from slotlake.verify import compare_table

from .sync_helpers import make_config, slot_confirmed, streaming_from

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE kv (
    id int PRIMARY KEY, txt text, big text, num numeric(12,3), ts timestamptz, d date,
    arr int[], j jsonb, f float8, r real, by bytea, m mood, p posint, flag bool, u uuid,
    s smallint, n numeric, g int GENERATED ALWAYS AS (id * 2) STORED
);
ALTER TABLE kv ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_t (a int, b text, big text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
ALTER TABLE full_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE idx_t (id int NOT NULL, code text NOT NULL, val text, big text);
CREATE UNIQUE INDEX idx_t_code ON idx_t (code) INCLUDE (id);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_code;
ALTER TABLE idx_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE nothing_t (x int, y text);
ALTER TABLE nothing_t REPLICA IDENTITY NOTHING;
CREATE TABLE nokey_t (x int, y text);
CREATE TABLE cl (id int PRIMARY KEY, a text, secret text, big text);
ALTER TABLE cl ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE rf (id int PRIMARY KEY, region text, big text);
ALTER TABLE rf ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE meas (id int PRIMARY KEY, at date, big text) PARTITION BY RANGE (id);
CREATE TABLE meas_1 PARTITION OF meas FOR VALUES FROM (0) TO (1000);
CREATE TABLE meas_2 PARTITION OF meas FOR VALUES FROM (1000) TO (1000000);
ALTER TABLE meas ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE leafy (id int PRIMARY KEY, v text, big text) PARTITION BY RANGE (id);
CREATE TABLE leafy_a PARTITION OF leafy FOR VALUES FROM (0) TO (1000);
CREATE TABLE leafy_b PARTITION OF leafy FOR VALUES FROM (1000) TO (1000000);
ALTER TABLE leafy ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE SCHEMA s2;
CREATE TABLE s2.t (id bigint PRIMARY KEY, v text);
CREATE PUBLICATION pub FOR TABLE kv, full_t, idx_t, nothing_t, nokey_t;
CREATE PUBLICATION pub_cl FOR TABLE cl (id, a, big), rf WHERE (id < 1000);
CREATE PUBLICATION pub_root FOR TABLE meas WITH (publish_via_partition_root = true);
CREATE PUBLICATION pub_leaf FOR TABLE leafy;
CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA s2;
"""
PUBLICATIONS = ("pub", "pub_cl", "pub_root", "pub_leaf", "pub_schema")
# Published table → (columns, row filter) to compare with; None = every column / row.
TABLES: dict[str, tuple[list[str] | None, str | None]] = {
    "public.kv": (None, None),
    "public.full_t": (None, None),
    "public.idx_t": (None, None),
    "public.nothing_t": (None, None),
    "public.nokey_t": (None, None),
    "public.cl": (["id", "a", "big"], None),
    "public.rf": (None, "id < 1000"),
    "public.meas": (None, None),
    "public.leafy_a": (None, None),
    "public.leafy_b": (None, None),
    "s2.t": (None, None),
}
TRICKY_TEXT = [
    "plain",
    "",
    'comma, "quote" and\nnewline\ttab \\ backslash',
    "zeile — ünïcödé ✓ 🐘",
    "\\N",
    "\r\ncrlf",
    " leading space",
]


def big(seed: int, n: int = 9000) -> str:
    # Digit chains compress poorly enough to be stored out of line (EXTERNAL anyway).
    return "".join(f"{(seed * 7919 + i) % 1_000_003:07d}" for i in range(n // 7))


def _populate(c: psycopg.Connection) -> None:
    for i in range(1, 301):
        c.execute(
            "INSERT INTO kv (id, txt, big, num, ts, d, arr, j, f, r, by, m, p, flag, u, s, n)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, gen_random_uuid(),"
            " %s, %s)",
            (
                i,
                None if i % 11 == 0 else TRICKY_TEXT[i % len(TRICKY_TEXT)] + f" {i}",
                big(i) if i % 3 == 0 else f"small {i}",
                "NaN" if i == 3 else f"{i}.125",
                "infinity" if i == 4 else f"2024-03-{i % 28 + 1:02d} 12:34:56.789+02",
                "-infinity" if i == 5 else f"2020-01-{i % 28 + 1:02d}",
                [[1, 2], [3, 4]] if i == 6 else ([i, None, -i] if i % 4 else []),
                Jsonb({"i": i, "s": 'q"uote', "nested": [1, None]}),
                float("inf") if i == 8 else float("nan") if i == 9 else i / 3,
                i / 7,
                bytes([0, i % 256, 255, 10, 44]),
                ["sad", "ok", "happy", None][i % 4],
                i,
                None if i % 13 == 0 else i % 2 == 0,
                i % 30000,
                "1e-30" if i == 10 else f"{i}.{i}",
            ),
        )
    c.execute(
        "INSERT INTO full_t VALUES (1, 'dup', %s), (1, 'dup', %s), (2, 'two', NULL), (3, NULL, 'x')",
        (big(100), big(100)),
    )
    c.execute(
        "INSERT INTO idx_t SELECT g, 'code' || g, 'v' || g, CASE WHEN g %% 2 = 0 THEN %s END"
        " FROM generate_series(1, 40) g",
        (big(200),),
    )
    c.execute("INSERT INTO nothing_t VALUES (1, 'n'), (1, 'n'), (2, NULL)")
    c.execute("INSERT INTO nokey_t VALUES (1, 'k'), (1, 'k')")
    c.execute(
        "INSERT INTO cl SELECT g, 'a' || g, 'secret' || g, %s FROM generate_series(1, 30) g",
        (big(300),),
    )
    c.execute(
        "INSERT INTO rf SELECT g, CASE WHEN g %% 2 = 0 THEN 'eu' ELSE 'us' END, %s"
        " FROM generate_series(990, 1010) g",
        (big(400),),
    )
    c.execute(
        "INSERT INTO meas SELECT g, date '2024-01-01' + g, %s FROM generate_series(990, 1010) g",
        (big(500),),
    )
    c.execute(
        "INSERT INTO leafy SELECT g, 'v' || g, %s FROM generate_series(995, 1005) g", (big(600),)
    )
    c.execute("INSERT INTO s2.t SELECT g, 't' || g FROM generate_series(1, 5) g")


class Writer(threading.Thread):
    """Small committed transactions, before, during and after the bootstrap's copy."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.inserted: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as c:
                i = 10_000
                while not self.stop.is_set():
                    i += 1
                    with c.transaction():
                        c.execute(
                            "INSERT INTO kv (id, txt, big) VALUES (%s, 'writer', %s)", (i, big(i))
                        )
                        # Leaves big out of a row that existed before the slot.
                        c.execute("UPDATE kv SET txt = %s WHERE id = %s", (f"w{i}", i % 300 + 1))
                    c.execute("INSERT INTO full_t VALUES (%s, 'writer', %s)", (i, big(i)))
                    c.execute(
                        "INSERT INTO meas VALUES (%s, NULL, %s)", (i, "m" if i % 2 else big(i))
                    )
                    c.execute("UPDATE meas SET at = now()::date WHERE id = %s", (990 + i % 21,))
                    self.inserted.append(i)
                    time.sleep(0.005)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _assert_states(c: psycopg.Connection, lake: str) -> None:
    for table, (columns, where) in TABLES.items():
        cmp = compare_table(c, lake, table, columns, where)
        assert cmp.equal, cmp.describe()
        assert cmp.source_rows > 0, table


def _assert_no_missing_toast(lake: str) -> None:
    for table in TABLES:
        changes = read_changes(lake, table)
        if changes.num_rows:
            missing = [m for m in changes.column("_missing_toast").to_pylist() if m]
            assert not missing, (table, missing[:3])


def _workload_2(c: psycopg.Connection) -> None:
    # Updates that leave the TOAST column out of rows copied by the bootstrap.
    c.execute("UPDATE kv SET txt = 'touched' WHERE id % 3 = 0 AND id < 100")
    c.execute("UPDATE kv SET id = id + 500 WHERE id IN (30, 33)")  # key change, big unchanged
    c.execute(
        "UPDATE full_t SET b = 'changed' WHERE a = 1 AND ctid = (SELECT min(ctid) FROM full_t WHERE a = 1)"
    )
    c.execute("UPDATE idx_t SET val = 'vv' WHERE id % 2 = 0")
    c.execute("UPDATE idx_t SET code = 'moved' WHERE id = 4")
    c.execute("UPDATE cl SET a = 'aa', secret = 'not published' WHERE id <= 10")
    c.execute("UPDATE rf SET region = 'xx' WHERE id BETWEEN 990 AND 1005")
    c.execute("UPDATE meas SET at = NULL WHERE id BETWEEN 990 AND 1010")
    c.execute("UPDATE leafy SET v = 'vv' WHERE id BETWEEN 995 AND 1005")
    c.execute("UPDATE s2.t SET v = 'changed' WHERE id = 1")
    c.execute("INSERT INTO nothing_t VALUES (3, 'later')")
    c.execute("INSERT INTO nokey_t VALUES (1, 'k')")


def _workload_3(c: psycopg.Connection) -> None:
    c.execute("DELETE FROM kv WHERE id IN (1, 2, 531)")
    c.execute("UPDATE kv SET flag = NOT coalesce(flag, false) WHERE id BETWEEN 100 AND 120")
    c.execute("DELETE FROM full_t WHERE a = 2")
    c.execute("UPDATE full_t SET b = 'again' WHERE a = 3")
    c.execute("DELETE FROM idx_t WHERE id = 5")
    c.execute("UPDATE cl SET a = 'third' WHERE id BETWEEN 5 AND 15")
    c.execute("UPDATE rf SET id = id + 1000 WHERE id = 991")  # leaves the row filter: a delete
    c.execute("UPDATE rf SET region = 'zz' WHERE id = 992")
    c.execute("DELETE FROM meas WHERE id = 995")
    c.execute("UPDATE meas SET at = date '2030-01-01' WHERE id BETWEEN 996 AND 1005")
    c.execute("UPDATE leafy SET v = 'third' WHERE id = 999")


@pytest.mark.parametrize(
    "copier", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_bootstrap_then_syncs(pg_dsn: str, slot: str, spark, tmp_path: Path, copier: str) -> None:
    """``driver``: a local lake's default, every table copied on the driver (kv, split in
    ranges, streamed with its ranges at once); ``spark``: every table through Spark, as on a
    lake on a Hadoop file system."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot, publications=PUBLICATIONS)
    if copier == "spark":
        cfg.lake.bootstrap_driver_mb = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        _populate(c)
        writer = Writer(pg_dsn)
        writer.start()
        time.sleep(0.3)  # some writes before the slot exists
        lines: list[str] = []
        result = run_bootstrap(
            cfg,
            spark=spark,
            parallel=3,
            min_range_blocks=1,
            progress=lines.append,
            progress_interval=0.2,
        )
        time.sleep(0.3)  # and some after the copy
        writer.stop.set()
        writer.join(timeout=30)
        assert writer.error is None, writer.error

        # The lake's first commit: a bootstrap batch ending at the slot's consistent point.
        rec = Lake(lake).last_commit()
        assert rec is not None and rec.kind == "bootstrap" and rec.batch == 1
        assert rec.start_lsn == rec.end_lsn == rec.target_lsn == str(result.consistent_point)
        assert slot_confirmed(c, slot) == str(result.consistent_point)
        # As a superuser, bootstrap installed the DDL capture trigger (slotlake.ddl).
        assert ddl_installed(c)
        assert "bootstrap: DDL capture trigger installed" in lines
        assert set(rec.tables) == set(TABLES)
        assert result.tables["public.kv"].ranges == 3  # the copy really was split
        on_driver = {n for n, t in result.tables.items() if t.driver}
        assert on_driver == (set(TABLES) if copier == "driver" else set()), on_driver
        # The final line (a slow copy also prints "… so far" lines while it runs).
        (kv_line,) = [
            x for x in lines if x.startswith("bootstrap: public.kv: ") and "so far" not in x
        ]
        assert "rows/s" in kv_line and "MB/s" in kv_line
        assert kv_line.endswith(
            "on the driver, 3 range(s))" if copier == "driver" else " 3 range(s))"
        ), kv_line
        assert read_changes(lake, "public.kv").num_rows == 0
        # Column list: exactly the published columns; generated columns never.
        assert read_state(lake, "public.cl").column_names == [
            "id",
            "a",
            "big",
            "_fallback",
            "_missing_toast",
        ]
        assert "g" not in read_state(lake, "public.kv").column_names
        assert rec.tables["public.kv"].key_columns == ["id"]
        assert rec.tables["public.full_t"].key_columns == ["a", "b", "big"]
        assert rec.tables["public.idx_t"].key_columns == ["code"]  # not the INCLUDE column
        assert rec.tables["public.nothing_t"].key_columns == []
        assert rec.tables["public.nokey_t"].key_columns == []
        assert rec.tables["public.meas"].replica_identity == "d"
        _assert_delta_tables(lake, rec)
        for name, copied in result.tables.items():
            # The copy's own count (Spark accumulators) is what the Delta state holds.
            assert read_state(lake, name, batch=1).num_rows == copied.rows, name
        kv_boot = {r["id"]: r for r in read_state(lake, "public.kv").to_pylist()}
        assert dict(kv_boot[3]["_fallback"]) == {"num": "NaN"} and kv_boot[3]["num"] is None
        assert dict(kv_boot[5]["_fallback"])["d"] == "-infinity"
        assert dict(kv_boot[6]["_fallback"])["arr"] == "{{1,2},{3,4}}"
        # The writer ran on both sides of the consistent point.
        boot_writer = {k for k in kv_boot if k > 10_000}
        assert boot_writer and set(writer.inserted) - boot_writer

        syncs = 0
        # The writer's changes after the consistent point ride along with the first sync.
        for step in (_workload_2, _workload_3):
            step(c)
            out = run_sync(cfg, spark=spark)
            assert out.status == "committed"
            syncs += 1
            _assert_states(c, lake)
        _assert_no_missing_toast(lake)

    # Nothing twice: no row the bootstrap copied is inserted again by a sync.
    inserted = {r["id"] for r in read_changes(lake, "public.kv").to_pylist() if r["_op"] == "I"}
    assert inserted and not (inserted & set(kv_boot))
    assert inserted | boot_writer >= set(writer.inserted)
    # The sync job's Relation messages agree with the bootstrap's catalog.
    lake_ = Lake(lake)
    boot = lake_.read_commit(1).tables
    compared = 0
    for b in range(2, 2 + syncs):
        for name, t in lake_.read_commit(b).tables.items():
            if t.changes:
                compared += 1
                assert (t.columns, t.key_columns, t.replica_identity) == (
                    boot[name].columns,
                    boot[name].key_columns,
                    boot[name].replica_identity,
                ), name
    assert compared >= len(TABLES)


def _assert_delta_tables(lake: str, rec) -> None:  # type: ignore[no-untyped-def]
    """Batch 1 of a bootstrap, as any Delta reader sees it: tables with deletion vectors and
    column mapping, the state written in one commit carrying the bootstrap's txn marker,
    empty change logs, multisets as distinct rows with their copies."""
    from deltalake import DeltaTable

    assert rec.txn_app_id.startswith(Lake(lake).app_id("bootstrap-"))
    assert rec.transactions == "transactions" and rec.transactions_version == 0
    assert read_delta(lake, "transactions", 0).num_rows == 0
    for name, t in rec.tables.items():
        assert t.state == Lake.table_path("state", name) and t.written
        assert t.changes == Lake.table_path("changes", name)
        assert t.changes_version == 0  # created empty
        assert t.state_version == 1  # created, then one overwrite with the copy
        for rel in (t.state, t.changes):
            dt = DeltaTable(f"{lake}/{rel}")
            config = dt.metadata().configuration
            assert config["delta.enableDeletionVectors"] == "true", (rel, config)
            assert config["delta.columnMapping.mode"] == "name", (rel, config)
            proto = dt.protocol()
            assert (proto.min_reader_version, proto.min_writer_version) == (3, 7)
            assert {"deletionVectors", "columnMapping"} <= set(proto.reader_features or [])
        state = DeltaTable(f"{lake}/{t.state}", version=t.state_version)
        assert state.transaction_version(rec.txn_app_id) == rec.batch
        # (deltalake numbers the history of a time-travelled table wrongly: ask the latest)
        history = DeltaTable(f"{lake}/{t.state}").history()
        (write,) = [h for h in history if h["version"] == t.state_version]
        assert write["operation"] == "WRITE", write
        assert write["operationParameters"]["mode"] == "Overwrite", write
        columns = [f.name for f in state.schema().fields]
        assert (COPIES in columns) == t.multiset, (name, columns)
    # Multisets: identical rows are one Delta row with their count; read_state repeats them.
    full = read_delta(lake, rec.tables["public.full_t"].state, 1).to_pylist()
    dup = [r for r in full if r["a"] == 1 and r["b"] == "dup"]
    assert len(dup) == 1 and dup[0][COPIES] == 2 and dup[0]["big"] == big(100)
    assert rec.tables["public.full_t"].state_rows == len(full)
    for name, value in (("public.nothing_t", (1, "n")), ("public.nokey_t", (1, "k"))):
        rows = read_delta(lake, rec.tables[name].state, 1).to_pylist()
        assert sorted((r["x"], r["y"], r[COPIES]) for r in rows)[0] == (*value, 2), rows
        assert (
            sorted((r["x"], r["y"]) for r in read_state(lake, name).to_pylist())[:2] == [value] * 2
        )


def test_plan_follows_the_publication(pg_dsn: str) -> None:
    """FOR ALL TABLES, ranges, and a partitioned table as each kind of publication shows it."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("CREATE PUBLICATION pub_all FOR ALL TABLES")
        c.execute(
            "INSERT INTO kv (id, txt) SELECT g, repeat('x', 500) FROM generate_series(1, 2000) g"
        )
        plans = {p.name: p for p in read_plan(c, ["pub_all"], parallel=4, min_range_blocks=8)}
        assert {"public.kv", "public.meas_1", "public.leafy_a", "s2.t"} <= set(plans)
        assert "public.meas" not in plans  # publish_via_partition_root is off there
        kv = plans["public.kv"]
        assert [c.name for c in kv.columns][:3] == ["id", "txt", "big"]
        assert "g" not in [c.name for c in kv.columns]
        assert kv.blocks > 32 and len(kv.ranges) == 4
        assert kv.ranges[0][0] is None and kv.ranges[-1][1] is None
        via_root = {p.name: p for p in read_plan(c, ["pub_root", "pub_cl"])}
        assert set(via_root) == {"public.meas", "public.cl", "public.rf"}
        assert via_root["public.meas"].from_clause == '"public"."meas"'  # covers partitions
        assert via_root["public.rf"].row_filter == "((id < 1000))"
        assert [c.name for c in via_root["public.cl"].columns] == ["id", "a", "big"]
    assert split_ranges(0, 4, 8) == [(None, None)]
    assert split_ranges(100, 4, 10) == [(None, 25), (25, 50), (50, 75), (75, None)]


def _role_dsn(dsn: str, role: str) -> str:
    return " ".join(p for p in dsn.split() if not p.startswith("user=")) + f" user={role}"


def test_a_slot_is_dropped_once_its_last_user_lets_go(pg_dsn: str, slot: str) -> None:
    """A bootstrap that gives up drops the slot it created right after closing the
    replication connection that created it, whose backend may not have exited yet."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        for name in (slot, f"{slot}_2"):
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        with streaming_from(pg_dsn, slot) as walsender:
            closer = threading.Timer(0.5, walsender.finish)
            closer.start()
            try:
                bootstrap_module._drop_slot(c, slot)  # active when asked: waits for it
            finally:
                closer.join()
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)
        # In use past the wait: the server's error, and the slot stays.
        with (
            streaming_from(pg_dsn, f"{slot}_2"),
            pytest.raises(psycopg.errors.ObjectInUse, match="is active for PID"),
        ):
            bootstrap_module._drop_slot(c, f"{slot}_2", wait_s=0.3)
        bootstrap_module._drop_slot(c, f"{slot}_2")


def test_refusals(pg_dsn: str, slot: str, spark, tmp_path: Path, capsys, monkeypatch) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    suffix = slot[-20:]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, big text)")
        c.execute("CREATE TABLE hidden (id int PRIMARY KEY)")
        c.execute("CREATE TABLE clash (id int PRIMARY KEY, _op text)")
        c.execute("INSERT INTO t VALUES (1, 'one')")

        # Publication missing (through the CLI too: one line, exit status 1).
        with pytest.raises(BootstrapError, match="publication 'pub' does not exist"):
            run_bootstrap(cfg, spark=spark)
        conf = tmp_path / "bootstrap.toml"
        conf.write_text(
            f'[source]\ndsn = "{pg_dsn}"\nslot = "{slot}"\npublications = ["pub"]\n'
            f'[lake]\npath = "{lake}"\n'
        )
        assert cli.main(["bootstrap", "--config", str(conf)]) == cli.EXIT_ERROR
        assert "publication 'pub' does not exist" in capsys.readouterr().err
        # One that does not publish every action: the mirror could not equal the source.
        c.execute("CREATE PUBLICATION pub FOR TABLE t WITH (publish = 'insert, truncate')")
        with pytest.raises(
            BootstrapError, match=r"publication 'pub' does not publish update, delete \(publish"
        ):
            run_bootstrap(cfg, spark=spark)
        c.execute("DROP PUBLICATION pub")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")

        # Metadata column names the sync job would refuse.
        c.execute("CREATE PUBLICATION pub_clash FOR TABLE clash")
        with pytest.raises(BootstrapError, match="collide with slotlake's metadata"):
            run_bootstrap(make_config(pg_dsn, lake, slot, publications=("pub_clash",)), spark=spark)

        # Privileges: the REPLICATION attribute, then SELECT on a published table.
        plain, repl = f"plain_{suffix}", f"repl_{suffix}"
        c.execute(f"CREATE ROLE {plain} LOGIN")
        c.execute(f"CREATE ROLE {repl} LOGIN REPLICATION")
        c.execute(f"GRANT SELECT ON t TO {repl}")
        c.execute("CREATE PUBLICATION pub_hidden FOR TABLE t, hidden")
        try:
            with pytest.raises(BootstrapError, match="lacks the REPLICATION attribute"):
                run_bootstrap(make_config(_role_dsn(pg_dsn, plain), lake, slot), spark=spark)
            hidden_cfg = make_config(
                _role_dsn(pg_dsn, repl), lake, slot, publications=("pub_hidden",)
            )
            with pytest.raises(
                BootstrapError, match=r"lacks SELECT on published table\(s\) public.hidden"
            ):
                run_bootstrap(hidden_cfg, spark=spark)
        finally:
            for role in (plain, repl):
                c.execute(f"DROP OWNED BY {role}")
                c.execute(f"DROP ROLE {role}")
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)

        # Another run holds the slot's lock: refused, naming the holder's session.
        with psycopg.connect(pg_dsn, autocommit=True, application_name="holder") as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (lock_key(slot),))
            pid = holder.info.backend_pid
            with pytest.raises(
                BootstrapError,
                match=rf"holds the lock for slot {slot} \(PID {pid}, application 'holder', "
                rf".*\); wait for it to end\. .* SELECT pg_terminate_backend\({pid}\)$",
            ):
                run_bootstrap(cfg, spark=spark)
            holder.execute("SELECT pg_advisory_unlock_all()")

        # A failure after the slot was created drops that slot again (the lake is a file).
        blocker = tmp_path / "not_a_dir"
        blocker.write_text("x")
        with pytest.raises(Exception):  # noqa: B017 - Spark's own error; the slot is the point
            run_bootstrap(make_config(pg_dsn, str(blocker / "lake"), slot), spark=spark)
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)

        # Slot already exists: refused, and nothing is dropped.
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        old = Lsn(slot_confirmed(c, slot))
        with pytest.raises(BootstrapError, match=r"already exists.*--rebootstrap"):
            run_bootstrap(cfg, spark=spark)
        assert Lsn(slot_confirmed(c, slot)) == old
        c.execute("INSERT INTO t VALUES (2, 'two')")
        # --rebootstrap on an empty lake: the old slot is dropped (said so) and recreated.
        lines: list[str] = []
        first = run_bootstrap(cfg, spark=spark, rebootstrap=True, progress=lines.append)
        assert first.dropped_slot == f"{slot} at {old}"
        assert any("dropping replication slot" in line for line in lines)
        assert first.consistent_point > old
        assert compare_table(c, lake, "public.t").equal

        # A lake with commits: refused even with --rebootstrap, unless told explicitly.
        c.execute("UPDATE t SET big = 'changed' WHERE id = 1")
        assert run_sync(cfg, spark=spark).status == "committed"
        with pytest.raises(BootstrapError, match="already has 2 committed batch"):
            run_bootstrap(cfg, spark=spark, rebootstrap=True)
        with pytest.raises(BootstrapError, match="already exists"):
            run_bootstrap(cfg, spark=spark, onto_existing_lake=True)
        c.execute("INSERT INTO t VALUES (3, 'three')")

        # A bootstrap onto the lake that fails after it overwrote a state: its slot is
        # dropped and the state restored, so the next attempt (same batch number, a txn
        # marker of its own) is not skipped and sync MERGEs into the committed version.
        state_rel = Lake.table_path("state", "public.t")
        head = Lake(lake).read_commit(2).tables["public.t"].state_version
        before = read_delta(lake, state_rel, head).sort_by("id")

        def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("injected after the state was overwritten")

        monkeypatch.setattr(bootstrap_module, "ensure_empty", fail)
        lines = []
        with pytest.raises(RuntimeError, match="injected"):
            run_bootstrap(
                cfg, spark=spark, rebootstrap=True, onto_existing_lake=True, progress=lines.append
            )
        monkeypatch.undo()
        from deltalake import DeltaTable

        restored = DeltaTable(f"{lake}/{state_rel}")
        assert restored.version() == head + 2  # the failed overwrite, then RESTORE
        assert read_delta(lake, state_rel, head + 1).num_rows == 3  # the copy it had written
        assert read_delta(lake, state_rel, None).sort_by("id") == before
        assert any(f"restored {state_rel} to its version {head}" in line for line in lines)
        assert Lake(lake).commit_batches() == [1, 2]
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)

        again = run_bootstrap(cfg, spark=spark, rebootstrap=True, onto_existing_lake=True)
        records = list(Lake(lake).commits())
        assert [r.kind for r in records] == ["bootstrap", "sync", "bootstrap"]
        t3 = records[-1].tables["public.t"]
        assert t3.state_version == head + 3 and t3.state_rows == 3
        assert t3.changes_version == records[1].tables["public.t"].changes_version
        assert records[-1].txn_app_id != records[0].txn_app_id  # one per attempt
        # Time travel: batch 2's state is still readable as it was.
        assert read_state(lake, "public.t", batch=2).sort_by("id") == before
        assert records[-1].start_lsn == records[1].end_lsn  # the gap is visible
        assert records[-1].end_lsn == str(again.consistent_point)
        assert read_changes(lake, "public.t").num_rows == 1  # history kept
        assert compare_table(c, lake, "public.t").equal
        c.execute("DELETE FROM t WHERE id = 3")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert compare_table(c, lake, "public.t").equal

        # A lake written from another slot is never bootstrapped over.
        with pytest.raises(BootstrapError, match="written from slot"):
            run_bootstrap(
                Config(source=make_config(pg_dsn, lake, "other_slot").source, lake=cfg.lake),
                spark=spark,
                onto_existing_lake=True,
            )


def test_row_level_security_that_would_hide_rows_from_a_copy_is_refused(
    pg_dsn: str, slot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgoutput sends every change of a table whatever its row-level security, but a copy
    read by a role its policies apply to lacks the rows they hide: before, the bootstrap
    (and a sync's per-table copy) mirrored a subset, silently. Both refuse, naming the
    tables and what to do; the copy's session runs with ``row_security = off``, so a
    table the check missed fails the copy instead of filtering it. A role with BYPASSRLS
    copies every row."""
    from slotlake.snapshot import SnapshotError

    from .sync_helpers import assert_mirror

    lake = str(tmp_path / "lake")
    role = f"rls_{slot[-20:]}"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
        try:
            cfg = make_config(_role_dsn(pg_dsn, role), lake, slot)
            for name in ("t", "u"):
                c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
                c.execute(f"INSERT INTO {name} SELECT g, 'v' FROM generate_series(1, 6) g")
                c.execute(f"GRANT SELECT ON {name} TO {role}")
            c.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY")
            c.execute("CREATE POLICY even ON t USING (id % 2 = 0)")
            c.execute("CREATE PUBLICATION pub FOR TABLE t")
            with pytest.raises(BootstrapError, match=r"public\.t through row-level security"):
                run_bootstrap(cfg)
            # Without the check, the copy's own setting refuses the rows the policy hides.
            monkeypatch.setattr(bootstrap_module, "hidden_by_row_security", lambda *_: [])
            with pytest.raises(BootstrapError, match="affected by row-level security policy"):
                run_bootstrap(cfg)
            monkeypatch.undo()
            assert c.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone() == (0,)

            c.execute(f"ALTER ROLE {role} BYPASSRLS")
            run_bootstrap(cfg)
            assert_mirror(c, lake, ["public.t"])
            # A table that joins the publication is copied by the sync: refused alike.
            c.execute(f"ALTER ROLE {role} NOBYPASSRLS")
            c.execute("ALTER TABLE u ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY")
            c.execute("CREATE POLICY none ON u USING (false)")
            c.execute("ALTER PUBLICATION pub ADD TABLE u")
            with pytest.raises(SnapshotError, match=r"public\.u through row-level security"):
                run_sync(cfg)
            c.execute(f"ALTER ROLE {role} BYPASSRLS")
            c.execute("UPDATE t SET v = 'w' WHERE id < 4")
            assert run_sync(cfg).status == "committed"
            assert_mirror(c, lake, ["public.t", "public.u"])
        finally:
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE {role}")


def test_refuses_without_logical_wal(pg_cluster: LocalPostgres, tmp_path: Path) -> None:
    with LocalPostgres(version=pg_cluster.version, settings={"wal_level": "replica"}) as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY)")
            c.execute("CREATE PUBLICATION pub FOR TABLE t")
        with pytest.raises(BootstrapError, match=r"wal_level is 'replica'.*wal_level = logical"):
            run_bootstrap(make_config(pg.dsn(), str(tmp_path / "lake"), "s_wal"))
        assert not (tmp_path / "lake").exists()


def test_split_ranges_cover_every_block() -> None:
    rng = random.Random(7)
    for _ in range(200):
        blocks, parallel, min_blocks = (
            rng.randrange(0, 5000),
            rng.randrange(1, 9),
            rng.randrange(1, 600),
        )
        ranges = split_ranges(blocks, parallel, min_blocks)
        assert 1 <= len(ranges) <= parallel
        assert ranges[0][0] is None and ranges[-1][1] is None
        for (_, hi), (lo, _) in itertools.pairwise(ranges):
            assert hi == lo and hi is not None and 0 < hi < blocks


def test_old_layout_lake_is_refused(pg_dsn: str, slot: str, tmp_path: Path, capsys) -> None:
    """A lake of slotlake's Parquet layout (before Delta Lake) is refused before anything
    is created: no slot, nothing written into the lake."""
    root = tmp_path / "old"
    (root / "_commits").mkdir(parents=True)
    (root / "_commits" / "00000000000000000001.json").write_text(
        json.dumps({"batch": 1, "slot": slot, "kind": "bootstrap", "tables": {}})
    )
    cfg = make_config(pg_dsn, str(root), slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        for kwargs in ({}, {"rebootstrap": True, "onto_existing_lake": True}):
            with pytest.raises(OldLayoutError, match="old Parquet layout") as info:
                run_bootstrap(cfg, **kwargs)
            assert "\n" not in str(info.value) and "bootstrap a new lake.path" in str(info.value)
        conf = tmp_path / "old.toml"
        conf.write_text(
            f'[source]\ndsn = "{pg_dsn}"\nslot = "{slot}"\npublications = ["pub"]\n'
            f'[lake]\npath = "{root}"\n'
        )
        assert cli.main(["bootstrap", "--config", str(conf)]) == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("slotlake bootstrap: lake ")
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)
    assert sorted(p.name for p in root.iterdir()) == ["_commits"]
