"""End to end with streaming of in-progress transactions (pgoutput proto ≥ 2).

``logical_decoding_work_mem`` is lowered to 64kB for the peek session, so every big
transaction is streamed in S…E chunks through the SQL interface. Checked here:
a streamed commit arrives once; a savepoint rolled back inside a stream is dropped; a
streamed transaction that aborts leaves nothing (not even its schema); a transaction
still open during a sync is discarded then and arrives whole in a later batch; logical
decoding messages and the transactions dataset; binary tuples give the same lake.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from slotlake.lake import Lake, read_changes, read_messages, read_state, read_transactions
from slotlake.pgoutput import StreamAbort, decode
from slotlake.raw import read_raw
from slotlake.source import SourceError
from slotlake.sync import run_sync

from .sync_helpers import assert_log_matches_audit, assert_mirror, audited_schema, make_config

SCHEMA = """
CREATE TABLE big_t (id int PRIMARY KEY, v text, big text);
ALTER TABLE big_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE other_t (id int PRIMARY KEY, v text, big text);
ALTER TABLE other_t ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR TABLE big_t, other_t;
"""
KEYS = {"public.big_t": "id", "public.other_t": "id"}
TABLES = list(KEYS)
STREAM_SETTINGS = {"logical_decoding_work_mem": "64kB"}
# Every 40th row carries a value stored out of line (EXTERNAL storage: no compression).
BIG = "CASE WHEN g %% 40 = 0 THEN repeat(md5(g::text), 300) END"


def streaming_config(dsn: str, lake: str, slot: str, proto: int, **extra: Any):  # type: ignore[no-untyped-def]
    return make_config(
        dsn,
        lake,
        slot,
        proto_version=proto,
        streaming=True,
        settings=dict(STREAM_SETTINGS),
        **extra,
    )


def server_major(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()
    assert row is not None
    return int(row[0])


def xid(conn: psycopg.Connection) -> int:
    """The current transaction's 32-bit xid (assigns one), as pgoutput sends it."""
    row = conn.execute("SELECT (pg_current_xact_id()::text::bigint % 4294967296)").fetchone()
    assert row is not None
    return int(row[0])


def emit(conn: psycopg.Connection, transactional: bool, prefix: str, content: str) -> None:
    conn.execute("SELECT pg_logical_emit_message(%s, %s, %s)", (transactional, prefix, content))


def insert_series(conn: psycopg.Connection, table: str, lo: int, hi: int, tag: str) -> None:
    conn.execute(
        f"INSERT INTO {table} SELECT g, %s || g, {BIG} FROM generate_series(%s::int, %s::int) g",
        (tag, lo, hi),
    )


def committed(lake: str, kind: str) -> pa.Table:
    """Every committed row of the transactions or messages dataset."""
    return read_transactions(lake) if kind == "transactions" else read_messages(lake)


def stream_aborts(lake: str, batch: int) -> set[tuple[int, int]]:
    raw = read_raw(Lake(lake).path(Lake(lake).read_commit(batch).raw or ""))
    out = set()
    for data, t in zip(
        raw.column("data").to_pylist(), raw.column("msg_type").to_pylist(), strict=True
    ):
        if t == "A":
            msg = decode(data)
            assert isinstance(msg, StreamAbort)
            out.add((msg.xid, msg.subxid))
    return out


def streamed_dml_xids(lake: str, batch: int) -> set[int]:
    raw = read_raw(Lake(lake).path(Lake(lake).read_commit(batch).raw or ""))
    return {
        sx
        for sx, t in zip(
            raw.column("stream_xid").to_pylist(), raw.column("msg_type").to_pylist(), strict=True
        )
        if sx is not None and t in ("I", "U", "D")
    }


@pytest.mark.parametrize("proto", [2, 4], ids=lambda p: f"proto{p}")
def test_streamed_workload(  # type: ignore[no-untyped-def]
    pg_dsn: str, slot: str, spark, tmp_path: Path, proto: int
) -> None:
    lake = str(tmp_path / "lake")
    cfg = streaming_config(pg_dsn, lake, slot, proto, messages=True)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        audited_schema(c, SCHEMA, KEYS)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        if proto == 4 and server_major(c) < 16:
            _assert_proto4_refused(c, cfg, slot)
            return
        started = datetime.now(timezone.utc)
        txs: dict[str, tuple[int, bool]] = {}  # name → (xid, streamed)

        with c.transaction():
            txs["small1"] = (xid(c), False)
            # A few rows whose TOAST values later updates leave out (filled from the lake).
            c.execute(
                "INSERT INTO other_t SELECT g, 'seed' || g, repeat(md5(g::text), 100)"
                " FROM generate_series(1, 8) g"
            )
        with c.transaction():  # A: big, streamed, committed
            txs["A"] = (xid(c), True)
            emit(c, True, "slotlake", "in A")
            insert_series(c, "big_t", 1, 1200, "a")
            # Leaves big out: filled from the insert earlier in the same streamed transaction.
            c.execute("UPDATE big_t SET v = v || '!' WHERE id % 40 = 0")
        with c.transaction():
            txs["small2"] = (xid(c), False)
            emit(c, True, "p", "small")
            c.execute("INSERT INTO other_t VALUES (20, 'small2', NULL)")
        with c.transaction():  # B: a savepoint rolled back after it was streamed
            txs["B"] = (xid(c), True)
            insert_series(c, "big_t", 1201, 1400, "b")
            with c.transaction():
                insert_series(c, "big_t", 100_001, 101_000, "lost")
                c.execute("UPDATE big_t SET v = 'lost' WHERE id <= 10")
                c.execute("DELETE FROM big_t WHERE id BETWEEN 11 AND 20")
                raise psycopg.Rollback()
            insert_series(c, "big_t", 1401, 1410, "b2")
            c.execute("UPDATE big_t SET v = 'kept' WHERE id = 1")
        with c.transaction(force_rollback=True):  # C: big, streamed, aborted
            xid_c = xid(c)
            emit(c, True, "slotlake", "in C")
            emit(c, False, "nontx", "from C")
            # The server stops streaming an aborted transaction at its next catalog lookup:
            # big_t is already cached from A, so these rows do reach the raw batch.
            insert_series(c, "big_t", 200_001, 201_200, "aborted")
        with c.transaction(force_rollback=True):
            emit(c, True, "p", "rolled back")
            emit(c, False, "nontx", "from rolled back")
            c.execute("INSERT INTO other_t VALUES (99, 'rolled back', NULL)")
        emit(c, False, "nontx", "autocommit")

        # D: streamed while small transactions commit on another table in between.
        with psycopg.connect(pg_dsn) as c2:
            txs["D"] = (xid(c2), True)
            insert_series(c2, "big_t", 2001, 2600, "d")
            with c.transaction():
                txs["small3"] = (xid(c), False)
                c.execute("INSERT INTO other_t VALUES (30, 'small3', NULL)")
            insert_series(c2, "big_t", 2601, 3200, "d")
            with c.transaction():
                txs["small4"] = (xid(c), False)
                c.execute("UPDATE other_t SET v = 'small4' WHERE id = 30")
            c2.execute("UPDATE big_t SET v = 'd' WHERE id BETWEEN 1 AND 120")
            c2.commit()

        # E: still open while the first batch runs (other_t is its table meanwhile, so the
        # audit trail's execution order stays the commit order per table).
        c3 = psycopg.connect(pg_dsn)
        try:
            txs["E"] = (xid(c3), True)
            emit(c3, True, "slotlake", "in E")
            insert_series(c3, "other_t", 1001, 2200, "e")
            c3.execute("UPDATE other_t SET v = 'e' WHERE id <= 4")  # big left out
            with c.transaction():
                txs["small5"] = (xid(c), False)
                c.execute("INSERT INTO big_t VALUES (5000, 'small5', NULL)")

            first = run_sync(cfg, spark=spark)
            assert first.status == "committed" and first.batch == 1
            assert_mirror(c, lake, TABLES)
            assert_log_matches_audit(c, lake, KEYS)
            xid_e = txs["E"][0]
            # The workload really exercised the paths under test.
            assert {txs["A"][0], txs["B"][0], xid_c, txs["D"][0], xid_e} <= streamed_dml_xids(
                lake, 1
            )
            aborts = stream_aborts(lake, 1)
            assert (xid_c, xid_c) in aborts
            assert any(x == txs["B"][0] and sub != x for x, sub in aborts)
            # E's streamed chunks were discarded: not a row of it yet.
            assert xid_e not in set(read_changes(lake, "public.other_t").column("_xid").to_pylist())

            c3.execute("UPDATE other_t SET v = 'e2' WHERE id = 5")
            c3.commit()
        finally:
            c3.close()
        with c.transaction():
            txs["small6"] = (xid(c), False)
            c.execute("UPDATE other_t SET v = 'after' WHERE id = 6")

        second = run_sync(cfg, spark=spark)
        assert second.status == "committed" and second.batch == 2
        assert_mirror(c, lake, TABLES)
        assert_log_matches_audit(c, lake, KEYS)

    # E arrived whole, once, in the second batch.
    other_log = read_changes(lake, "public.other_t").to_pylist()
    e_rows = [r for r in other_log if r["_xid"] == xid_e]
    assert len(e_rows) == 1200 + 4 + 1
    assert {r["_batch"] for r in e_rows} == {2}
    # Every unchanged TOAST value was recovered (same transaction, earlier batch state).
    for table in TABLES:
        assert not any(read_changes(lake, table).column("_missing_toast").to_pylist()), table
    filled = [r for r in other_log if r["_op"] == "U" and r["id"] <= 6]
    assert filled and all(r["big"] for r in filled)

    transactions = committed(lake, "transactions").to_pylist()
    by_xid = {r["xid"]: r for r in transactions}
    assert len(by_xid) == len(transactions), "a transaction appears twice"
    assert {x: r["streamed"] for x, r in by_xid.items()} == dict(txs.values())
    assert by_xid[xid_e]["_batch"] == 2
    now = datetime.now(timezone.utc)
    for r in transactions:
        assert r["commit_lsn"] < r["end_lsn"]
        assert started <= r["commit_ts"] <= now
    # Every change row belongs to its transaction's commit.
    for table in TABLES:
        for r in read_changes(lake, table).to_pylist():
            assert r["_commit_lsn"] == by_xid[r["_xid"]]["commit_lsn"], (table, r["_xid"])

    messages = committed(lake, "messages").to_pylist()
    assert sorted((m["prefix"], m["content"], m["transactional"]) for m in messages) == sorted(
        [
            ("slotlake", b"in A", True),
            ("p", b"small", True),
            ("nontx", b"from C", False),
            ("nontx", b"from rolled back", False),
            ("nontx", b"autocommit", False),
            ("slotlake", b"in E", True),
        ]
    )
    for m in messages:
        if m["transactional"]:
            assert m["commit_lsn"] == by_xid[m["xid"]]["commit_lsn"]
        else:
            assert m["commit_lsn"] is None
    assert [m["_batch"] for m in messages if m["content"] == b"in E"] == [2]


def _assert_proto4_refused(c: psycopg.Connection, cfg, slot: str) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL 15 speaks pgoutput up to protocol 3: slotlake says so before peeking…
    with pytest.raises(
        SourceError, match=r"proto_version 4 is not supported by PostgreSQL 15 \(highest: 3\)"
    ):
        run_sync(cfg)
    # …and the server itself refuses it, so the client's limit is the server's.
    with pytest.raises(psycopg.errors.Error, match="proto_version=4"):
        c.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '4', 'publication_names', 'pub')",
            (slot,),
        )
    assert not Path(cfg.lake.path, "_commits").exists() or not any(
        Path(cfg.lake.path, "_commits").iterdir()
    )


MULTI_SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE multi (
    id int PRIMARY KEY, i2 smallint, i8 bigint, num numeric(12,3), free numeric, f4 real,
    f8 float8, b bool, t text, vc varchar(20), by bytea, d date, ts timestamp, tz timestamptz,
    tm time, iv interval, u uuid, j jsonb, ia int[], ta text[], ip inet, m mood, big text
);
ALTER TABLE multi ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR TABLE multi;
"""

MULTI_ROWS = """
INSERT INTO multi SELECT g, (g % 300)::smallint, g * 100000000000,
    CASE WHEN g % 7 = 0 THEN 'NaN'::numeric ELSE g + 0.125 END, g / 3.0, g / 7.0, g / 9.0, g % 2 = 0,
    'tëxt ' || g, 'vc' || g, decode(md5(g::text), 'hex'),
    CASE WHEN g = 5 THEN 'infinity'::date ELSE date '2024-01-01' + g END,
    timestamp '2024-01-01 12:00:00.123456' + g * interval '1 minute',
    CASE WHEN g = 6 THEN '-infinity'::timestamptz ELSE timestamptz '2024-01-01 00:00+02' + g * interval '1 hour' END,
    time '10:00' + g * interval '1 second', g * interval '1 day 2 hours',
    md5(g::text)::uuid, jsonb_build_object('g', g, 'a', ARRAY[g, g + 1]),
    ARRAY[g, NULL, -g], ARRAY['x' || g, NULL], ('10.0.0.' || (g % 250))::inet,
    (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::mood,
    CASE WHEN g % 50 = 0 THEN repeat(md5(g::text), 300) END
FROM generate_series(1, 1500) g
"""


def test_binary_and_text_tuples_give_the_same_lake(  # type: ignore[no-untyped-def]
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    slot_b = f"{slot}_bin"[:63]
    lake_t, lake_b = str(tmp_path / "text"), str(tmp_path / "binary")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(MULTI_SCHEMA)
        for s in (slot, slot_b):
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
        c.execute(MULTI_ROWS)  # one streamed transaction
        c.execute("UPDATE multi SET t = 'upd' WHERE id % 50 = 0")  # big left out
        c.execute("DELETE FROM multi WHERE id % 11 = 0")
        for lake, s, binary in ((lake_t, slot, False), (lake_b, slot_b, True)):
            result = run_sync(streaming_config(pg_dsn, lake, s, 2, binary=binary), spark=spark)
            assert result.status == "committed"
            assert_mirror(c, lake, ["public.multi"])

    def rows(table: pa.Table) -> list[dict[str, Any]]:
        return sorted(
            table.to_pylist(),
            key=lambda r: (r.get("_commit_lsn") or 0, r.get("_tx_ordinal") or 0, r["id"] or 0),
        )

    state_t, state_b = read_state(lake_t, "public.multi"), read_state(lake_b, "public.multi")
    assert state_t.num_rows == 1500 - 1500 // 11
    assert state_t.schema == state_b.schema
    assert rows(state_t) == rows(state_b)
    changes_t, changes_b = (
        read_changes(lake_t, "public.multi"),
        read_changes(lake_b, "public.multi"),
    )
    assert changes_t.num_rows == changes_b.num_rows == 1500 + 30 + 1500 // 11
    assert rows(changes_t) == rows(changes_b)
    # The values kept as text came through both formats.
    fallback = {r["id"]: dict(r["_fallback"]) for r in state_b.to_pylist() if r["_fallback"]}
    assert fallback[5]["d"] == "infinity" and fallback[6]["tz"] == "-infinity"
    assert fallback[7]["num"] == "NaN"


def test_streaming_needs_proto_2(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    cfg = make_config(pg_dsn, str(tmp_path / "lake"), slot, proto_version=1, streaming=True)
    with pytest.raises(SourceError, match="streaming needs proto_version 2 or higher"):
        run_sync(cfg)
    assert not Path(tmp_path, "lake", "_commits").exists()


def test_a_stream_that_delivers_nothing_is_no_transaction(  # type: ignore[no-untyped-def]
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    """pgoutput streams a big transaction on unpublished tables as empty S…E segments and
    a Stream Commit (it leaves the same transaction out when it is not streamed): the
    transactions dataset lists neither, on the driver's path and on Spark's."""
    lake = str(tmp_path / "lake")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("CREATE TABLE scratch (id int, v text)")  # in no publication
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with c.transaction():
            xid_unpublished = xid(c)
            c.execute("INSERT INTO scratch SELECT g, md5(g::text) FROM generate_series(1, 3000) g")
        with c.transaction():
            xid_big = xid(c)
            insert_series(c, "big_t", 1, 1200, "a")
        with c.transaction():
            xid_small = xid(c)
            c.execute("INSERT INTO other_t VALUES (1, 'small', NULL)")
        result = run_sync(streaming_config(pg_dsn, lake, slot, 2), spark=spark)
        assert result.status == "committed"
        assert_mirror(c, lake, TABLES)

    raw_dir = Lake(lake).path(Lake(lake).read_commit(1).raw or "")
    raw = read_raw(raw_dir)
    stream_commits = {
        sx
        for sx, t in zip(
            raw.column("stream_xid").to_pylist(), raw.column("msg_type").to_pylist(), strict=True
        )
        if t == "c"
    }
    assert stream_commits == {xid_unpublished, xid_big}  # the server did stream it
    listed = read_transactions(lake).to_pylist()
    assert {(r["xid"], r["streamed"]) for r in listed} == {(xid_big, True), (xid_small, False)}

    # Spark's path (a batch too big for the driver) builds the same rows from the raw.
    from slotlake.batch import _transactions
    from slotlake.decode import collect_catalog, scan_raw

    scan = scan_raw(raw_dir)
    bcat = collect_catalog(scan.catalog_rows, 1, stream_content=scan.stream_content)
    assert bcat.streams.empty == {xid_unpublished}
    on_spark = _transactions(spark.read.parquet(raw_dir), bcat, 1).toArrow()
    assert sorted(on_spark.to_pylist(), key=lambda r: r["commit_lsn"]) == sorted(
        listed, key=lambda r: r["commit_lsn"]
    )


def _relations_in_streams(lake: str, batch: int) -> list[tuple[int, list[str]]]:
    """(stream xid, column names) of each Relation message streamed in batch ``batch``."""
    from slotlake.pgoutput import Relation

    raw = read_raw(Lake(lake).path(Lake(lake).read_commit(batch).raw or ""))
    out = []
    for data, t, sx in zip(
        raw.column("data").to_pylist(),
        raw.column("msg_type").to_pylist(),
        raw.column("stream_xid").to_pylist(),
        strict=True,
    ):
        if t == "R" and sx is not None:
            msg = decode(data, in_stream=True)
            assert isinstance(msg, Relation)
            out.append((sx, [col.name for col in msg.columns]))
    return out


def source_columns(table: pa.Table) -> list[str]:
    return [n for n in table.column_names if not n.startswith("_")]


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_column_added_by_a_transaction_open_at_the_target(  # type: ignore[no-untyped-def]
    pg_dsn: str, slot: str, spark, tmp_path: Path, end: str, monkeypatch, caplog
) -> None:
    """``ALTER TABLE … ADD COLUMN … DEFAULT`` and a big insert, streamed, in a transaction
    still open when a sync reads its target. The stream's Relation message names the new
    column, but the transaction is not in the batch: the state keeps the columns of the
    target's catalog, and gets the column with the transaction, whole, in a later batch
    (or never, rolled back). The sync reads the target's catalog in a snapshot taken with
    the flush LSN, so it may wait for the ALTER's lock (and says whose) but never sees
    the column early."""
    import logging
    import threading
    import time

    from slotlake import snapshot, source

    monkeypatch.setattr(source, "LOCK_REPORT_AFTER", 0.2)
    caplog.set_level(logging.WARNING, logger="slotlake.source")

    def lock_reports() -> list[str]:
        return [r.getMessage() for r in caplog.records if "waiting for session pid" in r.message]

    lake = str(tmp_path / "lake")
    cfg = streaming_config(pg_dsn, lake, slot, 2)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        insert_series(c, "big_t", 1, 50, "seed")
        assert run_sync(cfg, spark=spark).status == "committed"

        ddl = psycopg.connect(pg_dsn)
        ddl_pid = ddl.info.backend_pid
        finished, waited = threading.Event(), threading.Event()
        prepare = snapshot.prepare

        def end_the_ddl() -> None:
            # Once the sync waits for the ALTER's lock (its target and snapshot taken) or
            # has finished without waiting: either way the transaction ends after the target.
            with psycopg.connect(pg_dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 120
                while not finished.is_set() and time.monotonic() < deadline:
                    waiting = watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND pid <> %s",
                        (ddl_pid,),
                    ).fetchone()
                    if waiting and waiting[0]:
                        waited.set()
                        break
                    time.sleep(0.05)
            # A wait is reported before the transaction ends.
            while waited.is_set() and not lock_reports() and time.monotonic() < deadline:
                time.sleep(0.05)
            ddl.commit() if end == "commit" else ddl.rollback()

        def then_open_ddl(*args, **kwargs):  # type: ignore[no-untyped-def]
            prepared = prepare(*args, **kwargs)
            ddl.execute("ALTER TABLE big_t ADD COLUMN x int DEFAULT 7")
            insert_series(ddl, "big_t", 1001, 2200, "open")
            # A commit elsewhere flushes the open transaction's WAL below the target.
            c.execute("INSERT INTO other_t VALUES (1, 'o', NULL)")
            ender.start()
            return prepared

        ender = threading.Thread(target=end_the_ddl)
        monkeypatch.setattr(snapshot, "prepare", then_open_ddl)
        try:
            result = run_sync(cfg, spark=spark)
        finally:
            finished.set()
            if ender.ident is not None:
                ender.join(150)
            ddl.close()
        monkeypatch.setattr(snapshot, "prepare", prepare)
        assert result.status == "committed" and result.batch == 2
        if waited.is_set():  # PostgreSQL 16's pg_publication_tables locks the tables
            (report,) = set(lock_reports())
            assert report.startswith("batch 2: reading the published tables: waiting for ")
            assert f"session pid {ddl_pid} holding AccessExclusiveLock on big_t" in report
            assert "INSERT" not in report and "ALTER" not in report  # no statement text

        state = read_state(lake, "public.big_t")
        assert source_columns(state) == ["id", "v", "big"]
        assert state.num_rows == 50
        # Nor has the change log: a column no committed transaction had.
        assert "x" not in read_changes(lake, "public.big_t").column_names
        if end == "commit":
            # The path under test ran: the open transaction was streamed in this batch with
            # a Relation message that has the column.
            assert any("x" in cols for _, cols in _relations_in_streams(lake, 2))
            c.execute("UPDATE big_t SET v = 'after' WHERE id <= 3")
            assert run_sync(cfg, spark=spark).batch == 3
            assert source_columns(read_state(lake, "public.big_t")) == ["id", "v", "big", "x"]
        assert_mirror(c, lake, TABLES)
