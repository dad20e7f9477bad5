"""slotlake.identity_segments.replay_frames (a batch whose events carry two replica
identities, replayed run by run in Spark SQL) on tiny hand-built frames, checked against
hand-written states and against the driver's replay in Arrow on the same events."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality

from slotlake.batch import _state_schema
from slotlake.catalog import TableCatalog, build_catalogs
from slotlake.decode import arrow_schema_for
from slotlake.identity_segments import frame_runs, replay, replay_frames
from slotlake.pgoutput import Relation, RelationColumn

from .test_state_transforms import canon, event, events_df, state_df

INT4, TEXT = 23, 25
COLUMNS = (("id", INT4), ("code", TEXT), ("big", TEXT))


def relation(identity: str, *keys: str) -> Relation:
    columns = tuple(RelationColumn(1 if n in keys else 0, n, oid, -1) for n, oid in COLUMNS)
    return Relation(None, 16400, "public", "t", identity, columns)


def catalog(*versions: tuple[int, Relation]) -> TableCatalog:
    return build_catalogs(list(versions), [], None)["public.t"]


# event()'s seq is commit * 100 + ordinal: commits 100–199 are decoded with the first
# version, 200–299 with the second, 300 on with the third.
KEYED_FULL_CODE = catalog(
    (1, relation("d", "id")),
    (20000, relation("f", "id", "code", "big")),
    (30000, relation("d", "code")),
)
KEYED_FULL = catalog((1, relation("d", "id")), (20000, relation("f", "id", "code", "big")))
PRIOR = [(1, "a", "B1", {}, []), (2, "b", "B2", {}, []), (3, "c", "B3", {}, [])]


def _events(cat: TableCatalog) -> list[tuple[Any, ...]]:
    return [
        # keyed by id: an UPDATE whose TOAST value is unchanged (filled from the prior
        # state), a DELETE by the key only
        event(cat, "U", 100, 1, {"id": 1, "code": "a2"}, unchanged=("big",)),
        event(cat, "D", 100, 2, old={"id": 2}, old_kind="K"),
        # FULL: two copies of one row, one of them deleted, a whole-row UPDATE
        event(cat, "I", 200, 1, {"id": 4, "code": "d", "big": "B4"}),
        event(cat, "I", 200, 2, {"id": 4, "code": "d", "big": "B4"}),
        event(
            cat,
            "U",
            200,
            3,
            {"id": 3, "code": "c3", "big": "B3"},
            old={"id": 3, "code": "c", "big": "B3"},
            old_kind="O",
        ),
        event(cat, "D", 200, 4, old={"id": 4, "code": "d", "big": "B4"}, old_kind="O"),
    ]


def _third_run() -> list[tuple[Any, ...]]:
    cat = KEYED_FULL_CODE
    return [
        # keyed by code: the row the first run updated, its TOAST value unchanged again
        # (filled from the state the runs before left), and an INSERT
        event(cat, "U", 300, 1, {"id": 10, "code": "a2"}, unchanged=("big",)),
        event(cat, "I", 300, 2, {"id": 5, "code": "e", "big": "B5"}),
    ]


def _arrow_replay(cat, events, prior, truncs, defaults=()):  # type: ignore[no-untyped-def]
    """The driver's replay of the same events and prior state (one copy each)."""
    import pyarrow as pa

    keyed = arrow_schema_for(_state_schema(cat, counted=False))
    counted = arrow_schema_for(_state_schema(cat, counted=True))
    whole = prior.toArrow().cast(keyed)
    whole = whole.append_column("_copies", pa.repeat(pa.scalar(1, pa.int64()), whole.num_rows))
    return replay(events.toArrow(), whole, cat, truncs, keyed, counted, defaults)


def _rows(df) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    return sorted(tuple(r) for r in canon(df).collect())


def _arrow_rows(table, columns: list[str]) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    import json

    out = []
    for r in table.select(columns).to_pylist():
        fb = dict(r["_fallback"] or [])
        r["_fallback"] = json.dumps(dict(sorted(fb.items())), separators=(",", ":"))
        out.append(tuple(r.values()))
    return sorted(out)


def test_runs_are_cut_where_the_identity_changes(spark) -> None:  # type: ignore[no-untyped-def]
    cat = KEYED_FULL_CODE
    events = events_df(spark, cat, _events(cat) + _third_run())
    _, runs = frame_runs(events, cat)
    assert runs == [(("id",), [0], (100, 1)), (None, [1], (200, 1)), (("code",), [2], (300, 1))]
    early = events_df(spark, cat, [event(cat, "I", 0, 0, {"id": 1, "code": "x"})])
    with pytest.raises(ValueError, match=r"public\.t: an event before"):
        frame_runs(early, cat)


def test_keyed_then_full_then_keyed_by_another_column(spark) -> None:  # type: ignore[no-untyped-def]
    cat = KEYED_FULL_CODE
    events = events_df(spark, cat, _events(cat) + _third_run())
    prior = state_df(spark, cat, PRIOR)
    changes, state, _ = replay_frames(events, prior, cat, [])
    expected = state_df(
        spark,
        cat,
        [
            (10, "a2", "B1", {}, []),
            (3, "c3", "B3", {}, []),
            (4, "d", "B4", {}, []),
            (5, "e", "B5", {}, []),
        ],
    )
    assert state.columns == expected.columns  # keyed: no _copies
    assert_df_equality(canon(state), canon(expected), ignore_row_order=True, ignore_nullable=True)
    # Each TOAST value was filled by the run it belongs to, from the state before it.
    filled = {
        (r["_commit_lsn"], r["_tx_ordinal"]): (r["big"], list(r["_missing_toast"]))
        for r in changes.collect()
    }
    assert len(filled) == 8
    assert filled[(100, 1)] == ("B1", []) and filled[(300, 1)] == ("B1", [])
    # The driver's replay agrees, row for row.
    logged, whole = _arrow_replay(cat, events, prior, [])
    assert _arrow_rows(whole, state.columns) == _rows(state)
    assert sorted(logged.column("big").to_pylist(), key=str) == sorted(
        [r["big"] for r in changes.collect()], key=str
    )


@pytest.mark.parametrize("key", [None, ["id"]], ids=["no key", "checked on its key"])
def test_a_multiset_at_the_end_counts_its_copies(spark, key) -> None:  # type: ignore[no-untyped-def]
    """Asked about a key, the replay checks the new state on it: unique, its rows are
    one copy each without the grouping, the same rows either way."""
    cat = KEYED_FULL
    events = events_df(spark, cat, _events(cat))
    prior = state_df(spark, cat, PRIOR)
    _, state, unique = replay_frames(events, prior, cat, [], key=key)
    assert unique is (None if key is None else True)
    assert state.columns[-1] == "_copies"
    assert _rows(state) == [
        (1, "a2", "B1", "{}", [], 1),
        (3, "c3", "B3", "{}", [], 1),
        (4, "d", "B4", "{}", [], 1),
    ]
    _, whole = _arrow_replay(cat, events, prior, [])
    assert _arrow_rows(whole, state.columns) == _rows(state)


def test_a_multiset_that_breaks_the_key_asked_about_is_grouped(spark) -> None:  # type: ignore[no-untyped-def]
    """Both copies of (4, d) stay live: not unique on ``id``, and the two rows are
    counted into one with two copies, as without the key."""
    cat = KEYED_FULL
    events = events_df(spark, cat, _events(cat)[:-1])  # without the DELETE of one copy
    prior = state_df(spark, cat, PRIOR)
    _, state, unique = replay_frames(events, prior, cat, [], key=["id"])
    assert unique is False
    assert _rows(state) == [
        (1, "a2", "B1", "{}", [], 1),
        (3, "c3", "B3", "{}", [], 1),
        (4, "d", "B4", "{}", [], 2),
    ]
    _, whole = _arrow_replay(cat, events, prior, [])
    assert _arrow_rows(whole, state.columns) == _rows(state)


def test_a_truncate_goes_with_the_run_it_ran_in(spark) -> None:  # type: ignore[no-untyped-def]
    """A TRUNCATE between the FULL run's events: the prior state and everything before it
    go; the FULL run's later events and the keyed run after it stay."""
    cat = KEYED_FULL_CODE
    events = events_df(spark, cat, _events(cat) + _third_run())
    prior = state_df(spark, cat, PRIOR)
    truncs = [(200, 2)]  # after the first INSERT of the FULL run
    _, state, _ = replay_frames(events, prior, cat, truncs)
    # Left after the TRUNCATE: one copy of (4, d) inserted, then deleted; (3, c) was
    # gone, so its UPDATE removes nothing and adds (3, c3); then the third run's rows.
    # (10, a2)'s TOAST value is not in the state any more: it stays missing.
    assert _rows(state) == [
        (3, "c3", "B3", "{}", []),
        (5, "e", "B5", "{}", []),
        (10, "a2", None, "{}", ["big"]),
    ]
    _, whole = _arrow_replay(cat, events, prior, truncs)
    assert _arrow_rows(whole, state.columns) == _rows(state)


def test_a_column_added_with_a_default_inside_the_batch(spark) -> None:  # type: ignore[no-untyped-def]
    """``big`` (re-)added with a default between the first run's two events: the final
    rows and multiset images decoded before that point take the default, in Spark as on
    the driver."""
    from slotlake.fastdefault import FastDefault

    cat = KEYED_FULL_CODE
    default = FastDefault("big", 10002, "D", "D", None, "string", "catalog", False)
    events = events_df(spark, cat, _events(cat) + _third_run())
    prior = state_df(spark, cat, PRIOR)
    _, state, _ = replay_frames(events, prior, cat, [], [default])
    rows = _rows(state)
    # The first run's UPDATE (before the point) keeps the default, and the third run's
    # UPDATE of that row fills its unchanged value from it.
    assert (10, "a2", "D", "{}", []) in rows and len(rows) == 4
    _, whole = _arrow_replay(cat, events, prior, [], [default])
    assert _arrow_rows(whole, state.columns) == rows
