"""``slotlake maintain``: OPTIMIZE compacts, VACUUM keeps every retained batch readable.

One lake per PostgreSQL version, three sync batches of updates and deletes (small files and
deletion vectors in every state table). Then maintain runs: refused while the slot's lock
is held or a batch is unfinished, touching nothing; then it compacts, vacuums (keeping
the files the last ``lake.state_versions`` batches use, and files younger than the minimum
age), expires raw batches, and a sync after it still mirrors the source.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, unquote

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from slotlake import delta, dv_merge, key_index
from slotlake.batch import DriverWrites
from slotlake.cli import main as cli_main
from slotlake.lake import BatchPlan, Lake, read_state
from slotlake.maintain import (
    CLOCK_SKEW_HOURS,
    LISTING_PARALLELISM,
    SPARK_DEFAULT_LISTING_PARALLELISM,
    bound_listing,
    interval_hours,
    run_maintain,
    since_named,
    vacuum_retention,
)
from slotlake.source import lock_key
from slotlake.sync import run_sync

from .sync_helpers import assert_mirror, key_indexes_made, make_config, off_record

SCHEMA = """
CREATE TABLE kv (id int PRIMARY KEY, txt text, n int);
CREATE PUBLICATION pub FOR TABLE kv;
"""
TABLES = ["public.kv"]
LAST = 3  # batches synced before maintain


def _workload(c: psycopg.Connection, batch: int) -> None:
    base = batch * 100
    c.execute(
        "INSERT INTO kv SELECT g, 'v' || g, g FROM generate_series(%s::int, %s::int) g",
        (base, base + 49),
    )
    if batch > 1:
        prev = base - 100
        c.execute("UPDATE kv SET txt = 'u' || %s::text, n = n + 1 WHERE id %% 3 = 0", (batch,))
        c.execute("DELETE FROM kv WHERE id BETWEEN %s AND %s", (prev, prev + 9))


def _files(path: str, version: int | None = None) -> set[str]:
    return set(
        pa.table(DeltaTable(path, version=version).get_add_actions()).column("path").to_pylist()
    )


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "_delta_log" not in p.parts}


@pytest.mark.one_pg_version  # upkeep of the lake's files: the source's version is not seen
@pytest.mark.parametrize("writer", ["spark", "vectors"])
def test_maintain_compacts_vacuums_and_keeps_retained_batches(
    pg_dsn: str, slot: str, spark, tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake_dir = tmp_path / "lake"
    root = str(lake_dir)
    cfg = make_config(pg_dsn, root, slot)
    # Spark's MERGE, and the driver's with deletion vectors (here for any keyed state),
    # leave a file per batch plus deletion vectors: what OPTIMIZE is for (deltalake's
    # MERGE of small states rewrites the files it touches instead).
    if writer == "spark":
        cfg.lake.driver_write_rows = 0
    else:
        monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
        monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)  # vectors, not rewrites
    clock = time.monotonic()

    def took(what: str) -> None:
        nonlocal clock
        print(f"{what}: {time.monotonic() - clock:.1f} s")
        clock = time.monotonic()

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        states: dict[int, dict[str, list[tuple]]] = {}
        for batch in range(1, LAST + 1):
            _workload(c, batch)
            assert run_sync(cfg, spark=spark).batch == batch
            states[batch] = {t: _rows(read_state(root, t)) for t in TABLES}
        took(f"{LAST} syncs")

        lake = Lake(root)
        rec = {b: lake.read_commit(b) for b in range(1, LAST + 1)}
        kv_rel = rec[LAST].tables["public.kv"].state
        assert kv_rel is not None
        kv_state = lake.path(kv_rel)
        files_before = {rel: _files(lake.path(rel)) for rel in lake.delta_tables()}
        assert len(files_before[kv_rel]) >= LAST
        # Files no commit references (a killed writer's), one older than the minimum age.
        old, young = Path(kv_state) / "orphan-old.parquet", Path(kv_state) / "orphan-young.parquet"
        for p, hours in ((old, 48), (young, 30)):
            p.write_bytes(b"not committed")
            stamp = time.time() - hours * 3600
            os.utime(p, (stamp, stamp))
        # Key indexes beside the state (slotlake.key_index): of a file VACUUM keeps (every
        # removed file is younger than the minimum age) and of a file gone.
        first = {"path": sorted(files_before[kv_rel])[0], "size": 1}
        kept_index = Path(key_index.index_path(kv_state, first, "c"))
        gone_index = Path(key_index.index_path(kv_state, {"path": "gone.parquet", "size": 1}, "c"))
        kept_index.parent.mkdir(exist_ok=True)  # the MERGEs' own indexes may be there
        kept_index.write_bytes(b"")
        gone_index.write_bytes(b"")

        mcfg = make_config(pg_dsn, root, slot)
        mcfg.lake.state_versions = 2
        mcfg.lake.raw_retention_batches = 1
        mcfg.lake.vacuum_min_age_hours = 36
        versions = {rel: DeltaTable(lake.path(rel)).version() for rel in files_before}
        tree = _tree(lake_dir)

        # Locked by a sync of the slot: nothing done (the command exits 0).
        with psycopg.connect(pg_dsn, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (lock_key(slot),))
            assert run_maintain(mcfg, spark=spark).status == "locked"
            args = [f"source.dsn={pg_dsn}", f"source.slot={slot}", f"lake.path={root}"]
            assert cli_main(["maintain", *(x for a in args for x in ("--set", a))]) == 0
            # Released here: closing the session releases it only once the server's
            # backend has exited, which the next run may come before (status "locked").
            holder.execute("SELECT pg_advisory_unlock_all()")
        # An unfinished batch (a plan in _pending/): the next sync must finish it first.
        end = rec[LAST].end_lsn
        plan = BatchPlan(LAST + 1, "0", slot, end, end, end, "_raw/none", 0, 0, "app")
        lake.write_plan(plan)
        assert run_maintain(mcfg, spark=spark).status == "unfinished"
        (lake_dir / "_pending" / f"{LAST + 1:020d}.json").unlink()
        assert _tree(lake_dir) == tree
        assert {rel: DeltaTable(lake.path(rel)).version() for rel in files_before} == versions
        took("refusals")

        lines: list[str] = []
        # Every state file big enough for a key index made ahead: maintain makes the
        # compacted file's, so the next batch's MERGE finds it made.
        monkeypatch.setattr(key_index, "AHEAD_MIN_ROWS", 1)
        result = run_maintain(mcfg, spark=spark, progress=lines.append)
        took("maintain")
        print("\n".join(lines))
        assert result.status == "done", lines
        assert result.retention is not None and result.retention.hours == 36
        assert sorted(t.path for t in result.tables) == sorted(files_before)
        assert all(any(line.startswith(t.path + ":") for line in lines) for t in result.tables)
        assert lines[-1].startswith("status: done"), lines

        # Compaction: every table that had several files now has fewer (the state: one).
        for rel, before in files_before.items():
            if len(before) > 1:
                assert len(_files(lake.path(rel))) < len(before), rel
        assert len(_files(kv_state)) == 1
        assert result.files_compacted >= len(files_before[kv_rel])
        # VACUUM ran where a file the version does not use was old enough (the state's
        # 48-hour orphan), removed it and kept the young one (minimum age); the other
        # tables' removed files are all younger than the retention: no VACUUM for them.
        (kv_done,) = [t for t in result.tables if t.path == kv_rel]
        assert kv_done.vacuumed and not kv_done.vacuum_skipped
        others = [t for t in result.tables if t.path != kv_rel]
        assert others and all(t.vacuum_skipped and not t.vacuumed for t in others)
        assert not old.exists() and young.exists()
        assert kept_index.exists() and not gone_index.exists()
        assert result.files_deleted >= 1
        assert kv_done.key_indexes == 1
        assert [t.path for t in result.tables if t.key_indexes] == [kv_rel]  # keyed states only
        compacted = quote(unquote(next(iter(_files(kv_state)))), safe="")
        names = [p.name for p in kept_index.parent.glob("*.keys.npy")]
        assert sum(n.startswith(compacted + ".") for n in names) == 1, names
        assert kept_index.name in names, names

        # The retained batches still read exactly as they did, by time travel to versions
        # whose files are no longer in the tables' current versions.
        for b in (LAST - 1, LAST):
            v = rec[b].tables["public.kv"].state_version
            assert _files(kv_state, v) - _files(kv_state), "nothing for VACUUM to spare"
            for t in TABLES:
                assert _rows(read_state(root, t, batch=b)) == states[b][t], (b, t)
        assert_mirror(c, root, TABLES)
        # Raw expiry: only the newest batch keeps its raw payloads.
        assert [lake.exists(rec[b].raw or "-") for b in range(1, LAST + 1)] == [False, False, True]
        took("checks")

        # The next batch after maintenance: idempotency markers and state intact, and no
        # key index left for its MERGE to make.
        made = key_indexes_made(monkeypatch)
        _workload(c, LAST + 1)
        assert run_sync(cfg, spark=spark).batch == LAST + 1
        assert not made, made
        assert_mirror(c, root, TABLES)
        assert _rows(read_state(root, "public.kv", batch=LAST)) == states[LAST]["public.kv"]
        took("sync after maintain")


def test_vacuum_listing_is_bounded_by_the_cluster_unless_set(spark) -> None:  # type: ignore[no-untyped-def]
    """A cluster's session left at Spark's 10000 listing partitions gets its own
    parallelism for VACUUM; slotlake's local sessions start at 4; a value set is kept."""
    assert spark.conf.get(LISTING_PARALLELISM) == "4"
    session = spark.newSession()
    session.conf.set(LISTING_PARALLELISM, SPARK_DEFAULT_LISTING_PARALLELISM)
    bound_listing(session)
    assert session.conf.get(LISTING_PARALLELISM) == str(spark.sparkContext.defaultParallelism)
    session.conf.set(LISTING_PARALLELISM, "64")
    bound_listing(session)
    assert session.conf.get(LISTING_PARALLELISM) == "64"


def test_vacuum_retention_covers_the_window() -> None:
    now = datetime(2026, 1, 10, 12, 0, tzinfo=timezone.utc)

    def at(hours_ago: float) -> str:
        return (now - timedelta(hours=hours_ago)).isoformat()

    created = [at(h) for h in (100, 50, 20.5, 10, 2)]
    # keep 2 → the window is batches 4, 5; batch 3's record bounds their commits.
    r = vacuum_retention(created, 2, 0, now)
    assert r.hours == 21 + CLOCK_SKEW_HOURS and r.anchor == now - timedelta(hours=20.5)
    # The minimum age wins when the window is recent.
    assert vacuum_retention(created, 1, 24, now).hours == 24
    # A record replaced by an in-place reprocess (newer created_at) does not shorten it.
    replaced = [*created[:3], at(1), created[4]]
    assert vacuum_retention(replaced, 2, 0, now).hours == 21 + CLOCK_SKEW_HOURS
    # Fewer records than the window: the lake's creation bounds every commit.
    assert vacuum_retention(created[-2:], 3, 0, now, lake_created=at(300)).hours == 301
    # state_versions below 1 still keeps the newest batch (readers go through it).
    assert vacuum_retention(created, 0, 0, now).hours == 10 + CLOCK_SKEW_HOURS


@pytest.mark.parametrize(
    ("text", "hours"),
    [
        ("interval 1 week", 168),
        ("interval 7 days", 168),
        ("interval 1 day 12 hours", 36),
        ("interval 30 minutes", 0.5),
        ("interval 1 month", None),
        ("soon", None),
    ],
)
def test_interval_hours(text: str, hours: float | None) -> None:
    assert interval_hours(text) == hours


@pytest.mark.one_pg_version  # upkeep of the lake's files: the source's version is not seen
def test_maintain_reads_only_its_window_and_expires_old_commit_records(
    pg_dsn: str, slot: str, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake synced every few minutes writes a record a batch, each naming every table:
    maintain must not read them all, and expires those beyond
    ``lake.commit_retention_batches`` that no readable batch or kept raw needs. Reading
    an expired batch, or reprocessing from one, says so."""
    from slotlake.lake import LakeError
    from slotlake.reprocess import ReprocessError, run_reprocess

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    cfg.lake.raw_retention_batches = 2  # each sync expires raw too
    # A checkpoint every third version, so that eight batches leave some to clean up to.
    monkeypatch.setitem(delta.TABLE_PROPERTIES, "delta.checkpointInterval", "3")
    batches = 8
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        states = {}
        for batch in range(1, batches + 1):
            _workload(c, batch)
            assert run_sync(cfg, spark=spark).batch == batch
            states[batch] = _rows(read_state(root, "public.kv"))
        lake = Lake(root)
        # The state's log entries from before batch 4 made 40 days old: past the table's
        # delta.logRetentionDuration (30 days), so maintain's cleanup removes those below
        # its newest checkpoint. The driver writes the checkpoints, so no Spark commit's
        # cleanup would.
        kv_log = Path(lake.path(lake.read_commit(batches).tables["public.kv"].state or "-"))
        kv_log /= "_delta_log"
        old_before = lake.read_commit(4).tables["public.kv"].state_version
        assert old_before is not None
        aged = {
            p.name
            for p in kv_log.iterdir()
            if p.name[:20].isdigit() and int(p.name[:20]) < old_before
        }
        stamp = time.time() - 40 * 86400
        for name in aged:
            os.utime(kv_log / name, (stamp, stamp))
        checkpoints = sorted(int(p.name[:20]) for p in kv_log.glob("*.checkpoint.parquet"))
        assert any(0 < c < old_before for c in checkpoints), (checkpoints, old_before)
        mcfg = make_config(pg_dsn, root, slot)
        mcfg.lake.state_versions = 1
        mcfg.lake.raw_retention_batches = 2
        mcfg.lake.commit_retention_batches = 3
        read: list[int] = []
        real = Lake.read_commit
        monkeypatch.setattr(Lake, "read_commit", lambda self, b: read.append(b) or real(self, b))
        lines: list[str] = []
        result = run_maintain(mcfg, spark=spark, progress=lines.append)
        monkeypatch.setattr(Lake, "read_commit", real)
        assert result.status == "done", lines
        # The retention's window (batches 7, 8) and the kept raw's records (7, 8) only.
        assert set(read) == {7, 8}, read
        # Keep 3 (6..8): 6 is also the record before the oldest raw (7).
        assert result.commits_expired == [f"_commits/{b:020d}.json" for b in range(1, 6)]
        assert lake.commit_batches() == [6, 7, 8]
        assert any(line.startswith("expired 5 commit records") for line in lines), lines
        assert "0 raw batches and 5 commit records expired" in lines[-1], lines[-1]
        for b in (6, 7, 8):
            assert _rows(read_state(root, "public.kv", batch=b)) == states[b]
        # The aged files below the newest aged checkpoint are gone, and the batches kept
        # read as before (above). Here maintain's Spark commits may land on a checkpoint
        # version (every third) and Spark's own cleanup may come first (it also takes
        # that checkpoint when a newer one stands); at the lake's interval of 30 that is
        # one run in ten, hence maintain's own (tests/unit/test_checkpoint_interval.py).
        base = max(c for c in checkpoints if c < old_before)
        gone = {n for n in aged if int(n[:20]) < base}
        left = {p.name for p in kv_log.iterdir()}
        assert gone and not gone & left, sorted(gone & left)
        state_path = lake.path(lake.read_commit(batches).tables["public.kv"].state or "-")
        assert spark.read.format("delta").load(state_path).count() == len(states[batches])
        with pytest.raises(LakeError, match=r"batch 3's commit record .* was expired"):
            read_state(root, "public.kv", batch=3)
        # Batch 6 is the oldest record left, not the lake's first: its prior is unknown.
        with pytest.raises(ReprocessError, match=r"batch 5's commit record.* was expired"):
            run_reprocess(root, in_place=True, spark=spark)
        with pytest.raises(ReprocessError, match="or pass --from-empty"):
            run_reprocess(root, output=str(tmp_path / "out"), first=6, spark=spark)
        assert cli_main(["inspect", "--batch", "2", "--set", f"lake.path={root}"]) == 2
        # The lake goes on: the next batch, and maintain again (6 goes, 7 stays as the one
        # before the oldest raw).
        _workload(c, batches + 1)
        assert run_sync(cfg, spark=spark).batch == batches + 1
        assert_mirror(c, root, TABLES)
        again = run_maintain(mcfg, spark=spark)
        assert again.commits_expired == [f"_commits/{6:020d}.json"]
        assert lake.commit_batches() == [7, 8, 9]


def _age_removals(table: str, version: int, hours: float) -> list[str]:
    """Make the files that ``version`` of the local Delta table at ``table`` removed look
    ``hours`` old (their tombstones' deletion time and their modification time), as if it
    had committed that long ago: a test cannot wait for a retention to pass. The paths."""
    import json

    entry = Path(table) / "_delta_log" / f"{version:020d}.json"
    stamp = time.time() - hours * 3600
    lines, removed = [], []
    for line in entry.read_text().splitlines():
        action = json.loads(line)
        if "remove" in action:
            action["remove"]["deletionTimestamp"] = int(stamp * 1000)
            removed.append(unquote(action["remove"]["path"]))
        lines.append(json.dumps(action))
    entry.write_text("\n".join(lines) + "\n")
    # Hadoop's checksum of the entry Spark wrote (its local file system checks it).
    entry.with_name(f".{entry.name}.crc").unlink(missing_ok=True)
    for rel in removed:
        os.utime(Path(table) / rel, (stamp, stamp))
    # Delta's history dates a commit by its entry's modification time, kept increasing.
    for v in range(version + 1):
        os.utime(entry.with_name(f"{v:020d}.json"), (stamp, stamp))
    return removed


@pytest.mark.one_pg_version  # upkeep of the lake's files: the source's version is not seen
def test_a_quiet_tables_compacted_version_is_named_by_the_next_batch(
    pg_dsn: str, slot: str, spark, tmp_path: Path
) -> None:
    """A table that no batch writes after maintain compacted it: the next batch's record
    names the compacted version (the same rows). Before, the records kept naming the
    version before the OPTIMIZE, whose files it removed, and a VACUUM past their removal's
    retention deleted what readers read (reading the table failed until a batch wrote it
    again). Until that batch, VACUUM leaves a table alone whose commits since the version
    the newest record names removed files before its cutoff. A table gone from the source
    is not compacted at all."""
    import copy

    from slotlake.lake import read_changes
    from slotlake.reprocess import run_reprocess

    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    mcfg = copy.deepcopy(cfg)
    mcfg.lake.vacuum_min_age_hours = 0  # the retention: the window's hours, here 1
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE kv (id int PRIMARY KEY, n int); CREATE TABLE q (id int PRIMARY KEY);"
            "CREATE PUBLICATION pub FOR TABLE kv, q"
        )
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for batch in range(1, 4):  # a change log file a batch: OPTIMIZE bins them
            c.execute("INSERT INTO kv VALUES (%s, 0)", (batch,))
            c.execute("INSERT INTO q VALUES (%s)", (batch,))
            assert run_sync(cfg, spark=spark).batch == batch
        lake = Lake(root)
        q_log = lake.read_commit(3).tables["public.q"].changes
        assert q_log is not None
        named = lake.read_commit(3).tables["public.q"].changes_version
        assert named is not None
        expected = _rows(read_changes(root, "public.q"))
        assert len(expected) == 3

        first = run_maintain(mcfg, spark=spark)
        assert first.status == "done"
        (q_done,) = [t for t in first.tables if t.path == q_log]
        assert q_done.files_compacted == 3
        compacted = DeltaTable(lake.path(q_log)).version()
        assert lake.compacted(3)[q_log] == (named, compacted) == q_done.compacted_from

        # No batch since, and the OPTIMIZE's removals made to look 3 hours old: past the
        # retention (the window's, 1 hour), yet the newest record still names the
        # version they belong to.
        removed = _age_removals(lake.path(q_log), compacted, hours=3)
        assert len(removed) == 3
        second = run_maintain(mcfg, spark=spark)
        assert second.status == "done" and second.retention is not None
        assert second.retention.hours < 3
        assert all((Path(lake.path(q_log)) / rel).exists() for rel in removed)
        assert _rows(read_changes(root, "public.q")) == expected
        (q_done,) = [t for t in second.tables if t.path == q_log]
        assert not q_done.vacuumed and "readers still read" in q_done.note, q_done
        # Off a local disk, the same answers come from the table's history.
        local = since_named(spark, lake.path(q_log), lake.path(q_log), named)
        history = since_named(spark, lake.path(q_log), None, named)
        assert local.first_removal is not None and history.first_removal is not None
        assert abs(history.first_removal - local.first_removal) < 60
        assert local.first_removal < time.time() - 2.9 * 3600
        assert (local.newest, local.compactions_only) == (compacted, True)
        assert (history.newest, history.compactions_only) == (compacted, True)

        # The next batch, q quiet: its record names the compacted version.
        c.execute("UPDATE kv SET n = n + 1")
        assert run_sync(cfg, spark=spark).batch == 4
        assert lake.read_commit(4).tables["public.q"].changes_version == compacted
        assert lake.compacted(3) == {} == lake.compacted(4)
        assert _rows(read_changes(root, "public.q")) == expected
        assert _rows(read_changes(root, "public.q", batch=3)) == expected
        # Now VACUUM goes on: the files the OPTIMIZE removed are of no version named
        # since (the aged removals stand for that long ago).
        third = run_maintain(mcfg, spark=spark)
        (q_done,) = [t for t in third.tables if t.path == q_log]
        assert q_done.vacuumed and q_done.compacted_from is None, q_done
        assert not any((Path(lake.path(q_log)) / rel).exists() for rel in removed)
        assert _rows(read_changes(root, "public.q")) == expected
        assert_mirror(c, root, ["public.kv", "public.q"])

        # Compacted again, and the batch q sat out reprocessed in place before any sync:
        # q is left as it is (only an OPTIMIZE since the version the batch before names),
        # and the rebuilt record names its compacted version.
        c.execute("INSERT INTO q VALUES (4)")
        assert run_sync(cfg, spark=spark).batch == 5
        c.execute("UPDATE kv SET n = n + 1")
        assert run_sync(cfg, spark=spark).batch == 6
        run_maintain(mcfg, spark=spark)
        again = DeltaTable(lake.path(q_log)).version()
        assert lake.compacted(6)[q_log][1] == again
        run_reprocess(root, in_place=True, first=6, spark=spark)
        assert DeltaTable(lake.path(q_log)).version() == again
        assert lake.read_commit(6).tables["public.q"].changes_version == again
        assert off_record(lake) == []
        assert len(read_changes(root, "public.q")) == 4
        assert_mirror(c, root, ["public.kv", "public.q"])

        # Gone from the source: no batch writes it again, so no OPTIMIZE either (its
        # files would stay for good beside the compacted one).
        c.execute("INSERT INTO q VALUES (5)")
        run_sync(cfg, spark=spark)
        c.execute("ALTER PUBLICATION pub DROP TABLE q")
        c.execute("UPDATE kv SET n = n + 1")
        last = run_sync(cfg, spark=spark).batch
        assert lake.read_commit(last).tables["public.q"].gone_since == last
        before = DeltaTable(lake.path(q_log)).version()
        lines: list[str] = []
        fourth = run_maintain(mcfg, spark=spark, progress=lines.append)
        (q_done,) = [t for t in fourth.tables if t.path == q_log]
        assert q_done.gone and q_done.files_compacted == 0, q_done
        assert DeltaTable(lake.path(q_log)).version() == before
        assert any(line.startswith(f"{q_log}: gone from the source") for line in lines), lines
