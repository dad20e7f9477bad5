"""slotlake.multiset_arrow.multiset_state (the driver's multiset replay) against Spark's
slotlake.state.merge_multiset, on random batches over a REPLICA IDENTITY FULL table.

Values repeat on purpose (duplicates are the point of a multiset), floats come as -0.0,
0.0 and NaN, inside arrays too, and a timestamp may be NULL with a value text
('infinity'): rows equal but for their text must stay apart, and -0.0 must match 0.0
as Spark's grouping matches them. DELETEs of rows that are not there (a ghost) and
TRUNCATEs in the middle of a batch are drawn as well.
"""

from __future__ import annotations

import copy
import json
import random
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from slotlake.batch import _state_schema
from slotlake.decode import arrow_schema_for
from slotlake.delta import DRIVER_ENGINE
from slotlake.lake import COPIES
from slotlake.multiset_arrow import multiset_state, multiset_table
from slotlake.state import merge_multiset
from tests.integration.test_state_transforms import event, events_df, make_catalog, state_df

INT4, TEXT, FLOAT8, FLOAT8_ARRAY, TIMESTAMPTZ = 23, 25, 701, 1022, 1184
CAT = make_catalog(
    ("a", INT4, True),
    ("f", FLOAT8, True),
    ("arr", FLOAT8_ARRAY, True),
    ("ts", TIMESTAMPTZ, True),
    ("b", TEXT, True),
    identity="f",
)
COLUMNS = list(CAT.state_columns)
TS = datetime(2024, 5, 1, tzinfo=timezone.utc)
NAN = float("nan")
# (values, value texts): the pool rows are drawn from.
POOL: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({"a": 1, "f": 0.0, "arr": [0.0, 1.5], "ts": TS, "b": "x"}, {}),
    ({"a": 1, "f": -0.0, "arr": [-0.0, 1.5], "ts": TS, "b": "x"}, {}),
    ({"a": 2, "f": NAN, "arr": [NAN], "ts": None, "b": None}, {}),
    ({"a": 2, "f": NAN, "arr": [NAN], "ts": None, "b": None}, {"ts": "infinity"}),
    ({"a": 2, "f": NAN, "arr": [NAN], "ts": None, "b": None}, {"ts": "-infinity"}),
    ({"a": 3, "f": 2.5, "arr": None, "ts": TS, "b": ""}, {}),
    ({"a": 3, "f": 2.5, "arr": [], "ts": TS, "b": ""}, {}),
    ({"a": None, "f": None, "arr": None, "ts": None, "b": "é"}, {}),
]


def random_batch(seed: int) -> tuple[list[tuple[Any, ...]], list[int], list[tuple[int, int]]]:
    rng = random.Random(seed)
    prior = [rng.randrange(len(POOL)) for _ in range(rng.randrange(0, 12))]
    rows = []
    commit = 100
    for _ in range(rng.randrange(1, 25)):
        commit += rng.randrange(1, 3)
        for ordinal in range(1, rng.randrange(2, 5)):
            op = rng.choice("IUUDD")
            new_values, new_texts = POOL[rng.randrange(len(POOL))]
            old_values, old_texts = POOL[rng.randrange(len(POOL))]
            texts = dict(new_texts) if op != "D" else {}
            if op != "I":
                texts.update({f"_old.{k}": v for k, v in old_texts.items()})
            rows.append(
                event(
                    CAT,
                    op,
                    commit,
                    ordinal,
                    new_values if op != "D" else None,
                    old=old_values if op != "I" else None,
                    old_kind="O" if op != "I" else None,
                    fallback=texts,
                )
            )
    truncations = []
    if rng.random() < 0.25:
        truncations.append((rng.randrange(100, commit + 1), rng.randrange(0, 4)))
    return rows, prior, truncations


def canon(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as sorted texts: maps by their entries, floats by repr (-0.0 and 0.0 differ)."""

    def one(r: dict[str, Any]) -> str:
        fb = r["_fallback"]
        fb = sorted(fb.items() if isinstance(fb, dict) else fb)
        return json.dumps({**r, "_fallback": fb}, default=repr, sort_keys=True)

    return sorted(one(r) for r in rows)


def expanded(state: pa.Table) -> list[dict[str, Any]]:
    out = []
    for r in state.to_pylist():
        copies = r.pop(COPIES)
        out.extend([r] * copies)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_match_spark(spark, seed: int) -> None:  # type: ignore[no-untyped-def]
    rows, picks, truncations = random_batch(seed)
    prior_rows = [(*(POOL[i][0][c] for c in COLUMNS), dict(POOL[i][1]), []) for i in picks]
    prior_df = state_df(spark, CAT, prior_rows)
    events = events_df(spark, CAT, rows)
    theirs = merge_multiset(events, prior_df, CAT, truncations).toArrow()

    state = arrow_schema_for(_state_schema(CAT))
    prior = multiset_table(prior_df.toArrow(), COLUMNS) if prior_rows else None
    ours = multiset_state(events.toArrow(), prior, CAT, truncations, state)
    assert ours.schema == state
    assert all(c > 0 for c in ours.column(COPIES).to_pylist())
    assert all(m == [] for m in ours.column("_missing_toast").to_pylist())

    def values(rows: list[dict[str, Any]]) -> list[str]:
        return canon([{k: v for k, v in r.items() if k != "_missing_toast"} for r in rows])

    assert values(expanded(ours)) == values(theirs.to_pylist())


def test_driver_multiset_through_ddl(pg_dsn: str, slot: str, spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A table without a key, done on the driver batch after batch through ADD COLUMN,
    RENAME COLUMN and DROP COLUMN (which makes two distinct rows one value): the mirror
    equals the source after each, and no batch needed Spark's MERGE."""
    import psycopg
    from deltalake import DeltaTable, QueryBuilder

    from slotlake.lake import Lake, read_state
    from slotlake.sync import run_sync
    from tests.integration.sync_helpers import assert_mirror, make_config

    lake = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, lake, slot)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE bag (a int, b text, f float8)")
        c.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR TABLE bag")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute(
            "INSERT INTO bag VALUES (1, 'x', 0.0), (1, 'x', -0.0), (1, 'y', 'NaN'), (2, NULL, 1)"
        )
        # A DDL reaches the lake with the table's next change (its Relation message).
        steps = [
            "UPDATE bag SET f = 5 WHERE b = 'y'",
            "ALTER TABLE bag ADD COLUMN n int; UPDATE bag SET n = 7 WHERE a = 2",
            "INSERT INTO bag VALUES (1, 'x', 0, NULL), (3, 'z', NULL, 1)",
            "ALTER TABLE bag RENAME COLUMN b TO label;"
            " DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 1 AND label = 'x')",
            "ALTER TABLE bag DROP COLUMN f; UPDATE bag SET label = 'y' WHERE label = 'x'",
        ]
        # The first two batches through Spark (its MERGE leaves deletion vectors), the
        # others on the driver, which reads that state.
        in_spark = copy.deepcopy(cfg)
        in_spark.lake.driver_write_rows = 0
        assert run_sync(in_spark, spark=spark).status == "committed"
        assert_mirror(c, lake, ["public.bag"])
        for i, statement in enumerate(steps):
            c.execute(statement)
            assert run_sync(in_spark if i == 0 else cfg, spark=spark).status == "committed"
            assert_mirror(c, lake, ["public.bag"])
    state = read_state(lake, "public.bag")
    assert sorted((r["a"], r["label"], r["n"]) for r in state.to_pylist()) == [
        (1, "y", None),
        (1, "y", None),
        (1, "y", None),
        (2, None, 7),
        (3, "z", 1),
    ]
    record = Lake(lake).last_commit()
    assert record is not None
    table = DeltaTable(Lake(lake).path(record.tables["public.bag"].state))
    # Once f is dropped, (1, 'y') rows that differed only in f are one value with copies.
    rows = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    distinct = {(r["a"], r["label"], r["n"]): r[COPIES] for r in rows.to_pylist()}
    assert distinct == {(1, "y", None): 3, (2, None, 7): 1, (3, "z", 1): 1}
    history = table.history()
    writes = [h for h in history if h.get("operation") in ("MERGE", "WRITE")]
    by = [(h.get("engineInfo") == DRIVER_ENGINE, h["operation"]) for h in writes]
    # history() is newest first: four rebuilds by the driver after Spark's two MERGEs.
    assert by == [(True, "WRITE")] * 4 + [(False, "MERGE")] * 2, by
