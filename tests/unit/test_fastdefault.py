"""Fast-default planning (slotlake.fastdefault) and DDL messages (slotlake.ddl), crafted input."""

from __future__ import annotations

import datetime
import json
import struct
from collections import namedtuple
from decimal import Decimal

import pytest

from slotlake.catalog import TargetRelation, build_catalogs
from slotlake.ddl import (
    DDL_PREFIX,
    DdlMessage,
    DdlTable,
    TableColumns,
    catalog_from_json,
    catalog_to_json,
    ddl_messages_from_rows,
    parse_message,
)
from slotlake.fastdefault import BEFORE_BATCH, plan_defaults
from slotlake.lake import TableCommit
from slotlake.pgoutput import Relation, RelationColumn

INT4, TEXT, DATE, NUMERIC = 23, 25, 1082, 1700


def col(name: str, oid: int, key: bool = False, typmod: int = -1) -> RelationColumn:
    return RelationColumn(1 if key else 0, name, oid, typmod)


def rel(*columns: RelationColumn) -> Relation:
    return Relation(None, 16400, "public", "t", "d", tuple(columns))


def catalog(*versions: tuple[int, Relation], prior: list[tuple[str, str]] | None = None):  # type: ignore[no-untyped-def]
    return build_catalogs(list(versions), [], {"public.t": prior} if prior else None)["public.t"]


def prior_commit(columns: list[tuple[str, str]], attnums: dict[str, int] | None) -> TableCommit:
    return TableCommit(
        changes="changes/public.t",
        state="state/public.t",
        columns=[[n, t, "state"] for n, t in columns],
        key_columns=["id"],
        state_version=3,
        attnums=attnums or {},
    )


def message(seq: int, attnums: dict[str, int], missing: dict[str, str | None]) -> DdlMessage:
    return DdlMessage(
        seq, "ddl_command_end", "ALTER TABLE", "…", (), {"public.t": attnums}, {"public.t": missing}
    )


BASE = [("id", "int"), ("v", "string")]
V1 = rel(col("id", INT4, True), col("v", TEXT))
V2 = rel(col("id", INT4, True), col("v", TEXT), col("c", TEXT))


def test_add_inside_the_batch_from_the_catalog_uses_the_relation_position() -> None:
    cat = catalog((10, V1), (50, V2), prior=BASE)
    cat_end = TableColumns({"id": 1, "v": 2, "c": 3}, {"c": "dflt"})
    (d,) = plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), [], cat_end)
    assert (d.column, d.seq, d.value, d.source, d.update_prior) == (
        "c",
        50,
        "dflt",
        "catalog",
        True,
    )


def test_add_before_the_batch_without_a_baseline() -> None:
    cat = catalog((10, V2), prior=BASE)
    (d,) = plan_defaults(cat, prior_commit(BASE, None), [], TableColumns({"c": 3}, {"c": "x"}))
    assert (d.seq, d.value) == (BEFORE_BATCH, "x")


def test_nothing_when_the_column_is_old() -> None:
    cat = catalog((10, V2), prior=[*BASE, ("c", "string")])
    prior = prior_commit([*BASE, ("c", "string")], {"id": 1, "v": 2, "c": 3})
    assert plan_defaults(cat, prior, [], TableColumns({"c": 3}, {"c": "x"})) == []
    # ... and without attnums recorded, a column the lake already has is not re-added.
    assert plan_defaults(cat, prior_commit([*BASE, ("c", "string")], None), [], None) == []


def test_readd_across_batches_seen_by_the_attnum() -> None:
    cat = catalog((10, V2), prior=[*BASE, ("c", "string")])
    prior = prior_commit([*BASE, ("c", "string")], {"id": 1, "v": 2, "c": 3})
    (d,) = plan_defaults(cat, prior, [], TableColumns({"id": 1, "v": 2, "c": 4}, {"c": "new"}))
    assert (d.seq, d.value, d.update_prior) == (BEFORE_BATCH, "new", True)


def test_trigger_messages_win_and_give_the_exact_position() -> None:
    # ADD (seq 20), change under it (R at 30), DROP + re-ADD (seq 40, 45), change (R at 50).
    cat = catalog((10, V1), (30, V2), (50, V2), prior=BASE)
    msgs = [
        message(20, {"id": 1, "v": 2, "c": 3}, {"c": "first"}),
        message(40, {"id": 1, "v": 2}, {}),
        message(45, {"id": 1, "v": 2, "c": 4}, {"c": "second"}),
    ]
    end = TableColumns({"id": 1, "v": 2, "c": 4}, {"c": "second"})
    (d,) = plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), msgs, end)
    assert (d.seq, d.value, d.source) == (45, "second", "trigger")
    # Without a recorded baseline the first message still tells a new column.
    (d,) = plan_defaults(cat, prior_commit(BASE, None), msgs[:1], None)
    assert (d.seq, d.value) == (20, "first")


def test_nothing_for_a_table_only_a_snapshot_brings_into_the_batch() -> None:
    """No Relation in the batch (the table is there for its snapshot copy alone): no row
    to fill, and no type to convert a default with. Before, a DROP and re-ADD the
    trigger reported for a leaf copied in that batch raised IndexError (seed 97)."""
    from slotlake.catalog import TableCatalog

    cat = TableCatalog(
        name="public.t",
        versions=[],
        columns=[*BASE, ("c", "string")],
        state_columns=["id", "v", "c"],
        key_columns=["id"],
        replica_identity="d",
    )
    prior = prior_commit([*BASE, ("c", "string")], {"id": 1, "v": 2, "c": 3})
    msgs = [message(40, {"id": 1, "v": 2}, {}), message(45, {"id": 1, "v": 2, "c": 4}, {"c": "6"})]
    end = TableColumns({"id": 1, "v": 2, "c": 4}, {"c": "6"})
    assert plan_defaults(cat, prior, msgs, end) == []
    assert plan_defaults(cat, prior, [], end) == []


def test_messages_of_another_relation_under_the_name_are_left_out() -> None:
    """``ADD c DEFAULT 'd'`` on relation 16400, then the table dropped and created again
    (16500) with ``c`` at the same attnum: the old default is not the new column's."""
    cat = catalog((10, V1), (50, V2), prior=BASE)
    old, new = DdlTable("public.t", 16400, False), DdlTable("public.t", 16500, False)
    msgs = [
        DdlMessage(
            20,
            "ddl_command_end",
            "ALTER TABLE",
            "…",
            (old,),
            {"public.t": {"id": 1, "v": 2, "c": 3}},
            {"public.t": {"c": "d"}},
        ),
        DdlMessage(
            40,
            "ddl_command_end",
            "CREATE TABLE",
            "…",
            (new,),
            {"public.t": {"id": 1, "v": 2, "c": 3}},
            {"public.t": {}},
        ),
    ]
    prior = prior_commit(BASE, {"id": 1, "v": 2})

    def end(oid: int) -> TableColumns:
        shape = TargetRelation(Relation(None, oid, "public", "t", "d", V2.columns))
        return TableColumns({"id": 1, "v": 2, "c": 3}, {}, relation=shape)

    assert plan_defaults(cat, prior, msgs, end(16500)) == []
    # Both messages of one relation: the default is the column's.
    same = [
        msgs[0],
        DdlMessage(
            40, "ddl_command_end", "ALTER TABLE", "…", (old,), msgs[1].columns, msgs[1].missing
        ),
    ]
    (d,) = plan_defaults(cat, prior, same, end(16400))
    assert (d.seq, d.text) == (20, "d")


def test_a_rename_only_the_trigger_and_the_catalog_saw() -> None:
    # A change (R at 10), ADD x DEFAULT (seq 20), x → c (seq 30), no change after them:
    # no Relation names x, so the catalog does not know the rename; the attnum does.
    cat = catalog((10, V1), (1 << 61, V2), prior=BASE)
    assert "x" not in cat.renames
    msgs = [
        message(20, {"id": 1, "v": 2, "x": 3}, {"x": "d"}),
        message(30, {"id": 1, "v": 2, "c": 3}, {"c": "d"}),
    ]
    end = TableColumns({"id": 1, "v": 2, "c": 3}, {"c": "d"})
    (d,) = plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), msgs, end)
    assert (d.column, d.seq, d.value, d.source, d.update_prior) == (
        "c",
        20,
        "d",
        "trigger",
        True,
    )
    # The name c was another column's before the batch (dropped, then x took it):
    # still the ADD of attnum 3, not the older c.
    prior = prior_commit([*BASE, ("c", "string")], {"id": 1, "v": 2, "c": 9})
    drop = message(15, {"id": 1, "v": 2}, {})
    (d,) = plan_defaults(cat, prior, [drop, *msgs], end)
    assert (d.seq, d.value) == (20, "d")


def test_readd_without_default_sets_null_only_where_needed() -> None:
    cat = catalog((10, V2), (50, V2), prior=[*BASE, ("c", "string")])
    prior = prior_commit([*BASE, ("c", "string")], {"id": 1, "v": 2, "c": 3})
    msgs = [message(40, {"id": 1, "v": 2, "c": 4}, {})]
    (d,) = plan_defaults(cat, prior, msgs, None)
    assert (d.seq, d.value, d.update_prior) == (40, None, True)
    # A brand-new column without a default needs nothing.
    cat = catalog((10, V1), (50, V2), prior=BASE)
    msgs = [message(40, {"id": 1, "v": 2, "c": 3}, {})]
    assert plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), msgs, None) == []


def test_values_go_through_the_decoders_conversion() -> None:
    v = rel(
        col("id", INT4, True),
        col("d", DATE),
        col("n", NUMERIC, typmod=((6 << 16) | 2) + 4),
        col("i", INT4),
    )
    cat = catalog((10, V1), (20, v), prior=BASE)
    end = TableColumns({"id": 1, "d": 3, "n": 4, "i": 5}, {"d": "infinity", "n": "1.50", "i": "7"})
    got = {d.column: d for d in plan_defaults(cat, prior_commit(BASE, {"id": 1}), [], end)}
    assert got["d"].value is None and got["d"].fallback == "infinity"
    assert got["n"].value == Decimal("1.50") and got["n"].spark_type == "decimal(6,2)"
    assert got["i"].value == 7
    end.missing["d"] = "2024-02-03"
    got = {d.column: d for d in plan_defaults(cat, prior_commit(BASE, {"id": 1}), [], end)}
    assert got["d"].value == datetime.date(2024, 2, 3) and got["d"].fallback is None


def test_no_prior_rows_means_no_update() -> None:
    cat = catalog((10, V2))
    assert plan_defaults(cat, None, [], TableColumns({"id": 1, "v": 2, "c": 3}, {"c": "x"})) == []


def test_parse_message_contract_and_errors() -> None:
    content = json.dumps(
        {
            "event": "ddl_command_end",
            "tag": "ALTER TABLE",
            "query": "ALTER TABLE t ADD c text DEFAULT 'é'",
            "tables": [{"name": "public.t", "oid": 16400, "rewrite": False}],
            "columns": {"public.t": {"id": 1, "c": 2}},
            "missing": {"public.t": {"c": "é"}},
        }
    ).encode()
    m = parse_message(content, seq=7)
    assert (m.seq, m.tag, m.tables[0].name, m.tables[0].oid, m.tables[0].rewrite) == (
        7,
        "ALTER TABLE",
        "public.t",
        16400,
        False,
    )
    assert m.missing == {"public.t": {"c": "é"}} and m.columns["public.t"]["c"] == 2
    with pytest.raises(ValueError, match="seq 3 is not UTF-8 JSON"):
        parse_message(b"\xff{", seq=3)
    with pytest.raises(ValueError, match="seq 4 is malformed"):
        parse_message(b'{"tables": []}', seq=4)
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_message(b"[1]", seq=5)


def _m_payload(prefix: str, content: bytes, transactional: bool = True) -> bytes:
    # pgoutput 'M': flags, lsn, prefix (NUL-terminated), content length, content.
    return (
        b"M"
        + struct.pack(">BQ", 1 if transactional else 0, 0x16B374D848)
        + prefix.encode()
        + b"\0"
        + struct.pack(">I", len(content))
        + content
    )


def test_messages_from_raw_rows_keep_only_committed_ddl() -> None:
    Row = namedtuple("Row", "seq data stream_xid")
    body = json.dumps({"tag": "ALTER TABLE", "tables": []}).encode()
    rows = [
        Row(9, _m_payload(DDL_PREFIX, body), None),
        Row(3, _m_payload(DDL_PREFIX, body), None),
        Row(4, _m_payload("app", b"x"), None),
        Row(5, _m_payload(DDL_PREFIX, body, transactional=False), None),
    ]
    assert [m.seq for m in ddl_messages_from_rows(rows)] == [3, 9]


def test_catalog_file_round_trip() -> None:
    from slotlake.catalog import TargetRelation
    from slotlake.pgoutput import Relation, RelationColumn, Type

    relation = Relation(
        None,
        16400,
        "public",
        "t",
        "d",
        (RelationColumn(1, "id", 23, -1), RelationColumn(0, "c", 16500, -1)),
    )
    shape = TargetRelation(relation, (Type(None, 16500, "", "mood"),))
    tables = {
        "public.t": TableColumns({"id": 1, "c": 3}, {"c": None}, shape, natts=3),
        # A catalog file written before the Relation shapes (and relnatts) were recorded
        # reads as None.
        "public.old": TableColumns({"id": 1}, {}),
    }
    assert catalog_from_json(catalog_to_json("0/1", tables)) == tables


def test_a_copy_taken_before_the_add_takes_the_default_on_every_row() -> None:
    """A snapshot's copy without the column (taken before the ADD) needs its default on
    every row; a copy that holds it has its own values."""
    import pyarrow as pa

    from slotlake.fastdefault import apply_arrow, lacking_in_copy

    cat = catalog((10, V1), (50, V2), prior=BASE)
    cat_end = TableColumns({"id": 1, "v": 2, "c": 3}, {"c": "dflt"})
    defaults = plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), [], cat_end)
    assert [d.column for d in lacking_in_copy(defaults, cat, {"id", "v"})] == ["c"]
    assert lacking_in_copy(defaults, cat, {"id", "v", "c"}) == []
    rows = pa.table(
        {
            "id": [1, 2],
            "v": ["a", "b"],
            "c": pa.nulls(2, pa.string()),
            "_fallback": pa.array([[], [("c", "x")]], pa.map_(pa.string(), pa.string())),
        }
    )
    filled = apply_arrow(rows, lacking_in_copy(defaults, cat, {"id", "v"}), None)
    assert filled.column("c").to_pylist() == ["dflt", "dflt"]
    assert filled.column("_fallback").to_pylist() == [[], []]


def test_a_table_new_to_the_lake_needs_a_default_only_on_its_copy() -> None:
    """No prior state: an ADD before every change of the batch concerns no row, unless the
    state is a copy taken for the batch, whose rows may predate the column."""
    from slotlake.fastdefault import lacking_in_copy

    cat = catalog((10, V2))
    cat_end = TableColumns({"id": 1, "v": 2, "c": 3}, {"c": "dflt"})
    assert plan_defaults(cat, None, [], cat_end) == []
    (d,) = plan_defaults(cat, None, [], cat_end, copied=True)
    assert (d.column, d.seq, d.value, d.update_prior) == ("c", BEFORE_BATCH, "dflt", False)
    assert lacking_in_copy([d], cat, {"id", "v"}) == [d]
    assert lacking_in_copy([d], cat, {"id", "v", "c"}) == []


def test_a_copy_is_matched_to_the_target_by_attnum() -> None:
    """The copy's names → the target's by attnum: renamed after the copy keeps its values,
    dropped and added again under the copy's name is a new column (its default on every
    copied row); unknown attnums fall back to names."""
    from slotlake.fastdefault import lacking_in_copy
    from slotlake.snapshot import TableSnapshot, copy_names

    snap = TableSnapshot(
        "public.t", 16400, "r", "0/1", "x", 3, [["id", "int"], ["vb", "string"], ["c", "string"]],
        ["id"], "d", attnums={"id": 1, "vb": 2, "c": 3},
    )  # fmt: skip
    at_target = {"id": 1, "v": 2, "c": 4}
    names = copy_names(snap, at_target)
    assert names == {"id": "id", "v": "vb", "c": ""}
    cat = catalog((10, V2), prior=BASE)
    cat.copy_names = names
    copied = {"id", "vb", "c"}
    assert [cat.prior_name(n, copied, lake=False) for n in ("id", "v", "c")] == ["id", "vb", ""]
    cat_end = TableColumns(at_target, {"c": "new"})
    defaults = plan_defaults(cat, prior_commit(BASE, {"id": 1, "v": 2}), [], cat_end, copied=True)
    assert [d.column for d in lacking_in_copy(defaults, cat, copied)] == ["c"]
    # A plan or catalog file without attnums: matched by names, as before.
    assert copy_names(TableSnapshot(**{**snap.__dict__, "attnums": {}}), at_target) == {}
    assert copy_names(snap, {}) == {}
    partial = TableSnapshot(**{**snap.__dict__, "attnums": {"id": 1, "vb": 2}})
    assert copy_names(partial, at_target) == {}
