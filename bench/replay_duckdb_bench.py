#!/usr/bin/env python
"""Driver-lane TOAST replay benchmark: slotlake.replay_duckdb.fill_keyed_local alone.

One table of 8 columns (bigint key, text, numeric, timestamptz, text[], two TOAST-able
texts, int) with a prior state of ``--keys`` rows; a batch of ``--events`` changes: 80 %
UPDATEs (a third of them leave one or both big texts unchanged, 1 % of them move their
row to a new key), 10 % DELETEs, 10 % INSERTs of new keys. The batch is built first (not
timed); each timed run is a whole ``fill_keyed_local`` call, ``read_prior`` (an Arrow
filter of the prior table) included. Not a test: run by hand.

    python bench/replay_duckdb_bench.py [--events 10000 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from slotlake.catalog import TableCatalog
from slotlake.replay_duckdb import fill_keyed_local
from tests.replay_cases import arrow_event_schema, arrow_prior_schema

CAT = TableCatalog(
    name="public.bench",
    columns=[
        ("id", "bigint"),
        ("name", "string"),
        ("amount", "decimal(38,6)"),
        ("at", "timestamp"),
        ("tags", "array<string>"),
        ("body", "string"),
        ("note", "string"),
        ("n", "int"),
    ],
    state_columns=["id", "name", "amount", "at", "tags", "body", "note", "n"],
    key_columns=["id"],
)
EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


def values(rng: random.Random, id_: int) -> dict[str, Any]:
    return {
        "id": id_,
        "name": f"name {rng.randrange(10**6)}",
        "amount": Decimal(rng.randrange(10**9)).scaleb(-6),
        "at": EPOCH + timedelta(microseconds=rng.randrange(10**12)),
        "tags": [f"t{rng.randrange(9)}" for _ in range(rng.randrange(3))],
        "body": "b" * rng.randrange(50, 200),
        "note": "n" * rng.randrange(20, 80),
        "n": rng.randrange(1000),
    }


def batch(n_events: int, n_keys: int, seed: int = 1) -> tuple[pa.Table, pa.Table]:
    rng = random.Random(seed)
    prior = [{**values(rng, k), "_fallback": [], "_missing_toast": []} for k in range(n_keys)]
    live = list(range(n_keys))
    next_id = n_keys
    events = []
    for j in range(n_events):
        roll = rng.random()
        meta: dict[str, Any] = {
            "_commit_lsn": 1000 + j // 10,
            "_tx_ordinal": j % 10 + 1,
            "_seq": j,
            "_fallback": [],
            "_missing_toast": [],
            "_unchanged": [],
        }
        if roll < 0.1 or not live:
            row = {**values(rng, next_id), **meta, "_op": "I"}
            live.append(next_id)
            next_id += 1
        elif roll < 0.2:
            k = live.pop(rng.randrange(len(live)))
            row = {**meta, "_op": "D", "_old_kind": "K", "_old": {"id": k}}
        else:
            k = rng.choice(live)
            row = {**values(rng, k), **meta, "_op": "U"}
            if rng.random() < 0.01:
                live.remove(k)
                live.append(next_id)
                row.update(id=next_id, _old_kind="K", _old={"id": k})
                next_id += 1
            if rng.random() < 1 / 3:
                row["_unchanged"] = rng.choice([["body"], ["note"], ["body", "note"]])
                for c in row["_unchanged"]:
                    row[c] = None
        events.append(row)
    return (
        pa.Table.from_pylist(events, arrow_event_schema(CAT)),
        pa.Table.from_pylist(prior, arrow_prior_schema(CAT)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--keys", type=int, default=0, help="prior rows (default: events / 2)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for n in args.events:
        events, prior = batch(n, args.keys or n // 2)

        def read_prior(wanted: list[Any], want_null: bool, prior: pa.Table = prior) -> pa.Table:
            return prior.filter(pc.is_in(prior.column("id"), pa.array(wanted, pa.int64())))

        fill_keyed_local(events, read_prior, CAT, [])  # warm-up: imports, first connection
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            changes, finals = fill_keyed_local(events, read_prior, CAT, [])
            times.append(time.perf_counter() - start)
        print(
            f"{n:>7} events, {prior.num_rows} prior rows → {changes.num_rows} changes, "
            f"{finals.num_rows} finals: median {statistics.median(times):.3f} s, "
            f"min {min(times):.3f} s, max {max(times):.3f} s ({args.repeat} runs)"
        )


if __name__ == "__main__":
    main()
