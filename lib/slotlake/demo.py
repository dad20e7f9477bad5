"""``slotlake demo``: a throwaway PostgreSQL, a workload, several sync batches, a proof.

Everything is local: the cluster lives in a temporary directory and is removed at the
end; the lake goes to --lake (kept) or a temporary directory (removed).
"""

from __future__ import annotations

import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE customers (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL,
    email       varchar(200),
    balance     numeric(12,2),
    mood        mood,
    created_at  timestamptz DEFAULT now(),
    active      boolean,
    tags        text[]
);
-- TOAST-heavy: the body is stored out of line and left out of UPDATEs that do not touch it.
CREATE TABLE documents (
    id       bigint PRIMARY KEY,
    title    text,
    body     text,
    version  int
);
ALTER TABLE documents ALTER COLUMN body SET STORAGE EXTERNAL;
-- No key: REPLICA IDENTITY FULL, a multiset.
CREATE TABLE audit_log (kind text, detail jsonb, at timestamptz);
ALTER TABLE audit_log REPLICA IDENTITY FULL;
CREATE PUBLICATION slotlake FOR TABLE customers, documents, audit_log;
"""


def _big_text(rng: random.Random, n: int = 12_000) -> str:
    # Incompressible, so PostgreSQL must store it out of line.
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


def workload(conn, rng: random.Random, round_no: int, rows: int) -> None:  # type: ignore[no-untyped-def]
    moods = ["sad", "ok", "happy"]
    with conn.transaction():
        conn.cursor().executemany(
            "INSERT INTO customers (name, email, balance, mood, active, tags) VALUES (%s, %s, %s, %s, %s, %s)",
            [
                (
                    f"customer {round_no}-{i} ✓",
                    f"c{round_no}_{i}@example.com",
                    round(rng.uniform(-1000, 1000), 2),
                    rng.choice(moods),
                    rng.random() < 0.5,
                    [f"t{rng.randint(0, 9)}", "x,y", None] if i % 7 == 0 else [],
                )
                for i in range(rows)
            ],
        )
    with conn.transaction():
        base = round_no * 1000
        conn.cursor().executemany(
            "INSERT INTO documents (id, title, body, version) VALUES (%s, %s, %s, 1)",
            [(base + i, f"doc {base + i}", _big_text(rng)) for i in range(20)],
        )
    with conn.transaction():
        conn.execute("UPDATE customers SET balance = balance + 1, mood = 'happy' WHERE id % 5 = 0")
        conn.execute("DELETE FROM customers WHERE id % 11 = 0")
        # Touches only the title: the body arrives as unchanged TOAST.
        conn.execute("UPDATE documents SET title = title || ' (edited)', version = version + 1")
        conn.execute(
            "INSERT INTO audit_log SELECT 'round', jsonb_build_object('round', %s::int), now()"
            " FROM generate_series(1, 3)",
            (round_no,),
        )
    with conn.transaction():
        conn.execute(
            "UPDATE audit_log SET detail = detail || '{\"seen\": true}' WHERE kind = 'round'"
        )
        conn.execute("DELETE FROM audit_log WHERE ctid IN (SELECT ctid FROM audit_log LIMIT 1)")
    # A rolled-back transaction leaves no trace in the lake.
    try:
        with conn.transaction():
            conn.execute("INSERT INTO customers (name) VALUES ('never committed')")
            raise RuntimeError("rollback")
    except RuntimeError:
        pass


def run_demo(
    lake: str | None = None, pg_version: int | None = None, rows: int = 2000, batches: int = 3
) -> int:
    import psycopg

    from slotlake.config import Config, LakeConfig, SourceConfig
    from slotlake.lake import Lake, read_changes
    from slotlake.localpg import LocalPostgres
    from slotlake.spark import build_session
    from slotlake.sync import run_sync
    from slotlake.verify import compare_table

    tmp = None
    if lake is None:
        tmp = tempfile.mkdtemp(prefix="slotlake-demo-")
        lake = str(Path(tmp) / "lake")
    # Before any server starts: a lake of the old layout raises OldLayoutError (one line),
    # and a lake with commits belongs to another slot's history (the demo's slot is new).
    if Lake(lake).last_commit() is not None:
        print(
            f"slotlake demo: {lake} already holds a lake with committed batches: "
            "give the demo a new --lake directory",
            file=sys.stderr,
        )
        return 2
    rng = random.Random(42)
    print(
        f"slotlake demo: starting a throwaway PostgreSQL {pg_version or '(newest available)'}",
        flush=True,
    )
    ok = True
    with LocalPostgres(version=pg_version) as pg:
        dsn = pg.create_database("demo")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute("SELECT pg_create_logical_replication_slot('slotlake', 'pgoutput')")
            cfg = Config(
                source=SourceConfig(dsn=dsn, slot="slotlake", publications=["slotlake"]),
                lake=LakeConfig(path=lake),
            )
            print(f"PostgreSQL {pg.version} on port {pg.port}; lake at {lake}", flush=True)
            spark = build_session("slotlake-demo")
            for b in range(batches):
                t0 = time.monotonic()
                workload(conn, rng, b, rows)
                print(
                    f"round {b + 1}: workload done in {time.monotonic() - t0:.1f}s; syncing",
                    flush=True,
                )
                result = run_sync(cfg, spark=spark, progress=lambda m: print("  " + m, flush=True))
                print(
                    f"round {b + 1}: {result.status}, batch {result.batch}, {result.messages} messages",
                    flush=True,
                )
            print("\nper table: change-log rows, state rows, Delta versions, mirror check")
            last = Lake(lake).last_commit()
            assert last is not None
            for table in ("public.customers", "public.documents", "public.audit_log"):
                changes = read_changes(lake, table)
                missing = sum(1 for m in changes.column("_missing_toast").to_pylist() if m)
                cmp = compare_table(conn, lake, table)
                ok = ok and cmp.equal and missing == 0
                t = last.tables[table]
                print(
                    f"  {table:<20} {changes.num_rows:>7} changes  {cmp.lake_rows:>6} rows  "
                    f"(state v{t.state_version}, changes v{t.changes_version})  "
                    f"{'OK: state equals source' if cmp.equal else 'MISMATCH ' + cmp.describe()}"
                    f"{'' if not missing else f'  ({missing} rows with missing TOAST)'}"
                )
            spark.stop()
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\ndemo " + ("succeeded: the mirror equals the source" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo())
