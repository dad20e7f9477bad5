"""The `slotlake` command as a user runs it: a real process, a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from slotlake.raw import RawWriter
from slotlake.source import SlotSource

from .sync_helpers import slot_confirmed


def slotlake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotlake.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def write_config(tmp_path: Path, dsn: str, slot: str) -> Path:
    conf = tmp_path / "job.toml"
    conf.write_text(
        f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
publications = ["pub"]

[lake]
path = "{tmp_path / "lake"}"
"""
    )
    return conf


def setup_source(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t VALUES (1, 'één'), (2, NULL)")
        c.execute("UPDATE t SET note = 'two' WHERE id = 2")
        c.execute("DELETE FROM t WHERE id = 1")


def test_inspect_live_and_raw_print_one_line_per_message(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)
    before = None
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        before = slot_confirmed(c, slot)

    live = slotlake("inspect", "--config", str(conf), "--live")
    assert live.returncode == 0, live.stderr
    lines = live.stdout.splitlines()
    body = [line.split(None, 2)[2] for line in lines]
    assert [b.split(":")[0].split(" (")[0] for b in body if b.startswith("table")] == [
        "table public.t"
    ] * 4
    assert (
        sum(b.startswith("BEGIN") for b in body) == sum(b.startswith("COMMIT") for b in body) == 3
    )
    assert any(b.startswith("RELATION public.t") and "id 23 key" in b for b in body)
    assert "table public.t: INSERT: id[23]:'1' note[25]:'één'" in body
    assert "table public.t: UPDATE: id[23]:'2' note[25]:'two'" in body
    assert "table public.t: DELETE: old-key: id[23]:'1'" in body
    # A live inspect never consumes.
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert slot_confirmed(c, slot) == before

    limited = slotlake("inspect", "--config", str(conf), "--live", "--limit", "2")
    assert len(limited.stdout.splitlines()) == 2

    raw_dir = tmp_path / "raw"
    with SlotSource(pg_dsn, slot, ["pub"]) as src:
        src.pull(src.current_flush_lsn(), RawWriter(raw_dir))
    from_raw = slotlake("inspect", "--raw", str(raw_dir))
    assert from_raw.returncode == 0, from_raw.stderr
    assert from_raw.stdout.splitlines() == lines


def test_sync_then_status(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)

    status = slotlake("status", "--config", str(conf), "--json")
    assert status.returncode == 0, status.stderr
    before = json.loads(status.stdout)
    assert before["last_batch"] is None
    assert before["slot_state"]["wal_status"] in ("reserved", "extended")
    assert before["slot_state"]["retained_wal_bytes"] > 0

    run = slotlake("sync", "--config", str(conf), "--set", "spark.spark.sql.shuffle.partitions=2")
    assert run.returncode == 0, run.stderr
    assert "public.t: 4 changes, 1 rows" in run.stdout
    assert "status: committed, batch 1" in run.stdout
    assert "pulling" in run.stderr and "committed" in run.stderr  # progress goes to stderr

    after = json.loads(slotlake("status", "--config", str(conf), "--json").stdout)
    assert after["last_batch"]["batch"] == 1
    assert after["tables"] == {"public.t": {"state_rows": 1, "changes_in_last_batch": 4}}
    assert after["slot_state"]["confirmed_flush_lsn"] == after["last_batch"]["end_lsn"]

    text = slotlake("status", "--config", str(conf))
    assert "public.t: 1 rows" in text.stdout and "batch 1 (sync)" in text.stdout


def test_errors_are_one_line_with_exit_codes(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)
    bad = slotlake("sync", "--config", str(conf), "--set", "source.nope=1")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip().splitlines()[-1]
        == "slotlake: configuration error: unknown configuration key source.nope"
    )

    missing = slotlake(
        "status", "--config", str(conf), "--set", "source.slot=absent_slot", "--json"
    )
    assert missing.returncode == 0 and json.loads(missing.stdout)["slot_state"] is None

    no_slot = slotlake("sync", "--config", str(conf), "--set", "source.slot=absent_slot")
    assert no_slot.returncode == 1
    last = no_slot.stderr.strip().splitlines()[-1]
    assert "absent_slot" in last and "does not exist" in last
    assert not (tmp_path / "lake" / "_commits").exists()
