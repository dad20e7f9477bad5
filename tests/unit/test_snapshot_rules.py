"""The snapshot module's pure rules: DDL messages, published-set baselines, marker order."""

from __future__ import annotations

import json

from slotlake.lake import CommitRecord, TableCommit
from slotlake.lsn import Lsn
from slotlake.pgoutput.messages import Message
from slotlake.snapshot import DDL_PREFIX, TableSnapshot, _baseline, rewritten_by_ddl


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
