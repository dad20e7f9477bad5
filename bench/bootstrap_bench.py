#!/usr/bin/env python
"""Bootstrap benchmark: the initial copy of a multi-million-row table vs the COPY floor.

Starts a throwaway PostgreSQL, fills one 8-column table (int8 PK, int4, text with NULLs
and non-ASCII, numeric(12,2), timestamptz, bool, float8, varchar) with ``--rows`` rows,
then times

* **floor**: ``psql -c "COPY (SELECT … FROM ONLY bench) TO STDOUT" > /dev/null`` — the
  server's output functions and the wire, with nothing done to the rows;
* **bootstrap**: ``slotlake.bootstrap.run_bootstrap`` for the table's copy (create the
  slot, COPY in the exported snapshot over ``--parallel`` connections as Spark tasks,
  convert every value with the sync job's type mapping, write the state Parquet).

Both are reported in rows/s and MB/s of COPY text, with their ratio. Not a test: run by
hand (2 cores are shared with everything else on the machine; the load average is
printed with the results).

    python bench/bootstrap_bench.py [--version 15|16] [--rows N] [--parallel K] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from slotlake.bootstrap import run_bootstrap
from slotlake.config import Config, LakeConfig, SourceConfig
from slotlake.localpg import LocalPostgres

DDL = """
CREATE TABLE bench (
    id int8 PRIMARY KEY, i4 int4, t text, n numeric(12,2), ts timestamptz, b bool, f float8,
    vc varchar(40)
)
"""
FILL = """
INSERT INTO bench
SELECT i, (i * 7919) %% 2000000 - 1000000,
       CASE WHEN i %% 17 = 0 THEN NULL ELSE 'row ' || i || ' ' || repeat('é', (i %% 5)::int) END,
       ((i %% 100000) - 50000) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second',
       i %% 2 = 0, i / 7.0, 'v' || md5(i::text)
FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS i
"""
COLUMNS = "id, i4, t, n, ts, b, f, vc"


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


def floor(psql: str, dsn: str, fmt: str) -> tuple[float, int]:
    """(seconds to drain COPY into /dev/null, bytes of COPY output)."""
    query = f"COPY (SELECT {COLUMNS} FROM ONLY bench) TO STDOUT{fmt}"
    argv = [psql, "-X", "-q", "-d", dsn, "-c", query]
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(argv, stdout=sink, check=True)
    seconds = time.perf_counter() - t0
    size = subprocess.run(
        f"{' '.join(repr(a) for a in argv)} | wc -c", shell=True, capture_output=True, check=True
    )
    return seconds, int(size.stdout.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--version", type=int, default=16)
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--parallel", type=int, default=2, help="copy connections (Spark tasks)")
    ap.add_argument("--json", default=None, help="write results as JSON (- for stdout)")
    args = ap.parse_args()

    from slotlake.spark import build_session

    spark = build_session("slotlake-bootstrap-bench")
    work = Path(tempfile.mkdtemp(prefix="slotlake-bootstrap-bench-"))
    try:
        with LocalPostgres(version=args.version) as pg:
            dsn = pg.dsn()
            t0 = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(DDL)
                step = 500_000
                for lo in range(1, args.rows + 1, step):
                    c.execute(FILL, {"lo": lo, "hi": min(lo + step - 1, args.rows)})
                c.execute("VACUUM ANALYZE bench")
                c.execute("CREATE PUBLICATION pub FOR TABLE bench")
                (table_mb,) = c.execute(
                    "SELECT pg_relation_size('bench') / 1e6::float8"
                ).fetchone() or (0.0,)
            print(
                f"filled {args.rows:,} rows ({table_mb:,.0f} MB heap) in {time.perf_counter() - t0:.1f}s"
            )
            psql = find_psql(pg)
            floor_text_s, text_bytes = floor(psql, dsn, "")
            floor_csv_s, csv_bytes = floor(psql, dsn, " (FORMAT csv)")
            cfg = Config(
                source=SourceConfig(dsn=dsn, slot="bench", publications=["pub"]),
                lake=LakeConfig(path=str(work / "lake")),
            )
            result = run_bootstrap(cfg, spark=spark, parallel=args.parallel, progress=print)
            copy = result.tables["public.bench"]
            assert copy.rows == args.rows, (copy.rows, args.rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    rows = args.rows
    out = {
        "postgres": args.version,
        "rows": rows,
        "parallel": args.parallel,
        "load_average_1m": round(load, 1),
        "floor_text": {
            "seconds": round(floor_text_s, 2),
            "rows_per_s": round(rows / floor_text_s),
            "mb_per_s": round(text_bytes / 1e6 / floor_text_s, 1),
            "mb": round(text_bytes / 1e6, 1),
        },
        "floor_csv": {
            "seconds": round(floor_csv_s, 2),
            "rows_per_s": round(rows / floor_csv_s),
            "mb_per_s": round(csv_bytes / 1e6 / floor_csv_s, 1),
            "mb": round(csv_bytes / 1e6, 1),
        },
        "bootstrap_copy": {
            "seconds": round(copy.seconds, 2),
            "rows_per_s": round(rows / copy.seconds),
            "mb_per_s": round(copy.bytes / 1e6 / copy.seconds, 1),
            "mb": round(copy.bytes / 1e6, 1),
            "ranges": copy.ranges,
        },
        "bootstrap_total_seconds": round(result.seconds, 2),
        "ratio_copy_vs_text_floor": round(copy.seconds / floor_text_s, 1),
    }
    print()
    print(f"{'':28}{'seconds':>10}{'rows/s':>14}{'MB/s':>10}")
    for label, key in (
        ("floor: COPY text > null", "floor_text"),
        ("floor: COPY csv > null", "floor_csv"),
        ("bootstrap copy (→ Parquet)", "bootstrap_copy"),
    ):
        r = out[key]
        assert isinstance(r, dict)
        print(f"{label:28}{r['seconds']:>10.2f}{r['rows_per_s']:>14,}{r['mb_per_s']:>10.1f}")
    print(
        f"bootstrap copy / text floor: {out['ratio_copy_vs_text_floor']}x "
        f"(total bootstrap incl. slot and commit {out['bootstrap_total_seconds']}s; "
        f"load average {out['load_average_1m']})"
    )
    if args.json == "-":
        print(json.dumps(out, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
