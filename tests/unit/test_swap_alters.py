"""The plan of a swap made by Spark's ALTERs (physical name → final name) and the renames
that reach it from any point a crash can leave the names at."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from slotlake.delta import sql_string
from slotlake.swap_alters import TEMP_PREFIX, SwapError, levels, moves, plan


def _field(name: str, physical: str, kind: Any = "string") -> dict[str, Any]:
    return {
        "name": name,
        "type": kind,
        "nullable": True,
        "metadata": {"delta.columnMapping.physicalName": physical},
    }


def _apply(names: dict[str, str], renames: list[tuple[str, str]]) -> dict[str, str]:
    """``names`` (physical → name) after the ALTERs, each checked as Delta would: the old
    name is there and the new one is free."""
    now = dict(names)
    for old, new in renames:
        held = {n: p for p, n in now.items()}
        assert old in held, (old, now)
        assert new not in held, (new, now)
        now[held[old]] = new
    return now


SCHEMA = {
    "type": "struct",
    "fields": [
        _field("id", "p-id", "long"),
        _field("a", "p-a"),
        _field("c", "p-c"),
        _field(
            "_old",
            "p-old",
            {"type": "struct", "fields": [_field("a", "q-a"), _field("c", "q-c")]},
        ),
    ],
}


def test_plan_is_by_physical_name_at_each_level() -> None:
    assert levels(SCHEMA) == {
        "": {"p-id": "id", "p-a": "a", "p-c": "c", "p-old": "_old"},
        "_old": {"q-a": "a", "q-c": "c"},
    }
    assert plan(SCHEMA, {"a": "c", "c": "a"}) == {"p-a": "c", "p-c": "a", "q-a": "c", "q-c": "a"}
    # Not a cycle (b is free): rename_order's ALTERs make it, the plan leaves it.
    assert plan(SCHEMA, {"a": "b"}) == {}
    # A cycle at the top level only: the old image lacks one of its names.
    old_image = {"type": "struct", "fields": [_field("a", "q-a")]}
    partial = {**SCHEMA, "fields": [*SCHEMA["fields"][:3], _field("_old", "p-old", old_image)]}
    assert plan(partial, {"a": "c", "c": "a"}) == {"p-a": "c", "p-c": "a"}


def test_a_swap_takes_three_renames_through_a_free_temporary_name() -> None:
    names = {"p-id": "id", "p-a": "a", "p-c": "c", "p-t": f"{TEMP_PREFIX}0"}
    out = moves(names, {"p-a": "c", "p-c": "a"})
    assert len(out) == 3 and out[0] == ("a", f"{TEMP_PREFIX}1")
    assert _apply(names, out) == {**names, "p-a": "c", "p-c": "a"}


@pytest.mark.parametrize("size", [2, 3])
def test_the_names_converge_from_every_point_a_crash_leaves(size: int) -> None:
    """A rerun reads the names where the crash left them (after any number of the first
    run's ALTERs, or after a name-based rename of the rerun put a column of the cycle
    under another's name) and reaches the plan without asking a rename twice."""
    start = {f"p{i}": f"n{i}" for i in range(size)} | {"p-k": "k"}
    target = {f"p{i}": f"n{(i + 1) % size}" for i in range(size)}
    first = moves(start, target)
    assert len(first) == size + 1
    for k in range(len(first) + 1):
        at = _apply(start, first[:k])
        rest = moves(at, target)
        assert _apply(at, rest) == {**start, **target}, k
        if k == len(first):
            assert rest == []  # a finished swap costs nothing more
    # Any permutation of the cycle's names (a temporary name for one) converges too.
    for perm in itertools.permutations([f"n{i}" for i in range(size)]):
        at = {f"p{i}": n for i, n in enumerate(perm)} | {"p-k": "k"}
        assert _apply(at, moves(at, target)) == {**start, **target}


def test_a_final_name_held_outside_the_plan_is_an_error() -> None:
    with pytest.raises(SwapError, match=r"'a' is to be named 'k'.*outside"):
        moves({"p-a": "a", "p-k": "k"}, {"p-a": "k"})


def test_sql_string_escapes_quotes_and_backslashes() -> None:
    assert sql_string("""it's a \\ "x\"""") == """'it\\'s a \\\\ "x"'"""
