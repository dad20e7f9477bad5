#!/usr/bin/env python
"""Snapshot benchmark: a big table added to a running publication while it is written to.

On one throwaway PostgreSQL and one local SparkSession:

  floor   ``psql -c "COPY big TO STDOUT" > /dev/null`` of the table
  copy    the per-table snapshot's copy (slotlake.snapshot) of the same table, inside
          the sync that takes it: rows/s and its ratio to the floor
  mirror  time from ``ALTER PUBLICATION … ADD TABLE big`` to state == source, with
          ``--rate`` single-row updates per second hitting the table throughout (syncs
          run back to back; the writer stops after the snapshot's sync, one more sync
          catches up, then the state is compared with the table: count and a digest)
  quiet   a table of the same shape and size added with no writes to it: one
          ``slotlake sync`` process from start to exit, the re-base on the driver
          (default) and, after ``slotlake resnapshot``, in Spark (``driver_write_rows=0``);
          then the same for a REPLICA IDENTITY FULL table without a key (a multiset),
          and for a table without a key or FULL identity (INSERT-only: its copy stored a
          row a copy)
  vacuum  ``VACUUM FULL big`` (a new relfilenode, the values kept), then one ``slotlake
          sync`` process: with the DDL capture trigger in place since the previous commit
          (no copy), and after its rewrite trigger was disabled and enabled again in
          between (the relfilenode rule: the table copied again)

The lake starts with ``slotlake bootstrap`` of a small table, so ``big`` is new to the
published set when it is added. Not a test: run by hand.

    python bench/snapshot_bench.py [--rows 1000000] [--rate 1000] [--version 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bootstrap_bench import find_psql

from slotlake.bootstrap import run_bootstrap
from slotlake.config import Config, LakeConfig, SourceConfig
from slotlake.lake import read_state
from slotlake.localpg import LocalPostgres
from slotlake.spark import build_session
from slotlake.sync import run_sync

DDL = """
CREATE TABLE small (id int8 PRIMARY KEY, v text);
INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 100) g;
CREATE TABLE big (id int8 PRIMARY KEY, v text, n numeric(12,2), ts timestamptz, f float8,
                  b boolean, tags text[], c varchar(40));
CREATE PUBLICATION pub FOR TABLE small;
"""
FILL = """
INSERT INTO big SELECT g, md5(g::text), g / 7.0, now() - g * interval '1 second', g * 0.5,
       g %% 2 = 0, ARRAY['a' || g %% 10, 'b'], 'c' || g
FROM generate_series(%(lo)s::int8, %(hi)s::int8) g
"""
DIGEST = "SELECT count(*), coalesce(sum(hashtext(id::text || v)), 0) FROM big"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def writer(dsn: str, rows: int, rate: float, stop: threading.Event, done: list[int]) -> None:
    """``rate`` single-row UPDATE transactions a second, until ``stop``."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as c:
        t0 = time.monotonic()
        while not stop.is_set():
            c.execute(
                "UPDATE big SET v = md5(random()::text) WHERE id = %s", (rng.randint(1, rows),)
            )
            done[0] += 1
            ahead = done[0] / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)


def quiet(dsn: str, cfg: Config, rows: int) -> dict[str, float]:
    """Seconds of one ``slotlake sync`` process that copies a table with no writes to it:
    ``big``'s copy with its key, one of REPLICA IDENTITY FULL without a key (a multiset,
    its rows' values repeated: each distinct once twice), and the same rows in a table
    without a key or FULL identity (INSERT-only)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE quiet (LIKE big INCLUDING ALL)")
        c.execute("INSERT INTO quiet SELECT * FROM big")
        c.execute("CREATE TABLE quiet_full (LIKE big)")
        c.execute("ALTER TABLE quiet_full REPLICA IDENTITY FULL")
        c.execute("INSERT INTO quiet_full SELECT * FROM big WHERE id <= %s", (rows // 2,))
        c.execute("INSERT INTO quiet_full SELECT * FROM big WHERE id <= %s", (rows // 2,))
        c.execute("CREATE TABLE quiet_log (LIKE big)")
        c.execute("INSERT INTO quiet_log SELECT * FROM quiet_full")
        c.execute("VACUUM ANALYZE quiet, quiet_full, quiet_log")
    cli, where = _cli(dsn, cfg)
    out: dict[str, float] = {}
    for table in ("quiet", "quiet_full", "quiet_log"):
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"ALTER PUBLICATION pub ADD TABLE {table}")
        for path, extra in (("driver", []), ("spark", ["--set=lake.driver_write_rows=0"])):
            if path == "spark":
                subprocess.run(
                    [*cli, "resnapshot", *where, "--table", f"public.{table}"],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            t0 = time.monotonic()
            subprocess.run([*cli, "sync", *where, *extra], check=True, stdout=subprocess.DEVNULL)
            out[f"{table}_{path}"] = time.monotonic() - t0
            log(
                f"{table}: {rows:,}-row table added, re-based by {path}: sync process "
                f"{out[f'{table}_{path}']:.1f}s"
            )
    return out


def _cli(dsn: str, cfg: Config) -> tuple[list[str], list[str]]:
    """The ``slotlake`` command line and the options that name the bench's source and lake."""
    return [sys.executable, "-m", "slotlake.cli"], [
        f"--set=source.dsn={dsn}",
        f"--set=source.slot={cfg.source.slot}",
        "--set=source.publications=pub",
        f"--set=lake.path={cfg.lake.path}",
    ]


def vacuum(dsn: str, cfg: Config, rows: int) -> dict[str, float]:
    """Seconds of one ``slotlake sync`` process after ``VACUUM FULL big``: with the DDL
    capture in place throughout, then with its rewrite trigger disabled and enabled again
    before the VACUUM (what the sync cannot rely on: it copies ``big`` again)."""
    cli, where = _cli(dsn, cfg)
    subprocess.run([*cli, "sync", *where], check=True, stdout=subprocess.DEVNULL)
    out: dict[str, float] = {}
    for how in ("in_place", "broken"):
        with psycopg.connect(dsn, autocommit=True) as c:
            if how == "broken":
                c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite DISABLE")
                c.execute("ALTER EVENT TRIGGER slotlake_table_rewrite ENABLE ALWAYS")
            c.execute("VACUUM FULL big")
        t0 = time.monotonic()
        subprocess.run([*cli, "sync", *where], check=True, stdout=subprocess.DEVNULL)
        out[how] = time.monotonic() - t0
        log(
            f"vacuum: VACUUM FULL of the {rows:,}-row table, DDL capture {how}: sync process "
            f"{out[how]:.1f}s"
        )
    return out


def main() -> int:
    if os.environ.get("SLOTLAKE_BENCH_DEBUG"):
        # Each table's steps with their seconds (slotlake.batch's _Steps), the copy's lines.
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("slotlake").setLevel(logging.DEBUG)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=1000.0, help="updates per second")
    p.add_argument("--version", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args()
    out: dict[str, Any] = {"rows": args.rows, "rate": args.rate}
    spark = build_session("slotlake-snapshot-bench")
    with LocalPostgres(version=args.version) as pg:
        dsn = pg.dsn()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(DDL)
            for lo in range(1, args.rows + 1, 500_000):
                c.execute(FILL, {"lo": lo, "hi": min(lo + 499_999, args.rows)})
            c.execute("VACUUM ANALYZE big")
        psql = find_psql(pg)
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as sink:
            subprocess.run(
                [psql, "-X", "-q", "-d", dsn, "-c", "COPY big TO STDOUT"], stdout=sink, check=True
            )
        out["floor_s"] = time.perf_counter() - t0
        log(f"floor: COPY of {args.rows:,} rows {out['floor_s']:.1f}s")
        cfg = Config(
            source=SourceConfig(dsn=dsn, slot="snapbench", publications=["pub"]),
            lake=LakeConfig(path=tempfile.mkdtemp(prefix="lake-snapbench-")),
        )
        run_bootstrap(cfg, spark=spark)
        stop, done = threading.Event(), [0]
        thread = threading.Thread(target=writer, args=(dsn, args.rows, args.rate, stop, done))
        thread.start()
        time.sleep(2)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER PUBLICATION pub ADD TABLE big")
        t_added = time.monotonic()
        syncs = []
        try:
            while True:
                t1 = time.monotonic()
                result = run_sync(cfg, spark=spark)
                syncs.append({"seconds": time.monotonic() - t1, "batch": result.batch})
                log(f"sync: batch {result.batch} in {syncs[-1]['seconds']:.1f}s")
                if result.tables and "public.big" in result.tables:
                    out["copy_sync_s"] = syncs[-1]["seconds"]
                    break
        finally:
            stop.set()
            thread.join()
        t1 = time.monotonic()
        run_sync(cfg, spark=spark)
        syncs.append({"seconds": time.monotonic() - t1, "catch_up": True})
        with psycopg.connect(dsn) as c:
            source = c.execute(DIGEST).fetchone()
        state = read_state(cfg.lake.path, "public.big")
        ids, vs = state.column("id").to_pylist(), state.column("v").to_pylist()
        with psycopg.connect(dsn) as c:
            mirrored = c.execute(
                "SELECT count(*), coalesce(sum(hashtext(i::text || v)), 0) "
                "FROM unnest(%s::int8[], %s::text[]) AS m(i, v)",
                (ids, vs),
            ).fetchone()
        out["mirror_s"] = time.monotonic() - t_added
        out["equal"] = source == mirrored
        out["updates"] = done[0]
        out["syncs"] = syncs
        out["quiet"] = quiet(dsn, cfg, args.rows)
        out["vacuum"] = vacuum(dsn, cfg, args.rows)
        shutil.rmtree(cfg.lake.path, ignore_errors=True)  # measured: its gigabytes go
    log(
        f"mirror: state == source ({out['equal']}) {out['mirror_s']:.1f}s after ADD TABLE, "
        f"{done[0]:,} updates at {args.rate:.0f}/s; the snapshot's sync {out['copy_sync_s']:.1f}s "
        f"= {out['copy_sync_s'] / out['floor_s']:.2f}× the COPY floor"
    )
    spark.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if out["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
