"""The DataFrame → DataFrame functions of slotlake.state on tiny hand-built DataFrames."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from chispa import assert_df_equality

from slotlake.catalog import TableCatalog, build_catalogs
from slotlake.decode import change_schema
from slotlake.pgoutput import Relation, RelationColumn
from slotlake.state import (
    align_prior,
    empty_state,
    fill_and_merge_keyed,
    merge_multiset,
    multiset_delta,
    state_schema_ddl,
    unique_rows,
    with_keys,
)

INT4, INT8, TEXT, TIMESTAMPTZ = 23, 20, 25, 1184
TS = datetime(2024, 1, 1, tzinfo=timezone.utc)


def make_catalog(
    *columns: tuple[str, int, bool],
    identity: str = "d",
    prior: dict[str, list[tuple[str, str]]] | None = None,
) -> TableCatalog:
    relation = Relation(
        None,
        16400,
        "public",
        "t",
        identity,
        tuple(RelationColumn(1 if key else 0, n, oid, -1) for n, oid, key in columns),
    )
    return build_catalogs([(1, relation)], [], prior)["public.t"]


KEYED = make_catalog(("id", INT4, True), ("txt", TEXT, False), ("big", TEXT, False))
FULL = make_catalog(("a", INT4, True), ("b", TEXT, True), identity="f")


def event(
    cat: TableCatalog,
    op: str,
    commit: int,
    ordinal: int,
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    old_kind: str | None = None,
    unchanged: tuple[str, ...] = (),
    fallback: dict[str, str] | None = None,
) -> tuple[Any, ...]:
    """One change row as decode_table hands it to the state functions."""
    names = [n for n, _ in cat.columns]
    row: dict[str, Any] = dict.fromkeys(names)
    row.update(new or {})
    row.update(
        _op=op,
        _commit_lsn=commit,
        _lsn=commit,
        _tx_ordinal=ordinal,
        _xid=700,
        _commit_ts=TS,
        _origin=None,
        _batch=1,
        _old_kind=old_kind,
        _missing_toast=[],
        _fallback=fallback or {},
        _truncate_options=None,
        _seq=commit * 100 + ordinal,
        _unchanged=list(unchanged),
        _old=None if old is None else {n: old.get(n) for n in names},
    )
    return tuple(row[f] for f in change_schema(cat).fieldNames())


def events_df(spark, cat: TableCatalog, rows: list[tuple[Any, ...]]):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(rows, change_schema(cat))


def state_df(spark, cat: TableCatalog, rows: list[tuple[Any, ...]]):  # type: ignore[no-untyped-def]
    """rows: data columns in state order, then _fallback (dict) and _missing_toast (list)."""
    from pyspark.sql.types import StructType

    return spark.createDataFrame(rows, StructType.fromDDL(state_schema_ddl(cat)))


def canon(df):  # type: ignore[no-untyped-def]
    """Maps are neither sortable nor groupable: compare _fallback as sorted JSON."""
    from pyspark.sql import functions as F

    if "_fallback" not in df.columns:
        return df
    return df.withColumn(
        "_fallback", F.to_json(F.map_from_entries(F.array_sort(F.map_entries("_fallback"))))
    )


def assert_same(actual, expected) -> None:  # type: ignore[no-untyped-def]
    assert_df_equality(canon(actual), canon(expected), ignore_row_order=True, ignore_nullable=True)


# -- align_prior -----------------------------------------------------------------------------


def test_align_prior_renames_widens_and_adds(spark) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog(
        ("id", INT4, True),
        ("bb", TEXT, False),
        ("a", INT8, False),
        prior={"public.t": [("id", "int"), ("b", "string"), ("a", "int")]},
    )
    assert cat.renames == {"b": "bb"}
    prior = spark.createDataFrame(
        [(1, "x", 7, {"a": "?"}, [])],
        "id int, b string, a int, _fallback map<string,string>, _missing_toast array<string>",
    )
    aligned = align_prior(prior, cat)
    expected = state_df(spark, cat, [(1, "x", 7, {"a": "?"}, [])])
    assert aligned.schema["a"].dataType.simpleString() == "bigint"
    assert_same(aligned, expected)


def test_align_prior_added_column_is_null_and_dropped_one_is_gone(spark) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog(("id", INT4, True), ("c", INT4, False))
    prior = spark.createDataFrame(
        [(1, "old"), (2, None)],
        "id int, gone string",
    )
    aligned = align_prior(prior, cat)
    assert aligned.columns == ["id", "c", "_fallback", "_missing_toast"]
    # A prior version without the metadata columns gets empty ones, not NULLs.
    expected = state_df(spark, cat, [(1, None, {}, []), (2, None, {}, [])])
    assert_same(aligned, expected)


def test_align_prior_incompatible_type_becomes_text(spark) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog(
        ("id", INT4, True), ("a", INT4, False), prior={"public.t": [("id", "int"), ("a", "bigint")]}
    )
    assert cat.text_columns == {"a"}
    prior = spark.createDataFrame([(1, 5_000_000_000)], "id int, a bigint")
    rows = align_prior(prior, cat).collect()
    assert [(r["id"], r["a"]) for r in rows] == [(1, "5000000000")]


def test_align_prior_keeps_missing_toast_and_fallback(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, KEYED, [(1, None, None, {"txt": "NaN"}, ["big"])])
    aligned = align_prior(prior, KEYED)
    assert_same(aligned, prior)


# -- with_keys -------------------------------------------------------------------------------


def _keys(df) -> dict[int, tuple[Any, Any]]:  # type: ignore[no-untyped-def]
    def parse(v: str | None) -> Any:
        return None if v is None else json.loads(v)

    return {
        r["_seq"]: (parse(r["_k_before"]), parse(r["_k_after"]))
        for r in df.select("_seq", "_k_before", "_k_after").collect()
    }


def test_with_keys_for_each_operation(spark) -> None:  # type: ignore[no-untyped-def]
    rows = [
        event(KEYED, "I", 1, 1, {"id": 1, "txt": "a"}),
        event(KEYED, "U", 1, 2, {"id": 2, "txt": "b"}),
        event(KEYED, "U", 1, 3, {"id": 4}, old={"id": 3}, old_kind="K"),
        event(KEYED, "D", 1, 4, old={"id": 5}, old_kind="K"),
    ]
    keys = _keys(with_keys(events_df(spark, KEYED, rows), ["id"]))
    assert keys == {
        101: (None, {"id": 1}),
        102: ({"id": 2}, {"id": 2}),  # no old image: the key did not change
        103: ({"id": 3}, {"id": 4}),
        104: ({"id": 5}, None),
    }


def test_with_keys_include_fallback_text(spark) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog(("ts", TIMESTAMPTZ, True), ("v", TEXT, False))
    rows = [
        event(cat, "I", 1, 1, {"ts": None, "v": "x"}, fallback={"ts": "infinity"}),
        event(cat, "I", 1, 2, {"ts": None, "v": "y"}, fallback={"ts": "-infinity"}),
        event(
            cat,
            "U",
            1,
            3,
            {"ts": TS.replace(tzinfo=None), "v": "z"},
            old={"ts": None},
            old_kind="K",
            fallback={"_old.ts": "infinity"},
        ),
        event(cat, "D", 1, 4, old={"ts": None}, old_kind="K", fallback={"_old.ts": "-infinity"}),
    ]
    keys = _keys(with_keys(events_df(spark, cat, rows), ["ts"]))
    assert keys[101][1] == {"~ts": "infinity"}
    assert keys[102][1] == {"~ts": "-infinity"}
    # The old key's text comes from the _old.-prefixed fallback, the new key has none.
    assert keys[103][0] == {"~ts": "infinity"}
    assert set(keys[103][1]) == {"ts"}
    assert keys[104] == ({"~ts": "-infinity"}, None)
    # The same key built from a new image and from an old image is the same string.
    assert keys[101][1] == keys[103][0]


# -- merge_multiset --------------------------------------------------------------------------


def test_merge_multiset_duplicates_update_and_delete(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, FULL, [(1, "dup", {}, []), (1, "dup", {}, []), (2, "two", {}, [])])
    rows = [
        event(FULL, "U", 10, 1, {"a": 1, "b": "changed"}, old={"a": 1, "b": "dup"}, old_kind="O"),
        event(FULL, "D", 10, 2, old={"a": 2, "b": "two"}, old_kind="O"),
        event(FULL, "I", 11, 1, {"a": 3, "b": "x"}),
        event(FULL, "I", 11, 2, {"a": 3, "b": "x"}),
    ]
    state = merge_multiset(events_df(spark, FULL, rows), prior, FULL, [])
    expected = state_df(
        spark,
        FULL,
        [(1, "dup", {}, []), (1, "changed", {}, []), (3, "x", {}, []), (3, "x", {}, [])],
    )
    assert_same(state, expected)


def test_merge_multiset_truncate_drops_prior_and_earlier_events(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, FULL, [(1, "p", {}, [])])
    rows = [
        event(FULL, "I", 10, 1, {"a": 5, "b": "before"}),
        event(FULL, "I", 10, 3, {"a": 6, "b": "after, same tx"}),
        event(FULL, "I", 12, 1, {"a": 7, "b": "later"}),
    ]
    state = merge_multiset(events_df(spark, FULL, rows), prior, FULL, [(10, 2)])
    expected = state_df(spark, FULL, [(6, "after, same tx", {}, []), (7, "later", {}, [])])
    assert_same(state, expected)


def test_merge_multiset_negative_counts_never_produce_rows(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, FULL, [(1, "x", {}, []), (9, "keep", {}, [])])
    rows = [
        event(FULL, "D", 10, 1, old={"a": 1, "b": "x"}, old_kind="O"),
        event(FULL, "D", 10, 2, old={"a": 1, "b": "x"}, old_kind="O"),
        event(FULL, "I", 11, 1, {"a": 1, "b": "x"}),
        event(FULL, "D", 12, 1, old={"a": 4, "b": "ghost"}, old_kind="O"),
    ]
    state = merge_multiset(events_df(spark, FULL, rows), prior, FULL, [])
    assert_same(state, state_df(spark, FULL, [(9, "keep", {}, [])]))


def test_merge_multiset_rows_differing_only_by_fallback_stay_apart(spark) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog(("a", INT4, True), ("ts", TIMESTAMPTZ, True), identity="f")
    prior = state_df(
        spark, cat, [(1, None, {"ts": "infinity"}, []), (1, None, {"ts": "-infinity"}, [])]
    )
    rows = [
        event(cat, "D", 10, 1, old={"a": 1, "ts": None}, fallback={"_old.ts": "infinity"}),
        event(cat, "I", 10, 2, {"a": 2, "ts": None}, fallback={"ts": "infinity"}),
    ]
    state = merge_multiset(events_df(spark, cat, rows), prior, cat, [])
    expected = state_df(
        spark, cat, [(1, None, {"ts": "-infinity"}, []), (2, None, {"ts": "infinity"}, [])]
    )
    assert_same(state, expected)


def test_unique_rows_one_final_row_per_key(spark) -> None:  # type: ignore[no-untyped-def]
    """A multiset unique on ``a``: each key's net change as one row to MERGE by the key."""
    from pyspark.sql import functions as F

    rows = [
        event(FULL, "U", 10, 1, {"a": 1, "b": "y"}, old={"a": 1, "b": "x"}, old_kind="O"),
        event(FULL, "D", 10, 2, old={"a": 2, "b": "two"}, old_kind="O"),
        event(FULL, "I", 11, 1, {"a": 3, "b": "new"}),
        event(FULL, "I", 11, 2, {"a": 4, "b": "gone"}),
        event(FULL, "D", 11, 3, old={"a": 4, "b": "gone"}, old_kind="O"),
        event(FULL, "U", 12, 1, {"a": 7, "b": "moved"}, old={"a": 6, "b": "moved"}, old_kind="O"),
        event(FULL, "I", 13, 1, {"a": 5, "b": "one"}),  # the key added twice: not unique
        event(FULL, "I", 13, 2, {"a": 5, "b": "two"}),
        event(FULL, "I", 14, 1, {"a": None, "b": "no key"}),  # a NULL in the key
    ]
    delta = multiset_delta(events_df(spark, FULL, rows), FULL, [])
    out = unique_rows(delta, FULL, ["a"])
    assert out.columns == ["a", "b", "_fallback", "_key", "_deleted", "_fresh", "_bad"]
    picked = out.filter("a IS NULL OR a != 5").select(
        "a", "b", F.col("_key.a").alias("key_a"), "_deleted", "_fresh", "_bad"
    )
    expected = spark.createDataFrame(
        [
            (1, "y", 1, False, False, False),
            (2, "two", 2, True, False, False),
            (3, "new", 3, False, True, False),
            (6, "moved", 6, True, False, False),
            (7, "moved", 7, False, True, False),
            (None, "no key", None, False, True, True),
        ],
        "a int, b string, key_a int, _deleted boolean, _fresh boolean, _bad boolean",
    )
    assert_df_equality(picked, expected, ignore_row_order=True, ignore_nullable=True)
    twice = out.filter("a = 5").select("_deleted", "_fresh", "_bad").collect()
    assert [tuple(r) for r in twice] == [(False, True, True)]


# -- fill_and_merge_keyed --------------------------------------------------------------------

PRIOR_ROWS = [
    (1, "a", "B1", {}, []),
    (2, "b", "B2", {}, []),
    (3, "c", "B3", {}, []),
    (8, "untouched", "B8", {"txt": "kept"}, []),
]


def _changes(df) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    return [
        (
            r["_op"],
            r["_commit_lsn"],
            r["_tx_ordinal"],
            r["id"],
            r["txt"],
            r["big"],
            r["_missing_toast"],
        )
        for r in df.orderBy("_commit_lsn", "_tx_ordinal").collect()
    ]


def test_fill_and_merge_keyed_fills_from_prior_and_from_the_batch(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, KEYED, PRIOR_ROWS)
    rows = [
        event(KEYED, "U", 100, 1, {"id": 1, "txt": "a2"}, unchanged=("big",)),
        event(KEYED, "I", 100, 2, {"id": 4, "txt": "d", "big": "B4"}),
        event(KEYED, "U", 100, 3, {"id": 4, "txt": "d2"}, unchanged=("big",)),
        event(KEYED, "D", 110, 1, old={"id": 2}, old_kind="K"),
        # An update of a key the lake never saw: nothing to fill from.
        event(KEYED, "U", 115, 1, {"id": 9, "txt": "stranger"}, unchanged=("big",)),
    ]
    changes, state = fill_and_merge_keyed(events_df(spark, KEYED, rows), prior, KEYED, [])
    assert _changes(changes) == [
        ("U", 100, 1, 1, "a2", "B1", []),
        ("I", 100, 2, 4, "d", "B4", []),
        ("U", 100, 3, 4, "d2", "B4", []),
        ("D", 110, 1, None, None, None, []),
        ("U", 115, 1, 9, "stranger", None, ["big"]),
    ]
    for col in ("_k", "_kind", "_k_before", "_k_after", "_gid", "_bucket"):
        assert col not in changes.columns
    expected = state_df(
        spark,
        KEYED,
        [
            (1, "a2", "B1", {}, []),
            (3, "c", "B3", {}, []),
            (4, "d2", "B4", {}, []),
            (8, "untouched", "B8", {"txt": "kept"}, []),
            (9, "stranger", None, {}, ["big"]),
        ],
    )
    assert_same(state.select(*expected.columns), expected)


def test_fill_and_merge_keyed_follows_key_changes(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, KEYED, PRIOR_ROWS)
    rows = [
        event(
            KEYED,
            "U",
            120,
            1,
            {"id": 30, "txt": "c"},
            old={"id": 3},
            old_kind="K",
            unchanged=("big",),
        ),
        event(
            KEYED,
            "U",
            121,
            1,
            {"id": 31, "txt": "c"},
            old={"id": 30},
            old_kind="K",
            unchanged=("big",),
        ),
        event(KEYED, "U", 130, 1, {"id": 31, "txt": "moved"}, unchanged=("big",)),
        # A new row takes the key that moved away.
        event(KEYED, "I", 131, 1, {"id": 3, "txt": "new three", "big": "N3"}),
    ]
    changes, state = fill_and_merge_keyed(events_df(spark, KEYED, rows), prior, KEYED, [])
    assert _changes(changes) == [
        ("U", 120, 1, 30, "c", "B3", []),
        ("U", 121, 1, 31, "c", "B3", []),
        ("U", 130, 1, 31, "moved", "B3", []),
        ("I", 131, 1, 3, "new three", "N3", []),
    ]
    expected = state_df(
        spark,
        KEYED,
        [
            (1, "a", "B1", {}, []),
            (2, "b", "B2", {}, []),
            (3, "new three", "N3", {}, []),
            (8, "untouched", "B8", {"txt": "kept"}, []),
            (31, "moved", "B3", {}, []),
        ],
    )
    assert_same(state.select(*expected.columns), expected)


def test_fill_and_merge_keyed_truncate(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, KEYED, PRIOR_ROWS)
    rows = [
        event(KEYED, "U", 100, 1, {"id": 1, "txt": "before"}, unchanged=("big",)),
        event(KEYED, "I", 120, 1, {"id": 5, "txt": "e", "big": "B5"}),
        event(KEYED, "U", 130, 1, {"id": 5, "txt": "e2"}, unchanged=("big",)),
        event(KEYED, "I", 130, 2, {"id": 1, "txt": "back"}),
    ]
    changes, state = fill_and_merge_keyed(events_df(spark, KEYED, rows), prior, KEYED, [(110, 1)])
    assert _changes(changes) == [
        ("U", 100, 1, 1, "before", "B1", []),
        ("I", 120, 1, 5, "e", "B5", []),
        ("U", 130, 1, 5, "e2", "B5", []),
        ("I", 130, 2, 1, "back", None, []),
    ]
    expected = state_df(spark, KEYED, [(1, "back", None, {}, []), (5, "e2", "B5", {}, [])])
    assert_same(state.select(*expected.columns), expected)


def test_fill_and_merge_keyed_without_events_keeps_the_prior_state(spark) -> None:  # type: ignore[no-untyped-def]
    prior = state_df(spark, KEYED, PRIOR_ROWS)
    changes, state = fill_and_merge_keyed(events_df(spark, KEYED, []), prior, KEYED, [])
    assert changes.count() == 0
    assert_same(state.select(*prior.columns), prior)


@pytest.mark.parametrize("truncations", [[], [(1, 0)]])
def test_fill_and_merge_keyed_from_empty_state(spark, truncations) -> None:  # type: ignore[no-untyped-def]
    rows = [
        event(KEYED, "I", 5, 1, {"id": 1, "txt": "x", "big": "b"}),
        event(KEYED, "U", 6, 1, {"id": 1, "txt": "y"}, unchanged=("big",)),
    ]
    changes, state = fill_and_merge_keyed(
        events_df(spark, KEYED, rows), empty_state(spark, KEYED), KEYED, truncations
    )
    assert [c[5] for c in _changes(changes)] == ["b", "b"]
    expected = state_df(spark, KEYED, [(1, "y", "b", {}, [])])
    assert_same(state.select(*expected.columns), expected)


def test_multiset_rows_counts_copies_with_fallback_in_any_key_order(spark) -> None:  # type: ignore[no-untyped-def]
    """A copy of a table without a key → one state row per distinct value, with ``_copies``;
    value texts in ``_fallback`` count as part of the value whatever their map order."""
    from slotlake.bootstrap import multiset_rows

    schema = "a int, b string, _fallback map<string,string>"
    copy = spark.createDataFrame(
        [
            (1, "x", {}),
            (1, "x", {}),
            (2, None, {"b": "NaN", "c": "z"}),
            (2, None, {"c": "z", "b": "NaN"}),
            (2, None, {"b": "inf"}),
        ],
        schema,
    )
    expected = spark.createDataFrame(
        [
            (1, "x", {}, [], 2),
            (2, None, {"b": "NaN", "c": "z"}, [], 2),
            (2, None, {"b": "inf"}, [], 1),
        ],
        "a int, b string, _fallback map<string,string>, _missing_toast array<string>, "
        "_copies bigint",
    )
    got = multiset_rows(copy, ["a", "b"])
    key = ["a", "_copies"]
    assert_df_equality(
        got.orderBy(*key),
        expected.orderBy(*key),
        ignore_nullable=True,
        ignore_row_order=False,
    )
