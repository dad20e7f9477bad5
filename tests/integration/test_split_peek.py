"""A pull cut in two peeks (the slot to the cut, a temporary copy from it) returns the
single peek's rows: the PostgreSQL facts ``SlotSource._pull_split`` rests on, pinned at
the boundaries where they could fail (a commit record starting at the cut, ending at it,
page boundaries), on both server versions."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake.lsn import Lsn
from slotlake.raw import RawWriter, read_raw
from slotlake.source import SlotSource, SourceError, off_page_headers

from .test_source import PUB, check_transactions, connect, setup_source, slot_of

PAGE = 8192


def setup(dsn: str) -> None:
    """Many small transactions of every kind a batch carries, over a few dozen WAL pages,
    on test_source's tables (a keyed ``t1``, a multiset ``t2``), publication and slot."""
    setup_source(dsn)
    with connect(dsn) as c:
        for i in range(150):
            c.execute("INSERT INTO t1 (id, v) VALUES (%s, repeat('x', 900) || %s)", (i, i))
            if i % 7 == 0:
                c.execute("UPDATE t1 SET v = 'u' || id WHERE id = %s", (i // 2,))
                c.execute("INSERT INTO t2 VALUES (%s, 'row'), (%s, 'row')", (i, i))
            if i % 11 == 0:
                c.execute("DELETE FROM t2 WHERE id = %s", (i - 7 * (i // 7),))
                # Non-transactional: decoded at its own LSN, not with a commit.
                c.execute("SELECT pg_logical_emit_message(false, 'p', %s)", (f"alone {i}",))
            if i == 60:
                c.execute("ALTER TABLE t1 ADD COLUMN extra int DEFAULT 7")
            if i == 90:
                c.execute("TRUNCATE t2")
            if i % 13 == 0:
                with c.transaction():
                    c.execute("INSERT INTO t2 VALUES (%s, 'in tx')", (-i,))
                    c.execute("SELECT pg_logical_emit_message(true, 'p', %s)", (f"in tx {i}",))
                    c.execute("UPDATE t1 SET v = 'tx' WHERE id = %s", (i - 1,))


def content(directory: Path) -> list[tuple[Any, ...]]:
    """The raw rows that are not Relation or Type messages, in order: the second
    decoding session sends those again before its first change of each relation."""
    rows = read_raw(directory).to_pylist()
    check_transactions(rows)
    return [
        (r["lsn"], r["xid"], r["data"], r["commit_lsn"], r["commit_ts"])
        for r in rows
        if r["msg_type"] not in ("R", "Y")
    ]


def temporary_slots(dsn: str, slot: str) -> list[str]:
    with connect(dsn) as c:
        # The copy goes with its session, whose backend exits after the client moved on.
        for _ in range(100):
            names = [
                r[0]
                for r in c.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
                    (f"{slot[:40]}_half_%",),
                )
            ]
            if not names:
                break
            time.sleep(0.05)
    return names


def copies_now(dsn: str, slot: str) -> list[str]:
    """The copies of ``slot`` at this instant, without waiting for a backend to exit."""
    with connect(dsn) as c:
        rows = c.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s",
            (f"{slot[:40]}_half_%",),
        ).fetchall()
    return [r[0] for r in rows]


def test_two_peeks_cut_anywhere_return_the_single_peeks_rows(pg_dsn: str, tmp_path: Path) -> None:
    setup(pg_dsn)
    slot = slot_of(pg_dsn)
    with SlotSource(pg_dsn, slot, [PUB], messages=True) as src:
        info = src.check()
        start = info.confirmed_flush_lsn
        upto = src.current_flush_lsn()
        assert start is not None and int(upto) - int(start) > 16 * PAGE
        whole = src.pull(upto, RawWriter(tmp_path / "whole"))
        assert whole.split_at is None
        expected = content(tmp_path / "whole")
        rows = read_raw(tmp_path / "whole").to_pylist()
        commits = [r for r in rows if r["msg_type"] == "C"]
        assert len(commits) > 150
        # Cuts at a commit record's start (its transaction belongs to the second peek),
        # just after it (the first), at its end (the record that reaches the cut is the
        # first peek's last) and around page boundaries, through the rule pull uses.
        cuts: set[int] = set()
        for r in commits[5::45]:
            begin = Lsn.from_signed(r["commit_lsn"])
            end = Lsn.from_signed(r["lsn"])
            cuts |= {int(begin), int(begin) + 1, int(end) - 1, int(end), int(end) + 8}
        first_page = (int(start) // PAGE + 2) * PAGE
        for page in range(first_page, int(upto) - PAGE, 7 * PAGE):
            cuts |= {page - 8, page, page + 8, page + 24, page + 40, page + 48}
        seen_cuts = set()
        for k, raw_cut in enumerate(sorted(cuts)):
            cut = Lsn(off_page_headers(raw_cut, src.wal_block_size))
            if cut in seen_cuts or not start < cut < upto:
                continue
            seen_cuts.add(cut)
            out = tmp_path / f"cut{k}"
            result = src.pull(upto, RawWriter(out, row_group_rows=64), split_at=cut)
            assert result.split_at == cut
            # Dropped by the pull itself, so the next pull's copy never meets it.
            assert copies_now(pg_dsn, slot) == [], f"cut at {cut}"
            assert content(out) == expected, f"cut at {cut}"
            assert result.summary.last_complete_end_lsn == whole.summary.last_complete_end_lsn
            assert result.summary.transactions == whole.summary.transactions
        assert len(seen_cuts) > 20, len(seen_cuts)
        # Nothing consumed, nothing left behind.
        assert src.slot_info().confirmed_flush_lsn == start  # type: ignore[union-attr]
    assert temporary_slots(pg_dsn, slot) == []


def test_a_sized_pull_is_split_and_a_small_one_is_not(pg_dsn: str, tmp_path: Path) -> None:
    setup(pg_dsn)
    slot = slot_of(pg_dsn)
    with SlotSource(pg_dsn, slot, [PUB], messages=True, split_bytes=64 * 1024) as src:
        start = src.check().confirmed_flush_lsn
        upto = src.current_flush_lsn()
        assert start is not None
        small = src.pull(Lsn(int(start) + 32 * 1024), RawWriter(tmp_path / "small"))
        assert small.split_at is None
        big = src.pull(upto, RawWriter(tmp_path / "big"))
        assert big.split_at is not None and start < big.split_at < upto
        assert big.split_at == src.split_point(start, upto)
    with SlotSource(pg_dsn, slot, [PUB], messages=True) as src:
        src.pull(upto, RawWriter(tmp_path / "one"))
    assert content(tmp_path / "big") == content(tmp_path / "one")


def committed(directory: Path) -> list[tuple[int, list[bytes]]]:
    """(commit LSN, DML payloads) of each committed transaction, in commit order, whether
    it came streamed or whole: a streamed DML payload's xid is cut out."""
    out: list[tuple[int, list[bytes]]] = []
    streams: dict[int, list[bytes]] = {}
    current: list[bytes] = []
    for r in read_raw(directory).to_pylist():
        t, data = r["msg_type"], r["data"]
        if t in ("I", "U", "D"):
            if r["stream_xid"] is None:
                current.append(data)
            else:
                streams.setdefault(r["stream_xid"], []).append(data[:1] + data[5:])
        elif t == "C":
            out.append((r["commit_lsn"], current))
            current = []
        elif t == "c":
            out.append((r["commit_lsn"], streams.pop(r["stream_xid"], [])))
        elif t == "A":
            streams.pop(r["stream_xid"], None)
    return out


def test_a_transaction_streamed_across_the_cut_comes_once(pg_dsn: str, tmp_path: Path) -> None:
    """With streaming, the first peek runs unstreamed: a transaction open at the cut is
    left to the second peek whole, instead of streamed in part by both."""
    slot = slot_of(pg_dsn)
    with connect(pg_dsn) as c, psycopg.connect(pg_dsn) as open_tx:
        c.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
        c.execute(f"CREATE PUBLICATION {PUB} FOR TABLE t1")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        big = "INSERT INTO t1 SELECT g, repeat('s', 200) FROM generate_series(%s::int, %s::int) g"
        c.execute(big, (1, 800))  # streamed and committed before the cut
        open_tx.execute(big, (10_001, 11_000))
        for i in range(20):
            c.execute("UPDATE t1 SET v = %s WHERE id = %s", (f"small {i}", i + 1))
        cut = Lsn.parse(c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        open_tx.execute(big, (11_001, 12_000))
        c.execute("DELETE FROM t1 WHERE id <= 5")
        open_tx.commit()
        c.execute(big, (20_001, 20_800))  # streamed after the cut
    settings = {"logical_decoding_work_mem": "64kB"}
    with SlotSource(
        pg_dsn, slot, [PUB], proto_version=2, streaming=True, session_settings=settings
    ) as src:
        start = src.check().confirmed_flush_lsn
        upto = src.current_flush_lsn()
        src.pull(upto, RawWriter(tmp_path / "one"))
        cuts = [off_page_headers(int(cut), src.wal_block_size), int(start) + 4096]
        for k, at in enumerate(cuts):
            result = src.pull(upto, RawWriter(tmp_path / f"two{k}"), split_at=Lsn(at))
            assert result.split_at == Lsn(at)
    one = committed(tmp_path / "one")
    assert len(one) == 24
    one_raw = read_raw(tmp_path / "one").column("msg_type").to_pylist()
    assert one_raw.count("c") == 3  # the three big ones streamed in the single peek
    for k in range(len(cuts)):
        assert committed(tmp_path / f"two{k}") == one, f"cut {k}"
    # At the first cut, the first big transaction came whole from the first peek.
    types = read_raw(tmp_path / "two0").column("msg_type").to_pylist()
    assert types.count("c") == 2 and types.count("S") < one_raw.count("S"), types.count("S")


def test_without_a_free_slot_it_pulls_in_one_peek(
    pg_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup(pg_dsn)
    slot = slot_of(pg_dsn)
    with SlotSource(pg_dsn, slot, [PUB], messages=True, split_bytes=1) as src:
        start = src.check().confirmed_flush_lsn
        upto = src.current_flush_lsn()
        # The copy's name taken: the copy fails as it would with no slot free.
        taken = f"{slot[:40]}_half_{src._backend_pid()}_1"
        with connect(pg_dsn) as c:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (taken,))
        try:
            with caplog.at_level(logging.WARNING, logger="slotlake.source"):
                result = src.pull(upto, RawWriter(tmp_path / "raw"))
            assert result.split_at is None
            assert f"pulling in one peek: cannot copy slot {slot}" in caplog.text
            assert result.messages == src.count_floor(upto)
            # The next pull's copy has a name of its own: a copy of the pull before that
            # the server has not dropped yet does not stop it.
            again = src.pull(upto, RawWriter(tmp_path / "again"))
            assert again.split_at is not None
            assert content(tmp_path / "again") == content(tmp_path / "raw")
        finally:
            with connect(pg_dsn) as c:
                c.execute("SELECT pg_drop_replication_slot(%s)", (taken,))
        assert src.slot_info().confirmed_flush_lsn == start  # type: ignore[union-attr]


def test_a_failing_second_peek_fails_the_pull_and_leaves_nothing(
    pg_dsn: str, tmp_path: Path
) -> None:
    setup(pg_dsn)
    slot = slot_of(pg_dsn)
    with SlotSource(pg_dsn, slot, [PUB], messages=True) as src:
        start = src.check().confirmed_flush_lsn
        upto = src.current_flush_lsn()
        assert start is not None
        # Below the copy's confirmed_flush: its advance is refused by the server.
        with pytest.raises(SourceError, match=r"second half, from .* minimum is") as err:
            src.pull(upto, RawWriter(tmp_path / "bad"), split_at=Lsn(int(start) - 8))
        assert slot in str(err.value)
        assert not list((tmp_path / "bad").glob(".*inprogress"))
        # The session is still usable and the slot where it was.
        assert src.slot_info().confirmed_flush_lsn == start  # type: ignore[union-attr]
        again = src.pull(upto, RawWriter(tmp_path / "again"))
        assert again.messages == src.count_floor(upto)
    assert temporary_slots(pg_dsn, slot) == []
