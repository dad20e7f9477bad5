#!/usr/bin/env python
"""Executor-side decode benchmark: ``make_decoder``'s function over raw DML batches.

What ``mapInArrow`` runs on the executors for one table: each raw payload decoded with
the shared pgoutput decoder, every column value converted to its typed column, and the
change rows built as Arrow RecordBatches. Starts a throwaway PostgreSQL, writes a
workload on an 8-column table (bigint, text, numeric(12,2), float8, boolean, timestamptz,
text[], varchar) with a sprinkling of values that fall back (NaN, ±Infinity,
'infinity', BC), peeks the same backlog twice — ``binary`` off and on — through
``RawWriter`` (the pull's raw Parquet), and times the decoder over Arrow batches of
10,000 rows (Spark's ``maxRecordsPerBatch``). Not a test: run it by hand.

    python bench/convert_bench.py [--version 15|16] [--rows N] [--repeat K] [--corpus PATH]
    python bench/convert_bench.py --corpus /tmp/conv.pkl --against main   # before/after
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# The sibling benchmark's alternating best-of timer and its log line (bench/ is on sys.path
# when this file is run as a script).
from decode_bench import log, time_interleaved

from slotlake.decode import (
    DML_TYPES,
    arrow_schema_for,
    change_schema,
    collect_catalog,
    scan_raw,
)
from slotlake.localpg import LocalPostgres
from slotlake.raw import RawWriter, raw_files
from slotlake.source import SESSION_SETTINGS

TABLE = "public.conv"
DDL = """
CREATE TABLE conv (
    id int8 PRIMARY KEY,
    t text,
    n numeric(12,2),
    f float8,
    b bool,
    ts timestamptz,
    ta text[],
    vc varchar(40)
)
"""
# Values vary per row (lengths, NULLs, signs, quoting in the arrays); about one row in
# 300 carries a value the typed column cannot hold, so the fallback path is exercised at
# a realistic (small) rate.
INSERT = """
INSERT INTO conv
SELECT i,
       CASE WHEN i %% 17 = 0 THEN NULL ELSE 'row ' || i || ' ' || repeat('é', (i %% 5)::int) END,
       CASE WHEN i %% 997 = 0 THEN 'NaN'::numeric ELSE ((i %% 100000) - 50000) / 100.0 END,
       CASE WHEN i %% 991 = 0 THEN 'Infinity'::float8 WHEN i %% 983 = 0 THEN 'NaN'::float8
            ELSE i / 7.0 END,
       i %% 2 = 0,
       CASE WHEN i %% 977 = 0 THEN 'infinity'::timestamptz
            WHEN i %% 971 = 0 THEN timestamptz '0044-03-15 12:00:00+00 BC'
            ELSE timestamptz '2024-01-01 00:00:00+00' + i * interval '1.25 second' END,
       CASE WHEN i %% 11 = 0 THEN NULL
            WHEN i %% 5 = 0 THEN ARRAY['a' || i, 'tag ' || (i %% 7), NULL]
            ELSE ARRAY['a' || i, 't' || (i %% 7)] END,
       'v' || md5(i::text)
FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS i
"""
UPDATE = (
    "UPDATE conv SET t = coalesce(t, '') || '+', f = f + 1, b = NOT b "
    "WHERE id BETWEEN %(lo)s AND %(hi)s"
)
DELETE = "DELETE FROM conv WHERE id BETWEEN %(lo)s AND %(hi)s"
BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default


def build_corpus(version: int, target: int, txn_rows: int) -> dict[str, Any]:
    """Run the workload, peek it with binary off and on: the payloads of both peeks."""
    with LocalPostgres(version=version) as cluster:
        dsn = cluster.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for key, value in SESSION_SETTINGS.items():
                conn.execute("SELECT set_config(%s, %s, false)", (key, value))
            server_version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            conn.execute(DDL)
            conn.execute("CREATE PUBLICATION bench_pub FOR TABLE conv")
            for slot in ("bench_text", "bench_binary"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            per_cycle = txn_rows * 2 + txn_rows // 2
            cycles = max(1, -(-target // per_cycle))
            started = time.monotonic()
            for c in range(cycles):
                lo, hi = c * txn_rows + 1, (c + 1) * txn_rows
                conn.execute(INSERT, {"lo": lo, "hi": hi})
                conn.execute(UPDATE, {"lo": lo, "hi": hi})
                conn.execute(DELETE, {"lo": lo, "hi": lo + txn_rows // 2 - 1})
            conn.execute("SET synchronous_commit = on")
            conn.execute("CREATE TEMP TABLE bench_flush ()")
            log(f"workload: {cycles} cycles in {time.monotonic() - started:.1f}s; peeking…")
            peeks = {}
            for fmt in ("text", "binary"):
                cur = conn.execute(
                    "SELECT lsn::text, xid::text::int8, data FROM "
                    "pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                    "'publication_names', 'bench_pub', 'binary', %s)",
                    (f"bench_{fmt}", "true" if fmt == "binary" else "false"),
                )
                peeks[fmt] = [(lsn, xid, bytes(data)) for lsn, xid, data in cur]
                log(f"peek ({fmt}): {len(peeks[fmt]):,} messages")
    return {"server_version": server_version, "peeks": peeks}


def raw_batches(
    rows: list[tuple[str, int, bytes]], workdir: Path
) -> tuple[list[pa.RecordBatch], Any]:
    """The peek through RawWriter (as the pull stores it), then the table's DML rows in
    Arrow batches of BATCH_ROWS and its catalog, as the driver and executors see them."""
    from slotlake.lsn import Lsn

    directory = workdir / "raw"
    with RawWriter(directory, background=False) as writer:
        writer.append(
            [int(Lsn.parse(lsn)) for lsn, _, _ in rows],
            [x for _, x, _ in rows],
            [d for _, _, d in rows],
        )
    scan = scan_raw(str(directory))
    bcat = collect_catalog(scan.catalog_rows, batch=1)
    table = pa.concat_tables(pq.read_table(f) for f in raw_files(str(directory)))
    dml = table.filter(pc.is_in(table.column("msg_type"), pa.array(list(DML_TYPES))))
    dml = dml.drop_columns(["msg_type"])
    return dml.to_batches(max_chunksize=BATCH_ROWS), bcat


Runner = Callable[[list[pa.RecordBatch]], int]


def decode_all(module: Any, bcat: Any, batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``module.make_decoder``'s function over the table's batches, as mapInArrow runs it."""
    cat = bcat.tables[TABLE]
    schema = arrow_schema_for(change_schema(cat))
    return module.make_decoder(cat, bcat.streams, bcat.origins, 1, schema)(iter(batches))


def runner(module: Any, bcat: Any) -> Runner:
    def run(batches: list[pa.RecordBatch]) -> int:
        return sum(rb.num_rows for rb in decode_all(module, bcat, batches))

    return run


def decode_only(batches: list[pa.RecordBatch]) -> int:
    """The floor: the payloads decoded into messages, nothing converted or built."""
    from slotlake.pgoutput import decode

    rows = 0
    for rb in batches:
        for data in rb.column("data").to_pylist():
            decode(data, False)
            rows += 1
    return rows


def module_at(ref: str) -> Any:
    """slotlake/decode.py as it is at git ``ref``, loaded beside the current one."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{ref}:lib/slotlake/decode.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader(f"decode_at_{ref}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:lib/slotlake/decode.py", "exec"), module.__dict__)
    return module


def comparable(array: pa.Array) -> pa.Array:
    """``array`` with floats as their bit patterns: NaN never equals itself in ``equals``,
    and the bits show the two decoders' NaNs are the very same."""
    if pa.types.is_floating(array.type):
        return array.view(pa.int32() if array.type.bit_width == 32 else pa.int64())
    if pa.types.is_struct(array.type):
        children = [comparable(array.field(i)) for i in range(array.type.num_fields)]
        names = [f.name for f in array.type]
        return pa.StructArray.from_arrays(children, names=names, mask=array.is_null())
    return array


def same_output(a: list[pa.RecordBatch], b: list[pa.RecordBatch]) -> bool:
    left, right = pa.Table.from_batches(a), pa.Table.from_batches(b)
    return left.schema == right.schema and all(
        comparable(x.combine_chunks()).equals(comparable(y.combine_chunks()))
        for x, y in zip(left.columns, right.columns, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    import slotlake.decode as current

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, default=16, help="PostgreSQL major (15 or 16)")
    parser.add_argument("--rows", type=int, default=200_000, help="DML payloads (≈)")
    parser.add_argument("--txn-rows", type=int, default=10_000, help="rows per transaction")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs each (best)")
    parser.add_argument(
        "--corpus", metavar="PATH", help="pickle of the peeks: load if it exists, else save"
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also time decode.py at this git ref (e.g. main), alternating",
    )
    parser.add_argument("--json", metavar="PATH", help="write results as JSON ('-' = stdout)")
    args = parser.parse_args(argv)

    if args.corpus and Path(args.corpus).exists():
        with open(args.corpus, "rb") as fh:
            corpus = pickle.load(fh)
        log(f"corpus from {args.corpus}")
    else:
        corpus = build_corpus(args.version, args.rows, args.txn_rows)
        if args.corpus:
            with open(args.corpus, "wb") as fh:
                pickle.dump(corpus, fh, protocol=pickle.HIGHEST_PROTOCOL)

    modules = {"current": current}
    if args.against:
        modules[args.against] = module_at(args.against)
    results: dict[str, Any] = {
        "server_version": corpus["server_version"],
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "repeat": args.repeat,
        "formats": {},
    }
    for fmt, rows in corpus["peeks"].items():
        with tempfile.TemporaryDirectory() as tmp:
            batches, bcat = raw_batches(rows, Path(tmp))
        runners = {name: (runner(m, bcat), batches) for name, m in modules.items()}
        runners["decode only"] = (decode_only, batches)
        if len(modules) > 1:
            outputs = [list(decode_all(m, bcat, batches)) for m in modules.values()]
            assert all(same_output(outputs[0], o) for o in outputs[1:]), f"{fmt}: outputs differ"
        nbytes = sum(rb.column("data").nbytes for rb in batches)
        best = time_interleaved(runners, args.repeat)
        results["formats"][fmt] = {
            name: {
                "rows": count,
                "payload_mb": round(nbytes / 1e6, 1),
                "seconds": round(seconds, 3),
                "rows_per_s": round(count / seconds),
            }
            for name, (seconds, count) in best.items()
        }
    print(
        f"\nPostgreSQL {results['server_version']}, CPython {results['python']}, pyarrow {results['pyarrow']}, best of {args.repeat}"
    )
    print(f"{'format':<7} {'decoder':<12} {'rows':>9} {'seconds':>8} {'rows/s':>9}")
    for fmt, per in results["formats"].items():
        for name, r in per.items():
            print(f"{fmt:<7} {name:<12} {r['rows']:>9,} {r['seconds']:>8.2f} {r['rows_per_s']:>9,}")
    if args.json == "-":
        print(json.dumps(results))
    elif args.json:
        Path(args.json).write_text(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
