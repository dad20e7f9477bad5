"""The sync job's refusals: a concurrent run, a slot or publication that cannot work, a
corrupted raw payload, and secrets in configuration or errors.

Every refusal must say what is wrong and what to do in one line, write nothing to the
lake and leave the slot where it was.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotlake import cli
from slotlake.batch import SchemaCollisionError, process_batch
from slotlake.config import Config, ConfigError, SourceConfig, load_config, validate
from slotlake.decode import RawDataError
from slotlake.lake import RAW, Lake
from slotlake.localpg import LocalPostgres, free_port
from slotlake.lsn import Lsn
from slotlake.source import SlotSource, SourceError
from slotlake.sync import FAULT_ENV, InjectedFault, SyncError, run_sync

from .sync_helpers import (
    assert_log_matches_audit,
    assert_mirror,
    audited_schema,
    make_config,
    slot_confirmed,
)

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v text);
CREATE TABLE u (k text PRIMARY KEY, n int);
CREATE PUBLICATION pub FOR TABLE t, u;
"""
KEYS = {"public.t": "id", "public.u": "k"}


def setup_source(c: psycopg.Connection[Any]) -> None:
    audited_schema(c, SCHEMA, KEYS)


def workload(c: psycopg.Connection[Any], start: int = 0) -> None:
    with c.transaction():
        c.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            (start + 1, start + 5),
        )
        c.execute("INSERT INTO u VALUES (%s, 1), (%s, 2)", (f"a{start}", f"b{start}"))
    c.execute("UPDATE t SET v = 'changed' WHERE id = %s", (start + 2,))
    c.execute("DELETE FROM t WHERE id = %s", (start + 3,))
    c.execute("UPDATE u SET k = k || '!' WHERE k = %s", (f"a{start}",))


def slotted_source(c: psycopg.Connection[Any], slot: str) -> None:
    """The tables, a slot created after them, and a first workload for it to hold."""
    setup_source(c)
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    workload(c)


def lake_files(lake: str) -> list[str]:
    return sorted(p.as_posix() for p in Path(lake).rglob("*"))


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg, msg
    return msg


# -- concurrency -----------------------------------------------------------------------------


def test_a_second_run_while_one_is_in_flight_is_locked_out(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        slot_before = slot_confirmed(c, slot)

        # The first run pauses, lock held, just before it pulls.
        pulling, resume = threading.Event(), threading.Event()
        outcome: dict[str, Any] = {}

        def first_progress(msg: str) -> None:
            if "pulling" in msg:
                pulling.set()
                assert resume.wait(timeout=300)

        def first() -> None:
            try:
                outcome["result"] = run_sync(cfg, spark=spark, progress=first_progress)
            except BaseException as exc:  # re-raised in the test's thread below
                outcome["error"] = exc
                pulling.set()

        thread = threading.Thread(target=first, daemon=True)
        thread.start()
        try:
            assert pulling.wait(timeout=300)
            assert "error" not in outcome, outcome.get("error")
            files = lake_files(lake)
            said: list[str] = []
            second = run_sync(cfg, spark=spark, progress=said.append)
            assert second.status == "locked" and second.batch is None
            # The line names the session holding the lock (the first run's), as the server
            # lists it, and how to end it should its run be gone.
            (pid, app, state), *others = c.execute(
                "SELECT l.pid, a.application_name, a.state FROM pg_locks l"
                " JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()"
            ).fetchall()
            assert not others and app == "slotlake-sync" and state == "idle"
            (line,) = said
            assert re.fullmatch(
                rf"another slotlake run holds the lock for slot {re.escape(slot)} \(PID {pid}, "
                r"application 'slotlake-sync', from 127\.0\.0\.1, connected "
                r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, idle for \d+s\); nothing done\. "
                rf"If that run is gone, end its session: SELECT pg_terminate_backend\({pid}\)",
                line,
            ), line
            assert lake_files(lake) == files
            assert slot_confirmed(c, slot) == slot_before
        finally:
            resume.set()
            thread.join(timeout=600)
        if "error" in outcome:
            raise outcome["error"]
        assert outcome["result"].status == "committed"
        assert_log_matches_audit(c, lake, KEYS)
        assert_mirror(c, lake, list(KEYS))


def test_cli_sync_reports_locked_and_exits_cleanly(
    pg_dsn: str, slot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    config = tmp_path / "sync.toml"
    config.write_text(
        f'[source]\ndsn = "{pg_dsn}"\nslot = "{slot}"\npublications = ["pub"]\n'
        f'[lake]\npath = "{lake}"\n'
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        slot_before = slot_confirmed(c, slot)
        with SlotSource(pg_dsn, slot, ["pub"]) as holder:
            assert holder.try_lock()
            assert cli.main(["sync", "--config", str(config)]) == cli.EXIT_OK
        assert "status: locked" in capsys.readouterr().out
        assert not lake.exists()
        assert slot_confirmed(c, slot) == slot_before


# -- slots and publications that cannot work ----------------------------------------------


def _other_plugin(c: psycopg.Connection[Any]) -> str:
    # pgserver's PostgreSQL 16 ships no test_decoding; loading pgoutput by path gives a
    # slot whose plugin is not 'pgoutput' all the same.
    (libdir,) = c.execute("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'").fetchone()  # type: ignore[misc]
    return "test_decoding" if (Path(libdir) / "test_decoding.so").exists() else "$libdir/pgoutput"


@pytest.mark.parametrize("case", ["missing_slot", "wrong_plugin", "two_phase", "missing_pub"])
def test_unusable_slot_or_publication_is_refused(
    pg_dsn: str, slot: str, tmp_path: Path, case: str
) -> None:
    lake = str(tmp_path / "lake")
    publications = ("pub", "nope_pub") if case == "missing_pub" else ("pub",)
    cfg = make_config(pg_dsn, lake, slot, publications)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c)
        plugin = _other_plugin(c) if case == "wrong_plugin" else "pgoutput"
        if case != "missing_slot":
            c.execute(
                "SELECT pg_create_logical_replication_slot(%s, %s, false, %s)",
                (slot, plugin, case == "two_phase"),
            )
        workload(c)
        before = (
            None if case == "missing_slot" else slot_confirmed(c, slot)
        )  # the slot exists in every other case

        with pytest.raises(SourceError) as err:
            run_sync(cfg)
        msg = one_line(err.value)
        expected = {
            "missing_slot": [
                f"replication slot {slot!r} does not exist",
                f"pg_create_logical_replication_slot('{slot}', 'pgoutput')",
            ],
            "wrong_plugin": [f"uses plugin {plugin!r}; slotlake needs 'pgoutput'", "drop it"],
            "two_phase": [
                "created with two_phase = true",
                "recreate it without two_phase",
            ],
            "missing_pub": [
                "publication 'nope_pub' does not exist",
                "CREATE PUBLICATION nope_pub",
                "recreate the slot",
            ],
        }[case]
        for part in expected:
            assert part in msg, msg
        assert not Path(lake).exists()
        if before is not None:
            assert slot_confirmed(c, slot) == before


def test_invalidated_slot_is_refused(
    pg_dsn: str, slot: str, pg_cluster: LocalPostgres, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c)
        # Cluster-wide: any slot of this throwaway cluster could be invalidated while it is
        # set, so it is reset at once (the tests run one at a time; other slots are idle).
        c.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        c.execute("SELECT pg_reload_conf()")
        try:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            workload(c)
            status = None
            for i in range(40):
                # A segment switch (after some WAL) then a checkpoint: the checkpointer
                # invalidates slots whose restart_lsn is beyond max_slot_wal_keep_size.
                workload(c, 100 * (i + 1))
                c.execute("SELECT pg_switch_wal()")
                c.execute("CHECKPOINT")
                (status,) = c.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()  # type: ignore[misc]
                if status == "lost":
                    break
                time.sleep(0.1)
            assert status == "lost", f"could not invalidate the slot (wal_status {status})"
        finally:
            c.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            c.execute("SELECT pg_reload_conf()")

        with pytest.raises(SourceError) as err:
            run_sync(cfg)
        msg = one_line(err.value)
        assert f"replication slot {slot!r} is invalidated (wal_status=lost" in msg
        assert "drop it, recreate it and take a new initial snapshot" in msg
        assert not Path(lake).exists()


# -- a corrupted raw payload ------------------------------------------------------------------


def _corrupt(raw_dir: Path, msg_type: str, mangle: Callable[[bytes], bytes]) -> tuple[int, Lsn]:
    """Rewrite the first ``msg_type`` payload of a raw batch in place; its (seq, lsn)."""
    for f in sorted(raw_dir.glob("part-*.parquet")):
        table = pq.read_table(f)
        types = table.column("msg_type").to_pylist()
        if msg_type not in types:
            continue
        i = types.index(msg_type)
        data = table.column("data").to_pylist()
        data[i] = mangle(data[i])
        field = table.schema.field("data")
        table = table.set_column(
            table.schema.get_field_index("data"), field, pa.array(data, type=field.type)
        )
        pq.write_table(table, f)
        return table.column("seq")[i].as_py(), Lsn.from_signed(table.column("lsn")[i].as_py())
    raise AssertionError(f"no {msg_type!r} message in {raw_dir}")


def test_corrupted_raw_payload_fails_the_batch_with_its_coordinates(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake_root = str(tmp_path / "lake")
    lake = Lake(lake_root)
    cfg = make_config(pg_dsn, lake_root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        slot_before = slot_confirmed(c, slot)
        # A pull that stops right after writing raw: an uncommitted batch 1 on disk.
        monkeypatch.setenv(FAULT_ENV, "after_pull")
        with pytest.raises(InjectedFault):
            run_sync(cfg, spark=spark)
        monkeypatch.delenv(FAULT_ENV)
        (raw_dir,) = (lake.root / RAW).iterdir()
        raw_rel = f"{RAW}/{raw_dir.name}"
        app_id = lake.read_plan(1).txn_app_id  # type: ignore[union-attr]

        cases: list[tuple[str, Callable[[bytes], bytes], str]] = [
            # Insert: 'I', oid(4), 'N', natts(2), then the first column's kind byte at 8.
            ("I", lambda d: d[:8] + b"x" + d[9:], "offset 8"),
            ("U", lambda d: d[: len(d) // 2], "offset"),  # cut in the middle of a tuple
        ]
        for msg_type, mangle, detail in cases:
            original = {f: f.read_bytes() for f in raw_dir.glob("part-*.parquet")}
            seq, lsn = _corrupt(raw_dir, msg_type, mangle)
            with pytest.raises(RawDataError) as err:
                process_batch(spark, lake, raw_rel, 1, app_id, None)
            msg = one_line(err.value)
            for part in ("batch 1", raw_rel, f"seq {seq}", f"lsn {lsn}", detail):
                assert part in msg, msg
            assert "table public." in msg, msg
            for f, content in original.items():
                f.write_bytes(content)

        assert lake.commit_batches() == []
        assert slot_confirmed(c, slot) == slot_before

        # The next run finds the unfinished batch's raw undecodable: the slot has not moved,
        # so it pulls the same range again (same target) and finishes the batch from that.
        _corrupt(raw_dir, "I", lambda d: d[:3])
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_log_matches_audit(c, lake_root, KEYS)
        assert_mirror(c, lake_root, list(KEYS))
        assert not raw_dir.exists()


# -- targets ---------------------------------------------------------------------------------


def test_a_target_past_the_flush_lsn_is_lowered_to_it(
    pg_dsn: str, slot: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch ends where the source's WAL does: a ``--target-lsn`` past the flush LSN
    made the record claim WAL not written yet, and every later run skipped the changes
    committed there (the slot advanced past them, unwritten)."""
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        with caplog.at_level(logging.WARNING, logger="slotlake.sync"):
            result = run_sync(cfg, target_lsn=Lsn.parse("FFFFFFFF/FFFFFFFF"))
        assert result.status == "committed"
        assert "--target-lsn FFFFFFFF/FFFFFFFF is past the source's flush LSN" in caplog.text
        flush = Lsn.parse(c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        assert result.end_lsn <= flush and str(result.end_lsn) == slot_confirmed(c, slot)
        assert Lake(root).last_commit().end_lsn == str(result.end_lsn)  # type: ignore[union-attr]
        workload(c, 10)
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, root, list(KEYS))
        assert_log_matches_audit(c, root, KEYS)


def test_a_lake_past_the_sources_wal_is_refused(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    """A lake whose last batch ends past the source's WAL was not written from this
    server as it is now (restored from a backup, another server under the address, or a
    lake of the bug above): refused without moving the slot, where the run advanced the
    slot to the flush LSN and went on from the lake's end, skipping every change before
    it."""
    from slotlake.sync import SyncError

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        assert run_sync(cfg).status == "committed"
        record = Path(root) / "_commits" / f"{1:020d}.json"
        body = json.loads(record.read_text())
        body["end_lsn"] = body["target_lsn"] = "FFFFFFFF/0"
        record.write_text(json.dumps(body))
        workload(c, 10)
        before = slot_confirmed(c, slot)
        with pytest.raises(SyncError) as err:
            run_sync(cfg)
        msg = one_line(err.value)
        assert "batch 1 ends at FFFFFFFF/0, past the source's WAL (flushed up to " in msg
        assert msg.endswith("Re-bootstrap the lake from this source")
        assert slot_confirmed(c, slot) == before


# -- columns named like slotlake's -------------------------------------------------------------


def _refused(cfg: Config, c: psycopg.Connection[Any], slot: str, table: str, clash: str) -> None:
    """A sync refuses ``table`` for its columns ``clash`` in one line, before it copies,
    pulls or plans anything, and leaves the slot where it was."""
    files, before = lake_files(cfg.lake.path), slot_confirmed(c, slot)
    with pytest.raises(SchemaCollisionError) as err:
        run_sync(cfg)
    msg = one_line(err.value)
    assert msg.startswith(f"table {table} has column(s) {clash} that collide with slotlake's")
    assert "leave the table out of the publication" in msg and "rename them" in msg
    # No plan, no copy, no raw batch: nothing fixes a batch with the table.
    assert lake_files(cfg.lake.path) == files
    assert slot_confirmed(c, slot) == before


def test_a_table_with_columns_named_like_slotlakes_stops_syncs_until_renamed_or_unpublished(
    pg_dsn: str, slot: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A published table with a column slotlake's change log or state has (``_op``, ``_seq``,
    ``_batch`` …) is refused by a sync before its plan, so that no batch is fixed with it.
    Renamed at the source, the table's changes made under the old name are mirrored;
    left out of the publication, its changes the slot still holds are skipped and the
    table leaves the lake (marked gone) while the other tables go on."""
    import pyarrow.compute as pc

    from slotlake.lake import read_changes, read_state

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    lake = Lake(root)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        assert run_sync(cfg).status == "committed"

        # A new table: refused before its copy. Out of the publication, its changes made
        # while it was in are skipped.
        c.execute("CREATE TABLE clash (id int PRIMARY KEY, _op text, _seq int)")
        c.execute("ALTER PUBLICATION pub ADD TABLE clash")
        c.execute("INSERT INTO clash VALUES (1, 'x', 1)")
        workload(c, 10)
        _refused(cfg, c, slot, "public.clash", "_op, _seq")
        c.execute("ALTER PUBLICATION pub DROP TABLE clash")
        c.execute("INSERT INTO clash VALUES (2, 'y', 2)")
        with caplog.at_level(logging.WARNING, logger="slotlake.batch"):
            assert run_sync(cfg).status == "committed"
        assert "public.clash: its changes are left out" in caplog.text
        rec = lake.last_commit()
        assert rec is not None and "public.clash" not in rec.tables
        assert_mirror(c, root, list(KEYS))

        # A lake table given such a column, then renamed: mirrored, the rows changed
        # under the old name too.
        c.execute("ALTER TABLE u ADD COLUMN _batch int")
        c.execute("UPDATE u SET _batch = n * 10")
        _refused(cfg, c, slot, "public.u", "_batch")
        c.execute("ALTER TABLE u RENAME COLUMN _batch TO batch_no")
        c.execute("UPDATE u SET n = n + 1 WHERE n = 1")
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, root, list(KEYS))
        assert "batch_no" in read_state(root, "public.u").column_names

        # A lake table given one and left out of the publication: it leaves the lake, its
        # last state readable as of the batch before; the other table goes on.
        c.execute("ALTER TABLE t ADD COLUMN _xid int")
        c.execute("UPDATE t SET _xid = 7")
        _refused(cfg, c, slot, "public.t", "_xid")
        c.execute("ALTER PUBLICATION pub DROP TABLE t")
        c.execute("UPDATE u SET n = n + 1")
        assert run_sync(cfg).status == "committed"
        rec = lake.last_commit()
        assert rec is not None and rec.tables["public.t"].gone_since == rec.batch
        assert_mirror(c, root, ["public.u"])
        assert "_xid" not in read_state(root, "public.t", batch=rec.batch - 1).column_names

        # One added and dropped again between two syncs, with changes in between: clean at
        # the target, so not refused; its values go to a change-log column of its own.
        c.execute("ALTER TABLE u ADD COLUMN _op text")
        c.execute("UPDATE u SET _op = 'x' || n")
        c.execute("ALTER TABLE u DROP COLUMN _op")
        c.execute("UPDATE u SET n = n + 1")
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, root, ["public.u"])
        log = read_changes(root, "public.u")
        assert "_op__dropped" in log.column_names
        last = log.filter(pc.equal(log.column("_batch"), lake.last_commit().batch))  # type: ignore[union-attr]
        ops = last.column("_op__dropped").to_pylist()
        assert (
            len(ops) == 2 * len(set(last.column("k").to_pylist()))
            and ops.count(None) == len(ops) // 2
        )
        assert all(o is None or o.startswith("x") for o in ops)
        assert "_op__dropped" not in read_state(root, "public.u").column_names
        # Nothing is left over. The server's own WAL meanwhile (a checkpoint, the
        # bgwriter's record of running transactions) can make the run a batch of none.
        rest = run_sync(cfg)
        assert rest.status == "up_to_date" or (
            rest.status == "committed" and not any(n for n, _ in rest.tables.values())
        ), rest


def test_two_published_tables_with_one_lake_name_are_refused(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """``"a.b".c`` and ``a."b.c"`` are both ``a.b.c`` in the lake: bootstrap and sync
    refuse them, naming both, before they copy or pull anything."""
    from slotlake.bootstrap import BootstrapError, run_bootstrap
    from slotlake.snapshot import SnapshotError

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    refusal = (
        'published tables "a.b".c and a."b.c" both have the lake name a.b.c (schema and '
        "table joined by a dot): rename one, or leave one out of the publication"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute('CREATE SCHEMA a; CREATE SCHEMA "a.b"')
        c.execute('CREATE TABLE a."b.c" (id int PRIMARY KEY, v text)')
        c.execute('CREATE TABLE "a.b".c (id int PRIMARY KEY, w text)')
        c.execute("INSERT INTO a.\"b.c\" VALUES (1, 'x'); INSERT INTO \"a.b\".c VALUES (2, 'y')")
        c.execute('CREATE PUBLICATION pub FOR TABLE a."b.c", "a.b".c')
        with pytest.raises(BootstrapError) as err:
            run_bootstrap(cfg)
        assert one_line(err.value) == refusal
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (0,)

        c.execute('ALTER PUBLICATION pub DROP TABLE "a.b".c')
        run_bootstrap(cfg)
        c.execute('ALTER PUBLICATION pub ADD TABLE "a.b".c')
        c.execute("UPDATE a.\"b.c\" SET v = 'z'")
        files, before = lake_files(root), slot_confirmed(c, slot)
        with pytest.raises(SnapshotError) as err:
            run_sync(cfg)
        assert one_line(err.value) == refusal
        assert lake_files(root) == files and slot_confirmed(c, slot) == before

        c.execute('ALTER PUBLICATION pub DROP TABLE "a.b".c')
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, root, ["a.b.c"])


# -- secrets ------------------------------------------------------------------------------------

SECRET = "Sup3r-S3cret-pw"


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=db.internal dbname=app user=slotlake password={SECRET}",
        f"host=db.internal dbname=app password = '{SECRET}' user=slotlake",
        f"postgresql://slotlake:{SECRET}@db.internal/app",
        f"postgresql://slotlake@db.internal/app?sslmode=require&password={SECRET}",
    ],
)
def test_a_password_in_the_dsn_is_refused_without_echoing_it(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        validate(Config(source=SourceConfig(dsn=dsn, slot="s", publications=["pub"])))
    msg = one_line(err.value)
    assert SECRET not in msg and "must not carry a password" in msg and "PGPASSWORD" in msg

    config = tmp_path / "sync.toml"
    config.write_text(f"[source]\ndsn = {json.dumps(dsn)}\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert SECRET not in str(err.value)
    assert cli.main(["sync", "--config", str(config)]) == cli.EXIT_USAGE
    out = capsys.readouterr()
    assert "must not carry a password" in out.err
    assert SECRET not in out.out + out.err


def test_connection_failure_never_shows_the_password(
    pg_cluster: LocalPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("PGPASSWORD", SECRET)
    port = free_port()  # nothing listens there
    lake = str(tmp_path / "lake")
    good = pg_cluster.dsn()
    for dsn in (
        good.replace(f"port={pg_cluster.port}", f"port={port}"),
        # A DSN built in code skips the configuration's check: still never shown.
        good.replace(f"port={pg_cluster.port}", f"port={port}") + f" password={SECRET}",
    ):
        with pytest.raises(SourceError) as err:
            run_sync(make_config(dsn, lake, "s_nowhere"))
        text = "".join(traceback.format_exception(err.value))
        assert "cannot connect to" in str(err.value) and f"port={port}" in str(err.value)
        assert SECRET not in text
        assert SECRET not in caplog.text
    assert not Path(lake).exists()


def test_a_publication_dropped_and_created_again_stops_the_slot_with_advice(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """pgoutput reads the publications as of each change: one dropped and created again
    stops the slot at the first change made while it did not exist, on every peek
    (PostgreSQL 15 and 16). The run says so and what to do, writes nothing and leaves
    the slot; the advice (a new slot and copy onto the lake) brings the mirror back."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        slotted_source(c, slot)
        assert run_sync(cfg).status == "committed"
        c.execute("DROP PUBLICATION pub")
        workload(c, 100)  # published by none
        c.execute("CREATE PUBLICATION pub FOR TABLE t, u")
        workload(c, 200)

        # Beside the attempt's raw directory, the copies of the tables put back into the
        # publication, taken before the pull (both removed by the next run).
        def written() -> list[str]:
            return [f for f in lake_files(lake) if "/_raw/" not in f and "/_snapshots" not in f]

        files = written()
        before = slot_confirmed(c, slot)
        with pytest.raises(SyncError) as err:
            run_sync(cfg)
        msg = one_line(err.value)
        assert 'publication "pub" does not exist' in msg
        assert "bootstrap --rebootstrap --onto-existing-lake" in msg
        assert written() == files
        assert slot_confirmed(c, slot) == before
        run_bootstrap(cfg, rebootstrap=True, onto_existing_lake=True)
        workload(c, 300)
        assert run_sync(cfg).status == "committed"
        assert_mirror(c, lake, list(KEYS))
        # The failed attempt's raw batch 2 is gone (batch 2 is the bootstrap's).
        assert not [p for p in (Path(lake) / "_raw").iterdir() if p.name.startswith(f"b{2:020d}")]
