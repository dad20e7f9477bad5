"""Exactly once under crashes: kill the sync at every step, rerun, compare with an oracle.

The contract (DESIGN.md §3): kill the job at any instant and run it again — every change
appears in the change log exactly once, the state equals the source, no reader ever saw a
half-written batch, and the slot is never ahead of the lake. The oracle is the audit
trigger of sync_helpers (independent of logical decoding).

Each fault step costs two or three Spark runs, so the parametrised crash tests share one
database, slot and lake per PostgreSQL version (a module-scoped ``chain``): each test adds
its own workload on top of what the previous one left and checks the whole history.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from slotlake import dv_merge
from slotlake.config import Config
from slotlake.delta import DRIVER_ENGINE
from slotlake.lake import Lake, LakeError, read_changes, read_state, table_names
from slotlake.localpg import LocalPostgres
from slotlake.lsn import Lsn
from slotlake.sync import (
    FAULT_ENV,
    FAULT_STEPS,
    InjectedFault,
    SlotAheadError,
    run_sync,
)

from .sync_helpers import (
    assert_log_matches_audit,
    assert_mirror,
    assert_rows_recorded,
    audited_schema,
    logged_ops,
    make_config,
    off_record,
    slot_confirmed,
    slotlake_backends,
)

SCHEMA = """
CREATE TABLE kv (id int PRIMARY KEY, txt text, big text);
ALTER TABLE kv ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE items (code text PRIMARY KEY, qty int, note text);
CREATE PUBLICATION pub FOR TABLE kv, items;
"""
KEYS = {"public.kv": "id", "public.items": "code"}
TABLES = list(KEYS)
BATCH_DIR = re.compile(r"^b\d{20}-[0-9a-f]+$")
_db_counter = itertools.count()


def big(seed: int) -> str:
    # Incompressible enough to be stored out of line (STORAGE EXTERNAL): updates that
    # leave it alone send it as unchanged TOAST, filled from earlier events or the state.
    return "".join(f"{(seed * 7919 + i) % 1_000_003:07d}" for i in range(9000 // 7))


def setup_source(c: psycopg.Connection[Any], slot: str) -> None:
    audited_schema(c, SCHEMA, KEYS)
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def workload(c: psycopg.Connection[Any], r: int) -> None:
    """Round ``r``: inserts, TOAST-less updates, deletes and key changes on both tables.

    Rows of round r-1 are touched too, so unchanged TOAST must come from the prior state
    (a committed batch) as well as from earlier events of the same batch.
    """
    base, prev = r * 100, (r - 1) * 100
    with c.transaction():  # one transaction across both tables
        for i in range(1, 6):
            c.execute(
                "INSERT INTO kv VALUES (%s, %s, %s)", (base + i, f"r{r} row {i}", big(base + i))
            )
        c.execute(
            "INSERT INTO items SELECT 'r' || %s || '-' || g, g, 'n' || g FROM generate_series(1, 4) g",
            (r,),
        )
    c.execute("UPDATE kv SET txt = 'same batch' WHERE id = %s", (base + 1,))
    c.execute("UPDATE kv SET id = %s WHERE id = %s", (base + 50, base + 2))
    c.execute("UPDATE kv SET txt = 'moved' WHERE id = %s", (base + 50,))
    c.execute("DELETE FROM kv WHERE id = %s", (base + 3,))
    c.execute("UPDATE items SET code = code || 'x', qty = qty * 10 WHERE code = %s", (f"r{r}-1",))
    c.execute("DELETE FROM items WHERE code = %s", (f"r{r}-2",))
    if r > 1:
        with c.transaction():
            c.execute(
                "UPDATE kv SET txt = 'later batch' WHERE id IN (%s, %s)", (prev + 4, prev + 5)
            )
            c.execute("UPDATE items SET qty = -qty WHERE code = %s", (f"r{r - 1}-3",))
        c.execute("UPDATE kv SET id = %s WHERE id = %s", (base + 60, prev + 4))
        c.execute("DELETE FROM kv WHERE id = %s", (prev + 5,))


def uncommitted(lake: Lake) -> list[str]:
    """Raw directories no commit record names, and plans of unfinished batches."""
    referenced = {rec.raw for rec in lake.commits()}
    root = lake.root
    raw = [
        rel
        for p in (root / "_raw").glob("b*")
        if p.is_dir()
        and BATCH_DIR.match(p.name)
        and (rel := p.relative_to(root).as_posix()) not in referenced
    ]
    plans = [p.relative_to(root).as_posix() for p in (root / "_pending").glob("*.json")]
    return sorted(raw + plans)


def confirmed(c: psycopg.Connection[Any], slot: str) -> Lsn:
    return Lsn.parse(slot_confirmed(c, slot))


def assert_exactly_once(c: psycopg.Connection[Any], lake: str, slot: str) -> None:
    """The whole history so far: log == audit, state == source, clean lake, slot == lake."""
    assert_log_matches_audit(c, lake, KEYS)
    assert_mirror(c, lake, TABLES)
    assert uncommitted(Lake(lake)) == []
    last = Lake(lake).last_commit()
    assert last is not None
    assert confirmed(c, slot) == last.end
    # The newest records (a rerun's finished batch among them) count what was written.
    assert_rows_recorded(lake, Lake(lake).commit_batches()[-3:])


def log_snapshot(lake: str) -> dict[str, pa.Table]:
    return {t: read_changes(lake, t) for t in TABLES} if Lake(lake).last_commit() else {}


# -- one shared chain per PostgreSQL version ---------------------------------------------


@dataclass
class Chain:
    conn: psycopg.Connection[Any]
    slot: str
    lake: str
    cfg: Config
    rounds: Iterator[int]


def _chain(
    pg_cluster: LocalPostgres,
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
    state_mb: int | None = None,
) -> Iterator[Chain]:
    name = f"faults_pg{pg_cluster.version}_{next(_db_counter)}"
    dsn = pg_cluster.create_database(name)
    slot = f"s_{name}"
    lake = str(tmp_path_factory.mktemp(name) / "lake")
    with psycopg.connect(dsn, autocommit=True) as c:
        setup_source(c, slot)
        rounds = itertools.count(1)
        workload(c, next(rounds))
        cfg = make_config(dsn, lake, slot)
        if state_mb is not None:
            cfg.lake.driver_write_state_mb = state_mb
        assert run_sync(cfg, spark=spark).status == "committed"
        assert_exactly_once(c, lake, slot)
        try:
            yield Chain(c, slot, lake, cfg, rounds)
        finally:
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


@pytest.fixture(scope="module")
def chain(
    pg_cluster: LocalPostgres, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chain]:
    yield from _chain(pg_cluster, spark, tmp_path_factory)


@pytest.fixture(scope="module")
def dv_chain(
    pg_cluster: LocalPostgres, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chain]:
    """Every keyed state counts as big: the driver MERGEs it with deletion vectors."""
    yield from _chain(pg_cluster, spark, tmp_path_factory, state_mb=0)


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_crash_at_step_then_rerun_is_exactly_once(
    chain: Chain, step: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_then_rerun(chain, step, spark, monkeypatch)


def test_a_crash_in_a_lakes_first_batch_then_rerun(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with nothing to pull, then the lake's first batch dies once its tables hold
    it: no record names them yet, readers see no table, the slot has not moved, and the
    rerun finishes batch 1 as its first attempt fixed it, with no table written twice."""
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        start = confirmed(c, slot)
        # Up to the slot's own position: WAL is cluster-wide, and other databases' writes
        # (other tests, a checkpoint) would make a run to the flush LSN a batch of no change.
        assert run_sync(cfg, target_lsn=start, spark=spark).status == "up_to_date"
        assert Lake(lake).last_commit() is None and off_record(Lake(lake)) == []

        workload(c, 1)
        monkeypatch.setenv(FAULT_ENV, "changes_written")
        with pytest.raises(InjectedFault, match="at step changes_written"):
            run_sync(cfg, spark=spark)
        monkeypatch.delenv(FAULT_ENV)
        assert Lake(lake).last_commit() is None
        assert confirmed(c, slot) == start
        assert table_names(lake) == []
        with pytest.raises(LakeError, match="no committed state"):
            read_state(lake, "public.kv")
        written = off_record(Lake(lake))
        assert any(t.startswith("state/") for t in written), written
        assert any(t.startswith("changes/") for t in written), written

        # Changes after the crash: batch 1 is finished as its first attempt fixed it, and
        # they come as batch 2 of the same run.
        plan = Lake(lake).read_plan(1)
        assert plan is not None
        end_1 = Lsn.parse(plan.end_lsn)
        workload(c, 2)
        result = run_sync(cfg, spark=spark)
        assert (result.status, result.resumed, result.batch) == ("committed", 1, 2)
        assert Lake(lake).read_commit(1).end == end_1 == result.start_lsn
        assert off_record(Lake(lake)) == []
        assert_exactly_once(c, lake, slot)


@pytest.mark.parametrize("step", ["table_written", "before_commit"])
def test_crash_after_deletion_vector_merges_then_rerun(
    dv_chain: Chain, step: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables whose states the driver MERGEd with deletion vectors hold batch N when the
    run dies: the rerun skips them by their txn versions and writes nothing twice."""
    monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)  # vectors, not rewrites
    crash_then_rerun(dv_chain, step, spark, monkeypatch)
    paths = [Lake(dv_chain.lake).path(Lake.table_path("state", t)) for t in TABLES]
    states = [DeltaTable(str(p)) for p in paths]
    assert any(h.get("engineInfo") == DRIVER_ENGINE for t in states for h in t.history()), (
        "no state was MERGEd by the driver"
    )
    assert any(list(Path(p).glob("deletion_vector_*.bin")) for p in paths)


def crash_then_rerun(chain: Chain, step: str, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c, lake = chain.conn, Lake(chain.lake)
    if uncommitted(lake) or confirmed(c, chain.slot) != lake.last_commit().end:  # type: ignore[union-attr]
        # An earlier test of the chain failed half-way: a plain rerun is what repairs it.
        run_sync(chain.cfg, spark=spark)
    batches_before = lake.commit_batches()
    end_before = lake.last_commit().end  # type: ignore[union-attr]
    log_before = log_snapshot(chain.lake)
    workload(c, next(chain.rounds))

    monkeypatch.setenv(FAULT_ENV, step)
    with pytest.raises(InjectedFault, match=f"at step {step}"):
        run_sync(chain.cfg, spark=spark)
    monkeypatch.delenv(FAULT_ENV)

    slot_at = confirmed(c, chain.slot)
    last = lake.last_commit()
    assert last is not None
    assert slot_at <= last.end, "the slot must never be ahead of the lake"
    if step == "after_commit":
        # The commit point was passed: the batch is visible whole, the slot still behind.
        assert lake.commit_batches() == [*batches_before, batches_before[-1] + 1]
        assert slot_at == end_before < last.end
        assert uncommitted(lake) == []
    else:
        assert lake.commit_batches() == batches_before
        assert slot_at == end_before
        # Readers still see exactly the previous commit, although the attempt left files.
        assert log_snapshot(chain.lake) == log_before
        leftovers = uncommitted(lake)
        assert any(p.startswith("_raw/") for p in leftovers), leftovers
        # The batch's plan fixes its content before any table is written.
        assert any(p.startswith("_pending/") for p in leftovers), leftovers
        if step in ("table_written", "changes_written", "before_commit"):
            # Tables already hold batch N, yet readers saw only the last commit (above).
            assert off_record(lake), "no Delta table was written before the crash"

    # The source keeps changing while nobody syncs: the rerun must finish batch N with the
    # content its first attempt fixed (tables that already hold N would otherwise miss the
    # changes in between), then sync what arrived since as batch N+1.
    workload(c, next(chain.rounds))
    result = run_sync(chain.cfg, spark=spark)
    assert result.status == "committed"
    if step == "after_commit":
        # The orphan commit was honoured first: this batch starts where it ended.
        assert result.start_lsn == last.end
        assert result.batch == last.batch + 1
        assert result.resumed is None
    else:
        n = batches_before[-1] + 1
        assert result.resumed == n and result.batch == n + 1
        resumed = Lake(chain.lake).read_commit(n)
        assert resumed.start == end_before and resumed.end == result.start_lsn
    assert_exactly_once(c, chain.lake, chain.slot)


# -- the slot ahead of the lake ------------------------------------------------------------


def test_slot_ahead_of_the_lake_stops_the_run(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        workload(c, 1)
        assert run_sync(cfg, spark=spark).status == "committed"
        (lost_from,) = c.execute("SELECT coalesce(max(id), 0) FROM audit").fetchone()  # type: ignore[misc]
        workload(c, 2)  # consumed behind the lake's back below: lost
        (lost_to,) = c.execute("SELECT max(id) FROM audit").fetchone()  # type: ignore[misc]
        (moved,) = c.execute(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())",
            (slot,),
        ).fetchone()  # type: ignore[misc]
        files_before = sorted(p.as_posix() for p in Path(lake).rglob("*"))
        end_before = Lake(lake).last_commit().end  # type: ignore[union-attr]

        with pytest.raises(SlotAheadError) as err:
            run_sync(cfg, spark=spark)
        msg = str(err.value)
        assert "\n" not in msg
        assert f"slot {slot} is at {moved}" in msg and f"ends at {end_before}" in msg
        assert "data loss" in msg and "--accept-slot-ahead" in msg and "Re-bootstrap" in msg
        assert sorted(p.as_posix() for p in Path(lake).rglob("*")) == files_before
        assert slot_confirmed(c, slot) == moved

        workload(c, 3)
        result = run_sync(cfg, spark=spark, accept_slot_ahead=True)
        assert result.status == "committed" and result.start_lsn == Lsn.parse(moved)
        # Exactly the changes of rounds 1 and 3 are logged; round 2 is the accepted loss.
        for qualified, key in KEYS.items():
            expected = [
                (op, k)
                for op, k in c.execute(
                    "SELECT op, k FROM audit WHERE tbl = %s AND NOT id BETWEEN %s AND %s ORDER BY id",
                    (qualified.split(".")[1], lost_from + 1, lost_to),
                )
            ]
            assert logged_ops(lake, qualified, key) == expected, qualified
        assert confirmed(c, slot) == Lake(lake).last_commit().end  # type: ignore[union-attr]


# -- real process deaths: SIGKILL at a random instant, os._exit at a step --------------------

# SLOTLAKE_FAULT=<step>:exit in a real subprocess; a different step per version so that a
# full run covers both sides of the commit point (15: before it, right after the first
# table's Delta commits and before the others'; 16: after it).
EXIT_STEP = {15: "table_written", 16: "after_commit"}


def write_config(path: Path, dsn: str, slot: str, lake: str) -> Path:
    # json.dumps quotes like a TOML basic string for these ASCII values.
    path.write_text(
        "[source]\n"
        f"dsn = {json.dumps(dsn)}\n"
        f"slot = {json.dumps(slot)}\n"
        'publications = ["pub"]\n'
        "[lake]\n"
        f"path = {json.dumps(lake)}\n"
        "[spark]\n"
        '"spark.ui.enabled" = "false"\n'
        '"spark.driver.memory" = "1g"\n'
    )
    return path


def start_cli(config: Path, log: Path, fault: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    with open(log, "ab") as out:
        # A session of its own: SIGKILL goes to the whole tree (driver, JVM, Python
        # workers) at once, as when the job's container or node dies.
        return subprocess.Popen(
            [sys.executable, "-m", "slotlake.cli", "sync", "--config", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_gone(proc: subprocess.Popen[bytes], c: psycopg.Connection[Any]) -> None:
    """Until no process of the run's group and no server backend of it
    (:func:`slotlake_backends`, on ``c``'s database) is left."""
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        if not alive and slotlake_backends(c) == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the killed run's processes or server backend did not go away")


def test_sigkill_at_a_random_instant_then_rerun(
    pg_dsn: str, slot: str, pg_cluster: LocalPostgres, spark: Any, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    config = write_config(tmp_path / "sync.toml", pg_dsn, slot, lake)
    log = tmp_path / "cli.log"
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        setup_source(c, slot)
        # Two normal runs of the real command: the first creates the Delta tables, the
        # second (timed, as the killed ones will be: small tables need no JVM) gives the
        # range the kill instant is drawn from.
        for batch in (1, 2):
            workload(c, batch)
            t0 = time.monotonic()
            proc = start_cli(config, log)
            assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
            normal = time.monotonic() - t0
            assert f"status: committed, batch {batch}" in log.read_text()
            assert_exactly_once(c, lake, slot)

        # Seeded per version: reproducible, and the two versions die at different instants.
        rng = random.Random(f"sigkill-pg{pg_cluster.version}")
        bound, killed, rounds = normal, False, itertools.count(3)
        for _ in range(5):
            workload(c, next(rounds))
            delay = rng.uniform(0.1, bound)
            t0 = time.monotonic()
            proc = start_cli(config, log)
            time.sleep(delay)
            killed = proc.poll() is None
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
            wait_gone(proc, c)
            # Shown on failure: where the run was when it died.
            print(f"SIGKILL after {delay:.2f}s (normal run {normal:.1f}s): killed={killed}")
            last = Lake(lake).last_commit()
            assert last is not None and confirmed(c, slot) <= last.end
            if killed:
                break
            # The run was quicker than the timed one: draw again within its duration.
            bound = 0.6 * (time.monotonic() - t0)
        assert killed, "every run finished before its kill instant"
        print(log.read_text()[-2000:])

        workload(c, next(rounds))
        result = run_sync(cfg, spark=spark)
        assert result.status == "committed"
        assert_exactly_once(c, lake, slot)

        # os._exit at a step, in a real process (no finally, no unlock, no cleanup).
        step = EXIT_STEP[pg_cluster.version]
        batches = Lake(lake).commit_batches()
        end_before = Lake(lake).last_commit().end  # type: ignore[union-attr]
        workload(c, next(rounds))
        proc = start_cli(config, log, fault=f"{step}:exit")
        assert proc.wait(timeout=600) == 137, log.read_text()[-3000:]
        wait_gone(proc, c)
        assert confirmed(c, slot) == end_before
        if step == "after_commit":
            assert Lake(lake).commit_batches() == [*batches, batches[-1] + 1]
        else:
            assert Lake(lake).commit_batches() == batches
            assert uncommitted(Lake(lake))
        last = Lake(lake).last_commit()
        result = run_sync(cfg, spark=spark)
        assert result.status in ("committed", "up_to_date")
        if result.resumed is not None:
            # The killed batch was finished from its plan first (then anything newer).
            assert step != "after_commit"
            assert Lake(lake).read_commit(result.resumed).start == last.end  # type: ignore[union-attr]
        else:
            assert result.start_lsn == last.end  # type: ignore[union-attr]
        assert_exactly_once(c, lake, slot)
