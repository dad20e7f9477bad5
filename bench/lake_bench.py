#!/usr/bin/env python
"""Delta lake benchmark: does a batch cost what its changes cost?

Two comparisons, each side by side in one run on one throwaway PostgreSQL and one local
SparkSession (the issue's targets in brackets):

  size    a batch of ``--changes`` changes (80 % updates of random rows, 10 % deletes,
          10 % inserts) on a ``--big``-row table vs the same batch on a ``--small``-row
          table                                                          [≤ 1.25×]
          and the small table once more with the driver lane off (every step in
          Spark), to show what the big table costs beyond the path it takes
  spread  the same ``--changes`` changes spread over ``--tables`` tables vs all in one
          table                                                          [≤ 2×]
          and the many tables once more written by the driver's threads only
          (``lake.table_processes = 0``: no forked workers)
  floor   the spread's tables written one after another at the least any Delta writer
          must do (per table: a Parquet file and a log entry for its change rows, its
          state's file read, written again without the changed keys and a log entry; no
          decode, fill, checks or fsync), in this Python: what a table costs at best here,
          and the spread's ratio if its many-table batch's tables took that on every core
  steady  the size's and the spread's sides again, ``--steady-batches`` batches each in one
          process, the median of all batches after the second: both ratios once every
          side is warm (``size`` and ``spread`` take the faster of each side's first two,
          and the first scenario after the JVM's start still warms up), and what a writer
          at the floor would reach in the spread (after ``floor``)  [≤ 1.25×, ≤ 2×]
  series  the spread's ``--tables`` tables over ``--series-batches`` batches in one process:
          every batch's time (min, median, mean, max), to show the batches between and
          at the tables' checkpoints (each table checkpoints once in 30 of its versions)
  quiet   ``--changes`` / ``--tables`` changes to one table of a lake of ``--quiet-tables``
          tables the batch leaves alone vs the same batch in a lake of that table
          alone: a batch should not cost what the lake holds (each table's catalog is
          read at the target, and the commit record lists them all)
  process ``--process-changes`` changes over 8 tables, one ``slotlake sync`` process timed
          from its start to its exit (slot advanced)                     [≤ 10 s]
  multiset  ``--process-changes`` changes on a ``--small``-row table without a key
          (REPLICA IDENTITY FULL), one ``slotlake sync`` process each: its state rebuilt
          on the driver (the default) vs MERGEd by Spark (``driver_write_state_mb = 0``)
  appends  ``--changes`` inserts on a ``--big``-row table without a key (identity DEFAULT:
          INSERT-only) vs the same on a ``--small``-row one, ``--steady-batches``
          batches each, medians of all after the second: an INSERT-only state is
          appended to, never read, so the ratio should be about 1  [≤ 1.25×]
  uuid    the size's comparison (medians of ``--steady-batches`` batches, all after the
          second) on tables keyed by a random uuid, as ``gen_random_uuid()`` keys are:
          Delta's statistics prune no file for random keys          [≤ 1.25×]
  composite  the same on tables keyed by (tenant, id), each row's tenant one of 1,000 at
          random: statistics of the key's first column prune nothing either
  full    the same on tables with a primary key and REPLICA IDENTITY FULL (a multiset
          kept unique on its key, slotlake.unique_multiset: MERGEd by it)
  full_spark  ``full`` with every table done by Spark (``driver_write_rows = 0``), as on
          a lake off the local disk: Spark's MERGE by the key (not in the default steps)
  identity  ``--changes``/10 changes on an ``--identity-rows``-row table by Spark
          (``driver_write_rows = 0``), six batches: the third switches the table to
          REPLICA IDENTITY FULL between its changes, the fifth back; those rewrite the
          state whole, the others are MERGEs (the FULL one by the primary key kept as
          ``unique_on``). Not in the default steps
  mid     2,000 changes on 100k- and 500k-row keyed tables (states within
          ``lake.driver_write_state_mb``): the touched files rewritten by the driver
          (``driver_deletion_vectors = false``) vs MERGEd with deletion vectors
  ddl     the ``process`` batch with column changes at the source in it (each of the 8
          tables gets ADD COLUMN … DEFAULT, RENAME COLUMN and DROP COLUMN before its
          updates), one ``slotlake sync`` process, vs the ``process`` figure: DDL should
          cost no more than the changes around it; says whether Spark wrote any commit
  rollback  an in-place reprocess of the newest batch of ``--tables`` tables (100 changes
          each): every change log, state and the transactions table restored to its
          version before that batch (the driver's RESTORE commits), then the batch
          decoded and written again; timed whole, and the restores apart. Before it, the
          same batch reprocessed into a new root, whose states and change logs start as
          clones of their versions before the batch (timed whole, and the seeding apart),
          beside Spark's copy of a state as the seed was made before

Each table is first loaded and bootstrapped (``slotlake bootstrap``: slot + copy, not
timed), then the timed batch is written and one ``run_sync`` measured. Four batches of
``--changes`` on a ``--small``-row table go first, untimed, so that no step's first side pays the process's first
calls. Not a test: run by
hand.

The source cluster's files go to ``--source-dir`` (default ``/dev/shm``, a tmpfs, where it
exists): a production source runs on its own machine, and on this one-disk machine the
lake's fsyncs would wait for the source's WAL instead (ext4's ordered mode writes the new
blocks of every file before the journal commit an fsync waits for: ~0.1 s more on the
5M-row batch, whose 10k random updates write ~100 MB of WAL). ``--source-dir ''``: the
system's temporary directory, beside the lake.

    python bench/lake_bench.py [--changes 10000] [--big 5000000] [--small 20000]
                               [--tables 100]
                               [--steps size,spread,floor,steady,series,quiet,process,multiset,appends,uuid,composite,full,mid,ddl,rollback]
                               [--quiet-tables 300] [--series-batches 32]
                               [--steady-batches 8]
                               [--source-dir /dev/shm] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from slotlake.bootstrap import run_bootstrap
from slotlake.config import Config, LakeConfig, SourceConfig
from slotlake.localpg import LocalPostgres
from slotlake.spark import build_session
from slotlake.sync import run_sync
from slotlake.table_processes import cores

DDL = "CREATE TABLE {name} (id int8 PRIMARY KEY, v text, n numeric(12,2), ts timestamptz)"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load(
    c: psycopg.Connection[Any],
    name: str,
    rows: int,
    multiset: bool = False,
    insert_only: bool = False,
    uuid_key: bool = False,
    composite: bool = False,
    full_key: bool = False,
) -> None:
    ddl = DDL.format(name=name)
    if composite:  # the key (tenant, id), each row's tenant one of 1,000 at random
        ddl = ddl.replace(" PRIMARY KEY", "")[: -len(")")]
        ddl += ", tenant int DEFAULT (random() * 1000)::int, PRIMARY KEY (tenant, id))"
    if multiset or insert_only:  # no key: with identity DEFAULT, INSERTs only are published
        ddl = ddl.replace(" PRIMARY KEY", "")
    if uuid_key:  # row g's key is md5(g) as a uuid: random, as gen_random_uuid() keys are
        ddl = ddl.replace("id int8", "id uuid")
    c.execute(ddl)
    if multiset or full_key:  # full_key: FULL identity and a primary key
        c.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    key = "md5(g::text)::uuid" if uuid_key else "g"
    c.execute(
        f"INSERT INTO {name} SELECT {key}, md5(g::text), g / 7.0, now() "
        "FROM generate_series(1, %s) g",
        (rows,),
    )
    if composite:  # the batches find their rows by id
        c.execute(f"CREATE INDEX ON {name} (id)")


def changes(
    c: psycopg.Connection[Any], name: str, rows: int, n: int, rng: random.Random, round_: int
) -> None:
    """n changes: 80 % updates of random rows, 10 % deletes, 10 % inserts, one transaction."""
    ids = rng.sample(range(1, rows + 1), min(rows, int(n * 0.9)))
    updates, deletes = ids[: int(n * 0.8)], ids[int(n * 0.8) :]
    with c.transaction():
        c.execute(f"UPDATE {name} SET v = 'u' || v WHERE id = ANY(%s)", (updates,))
        c.execute(f"DELETE FROM {name} WHERE id = ANY(%s)", (deletes,))
        c.execute(
            f"INSERT INTO {name} SELECT g, 'new', 0, now() FROM generate_series(%s::int8, %s::int8) g",
            (rows + 1, rows + n - len(ids)),
        )


# identity: the round whose batch switches the table to FULL between its changes, and
# the round that switches it back (the rounds between are plain batches of each shape).
IDENTITY_ROUNDS = {2: "FULL", 4: "DEFAULT"}


def identity_changes(
    c: psycopg.Connection[Any], name: str, rows: int, n: int, rng: random.Random, round_: int
) -> None:
    """:func:`changes` in two halves, the table's replica identity switched between them
    in the rounds of ``IDENTITY_ROUNDS``."""
    changes(c, name, rows, n // 2, rng, round_)
    if round_ in IDENTITY_ROUNDS:
        c.execute(f"ALTER TABLE {name} REPLICA IDENTITY {IDENTITY_ROUNDS[round_]}")
    # The first half's inserts took the ids after rows.
    changes(c, name, rows + n // 2 - int(n // 2 * 0.9), n - n // 2, rng, round_)


def uuid_changes(
    c: psycopg.Connection[Any], name: str, rows: int, n: int, rng: random.Random, round_: int
) -> None:
    """:func:`changes` to a table whose row g has the key md5(g) as a uuid."""
    ids = rng.sample(range(1, rows + 1), min(rows, int(n * 0.9)))
    updates, deletes = ids[: int(n * 0.8)], ids[int(n * 0.8) :]
    keys = "(SELECT md5(x::text)::uuid FROM unnest(%s::int8[]) x)"
    with c.transaction():
        c.execute(f"UPDATE {name} SET v = 'u' || v WHERE id IN {keys}", (updates,))
        c.execute(f"DELETE FROM {name} WHERE id IN {keys}", (deletes,))
        c.execute(
            f"INSERT INTO {name} SELECT md5(g::text)::uuid, 'new', 0, now() "
            "FROM generate_series(%s::int8, %s::int8) g",
            (rows + 1, rows + n - len(ids)),
        )


def inserts(
    c: psycopg.Connection[Any], name: str, rows: int, n: int, rng: random.Random, round_: int
) -> None:
    """n inserts of new rows, one transaction (an INSERT-only table's batch)."""
    c.execute(
        f"INSERT INTO {name} SELECT g, md5(g::text), g / 7.0, now() "
        "FROM generate_series(%s::int8, %s::int8) g",
        (rows + 1, rows + n),
    )


def column_changes(
    c: psycopg.Connection[Any], name: str, rows: int, n: int, rng: random.Random, round_: int
) -> None:
    """Round ``round_``'s DDL on a table, then n updates of random rows setting the new
    column: ADD COLUMN with a DEFAULT (a fast default: every existing row reads it, the
    WAL shows none), RENAME the previous round's added column, DROP the one before."""
    with c.transaction():
        c.execute(f"ALTER TABLE {name} ADD COLUMN c{round_} text DEFAULT 'd{round_}'")
        if round_ >= 1:
            c.execute(f"ALTER TABLE {name} RENAME COLUMN c{round_ - 1} TO r{round_ - 1}")
        if round_ >= 2:
            c.execute(f"ALTER TABLE {name} DROP COLUMN r{round_ - 2}")
        ids = rng.sample(range(1, rows + 1), min(rows, n))
        c.execute(f"UPDATE {name} SET c{round_} = 'new' WHERE id = ANY(%s)", (ids,))


def spark_commits(cfg: Config, names: list[str]) -> int:
    """Commits Spark wrote into the tables' state and change log (from their Delta logs)."""
    from deltalake import DeltaTable

    from slotlake.lake import Lake

    return sum(
        str(h.get("engineInfo", "")).startswith("Apache-Spark")
        for name in names
        for kind in ("state", "changes")
        for h in DeltaTable(f"{cfg.lake.path}/{Lake.table_path(kind, name)}").history()
    )


def check_mirror(c: psycopg.Connection[Any], cfg: Config, name: str) -> None:
    """The state holds the source's rows (count, and every v's length summed): a fast
    batch that wrote a wrong mirror would not count (not timed)."""
    from deltalake import DeltaTable

    from slotlake.lake import Lake, query_delta

    # sum(id) where the key is a number, the uuid keys' first characters' codes otherwise
    number = c.execute(
        "SELECT atttypid = 'int8'::regtype FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attname = 'id'",
        (name,),
    ).fetchone()
    total = "sum(id)" if number and number[0] else "sum(ascii(id::text))"
    sql = f"SELECT count(*), sum(length(v)), {total} FROM {{}}"
    want = c.execute(sql.format(name)).fetchone()
    path = f"{cfg.lake.path}/{Lake.table_path('state', 'public.' + name)}"
    if "_copies" in DeltaTable(path).schema().to_arrow().names:  # a multiset: rows counted
        sql = "SELECT sum(_copies), sum(length(v) * _copies), sum(id * _copies) FROM {}"
    got = query_delta(path, DeltaTable(path).version(), sql.format("t")).to_pylist()[0]
    assert tuple(int(v or 0) for v in got.values()) == tuple(int(v or 0) for v in want), (
        name,
        got,
        want,
    )


# Each timed batch's (seconds, run_sync's timings), newest last: the spread's floor step
# reads the parts of the fastest many-table batch that are not its tables.
BATCHES: list[tuple[float, dict[str, float]]] = []


def timed_sync(cfg: Config, spark: Any) -> float:
    t0 = time.monotonic()
    result = run_sync(cfg, spark=spark)
    assert result.status == "committed", result
    BATCHES.append((time.monotonic() - t0, dict(result.timings)))
    return BATCHES[-1][0]


def floor_per_table(tables: int, per: int, rows: int, passes: int = 4) -> float:
    """Seconds ``tables`` small tables' batch takes in this Python at the least any Delta
    writer must do (the fastest of ``passes`` batches but the first), one table after
    another: its change rows appended as one Parquet file and
    one log entry, and its state's file read and written again without the changed keys
    plus one log entry. No decode, no TOAST fill, no statistics beyond the key's min and
    max, no schema or transaction checks, nothing made durable: slotlake's tables all do
    more."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def frame(n: int, first: int) -> pa.Table:
        ids = np.arange(first, first + n, dtype=np.int64)
        return pa.table(
            {
                "id": ids,
                "v": pa.array([f"{i:032x}" for i in ids]),
                "n": pa.array(ids // 7, pa.int64())
                .cast(pa.decimal128(19, 0))
                .cast(pa.decimal128(12, 2)),
                "ts": pa.array(ids).cast(pa.timestamp("us", "UTC")),
            }
        )

    def add(directory: str, data: pa.Table) -> dict[str, Any]:
        # Encoded in memory and written with one call, without a dictionary, Parquet's own
        # statistics or the Arrow schema: the cheapest small file pyarrow writes (as
        # slotlake's own writer does), where a path costs a file system and a stream.
        name = f"part-{os.urandom(16).hex()}.parquet"
        encoded = pa.BufferOutputStream()
        pq.write_table(
            data, encoded, use_dictionary=False, write_statistics=False, store_schema=False
        )
        with open(os.path.join(directory, name), "xb") as f:
            f.write(encoded.getvalue())
        low, high = pc.min_max(data.column("id")).values()
        stats = {"numRecords": data.num_rows, "minValues": {"id": low.as_py()}}
        stats["maxValues"] = {"id": high.as_py()}
        return {"add": {"path": name, "size": 0, "stats": json.dumps(stats)}}

    def commit(directory: str, version: int, actions: list[dict[str, Any]]) -> None:
        entry = os.path.join(directory, "_delta_log", f"{version:020d}.json")
        with open(entry, "x") as f:
            f.write("\n".join(json.dumps(a) for a in [{"txn": {"version": 1}}, *actions]))

    root = tempfile.mkdtemp(prefix="lake-floor-")
    try:
        states = []
        for i in range(tables):
            for kind in ("c", "s"):
                os.makedirs(os.path.join(root, f"{kind}{i}", "_delta_log"))
            states.append(add(os.path.join(root, f"s{i}"), frame(rows, 1))["add"]["path"])
        meta = {
            "_lsn": pa.array(np.arange(per, dtype=np.int64)),
            "_op": pa.array(["u"] * per),
            "_batch": pa.array(np.ones(per, dtype=np.int64)),
        }
        # Each table's decoded changes, built before the clock starts: decoding is not
        # part of the floor.
        changes = [frame(per, rows - per // 2) for _ in range(tables)]
        # Batch after batch into the same tables, each after a sync of the file system (a
        # sync's batch ends with one, not timed here): on this machine's ext4 a file made
        # in a directory whose own changes are not on disk yet took 0.27 ms, 0.036 ms
        # once they were, and a table's batch makes four in four directories.
        times = []
        for version in range(1, passes + 1):
            os.sync()
            t0 = time.perf_counter()
            for i, changed in enumerate(changes):
                log_dir, state_dir = os.path.join(root, f"c{i}"), os.path.join(root, f"s{i}")
                logged = changed
                for name, values in meta.items():
                    logged = logged.append_column(name, values)
                commit(log_dir, version, [add(log_dir, logged)])
                old = pq.ParquetFile(os.path.join(state_dir, states[i])).read()
                kept = old.filter(pc.invert(pc.is_in(old.column("id"), value_set=changed["id"])))
                gone = {"remove": {"path": states[i]}}
                new = add(state_dir, pa.concat_tables([kept, changed]))
                commit(state_dir, version, [gone, new])
                states[i] = new["add"]["path"]
            times.append(time.perf_counter() - t0)
        return min(times[1:] or times)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def timed_process(cfg: Config, spark: Any) -> float:
    """One ``slotlake sync`` in a process of its own, from its start to its exit."""
    t0 = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slotlake.cli",
            "sync",
            f"--set=source.dsn={cfg.source.dsn}",
            f"--set=source.slot={cfg.source.slot}",
            f"--set=source.publications={','.join(cfg.source.publications)}",
            f"--set=lake.path={cfg.lake.path}",
            f"--set=lake.driver_write_state_mb={cfg.lake.driver_write_state_mb}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - t0


def scenario(
    pg: LocalPostgres,
    spark: Any,
    tag: str,
    tables: dict[str, int],
    per_table: int,
    repeat: int = 2,
    sync: Any = timed_sync,
    driver_rows: int | None = None,
    multiset: bool = False,
    insert_only: bool = False,
    uuid_key: bool = False,
    composite: bool = False,
    full_key: bool = False,
    state_mb: int | None = None,
    deletion_vectors: bool = True,
    write: Any = changes,
    after: Any = None,
    processes: int | None = None,
) -> float:
    """Load and bootstrap ``tables`` (name → rows), then time ``repeat`` batches of changes
    to each (``write``) with ``sync``; the fastest counts (the first pays the JVM's
    warm-up). ``after(cfg)`` runs once the batches are written."""
    dsn = pg.create_database(f"bench_{tag}")
    slot = f"bench_{tag}"
    with psycopg.connect(dsn, autocommit=True) as c:
        for name, rows in tables.items():
            load(c, name, rows, multiset, insert_only, uuid_key, composite, full_key)
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        cfg = Config(
            source=SourceConfig(dsn=dsn, slot=slot, publications=["pub"]),
            lake=LakeConfig(path=tempfile.mkdtemp(prefix=f"lake-{tag}-")),
        )
        if driver_rows is not None:
            cfg.lake.driver_write_rows = driver_rows
        if state_mb is not None:
            cfg.lake.driver_write_state_mb = state_mb
        cfg.lake.driver_deletion_vectors = deletion_vectors
        cfg.lake.table_processes = processes
        # The initial copy (not timed): bootstrap creates the slot and copies every row.
        log(f"{tag}: bootstrap of {sum(tables.values()):,} rows")
        t0 = time.monotonic()
        run_bootstrap(cfg, spark=spark)
        log(f"{tag}: bootstrap {time.monotonic() - t0:.1f}s")
        rng = random.Random(tag)
        times = []
        for round_ in range(repeat):
            for name, rows in tables.items():
                write(c, name, rows, per_table, rng, round_)
                rows += per_table // 10  # the inserts of this round are the next ids
                tables[name] = rows
            times.append(sync(cfg, spark))
            log(f"{tag}: batch of {per_table * len(tables):,} changes {times[-1]:.2f}s")
            if not multiset:
                for name in tables:
                    check_mirror(c, cfg, name)
        seconds = min(times)
        if after is not None:
            after(cfg)
        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    # Kept when the scenario failed (to look at), removed once measured: a full run's lakes
    # are gigabytes.
    shutil.rmtree(cfg.lake.path, ignore_errors=True)
    return seconds


def spread_tables(args: argparse.Namespace, prefix: str) -> tuple[dict[str, int], int]:
    """The spread's ``--tables`` tables (name → rows) and the changes each gets: the
    ``--changes`` shared among them, each table at least twice as big as its share."""
    per = max(1, args.changes // args.tables)
    rows = max(args.small // args.tables, per * 2)
    return {f"{prefix}_{i:03d}": rows for i in range(args.tables)}, per


def steady_sides(
    pg: LocalPostgres,
    spark: Any,
    batches: int,
    sides: dict[str, tuple[dict[str, int], int]],
) -> dict[str, list[tuple[float, dict[str, float]]]]:
    """Each side (tag → its tables and the changes each gets) over ``batches`` batches in
    this process: the batches after the first two (the JVM's, the workers' and the
    caches' warm-up), with run_sync's timings."""
    if batches < 3:
        raise SystemExit("--steady-batches must be at least 3 (the first two are warm-up)")
    out = {}
    for tag, (tables, changed) in sides.items():
        mark = len(BATCHES)
        scenario(pg, spark, tag, dict(tables), changed, repeat=batches)
        out[tag] = BATCHES[mark + 2 :]
    return out


def median_s(batches: list[tuple[float, dict[str, float]]]) -> float:
    return statistics.median(t for t, _ in batches)


def steady_ratios(
    pg: LocalPostgres, spark: Any, args: argparse.Namespace, floor: dict[str, Any] | None
) -> dict[str, Any]:
    """The size and spread comparisons once every side is warm: their medians and ratios;
    for the spread also the many-table batch's steps outside its tables and, with the
    floor step's figure, the ratio if its tables' phase took only the floor on every
    core."""
    tables, per = spread_tables(args, "d")
    sides = steady_sides(
        pg,
        spark,
        args.steady_batches,
        {
            "steady_small": ({"d_small": args.small}, args.changes),
            "steady_big": ({"d_big": args.big}, args.changes),
            "steady_one": ({"d_one": sum(tables.values())}, per * args.tables),
            "steady_many": (tables, per),
        },
    )
    small, big = median_s(sides["steady_small"]), median_s(sides["steady_big"])
    one, many = median_s(sides["steady_one"]), median_s(sides["steady_many"])
    rest = statistics.median(t - tm.get("batch.tables", 0.0) for t, tm in sides["steady_many"])
    result: dict[str, Any] = {
        "small_s": small,
        "big_s": big,
        "size_ratio": big / small,
        "one_s": one,
        "many_s": many,
        "spread_ratio": many / one,
        "many_rest_s": rest,
        "batches_s": {tag: [t for t, _ in b] for tag, b in sides.items()},
    }
    log(
        f"steady size: batches 3-{args.steady_batches}, median: {args.big:,} rows {big:.2f}s "
        f"vs {args.small:,} rows {small:.2f}s = {big / small:.2f}× (target ≤ 1.25×)"
    )
    line = (
        f"steady spread: batches 3-{args.steady_batches}, median: {args.tables} tables "
        f"{many:.2f}s vs one table {one:.2f}s = {many / one:.2f}× (target ≤ 2×); the many "
        f"tables' other steps {rest:.3f}s"
    )
    if floor is not None:
        best = rest + floor["per_table_ms"] * args.tables / 1000 / floor["cores"]
        result["spread_best_ratio"] = best / one
        line += f"; their tables at the floor: {best / one:.2f}×"
    log(line)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--changes", type=int, default=10_000)
    p.add_argument("--big", type=int, default=5_000_000)
    p.add_argument("--small", type=int, default=20_000)
    p.add_argument("--tables", type=int, default=100)
    p.add_argument("--process-changes", type=int, default=400)
    p.add_argument("--quiet-tables", type=int, default=300)
    p.add_argument("--series-batches", type=int, default=32)
    p.add_argument("--steady-batches", type=int, default=8)
    p.add_argument("--spark-tables", type=int, default=10)
    p.add_argument("--spark-changes", type=int, default=100)
    p.add_argument("--identity-rows", type=int, default=1_000_000)
    p.add_argument(
        "--steps",
        default="size,spread,floor,steady,series,quiet,process,multiset,appends,uuid,composite,full,mid,ddl,rollback,spark",
    )
    p.add_argument("--version", type=int, default=16)
    p.add_argument(
        "--source-dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else "",
        help="where the source cluster's files go ('' = the system's temporary directory)",
    )
    p.add_argument("--json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out: dict[str, Any] = {"load": os.getloadavg(), "source_dir": args.source_dir or None}
    pg = LocalPostgres(
        version=args.version, base_dir=Path(args.source_dir) if args.source_dir else None
    ).start()
    spark = build_session("slotlake-lake-bench")
    try:
        steps = args.steps.split(",")
        # Not timed: the process's first batches of this size pay for first calls and
        # growing memory pools (0.25 and 0.15 s where the same table's later ones take
        # 0.10-0.11), which would flatter every ratio whose small side ran first.
        scenario(pg, spark, "warm_up", {"w_up": args.small}, args.changes, repeat=4)
        if "size" in steps:
            small = scenario(pg, spark, "small", {"t_small": args.small}, args.changes)
            big = scenario(pg, spark, "big", {"t_big": args.big}, args.changes)
            # The small table again on the Spark path (driver lane off): what the big
            # table's batch costs beyond the path it must take.
            small_spark = scenario(
                pg, spark, "small_spark", {"t_small": args.small}, args.changes, driver_rows=0
            )
            # The big table's MERGE by Spark instead of the driver's deletion vectors.
            big_spark = scenario(
                pg, spark, "big_spark", {"t_big": args.big}, args.changes, deletion_vectors=False
            )
            out["size"] = {
                "small_s": small,
                "small_spark_s": small_spark,
                "big_s": big,
                "big_spark_merge_s": big_spark,
                "ratio": big / small,
                "ratio_same_path": big_spark / small_spark,
            }
            log(
                f"size: {args.big:,} rows {big:.2f}s vs {args.small:,} rows {small:.2f}s "
                f"= {big / small:.2f}× (target ≤ 1.25×); the big table MERGEd by Spark "
                f"{big_spark:.1f}s; vs {args.small:,} rows on the Spark path "
                f"{small_spark:.1f}s = {big_spark / small_spark:.2f}×"
            )
        if "spread" in steps:
            tables, per = spread_tables(args, "t")
            whole = {"t_one": sum(tables.values())}
            one = scenario(pg, spark, "one", whole, per * args.tables)
            mark = len(BATCHES)
            many = scenario(pg, spark, "many", tables, per)
            many_batches = BATCHES[mark:]
            # The same tables written by the driver's threads only (no forked workers).
            threads = scenario(pg, spark, "many_threads", tables, per, processes=0)
            # Each batch a `slotlake sync` of its own, as Airflow runs it: process start
            # to exit, so the imports a fresh process makes are counted too.
            one_p = scenario(pg, spark, "one_p", dict(whole), per * args.tables, sync=timed_process)
            many_p = scenario(pg, spark, "many_p", dict(tables), per, sync=timed_process)
            out["spread"] = {
                "one_s": one,
                "many_s": many,
                "many_threads_s": threads,
                "ratio": many / one,
                "ratio_threads": threads / one,
                "one_process_s": one_p,
                "many_process_s": many_p,
                "ratio_process": many_p / one_p,
            }
            log(
                f"spread: {args.tables} tables {many:.2f}s vs one table {one:.2f}s "
                f"= {many / one:.2f}× (target ≤ 2×); threads only {threads:.2f}s "
                f"= {threads / one:.2f}×; a process each batch {many_p:.2f}s vs "
                f"{one_p:.2f}s = {many_p / one_p:.2f}×"
            )
        if "spark" in steps:
            # A lake off the local disk (an object store, HDFS): every table through
            # Spark's writers, ten keyed tables side by side vs their changes in one.
            n, per = args.spark_tables, args.spark_changes
            tables = {f"sp_{i:02d}": max(per * 2, args.small // n) for i in range(n)}
            many = scenario(pg, spark, "spark_many", tables, per, repeat=3, driver_rows=0)
            one = scenario(
                pg, spark, "spark_one", {"sp_one": args.small}, per * n, repeat=3, driver_rows=0
            )
            out["spark"] = {"many_s": many, "one_s": one, "tables": n, "changes": per * n}
            log(
                f"spark: {per * n:,} changes over {n} tables through Spark {many:.2f}s "
                f"vs in one table {one:.2f}s ({many / n:.2f}s a table)"
            )
        if "floor" in steps:
            tables, per = spread_tables(args, "f")
            rows = next(iter(tables.values()))
            floor = floor_per_table(args.tables, per, rows)
            n_cores = cores()
            out["floor"] = {"per_table_ms": 1000 * floor / args.tables, "cores": n_cores}
            line = (
                f"floor: a table's batch at the least a Delta writer does "
                f"{1000 * floor / args.tables:.2f} ms; {args.tables} tables on {n_cores} cores "
                f"{floor / n_cores:.3f}s"
            )
            if "spread" in out:
                # The fastest many-table batch with its tables' phase at the floor, all cores
                # busy and no cost of spreading them over the cores.
                many_s, timings = min(many_batches, key=lambda b: b[0])
                rest = many_s - timings.get("batch.tables", 0.0)
                best = rest + floor / n_cores
                out["floor"].update(
                    spread_rest_s=rest, spread_best_ratio=best / out["spread"]["one_s"]
                )
                line += (
                    f"; the spread's other steps {rest:.3f}s: at best "
                    f"{best / out['spread']['one_s']:.2f}× (target ≤ 2×)"
                )
            log(line)
        if "steady" in steps:
            out["steady"] = steady_ratios(pg, spark, args, out.get("floor"))
        if "series" in steps:
            tables, per = spread_tables(args, "s")
            series: list[float] = []

            def kept(cfg: Config, spark: Any) -> float:
                series.append(timed_sync(cfg, spark))
                return series[-1]

            scenario(pg, spark, "series", tables, per, repeat=args.series_batches, sync=kept)
            # The first batch pays the JVM's and the caches' warm-up: not counted.
            steady = series[1:]
            out["series"] = {
                "batches_s": series,
                "min_s": min(steady),
                "median_s": statistics.median(steady),
                "mean_s": statistics.fmean(steady),
                "max_s": max(steady),
            }
            log(
                f"series: {len(steady)} batches of {args.tables} tables: min {min(steady):.2f}s "
                f"median {statistics.median(steady):.2f}s mean {statistics.fmean(steady):.2f}s "
                f"max {max(steady):.2f}s"
            )
        if "quiet" in steps:
            # The changed table is one of the spread's tables: its size, its changes.
            spread, per = spread_tables(args, "q")
            rows = spread["q_000"]

            def first_only(
                c: psycopg.Connection[Any],
                name: str,
                n_rows: int,
                n: int,
                rng: random.Random,
                r: int,
            ) -> None:
                if name.endswith("_000"):
                    changes(c, name, n_rows, n, rng, r)

            alone = scenario(pg, spark, "alone", {"q_000": rows}, per, repeat=4, write=first_only)
            crowd = {f"q_{i:03d}": rows for i in range(args.quiet_tables)}
            among = scenario(pg, spark, "among", crowd, per, repeat=4, write=first_only)
            out["quiet"] = {
                "changes": per,
                "quiet_tables": args.quiet_tables - 1,
                "alone_s": alone,
                "among_s": among,
                "ratio": among / alone,
            }
            log(
                f"quiet: {per} changes to one table, in a lake of {args.quiet_tables} tables "
                f"{among:.2f}s vs alone {alone:.2f}s = {among / alone:.2f}×"
            )
        if "rollback" in steps:
            rolled: dict[str, Any] = {}

            def reprocess_newest(cfg: Config) -> None:
                from deltalake import DeltaTable

                from slotlake.lake import Lake
                from slotlake.reprocess import run_reprocess

                stamps: list[tuple[float, str]] = []

                def progress(msg: str) -> None:
                    stamps.append((time.monotonic(), msg))

                newest = Lake(cfg.lake.path).commit_batches()[-1]
                # Into a new root first: every table's state and change log as of the batch
                # before, cloned by the driver, then the batch decoded and written again.
                out_root = os.path.join(tempfile.mkdtemp(prefix="lake-reseed-"), "lake")
                t0 = time.monotonic()
                run_reprocess(
                    cfg.lake.path, output=out_root, first=newest, spark=spark, progress=progress
                )
                rolled["new_root_s"] = time.monotonic() - t0
                rolled["seed_s"] = (
                    next((t for t, m in stamps if m.startswith("reprocessing batch")), t0) - t0
                )
                shutil.rmtree(os.path.dirname(out_root), ignore_errors=True)
                stamps.clear()
                t0 = time.monotonic()
                result = run_reprocess(
                    cfg.lake.path, in_place=True, first=newest, spark=spark, progress=progress
                )
                seconds = time.monotonic() - t0
                restores = [t for t, m in stamps if "restored to" in m]
                # For comparison, Spark's RESTORE of a few of the same tables (JVM warm).
                lake = Lake(cfg.lake.path)
                sample = [f"state/public.r_{i:03d}" for i in range(min(5, args.tables))]
                t1 = time.monotonic()
                for rel in sample:
                    version = int(DeltaTable(lake.path(rel)).version())
                    spark.sql(
                        f"RESTORE TABLE delta.`{lake.path(rel)}` TO VERSION AS OF {version - 1}"
                    )
                # And Spark's copy of a few states as the new root's seed was made before:
                # the version read (time travel) and written to a new table.
                from slotlake.delta import ensure_table, overwrite

                copies = tempfile.mkdtemp(prefix="lake-copies-")
                t2 = time.monotonic()
                for i, rel in enumerate(sample):
                    version = int(DeltaTable(lake.path(rel)).version())
                    df = spark.read.format("delta").option("versionAsOf", version - 1)
                    df = df.load(lake.path(rel))
                    ensure_table(spark, f"{copies}/{i}", df.schema)
                    overwrite(df, f"{copies}/{i}", "bench", 1)
                rolled["spark_seed_s_per_table"] = (time.monotonic() - t2) / len(sample)
                shutil.rmtree(copies, ignore_errors=True)
                rolled.update(
                    seconds=seconds,
                    restored=len(restores),
                    restore_s=(restores[-1] - t0) if restores else 0.0,
                    spark_restore_s_per_table=(time.monotonic() - t1) / len(sample),
                    batches=result.batches,
                )

            tables, per = spread_tables(args, "r")
            scenario(pg, spark, "rollback", tables, per, after=reprocess_newest)
            out["rollback"] = rolled
            log(
                f"rollback: in-place reprocess of the newest batch over {args.tables} tables "
                f"{rolled['seconds']:.2f}s, of which {rolled['restored']} tables restored in "
                f"{rolled['restore_s']:.2f}s; Spark's RESTORE "
                f"{rolled['spark_restore_s_per_table']:.2f}s a table"
            )
            log(
                f"rollback: the same batch into a new root {rolled['new_root_s']:.2f}s, of which "
                f"{2 * args.tables} tables seeded (cloned) in {rolled['seed_s']:.2f}s; "
                f"Spark's copy of a state {rolled['spark_seed_s_per_table']:.2f}s a table"
            )
        if "process" in steps:
            tables = {f"p_{i}": args.small for i in range(8)}
            per = max(1, args.process_changes // len(tables))
            seconds = scenario(pg, spark, "process", tables, per, sync=timed_process)
            out["process"] = {"changes": per * len(tables), "seconds": seconds}
            log(
                f"process: {per * len(tables)} changes over 8 tables, process start to "
                f"slot advanced {seconds:.1f}s (target ≤ 10 s)"
            )
        if "ddl" in steps:
            tables = {f"d_{i}": args.small for i in range(8)}
            per = max(1, args.process_changes // len(tables))
            found: dict[str, int] = {}
            seconds = scenario(
                pg,
                spark,
                "ddl",
                tables,
                per,
                repeat=3,
                sync=timed_process,
                write=column_changes,
                after=lambda cfg: found.update(
                    spark=spark_commits(cfg, [f"public.{t}" for t in tables])
                ),
            )
            out["ddl"] = {"changes": per * len(tables), "seconds": seconds, **found}
            log(
                f"ddl: ADD COLUMN … DEFAULT, RENAME and DROP COLUMN on 8 tables with {per * len(tables)} "
                f"changes, one process: {seconds:.1f}s (the process step without DDL: "
                f"{out.get('process', {}).get('seconds', float('nan')):.1f}s); commits by "
                f"Spark: {found['spark']}"
            )
        if "multiset" in steps:
            n = args.process_changes
            table = {"m": args.small}
            runs = {"repeat": 3, "sync": timed_process, "multiset": True}
            driver = scenario(pg, spark, "ms_driver", dict(table), n, **runs)
            in_spark = scenario(pg, spark, "ms_spark", dict(table), n, **runs, state_mb=0)
            out["multiset"] = {"changes": n, "driver_s": driver, "spark_s": in_spark}
            log(
                f"multiset: {n} changes on {args.small:,} rows (REPLICA IDENTITY FULL), one "
                f"process: state rebuilt on the driver {driver:.1f}s vs MERGEd by Spark "
                f"{in_spark:.1f}s"
            )
        if "appends" in steps:
            ins = {"multiset": False, "insert_only": True, "write": inserts}
            sides = {}
            for tag, rows in (("ins_small", args.small), ("ins_big", args.big)):
                mark = len(BATCHES)
                scenario(pg, spark, tag, {tag: rows}, args.changes, args.steady_batches, **ins)
                sides[tag] = median_s(BATCHES[mark + 2 :])
            small, big = sides["ins_small"], sides["ins_big"]
            out["appends"] = {"small_s": small, "big_s": big, "ratio": big / small}
            log(
                f"appends: {args.changes:,} inserts into a table without a key (INSERT-only), "
                f"median of batches 3-{args.steady_batches}: {args.big:,} rows {big:.2f}s vs "
                f"{args.small:,} rows {small:.2f}s = {big / small:.2f}×"
            )
        for kind in ("uuid", "composite", "full", "full_spark"):
            if kind not in steps:
                continue
            keyed: dict[str, Any] = {
                "uuid": {"uuid_key": True, "write": uuid_changes},
                "composite": {"composite": True},
                "full": {"full_key": True},
                "full_spark": {"full_key": True, "driver_rows": 0},
            }[kind]
            sides = {}
            steps_s = {}
            for tag, rows in ((f"{kind}_small", args.small), (f"{kind}_big", args.big)):
                mark = len(BATCHES)
                scenario(pg, spark, tag, {tag: rows}, args.changes, args.steady_batches, **keyed)
                sides[tag] = median_s(BATCHES[mark + 2 :])
                steps_s[tag] = {
                    k: statistics.median(tm.get(k, 0.0) for _, tm in BATCHES[mark + 2 :])
                    for k in BATCHES[-1][1]
                }
                log(f"{tag}: run_sync's steps, medians: {steps_s[tag]}")
            small, big = sides[f"{kind}_small"], sides[f"{kind}_big"]
            out[kind] = {"small_s": small, "big_s": big, "ratio": big / small, "steps": steps_s}
            keyed_by = {
                "uuid": "a random uuid",
                "composite": "(tenant, id)",
                "full": "id with REPLICA IDENTITY FULL",
                "full_spark": "id with REPLICA IDENTITY FULL, by Spark",
            }[kind]
            log(
                f"{kind}: the size's batch on tables keyed by {keyed_by}, median of batches "
                f"3-{args.steady_batches}: {args.big:,} rows {big:.2f}s vs {args.small:,} rows "
                f"{small:.2f}s = {big / small:.2f}× (target ≤ 1.25×)"
            )
        if "identity" in steps:
            # A batch that switches a table's identity between its changes rewrites its
            # state whole (slotlake.identity_segments), by Spark here as off the local disk.
            mark = len(BATCHES)
            n = max(2, args.changes // 10)
            scenario(
                pg,
                spark,
                "identity",
                {"t_identity": args.identity_rows},
                n,
                repeat=6,
                driver_rows=0,
                write=identity_changes,
            )
            t = [s for s, _ in BATCHES[mark:]]
            plain = statistics.median([t[1], t[3], t[5]])
            out["identity"] = {"rows": args.identity_rows, "batches_s": t, "plain_s": plain}
            log(
                f"identity: {n:,} changes on {args.identity_rows:,} rows by Spark, the identity "
                f"switched inside the batch: to FULL {t[2]:.2f}s, back {t[4]:.2f}s; plain "
                f"batches (keyed, FULL by its key, keyed) {t[1]:.2f} / {t[3]:.2f} / "
                f"{t[5]:.2f}s"
            )
        if "mid" in steps:
            # Mid-sized keyed states (within lake.driver_write_state_mb): the driver
            # rewriting the files its keys hit vs giving them deletion vectors.
            out["mid"] = {}
            for rows in (100_000, 500_000):
                tag = f"mid{rows // 1000}k"
                cow = scenario(
                    pg, spark, f"{tag}_cow", {"t": rows}, 2000, repeat=3, deletion_vectors=False
                )
                dv = scenario(pg, spark, f"{tag}_dv", {"t": rows}, 2000, repeat=3)
                out["mid"][rows] = {"rewrite_s": cow, "vectors_s": dv}
                log(
                    f"mid: 2,000 changes on {rows:,} rows: files rewritten {cow:.2f}s vs "
                    f"deletion vectors {dv:.2f}s"
                )
    finally:
        spark.stop()
        pg.stop()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
