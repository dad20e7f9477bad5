"""Relation versions and schema evolution (slotlake.catalog) from hand-made Relation messages."""

from __future__ import annotations

import pytest

from slotlake.catalog import (
    END_SEQ,
    TARGET_SEQ,
    ColumnIds,
    RelationChange,
    TableCatalog,
    TargetRelation,
    build_catalogs,
    relation_changes,
    target_versions,
    widens_to,
)
from slotlake.pgoutput import Relation, RelationColumn, Type

INT2, INT4, INT8, TEXT, FLOAT4, FLOAT8, NUMERIC = 21, 23, 20, 25, 700, 701, 1700
OID = 16400


def numeric(p: int, s: int) -> int:
    return ((p << 16) | s) + 4  # PostgreSQL's numeric typmod


def col(name: str, oid: int, key: bool = False, typmod: int = -1) -> RelationColumn:
    return RelationColumn(1 if key else 0, name, oid, typmod)


def rel(*columns: RelationColumn, oid: int = OID, name: str = "t", identity: str = "d") -> Relation:
    return Relation(None, oid, "public", name, identity, tuple(columns))


def catalog(*versions: Relation, prior: dict[str, list[tuple[str, str]]] | None = None):  # type: ignore[no-untyped-def]
    cats = build_catalogs([(10 * (i + 1), r) for i, r in enumerate(versions)], [], prior)
    return cats["public.t"]


def test_rename_at_same_position_and_type() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("b", TEXT)),
        rel(col("id", INT4, key=True), col("bb", TEXT)),
    )
    assert cat.renames == {"b": "bb"}
    assert cat.columns == [("id", "int"), ("bb", "string")]
    assert cat.state_columns == ["id", "bb"]
    # Older versions shape their rows under the new name already.
    assert [c.name for c in cat.versions[0].columns] == ["id", "bb"]


def test_renames_chain_to_the_latest_name() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", TEXT)),
        rel(col("id", INT4, key=True), col("b", TEXT)),
        rel(col("id", INT4, key=True), col("c", TEXT)),
    )
    assert cat.columns == [("id", "int"), ("c", "string")]
    assert [c.name for v in cat.versions for c in v.columns] == ["id", "c"] * 3


def test_renamed_key_column_is_renamed_in_every_version_key() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("v", TEXT)),
        rel(col("ident", INT4, key=True), col("v", TEXT)),
    )
    assert cat.renames == {"id": "ident"}
    assert cat.key_columns == ["ident"]
    assert cat.versions[0].key_columns == ("ident",)


def test_same_position_with_another_type_is_not_a_rename() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("b", TEXT)),
        rel(col("id", INT4, key=True), col("n", INT8)),
    )
    assert cat.renames == {}
    # b is dropped (kept in the log), n is new.
    assert cat.columns == [("id", "int"), ("n", "bigint"), ("b", "string")]
    assert cat.state_columns == ["id", "n"]


def test_swapped_names_are_not_renames() -> None:
    cat = catalog(
        rel(col("a", TEXT), col("b", TEXT)),
        rel(col("b", TEXT), col("a", TEXT)),
    )
    assert cat.renames == {}


def test_add_column_appends() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", INT4)),
        rel(col("id", INT4, key=True), col("a", INT4), col("c", TEXT)),
    )
    assert cat.renames == {}
    assert cat.columns == [("id", "int"), ("a", "int"), ("c", "string")]
    assert cat.state_columns == ["id", "a", "c"]


def test_drop_column_stays_in_the_log_but_leaves_the_state() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", INT4), col("c", TEXT)),
        rel(col("id", INT4, key=True), col("a", INT4)),
    )
    assert cat.renames == {}
    assert cat.columns == [("id", "int"), ("a", "int"), ("c", "string")]
    assert cat.state_columns == ["id", "a"]


def test_drop_and_add_together_is_not_a_rename() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", TEXT), col("b", TEXT)),
        rel(col("id", INT4, key=True), col("b", TEXT), col("z", TEXT)),
    )
    assert cat.renames == {}
    assert [n for n, _ in cat.columns] == ["id", "b", "z", "a"]


def _ids(before: dict[str, int], after: dict[str, int]) -> dict[str, ColumnIds]:
    return {"public.t": ColumnIds(before, after)}


def test_drop_add_and_rename_in_one_step_told_apart_by_attnums() -> None:
    """ADD c, RENAME b TO b2, DROP a between two Relation messages: the same number of
    columns, each differing one of the same type at the same place. By position that is
    a → b2 and b → c; the attnums say b → b2, a dropped, c added."""
    before = rel(col("id", INT4, key=True), col("a", TEXT), col("b", TEXT))
    after = rel(col("id", INT4, key=True), col("b2", TEXT), col("c", TEXT))
    assert catalog(before, after).renames == {"a": "b2", "b": "c"}  # what position says
    ids = _ids({"id": 1, "a": 2, "b": 3}, {"id": 1, "b2": 3, "c": 4})
    cats = build_catalogs([(10, before), (20, after)], [], None, ids)
    cat = cats["public.t"]
    assert cat.renames == {"b": "b2"}
    assert cat.state_columns == ["id", "b2", "c"]
    assert [n for n, _ in cat.columns] == ["id", "b2", "c", "a"]  # a stays in the log
    assert [c.name for c in cat.versions[0].columns] == ["id", "a", "b2"]


def test_attnums_find_renames_across_batches_and_positions() -> None:
    """Between the lake's last schema and the batch: a rename that moved (a DROP before
    it) and a rename with a type change are both renames by attnum; a same-named column
    is never a rename."""
    prior = {"public.t": [("id", "int"), ("x", "string"), ("y", "string"), ("n", "int")]}
    now = rel(col("id", INT4, key=True), col("y2", TEXT), col("n2", INT8))
    ids = _ids({"id": 1, "x": 2, "y": 3, "n": 4}, {"id": 1, "y2": 3, "n2": 4})
    cat = build_catalogs([(10, now)], [], prior, ids)["public.t"]
    assert cat.renames == {"y": "y2", "n": "n2"}
    assert ("n2", "bigint") in cat.columns and ("x", "string") in cat.columns
    # attnums known for only some columns: the positional rule as before.
    partial = _ids({"id": 1, "x": 2}, {"id": 1})
    cat = build_catalogs(
        [(10, rel(col("id", INT4, key=True), col("x2", TEXT)))],
        [],
        {"public.t": [("id", "int"), ("x", "string")]},
        partial,
    )["public.t"]
    assert cat.renames == {"x": "x2"}


def test_a_name_handed_on_in_one_step_is_told_by_attnums() -> None:
    """``RENAME a TO b`` and ``RENAME c TO a`` between two Relation messages: ``a`` is on
    both sides, another column on each. Names alone find no rename (the lake's ``a``
    kept the old values); the attnums say a → b and c → a, and the prior state's
    ``a`` is read from the lake's ``c``."""
    prior = {"public.t": [("id", "int"), ("a", "string"), ("c", "string"), ("v", "string")]}
    now = rel(col("id", INT4, key=True), col("b", TEXT), col("a", TEXT), col("v", TEXT))
    assert build_catalogs([(10, now)], [], prior)["public.t"].renames == {}
    ids = _ids({"id": 1, "a": 2, "c": 3, "v": 4}, {"id": 1, "b": 2, "a": 3, "v": 4})
    cat = build_catalogs([(10, now)], [], prior, ids)["public.t"]
    assert cat.renames == {"a": "b", "c": "a"}
    assert cat.state_columns == ["id", "b", "a", "v"]
    have = {"id", "a", "c", "v"}
    assert [cat.prior_name(n, have) for n in cat.state_columns] == ["id", "a", "c", "v"]
    # A snapshot's copy taken after the renames has the latest names.
    copy = {"id", "b", "a", "v"}
    assert [cat.prior_name(n, copy, lake=False) for n in cat.state_columns] == list(
        cat.state_columns
    )


def test_a_swap_in_one_step_is_told_by_attnums() -> None:
    """A swap through a third name between two Relation messages, told by the target's
    attnums (the lake's, then the target's) or the trigger's report at the step; attnums
    that do not ascend in a Relation's order are another column's name: not used."""
    prior = {"public.t": [("id", "int"), ("a", "string"), ("c", "string")]}
    first = rel(col("id", INT4, key=True), col("a", TEXT), col("c", TEXT))
    swapped = rel(col("id", INT4, key=True), col("c", TEXT), col("a", TEXT))
    ids = _ids({"id": 1, "a": 2, "c": 3}, {"id": 1, "c": 2, "a": 3})
    cat = build_catalogs([(10, swapped)], [], prior, ids)["public.t"]
    assert cat.renames == {"a": "c", "c": "a"}
    assert cat.lake_names == {"c": "a", "a": "c"}
    # Inside the batch, the trigger's report after the swap; the target renamed a again.
    reported = {
        "public.t": ColumnIds(
            {"id": 1, "a": 2, "c": 3},
            {"id": 1, "c": 2, "z": 3},
            ((15, {"id": 1, "c": 2, "a": 3}),),
        )
    }
    cat = build_catalogs([(10, first), (20, swapped)], [], prior, reported)["public.t"]
    assert cat.renames == {"a": "c", "c": "a"}
    assert [c.name for c in cat.versions[0].columns] == ["id", "c", "a"]
    # The target's names on other attnums than the Relation's order allows: not a swap.
    odd = _ids({"id": 1, "a": 2, "c": 3}, {"id": 1, "c": 3, "a": 2})
    assert build_catalogs([(10, swapped)], [], prior, odd)["public.t"].renames == {}


def test_a_name_handed_on_to_a_column_the_batch_added() -> None:
    """ADD c1, a change, then ``RENAME v TO w`` and ``RENAME c1 TO v``, without the
    trigger: c1 has no attnum in the lake, the lake's relnatts pins it (3), so ``v``
    is seen to be another column after the step."""
    prior = {"public.t": [("id", "int"), ("v", "string")]}
    versions = [
        (10, rel(col("id", INT4, key=True), col("v", TEXT), col("c1", TEXT))),
        (20, rel(col("id", INT4, key=True), col("w", TEXT), col("v", TEXT))),
    ]
    after = {"id": 1, "w": 2, "v": 3}
    ids = ColumnIds({"id": 1, "v": 2}, after, (), 2, frozenset(after))
    cat = build_catalogs(versions, [], prior, {"public.t": ids})["public.t"]
    assert cat.renames == {"v": "w", "c1": "v"}
    assert [c.name for c in cat.versions[0].columns] == ["id", "w", "v"]
    # Without the relnatts nothing pins c1: names alone (the rule before).
    unpinned = ColumnIds({"id": 1, "v": 2}, after)
    assert build_catalogs(versions, [], prior, {"public.t": unpinned})["public.t"].renames == {}


def test_a_dropped_columns_name_taken_by_a_rename() -> None:
    """``DROP a`` then ``RENAME c TO a``: a version (and the lake) has both, so the
    dropped column gets a latest name of its own; a DROP and re-ADD of one name never
    has both at once and keeps sharing it."""
    prior = {"public.t": [("id", "int"), ("a", "string"), ("c", "int"), ("v", "string")]}
    both = rel(col("id", INT4, key=True), col("a", TEXT), col("c", INT4), col("v", TEXT))
    taken = rel(col("id", INT4, key=True), col("a", INT4), col("v", TEXT))
    ids = _ids({"id": 1, "a": 2, "c": 3, "v": 4}, {"id": 1, "a": 3, "v": 4})
    cat = build_catalogs([(10, both), (20, taken)], [], prior, ids)["public.t"]
    assert cat.renames == {"a": "a__dropped", "c": "a"}
    assert [c.name for c in cat.versions[0].columns] == ["id", "a__dropped", "a", "v"]
    assert ("a", "int") in cat.columns and ("a__dropped", "string") in cat.columns
    assert cat.state_columns == ["id", "a", "v"]
    # The change log keeps an earlier batch's a__dropped (the state does not): asked only
    # then, its names are taken too.
    asked: list[str] = []

    def logged(table: str) -> dict[str, str]:
        asked.append(table)
        return {"id": "int", "a": "int", "v": "string", "a__dropped": "string", "_old": ""}

    again_cat = build_catalogs([(10, both), (20, taken)], [], prior, ids, logged)["public.t"]
    assert again_cat.renames == {"a": "a__dropped2", "c": "a"}
    assert asked == ["public.t"]
    build_catalogs([(10, both)], [], prior, ids, logged)
    assert asked == ["public.t"]  # no name of its own needed: the log is not read
    gone = rel(col("id", INT4, key=True), col("c", INT4), col("v", TEXT))
    readded = rel(col("id", INT4, key=True), col("c", INT4), col("v", TEXT), col("a", TEXT))
    again = _ids({"id": 1, "a": 2, "c": 3, "v": 4}, {"id": 1, "c": 3, "v": 4, "a": 5})
    cat = build_catalogs([(10, both), (20, gone), (30, readded)], [], prior, again)["public.t"]
    assert cat.renames == {}
    assert [n for n, _ in cat.columns] == ["id", "c", "v", "a"]
    # The attnums tell the re-added a from the first from the version that has it on.
    assert cat.readded_at == {"a": 30}
    in_one_step = build_catalogs([(10, both), (20, readded)], [], prior, again)["public.t"]
    assert in_one_step.renames == {} and in_one_step.readded_at == {"a": 20}
    assert build_catalogs([(10, both), (20, readded)], [], prior)["public.t"].readded_at == {}


def test_a_dropped_columns_name_taken_by_a_column_of_another_type() -> None:
    """``DROP a`` (text), ``ADD a int``: shared, the column would become text, which
    neither is; the dropped one gets a name of its own. A type that widens (int to bigint)
    or the same type still shares the column."""
    prior = {"public.t": [("id", "int"), ("a", "string"), ("v", "string")]}
    first = rel(col("id", INT4, key=True), col("a", TEXT), col("v", TEXT))
    gone = rel(col("id", INT4, key=True), col("v", TEXT))
    ids = _ids({"id": 1, "a": 2, "v": 3}, {"id": 1, "v": 3, "a": 4})
    readded = rel(col("id", INT4, key=True), col("v", TEXT), col("a", INT4))
    cat = build_catalogs([(10, first), (20, gone), (30, readded)], [], prior, ids)["public.t"]
    assert cat.renames == {"a": "a__dropped"}
    assert cat.columns == [("id", "int"), ("v", "string"), ("a", "int"), ("a__dropped", "string")]
    assert cat.text_columns == set()
    assert [c.name for c in cat.versions[0].columns] == ["id", "a__dropped", "v"]
    # Without a version of the batch between (the Relation messages show only the new a).
    cat = build_catalogs([(30, readded)], [], prior, ids)["public.t"]
    assert cat.renames == {"a": "a__dropped"} and ("a", "int") in cat.columns
    # int to bigint widens: the column is shared and becomes bigint.
    wide = {"public.t": [("id", "int"), ("a", "int"), ("v", "string")]}
    big = rel(col("id", INT4, key=True), col("v", TEXT), col("a", INT8))
    cat = build_catalogs([(30, big)], [], wide, ids)["public.t"]
    assert cat.renames == {} and ("a", "bigint") in cat.columns


def test_a_name_the_change_log_kept_from_an_earlier_drop() -> None:
    """The change log keeps a column dropped in an earlier batch, the state does not: a
    column added later under its name shares it while the type widens, else the change
    log's one moves to ``a__dropped`` (before, the change log's a was cast to the new
    type and the batch failed); a column renamed to it never shares it. The change log's
    schema is read only in a batch that brings a name new to the state."""
    prior = {"public.t": [("id", "int"), ("v", "string")]}
    asked: list[str] = []

    def logged(table: str) -> dict[str, str]:
        asked.append(table)
        return {"id": "int", "v": "string", "a": "string", "_old": "struct<id:int,a:string>"}

    ids = _ids({"id": 1, "v": 2}, {"id": 1, "v": 2, "a": 4})
    added = rel(col("id", INT4, key=True), col("v", TEXT), col("a", INT4))
    cat = build_catalogs([(10, added)], [], prior, ids, logged)["public.t"]
    assert cat.renames == {"a": "a__dropped"}
    assert cat.columns == [("id", "int"), ("v", "string"), ("a", "int")]
    assert asked == ["public.t"]
    same = rel(col("id", INT4, key=True), col("v", TEXT), col("a", TEXT))
    assert build_catalogs([(10, same)], [], prior, ids, logged)["public.t"].renames == {}
    # v renamed to a: the change log's a must leave the name (any type).
    moved = rel(col("id", INT4, key=True), col("a", TEXT))
    to_a = _ids({"id": 1, "v": 2}, {"id": 1, "a": 2})
    cat = build_catalogs([(10, moved)], [], prior, to_a, logged)["public.t"]
    assert cat.renames == {"a": "a__dropped", "v": "a"}
    # The same when the column that took the name is dropped again in the batch (seed
    # 10703: its values, logged under a, met the change log's a of another type).
    gone = rel(col("id", INT4, key=True))
    dropped = _ids({"id": 1, "v": 2}, {"id": 1})
    cat = build_catalogs([(10, moved), (20, gone)], [], prior, dropped, logged)["public.t"]
    assert cat.renames == {"a": "a__dropped", "v": "a"}
    briefly = rel(col("id", INT4, key=True), col("v", TEXT), col("a", INT4))
    only_v = rel(col("id", INT4, key=True), col("v", TEXT))
    cat = build_catalogs([(10, briefly), (20, only_v)], [], prior, ids, logged)["public.t"]
    assert cat.renames == {"a": "a__dropped"}
    # No name new to the state: the change log is not read.
    asked.clear()
    plain = rel(col("id", INT4, key=True), col("v", TEXT))
    build_catalogs([(10, plain)], [], prior, _ids({"id": 1, "v": 2}, {"id": 1, "v": 2}), logged)
    assert asked == []


def test_a_name_the_change_log_kept_that_a_column_only_passes_through() -> None:
    """``RENAME c3 TO c1``, a row, ``RENAME c1 TO r12`` where the change log kept ``c1``
    from an earlier drop: the lake's c3 goes to r12 and the change log's c1 stays where
    it is (before, both were renamed to r12 and the batch failed on every rerun, seed
    17302)."""
    prior = {"public.t": [("id", "int"), ("c3", "int")]}

    def logged(table: str) -> dict[str, str]:
        return {"id": "int", "c3": "int", "c1": "string", "_old": "struct<id:int,c1:string>"}

    ids = ColumnIds({"id": 1, "c3": 3}, {"id": 1, "r12": 3})
    via = rel(col("id", INT4, key=True), col("c1", INT4))
    last = rel(col("id", INT4, key=True), col("r12", INT4))
    cat = build_catalogs([(10, via), (20, last)], [], prior, {"public.t": ids}, logged)["public.t"]
    assert cat.renames == {"c3": "r12"}
    assert cat.columns == [("id", "int"), ("r12", "int")]
    assert [c.name for c in cat.versions[0].columns] == ["id", "r12"]


def test_attnums_say_a_drop_and_add_of_one_type_is_no_rename() -> None:
    before = rel(col("id", INT4, key=True), col("a", TEXT))
    after = rel(col("id", INT4, key=True), col("z", TEXT))
    assert catalog(before, after).renames == {"a": "z"}  # position cannot tell
    ids = _ids({"id": 1, "a": 2}, {"id": 1, "z": 3})
    cat = build_catalogs([(10, before), (20, after)], [], None, ids)["public.t"]
    assert cat.renames == {}
    assert cat.state_columns == ["id", "z"]


@pytest.mark.parametrize(
    ("old", "old_mod", "new", "new_mod", "expected"),
    [
        (INT2, -1, INT4, -1, "int"),
        (INT4, -1, INT8, -1, "bigint"),
        (FLOAT4, -1, FLOAT8, -1, "double"),
        (NUMERIC, numeric(10, 2), NUMERIC, numeric(12, 3), "decimal(12,3)"),
        (INT4, -1, NUMERIC, numeric(12, 2), "decimal(12,2)"),
        (INT4, -1, TEXT, -1, "string"),
    ],
)
def test_widening_type_change_takes_the_latest_type(
    old: int, old_mod: int, new: int, new_mod: int, expected: str
) -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", old, typmod=old_mod)),
        rel(col("id", INT4, key=True), col("a", new, typmod=new_mod)),
    )
    assert dict(cat.columns)["a"] == expected
    assert cat.text_columns == set()
    assert cat.renames == {}
    # Each version keeps its own type, so old rows are converted with the old decoder.
    assert cat.versions[0].columns[1].type_oid == old


@pytest.mark.parametrize(
    ("old", "old_mod", "new", "new_mod"),
    [
        (INT8, -1, INT4, -1),  # narrowing
        (TEXT, -1, INT4, -1),
        (FLOAT8, -1, FLOAT4, -1),
        (NUMERIC, numeric(10, 2), NUMERIC, numeric(10, 3)),  # fewer integer digits
        (NUMERIC, numeric(10, 3), NUMERIC, numeric(12, 2)),  # fewer fraction digits
        (INT8, -1, NUMERIC, numeric(12, 2)),
    ],
)
def test_incompatible_type_change_makes_the_column_text(
    old: int, old_mod: int, new: int, new_mod: int
) -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("a", old, typmod=old_mod)),
        rel(col("id", INT4, key=True), col("a", new, typmod=new_mod)),
    )
    assert dict(cat.columns)["a"] == "string"
    assert cat.text_columns == {"a"}


def test_type_back_and_forth_is_text_when_any_step_narrows() -> None:
    cat = catalog(
        rel(col("a", INT8)),
        rel(col("a", INT4)),
        rel(col("a", INT8)),
    )
    # int8 → int4 → int8: every earlier type widens to the final int8.
    assert dict(cat.columns)["a"] == "bigint" and cat.text_columns == set()
    cat = catalog(rel(col("a", INT8)), rel(col("a", TEXT)), rel(col("a", INT8)))
    assert dict(cat.columns)["a"] == "string" and cat.text_columns == {"a"}


def test_rename_across_batches_via_prior_schemas() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("bb", TEXT)),
        prior={"public.t": [("id", "int"), ("b", "string")]},
    )
    assert cat.renames == {"b": "bb"}
    assert cat.columns == [("id", "int"), ("bb", "string")]


def test_type_change_across_batches_via_prior_schemas() -> None:
    widened = catalog(
        rel(col("id", INT4, key=True), col("a", INT8)),
        prior={"public.t": [("id", "int"), ("a", "int")]},
    )
    assert dict(widened.columns)["a"] == "bigint" and widened.text_columns == set()
    narrowed = catalog(
        rel(col("id", INT4, key=True), col("a", INT4)),
        prior={"public.t": [("id", "int"), ("a", "bigint")]},
    )
    assert dict(narrowed.columns)["a"] == "string" and narrowed.text_columns == {"a"}


def test_column_dropped_between_batches_is_not_in_this_batch_log() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True)),
        prior={"public.t": [("id", "int"), ("gone", "string")]},
    )
    # The prior lake column only contributes its type history; the state has the latest.
    assert cat.state_columns == ["id"]
    assert ("gone", "string") in cat.columns


def test_prior_schema_of_another_table_does_not_rename() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("bb", TEXT)),
        prior={"public.other": [("id", "int"), ("b", "string")]},
    )
    assert cat.renames == {}


def test_version_at_picks_the_relation_in_force_at_a_seq() -> None:
    cats = build_catalogs(
        [
            (5, rel(col("id", INT4, key=True))),
            (20, rel(col("id", INT4, key=True), col("a", INT4))),
            # The same name with another OID: the table was dropped and created again.
            (30, rel(col("id", INT4, key=True), col("z", TEXT), oid=OID + 1)),
        ],
        [],
    )
    cat = cats["public.t"]
    assert cat.oids == {OID, OID + 1}
    assert cat.version_at(OID, 6).seq == 5
    # A Relation message shapes the rows after it, not itself.
    assert cat.version_at(OID, 20).seq == 5
    assert cat.version_at(OID, 21).seq == 20
    assert cat.version_at(OID, 1000).seq == 20
    assert cat.version_at(OID + 1, 31).seq == 30
    with pytest.raises(LookupError, match=r"public\.t.*before seq 5"):
        cat.version_at(OID, 5)
    with pytest.raises(LookupError):
        cat.version_at(OID + 1, 25)


def test_identity_and_keys_follow_the_latest_version() -> None:
    cat = catalog(
        rel(col("id", INT4, key=True), col("v", TEXT)),
        rel(col("id", INT4, key=True), col("v", TEXT, key=True), identity="f"),
    )
    assert cat.replica_identity == "f" and cat.is_multiset
    assert cat.key_columns == ["id", "v"]
    keyless = catalog(rel(col("x", INT4), col("y", TEXT), identity="n"))
    assert keyless.key_columns == [] and keyless.is_multiset
    keyed = catalog(rel(col("id", INT4, key=True), col("v", TEXT)))
    assert not keyed.is_multiset


def test_type_messages_name_enum_columns() -> None:
    enum_oid = 16500
    cats = build_catalogs(
        [(10, rel(col("id", INT4, key=True), col("m", enum_oid)))],
        [(5, Type(None, enum_oid, "public", "mood"))],
    )
    version = cats["public.t"].versions[0]
    assert version.type_names == ((enum_oid, "public", "mood"),)
    assert dict(cats["public.t"].columns)["m"] == "string"


def test_tables_are_kept_apart() -> None:
    cats = build_catalogs(
        [(1, rel(col("a", INT4))), (2, rel(col("b", TEXT), oid=OID + 5, name="u"))], []
    )
    assert set(cats) == {"public.t", "public.u"}
    assert cats["public.u"].columns == [("b", "string")]


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("array<int>", "array<bigint>", True),
        ("array<bigint>", "array<int>", False),
        ("decimal(5,2)", "decimal(7,2)", True),
        ("double", "float", False),
        ("boolean", "int", False),
        ("timestamp", "string", True),
        # Changed into each other without a rewrite only at UTC, as the lake casts.
        ("timestamp_ntz", "timestamp", True),
        ("timestamp", "timestamp_ntz", True),
        ("date", "timestamp", False),
    ],
)
def test_widens_to(old: str, new: str, ok: bool) -> None:
    assert widens_to(old, new) is ok


DATE, XID8 = 1082, 5069


@pytest.mark.parametrize(
    ("oid", "typmod", "expected"),
    [
        (INT4, -1, False),
        (INT8, -1, False),
        (TEXT, -1, False),
        (DATE, -1, True),  # 'infinity' and BC dates are kept as text
        (NUMERIC, numeric(12, 2), True),  # 'NaN'
        (XID8, -1, True),  # beyond bigint
    ],
)
def test_may_fall_back_follows_the_key_type(oid: int, typmod: int, expected: bool) -> None:
    from slotlake.state import arrow_merge_predicate, merge_condition

    cat = catalog(rel(col("k", oid, key=True, typmod=typmod), col("v", TEXT)))
    assert cat.may_fall_back("k") is expected
    # The MERGE reads the _fallback map of every target row only when it can matter.
    assert ("_fallback" in merge_condition(cat)) is (expected and cat.columns[0][1] != "string")
    assert ("_fallback" in arrow_merge_predicate(cat)) is ("_fallback" in merge_condition(cat))


def test_may_fall_back_once_any_version_may() -> None:
    cat = catalog(
        rel(col("k", DATE, key=True), col("v", TEXT)),
        rel(col("k", DATE, key=True), col("v", TEXT), col("w", INT4)),
    )
    assert cat.may_fall_back("k")
    assert not cat.may_fall_back("w")
    # A column no version names: the state may hold values of an earlier type.
    assert cat.may_fall_back("gone")


# -- a table's shape at the batch's target (columns changed after its last change) --------

MOOD = 16500


def _target(*columns: RelationColumn, oid: int = OID, identity: str = "d") -> TargetRelation:
    return TargetRelation(
        rel(*columns, oid=oid, identity=identity), (Type(None, MOOD, "", "mood"),)
    )


def test_target_version_only_where_the_batch_left_a_table_behind() -> None:
    seen = rel(col("id", INT4, key=True), col("v", TEXT))
    same = _target(col("id", INT4, key=True), col("v", TEXT))
    added = _target(col("id", INT4, key=True), col("v", TEXT), col("m", MOOD))
    # The batch's last Relation of the table is its shape at the target: nothing to add.
    assert target_versions([(5, seen)], {"public.t": same}, {}, {}) == []
    # A column added after the table's last change: its Types, then the Relation, after
    # every payload of the batch.
    out = target_versions([(5, seen)], {"public.t": added}, {}, {})
    assert out == [(TARGET_SEQ - 1, Type(None, MOOD, "", "mood")), (TARGET_SEQ, added.relation)]
    # A type counts; the key or the replica identity alone do not (the table's next change
    # brings them). A table dropped and created again after its last change (another
    # oid) gets one too: the state ends in the new relation's columns, as the copy the
    # run takes of it has them. A table the lake lacks is left to its own messages.
    widened = _target(col("id", INT8, key=True), col("v", TEXT))
    assert target_versions([(5, seen)], {"public.t": widened}, {}, {})[-1][1] == widened.relation
    rekeyed = _target(col("id", INT4, key=True), col("v", TEXT, key=True))
    assert target_versions([(5, seen)], {"public.t": rekeyed}, {}, {}) == []
    full = _target(col("id", INT4, key=True), col("v", TEXT), identity="f")
    assert target_versions([(5, seen)], {"public.t": full}, {}, {}) == []
    other_oid = _target(col("id", INT4, key=True), oid=OID + 1)
    again = target_versions([(5, seen)], {"public.t": other_oid}, {}, {})
    assert again[-1] == (TARGET_SEQ, other_oid.relation)
    assert target_versions([], {"public.t": added}, {}, {}) == []


def test_target_version_of_a_table_without_changes_in_the_batch() -> None:
    target = _target(col("id", INT4, key=True), col("v", TEXT))
    ids = {"public.t": {"id": 1, "v": 2}}
    # The lake's state has the same names and attnums (its types are not compared: the
    # lake may keep a column as text): nothing to do, batch after batch.
    lake = {"public.t": (["id", "v"], {"id": 1, "v": 2})}
    assert target_versions([], {"public.t": target}, ids, lake) == []
    # A column added, renamed or dropped since the lake last wrote the table.
    for names in (["id"], ["id", "v", "w"], ["id", "w"]):
        assert target_versions([], {"public.t": target}, ids, {"public.t": (names, {})})
    # Same names, another attnum: dropped and added again.
    readded = {"public.t": (["id", "v"], {"id": 1, "v": 3})}
    assert target_versions([], {"public.t": target}, ids, readded)


def test_a_table_the_lake_wrote_from_another_relation_gets_a_target_version() -> None:
    """Dropped and created again with the same names and attnums, no change of it in the
    batch: the lake's oid says its columns are another table's."""
    target = _target(col("id", INT4, key=True), col("v", INT4))
    ids = {"public.t": {"id": 1, "v": 2}}
    lake = {"public.t": (["id", "v"], {"id": 1, "v": 2})}
    assert target_versions([], {"public.t": target}, ids, lake, {"public.t": OID}) == []
    assert target_versions([], {"public.t": target}, ids, lake, {"public.t": None}) == []
    again = target_versions([], {"public.t": target}, ids, lake, {"public.t": OID - 1})
    assert again[-1] == (TARGET_SEQ, target.relation)


def test_a_table_created_again_has_new_columns_whatever_its_names_and_attnums() -> None:
    """The lake wrote ``t`` (id int, v text, w text) from one relation; the batch has ``t``
    of another oid (id int, v int, x text): neither the attnums nor the positions relate
    the two. v of another type moves aside in the log, w is dropped, x added; the key
    and a same-typed column share their names."""
    prior = {"public.t": [("id", "int"), ("v", "string"), ("w", "string")]}
    now = rel(col("id", INT4, key=True), col("v", INT4), col("x", TEXT), oid=OID + 7)
    # The new relation's attnums equal the old one's (x at w's 3): ignored across oids.
    ids = {"public.t": ColumnIds({}, {"id": 1, "v": 2, "x": 3}, oid_before=OID)}
    cat = build_catalogs([(10, now)], [], prior, ids)["public.t"]
    assert cat.renames == {"v": "v__dropped"}
    assert cat.state_columns == ["id", "v", "x"]
    assert ("v", "int") in cat.columns and ("v__dropped", "string") in cat.columns
    assert ("w", "string") in cat.columns and cat.text_columns == set()
    # The same relation as the lake's: x at w's attnum is a rename, v's type goes text.
    same = {
        "public.t": ColumnIds(
            {"id": 1, "v": 2, "w": 3}, {"id": 1, "v": 2, "x": 3}, oid_before=OID + 7
        )
    }
    cat = build_catalogs([(10, now)], [], prior, same)["public.t"]
    assert cat.renames == {"w": "x"} and ("v", "string") in cat.columns


def test_a_table_dropped_and_created_again_inside_the_batch() -> None:
    """Rows of the old relation, then of the new one under the same name: the second
    version's columns are new from the oid on, and each row keeps its own version."""
    old = rel(col("id", INT4, key=True), col("v", TEXT))
    new = rel(col("id", INT4, key=True), col("v", INT4), oid=OID + 1)
    cat = build_catalogs([(10, old), (20, new)], [], None, None)["public.t"]
    assert cat.renames == {}  # the lake had neither
    assert ("v", "int") in cat.columns and ("v__dropped", "string") in cat.columns
    assert [c.name for c in cat.version_at(OID, 11).columns] == ["id", "v__dropped"]
    assert [c.name for c in cat.version_at(OID + 1, 21).columns] == ["id", "v"]


def test_a_table_renamed_in_the_batch_owns_its_oids_rows_by_seq() -> None:
    """``t`` renamed to ``t2`` and back (one oid), beside ``u`` (another): each name owns
    the rows after its Relation message up to the next one of the oid under another
    name, as pgoutput's receiver reads them; an oid no other table named is owned whole."""
    shape = (col("id", INT4, key=True), col("v", TEXT))
    cats = build_catalogs(
        [
            (10, rel(*shape)),
            (15, rel(*shape, oid=OID + 5, name="u")),
            (20, rel(*shape, name="t2")),
            (25, rel(*shape, name="t2")),  # the same name again: its span goes on
            (30, rel(*shape)),
        ],
        [],
    )
    t, t2, u = cats["public.t"], cats["public.t2"], cats["public.u"]
    assert t.shared == {OID: ((-1, 20), (30, END_SEQ))}
    assert t2.shared == {OID: ((20, 30),)}
    assert u.shared == {}

    def owners(seq: int) -> list[str]:
        return [c.name for c in (t, t2) if any(a < seq < b for a, b in c.shared[OID])]

    for seq, owner in [(11, t), (19, t), (21, t2), (26, t2), (29, t2), (31, t), (TARGET_SEQ, t)]:
        assert owners(seq) == [owner.name]


def test_relation_changes_name_the_tables_that_read_another_relation() -> None:
    """Dropped and created again (against the lake's oid, or inside the batch), renamed to
    a name inside the batch: the latest change of each table; a table the lake wrote from
    the same relation, or whose relation the lake does not know, has none."""
    shape = (col("id", INT4, key=True), col("v", TEXT))
    cats = build_catalogs(
        [
            (10, rel(*shape)),  # t: the lake's relation
            (20, rel(*shape, name="t2")),  # t renamed t2
            (30, rel(*shape, oid=OID + 1, name="a")),  # a: the lake had OID + 9
            (40, rel(*shape, oid=OID + 2, name="b")),  # b: dropped and created again
            (50, rel(*shape, oid=OID + 3, name="b")),
            (60, rel(*shape, oid=OID + 4, name="c")),  # c: a relation new to the lake
            (70, rel(*shape, oid=OID + 6, name="d")),  # d: the lake's relation, no change
            (80, rel(*shape, oid=OID + 7, name="e")),  # e renamed e_r, changed, and back
            (90, rel(*shape, oid=OID + 7, name="e_r")),
        ],
        [],
    )
    lake = {"public.t": OID, "public.a": OID + 9, "public.b": OID + 2, "public.d": OID + 6}
    lake |= {"public.e": OID + 7}
    changed = {
        "public.t2": RelationChange("renamed from public.t", OID),
        "public.a": RelationChange(f"recreated (oid {OID + 9} → {OID + 1})", OID + 1),
        "public.b": RelationChange(f"recreated (oid {OID + 2} → {OID + 3})", OID + 3),
        "public.e": RelationChange("renamed from public.e_r", OID + 7),
    }
    # The names at the target tell where each relation's rows belong: e's went to e_r.
    target = {OID: "public.t2", OID + 1: "public.a", OID + 3: "public.b", OID + 7: "public.e"}
    assert relation_changes(cats, lake, target | {OID + 4: "public.c"}) == changed
    # Without them, only a Relation message after another name's tells: e_r's, not e's.
    assert relation_changes(cats, lake) == {
        **{n: c for n, c in changed.items() if n != "public.e"},
        "public.e_r": RelationChange("renamed from public.e", OID + 7),
    }
    # A lake's first batch knows no oid: only the changes inside the batch.
    assert set(relation_changes(cats, {}, target)) == {"public.t2", "public.b", "public.e"}


def test_a_target_version_renames_by_attnum_and_keeps_older_rows_shapes() -> None:
    cats = build_catalogs(
        [
            (5, rel(col("id", INT4, key=True), col("a", TEXT), col("b", TEXT))),
            (TARGET_SEQ, rel(col("id", INT4, key=True), col("b2", TEXT), col("c", INT4))),
        ],
        [],
        None,
        {"public.t": ColumnIds({"id": 1, "a": 2, "b": 3}, {"id": 1, "b2": 3, "c": 4})},
    )
    cat = cats["public.t"]
    assert cat.renames == {"b": "b2"}
    assert cat.state_columns == ["id", "b2", "c"]
    # The batch's rows are still shaped by the version in force at their position.
    assert [c.name for c in cat.version_at(OID, 6).columns] == ["id", "a", "b2"]


def test_renames_chained_and_a_name_taken_again() -> None:
    """a → b, then c → a, then b → b2: each version's columns under their latest names,
    and the lake's names mapped once each (never chained: c ends as a, not b2)."""
    prior = {"public.t": [("id", "int"), ("a", "string"), ("c", "string")]}
    ids = ColumnIds({"id": 1, "a": 2, "c": 3}, {"id": 1, "b2": 2, "a": 3})
    cats = build_catalogs(
        [
            (10, rel(col("id", INT4, key=True), col("a", TEXT), col("c", TEXT))),
            (20, rel(col("id", INT4, key=True), col("b", TEXT), col("c", TEXT))),
            (30, rel(col("id", INT4, key=True), col("b", TEXT), col("a", TEXT))),
            (40, rel(col("id", INT4, key=True), col("b2", TEXT), col("a", TEXT))),
        ],
        [],
        prior,
        {"public.t": ids},
    )
    cat = cats["public.t"]
    assert [[c.name for c in v.columns] for v in cat.versions] == [["id", "b2", "a"]] * 4
    assert cat.renames == {"a": "b2", "b": "b2", "c": "a"}
    assert cat.columns == [("id", "int"), ("b2", "string"), ("a", "string")]


def test_a_rename_of_a_renamed_column_beside_an_add_is_told_by_the_lakes_attnum() -> None:
    """``c3 → r8``, a row, ``ADD c9``, ``r8 → r10``, a row: the step from the second
    version to the third renames and adds at once (position cannot tell), and ``r8`` has
    no attnum of its own; it is the lake's ``c3``, whose attnum the target has as ``r10``."""
    prior = {"public.t": [("id", "int"), ("c3", "int"), ("c7", "int")]}
    ids = _ids({"id": 1, "c3": 6, "c7": 7}, {"id": 1, "r10": 6, "c7": 7, "c9": 8})
    versions = [
        rel(col("id", INT4, key=True), col("c3", INT4), col("c7", INT4)),
        rel(col("id", INT4, key=True), col("r8", INT4), col("c7", INT4)),
        rel(col("id", INT4, key=True), col("r10", INT4), col("c7", INT4), col("c9", TEXT)),
    ]
    cat = build_catalogs([(10 * (i + 1), r) for i, r in enumerate(versions)], [], prior, ids)
    t = cat["public.t"]
    assert t.renames == {"c3": "r10", "r8": "r10"}
    assert t.state_columns == ["id", "r10", "c7", "c9"]
    assert [c.name for c in t.versions[1].columns] == ["id", "r10", "c7"]


def test_the_prior_name_of_a_column_renamed_twice_is_the_lakes() -> None:
    """``c3 → r7 → r8``: both earlier names lead to ``r8``; the prior state has ``c3``."""
    prior = {"public.t": [("id", "int"), ("c3", "int")]}
    versions = [
        rel(col("id", INT4, key=True), col("r7", INT4)),
        rel(col("id", INT4, key=True), col("r8", INT4)),
    ]
    t = build_catalogs([(10 * (i + 1), r) for i, r in enumerate(versions)], [], prior)["public.t"]
    assert t.renames == {"c3": "r8", "r7": "r8"}
    assert t.prior_name("r8") == "c3"
    assert t.prior_name("r8", {"id", "c3"}) == "c3"
    assert t.prior_name("id", {"id", "c3"}) == "id"


def test_a_drop_and_add_told_by_the_ddl_reports_when_the_added_column_is_renamed_later() -> None:
    """A row under ``c2``, ``DROP c2``, ``ADD c3``, a row, ``c3 → r4``, a row (seed 1107):
    position takes the middle step for ``c2 → c3``, and ``c3`` has no attnum in the lake or
    at the target. The capture trigger's report after the ADD gives it: a new column."""
    prior = {"public.t": [("id", "int"), ("c2", "string")]}
    versions = [
        rel(col("id", INT4, key=True), col("c2", TEXT)),
        rel(col("id", INT4, key=True), col("c3", TEXT)),
        rel(col("id", INT4, key=True), col("r4", TEXT)),
    ]
    relations = [(10 * (i + 1), r) for i, r in enumerate(versions)]
    before, after = {"id": 1, "c2": 2}, {"id": 1, "r4": 3}
    reports = ((12, {"id": 1}), (14, {"id": 1, "c3": 3}), (25, {"id": 1, "r4": 3}))
    wrong = build_catalogs(relations, [], prior, _ids(before, after))["public.t"]
    assert wrong.renames == {"c2": "c3"}  # before: c2 renamed, and r4 a new column
    ids = {"public.t": ColumnIds(before, after, reports)}
    t = build_catalogs(relations, [], prior, ids)["public.t"]
    assert t.renames == {"c3": "r4"}
    assert t.state_columns == ["id", "r4"]
    assert [c[0] for c in t.columns] == ["id", "r4", "c2"]  # c2 dropped: the log keeps it
    assert t.prior_name("r4", {"id", "c2"}) == "r4"


def test_column_ids_as_of_a_seq() -> None:
    ids = ColumnIds({"a": 1}, {"b": 2}, ((5, {"a": 1, "x": 4}), (9, {"b": 2})))
    # Before the first report: as the lake last wrote the table.
    assert ids.as_of(5) == {"a": 1}
    assert ids.as_of(6) == {"a": 1, "x": 4}
    assert ids.as_of(10) == {"b": 2}
    # No report at all (no trigger): nothing known.
    assert ColumnIds({"a": 1}, {"b": 2}).as_of(5) == {}


def test_a_name_moved_after_the_tables_last_change() -> None:
    """A row under (id, v, r), ``ADD c DEFAULT 7``, ``c`` and ``r`` swapped, no change after
    (seed 9202): the target has ``r`` on the added column (attnum 4). Taken for the
    batch's Relation message too, it made that message's ``r`` a new column and the swap
    no rename at all (the state's ``c`` NULL, its ``r`` the lake's values). Before the
    trigger's first report the attnums are the lake's."""
    prior = {"public.t": [("id", "int"), ("v", "string"), ("r", "int")]}
    relations = [
        (10, rel(col("id", INT4, key=True), col("v", TEXT), col("r", INT4))),
        (
            TARGET_SEQ,
            rel(col("id", INT4, key=True), col("v", TEXT), col("c", INT4), col("r", INT4)),
        ),
    ]
    before, after = {"id": 1, "v": 2, "r": 3}, {"id": 1, "v": 2, "c": 3, "r": 4}
    reports = (
        (12, {"id": 1, "v": 2, "r": 3, "c": 4}),
        (13, {"id": 1, "v": 2, "r": 3, "tmp": 4}),
        (14, {"id": 1, "v": 2, "c": 3, "tmp": 4}),
        (15, after),
    )
    ids = {"public.t": ColumnIds(before, after, reports, 3, frozenset(after))}
    t = build_catalogs(relations, [], prior, ids)["public.t"]
    assert t.renames == {"r": "c"}
    assert t.state_columns == ["id", "v", "c", "r"]
    assert t.prior_name("c", {"id", "v", "r"}) == "r"


def test_a_column_added_in_the_batch_pinned_by_the_lakes_relnatts() -> None:
    """ADD c, a row (Relation), ADD d, RENAME c TO e, no change after: the target version
    has one column more than the last Relation, and no report gives c's attnum. The lake's
    relnatts (2: id, v) pins the first column added since at 3, which the target sends
    as e: a rename, d a new column."""
    prior = {"public.t": [("id", "int"), ("v", "string")]}
    versions = [
        (10, rel(col("id", INT4, key=True), col("v", TEXT), col("c", INT4))),
        (
            TARGET_SEQ,
            rel(col("id", INT4, key=True), col("v", TEXT), col("e", INT4), col("d", INT4)),
        ),
    ]
    after = {"id": 1, "v": 2, "e": 3, "d": 4}
    sent = frozenset(after)

    def cat_with(natts: int | None, sent_after: frozenset[str] | None = sent) -> TableCatalog:
        ids = ColumnIds({"id": 1, "v": 2}, after, (), natts, sent_after)
        return build_catalogs(versions, [], prior, {"public.t": ids})["public.t"]

    cat = cat_with(2)
    assert cat.renames == {"c": "e"}
    assert cat.state_columns == ["id", "v", "e", "d"]
    # Unknown relnatts, or an attnum given to a column dropped unseen (3 is not sent at
    # the target: e is 4), or one the target does not send: nothing pinned, not a rename.
    assert cat_with(None).renames == {}
    assert cat_with(1).renames == {}
    assert cat_with(2, frozenset({"id", "v", "d"})).renames == {}
    ids = ColumnIds({"id": 1, "v": 2}, {"id": 1, "v": 2, "e": 4, "d": 5}, (), 2, sent)
    assert build_catalogs(versions, [], prior, {"public.t": ids})["public.t"].renames == {}


def test_added_in_batch_pins_only_the_unbroken_run() -> None:
    ids = ColumnIds(
        {"id": 1}, {"id": 1, "x": 6, "y": 7, "z": 9}, (), 5, frozenset({"id", "x", "y", "z"})
    )
    prev = [("id", "int"), ("a", "int"), ("b", "int"), ("c", "int")]
    lake = {"id": "id"}
    assert ids.added_in_batch(prev, lake.get) == {"a": 6, "b": 7}
    # A name the target gives another attnum: the run is not trusted at all.
    assert ids.added_in_batch([("id", "int"), ("z", "int")], lake.get) == {}
    assert ColumnIds({}, {"x": 6}, (), 5, frozenset({"x"})).added_in_batch(prev, lake.get) == {}


def test_added_in_batch_pins_nothing_when_a_lake_column_passes_for_added() -> None:
    """A rename of a lake column the batch did not see (no attnum for its middle name)
    leaves that column looking added: pinning would shift every attnum by one."""
    sent = frozenset({"id", "r8", "c3", "c6", "b3", "y", "w"})
    # It stands before columns the lake knows: not all added columns come last.
    ids = ColumnIds({"id": 1, "c1": 2, "c3": 3}, {"id": 1, "r8": 2, "c3": 3, "c6": 5}, (), 4, sent)
    prev = [("id", "int"), ("r7", "int"), ("c3", "int"), ("c6", "int")]
    lineage = {"id": "id", "c3": "c3"}
    assert ids.added_in_batch(prev, lineage.get) == {}
    # It is the lake's last column: the target sends attnum 2, which no column of
    # ``prev`` the lake knows has.
    ids = ColumnIds({"id": 1, "b": 2}, {"id": 1, "b3": 2, "y": 3, "w": 4}, (), 2, sent)
    prev = [("id", "int"), ("b2", "int"), ("x", "int")]
    assert ids.added_in_batch(prev, {"id": "id"}.get) == {}
    # The same with the lake's column told apart (b2 followed to b): x is pinned at 3.
    assert ids.added_in_batch(prev, {"id": "id", "b2": "b"}.get) == {"x": 3}


def test_every_column_that_went_found_by_attnum_though_an_add_has_none() -> None:
    """RENAME x4 TO y6 and ADD x7 before a change, x7 dropped again before the target
    (seed 6124, a multiset, without the trigger): x7 has no attnum anywhere, but x4's
    is y6's, so that is a rename and x7 an ADD."""
    prior = {"public.t": [("a", "int"), ("b", "string"), ("x4", "string")]}
    versions = [
        (10, rel(col("a", INT4), col("b", TEXT), col("y6", TEXT), col("x7", INT4))),
        (TARGET_SEQ, rel(col("a", INT4), col("b", TEXT), col("y6", TEXT))),
    ]
    ids = ColumnIds({"a": 1, "b": 2, "x4": 3}, {"a": 1, "b": 2, "y6": 3})
    cat = build_catalogs(versions, [], prior, {"public.t": ids})["public.t"]
    assert cat.renames == {"x4": "y6"}
    assert cat.state_columns == ["a", "b", "y6"]


def test_a_stream_that_does_not_commit_in_the_batch_describes_no_table() -> None:
    """Relation and Type messages of a stream without its Stream Commit in the batch (open
    at the target, or aborted) are that transaction's uncommitted DDL: left out of the
    catalog. A committed stream's count, and so do ones outside streams."""
    from types import SimpleNamespace

    from slotlake.decode import collect_catalog
    from tests.unit.test_make_decoder import relation_payload
    from tests.unit.test_pgoutput_decode import cstr, i64, u8, u32, u64

    def row(seq: int, data: bytes, stream_xid: int | None = None) -> SimpleNamespace:
        return SimpleNamespace(
            seq=seq, lsn=seq, data=data, msg_type=chr(data[0]), stream_xid=stream_xid,
            commit_lsn=None, commit_ts=None, tx_ordinal=None,
        )  # fmt: skip

    def streamed(xid: int, payload: bytes) -> bytes:  # the xid follows the type byte
        return payload[:1] + u32(xid) + payload[1:]

    two = relation_payload([("id", INT4, -1, True), ("v", TEXT, -1, False)])
    three = relation_payload(
        [("id", INT4, -1, True), ("v", TEXT, -1, False), ("x", INT4, -1, False)]
    )
    mood = b"Y" + u32(70001) + cstr("public") + cstr("mood")
    commit = b"c" + u32(7) + u8(0) + u64(0x500) + u64(0x510) + i64(0)
    # The stream's DDL, then a committed transaction's change of the table.
    open_stream = [
        row(1, two), row(2, streamed(9, mood), 9), row(3, streamed(9, three), 9), row(4, two),
    ]  # fmt: skip

    cat = collect_catalog(open_stream, 1)
    versions = cat.tables["public.t"].versions
    assert [([c.name for c in v.columns], v.seq) for v in versions] == [
        (["id", "v"], 1),
        (["id", "v"], 4),
    ]
    assert [n for n, _ in cat.tables["public.t"].columns] == ["id", "v"]
    assert 70001 not in {o for v in cat.tables["public.t"].versions for o, _, _ in v.type_names}

    committed = [row(1, two), row(2, streamed(7, three), 7), row(4, commit, 7)]
    cat = collect_catalog(committed, 1)
    assert [n for n, _ in cat.tables["public.t"].columns] == ["id", "v", "x"]


def test_every_column_slotlake_adds_is_reserved() -> None:
    """A source column named like one of slotlake's own is refused (or renamed once
    dropped): the list in the catalog must cover what the decoder adds."""
    from slotlake.catalog import RESERVED
    from slotlake.decode import META_COLUMNS, WORK_COLUMNS

    assert {n for n, _ in META_COLUMNS + WORK_COLUMNS} | {"_old"} <= RESERVED
