#!/usr/bin/env python
"""DDL capture benchmark: what the event trigger adds to a DDL command's own time.

On one throwaway PostgreSQL, a table partitioned into ``--partitions`` leaves of
``--columns`` columns each (the case where the trigger does the most: its message names
every partition below the table with its columns, fast defaults and ``pg_inherits``
path) and a plain table of the same columns. Each timed command is an
``ALTER TABLE … ADD COLUMN … DEFAULT`` (the trigger reads the catalog after it), run
``--repeat`` times without the trigger and with it; the fastest of each counts. Reports
the seconds of each and the size of the message the trigger put in the WAL.

Not a test: run by hand.

    python bench/ddl_capture_bench.py [--partitions 1000] [--columns 10] [--repeat 3]
                                      [--version 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from slotlake import ddl
from slotlake.localpg import LocalPostgres


def timed_adds(c: psycopg.Connection[Any], table: str, tag: str, repeat: int) -> float:
    """The fastest of ``repeat`` ADD COLUMN … DEFAULT on ``table``."""
    best = float("inf")
    for i in range(repeat):
        t0 = time.monotonic()
        c.execute(f"ALTER TABLE {table} ADD COLUMN {tag}_{i} int DEFAULT {i}")
        best = min(best, time.monotonic() - t0)
    return best


def message_sizes(c: psycopg.Connection[Any], slot: str) -> list[int]:
    """Bytes of each logical message in the slot (peeked, not consumed)."""
    rows = c.execute(
        "SELECT length(data) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'none', 'messages', 'true') "
        "WHERE get_byte(data, 0) = 77",  # 'M'
        (slot,),
    ).fetchall()
    return [int(r[0]) for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--columns", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--version", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args(argv)
    pg = LocalPostgres(version=args.version).start()
    out: dict[str, Any] = {"partitions": args.partitions, "columns": args.columns}
    try:
        dsn = pg.create_database("ddl_bench")
        with psycopg.connect(dsn, autocommit=True) as c:
            cols = ", ".join(f"c{i} int" for i in range(args.columns))
            c.execute(f"CREATE TABLE plain (id int PRIMARY KEY, {cols})")
            c.execute(f"CREATE TABLE p (id int, k int, {cols}) PARTITION BY RANGE (k)")
            for i in range(args.partitions):
                c.execute(
                    f"CREATE TABLE p{i} PARTITION OF p FOR VALUES FROM ({i * 10}) TO ({i * 10 + 10})"
                )
            c.execute("SELECT pg_create_logical_replication_slot('ddl_bench', 'pgoutput')")
            for trigger in (False, True):
                if trigger:
                    ddl.install(c)
                key = "trigger" if trigger else "no_trigger"
                out[key] = {
                    "plain_s": timed_adds(c, "plain", f"a{int(trigger)}", args.repeat),
                    "partitioned_s": timed_adds(c, "p", f"b{int(trigger)}", args.repeat),
                }
            sizes = message_sizes(c, "ddl_bench")
            # The plain table's messages come first, then the partitioned table's.
            out["message_bytes"] = {
                "plain": max(sizes[: args.repeat], default=0),
                "partitioned": max(sizes[args.repeat :], default=0),
            }
            c.execute("SELECT pg_drop_replication_slot('ddl_bench')")
    finally:
        pg.stop()
    n, t = out["no_trigger"], out["trigger"]
    print(
        f"ALTER TABLE … ADD COLUMN … DEFAULT, fastest of {args.repeat}: plain table "
        f"{n['plain_s'] * 1000:.1f} → {t['plain_s'] * 1000:.1f} ms with the trigger "
        f"(message {out['message_bytes']['plain']:,} B); partitioned into "
        f"{args.partitions:,} leaves {n['partitioned_s']:.3f} → {t['partitioned_s']:.3f} s "
        f"(message {out['message_bytes']['partitioned']:,} B)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
