"""Per-table snapshots while syncing (slotlake.snapshot), on real PostgreSQL and Spark.

Every sync costs seconds of Spark here, so each test walks one lake through several
situations. The oracles: state == ``SELECT *`` (verify.compare_table), and the change
log against the audit trigger of sync_helpers (every change exactly once, in order; the
snapshot's 'S' marker aside).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake.catalog import RESERVED
from slotlake.cli import main as cli_main
from slotlake.lake import Lake, read_changes, read_state
from slotlake.sync import run_sync
from slotlake.verify import compare_table

from .sync_helpers import (
    AUDIT_SQL,
    assert_mirror,
    audit,
    audited_ops,
    before_the_target,
    make_config,
    published_as_leaves,
)


def big(seed: int) -> str:
    return "".join(f"{(seed * 7919 + i) % 1_000_003:07d}" for i in range(3000 // 7))


def logged(root: str, table: str) -> list[tuple[str, str | None]]:
    """(op, id) of the change log, in order, without the snapshot markers."""
    out = []
    for r in read_changes(root, table).to_pylist():
        if r["_op"] == "S":
            continue
        v = (r["_old"] or {}).get("id") if r["_op"] == "D" else r.get("id")
        out.append((r["_op"], None if v is None else str(v)))
    return out


def assert_log_once(root: str, table: str) -> None:
    log = read_changes(root, table).to_pylist()
    ids = Counter((r["_commit_lsn"], r["_tx_ordinal"]) for r in log)
    twice = [k for k, n in ids.items() if n > 1]
    assert not twice, f"{table}: change log rows applied twice: {twice[:5]}"


def markers(root: str, table: str) -> list[int]:
    return [r["_commit_lsn"] for r in read_changes(root, table).to_pylist() if r["_op"] == "S"]


class Writer(threading.Thread):
    """Small transactions on ``b`` while a sync runs (its snapshot must not lose them)."""

    def __init__(self, dsn: str, start_id: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_id, self.stop = dsn, start_id, threading.Event()
        self.count = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self.stop.is_set():
                i = self.next_id
                with c.transaction():
                    c.execute("INSERT INTO b VALUES (%s, %s, %s)", (i, "new", big(i)))
                    # Updates that leave big out: filled from the copy or from events.
                    c.execute("UPDATE b SET v = 'upd' || %s WHERE id = %s", (i, (i * 7) % 10_000))
                    c.execute("DELETE FROM b WHERE id = %s", ((i * 13) % 10_000 + 1,))
                self.next_id += 1
                self.count += 1
                self.stop.wait(0.02)


def test_table_added_to_publication_with_writes_during_its_snapshot(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(AUDIT_SQL)
        c.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE b (id int PRIMARY KEY, v text, big text)")
        c.execute("ALTER TABLE b ALTER COLUMN big SET STORAGE EXTERNAL")
        c.execute(
            "INSERT INTO b SELECT g, 'old' || g, CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 200) END"
            " FROM generate_series(1, 10000) g"
        )
        c.execute("CREATE PUBLICATION pub FOR TABLE a")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO a VALUES (1, 'one')")
        assert run_sync(cfg, spark=spark).status == "committed"
        rec = Lake(lake).last_commit()
        assert rec is not None and set(rec.snapshot["published"]) == {"public.a"}

        c.execute("ALTER PUBLICATION pub ADD TABLE b")
        audit(c, "b", "id")
        c.execute("UPDATE b SET v = 'before the sync' WHERE id IN (1, 2)")  # before CP
        writer = Writer(pg_dsn, 20_000)
        writer.start()
        try:
            result = run_sync(cfg, spark=spark)
        finally:
            writer.stop.set()
            writer.join()
        assert result.status == "committed" and writer.count > 0
        rec = Lake(lake).last_commit()
        assert rec is not None
        assert set(rec.snapshot["tables"]) == {"public.b"}
        assert rec.snapshot["tables"]["public.b"]["reason"] == "new in the publication"
        assert rec.snapshot["tables"]["public.b"]["rows"] >= 10_000 - writer.count
        # What was written after the batch's target comes with the next sync.
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, ["public.a", "public.b"])
        assert_log_once(lake, "public.b")
        assert logged(lake, "public.b") == audited_ops(c, "b")
        assert len(markers(lake, "public.b")) == 1
        # The copy held every row: nothing applied on top of it lacked a TOAST value.
        log = read_changes(lake, "public.b").to_pylist()
        cp = markers(lake, "public.b")[0]
        assert not any(r["_missing_toast"] for r in log if r["_commit_lsn"] >= cp)


def _add_to_a_running_lake(
    c: psycopg.Connection[Any],
    cfg: Any,
    spark: Any,
    slot: str,
    table: str,
    rows: int,
    value_sql: str,
    seed: int,
) -> None:
    """A lake syncing table ``a``, then ``table`` (``rows`` rows, ``v`` = ``value_sql`` of
    ``g``, an EXTERNAL TOAST column ``big``) added to its publication; both audited."""
    c.execute(AUDIT_SQL)
    c.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, big text)")
    c.execute(f"ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL")
    c.execute(
        f"INSERT INTO {table} SELECT g, {value_sql}, %s FROM generate_series(1, %s::int) g",
        (big(seed), rows),
    )
    c.execute("CREATE PUBLICATION pub FOR TABLE a")
    audit(c, "a", "id")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    c.execute("INSERT INTO a VALUES (1, 'one')")
    assert run_sync(cfg, spark=spark).status == "committed"
    c.execute(f"ALTER PUBLICATION pub ADD TABLE {table}")
    audit(c, table, "id")


def _spark_wrote(lake: str, rel: str, since: int) -> list[int]:
    """The versions from ``since`` on of a lake's Delta table that Spark committed."""
    from deltalake import DeltaTable

    return [
        h["version"]
        for h in DeltaTable(str(Path(lake) / rel)).history()
        if h["version"] >= since and str(h.get("engineInfo", "")).startswith("Apache-Spark")
    ]


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_quiet_table_added_to_publication(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A table added to the publication with no change of its own in the batch that copies
    it: the driver re-bases a small one without Spark (Spark a big one, here forced), and a
    fault at each step of the hand-over leaves it exactly once."""
    from slotlake.sync import FAULT_ENV, InjectedFault

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if path == "spark":
        cfg.lake.driver_write_rows = 0
    config = write_config(
        tmp_path / "sync.toml", pg_dsn, slot, lake, driver_rows=0 if path == "spark" else -1
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _add_to_a_running_lake(c, cfg, spark, slot, "q", 3000, "'old' || g", 1)

        steps = (None, "snapshot_copied", "snapshot_rebased", "before_commit")
        for snapshots, step in enumerate(steps, 1):
            c.execute("INSERT INTO a VALUES (%s, 'round')", (100 + snapshots,))  # q stays quiet
            if snapshots > 1:
                assert cli_main(["resnapshot", "--config", str(config), "--table", "public.q"]) == 0
            state_rel = "state/public.q"
            since = len(_delta_commits(lake, state_rel))
            if step is not None:
                monkeypatch.setenv(FAULT_ENV, step)
                with pytest.raises(InjectedFault, match=step):
                    run_sync(cfg, spark=spark)
                monkeypatch.delenv(FAULT_ENV)
            assert run_sync(cfg, spark=spark).status == "committed"
            # A resumed batch is followed by what arrived since: maybe an empty batch more.
            copied = [
                rec
                for rec in Lake(lake).commits()
                if "public.q" in (rec.snapshot or {}).get("tables", {})
            ]
            assert len(copied) == snapshots, step
            assert copied[-1].tables["public.q"].state_rows == 3000
            assert len(markers(lake, "public.q")) == snapshots, step
            assert_mirror(c, lake, ["public.a", "public.q"])
            assert_log_once(lake, "public.a")
            spark_versions = _spark_wrote(lake, state_rel, since)
            assert bool(spark_versions) == (path == "spark"), (step, spark_versions)

        # Its first changes after the copy fill their TOAST value from the copied state.
        c.execute("UPDATE q SET v = 'after' WHERE id <= 10")
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_mirror(c, lake, ["public.a", "public.q"])
        assert logged(lake, "public.q") == audited_ops(c, "q")
        assert not any(read_changes(lake, "public.q").column("_missing_toast").to_pylist())


def _delta_commits(lake: str, rel: str) -> list[Path]:
    """The commit files of a lake's Delta table (none before it exists)."""
    return sorted((Path(lake) / rel / "_delta_log").glob("*.json"))


def write_config(
    path: Path, dsn: str, slot: str, lake: str, messages: bool = False, driver_rows: int = -1
) -> Path:
    path.write_text(
        "[source]\n"
        f"dsn = {json.dumps(dsn)}\n"
        f"slot = {json.dumps(slot)}\n"
        'publications = ["pub"]\n'
        f"messages = {'true' if messages else 'false'}\n"
        "[lake]\n"
        f"path = {json.dumps(lake)}\n"
        + (f"driver_write_rows = {driver_rows}\n" if driver_rows >= 0 else "")
    )
    return path


def test_new_table_rewrites_and_resnapshot(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot, messages=True)
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake, messages=True)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO a VALUES (1, 'one')")
        assert run_sync(cfg, spark=spark).status == "committed"

        # (a) A new table under FOR ALL TABLES, with rows: copied by the next sync.
        c.execute("CREATE TABLE c (id int PRIMARY KEY, n int, t text)")
        c.execute("INSERT INTO c SELECT g, g, 't' || g FROM generate_series(1, 300) g")
        # And one without a key (a multiset state: duplicates kept as _copies).
        c.execute("CREATE TABLE d (x int, y text)")
        c.execute("ALTER TABLE d REPLICA IDENTITY FULL")
        c.execute("INSERT INTO d SELECT g % 3, 'y' FROM generate_series(1, 30) g")
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.a", "public.c", "public.d"])
        assert len(markers(lake, "public.c")) == 1
        assert len(markers(lake, "public.d")) == 1

        # (b) A rewrite without the DDL trigger: the relfilenode changed, no TRUNCATE.
        c.execute("ALTER TABLE c ALTER COLUMN n TYPE bigint USING n * 10")
        c.execute("UPDATE c SET t = 'touched' WHERE id = 1")
        # One duplicate of d goes, another value gains one: the multiset MERGE after a copy.
        c.execute("DELETE FROM d WHERE ctid = (SELECT ctid FROM d WHERE x = 0 LIMIT 1)")
        c.execute("INSERT INTO d VALUES (1, 'y'), (7, NULL)")
        # The batch names c for a copy, and the run takes it in one more batch.
        capsys.readouterr()
        assert cli_main(["sync", "--config", str(config)]) == 0
        said = re.search(
            r"batch (\d+) named tables for a copy, which batch (\d+) took\nstatus: committed, "
            r"batch \2,",
            capsys.readouterr().out,
        )
        assert said is not None
        named, took = int(said[1]), int(said[2])
        assert took == named + 1
        assert "relfilenode" in Lake(lake).read_commit(named).snapshot["wanted"]["public.c"]
        assert list(Lake(lake).read_commit(took).snapshot["tables"]) == ["public.c"]
        assert_mirror(c, lake, ["public.a", "public.c", "public.d"])

        # (b) The DDL capture trigger's message, with a volatile default's rewrite.
        with c.transaction():
            c.execute("ALTER TABLE c ADD COLUMN ts timestamptz DEFAULT clock_timestamp()")
            (oid,) = c.execute("SELECT 'c'::regclass::oid::int").fetchone()  # type: ignore[misc]
            content = {
                "tag": "ALTER TABLE",
                "query": "ALTER TABLE c ADD COLUMN ts …",
                "tables": [{"name": "public.c", "oid": oid, "rewrite": True}],
            }
            c.execute(
                "SELECT pg_logical_emit_message(true, 'slotlake.ddl', %s)", (json.dumps(content),)
            )
        # With the same run's copy off, the next run takes it (and status says so).
        cfg.lake.copy_wanted_in_same_run = False
        assert run_sync(cfg, spark=spark).followed is None
        cfg.lake.copy_wanted_in_same_run = True
        rec = Lake(lake).last_commit()
        assert rec is not None and "DDL message" in rec.snapshot["wanted"]["public.c"]
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config)]) == 0
        assert "snapshot waiting: public.c (rewritten (DDL message" in capsys.readouterr().out
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.a", "public.c"])

        # (c) State damaged by hand, repaired with `slotlake resnapshot`.
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, str(Path(lake) / "state" / "public.c")).delete("id <= 50")
        c.execute("UPDATE c SET t = 'after damage' WHERE id = 200")
        assert cli_main(["resnapshot", "--config", str(config), "--table", "public.c"]) == 0
        assert cli_main(["resnapshot", "--config", str(config), "--table", "public.nope"]) == 1
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config)]) == 0
        assert "snapshot waiting: public.c (requested by hand)" in capsys.readouterr().out
        run_sync(cfg, spark=spark)
        assert_mirror(c, lake, ["public.a", "public.c"])
        assert not list((Path(lake) / "_snapshots" / "requests").glob("*.json"))
        assert_log_once(lake, "public.c")
        assert len(markers(lake, "public.c")) == 4


# -- exactly once across the hand-over ------------------------------------------------------


def _writes(c: psycopg.Connection[Any], r: int) -> None:
    """Changes to both tables, some leaving b's TOAST column out."""
    base = 10_000 + r * 100
    c.execute(
        "INSERT INTO a SELECT g, 'r' || g FROM generate_series(%s::int, %s::int) g",
        (base, base + 4),
    )
    c.execute(
        "INSERT INTO b SELECT g, 'r' || g, %s FROM generate_series(%s::int, %s::int) g",
        (big(r), base, base + 4),
    )
    c.execute("UPDATE b SET v = 'round ' || %s WHERE id IN (%s, %s)", (r, r, base + 1))
    c.execute("UPDATE b SET id = id + 50 WHERE id = %s", (base + 2,))
    c.execute("DELETE FROM b WHERE id IN (%s, %s)", (r + 500, base + 3))


def _check(c: psycopg.Connection[Any], lake: str, slot: str) -> None:
    assert_mirror(c, lake, ["public.a", "public.b"])
    for t in ("a", "b"):
        assert logged(lake, f"public.{t}") == audited_ops(c, t), t
        assert_log_once(lake, f"public.{t}")
    root = Lake(lake)
    assert not list((root.root / "_pending").glob("*.json"))
    from slotlake.snapshot import remove_orphans

    assert remove_orphans(root) == []
    (slots,) = c.execute(
        "SELECT array_agg(slot_name::text) FROM pg_replication_slots WHERE database = current_database()"
    ).fetchone()  # type: ignore[misc]
    assert slots == [slot], "a temporary snapshot slot outlived its run"


@pytest.mark.parametrize(
    "path", ["driver", pytest.param("spark", marks=pytest.mark.one_pg_version)]
)
def test_kill_during_the_hand_over_then_rerun_is_exactly_once(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pg_cluster: Any,
    path: str,
) -> None:
    """Injected faults at each step of a snapshot's hand-over (Spark's: at its re-base),
    then real SIGKILLs, on the driver's re-base (the default for a small table) and on
    Spark's."""
    import random
    import signal
    import time

    from slotlake.sync import FAULT_ENV, InjectedFault

    from .test_sync_faults import start_cli, wait_gone

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    driver_rows = 0 if path == "spark" else -1
    if path == "spark":
        cfg.lake.driver_write_rows = 0
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake, driver_rows=driver_rows)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _add_to_a_running_lake(c, cfg, spark, slot, "b", 2000, "'old'", 0)

        snapshots = 0
        # Spark's hand-over at every step is test_quiet_table_added_to_publication's; here
        # it takes the re-base's fault, then the SIGKILLs (a JVM a run).
        steps = ("snapshot_copied", "snapshot_rebased", "before_commit")
        for r, step in enumerate(steps if path == "driver" else steps[1:2], 1):
            _writes(c, r)
            if r > 1:  # the first round's snapshot is the new table's
                assert cli_main(["resnapshot", "--config", str(config), "--table", "public.b"]) == 0
            monkeypatch.setenv(FAULT_ENV, step)
            with pytest.raises(InjectedFault, match=step):
                run_sync(cfg, spark=spark)
            monkeypatch.delenv(FAULT_ENV)
            _writes(c, r + 10)
            started = time.monotonic()
            assert run_sync(cfg, spark=spark).status == "committed"
            # A whole resumed run in this warm process: shorter than what a CLI run (its
            # own JVM) does after its copy started, so a kill within it lands in a run.
            span = time.monotonic() - started
            snapshots += 1
            assert len(markers(lake, "public.b")) == snapshots, step
            _check(c, lake, slot)

        # A real SIGKILL at a random instant after the copy of a run that takes a snapshot
        # (between the copy and the commit: the hand-over).
        rng = random.Random(f"snapshot-pg{pg_cluster.version}-{path}")
        log = tmp_path / "cli.log"
        progress_file = Path(lake) / "_snapshots" / "progress.json"
        killed = False
        for attempt in range(4):
            _writes(c, 30 + attempt)
            assert cli_main(["resnapshot", "--config", str(config), "--table", "public.b"]) == 0
            progress_file.unlink(missing_ok=True)
            proc = start_cli(config, log)
            deadline = time.monotonic() + 300
            # Watched closely: the driver's hand-over of a small table after its copy takes
            # ~0.1 s, and a coarser look missed all of it (every run done before its kill).
            while not progress_file.exists() and proc.poll() is None:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.005)
            delay = rng.uniform(0.0, span)
            time.sleep(delay)
            killed = proc.poll() is None
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
            wait_gone(proc, c)
            print(f"SIGKILL {delay:.1f}s after the copy: killed={killed}")
            if killed:
                break
            assert proc.returncode == 0, log.read_text()[-3000:]
            snapshots += 1
        assert killed, "every run finished before its kill instant"
        _writes(c, 40)
        run_sync(cfg, spark=spark)
        # The request is honoured once: by the killed run if it committed, else by the rerun.
        assert len(markers(lake, "public.b")) == snapshots + 1
        # The slot of a killed run's snapshot goes with its connection.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (n,) = c.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
            ).fetchone()  # type: ignore[misc]
            if n == 1:
                break
            time.sleep(0.2)
        _check(c, lake, slot)


def _partitioned_through_its_root(c: psycopg.Connection[Any], slot: str) -> None:
    """``p`` (partitions ``p1``, ``p2``) published through its root, the slot, 12 rows."""
    c.execute("CREATE TABLE p (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)")
    c.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)")
    c.execute("CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (10) TO (20)")
    c.execute("CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root = true)")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    c.execute("INSERT INTO p SELECT g, g % 20, 'v' FROM generate_series(1, 12) g")


def test_partitions_leaving_a_root_published_as_itself_are_copied_again(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """A partitioned table published as itself (``publish_via_partition_root``): rows leave
    it without a change in the stream when a partition is detached, dropped or truncated
    alone (pgoutput sends no TRUNCATE of such a partition). The commit records each root's
    leaf partitions; one gone is copied again by the run that reads the leaves without it
    (before its target), one with another relfilenode by one more batch of the run that
    finds it (``lake.copy_wanted_in_same_run``). A partition
    created since starts empty and costs no copy, nor does a TRUNCATE of the root in the
    stream, unless a leaf was truncated alone after it."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)

    def copied() -> list[str]:
        last = Lake(lake).last_commit()
        assert last is not None
        return sorted(last.snapshot.get("tables", {}))

    steps = [
        # (statements, the tables the sync after them copies)
        (["CREATE TABLE p3 PARTITION OF p FOR VALUES FROM (20) TO (30)"], []),
        (
            ["INSERT INTO p VALUES (21, 21, 'new')", "ALTER TABLE p DETACH PARTITION p1"],
            ["public.p"],
        ),
        ([], []),
        (["DROP TABLE p3"], ["public.p"]),
        # A leaf truncated alone: the batch names the root, one more batch copies it.
        (["TRUNCATE p2"], ["public.p"]),
        # The root truncated in the stream rewrote every leaf, and said so: no copy.
        (["TRUNCATE p"], []),
        ([], []),
        # ... unless a leaf was truncated alone after it (its pg_class row is another
        # transaction's than that TRUNCATE): the row between the two is gone unseen.
        (["TRUNCATE p", "INSERT INTO p VALUES (12, 12, 'between')", "TRUNCATE p2"], ["public.p"]),
        # A partition created since, rows routed into it and it truncated alone: it no
        # longer has its oid for relfilenode, which a table starts with.
        (
            [
                "CREATE TABLE p4 PARTITION OF p FOR VALUES FROM (40) TO (50)",
                "INSERT INTO p VALUES (41, 41, 'routed')",
                "TRUNCATE p4",
            ],
            ["public.p"],
        ),
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _partitioned_through_its_root(c, slot)
        run_sync(cfg)
        for i, (statements, copies) in enumerate(steps):
            for statement in statements:
                c.execute(statement)
            c.execute("INSERT INTO p VALUES (%s, 15, 'tick')", (100 + i,))
            run_sync(cfg)
            assert copied() == copies, statements
        assert_mirror(c, lake, ["public.p"])


def test_a_partition_attached_with_rows_is_copied_by_the_same_run(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """``ATTACH PARTITION`` of a table that has rows brings them into a root published as
    itself without a change in the stream: the run that first sees the new leaf copies the
    root, also when the attaching transaction filled it (or created and filled it). A
    partition attached empty and filled through the root, or created below a partition
    the lake knew, costs nothing; a detached partition attached again is copied again,
    also when no run saw it detached."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)

    def copied() -> dict[str, str]:
        last = Lake(lake).last_commit()
        assert last is not None
        return {k: v["reason"] for k, v in last.snapshot.get("tables", {}).items()}

    attached = {"public.p": "partition public.{} attached with rows"}
    steps: list[tuple[list[str | tuple[str, ...]], dict[str, str], bool]] = [
        # (statements (a tuple: one transaction, rolled back when it starts so), the
        # tables the sync after them copies and why, mirror exact after it)
        (
            [
                "CREATE TABLE staged (id int, k int, v text, PRIMARY KEY (id, k))",
                "INSERT INTO staged SELECT g, 20 + g % 10, 'staged' FROM generate_series(1, 5) g",
                "ALTER TABLE p ATTACH PARTITION staged FOR VALUES FROM (20) TO (30)",
                "UPDATE p SET v = 'moved' WHERE id = 1 AND k = 21",
            ],
            {"public.p": attached["public.p"].format("staged")},
            True,
        ),
        (
            [
                "CREATE TABLE e (id int NOT NULL, k int NOT NULL, v text)",
                "ALTER TABLE p ATTACH PARTITION e FOR VALUES FROM (30) TO (40)",
                "INSERT INTO p VALUES (31, 31, 'through the root')",
            ],
            {},
            True,
        ),
        (
            [
                "CREATE TABLE q (id int, k int, v text, PRIMARY KEY (id, k)) "
                "PARTITION BY RANGE (id)",
                "CREATE TABLE q1 PARTITION OF q FOR VALUES FROM (0) TO (1000)",
                "INSERT INTO q VALUES (1, 45, 'a tree')",
                "ALTER TABLE p ATTACH PARTITION q FOR VALUES FROM (40) TO (50)",
            ],
            {"public.p": attached["public.p"].format("q1")},
            True,
        ),
        (
            [
                "CREATE TABLE q2 PARTITION OF q FOR VALUES FROM (1000) TO (2000)",
                "INSERT INTO p VALUES (1001, 46, 'below a known partition')",
            ],
            {},
            True,
        ),
        # Rows the attaching transaction wrote: before the ATTACH (filled, then attached,
        # also into a table created by that transaction), or through the root after it.
        (
            [
                (
                    "CREATE TABLE one_tx (id int, k int, v text, PRIMARY KEY (id, k))",
                    "INSERT INTO one_tx VALUES (1, 51, 'filled'), (2, 52, 'filled')",
                    "UPDATE one_tx SET v = 'filled again' WHERE id = 2",
                    "ALTER TABLE p ATTACH PARTITION one_tx FOR VALUES FROM (50) TO (60)",
                    "INSERT INTO p VALUES (3, 53, 'through the root')",
                )
            ],
            {"public.p": attached["public.p"].format("one_tx")},
            True,
        ),
        (
            [
                "CREATE TABLE later (id int, k int, v text, PRIMARY KEY (id, k))",
                (
                    "INSERT INTO later VALUES (1, 61, 'filled')",
                    "ALTER TABLE p ATTACH PARTITION later FOR VALUES FROM (60) TO (70)",
                ),
            ],
            {"public.p": attached["public.p"].format("later")},
            True,
        ),
        (
            [
                (
                    "CREATE TABLE p7 PARTITION OF p FOR VALUES FROM (70) TO (80)",
                    "INSERT INTO p VALUES (1, 71, 'through the root')",
                    "CREATE TABLE p8 (id int NOT NULL, k int NOT NULL, v text)",
                    "ALTER TABLE p ATTACH PARTITION p8 FOR VALUES FROM (80) TO (90)",
                    "INSERT INTO p VALUES (1, 81, 'through the root')",
                    "UPDATE p SET v = 'again' WHERE k IN (71, 81)",
                )
            ],
            {},
            True,
        ),
        # A DETACH rolled back since wrote its command number over the pg_inherits row's
        # cmin: any row of the attaching transaction counts then.
        (
            [
                (
                    "CREATE TABLE ab (id int, k int, v text, PRIMARY KEY (id, k))",
                    "INSERT INTO ab VALUES (1, 91, 'filled'), (2, 92, 'filled')",
                    "ALTER TABLE p ATTACH PARTITION ab FOR VALUES FROM (90) TO (100)",
                ),
                ("-- rolled back", "ALTER TABLE p DETACH PARTITION ab"),
            ],
            {"public.p": attached["public.p"].format("ab")},
            True,
        ),
        (
            ["ALTER TABLE p DETACH PARTITION p1"],
            {"public.p": "partitions detached or dropped"},
            True,
        ),
        (
            ["ALTER TABLE p ATTACH PARTITION p1 FOR VALUES FROM (0) TO (10)"],
            {"public.p": attached["public.p"].format("p1")},
            True,
        ),
        # Detached, written and attached again between two runs: a leaf the last commit
        # knew, but made a partition by another transaction (snapshot.partition_joins).
        (
            [
                "ALTER TABLE p DETACH PARTITION p2",
                "INSERT INTO p2 VALUES (50, 12, 'while detached')",
                "ALTER TABLE p ATTACH PARTITION p2 FOR VALUES FROM (10) TO (20)",
            ],
            {"public.p": attached["public.p"].format("p2")},
            True,
        ),
        # ... and every row it brought back changed through the root since: none is older
        # than the attach, but one it lost while detached is still in the mirror.
        (
            [
                "ALTER TABLE p DETACH PARTITION p2",
                "DELETE FROM p2 WHERE id = 50",
                "ALTER TABLE p ATTACH PARTITION p2 FOR VALUES FROM (10) TO (20)",
                "UPDATE p SET v = 'after' WHERE k >= 10 AND k < 20",
            ],
            {"public.p": "partitions detached and attached again"},
            True,
        ),
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _partitioned_through_its_root(c, slot)
        run_sync(cfg)
        for i, (statements, copies, exact) in enumerate(steps):
            for statement in statements:
                one_tx = (statement,) if isinstance(statement, str) else statement
                with c.transaction(force_rollback=one_tx[0] == "-- rolled back"):
                    for one in one_tx:
                        c.execute(one)
            c.execute("INSERT INTO p VALUES (%s, 15, 'tick')", (100 + i,))
            run_sync(cfg)
            got = copied()
            assert sorted(got) == sorted(copies), statements
            for name, reason in copies.items():
                assert got[name].startswith(reason), (statements, got[name])
            if exact:
                assert_mirror(c, lake, ["public.p"])


@pytest.mark.parametrize(
    ("begun_by", "path"),
    [
        ("bootstrap", "driver"),
        ("bootstrap", "rerun"),
        pytest.param("bootstrap", "spark", marks=pytest.mark.one_pg_version),
        pytest.param("bootstrap", "spark rerun", marks=pytest.mark.one_pg_version),
        ("sync", "driver"),
    ],
)
def test_rows_a_partition_brought_that_changed_through_the_root_since_are_copied(
    pg_dsn: str,
    slot: str,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    begun_by: str,
    path: str,
) -> None:
    """A partition attached with rows every one of which was changed through the root
    before the run read the leaves holds no row older than its attach: no check of the
    published set tells it from one filled through the root. The UPDATEs carry those rows,
    but not the out-of-line values they left unchanged, which the lake never had. In a
    lake begun by ``slotlake bootstrap`` (every row copied) such a value is a sign of rows
    that arrived unseen: the batch names the table, and one more batch of the run copies
    it (also when the batch is finished by a rerun, whose tables were written already, or
    written by Spark, or by Spark's rerun of a batch whose change log was written). A lake
    begun by a plain sync keeps what it had: the values stay
    listed in ``_missing_toast``. An UPDATE of a row the lake has fills them and costs
    nothing."""
    from slotlake.bootstrap import run_bootstrap
    from slotlake.lake import read_state
    from slotlake.sync import FAULT_ENV, InjectedFault

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    if path.startswith("spark"):
        cfg.lake.driver_write_rows = 0
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE p (id int, k int, v text, big text, PRIMARY KEY (id, k)) "
            "PARTITION BY RANGE (k)"
        )
        c.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)")
        c.execute("ALTER TABLE p1 ALTER COLUMN big SET STORAGE EXTERNAL")
        c.execute("CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root = true)")
        if begun_by == "bootstrap":
            c.execute("INSERT INTO p VALUES (1, 1, 'a', %s)", (big(1),))
            run_bootstrap(cfg, spark=spark)
        else:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            c.execute("INSERT INTO p VALUES (1, 1, 'a', %s)", (big(1),))
            run_sync(cfg, spark=spark)
        c.execute("UPDATE p SET v = 'known' WHERE id = 1")
        assert run_sync(cfg, spark=spark).followed is None
        last = Lake(lake).last_commit()
        assert last is not None
        assert last.snapshot["complete"] is (begun_by == "bootstrap")
        assert not last.snapshot["wanted"] and last.tables["public.p"].missing_toast == 0

        def attach_then_change(name: str, lower: int, ids: range) -> None:
            """A table with rows (``ids``, out-of-line values) attached as the partition
            from ``lower``, then every row of it changed through the root."""
            c.execute(f"CREATE TABLE {name} (id int, k int, v text, big text, PRIMARY KEY (id, k))")
            c.execute(f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL")
            for i in ids:
                c.execute(
                    f"INSERT INTO {name} VALUES (%s, %s, %s, %s)", (i, lower + i, name, big(i))
                )
            c.execute(
                f"ALTER TABLE p ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({lower + 10})"
            )
            c.execute("UPDATE p SET v = 'through the root' WHERE k >= %s", (lower,))

        attach_then_change("staged", 20, range(2, 6))
        c.execute("UPDATE p SET v = 'known again' WHERE id = 1")
        from slotlake import batch as batch_module

        # The writers count as they write; a rerun counts what an earlier attempt wrote.
        logged: list[int] = []
        count_logged = batch_module._missing_toast_logged

        def counting(*args: Any, **kwargs: Any) -> int:
            logged.append(count_logged(*args, **kwargs))
            return logged[-1]

        monkeypatch.setattr(batch_module, "_missing_toast_logged", counting)
        if path == "spark rerun":
            # The state's write fails once, after the change log took the batch: the
            # rerun's append is skipped (no job, no observed count).
            write_state = batch_module._write_state

            def failing(*args: Any, **kwargs: Any) -> Any:
                monkeypatch.setattr(batch_module, "_write_state", write_state)
                raise RuntimeError("the state's MERGE failed")

            monkeypatch.setattr(batch_module, "_write_state", failing)
            with pytest.raises(RuntimeError, match="MERGE failed"):
                run_sync(cfg, spark=spark)
        if path == "rerun":
            monkeypatch.setenv(FAULT_ENV, "before_commit")
            with pytest.raises(InjectedFault):
                run_sync(cfg, spark=spark)
            monkeypatch.delenv(FAULT_ENV)
        result = run_sync(cfg, spark=spark)
        assert logged[:1] == ([4] if "rerun" in path else []), logged
        assert result.status == "committed"
        # A rerun finishes the batch, then takes what arrived since: that batch copies.
        named = Lake(lake).read_commit(result.followed or result.resumed or result.batch or 0)
        assert named.tables["public.p"].missing_toast == 4
        changes = read_changes(lake, "public.p").to_pylist()
        assert sorted(r["id"] for r in changes if r["_missing_toast"]) == [2, 3, 4, 5]
        if begun_by == "sync":
            assert result.followed is None and not named.snapshot["wanted"]
            state = read_state(lake, "public.p").to_pylist()
            assert sorted((r["id"], r["big"], r["_missing_toast"]) for r in state) == [
                (1, big(1), []),
                *[(i, None, ["big"]) for i in range(2, 6)],
            ]
            # `slotlake status` tells them.
            config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake)
            capsys.readouterr()
            assert cli_main(["status", "--config", str(config), "--json"]) == 0
            status = json.loads(capsys.readouterr().out)
            assert status["tables"]["public.p"]["missing_toast_in_last_batch"] == 4
            assert cli_main(["status", "--config", str(config)]) == 0
            assert "without an unchanged TOAST value" in capsys.readouterr().out
            return
        reason = "unchanged TOAST values of rows the lake never had (4 changes)"
        assert named.snapshot["wanted"] == {"public.p": reason}
        assert result.followed == (None if "rerun" in path else named.batch)
        copied = Lake(lake).last_commit()
        assert copied is not None and copied.batch == named.batch + 1
        assert copied.snapshot["tables"]["public.p"]["reason"] == reason
        assert_mirror(c, lake, ["public.p"])
        assert not any(read_state(lake, "public.p").column("_missing_toast").to_pylist())
        assert not copied.snapshot["wanted"] and copied.tables["public.p"].missing_toast == 0
        c.execute("UPDATE p SET v = 'after the copy' WHERE k >= 20")
        assert run_sync(cfg, spark=spark).followed is None
        assert_mirror(c, lake, ["public.p"])
        last = Lake(lake).last_commit()
        assert last is not None and not last.snapshot["wanted"]

        # Left to the next run: its batch's UPDATEs of those rows from before its copy
        # miss their values too, and name nothing (the copy's rows from its CP on count).
        cfg.lake.copy_wanted_in_same_run = False
        attach_then_change("later", 30, range(6, 7))
        assert run_sync(cfg, spark=spark).followed is None
        c.execute("UPDATE p SET v = 'before the copy' WHERE k >= 30")
        assert run_sync(cfg, spark=spark).followed is None
        last = Lake(lake).last_commit()
        assert last is not None and last.snapshot["tables"]["public.p"]["reason"] == (
            "unchanged TOAST values of rows the lake never had (1 changes)"
        )
        assert not last.snapshot["wanted"] and last.tables["public.p"].missing_toast == 0
        changes = read_changes(lake, "public.p").to_pylist()
        assert [(r["v"], r["_missing_toast"]) for r in changes if r["id"] == 6] == [
            ("through the root", ["big"]),
            ("before the copy", ["big"]),
        ]
        assert_mirror(c, lake, ["public.p"])


def test_partitions_created_and_removed_between_two_runs_are_seen_by_the_ddl_trigger(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """The DDL capture trigger's messages list the leaves of the partition trees a command
    touched. A partition created (or attached) and then detached or dropped between two
    runs, which no run read, is among the leaves the batch's record keeps
    (``leaves_seen``): the run's read of its published set after that batch committed
    finds it gone and copies the root in one more batch, as the rows routed into it left
    the root unseen (before 2026-12-03, the next run did). A root whose partitions are all
    gone is copied too, by the batch whose read finds them gone."""
    from slotlake import ddl

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)

    def copied() -> dict[str, str]:
        last = Lake(lake).last_commit()
        assert last is not None
        return {k: v["reason"] for k, v in last.snapshot.get("tables", {}).items()}

    gone = {"public.p": "partitions detached or dropped"}
    steps: list[tuple[list[str], bool]] = [
        # (statements, whether one more batch of the run copies the root)
        (
            [
                "CREATE TABLE p3 PARTITION OF p FOR VALUES FROM (20) TO (30)",
                "INSERT INTO p VALUES (21, 21, 'routed')",
                "ALTER TABLE p DETACH PARTITION p3",
            ],
            True,
        ),
        (
            [
                "CREATE TABLE p4 PARTITION OF p FOR VALUES FROM (40) TO (50)",
                "INSERT INTO p VALUES (41, 41, 'routed')",
                "DROP TABLE p4",
            ],
            True,
        ),
        (
            [
                "CREATE TABLE p5 (id int NOT NULL, k int NOT NULL, v text)",
                "ALTER TABLE p ATTACH PARTITION p5 FOR VALUES FROM (50) TO (60)",
                "INSERT INTO p VALUES (51, 51, 'routed')",
                "ALTER TABLE p DETACH PARTITION p5",
            ],
            True,
        ),
        (["ALTER TABLE p DETACH PARTITION p1", "ALTER TABLE p DETACH PARTITION p2"], False),
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        _partitioned_through_its_root(c, slot)
        ddl.install(c)
        run_sync(cfg)
        for i, (statements, followed) in enumerate(steps):
            c.execute("INSERT INTO p VALUES (%s, 15, 'tick')", (100 + i,))
            for statement in statements:
                c.execute(statement)
            result = run_sync(cfg)
            assert (result.followed is not None) == followed, (statements, result)
            got = copied()
            assert sorted(got) == sorted(gone), statements
            assert got["public.p"].startswith(gone["public.p"]), (statements, got)
            assert_mirror(c, lake, ["public.p"])
        # The leaves the last batch's DDL messages showed went before its copy: the next
        # run has nothing to copy (before 2026-12-03 it copied the root again).
        before = Lake(lake).commit_batches()[-1]
        run_sync(cfg)
        for b in Lake(lake).commit_batches():
            assert b <= before or not Lake(lake).read_commit(b).snapshot.get("tables"), b


def test_a_leaf_published_as_itself_detached_and_attached_again_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """Published as its leaves (no ``publish_via_partition_root``), a partition detached
    leaves the publication: rows written into it meanwhile are in no change stream. One
    attached again before the next run is no newer in the published set than before, but
    its ``pg_inherits`` row (or one above it) is another: that run copies it."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        published_as_leaves(c, slot)
        run_sync(cfg)
        steps = [
            ("l1", "l1", "FROM (0) TO (10)", "INSERT INTO l1 VALUES (50, 5, 'while detached')"),
            # A sub-partitioned partition: its leaf's own pg_inherits row stays.
            ("l2", "l2a", "FROM (10) TO (20)", "DELETE FROM l2a WHERE id = 11"),
        ]
        for i, (partition, leaf, bounds, write) in enumerate(steps):
            c.execute(f"ALTER TABLE l DETACH PARTITION {partition}")
            c.execute(write)
            c.execute(f"ALTER TABLE l ATTACH PARTITION {partition} FOR VALUES {bounds}")
            c.execute("INSERT INTO l VALUES (%s, 3, 'tick')", (100 + i,))
            run_sync(cfg)
            last = Lake(lake).last_commit()
            assert last is not None
            copied = {k: v["reason"] for k, v in last.snapshot.get("tables", {}).items()}
            assert copied == {f"public.{leaf}": "detached and attached again"}, write
            assert_mirror(c, lake, ["public.l1", "public.l2a"])


@pytest.mark.parametrize("after", ["attached and re-created", "detached and rewritten"])
def test_the_first_sync_after_a_bootstrap_sees_what_changed_since(
    pg_dsn: str, slot: str, tmp_path: Path, after: str
) -> None:
    """A bootstrap records what the first sync's checks compare with: the copied tables'
    oids, the relfilenodes and the partitioned tables' leaves. Between it and the first
    sync: a partition attached with rows and a table dropped and created again, or a
    partition detached (copied by that sync), or a table rewritten (copied by one more
    batch of that run).
    Before, the first sync had nothing to compare with: the mirror kept the dropped
    table's rows and the detached partition's, and lacked the attached one's, for good."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE p (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)"
        )
        c.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10)")
        c.execute("CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (10) TO (20)")
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
        c.execute(
            "CREATE PUBLICATION pub FOR TABLE p, t, u WITH (publish_via_partition_root = true)"
        )
        c.execute("INSERT INTO p SELECT g, g % 20, 'v' FROM generate_series(1, 12) g")
        c.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 5) g")
        c.execute("INSERT INTO u SELECT g, 'old' FROM generate_series(1, 5) g")
        run_bootstrap(cfg)
        if after == "attached and re-created":
            c.execute("CREATE TABLE staged (id int NOT NULL, k int NOT NULL, v text)")
            c.execute("INSERT INTO staged VALUES (1, 25, 'staged'), (2, 26, 'staged')")
            c.execute("ALTER TABLE p ATTACH PARTITION staged FOR VALUES FROM (20) TO (30)")
            c.execute("DROP TABLE u")
            c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
            c.execute("ALTER PUBLICATION pub ADD TABLE u")
            # Per run, the tables each of its batches copies.
            copies = [[["public.p", "public.u"]], [[]]]
        else:
            c.execute("ALTER TABLE p DETACH PARTITION p1")
            # A rewrite that changes values unseen: the DDL capture's rewrite trigger off
            # for it (a VACUUM FULL under the capture needs no copy: the test below).
            c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite DISABLE")
            c.execute("ALTER TABLE t ALTER COLUMN v TYPE text USING v || '!'")
            c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite ENABLE ALWAYS")
            # The rewrite is found by the batch (relfilenode): one more batch copies it.
            copies = [[["public.p"], ["public.t"]], [[]]]
        for i, want in enumerate(copies):
            c.execute("INSERT INTO p VALUES (100 + %s, 15, 'tick')", (i,))
            result = run_sync(cfg)
            assert result.batch is not None
            batches = range(result.followed or result.batch, result.batch + 1)
            got = [sorted(Lake(lake).read_commit(b).snapshot.get("tables", {})) for b in batches]
            assert got == want, after
        assert_mirror(c, lake, ["public.p", "public.t", "public.u"])


def _run_copying(
    c: psycopg.Connection[Any], cfg: Any, tables: list[str], want: tuple[str, ...]
) -> dict[str, Any]:
    """A committed run whose batches copy exactly ``want`` and leave ``tables`` equal to
    the source; the ``snapshot`` record of its first batch."""
    lake = cfg.lake.path
    result = run_sync(cfg)
    assert result.status == "committed" and result.batch is not None
    batches = range(result.followed or result.batch, result.batch + 1)
    records = [Lake(lake).read_commit(b) for b in batches]
    copied = sorted(n for r in records for n in r.snapshot.get("tables", {}))
    assert copied == sorted(want)
    assert_mirror(c, lake, tables)
    return records[0].snapshot


def test_a_rewrite_that_keeps_values_needs_no_copy_while_the_ddl_capture_is_in_place(
    pg_dsn: str, slot: str, tmp_path: Path, caplog: Any
) -> None:
    """With the DDL capture's triggers in place since the previous commit (the same
    triggers, function and publications: their catalog rows' xmins), a rewrite that
    changes values sends its message, so a new relfilenode that no message and no
    TRUNCATE explains kept the values: VACUUM FULL and CLUSTER cost no copy (before
    2026-12-06, each copied the table). The trigger disabled for a while, or a
    publication that stopped publishing TRUNCATE for a while, and the relfilenode rule
    copies the table again."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    tables = ["public.t", "public.m"]

    def sync(*want: str) -> dict[str, Any]:
        c.execute("UPDATE t SET v = v || '.' WHERE id = 1")
        return _run_copying(c, cfg, tables, want)

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
        c.execute("CREATE TABLE m (x int, y text)")
        c.execute("ALTER TABLE m REPLICA IDENTITY FULL")
        c.execute("INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 50) g")
        c.execute("INSERT INTO m SELECT g % 5, 'y' FROM generate_series(1, 20) g")
        c.execute("CREATE PUBLICATION pub FOR TABLE t, m")
        run_bootstrap(cfg)
        assert sync()["ddl_capture"] is not None

        def relfilenode(table: str) -> int:
            row = c.execute("SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", (table,))
            return int(row.fetchone()[0])  # type: ignore[index]

        nodes = {n: relfilenode(n) for n in ("t", "m")}
        c.execute("DELETE FROM t WHERE id > 40")
        c.execute("VACUUM FULL t")
        c.execute("CLUSTER t USING t_pkey")
        c.execute("VACUUM FULL m")
        assert all(relfilenode(n) != node for n, node in nodes.items())
        with caplog.at_level(logging.INFO, logger="slotlake.snapshot"):
            snapshot = sync()
        assert not snapshot.get("wanted")
        assert "its values were kept (VACUUM FULL" in caplog.text

        # A rewrite that changes values sends its message: copied by one more batch.
        c.execute("ALTER TABLE t ALTER COLUMN n TYPE bigint USING n * 10")
        sync("public.t")

        # The rewrite trigger off for a while: nothing is relied on, the rule copies.
        c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite DISABLE")
        c.execute("ALTER TABLE t ALTER COLUMN n TYPE bigint USING n + 1")
        c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite ENABLE ALWAYS")
        assert "relfilenode" in sync("public.t")["wanted"]["public.t"]

        # A TRUNCATE its publication did not publish for a while: copied as well.
        c.execute("ALTER PUBLICATION pub SET (publish = 'insert, update, delete')")
        c.execute("TRUNCATE m")
        c.execute("ALTER PUBLICATION pub SET (publish = 'insert, update, delete, truncate')")
        sync("public.m")
        assert c.execute("SELECT count(*) FROM m").fetchone() == (0,)

        # In place again since the previous commit: a VACUUM FULL needs no copy.
        c.execute("VACUUM FULL t")
        assert not sync().get("wanted")


def test_a_partition_rewritten_with_its_values_kept_needs_no_copy_while_the_ddl_capture_is_in_place(
    pg_dsn: str, slot: str, tmp_path: Path, caplog: Any
) -> None:
    """A partitioned table published through its root: a leaf's new relfilenode could be
    a TRUNCATE of that leaf alone, which leaves no trace in the stream, so it was copied
    whatever made it. VACUUM FULL and CLUSTER keep each row's xmin: a leaf that still holds
    a row from before the previous run's reading was not truncated since, and with the DDL
    capture in place throughout it needs no copy (before 2026-12-06, the root was copied
    whole). A leaf truncated alone, refilled through the root and then vacuumed holds no
    such row: copied, and the mirror loses the truncated rows."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)

    def sync(*want: str) -> dict[str, Any]:
        c.execute("UPDATE r SET v = v || '.' WHERE id = 120")
        return _run_copying(c, cfg, ["public.r"], want)

    def oid(table: str) -> int:
        return int(c.execute("SELECT %s::regclass::oid", (table,)).fetchone()[0])  # type: ignore[index]

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE r (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE r0 PARTITION OF r FOR VALUES FROM (0) TO (100)")
        c.execute("CREATE TABLE r1 PARTITION OF r FOR VALUES FROM (100) TO (1000)")
        c.execute("CREATE PUBLICATION pub FOR TABLE r WITH (publish_via_partition_root)")
        c.execute("INSERT INTO r SELECT g, 'v' || g FROM generate_series(1, 300) g")
        run_bootstrap(cfg)
        assert sync()["xid_horizon"] is not None

        c.execute("DELETE FROM r WHERE id > 250")
        c.execute("VACUUM FULL r0")
        c.execute("CLUSTER r1 USING r1_pkey")
        with caplog.at_level(logging.INFO, logger="slotlake.snapshot"):
            snapshot = sync()
        assert not snapshot.get("wanted")
        assert sorted(snapshot["leaves_with_old_rows"]) == sorted([oid("r0"), oid("r1")])
        assert "their values were kept (VACUUM FULL, CLUSTER)" in caplog.text

        # Truncated alone (no trace in the stream), refilled through the root, vacuumed:
        # none of its rows is from before the last run.
        c.execute("TRUNCATE r0")
        c.execute("INSERT INTO r SELECT g, 'n' || g FROM generate_series(1, 10) g")
        c.execute("VACUUM FULL r0")
        c.execute("VACUUM FULL r1")
        snapshot = sync("public.r")
        assert snapshot["leaves_with_old_rows"] == [oid("r1")]
        assert snapshot["wanted"]["public.r"] == f"partitions detached or rewritten ({oid('r0')})"
        assert c.execute("SELECT count(*) FROM r").fetchone() == (161,)

        # Truncated alone and left empty: copied as well.
        c.execute("TRUNCATE r0")
        assert "rewritten" in sync("public.r")["wanted"]["public.r"]

        # Truncated, refilled and clustered by one transaction: its rows are that one's.
        with c.transaction():
            c.execute("TRUNCATE r1")
            c.execute("INSERT INTO r SELECT g, 'c' || g FROM generate_series(100, 120) g")
            c.execute("CLUSTER r1 USING r1_pkey")
        assert sync("public.r")["leaves_with_old_rows"] == []
        assert c.execute("SELECT count(*) FROM r").fetchone() == (21,)

        # The capture off for a while: nothing is relied on, a vacuumed leaf is copied.
        c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite DISABLE")
        c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite ENABLE ALWAYS")
        c.execute("VACUUM FULL r1")
        snapshot = sync("public.r")
        assert snapshot["leaves_with_old_rows"] == []
        assert "rewritten" in snapshot["wanted"]["public.r"]


def test_publish_via_partition_root_switched_and_back_between_two_runs_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """``publish_via_partition_root`` switched off, rows written, switched on again, all
    between two runs: both runs read the root published through itself, but pgoutput
    published the rows in between as its partitions' changes, under their names, and the
    root's mirror lacked them (found by the publications' random workload, seed 6704).
    The batch names the root and the same run copies it. The other way round (partitions
    published as themselves at both readings, the root's changes in between) copies each
    partition."""
    from slotlake.bootstrap import run_bootstrap
    from slotlake.snapshot import request

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)

    def run(*meanwhile: Callable[[], None]) -> dict[str, Any]:
        """The run's first batch's ``snapshot`` record (``meanwhile``: during the run)."""
        with before_the_target(list(meanwhile)):
            result = run_sync(cfg)
        assert result.status == "committed" and result.batch is not None
        return Lake(lake).read_commit(result.followed or result.batch).snapshot

    def sync() -> dict[str, str]:
        return run().get("wanted", {})

    def via_root(on: bool) -> None:
        c.execute(f"ALTER PUBLICATION pub SET (publish_via_partition_root = {str(on).lower()})")

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE p (id int PRIMARY KEY, x int) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
        c.execute("CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (1000)")
        c.execute("INSERT INTO p SELECT g, g FROM generate_series(1, 150) g")
        c.execute("CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root)")
        run_bootstrap(cfg)

        via_root(False)
        c.execute("INSERT INTO p SELECT g, g FROM generate_series(151, 155) g")
        c.execute("DELETE FROM p WHERE id = 3")
        c.execute("UPDATE p SET x = -1 WHERE id = 120")
        via_root(True)
        wanted = sync()
        assert wanted == {
            "public.p": "changes published under its partition public.p1's name "
            "(publish_via_partition_root switched meanwhile)"
        }
        assert_mirror(c, lake, ["public.p"])
        # pgoutput describes a partition beside the root it publishes the partition's
        # changes under: the Relation messages name it, the changes the root alone.
        c.execute("UPDATE p SET x = x + 1 WHERE id = 130")
        assert sync() == {}
        assert_mirror(c, lake, ["public.p"])

        via_root(False)
        c.execute("UPDATE p SET x = x + 1 WHERE id = 130")
        assert sync() == {}  # the partitions new in the publication: copied before it
        assert_mirror(c, lake, ["public.p1", "public.p2"])
        via_root(True)
        c.execute("INSERT INTO p VALUES (160, 160)")
        c.execute("DELETE FROM p WHERE id = 4")
        via_root(False)
        wanted = sync()
        assert sorted(wanted) == ["public.p1", "public.p2"]
        assert wanted["public.p1"].startswith(
            "changes published under its partitioned table public.p's"
        )
        assert_mirror(c, lake, ["public.p1", "public.p2"])

        # A TRUNCATE of the root in between (its message names the root alone): the
        # partitions' new relfilenodes have them copied, the switch having changed the
        # publication's row, so the DDL capture is not relied on.
        via_root(True)
        c.execute("TRUNCATE p")
        c.execute("INSERT INTO p VALUES (7, 7)")
        via_root(False)
        assert sorted(sync()) == ["public.p1", "public.p2"]
        assert_mirror(c, lake, ["public.p1", "public.p2"])

        # Switched on for good, rows written through the partitions before: the root's
        # copy (new in the publication) has them, and no second copy follows.
        c.execute("INSERT INTO p VALUES (8, 8)")
        via_root(True)
        first = run()
        assert sorted(first["tables"]) == ["public.p"] and not first.get("wanted"), first
        assert_mirror(c, lake, ["public.p"])

        # Switched off and on by a transaction that commits after the root's copy (asked
        # for by hand) and before the target: its changes are not in the copy.
        def off_and_on() -> None:
            with c.transaction():
                via_root(False)
                c.execute("INSERT INTO p VALUES (9, 9)")
                via_root(True)

        request(Lake(lake), "public.p")
        first = run(off_and_on)
        assert sorted(first["tables"]) == ["public.p"]
        assert first["wanted"]["public.p"].startswith("changes published under its partition")
        assert_mirror(c, lake, ["public.p"])


def test_a_rewrite_whose_capture_fails_still_sends_its_rewrite_message(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """The capture function's failure path (its main part raising, the DDL going on with a
    WARNING) still sends a ``table_rewrite`` message with the table's name and oid: the
    sync copies the table for that message, not only for its relfilenode."""
    from slotlake import ddl
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
        c.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 20) g")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        run_bootstrap(cfg)
        # Every event's main part made to fail first thing: the failure path alone speaks.
        main = "  BEGIN\n    IF TG_EVENT = 'table_rewrite' THEN\n"
        assert ddl.FUNCTION_SQL.count(main) == 1
        c.execute(ddl.FUNCTION_SQL.replace(main, main.replace("BEGIN", "BEGIN PERFORM 1 / 0;")))
        c.execute("ALTER TABLE t ALTER COLUMN n TYPE bigint USING n * 10")
        result = run_sync(cfg)
        assert result.status == "committed" and result.batch is not None
        named = Lake(lake).read_commit(result.followed or result.batch).snapshot
        assert named["ddl_capture"] is None  # another function body: not relied on
        assert named["wanted"]["public.t"].startswith("rewritten (DDL message")
        assert_mirror(c, lake, ["public.t"])


@pytest.mark.parametrize("table", ["t", "r"], ids=["table", "root"])
def test_a_rewrite_after_a_truncate_is_copied_by_the_same_run(
    pg_dsn: str, slot: str, tmp_path: Path, table: str
) -> None:
    """Without the DDL capture trigger, a new relfilenode that a TRUNCATE in the stream
    set needs no copy: the stream has everything after it. A rewrite after the TRUNCATE
    (``ALTER COLUMN … TYPE … USING``, which changes values and sends no change) sets
    another: the table's ``pg_class`` row is then another transaction's than the
    TRUNCATE, or, in the TRUNCATE's own transaction, newer than rows that transaction
    wrote into the table: the batch names it and the run copies it in one more batch.
    Before, any TRUNCATE in the window explained it, and the mirror kept the values from
    before the rewrite; until 2026-12-03, evening, one in the same transaction did
    (found by the partitioned tables' random workload, seed 518). ``root``: a
    partitioned table published through its root, whose leaves the TRUNCATE and the
    rewrite reach; a transaction that truncates it and writes through it is copied too:
    a leaf it truncates alone after the writes (truncated in place, its relfilenode new
    in that transaction already) leaves no trace but the missing rows (before, the mirror
    kept them; found by the random workload, seed 5508)."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    name = f"public.{table}"

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        if table == "r":
            c.execute("CREATE TABLE r (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
            c.execute("CREATE TABLE r0 PARTITION OF r FOR VALUES FROM (0) TO (50)")
            c.execute("CREATE TABLE r1 PARTITION OF r FOR VALUES FROM (50) TO (1000)")
            c.execute("CREATE PUBLICATION pub FOR TABLE r WITH (publish_via_partition_root)")
        else:
            c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute(f"INSERT INTO {table} SELECT g, 'v' FROM generate_series(1, 5) g")
        run_sync(cfg)
        # A batch of a TRUNCATE and nothing else: no copy, no row to read.
        c.execute(f"TRUNCATE {table}")
        result = run_sync(cfg)
        assert result.status == "committed" and result.followed is None, result
        assert_mirror(c, lake, [name])
        c.execute(f"INSERT INTO {table} SELECT g, 'v' FROM generate_series(1, 5) g")
        run_sync(cfg)
        rewrite = f"ALTER TABLE {table} ALTER COLUMN v TYPE text USING v || 'x'"
        refill = table == "r"  # a root truncated and written by one transaction: copied
        steps = [
            # (statements, in one transaction, a rewrite the run copies in one more batch)
            ([f"TRUNCATE {table}", f"INSERT INTO {table} VALUES (1, 'a')"], False, False),
            ([f"TRUNCATE {table}", f"INSERT INTO {table} VALUES (3, 'c')"], True, refill),
            ([rewrite, f"TRUNCATE {table}"], False, False),
            ([rewrite, f"TRUNCATE {table}", f"INSERT INTO {table} VALUES (4, 'd')"], True, refill),
            ([f"TRUNCATE {table}", f"INSERT INTO {table} VALUES (2, 'b')", rewrite], False, True),
            ([f"TRUNCATE {table}", f"INSERT INTO {table} VALUES (5, 'e')", rewrite], True, True),
        ]
        if table == "r":  # the leaf truncated alone, in place, after the row went into it
            steps.append(
                (["TRUNCATE r", "INSERT INTO r VALUES (7, 'g')", "TRUNCATE r0"], True, True)
            )
        for statements, together, rewritten in steps:
            with c.transaction() if together else contextlib.nullcontext():
                for statement in statements:
                    c.execute(statement)
            c.execute(
                f"INSERT INTO {table} VALUES (100, 'tick') ON CONFLICT (id) DO UPDATE SET v = 'tock'"
            )
            result = run_sync(cfg)
            assert result.batch is not None
            named = Lake(lake).read_commit(result.followed or result.batch).snapshot
            assert (name in named.get("wanted", {})) == rewritten, statements
            assert (result.followed is not None) == rewritten, statements
            if rewritten:
                last = Lake(lake).read_commit(result.batch)
                assert list(last.snapshot.get("tables", {})) == [name]
            assert_mirror(c, lake, [name])


@pytest.mark.parametrize("rewrite", [False, True], ids=["truncated and filled", "rewritten"])
def test_rows_written_before_a_new_relfilenode_are_found_in_its_first_blocks(
    pg_dsn: str, rewrite: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction that truncates a table and fills it with rows leaves a relfilenode
    its TRUNCATE explains; one that rewrites the table after those rows does not. Told
    apart from the first blocks alone, whatever the table weighs (100k rows here), and
    whatever other transactions did to those rows since."""
    from slotlake.snapshot import REWRITE_BLOCKS, _written_before_its_node

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
        with c.transaction():
            c.execute("TRUNCATE t")
            c.execute("INSERT INTO t SELECT g, 'w' FROM generate_series(1, 100000) g")
            if rewrite:
                c.execute("ALTER TABLE t ALTER COLUMN v TYPE text USING v || 'x'")
        oid, xmin, blocks = c.execute(
            "SELECT oid::int, xmin::text, pg_relation_size(oid) / 8192 FROM pg_class "
            "WHERE relname = 't'"
        ).fetchone()
        assert blocks > REWRITE_BLOCKS
        assert _written_before_its_node(c, oid, xmin) == rewrite
        # Rows changed or locked since by others (their cid is then another command's)
        # tell nothing: a refilled table updated by its writers costs no copy.
        c.execute("UPDATE t SET v = v || '' WHERE id <= 100")
        with c.transaction():
            c.execute("SELECT * FROM t WHERE id > 100 AND id <= 200 FOR KEY SHARE")
        assert _written_before_its_node(c, oid, xmin) == rewrite
        # A table it cannot read: counted, and said.
        role = psycopg.sql.Identifier(f"r_{c.info.dbname}")  # roles are the cluster's
        c.execute(psycopg.sql.SQL("CREATE ROLE {}").format(role))
        c.execute(psycopg.sql.SQL("SET ROLE {}").format(role))
        with caplog.at_level(logging.WARNING, logger="slotlake.snapshot"):
            assert _written_before_its_node(c, oid, xmin)
        assert "cannot read table public.t" in caplog.text
        c.execute("RESET ROLE")
        c.execute(psycopg.sql.SQL("DROP ROLE {}").format(role))
        # Another transaction's pg_class row by now: counted.
        c.execute("ALTER TABLE t ADD COLUMN w int")
        assert _written_before_its_node(c, oid, xmin)
        plan = "\n".join(
            r[0] for r in c.execute("EXPLAIN SELECT 1 FROM ONLY t WHERE ctid < '(32,0)'::tid")
        )
        assert "Tid Range Scan" in plan, plan


@pytest.mark.one_pg_version  # the lake's readers are under test, not the source
def test_the_raw_rows_read_with_and_without_spark_are_the_same(
    pg_dsn: str, slot: str, tmp_path: Path, spark: Any
) -> None:
    """The raw rows the snapshot checks read (TRUNCATE and message rows, a root's DML
    rows) are the same whether pyarrow reads a local lake or Spark a lake off the local
    disk, in peek order; a batch without such rows gives none either way."""
    from slotlake.snapshot import _raw_rows

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE u (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t, u")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        with c.transaction():
            c.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 30) g")
            c.execute("TRUNCATE t")
            c.execute("INSERT INTO t VALUES (1, 'a')")
            c.execute("INSERT INTO u VALUES (1)")
        c.execute("SELECT pg_logical_emit_message(true, 'x', 'y')")
        result = run_sync(cfg)
        (t_oid,) = c.execute("SELECT 't'::regclass::oid::int").fetchone() or (0,)
    raw = Lake(root).read_commit(result.batch or 0).raw

    class Off:  # the same files, read as a lake off the local disk is
        on_local_disk = False

        def path(self, rel: str) -> str:
            return Lake(root).path(rel)

    reads = [
        (("T", "M"), ["msg_type", "xid", "seq"], None),
        (("I", "U", "D"), ["rel_oid", "xid", "seq", "commit_lsn"], [t_oid]),
        (("I", "U", "D"), ["seq"], None),
        (("R",), ["rel_oid", "seq"], [-1]),
    ]
    for types, columns, oids in reads:
        local = _raw_rows(None, Lake(root), raw, types, columns, oids)
        assert local == _raw_rows(spark, Off(), raw, types, columns, oids), types  # type: ignore[arg-type]
        assert [r["seq"] for r in local] == sorted(r["seq"] for r in local)
    counts = [len(_raw_rows(None, Lake(root), raw, *read)) for read in reads]
    assert counts == [2, 31, 32, 0], counts


def mirrored_columns(lake: str, table: str) -> list[str]:
    """The state's columns without slotlake's own."""
    return [n for n in read_state(lake, table).column_names if n not in RESERVED]


def test_a_publications_row_filter_or_column_list_changed_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ALTER PUBLICATION … SET TABLE`` with another row filter, or a column list that
    publishes a column it left out, changes what the lake must hold without a change in
    the stream: rows that now pass the filter, or values of the column, the lake never
    had (rows that no longer pass it, it must lose). The run that sees it copies the
    table; a column added to a table without a list needs no copy. Before, the mirror
    lacked them for good."""
    from slotlake.bootstrap import run_bootstrap

    from .sync_helpers import before_the_target

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake)
    # What each table's publication publishes now: columns (None: all), row filter.
    scope: dict[str, tuple[list[str] | None, str]] = {
        "public.t": (["id", "x"], "id > 10"),
        "public.m": (None, "id % 2 = 0"),
    }

    def publish(t: tuple[list[str] | None, str], m: tuple[list[str] | None, str]) -> None:
        scope.update({"public.t": t, "public.m": m})
        parts = [
            f"{name.split('.')[1]}{'' if cols is None else ' (' + ', '.join(cols) + ')'}"
            f" WHERE ({where})"
            for name, (cols, where) in scope.items()
        ]
        c.execute(f"ALTER PUBLICATION pub SET TABLE {', '.join(parts)}")

    ticks: list[int] = []

    def sync_copies(*want: list[str]) -> None:
        """A sync after a change (the batch has one); the tables each of its batches
        copied."""
        ticks.append(len(ticks))
        c.execute("INSERT INTO t VALUES (%s, 0, 'tick', 'tick')", (100 + len(ticks),))
        result = run_sync(cfg)
        assert result.status == "committed" and result.batch is not None
        batches = range(result.followed or result.batch, result.batch + 1)
        got = [sorted(Lake(lake).read_commit(b).snapshot.get("tables", {})) for b in batches]
        assert got == list(want)
        for name, (cols, where) in scope.items():
            cmp = compare_table(c, lake, name, cols, where)
            assert cmp.equal, cmp.describe()

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, x int, b text, d text)")
        # Only inserted into: its filter may name a column outside its key.
        c.execute("CREATE TABLE m (k serial PRIMARY KEY, id int, v text)")
        c.execute(
            "INSERT INTO t SELECT g, g * 10, 'b' || g, 'd' || g FROM generate_series(1, 20) g"
        )
        c.execute("INSERT INTO m (id, v) SELECT g % 12, 'v' FROM generate_series(1, 30) g")
        c.execute(
            "CREATE PUBLICATION pub FOR TABLE t (id, x) WHERE (id > 10), m WHERE (id % 2 = 0)"
        )
        run_bootstrap(cfg)
        sync_copies([])

        # A wider filter lets rows 6-10 in; status says so before the run.
        publish((["id", "x"], "id > 5"), scope["public.m"])
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config), "--json"]) == 0
        waiting = json.loads(capsys.readouterr().out)["snapshots"]["waiting"]
        assert waiting == {"public.t": "its publication's row filter changed"}
        c.execute("UPDATE t SET x = x + 1 WHERE id IN (3, 12)")
        sync_copies(["public.t"])

        # A column list that publishes b, and a narrower filter on m (rows leave).
        publish((["id", "x", "b"], "id > 5"), (None, "id % 4 = 0"))
        c.execute("INSERT INTO m (id, v) VALUES (4, 'w'), (8, 'w'), (5, 'w')")
        sync_copies(["public.m", "public.t"])

        # A list that leaves b out needs no copy, but SET TABLE replaces t's row in the
        # publication, as if t was taken out and put back: copied. A column added to m
        # (no list, its row kept): nothing to copy.
        publish((["id", "x"], "id > 5"), scope["public.m"])
        c.execute("ALTER TABLE m ADD COLUMN w int")
        c.execute("INSERT INTO m (id, v, w) VALUES (8, 'x', 1)")
        c.execute("UPDATE t SET b = 'unseen', x = 0 WHERE id = 7")
        sync_copies(["public.t"])
        assert mirrored_columns(lake, "public.t") == ["id", "x"]

        # No list any more: every column, b's and d's values among them.
        publish((None, "id > 5"), scope["public.m"])
        sync_copies(["public.t"])
        assert mirrored_columns(lake, "public.t") == ["id", "x", "b", "d"]

        # Changed between the run's read of its publications and its target: one more
        # batch of the same run copies it.
        c.execute("INSERT INTO t VALUES (30, 300, 'b30', 'd30')")
        ops = [lambda: publish(scope["public.t"], (None, "id % 3 = 0"))]
        with before_the_target(ops):
            sync_copies([], ["public.m"])
        assert not ops


def test_a_row_a_row_filter_lets_in_with_a_value_left_out_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    """An UPDATE that moves a row into a publication's row filter reaches the slot as an
    INSERT (pgoutput_row_filter), which leaves an unchanged out-of-line value out: only
    the replica identity's are taken from the old row. The lake never had the row, so
    the value is listed missing (in the change log and the state), never invented, and
    a lake that holds every row copies the table in the same run. Before, the INSERT's
    value was NULL and listed nowhere: the mirror kept NULL for good. (Spark's replay of
    such an INSERT: the hand-built replay case of test_replay_sql.)"""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
        c.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line
        c.execute("CREATE PUBLICATION pub FOR TABLE t WHERE (id > 10)")
        c.execute(
            "INSERT INTO t SELECT g, 'v', repeat(md5(g::text), 200) FROM generate_series(1, 20) g"
        )
        run_bootstrap(cfg)
        c.execute("UPDATE t SET id = 105 WHERE id = 5")  # moves in: an INSERT
        c.execute("UPDATE t SET v = 'later' WHERE id = 105")  # big unchanged again
        c.execute("UPDATE t SET id = 0 WHERE id = 15")  # moves out: a DELETE
        c.execute("UPDATE t SET v = 'w' WHERE id = 16")
        result = run_sync(cfg)
        assert result.batch is not None and result.followed is not None
        named = Lake(lake).read_commit(result.followed)
        assert named.tables["public.t"].missing_toast == 2
        assert "public.t" in named.snapshot["wanted"]
        log = {
            (r["_op"], r["id"]): r["_missing_toast"]
            for r in read_changes(lake, "public.t").to_pylist()
            if r["_batch"] == result.followed
        }
        assert log == {("I", 105): ["big"], ("U", 105): ["big"], ("D", None): [], ("U", 16): []}
        assert sorted(Lake(lake).read_commit(result.batch).snapshot["tables"]) == ["public.t"]
        cmp = compare_table(c, lake, "public.t", None, "id > 10")
        assert cmp.equal, cmp.describe()


def test_tables_holding_an_enum_or_composite_whose_values_read_otherwise_are_copied(
    pg_dsn: str, slot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ALTER TYPE … RENAME VALUE`` changes what every row holding the label reads as,
    without a change in the stream or a rewrite (a row stores the label's oid); so does
    ``ALTER TYPE … ADD ATTRIBUTE`` for every value of a composite type (``(1,x)`` reads
    ``(1,x,)``), and a column added to a table whose row type a column holds. The run
    that sees it copies each table whose columns hold the type — directly, in an array,
    a domain, a composite or a range — and no other; a value added to an enum, or an
    attribute renamed, needs nothing. Before, the lake kept the old texts for good."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake)
    renamed = ["public.arr", "public.comp", "public.dom", "public.plain", "public.rng"]
    tables = [*renamed, "public.other", "public.rows"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        c.execute("CREATE TYPE size AS ENUM ('s', 'm', 'l')")
        c.execute("CREATE DOMAIN good_mood AS mood CHECK (VALUE <> 'sad')")
        c.execute("CREATE TYPE pair AS (n int, m mood)")
        c.execute("CREATE TYPE mood_range AS RANGE (subtype = mood)")
        c.execute("CREATE TABLE rng (id int PRIMARY KEY, r mood_range)")
        c.execute(
            "INSERT INTO rng SELECT g, mood_range('sad', 'ok', '[]') FROM generate_series(1, 3) g"
        )
        c.execute("CREATE TABLE plain (id int PRIMARY KEY, m mood)")
        c.execute("CREATE TABLE arr (id int PRIMARY KEY, ms mood[])")
        c.execute("CREATE TABLE dom (id int PRIMARY KEY, g good_mood)")
        c.execute("CREATE TABLE comp (id int PRIMARY KEY, p pair)")
        c.execute("CREATE TABLE other (id int PRIMARY KEY, s size, t text)")
        c.execute("INSERT INTO plain SELECT g, 'ok' FROM generate_series(1, 3) g")
        c.execute(
            "INSERT INTO arr SELECT g, ARRAY['ok', 'sad']::mood[] FROM generate_series(1, 3) g"
        )
        c.execute("INSERT INTO dom SELECT g, 'ok' FROM generate_series(1, 3) g")
        c.execute("INSERT INTO comp SELECT g, ROW(g, 'ok')::pair FROM generate_series(1, 3) g")
        c.execute("INSERT INTO other SELECT g, 'm', 'ok' FROM generate_series(1, 3) g")
        c.execute("CREATE TABLE rows (id int PRIMARY KEY, o other)")
        c.execute("INSERT INTO rows SELECT g, ROW(g, 'm', 'x')::other FROM generate_series(1, 3) g")
        c.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)}")
        run_bootstrap(cfg)

        c.execute("ALTER TYPE size ADD VALUE 'xl'")  # changes no row
        c.execute("ALTER TYPE pair RENAME ATTRIBUTE n TO n2")  # '(1,ok)' still
        c.execute("INSERT INTO other VALUES (10, 'xl', 'x')")
        result = run_sync(cfg)
        assert result.status == "committed" and result.followed is None
        assert Lake(lake).read_commit(result.batch).snapshot.get("tables") == {}

        c.execute("ALTER TYPE mood RENAME VALUE 'ok' TO 'fine'")
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config), "--json"]) == 0
        waiting = json.loads(capsys.readouterr().out)["snapshots"]["waiting"]
        why = "an enum value it holds was renamed ('ok' to 'fine')"
        assert waiting == dict.fromkeys(renamed, why)
        c.execute("INSERT INTO plain VALUES (10, 'fine')")
        result = run_sync(cfg)
        assert result.status == "committed" and result.followed is None
        copied = Lake(lake).read_commit(result.batch).snapshot["tables"]
        assert sorted(copied) == renamed
        assert_mirror(c, lake, tables)

        c.execute("ALTER TYPE pair ADD ATTRIBUTE z int")
        c.execute("ALTER TABLE other ADD COLUMN w int")
        c.execute("INSERT INTO plain VALUES (11, 'fine')")
        result = run_sync(cfg)
        copied = Lake(lake).read_commit(result.batch).snapshot["tables"]
        assert sorted(copied) == ["public.comp", "public.rows"]
        assert_mirror(c, lake, tables)


def test_a_generated_column_made_ordinary_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ALTER TABLE … ALTER COLUMN … DROP EXPRESSION`` makes a stored generated column,
    which pgoutput of PostgreSQL 15 and 16 never sends, an ordinary one: no rewrite, no
    change in the stream, and every row keeps the value it had. The next Relation message
    brings the column, which the lake added as NULL for every earlier row, for good. The
    run that sees it copies the table; a generated column dropped, or made ordinary
    outside the publication's column list, needs nothing (until the list takes it)."""
    from slotlake.bootstrap import run_bootstrap

    from .sync_helpers import before_the_target

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake)
    tables = ["public.g", "public.h", "public.l"]

    def sync_copies(*want: list[str]) -> None:
        c.execute("UPDATE h SET a = a + 1 WHERE id = 1")
        result = run_sync(cfg)
        assert result.status == "committed" and result.batch is not None
        batches = range(result.followed or result.batch, result.batch + 1)
        got = [sorted(Lake(lake).read_commit(b).snapshot.get("tables", {})) for b in batches]
        assert got == list(want)
        assert_mirror(c, lake, ["public.g", "public.h"])
        listed = ["id", "a"] if "c" not in mirrored_columns(lake, "public.l") else None
        cmp = compare_table(c, lake, "public.l", listed)
        assert cmp.equal, cmp.describe()

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name in ("g", "h", "l"):
            c.execute(
                f"CREATE TABLE {name} (id int PRIMARY KEY, a int, "
                "b int GENERATED ALWAYS AS (a * 2) STORED, "
                "c text GENERATED ALWAYS AS ('c' || a) STORED)"
            )
            c.execute(f"INSERT INTO {name} (id, a) SELECT x, x FROM generate_series(1, 5) x")
        c.execute("CREATE PUBLICATION pub FOR TABLE g, h, l (id, a)")
        run_bootstrap(cfg)
        sync_copies([])

        c.execute("ALTER TABLE g ALTER COLUMN b DROP EXPRESSION")
        c.execute("ALTER TABLE h DROP COLUMN b")
        c.execute("ALTER TABLE l ALTER COLUMN c DROP EXPRESSION")  # outside l's list
        capsys.readouterr()
        assert cli_main(["status", "--config", str(config), "--json"]) == 0
        waiting = json.loads(capsys.readouterr().out)["snapshots"]["waiting"]
        assert waiting == {"public.g": "its generated column b became an ordinary column"}
        c.execute("INSERT INTO g (id, a, b) VALUES (10, 10, 7)")
        c.execute("UPDATE g SET a = 0 WHERE id = 2")  # b stays 4
        sync_copies(["public.g"])
        assert mirrored_columns(lake, "public.g") == ["id", "a", "b"]

        # The list takes c (SET TABLE replaces l's row in the publication: copied).
        c.execute("ALTER PUBLICATION pub SET TABLE g, h, l (id, a, c)")
        sync_copies(["public.l"])
        assert mirrored_columns(lake, "public.l") == ["id", "a", "c"]

        # Between the run's read of its publications and its target: one more batch.
        ops = [lambda: c.execute("ALTER TABLE g ALTER COLUMN c DROP EXPRESSION")]
        with before_the_target(ops):
            sync_copies([], ["public.g"])
        assert not ops
        assert mirrored_columns(lake, "public.g") == ["id", "a", "b", "c"]
        assert_mirror(c, lake, tables[:2])


@pytest.mark.parametrize("how", ["table", "schema"])
def test_a_table_taken_out_of_its_publication_and_put_back_is_copied(
    pg_dsn: str, slot: str, tmp_path: Path, how: str
) -> None:
    """``ALTER PUBLICATION … DROP TABLE t``, changes of t, ``ADD TABLE t`` (or its
    schema's ``TABLES IN SCHEMA``) between two runs: the changes in between were published
    by none, and t is in the published set as before, with its oid. The publication's row
    that publishes t is another one (each commit records them, ``snapshot.memberships``):
    the run copies t, and no other table. Before, the mirror lacked those changes for
    good."""
    from slotlake.bootstrap import run_bootstrap

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    member = "TABLE s.t" if how == "table" else "TABLES IN SCHEMA s"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA s")
        c.execute("CREATE TABLE s.t (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
        c.execute(f"CREATE PUBLICATION pub FOR {member}, TABLE u")
        c.execute("INSERT INTO s.t SELECT g, 'a' FROM generate_series(1, 3) g")
        run_bootstrap(cfg)
        c.execute("INSERT INTO u VALUES (1, 'x')")
        assert run_sync(cfg).status == "committed"
        c.execute(f"ALTER PUBLICATION pub DROP {member}")
        c.execute("UPDATE s.t SET v = 'unseen' WHERE id = 1")
        c.execute("DELETE FROM s.t WHERE id = 2")
        c.execute(f"ALTER PUBLICATION pub ADD {member}")
        c.execute("INSERT INTO u VALUES (2, 'y')")
        result = run_sync(cfg)
        record = Lake(lake).read_commit(result.batch)
        assert {n: t["reason"] for n, t in record.snapshot["tables"].items()} == {
            "s.t": "put back into its publication"
        }
        assert_mirror(c, lake, ["s.t", "public.u"])
        c.execute("INSERT INTO u VALUES (3, 'z')")
        result = run_sync(cfg)
        assert Lake(lake).read_commit(result.batch).snapshot["tables"] == {}
