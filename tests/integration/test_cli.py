"""The `slotlake` command as a user runs it: a real process, a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from slotlake.lake import LAYOUT_FILE, Lake, TableCommit, make_record
from slotlake.localpg import LocalPostgres
from slotlake.raw import RawWriter
from slotlake.source import SlotSource, lock_key

from .sync_helpers import slot_confirmed, streaming_from


def slotlake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # The console script a user runs (.venv/bin/slotlake), else the module.
    script = Path(sys.executable).parent / "slotlake"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "slotlake.cli"]
    return subprocess.run(
        [*command, *args],
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
    # A directory of batches (a lake's _raw) is no batch: a usage error naming them.
    no_batch = slotlake("inspect", "--raw", str(tmp_path))
    assert no_batch.returncode == 2 and not no_batch.stdout
    assert no_batch.stderr.strip() == (
        f"slotlake inspect: {tmp_path} is not one raw batch but holds 1 (raw): pass one of "
        "them to --raw, or a committed batch's number to --batch with the lake's --config"
    )


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
    assert "public.t: 4 changes, 1 rows\n" in run.stdout
    assert "status: committed, batch 1" in run.stdout
    assert "pulling" in run.stderr and "committed" in run.stderr  # progress goes to stderr

    after = json.loads(slotlake("status", "--config", str(conf), "--json").stdout)
    assert after["last_batch"]["batch"] == 1
    rec = Lake(tmp_path / "lake").read_commit(1)
    t = rec.tables["public.t"]
    assert after["tables"] == {
        "public.t": {
            "state_rows": 1,
            "changes_in_last_batch": 4,
            "missing_toast_in_last_batch": 0,
            "state_version": t.state_version,
            "changes_version": t.changes_version,
            "state": "state/public.t",
            "changes": "changes/public.t",
            "multiset": False,
            "multiset_spread": False,
            "unique_on": [],
            "written_in_last_batch": True,
            "gone_since": None,
        }
    }
    assert isinstance(t.state_version, int) and isinstance(t.changes_version, int)
    assert after["lake_id"] and after["last_batch"]["txn_app_id"] == rec.txn_app_id
    assert after["last_batch"]["transactions_version"] == rec.transactions_version
    assert after["slot_state"]["confirmed_flush_lsn"] == after["last_batch"]["end_lsn"]

    assert after["lock_held_by"] is None
    text = slotlake("status", "--config", str(conf))
    assert "public.t: 1 rows (4 changes in the last batch)" in text.stdout
    assert "lock:" not in text.stdout
    # A run holding the slot's lock meanwhile: its session, as the server lists it.
    with psycopg.connect(pg_dsn, autocommit=True, application_name="a run") as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (lock_key(slot),))
        held = json.loads(slotlake("status", "--config", str(conf), "--json").stdout)
        pid = holder.info.backend_pid
        assert held["lock_held_by"]["pid"] == pid
        assert held["lock_held_by"]["application"] == "a run"
        assert held["lock_held_by"]["state"] == "idle"
        line = f"  lock: held by PID {pid}, application 'a run', from 127.0.0.1, connected "
        assert line in slotlake("status", "--config", str(conf)).stdout
        holder.execute("SELECT pg_advisory_unlock_all()")
    assert after["slot_state"]["active_by"] is None
    # A consumer streaming from the slot meanwhile: its session, as the server lists it.
    with streaming_from(pg_dsn, slot, application="rival"):
        busy = json.loads(slotlake("status", "--config", str(conf), "--json").stdout)
        assert busy["slot_state"]["active_by"]["application"] == "rival"
        shown = slotlake("status", "--config", str(conf)).stdout
        assert f"  slot in use by PID {busy['slot_state']['active_by']['pid']}, " in shown
    assert f"Delta state v{t.state_version}, changes v{t.changes_version}" in text.stdout
    assert "batch 1 (sync)" in text.stdout

    # The source down (nothing listens on port 1): the lake's status still shows, and the
    # run fails and says why. An empty DSN is named as libpq's defaults.
    down = slotlake(
        "status", "--config", str(conf), "--set", "source.dsn=",
        env={"PGHOST": "127.0.0.1", "PGPORT": "1"},
    )  # fmt: skip
    assert down.returncode == 1, down.stderr
    assert (
        "slot: unknown, the source was not reached: cannot connect to the libpq defaults "
        "(an empty source.dsn: PG* variables, service file): " in down.stdout
    )
    assert "public.t: 1 rows (4 changes in the last batch)" in down.stdout
    down = slotlake("status", "--config", str(conf), "--json", "--set", "source.dsn=port=1")
    assert down.returncode == 1, down.stderr
    out = json.loads(down.stdout)
    assert out["slot_state"] is None and out["last_batch"]["batch"] == 1
    assert out["source_error"].startswith("cannot connect to port=1: ")
    assert out["tables"] == after["tables"] and before["source_error"] is None

    # Dropped at the source: the next batch marks it gone, and status says so.
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DROP TABLE t")
    assert slotlake("sync", "--config", str(conf)).returncode == 0
    text = slotlake("status", "--config", str(conf))
    assert "public.t: gone from the source since batch 2, last 1 rows" in text.stdout


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


def old_layout_lake(root: Path) -> None:
    """A lake as slotlake wrote it before Delta Lake: commit records without a layout."""
    (root / "_commits").mkdir(parents=True)
    (root / "_commits" / "00000000000000000001.json").write_text(
        json.dumps({"batch": 1, "slot": "s", "kind": "sync", "tables": {}, "raw": None})
    )
    (root / "state").mkdir()


def assert_old_layout_refused(run: subprocess.CompletedProcess[str], command: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert "Traceback" not in run.stderr, run.stderr
    if command != "sync":  # sync logs its configuration first
        assert len(lines) == 1, run.stderr
    assert lines[-1].startswith(f"slotlake {command}: lake ")
    assert "old Parquet layout" in lines[-1] and "bootstrap a new lake.path" in lines[-1]


@pytest.mark.one_pg_version
def test_old_layout_lake_is_refused_in_one_line(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)
    old_layout_lake(tmp_path / "lake")
    for command in ("status", "bootstrap", "sync"):
        assert_old_layout_refused(slotlake(command, "--config", str(conf)), command)
    inspect = slotlake("inspect", "--config", str(conf), "--batch", "1")
    assert_old_layout_refused(inspect, "inspect")
    # The demo checks a --lake it is given before it starts a server.
    assert_old_layout_refused(slotlake("demo", "--lake", str(tmp_path / "lake")), "demo")
    # Nothing was written into it, and the source's slot was not touched.
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == ["_commits", "state"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert c.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone() == (1,)


def test_status_and_inspect_of_a_bootstrap_batch(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    """A bootstrap record (no raw payloads), written without Spark: status lists its Delta
    versions per table; inspect --batch says there is nothing to decode."""
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)
    lake = Lake(tmp_path / "lake")
    app_id = lake.app_id("bootstrap-abc")
    lake.write_commit(
        make_record(
            batch=1,
            attempt="abc",
            slot=slot,
            start_lsn="0/10",
            end_lsn="0/10",
            target_lsn="0/10",
            raw=None,
            kind="bootstrap",
            transactions="transactions",
            transactions_version=0,
            txn_app_id=app_id,
            tables={
                "public.t": TableCommit(
                    changes="changes/public.t",
                    state="state/public.t",
                    state_rows=5,
                    key_columns=["id"],
                    replica_identity="d",
                    changes_version=0,
                    state_version=1,
                    written=True,
                ),
                "public.f": TableCommit(
                    changes="changes/public.f",
                    state="state/public.f",
                    state_rows=3,
                    replica_identity="f",
                    changes_version=0,
                    state_version=1,
                    written=True,
                ),
                "public.fk": TableCommit(
                    changes="changes/public.fk",
                    state="state/public.fk",
                    state_rows=4,
                    replica_identity="f",
                    changes_version=0,
                    state_version=1,
                    written=True,
                    unique_on=["a", "b"],
                ),
            },
        )
    )
    assert (tmp_path / "lake" / LAYOUT_FILE).exists()
    text = slotlake("status", "--config", str(conf))
    assert text.returncode == 0, text.stderr
    assert "batch 1 (bootstrap)" in text.stdout
    assert (
        "public.t: 5 rows (0 changes in the last batch); Delta state v1, changes v0" in text.stdout
    )
    assert "public.f: 3 distinct rows (multiset)" in text.stdout
    assert "public.fk: 4 rows (multiset unique on a, b)" in text.stdout
    status = json.loads(slotlake("status", "--config", str(conf), "--json").stdout)
    assert status["tables"]["public.f"]["multiset"] is True
    assert status["tables"]["public.fk"]["unique_on"] == ["a", "b"]
    assert status["last_batch"]["txn_app_id"] == app_id

    boot = slotlake("inspect", "--config", str(conf), "--batch", "1")
    assert boot.returncode == 2
    assert "batch 1 is a bootstrap batch: it has no raw payloads" in boot.stderr
    absent = slotlake("inspect", "--config", str(conf), "--batch", "7")
    assert absent.returncode == 2 and "batch 7 is not committed" in absent.stderr


@pytest.mark.one_pg_version  # the source's versions are covered by every pg_cluster test
def test_demo_runs_and_proves_the_mirror(pg_cluster: LocalPostgres, tmp_path: Path) -> None:
    """`slotlake demo` as `make demo` runs it (a throwaway server of its own), small."""
    lake = tmp_path / "demo-lake"
    run = slotlake(
        "demo", "--lake", str(lake), "--pg-version", str(pg_cluster.version), "--rows", "60"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "demo succeeded: the mirror equals the source" in run.stdout
    for table in ("public.customers", "public.documents", "public.audit_log"):
        line = next(x for x in run.stdout.splitlines() if x.strip().startswith(table))
        assert "OK: state equals source" in line and "(state v" in line, line
    rec = Lake(lake).last_commit()
    assert rec is not None and rec.batch == 3 and rec.kind == "sync"
    # A second demo into the same lake is refused (its slot would be a new one).
    again = slotlake("demo", "--lake", str(lake), "--pg-version", str(pg_cluster.version))
    assert again.returncode == 2 and "already holds a lake" in again.stderr


def test_status_of_an_empty_lake_directory(pg_dsn: str, slot: str, tmp_path: Path) -> None:
    setup_source(pg_dsn, slot)
    conf = write_config(tmp_path, pg_dsn, slot)
    run = slotlake("status", "--config", str(conf))
    assert run.returncode == 0, run.stderr
    assert "no committed batch" in run.stdout
    assert not (tmp_path / "lake").exists()  # status never creates the lake
