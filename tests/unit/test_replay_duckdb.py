"""slotlake.replay_duckdb.fill_keyed_local without Spark: the hand-built cases of
tests/replay_cases.py and a randomized comparison with slotlake.toast.replay (the oracle).

The cases key rows by strings (``_k_before``/``_k_after``); here those strings become the
values of a key column ``key`` (new image) and ``_old.key`` (old image), so the keys go
through the real derivation (with_keys' images) before the replay.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slotlake.catalog import TableCatalog
from slotlake.replay_duckdb import fill_keyed_local
from tests.replay_cases import (
    COLS,
    HAND_BUILT,
    arrow_event_schema,
    arrow_prior_schema,
    change_tuple,
    final_tuple,
    full_finals,
    oracle,
    prior,
    random_batch,
)

DATA = ["key", *COLS]
CAT = TableCatalog(
    name="public.t",
    columns=[("key", "string"), ("id", "int"), ("a", "string"), ("b", "string"), ("n", "bigint")],
    state_columns=list(DATA),
    key_columns=["key"],
)


def keyed(e: dict[str, Any]) -> dict[str, Any]:
    """A case's event with its keys as column values: ``key`` holds the key after the
    event, ``_old.key`` the key before it when an old image carries it."""
    row = copy.deepcopy(e)
    op, before, after = e["_op"], e["_k_before"], e["_k_after"]
    row["key"] = after
    # Not every UPDATE that keeps its key has an old image: both ways of finding the key.
    old_image = op == "D" or (op == "U" and (before != after or e["_seq"] % 2 == 0))
    row["_old_kind"] = "K" if old_image else None
    row["_old"] = {**dict.fromkeys(DATA), **(e["_old"] or {}), "key": before} if old_image else None
    return row


def arrow_rows(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    def value(name: str, row: dict[str, Any]) -> Any:
        v = row.get(name)
        return list(v.items()) if isinstance(v, dict) and name == "_fallback" else v

    return pa.Table.from_pylist([{f.name: value(f.name, r) for f in schema} for r in rows], schema)


class PriorReader:
    """read_prior over an Arrow table: the rows whose first key is wanted, or (``loose``)
    every row, as a reader with false positives may return."""

    def __init__(self, table: pa.Table, loose: bool = False) -> None:
        self.table, self.loose, self.calls = table, loose, []

    def __call__(self, values: list[Any], want_null: bool) -> pa.Table:
        self.calls.append((sorted(values), want_null))
        if self.loose:
            return self.table
        first = self.table.column(CAT.key_columns[0])
        wanted = pc.is_in(first, pa.array(values, first.type))
        if want_null:
            wanted = pc.or_(wanted, pc.is_null(first))
        return self.table.filter(wanted)


def run(events, priors, truncations, loose: bool = False, chunks: int = 1):  # type: ignore[no-untyped-def]
    """``fill_keyed_local`` of a case; ``loose``: read_prior returns every prior row;
    ``chunks``: the events come as that many record batches (slices of one)."""
    schema = arrow_event_schema(CAT)
    table = arrow_rows([keyed(e) for e in events], schema)
    step = -(-table.num_rows // chunks) or 1
    table = pa.concat_tables(
        [table.slice(i, step) for i in range(0, table.num_rows, step)] or [table]
    )
    prior_rows = [{**p, "key": p["_pk"]} for p in priors]
    reader = PriorReader(arrow_rows(prior_rows, arrow_prior_schema(CAT)), loose)
    changes, finals = fill_keyed_local(table, reader, CAT, truncations)
    # The events' schema, but _missing_toast is never NULL (as Spark's says).
    missing = schema.get_field_index("_missing_toast")
    assert changes.schema == schema.set(missing, schema.field(missing).with_nullable(False))
    assert len(reader.calls) <= 1
    if not any(e["_unchanged"] for e in events):
        assert reader.calls == []
    return changes, finals


def as_tuples(changes: pa.Table, finals: pa.Table):  # type: ignore[no-untyped-def]
    """Sorted comparable tuples; a final's ``_k`` is the case's key (``_key.key``)."""
    c = [change_tuple(r, DATA, keys=False) for r in changes.to_pylist()]
    f = [final_tuple({**r, "_k": r["_key"]["key"]}, DATA) for r in finals.to_pylist()]
    return sorted(c, key=repr), sorted(f, key=repr)


def test_finals_schema() -> None:
    case = HAND_BUILT["update_fills_from_prior_row"]()
    _, finals = run(case.events, case.priors, case.truncations)
    schema = arrow_event_schema(CAT)
    assert finals.schema == pa.schema(
        [
            pa.field("_k", pa.string()),
            *[schema.field(c) for c in DATA],
            schema.field("_fallback"),
            schema.field("_missing_toast"),
            pa.field("_seq", schema.field("_seq").type),
            pa.field("_deleted", pa.bool_()),
            pa.field(
                "_key", pa.struct([pa.field("key", pa.string()), pa.field("~key", pa.string())])
            ),
        ]
    )
    assert finals.column("_key").to_pylist() == [{"key": "k1", "~key": None}]


@pytest.mark.parametrize("name", list(HAND_BUILT))
def test_hand_built(name: str) -> None:
    case = HAND_BUILT[name]()
    changes, finals = run(case.events, case.priors, case.truncations)
    expected_finals = [{**r, "key": None if r.get("_deleted") else r["_k"]} for r in case.finals]
    expected = (
        sorted((change_tuple(keyed(r), DATA, keys=False) for r in case.changes), key=repr),
        sorted((final_tuple(r, DATA) for r in full_finals(expected_finals, DATA)), key=repr),
    )
    assert as_tuples(changes, finals) == expected


def test_prior_is_read_for_the_open_keys_only() -> None:
    case = HAND_BUILT["truncate_in_the_middle"]()
    reader_calls = []

    def reader(values: list[Any], want_null: bool) -> pa.Table:
        reader_calls.append((sorted(values), want_null))
        return arrow_rows([], arrow_prior_schema(CAT))

    table = arrow_rows([keyed(e) for e in case.events], arrow_event_schema(CAT))
    fill_keyed_local(table, reader, CAT, case.truncations)
    # k3's UPDATE has TOAST open too; k4's INSERT has none, but its UPDATE has.
    assert reader_calls == [(["k1", "k2", "k3", "k4"], False)]


# 200 random batches of 8 cases: 1600 cases (the Spark test runs 5 batches).
@pytest.mark.parametrize("seed", range(200))
def test_matches_oracle_on_random_batches(seed: int) -> None:
    events, priors, truncations = random_batch(seed)
    keyed_events = [keyed(e) for e in events]
    expected = oracle(
        keyed_events, [{**p, "key": p["_pk"]} for p in priors], truncations, DATA, False
    )
    actual = as_tuples(*run(events, priors, truncations, loose=seed % 2 == 1, chunks=1 + seed % 3))
    assert actual[0] == expected[0], "changes"
    assert actual[1] == expected[1], "finals"


def test_no_events() -> None:
    changes, finals = run([], [prior("k1", id=1)], [(10, 1)])
    assert changes.num_rows == 0 and finals.num_rows == 0


def test_timestamp_keys_a_microsecond_apart_stay_apart() -> None:
    # Spark's to_json (state_key, with_keys) writes timestamps to the millisecond; the key
    # texts here keep every microsecond, as the MERGE on the typed _key does.
    cat = TableCatalog(
        name="public.ticks",
        columns=[("at", "timestamp"), ("body", "string")],
        state_columns=["at", "body"],
        key_columns=["at"],
    )
    t0 = datetime(2024, 5, 1, 8, 0, 0, 1, tzinfo=timezone.utc)
    t1 = t0 + timedelta(microseconds=1)
    updates = [
        {"at": t, "_op": "U", "_commit_lsn": 10, "_tx_ordinal": i, "_unchanged": ["body"]}
        for i, t in enumerate((t0, t1))
    ]
    priors = [{"at": t0, "body": "B0"}, {"at": t1, "body": "B1"}]
    events = arrow_rows(updates, arrow_event_schema(cat))
    prior_table = arrow_rows(priors, arrow_prior_schema(cat))
    changes, finals = fill_keyed_local(events, lambda values, _: prior_table, cat, [])
    assert changes.column("body").to_pylist() == ["B0", "B1"]
    assert sorted((r["at"], r["body"]) for r in finals.to_pylist()) == [(t0, "B0"), (t1, "B1")]
