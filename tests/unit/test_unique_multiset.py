"""slotlake.unique_multiset on hand-built events: each key's final row, and the batches
that break the key's uniqueness."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from slotlake.catalog import TableCatalog
from slotlake.lake import TableCommit
from slotlake.unique_multiset import Broken, holds, keyed_rows, unique_key

FB = pa.map_(pa.string(), pa.string())
STATE = pa.schema(
    [
        ("id", pa.int32()),
        ("v", pa.string()),
        ("f", pa.float64()),
        ("_fallback", FB),
        ("_missing_toast", pa.list_(pa.string())),
        ("_copies", pa.int64()),
    ]
)
OLD = pa.struct([("id", pa.int32()), ("v", pa.string()), ("f", pa.float64())])


def _events(rows: list[tuple[str, Any, Any]], kind: str = "O") -> pa.Table:
    """(op, new image (id, v, f) or None, old image or None), in commit order."""
    return pa.table(
        {
            "id": pa.array([n[0] if n else None for _, n, _ in rows], pa.int32()),
            "v": pa.array([n[1] if n else None for _, n, _ in rows], pa.string()),
            "f": pa.array([n[2] if n else None for _, n, _ in rows], pa.float64()),
            "_op": [op for op, _, _ in rows],
            "_old_kind": [kind if o else None for _, _, o in rows],
            "_unchanged": pa.array([[] for _ in rows], pa.list_(pa.string())),
            "_fallback": pa.array([[] for _ in rows], FB),
            "_old": pa.array(
                [dict(zip(("id", "v", "f"), o, strict=True)) if o else None for _, _, o in rows],
                OLD,
            ),
            "_seq": pa.array(range(10, 10 + len(rows)), pa.int64()),
        }
    )


def _finals(events: pa.Table) -> tuple[list[tuple[Any, ...]], list[bool]]:
    out = keyed_rows(events, ["id"], STATE)
    rows = out.rows.sort_by("id").to_pylist()
    assert all(r["_copies"] == 1 and r["_key"] == {"id": r["id"], "~id": None} for r in rows)
    fresh = dict(zip(out.rows.column("id").to_pylist(), out.fresh.tolist(), strict=True))
    return [(r["id"], r["v"], r["f"], r["_deleted"]) for r in rows], [fresh[r["id"]] for r in rows]


EVENTS = [
    ("U", (1, "b", 1.0), (1, "a", 1.0)),
    ("U", (1, "c", -0.0), (1, "b", 1.0)),
    ("D", None, (2, "x", 2.0)),
    ("I", (3, "n", 3.0), None),
    ("U", (5, "moved", 4.0), (4, "m", 4.0)),  # the key moves: 4 goes, 5 comes
    ("I", (6, "gone", 6.0), None),
    ("D", None, (6, "gone", 6.0)),
    ("D", None, (7, "back", 7.0)),
    ("I", (7, "again", 7.0), None),
]


def test_each_keys_last_event_makes_its_row() -> None:
    rows, fresh = _finals(_events(EVENTS))
    assert rows == [
        (1, "c", 0.0, False),  # -0.0 as a multiset's grouping holds it
        (2, "x", 2.0, True),
        (3, "n", 3.0, False),
        (4, "m", 4.0, True),
        (5, "moved", 4.0, False),
        (6, "gone", 6.0, True),
        (7, "again", 7.0, False),
    ]
    # A key the batch adds before removing it must not be live in the state.
    assert fresh == [False, False, True, False, True, True, False]
    # Each row's final image's raw row (for a fast default), none for a deleted key.
    out = keyed_rows(_events(EVENTS), ["id"], STATE).rows.sort_by("id")
    assert out.column("_seq").to_pylist() == [11, None, 13, None, 14, None, 18]


@pytest.mark.parametrize(
    "events",
    [
        [("I", (1, "a", 0.0), None), ("I", (1, "b", 0.0), None)],
        [("D", None, (1, "a", 0.0)), ("D", None, (1, "a", 0.0))],
        [("U", (2, "b", 0.0), (1, "a", 0.0)), ("I", (2, "c", 0.0), None)],
        [
            ("I", (1, "a", 0.0), None),
            ("U", (1, "b", 0.0), (2, "x", 0.0)),
            ("D", None, (2, "y", 0.0)),
        ],
    ],
    ids=["insert-twice", "delete-twice", "moved-onto-a-new-key", "update-onto-a-live-key"],
)
def test_a_batch_that_repeats_a_key_is_broken(events: list[tuple[str, Any, Any]]) -> None:
    with pytest.raises(Broken, match="key is live"):
        keyed_rows(_events(events), ["id"], STATE)


def test_old_rows_that_are_not_whole_or_keys_that_are_null_are_broken() -> None:
    with pytest.raises(Broken, match="not whole"):
        keyed_rows(_events([("D", None, (1, "a", 0.0))], kind="K"), ["id"], STATE)
    with pytest.raises(Broken, match="NULL"):
        keyed_rows(_events([("I", (None, "a", 0.0), None)]), ["id"], STATE)
    unfilled = _events([("U", (1, "a", 0.0), (1, "a", 0.0))])
    unfilled = unfilled.set_column(
        unfilled.schema.get_field_index("_unchanged"),
        "_unchanged",
        pa.array([["v"]], pa.list_(pa.string())),
    )
    with pytest.raises(Broken, match="TOAST"):
        keyed_rows(unfilled, ["id"], STATE)


def test_a_whole_state_holds_its_key_or_not() -> None:
    def state(ids: list[int | None], copies: list[int]) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int32()), "_copies": copies})

    assert holds(state([1, 2, 3], [1, 1, 1]), ["id"])
    assert holds(state([], []), ["id"])
    assert not holds(state([1, 2, 1], [1, 1, 1]), ["id"])
    assert not holds(state([1, 2], [1, 2]), ["id"])
    assert not holds(state([1, None], [1, 1]), ["id"])


def test_the_key_is_kept_only_while_the_batch_leaves_it_as_it_was() -> None:
    from slotlake.catalog import ColumnSpec, RelationVersion

    def cat(identity: str = "f", **kw: Any) -> TableCatalog:
        version = RelationVersion(
            1,
            7,
            identity,
            (ColumnSpec("id", 23, -1, "int"), ColumnSpec("v", 25, -1, "string")),
            ("id", "v"),
            (),
        )
        base = TableCatalog(
            "public.t",
            versions=[version],
            columns=[("id", "int"), ("v", "string")],
            state_columns=["id", "v"],
            key_columns=["id", "v"],
            replica_identity=identity,
        )
        for name, value in kw.items():
            setattr(base, name, value)
        return base

    prior = TableCommit(
        "c",
        "s",
        columns=[["id", "int", "state"], ["v", "string", "state"]],
        unique_on=["id"],
        oid=7,
    )
    assert unique_key(cat(), prior) == ["id"]
    assert unique_key(cat(), TableCommit("c", "s", columns=prior.columns)) is None
    assert unique_key(cat(renames={"id": "id2"}), prior) is None
    assert unique_key(cat(text_columns={"id"}), prior) is None
    assert unique_key(cat(columns=[("id", "bigint"), ("v", "string")]), prior) is None
    assert unique_key(cat(state_columns=["v"]), prior) is None
    assert unique_key(cat(replica_identity="d"), prior) is None
    created_again = TableCommit(**{**prior.__dict__, "oid": 8})
    assert unique_key(cat(), created_again) is None


def test_a_key_arrow_cannot_order_is_broken() -> None:
    """An array key (PostgreSQL orders arrays; Arrow sorts no lists): matched whole."""
    ints = pa.list_(pa.int32())
    state = pa.schema(
        [("k", ints), ("_fallback", FB), ("_missing_toast", pa.list_(pa.string()))]
    ).append(pa.field("_copies", pa.int64()))
    events = pa.table(
        {
            "k": pa.array([[1, 2], [3]], ints),
            "_op": ["I", "I"],
            "_old_kind": pa.array([None, None], pa.string()),
            "_unchanged": pa.array([[], []], pa.list_(pa.string())),
            "_fallback": pa.array([[], []], FB),
            "_old": pa.array([None, None], pa.struct([("k", ints)])),
            "_seq": pa.array([1, 2], pa.int64()),
        }
    )
    with pytest.raises(Broken, match="cannot be ordered"):
        keyed_rows(events, ["k"], state)
    assert not holds(pa.table({"k": pa.array([[1]], ints), "_copies": [1]}), ["k"])
