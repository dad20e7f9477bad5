"""The snapshot module's pure rules: DDL messages, published-set baselines, marker order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slotlake.lake import CommitRecord, TableCommit
from slotlake.lsn import Lsn
from slotlake.pgoutput.messages import Message
from slotlake.snapshot import (
    DDL_PREFIX,
    PartitionNode,
    TableSnapshot,
    _baseline,
    began_with_copies,
    leaves_in_ddl,
    partitions_left,
    rejoined,
    retyped,
    rewritten_by_ddl,
    scope_of,
    scope_widened,
    unseen_rows,
)


def _msg(prefix: str, content: object, transactional: bool = True) -> Message:
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    return Message(1, transactional, Lsn(100), prefix, data)


def test_rewrites_come_from_transactional_ddl_messages_only() -> None:
    tables = [
        {"name": "public.t", "oid": 1, "rewrite": True},
        {"name": "public.u", "oid": 2, "rewrite": False},
    ]
    msgs = [
        ("M", 500, _msg(DDL_PREFIX, {"tag": "ALTER TABLE", "query": "…", "tables": tables})),
        ("M", 900, _msg(DDL_PREFIX, {"tables": [{"name": "public.t", "rewrite": True}]})),
        ("M", 700, _msg("other", {"tables": [{"name": "public.v", "rewrite": True}]})),
        ("M", None, _msg(DDL_PREFIX, {"tables": [{"name": "public.w", "rewrite": True}]}, False)),
        ("M", 800, _msg(DDL_PREFIX, b"\xffnot json")),
    ]
    # The latest rewrite of a table counts: a copy taken after it already has it.
    assert rewritten_by_ddl(msgs) == {"public.t": 900}


def _record(**kw: object) -> CommitRecord:
    base = dict(batch=3, attempt="a", slot="s", start_lsn="0/1", end_lsn="0/2", target_lsn="0/2")
    base.update(created_at="", code_version="", raw=None)
    base.update(kw)
    return CommitRecord(**base)  # type: ignore[arg-type]


def test_published_baseline() -> None:
    assert _baseline(None) is None  # a lake's first batch never snapshots
    assert _baseline(_record()) is None  # a sync record from before the field: unknown
    boot = _record(kind="bootstrap", tables={"public.a": TableCommit(None, None)})
    assert _baseline(boot) == {"public.a": None}
    rec = _record(snapshot={"published": {"public.a": 16384}})
    assert _baseline(rec) == {"public.a": 16384}
    # Round trip through the record's JSON keeps the field.
    assert CommitRecord.from_json(rec.to_json()).snapshot == rec.snapshot


def test_consistent_point_as_stored_in_the_change_log() -> None:
    snap = TableSnapshot("public.a", 1, "r", "FFFFFFFF/0", "x", 0, [], [], "d")
    assert snap.cp_signed == Lsn.parse("FFFFFFFF/0").to_signed() < 0


def test_leaves_seen_in_ddl_messages_by_published_root() -> None:
    """Every leaf below a published root (at any level) that a message listed, with the
    pg_inherits xmins of its path up to that root as the last message showed them; a
    malformed entry and other prefixes ignored."""
    parts = [
        {"leaf": 11, "ancestors": [10], "joined": ["5"]},
        # below a sub-partitioned partition
        {"leaf": 21, "ancestors": [20, 10], "joined": ["7", "6"]},
        {"leaf": 31, "ancestors": [30], "joined": ["8"]},  # another tree
    ]
    msgs = [
        ("M", 500, _msg(DDL_PREFIX, {"tag": "CREATE TABLE", "partitions": parts})),
        # detached and attached again: the later message's path counts
        (
            "M",
            600,
            _msg(DDL_PREFIX, {"partitions": [{"leaf": 11, "ancestors": [10], "joined": ["9"]}]}),
        ),
        ("M", 700, _msg(DDL_PREFIX, {"tag": "ALTER TABLE", "partitions": [{"ancestors": [10]}]})),
        ("M", 800, _msg("other", {"partitions": [{"leaf": 12, "ancestors": [10]}]})),
        ("M", 900, _msg(DDL_PREFIX, {"tag": "ALTER TABLE"})),  # an older trigger's message
    ]
    roots = {"public.p": 10, "public.q": 20, "public.plain": 40}
    assert leaves_in_ddl(msgs, roots) == {
        "public.p": {"11": ["9"], "21": ["7", "6"]},
        "public.q": {"21": ["7"]},
    }
    # A root the batch copied: the messages committed before the copy's consistent point
    # are in the copy (a leaf they showed gone since is not gone from it).
    assert leaves_in_ddl(msgs, roots, {"public.p": 650}) == {"public.q": {"21": ["7"]}}
    assert leaves_in_ddl(msgs, roots, {"public.p": 550, "public.x": 1}) == {
        "public.p": {"11": ["9"]},
        "public.q": {"21": ["7"]},
    }


def _node(parent: int, joined: str = "5", leaf: bool = True) -> PartitionNode:
    return PartitionNode(parent, leaf, 1, None, ("public", "x"), "5", joined, 0)


def test_partitions_that_left_since_the_last_commit() -> None:
    """A leaf the last commit read, or its batch's DDL messages showed, that is gone now,
    or that came back by another pg_inherits row on its path, names its root; a root the
    last commit did not record is left to its copy."""
    last = _record(
        snapshot={
            "leaves": {"public.p": {"11": 11, "12": 12}, "public.q": {"21": 21}, "public.r": {}},
            "partition_joins": {"public.p": {"11": "5", "12": "5"}, "public.q": {"21": "5"}},
            "leaves_seen": {
                "public.q": {"21": ["5"], "22": ["6"]},
                "public.r": {"31": ["7"]},
                "public.t": {"51": ["7", "6"]},
            },
        }
    )
    trees = {
        "public.p": {11: _node(10), 12: _node(10)},  # unchanged
        "public.q": {21: _node(20)},  # 22 came and went between the two runs
        "public.r": {},  # its only leaf, seen in a message, is gone: no leaves at all
        "public.s": {41: _node(40)},  # not in the last commit
    }
    assert partitions_left(trees, last) == {
        "public.q": "partitions detached or dropped (22)",
        "public.r": "partitions detached or dropped (31)",
    }
    del trees["public.p"][12]
    assert partitions_left(trees, last)["public.p"] == "partitions detached or dropped (12)"
    # A known leaf attached again; a seen one below a partition attached again.
    trees["public.p"] = {11: _node(10, "9"), 12: _node(10)}
    last.snapshot["leaves"]["public.t"] = {}
    trees["public.t"] = {50: _node(60, "6", leaf=False), 51: _node(50, "7")}
    assert partitions_left(trees, last)["public.p"] == (
        "partitions detached and attached again (11)"
    )
    assert "public.t" not in partitions_left(trees, last)
    trees["public.t"][50] = _node(60, "10", leaf=False)
    assert partitions_left(trees, last)["public.t"] == (
        "partitions detached and attached again (51)"
    )
    assert partitions_left(trees, None) == {}


def test_a_lake_holds_every_row_when_it_began_with_a_bootstrap(tmp_path: Path) -> None:
    from slotlake.lake import Lake

    lake = Lake(str(tmp_path / "lake"))
    assert not began_with_copies(lake, None)  # a lake's first sync: no copy
    assert began_with_copies(lake, _record(kind="bootstrap"))
    assert began_with_copies(lake, _record(snapshot={"complete": True}))
    assert not began_with_copies(lake, _record(snapshot={"complete": False}))
    # A record from before the flag: the lake's first record says.
    lake.write_commit(_record(batch=1, kind="bootstrap"))
    assert began_with_copies(lake, _record(batch=2))
    plain = Lake(str(tmp_path / "plain"))
    plain.write_commit(_record(batch=1))
    assert not began_with_copies(plain, _record(batch=2))


def test_unseen_rows_want_the_tables_not_wanted_already() -> None:
    missing = {"public.a": 3, "public.b": 0, "public.c": 1}
    assert unseen_rows(missing, {"public.c": "renamed"}) == {
        "public.a": "unchanged TOAST values of rows the lake never had (3 changes)"
    }
    assert unseen_rows({}, {}) == {}


def test_a_publications_scope_of_a_table() -> None:
    # (row filter, attnums of its column list or None) per publication.
    assert scope_of([("(id > 5)", [1, 2])]) == [["(id > 5)"], [1, 2]]
    # Filters are ORed: one publication without a filter publishes every row; one
    # without a list, every column.
    assert scope_of([("(id > 5)", [1, 2]), (None, None)]) == [None, None]
    assert scope_of([("(b)", None), ("(a)", None)])[0] == ["(a)", "(b)"]


def test_what_a_changed_scope_needs_copied() -> None:
    every, list2 = [None, None], [None, [1, 2]]
    assert scope_widened(every, every) is None
    assert scope_widened([["(id > 5)"], None], every) == "its publication's row filter changed"
    assert scope_widened(every, [["(id > 5)"], None]) is not None  # rows leave
    # A list that leaves a column out: the Relation messages drop it.
    assert scope_widened(every, list2) is None
    assert scope_widened([None, [1, 2, 3]], list2) is None
    # One that publishes a column it left out, or no list: values the lake never had.
    assert scope_widened(list2, every) == "its publication's column list was removed"
    assert scope_widened(list2, [None, [1, 2, 4]]) == (
        "its publication's column list now publishes attnums [4]"
    )
    # A record of another form tells nothing.
    assert scope_widened([None, [1], False], list2) is None


def test_tables_holding_a_renamed_enum_label_or_a_changed_composite() -> None:
    def record(types: dict[str, Any]) -> CommitRecord:
        rec = CommitRecord.__new__(CommitRecord)
        rec.snapshot = {"types": types}
        return rec

    pair = {"name": "pair", "attributes": [[1, 23], [2, 25]]}
    last = record(
        {"enums": {"10": {"1": "sad", "2": "ok"}, "20": {"5": "s"}}, "composites": {"30": pair}}
    )
    uses = {"public.a": ["10"], "public.b": ["20"], "public.c": ["10", "20"], "public.d": ["30"]}
    enums = {"10": {"1": "sad", "2": "fine", "3": "new"}, "20": {"5": "s"}}
    now = {"uses": uses, "enums": enums, "composites": {"30": pair}}
    why = "an enum value it holds was renamed ('ok' to 'fine')"
    assert retyped(last, now) == {"public.a": why, "public.c": why}
    # An attribute added (or dropped): every value of the type reads otherwise.
    grown = {**pair, "attributes": [[1, 23], [2, 25], [3, 23]]}
    now = {"uses": uses, "enums": last.snapshot["types"]["enums"], "composites": {"30": grown}}
    assert retyped(last, now) == {
        "public.d": "the attributes of the composite type pair it holds changed"
    }
    # A label added, a type the record did not read, a record from before types were kept.
    enums = {"10": {"1": "sad", "2": "ok", "3": "x"}, "40": {"9": "z"}}
    assert retyped(last, {"uses": uses, "enums": enums, "composites": {"30": pair}}) == {}
    assert retyped(record({}), now) == {}


def test_tables_put_back_into_a_publication() -> None:
    def record(members: dict[str, list[int]] | None) -> CommitRecord:
        rec = CommitRecord.__new__(CommitRecord)
        rec.snapshot = {} if members is None else {"memberships": members}
        return rec

    last = record({"public.a": [10], "public.b": [20], "public.c": []})
    now = {"public.a": [11], "public.b": [20], "public.c": [], "public.new": [30]}
    # a: another row publishes it (taken out and put back); new: not in the record, a
    # copy for another reason; c: FOR ALL TABLES, no row.
    assert rejoined(last, now) == {"public.a": "put back into its publication"}
    assert rejoined(last, {"public.b": []}) == {}  # a row gone: still published, or gone
    assert rejoined(record(None), now) == {}  # a record from before they were kept
