"""The decoder against pgoutput payloads captured from real PostgreSQL 15 and 16 servers.

The vectors live in tests/golden/pg{15,16}/*.jsonl (regenerate with
``python tests/golden/capture.py``). Each file carries facts written down from the
workload that produced it; these tests check the decoded messages against those facts,
so the decoder is never compared with itself. ``verify_capture`` is shared with the
live tests (tests/integration/test_pgoutput_live.py).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slotlake.lsn import Lsn
from slotlake.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    DecodeError,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    decode,
)
from tests.golden.capture import VERSIONS, PeekRow, load, stored_files

# Written out here rather than taken from the decoder, so a wrong type_code shows.
CLASS_BY_CODE: dict[bytes, type[Any]] = {
    b"B": Begin,
    b"M": Message,
    b"C": Commit,
    b"O": Origin,
    b"R": Relation,
    b"Y": Type,
    b"I": Insert,
    b"U": Update,
    b"D": Delete,
    b"T": Truncate,
    b"S": StreamStart,
    b"E": StreamStop,
    b"c": StreamCommit,
    b"A": StreamAbort,
    b"b": BeginPrepare,
    b"P": Prepare,
    b"K": CommitPrepared,
    b"r": RollbackPrepared,
    b"p": StreamPrepare,
}
# The messages that carry a leading xid inside a stream (and only there).
STREAMABLE = (Relation, Type, Insert, Update, Delete, Truncate, Message)

GOLDEN_FILES = stored_files()


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


# --------------------------------------------------------------------------------------
# Shared verification (also used by the live tests)
# --------------------------------------------------------------------------------------


def value_json(value: Any) -> Any:
    """A decoded TupleData value in the expected-facts notation of capture.py."""
    if value is None or isinstance(value, str):
        return value
    if value is UNCHANGED_TOAST:
        return {"unchanged_toast": True}
    if isinstance(value, bytes):
        return {"binary": value.hex()}
    raise AssertionError(f"unexpected tuple value {value!r} ({type(value).__name__})")


def tuple_json(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else [value_json(v) for v in values]


def expand_expected(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unfold the compact ``I*`` ranges capture.py writes for big transactions."""
    out: list[dict[str, Any]] = []
    for change in changes:
        if change["op"] == "I*":
            for i in range(change["lo"], change["hi"] + 1):
                new = [t.format(i=i) for t in change["new"]]
                out.append({"op": "I", "table": change["table"], "new": new})
        else:
            out.append(change)
    return out


def decode_rows(rows: list[PeekRow]) -> list[Any]:
    return [decode(row.payload, in_stream=row.in_stream) for row in rows]


def _change_json(msg: Any, rel_names: dict[int, str]) -> dict[str, Any]:
    if isinstance(msg, Insert):
        return {"op": "I", "table": rel_names[msg.relation_oid], "new": tuple_json(msg.new)}
    if isinstance(msg, Update):
        return {
            "op": "U",
            "table": rel_names[msg.relation_oid],
            "old_kind": msg.old_kind,
            "old": tuple_json(msg.old),
            "new": tuple_json(msg.new),
        }
    if isinstance(msg, Delete):
        return {
            "op": "D",
            "table": rel_names[msg.relation_oid],
            "old_kind": msg.old_kind,
            "old": tuple_json(msg.old),
        }
    if isinstance(msg, Truncate):
        return {
            "op": "T",
            "tables": sorted(rel_names[o] for o in msg.relation_oids),
            "cascade": msg.cascade,
            "restart_identity": msg.restart_identity,
        }
    assert isinstance(msg, Message)
    return {
        "op": "M",
        "transactional": msg.transactional,
        "prefix": msg.prefix,
        "content_hex": bytes(msg.content).hex(),
    }


def replay(rows: list[PeekRow], msgs: list[Any]) -> list[dict[str, Any]]:
    """The changes a consumer must apply, in order, with the design's rules.

    Ordinary transactions apply at Commit; streamed ones buffer per xid and apply at
    Stream Commit; Stream Abort drops the whole transaction (xid == subxid) or the
    subtransaction's changes (they carry the subxid); prepared transactions apply at
    Commit Prepared, which may come in a later peek call than the Prepare.
    """
    applied: list[dict[str, Any]] = []
    prepared: dict[str, list[dict[str, Any]]] = {}
    call = None
    txn: list[dict[str, Any]] | None = None
    streams: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    current: list[tuple[int, dict[str, Any]]] | None = None
    rel_names: dict[int, str] = {}
    for row, msg in zip(rows, msgs, strict=True):
        if row.call != call:
            # Every peek call starts decoding afresh: Relation messages come again.
            call, txn, streams, current, rel_names = row.call, None, {}, None, {}
        if isinstance(msg, Relation):
            rel_names[msg.oid] = msg.name
        elif isinstance(msg, (Type, Origin)):
            pass
        elif isinstance(msg, (Begin, BeginPrepare)):
            assert txn is None and current is None, f"nested transaction at {row.lsn}"
            txn = []
        elif isinstance(msg, Commit):
            assert txn is not None, f"Commit without Begin at {row.lsn}"
            applied += txn
            txn = None
        elif isinstance(msg, Prepare):
            assert txn is not None, f"Prepare without Begin Prepare at {row.lsn}"
            prepared[msg.gid] = txn
            txn = None
        elif isinstance(msg, CommitPrepared):
            applied += prepared.pop(msg.gid)
        elif isinstance(msg, RollbackPrepared):
            prepared.pop(msg.gid)
        elif isinstance(msg, StreamStart):
            assert current is None, f"nested Stream Start at {row.lsn}"
            assert msg.first_segment == (msg.xid not in streams)
            current = streams.setdefault(msg.xid, [])
        elif isinstance(msg, StreamStop):
            assert current is not None
            current = None
        elif isinstance(msg, StreamCommit):
            applied += [c for _, c in streams.pop(msg.xid)]
        elif isinstance(msg, StreamAbort):
            if msg.xid == msg.subxid:
                streams.pop(msg.xid)
            else:
                streams[msg.xid] = [(x, c) for x, c in streams[msg.xid] if x != msg.subxid]
        elif isinstance(msg, StreamPrepare):
            prepared[msg.gid] = [c for _, c in streams.pop(msg.xid)]
        else:
            change = _change_json(msg, rel_names)
            if current is not None:
                current.append((msg.xid, change))
            elif txn is not None:
                txn.append(change)
            else:
                # Only a non-transactional message lives outside any transaction.
                assert isinstance(msg, Message) and not msg.transactional, row
                applied.append(change)
    assert txn is None and current is None, "capture ends inside a transaction"
    return applied


def verify_capture(header: dict[str, Any], rows: list[PeekRow]) -> list[Any]:
    """Decode every row and check it against the row's metadata and the expected facts."""
    expected = header["expected"]
    proto = int(header["options"]["proto_version"])
    msgs = decode_rows(rows)

    # -- every message: class, envelope fields against the peek's own columns ----------
    stream_xid: int | None = None
    for row, msg in zip(rows, msgs, strict=True):
        code = row.payload[:1]
        assert type(msg) is CLASS_BY_CODE[code], (row, msg)
        assert msg.type_code == code
        where = f"{header['scenario']} pg{header['pg_version']} row {row.lsn}: {msg!r}"[:300]
        if isinstance(msg, STREAMABLE):
            # A message outside a stream has no xid; inside, the (sub)transaction's xid.
            if row.in_stream:
                # The peek's xid column stays the top-level xid; the payload names the
                # subtransaction (a later, larger xid here) for changes made in one.
                assert row.xid == stream_xid, where
                assert msg.xid is not None and msg.xid >= row.xid, where
            else:
                assert msg.xid is None, where
        if isinstance(msg, (Begin, BeginPrepare, StreamStart)):
            assert msg.xid == row.xid, where
        if isinstance(msg, StreamStart):
            stream_xid = msg.xid
        elif isinstance(msg, StreamStop):
            stream_xid = None
        if isinstance(msg, (Commit, CommitPrepared, Prepare, StreamCommit, StreamPrepare)):
            # The peek's lsn column of a commit-like row is the end of its WAL record.
            assert msg.end_lsn == Lsn(row.lsn), where
            assert isinstance(msg.end_lsn, Lsn)
            assert msg.flags == 0
        if isinstance(msg, Commit):
            assert msg.commit_lsn < msg.end_lsn
        if isinstance(msg, (CommitPrepared, RollbackPrepared, StreamCommit, StreamPrepare)):
            assert msg.xid == row.xid, where
        if isinstance(msg, StreamAbort):
            parallel = header["options"].get("streaming") == "parallel"
            assert (msg.abort_lsn is not None) == parallel, where
            assert (msg.abort_ts is not None) == parallel, where
            if parallel:
                assert isinstance(msg.abort_lsn, Lsn)
        if isinstance(msg, Message) and msg.transactional is False:
            assert not row.in_stream
        if proto < 2:
            assert not isinstance(msg, (StreamStart, StreamStop, StreamCommit, StreamAbort))
        if proto < 3:
            assert not isinstance(msg, (BeginPrepare, Prepare, CommitPrepared, RollbackPrepared))

    # -- Begin/Commit pairing: Begin.final_lsn is its Commit's commit_lsn ---------------
    begin: Begin | None = None
    for msg in msgs:
        if isinstance(msg, Begin):
            begin = msg
        elif isinstance(msg, Commit):
            assert begin is not None
            assert begin.final_lsn == msg.commit_lsn
            assert begin.commit_ts == msg.commit_ts
            begin = None

    # -- relations and types ------------------------------------------------------------
    decoded_rels = {
        (
            r.oid,
            r.namespace,
            r.name,
            r.replica_identity,
            tuple((c.name, c.is_key, c.type_oid, c.typmod) for c in r.columns),
        )
        for r in msgs
        if isinstance(r, Relation)
    }
    expected_rels = {
        (
            r["oid"],
            r["namespace"],
            r["name"],
            r["replica_identity"],
            tuple(tuple(c) for c in r["columns"]),
        )
        for r in expected["relations"]
    }
    assert decoded_rels == expected_rels
    for r in msgs:
        if isinstance(r, Relation):
            for c in r.columns:
                assert c.flags in (0, 1) and c.is_key == bool(c.flags)
    decoded_types = {(t.oid, t.namespace, t.name) for t in msgs if isinstance(t, Type)}
    expected_types = {(t["oid"], t["namespace"], t["name"]) for t in expected.get("types", [])}
    assert decoded_types == expected_types
    # A Type message precedes the Relation that uses it.
    pending: set[int] = set()
    for msg in msgs:
        if isinstance(msg, Type):
            pending.add(msg.oid)
        elif isinstance(msg, Relation):
            used = {c.type_oid for c in msg.columns}
            assert pending <= used, (pending, msg)
            pending.clear()

    # -- the changes, applied with the transaction/stream/two-phase rules ---------------
    assert replay(rows, msgs) == expand_expected(expected["changes"])

    if "transactions" in expected:
        assert sum(isinstance(m, Begin) for m in msgs) == expected["transactions"]

    # -- origins: the Origin message right after Begin, before any change ---------------
    if "origins" in expected:
        origins = [m for m in msgs if isinstance(m, Origin)]
        assert [(o.name, str(o.commit_lsn)) for o in origins] == [
            (o["name"], o["commit_lsn"]) for o in expected["origins"]
        ]
        with_origin = []
        for i, msg in enumerate(msgs):
            if isinstance(msg, Begin):
                with_origin.append(isinstance(msgs[i + 1], Origin))
        assert with_origin == expected["transactions_with_origin"]

    # -- two-phase: one b…P (or S…E p) per gid, then K or r with the same xid -----------
    if "prepared" in expected:
        xid_of: dict[str, set[int]] = {}
        for m in msgs:
            if isinstance(
                m, (BeginPrepare, Prepare, StreamPrepare, CommitPrepared, RollbackPrepared)
            ):
                xid_of.setdefault(m.gid, set()).add(m.xid)
        for p in expected["prepared"]:
            gid = p["gid"]
            assert len(xid_of[gid]) == 1, xid_of
            kinds = [type(m) for m in msgs if getattr(m, "gid", None) == gid]
            head = [StreamPrepare] if p["streamed"] else [BeginPrepare, Prepare]
            tail = CommitPrepared if p["outcome"] == "commit" else RollbackPrepared
            assert kinds == [*head, tail], (gid, kinds)
        assert sorted(xid_of) == sorted(p["gid"] for p in expected["prepared"])
        assert len({r.call for r in rows}) == expected["calls"]

    if "stream_aborts" in expected:
        aborts = [m for m in msgs if isinstance(m, StreamAbort)]
        assert sum(a.xid == a.subxid for a in aborts) == expected["stream_aborts"]["toplevel"]
        assert sum(a.xid != a.subxid for a in aborts) == expected["stream_aborts"]["subtransaction"]
    return msgs


# --------------------------------------------------------------------------------------
# Tests over the stored corpus
# --------------------------------------------------------------------------------------


def test_corpus_exists_for_both_versions() -> None:
    for version in VERSIONS:
        names = {p.stem for p in stored_files(version)}
        assert {"basic_p1", "stream_p2", "two_phase_p3", "origin_p2", "toast_p1"} <= names
    assert {p.stem for p in stored_files(16)} >= {"basic_p4", "stream_parallel_p4"}
    total = sum(p.stat().st_size for p in GOLDEN_FILES)
    assert total < 5_000_000, f"golden corpus grew to {total} bytes"


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=_id)
def test_golden_vectors_decode_to_the_recorded_facts(path: Path) -> None:
    header, rows = load(path)
    assert rows, "empty capture"
    assert header["pg_version"] == int(path.parent.name[2:])
    verify_capture(header, rows)


def test_every_message_type_appears_in_the_corpus() -> None:
    seen: Counter[bytes] = Counter()
    for path in GOLDEN_FILES:
        _, rows = load(path)
        for row in rows:
            seen[type(decode(row.payload, in_stream=row.in_stream)).type_code] += 1
    assert set(seen) == set(CLASS_BY_CODE), set(CLASS_BY_CODE) - set(seen)


def test_streamed_variants_of_every_streamable_message_appear() -> None:
    # R/Y/I/U/D/T/M each occur inside a stream (with the leading xid) somewhere.
    seen: set[type[Any]] = set()
    for path in GOLDEN_FILES:
        _, rows = load(path)
        for row in rows:
            if row.in_stream:
                seen.add(type(decode(row.payload, in_stream=True)))
    assert set(STREAMABLE) <= seen


def test_binary_and_text_tuples_both_appear() -> None:
    kinds: set[type[Any]] = set()
    for path in GOLDEN_FILES:
        _, rows = load(path)
        for msg in decode_rows(rows):
            for values in (getattr(msg, "new", None), getattr(msg, "old", None)):
                for v in values or ():
                    kinds.add(type(v))
    assert {str, bytes, type(None), type(UNCHANGED_TOAST)} <= kinds


def _distinct_shapes(per_shape: int = 3) -> list[tuple[bytes, bool]]:
    """A few payloads per (type, in_stream, length): the thousands of same-shaped rows
    of the streamed transactions would add time, not coverage."""
    shapes: dict[tuple[bytes, bool, int], list[bytes]] = {}
    for path in GOLDEN_FILES:
        _, rows = load(path)
        for row in rows:
            bucket = shapes.setdefault((row.payload[:1], row.in_stream, len(row.payload)), [])
            if len(bucket) < per_shape and row.payload not in bucket:
                bucket.append(row.payload)
    return [(p, key[1]) for key, bucket in shapes.items() for p in bucket]


def _valid_prefix(payload: bytes, cut: int) -> bool:
    # Stream Abort is 9 bytes before protocol 4 and 25 bytes with parallel streaming;
    # decode() is not told the protocol, so the 9-byte prefix of the longer form is a
    # well-formed older Stream Abort.
    return payload[:1] == b"A" and len(payload) == 25 and cut == 9


def test_every_truncation_of_every_golden_payload_is_a_decode_error() -> None:
    payloads = _distinct_shapes()
    assert {p[:1] for p, _ in payloads} == set(CLASS_BY_CODE)
    rng = random.Random(20240601)
    # Keep it a unit-test loop: every cut of short payloads, a sample of the long ones.
    budget_per_payload = 2000
    started = time.monotonic()
    checked = 0
    for payload, in_stream in payloads:
        cuts = range(len(payload))
        if len(payload) > budget_per_payload:
            cuts = sorted(
                {0, 1, len(payload) - 1, *rng.sample(range(len(payload)), budget_per_payload)}
            )
        for cut in cuts:
            if _valid_prefix(payload, cut):
                continue
            with pytest.raises(DecodeError) as info:
                decode(payload[:cut], in_stream=in_stream)
            err = info.value
            assert 0 <= err.offset <= cut, (payload[:40], cut, err.offset)
            checked += 1
    elapsed = time.monotonic() - started
    assert checked > 10_000, checked
    assert elapsed < 20, f"truncation sweep took {elapsed:.1f}s"


def test_unknown_type_byte_is_a_decode_error() -> None:
    for code in (b"Z", b"\x00", b"x"):
        with pytest.raises(DecodeError):
            decode(code + b"\x00" * 16)


def test_a_trailing_byte_on_any_golden_payload_is_a_decode_error() -> None:
    # Every message either ends at a fixed point or carries its own counts/lengths, so
    # one byte too many means a framing bug upstream (or a wrong in_stream flag).
    for payload, in_stream in _distinct_shapes(per_shape=1):
        with pytest.raises(DecodeError):
            decode(payload + b"\x00", in_stream=in_stream)


def test_in_stream_flag_matters_for_streamable_messages() -> None:
    # The same bytes read with the wrong in_stream either fail or read a different xid.
    for payload, in_stream in _distinct_shapes(per_shape=1):
        if not in_stream or payload[:1] not in b"RYIUDTM":
            continue
        right = decode(payload, in_stream=True)
        try:
            wrong = decode(payload, in_stream=False)
        except DecodeError:
            continue
        assert wrong != right


def _golden_insert(prefix: bytes = b"I") -> bytes:
    """A real text Insert from the corpus (people row 1: twelve columns, all 't')."""
    _, rows = load(Path(GOLDEN_FILES[0]).parent / "basic_p1.jsonl")
    return next(r.payload for r in rows if r.payload[:1] == prefix)


def test_mutated_golden_insert_is_a_decode_error_naming_the_offset() -> None:
    payload = _golden_insert()
    ncols = int.from_bytes(payload[6:8], "big")
    assert payload[5:6] == b"N" and ncols == 12
    mutations = {
        # One column more or fewer than the TupleData holds.
        "count+1": payload[:6] + (ncols + 1).to_bytes(2, "big") + payload[8:],
        "count-1": payload[:6] + (ncols - 1).to_bytes(2, "big") + payload[8:],
        # An unknown column kind where the first value's 't' is.
        "kind": payload[:8] + b"x" + payload[9:],
        # Not a new-tuple marker.
        "marker": payload[:5] + b"Q" + payload[6:],
        # A length running past the end.
        "length": payload[:9] + (len(payload)).to_bytes(4, "big") + payload[13:],
    }
    for name, bad in mutations.items():
        with pytest.raises(DecodeError) as info:
            decode(bad)
        assert 0 <= info.value.offset <= len(bad), name
        assert "Insert" in str(info.value) or info.value.message_type == "Insert", name


def test_invalid_utf8_in_a_text_value_is_a_decode_error() -> None:
    payload = _golden_insert()
    # people.name of row 1 is 'Ada': make it three bytes that are not UTF-8.
    at = payload.index(b"Ada")
    bad = payload[:at] + b"\xff\xfe\xfd" + payload[at + 3 :]
    with pytest.raises(DecodeError):
        decode(bad)
