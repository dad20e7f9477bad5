"""slotlake.replay_arrow (a batch with no TOAST open) against DuckDB's replay and the oracle.

fill_keyed_local hands such a batch to the Arrow path by itself; ``arrow=False`` keeps it
in DuckDB. Both must give the same change rows and finals on the shared random cases
(key moves, deletes, truncations, events out of commit order) with their unchanged
columns taken out, on keys of several columns with NULLs and fallback texts, and on keys
a microsecond apart; a key type the grouping does not take stays with DuckDB.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from slotlake.catalog import TableCatalog
from slotlake.replay_arrow import finals_without_toast, no_toast_open
from slotlake.replay_duckdb import fill_keyed_local
from tests.replay_cases import (
    HAND_BUILT,
    arrow_event_schema,
    arrow_prior_schema,
    final_tuple,
    oracle,
    random_batch,
)
from tests.unit.test_replay_duckdb import CAT, DATA, arrow_rows, as_tuples, keyed


def without_toast(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(events)
    for e in out:
        e["_unchanged"] = []
    return out


def both(table: pa.Table, cat: TableCatalog, truncations: list[tuple[int, int]]) -> Any:
    def no_prior(values: list[Any], want_null: bool) -> pa.Table:
        raise AssertionError("no TOAST is open: the prior state is not read")

    arrow = fill_keyed_local(table, no_prior, cat, truncations)
    duck = fill_keyed_local(table, no_prior, cat, truncations, arrow=False)
    return arrow, duck


@pytest.mark.parametrize("seed", range(120))
def test_random_batches_match_duckdb_and_the_oracle(seed: int) -> None:
    events, _, truncations = random_batch(seed)
    events = [keyed(e) for e in without_toast(events)]
    table = arrow_rows(events, arrow_event_schema(CAT))
    assert no_toast_open(table)
    (changes, finals), duck = both(table, CAT, truncations)
    assert changes.schema == duck[0].schema
    assert finals.schema == duck[1].schema
    assert as_tuples(changes, finals) == as_tuples(*duck)
    # With nothing to fill, the prior rows play no part: the oracle replays without them.
    assert as_tuples(changes, finals) == oracle(events, [], truncations, DATA, False)


INT_CAT = TableCatalog(
    name="public.i",
    columns=[("key", "bigint"), *CAT.columns[1:]],
    state_columns=list(CAT.state_columns),
    key_columns=["key"],
)


def _as_int_key(event: dict[str, Any], numbers: dict[str, int]) -> dict[str, Any]:
    """The event with its key strings as numbers (NULL stays NULL), one number a string,
    and no value fallen back to text (the usual batch: no key text to group by)."""
    row = copy.deepcopy(event)
    row["_fallback"] = {}

    def number(k: str | None) -> int | None:
        return None if k is None else numbers.setdefault(k, len(numbers) * 7 - 20)

    row["key"] = number(row["key"])
    if row["_old"] is not None:
        row["_old"]["key"] = number(row["_old"]["key"])
    return row


@pytest.mark.parametrize("seed", range(60))
def test_random_batches_on_an_integer_key_match_duckdb(seed: int) -> None:
    """A single integer key: its last records are found in NumPy, not by Acero's
    grouping (replay_arrow._last_codes)."""
    events, _, truncations = random_batch(seed)
    numbers: dict[str, int] = {}
    rows = [_as_int_key(keyed(e), numbers) for e in without_toast(events)]
    table = arrow_rows(rows, arrow_event_schema(INT_CAT))
    assert table.schema.field("key").type == pa.int64()
    (changes, finals), duck = both(table, INT_CAT, truncations)
    assert finals.schema == duck[1].schema
    assert as_tuples(changes, finals) == as_tuples(*duck)
    # Keys the cases move between: one final row each.
    assert finals.num_rows == len({k["key"] for k in finals.column("_key").to_pylist()})


@pytest.mark.parametrize("name", list(HAND_BUILT))
def test_hand_built_cases_without_toast(name: str) -> None:
    case = HAND_BUILT[name]()
    table = arrow_rows([keyed(e) for e in without_toast(case.events)], arrow_event_schema(CAT))
    arrow, duck = both(table, CAT, case.truncations)
    assert as_tuples(*arrow) == as_tuples(*duck)


COMPOSITE = TableCatalog(
    name="public.c",
    columns=[("region", "string"), ("n", "decimal(12,2)"), ("at", "timestamp"), ("v", "string")],
    state_columns=["region", "n", "at", "v"],
    key_columns=["region", "n", "at"],
)


def test_composite_keys_with_nulls_fallbacks_and_microseconds() -> None:
    t0 = datetime(2024, 5, 1, 8, 0, 0, 1, tzinfo=timezone.utc)
    t1 = t0 + timedelta(microseconds=1)
    d = Decimal("1.50")

    def event(op: str, lsn: int, o: int, key: tuple, old: tuple | None = None, **kw: Any) -> dict:
        region, n, at = key
        row = {"region": region, "n": n, "at": at, "v": kw.get("v"), "_op": op}
        row.update(_commit_lsn=lsn, _tx_ordinal=o, _fallback=kw.get("fallback", []))
        if old is not None:
            row["_old_kind"] = "K"
            row["_old"] = {"region": old[0], "n": old[1], "at": old[2], "v": None}
        return row

    events = [
        event("I", 10, 1, ("eu", d, t0), v="a"),
        event("I", 10, 2, ("eu", d, t1), v="b"),  # a microsecond apart: another key
        # A NaN key value falls back: NULL value, its text in _fallback.
        event("I", 10, 3, ("eu", None, t0), v="nan", fallback=[("n", "NaN")]),
        event("I", 10, 4, ("eu", None, t0), v="null"),  # NULL key value, no text
        event("U", 20, 1, ("us", d, t0), old=("eu", d, t0), v="moved"),
        event("U", 20, 2, ("eu", None, t0), v="nan2", fallback=[("n", "NaN"), ("_old.v", "x")]),
        event("D", 30, 1, ("eu", d, t1), old=("eu", d, t1)),
        event("I", 5, 1, ("ap", d, t0), v="before the truncate"),
    ]
    schema = arrow_event_schema(COMPOSITE)
    table = arrow_rows(events, schema)
    (_, finals), duck = both(table, COMPOSITE, [(6, 0)])

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(
            (
                final_tuple({**r, "_k": repr(r["_key"])}, COMPOSITE.state_columns)
                for r in t.to_pylist()
            ),
            key=repr,
        )

    assert rows(finals) == rows(duck[1])
    assert len(finals) == 6  # ap, eu/t0, eu/t1, eu/NaN, eu/NULL, us/t0
    by_key = {
        (r["_key"]["region"], r["_key"]["~n"], r["_key"]["n"], r["_key"]["at"]): r
        for r in finals.to_pylist()
    }
    assert by_key[("eu", None, d, t0)]["_deleted"]  # moved away
    assert by_key[("us", None, d, t0)]["v"] == "moved"
    assert by_key[("eu", None, d, t1)]["_deleted"]
    assert by_key[("eu", "NaN", None, t0)]["v"] == "nan2"
    assert by_key[("eu", "NaN", None, t0)]["_fallback"] == [("n", "NaN")]  # state columns only
    assert by_key[("eu", None, None, t0)]["v"] == "null"
    assert by_key[("ap", None, d, t0)]["_deleted"]  # truncated after it


def test_float_keys_stay_with_duckdb() -> None:
    cat = TableCatalog(
        name="public.f",
        columns=[("x", "double"), ("v", "string")],
        state_columns=["x", "v"],
        key_columns=["x"],
    )
    table = arrow_rows(
        [{"x": 0.0, "v": "a", "_op": "I", "_commit_lsn": 1, "_tx_ordinal": 1}],
        arrow_event_schema(cat),
    )
    assert finals_without_toast(table, cat, []) is None
    _, finals = fill_keyed_local(table, lambda *_: arrow_rows([], arrow_prior_schema(cat)), cat, [])
    assert finals.column("v").to_pylist() == ["a"]


def test_open_toast_goes_to_duckdb() -> None:
    case = HAND_BUILT["update_fills_from_prior_row"]()
    table = arrow_rows([keyed(e) for e in case.events], arrow_event_schema(CAT))
    assert not no_toast_open(table)


@pytest.mark.parametrize("n", [0, 1, 7, 300, 1024, 1025, 5000])
def test_each_keys_last_code_by_either_way(n: int) -> None:
    """replay_arrow._last_codes: NumPy's sort up to NUMPY_LAST_MAX records of an integer
    key, Acero's grouping past it or for other keys; the same answer."""
    import numpy as np

    from slotlake.replay_arrow import _last_codes

    rng = np.random.default_rng(n)
    values = rng.integers(-50, n // 3 + 2, n)
    code = rng.permutation(n).astype(np.int64) * 2 + rng.integers(0, 2, n)
    want: dict[Any, int] = {}
    for v, c in zip(values.tolist(), code.tolist(), strict=True):
        want[v] = max(want.get(v, -1), c)
    for column in (pa.array(values, pa.int64()), pa.array(values, pa.int16()).cast(pa.string())):
        got = _last_codes({"k0": column}, code)
        assert sorted(got.tolist()) == sorted(want.values())
