#!/usr/bin/env python
"""Bootstrap benchmark: the initial copy against the COPY floor, for one big table or many
small ones.

Starts a throwaway PostgreSQL, fills one 8-column table (int8 PK, text[], text with NULLs
and non-ASCII, numeric(12,2), timestamptz, bool, float8, varchar) with ``--rows`` rows —
or, with ``--tables N``, N such tables of ``--rows`` rows each — then times

* **floor**: ``psql`` running ``COPY (SELECT … FROM ONLY <table>) TO STDOUT`` for every
  table in one session, into /dev/null — the server's output functions and the wire,
  with nothing done to the rows;
* **bootstrap**: one ``slotlake bootstrap`` process, start to exit (Python start-up;
  create the slot, COPY in the exported snapshot, convert every value with the sync job's
  type mapping, write each table's Delta state and empty change log, commit). On a local
  lake every keyed table is copied on the driver (a big one streamed, ``--parallel``
  ranges at once) and no JVM starts; ``--driver-mb 0`` sends every table through Spark
  (Spark's start-up then counts too).

Both are reported in rows/s and MB/s of COPY text, with their ratio. Not a test: run by
hand (2 cores are shared with everything else on the machine; the load average is
printed with the results).

    python bench/bootstrap_bench.py [--version 15|16] [--rows N] [--tables N] [--parallel K]
                                    [--driver-mb MB] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from slotlake.localpg import LocalPostgres

DDL = """
CREATE TABLE {name} (
    id int8 PRIMARY KEY, tags text[], t text, n numeric(12,2), ts timestamptz, b bool, f float8,
    vc varchar(40)
)
"""
FILL = """
INSERT INTO {name}
SELECT i, ARRAY['tag' || i %% 10, 'x' || i %% 7],
       CASE WHEN i %% 17 = 0 THEN NULL ELSE 'row ' || i || ' ' || repeat('é', (i %% 5)::int) END,
       ((i %% 100000) - 50000) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second',
       i %% 2 = 0, i / 7.0, 'v' || md5(i::text)
FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS i
"""
COLUMNS = "id, tags, t, n, ts, b, f, vc"


def table_names(tables: int) -> list[str]:
    """``bench`` alone (the big-table scenario), or ``small_0001``… (many small tables)."""
    return [f"small_{i:04d}" for i in range(1, tables + 1)] if tables else ["bench"]


def fill(dsn: str, names: list[str], rows: int) -> float:
    """Create and fill the tables and their publication; returns the heap size in MB."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for name in names:
            c.execute(DDL.format(name=name))
            step = 500_000
            for lo in range(1, rows + 1, step):
                c.execute(FILL.format(name=name), {"lo": lo, "hi": min(lo + step - 1, rows)})
        c.execute("VACUUM ANALYZE")
        c.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(names)}")
        (table_mb,) = c.execute(
            "SELECT sum(pg_relation_size(oid)) / 1e6::float8 FROM pg_class WHERE relname = ANY(%s)",
            (names,),
        ).fetchone() or (0.0,)
    return float(table_mb)


def find_psql(cluster: LocalPostgres) -> str:
    for candidate in (
        Path(cluster.bin_dir) / "psql",
        Path("/usr/lib/postgresql/15/bin/psql"),
        Path("/usr/lib/postgresql/16/bin/psql"),
    ):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("psql")
    if found is None:
        sys.exit("no psql found (install postgresql-client or pgserver)")
    return found


def floor(psql: str, dsn: str, fmt: str, names: list[str], work: Path) -> tuple[float, int]:
    """(seconds to drain every table's COPY into /dev/null in one session, bytes of output)."""
    script = work / f"floor{len(fmt)}.sql"
    script.write_text(
        "".join(f"COPY (SELECT {COLUMNS} FROM ONLY {n}) TO STDOUT{fmt};\n" for n in names)
    )
    argv = [psql, "-X", "-q", "-d", dsn, "-f", str(script)]
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(argv, stdout=sink, check=True)
    seconds = time.perf_counter() - t0
    size = subprocess.run(
        f"{' '.join(repr(a) for a in argv)} | wc -c", shell=True, capture_output=True, check=True
    )
    return seconds, int(size.stdout.split()[0])


TABLE_LINE = re.compile(r"^(\S+): (\d+) rows, ([\d.]+) MB in ([\d.]+)s$")


def timed_command(
    dsn: str, lake: Path, parallel: int, driver_mb: int | None
) -> tuple[float, float, dict[str, tuple[int, int, float]]]:
    """One ``slotlake bootstrap`` in a process of its own, from its start to its exit (Python
    start-up, and Spark's when a table goes through Spark, included); returns its seconds
    its peak RSS in MB and each table's (rows, COPY bytes, seconds) from its output."""
    argv = [
        sys.executable,
        "-m",
        "slotlake.cli",
        "bootstrap",
        f"--parallel={parallel}",
        f"--set=source.dsn={dsn}",
        "--set=source.slot=bench",
        "--set=source.publications=pub",
        f"--set=lake.path={lake}",
    ]
    if driver_mb is not None:
        argv.append(f"--set=lake.bootstrap_driver_mb={driver_mb}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The biggest child so far: psql's are far smaller than the bootstrap.
    peak_mb = after.ru_maxrss / 1024
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"slotlake bootstrap: {seconds:.2f}s wall, {cpu:.2f}s CPU (client side)")
    sys.stdout.write(done.stderr[-2000:])
    tables = {}
    for line in done.stdout.splitlines():
        m = TABLE_LINE.match(line)
        if m:
            tables[m[1]] = (int(m[2]), int(float(m[3]) * 1e6), float(m[4]))
    return seconds, peak_mb, tables


def rates(seconds: float, rows: int, nbytes: int) -> dict[str, float]:
    return {
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "mb_per_s": round(nbytes / 1e6 / seconds, 1),
        "mb": round(nbytes / 1e6, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--version", type=int, default=16)
    ap.add_argument("--rows", type=int, default=3_000_000, help="rows per table")
    ap.add_argument("--tables", type=int, default=0, help="N small tables instead of one")
    ap.add_argument("--parallel", type=int, default=2, help="copy connections")
    ap.add_argument(
        "--driver-mb", type=int, default=None, help="lake.bootstrap_driver_mb (0: Spark only)"
    )
    ap.add_argument("--json", default=None, help="write results as JSON (- for stdout)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slotlake-bootstrap-bench-"))
    names = table_names(args.tables)
    try:
        with LocalPostgres(version=args.version) as pg:
            dsn = pg.dsn()
            t0 = time.perf_counter()
            table_mb = fill(dsn, names, args.rows)
            print(
                f"filled {len(names)} table(s) × {args.rows:,} rows ({table_mb:,.1f} MB heap) "
                f"in {time.perf_counter() - t0:.1f}s"
            )
            psql = find_psql(pg)
            floor_text_s, text_bytes = floor(psql, dsn, "", names, work)
            floor_csv_s, csv_bytes = floor(psql, dsn, " (FORMAT csv)", names, work)
            seconds, peak_mb, copied = timed_command(
                dsn, work / "lake", args.parallel, args.driver_mb
            )
            assert len(copied) == len(names), copied
            assert all(rows == args.rows for rows, _, _ in copied.values()), copied
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    rows = args.rows * len(names)
    copy_bytes = sum(nbytes for _, nbytes, _ in copied.values())
    out = {
        "postgres": args.version,
        "tables": len(names),
        "rows_per_table": args.rows,
        "rows": rows,
        "parallel": args.parallel,
        "driver_mb": args.driver_mb,
        "load_average_1m": round(load, 1),
        "floor_text": rates(floor_text_s, rows, text_bytes),
        "floor_csv": rates(floor_csv_s, rows, csv_bytes),
        # Tables are copied one after another (Spark) or several at once (driver): the
        # whole run is the figure to compare, the per-table sum shows the overlap.
        "bootstrap_total": rates(seconds, rows, copy_bytes),
        "per_table_seconds_sum": round(sum(t for _, _, t in copied.values()), 2),
        "ratio_total_vs_text_floor": round(seconds / floor_text_s, 1),
        "bootstrap_peak_rss_mb": round(peak_mb),
    }
    print()
    print(f"{'':30}{'seconds':>10}{'rows/s':>14}{'MB/s':>10}")
    for label, key in (
        ("floor: COPY text > null", "floor_text"),
        ("floor: COPY csv > null", "floor_csv"),
        ("slotlake bootstrap (process)", "bootstrap_total"),
    ):
        r = out[key]
        assert isinstance(r, dict)
        print(f"{label:30}{r['seconds']:>10.2f}{r['rows_per_s']:>14,}{r['mb_per_s']:>10.1f}")
    print(
        f"bootstrap / text floor: {out['ratio_total_vs_text_floor']}x "
        f"({len(names)} table(s), per-table times summed {out['per_table_seconds_sum']}s, "
        f"peak RSS {out['bootstrap_peak_rss_mb']} MB; "
        f"load average {out['load_average_1m']})"
    )
    if args.json == "-":
        print(json.dumps(out, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
