"""The reference pgoutput parser: every read bounds-checked and named.

:func:`slotlake.pgoutput.decode` runs a hand-tuned parser that only knows *that*
a payload is malformed. When it fails, this parser runs over the same bytes to
say *what* is wrong, naming the message type, the field and its byte offset.
Being written field by field straight from the documented layouts, it doubles
as the specification the fast parser is tested against (same result or both
fail, on every input).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from slotlake.lsn import Lsn
from slotlake.pgoutput.messages import (
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
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleValue,
    Type,
    Update,
)

__all__ = ["decode_checked"]

_FIXED = {
    "u8": struct.Struct(">B"),
    "u16": struct.Struct(">H"),
    "u32": struct.Struct(">I"),
    "i32": struct.Struct(">i"),
    "u64": struct.Struct(">Q"),
    "i64": struct.Struct(">q"),
}


class _Reader:
    __slots__ = ("buf", "msg", "pos")

    def __init__(self, buf: bytes, msg: str) -> None:
        self.buf = buf
        self.msg = msg
        self.pos = 1  # the type byte is already consumed

    def fail(self, field: str | None, problem: str, offset: int | None = None) -> DecodeError:
        return DecodeError(self.msg, field, self.pos if offset is None else offset, problem)

    def _need(self, field: str, n: int) -> None:
        left = len(self.buf) - self.pos
        if n > left:
            raise self.fail(
                field,
                f"truncated reading {field!r} at offset {self.pos} (need {n} bytes, {left} left)",
            )

    def _int(self, field: str, kind: str) -> int:
        s = _FIXED[kind]
        self._need(field, s.size)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return int(v)

    def u8(self, field: str) -> int:
        return self._int(field, "u8")

    def u16(self, field: str) -> int:
        return self._int(field, "u16")

    def u32(self, field: str) -> int:
        return self._int(field, "u32")

    def i32(self, field: str) -> int:
        return self._int(field, "i32")

    def i64(self, field: str) -> int:
        return self._int(field, "i64")

    def lsn(self, field: str) -> Lsn:
        return Lsn(self._int(field, "u64"))

    def flag(self, field: str) -> bool:
        start = self.pos
        v = self.u8(field)
        if v not in (0, 1):
            raise self.fail(
                field, f"invalid value {v} for {field!r} at offset {start} (expected 0 or 1)", start
            )
        return v == 1

    def char(self, field: str, allowed: str) -> str:
        start = self.pos
        v = chr(self.u8(field))
        if v not in allowed:
            expected = ", ".join(repr(c) for c in allowed)
            raise self.fail(
                field,
                f"unexpected byte {v!r} for {field!r} at offset {start} (expected {expected})",
                start,
            )
        return v

    def raw(self, field: str, n: int) -> bytes:
        self._need(field, n)
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def text(self, field: str, raw: bytes, start: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad, reason = start + e.start, e.reason
        # Raised outside the except block so the traceback shows only the DecodeError.
        raise self.fail(field, f"invalid UTF-8 in {field!r} at offset {bad} ({reason})", bad)

    def string(self, field: str) -> str:
        start = self.pos
        end = self.buf.find(0, start)
        if end < 0:
            raise self.fail(
                field,
                f"truncated reading {field!r} at offset {start} (no NUL terminator in the "
                f"{len(self.buf) - start} bytes left)",
            )
        self.pos = end + 1
        return self.text(field, self.buf[start:end], start)

    def length(self, field: str) -> int:
        start = self.pos
        n = self.i32(field)
        if n < 0:
            raise self.fail(field, f"negative length {n} in {field!r} at offset {start}", start)
        return n

    def tuple_data(self, name: str) -> tuple[TupleValue, ...]:
        ncols = self.u16(f"{name}.ncolumns")
        left = len(self.buf) - self.pos
        if ncols > left:
            raise self.fail(
                f"{name}.ncolumns",
                f"column count {ncols} in '{name}.ncolumns' at offset {self.pos - 2} "
                f"needs at least {ncols} more bytes, {left} left",
                self.pos - 2,
            )
        values: list[TupleValue] = []
        for i in range(ncols):
            col = f"{name}[{i}]"
            start = self.pos
            kind = self.u8(f"{col}.kind")
            if kind == 0x6E:  # 'n'
                values.append(None)
            elif kind == 0x75:  # 'u'
                values.append(UNCHANGED_TOAST)
            elif kind in (0x74, 0x62):  # 't', 'b'
                n = self.length(f"{col}.length")
                value_start = self.pos
                raw = self.raw(f"{col}.value", n)
                values.append(self.text(f"{col}.value", raw, value_start) if kind == 0x74 else raw)
            else:
                raise self.fail(
                    f"{col}.kind",
                    f"unknown tuple value kind {chr(kind)!r} in '{col}.kind' at offset {start} "
                    "(expected 'n', 'u', 't' or 'b')",
                    start,
                )
        return tuple(values)

    def stream_xid(self, in_stream: bool) -> int | None:
        return self.u32("xid") if in_stream else None

    def end(self) -> None:
        extra = len(self.buf) - self.pos
        if extra:
            raise self.fail(
                "end", f"{extra} trailing byte(s) after the message at offset {self.pos}"
            )


def _begin(r: _Reader, in_stream: bool) -> Begin:
    return Begin(r.lsn("final_lsn"), r.i64("commit_ts"), r.u32("xid"))


def _message(r: _Reader, in_stream: bool) -> Message:
    xid = r.stream_xid(in_stream)
    transactional = r.flag("flags")
    lsn = r.lsn("lsn")
    prefix = r.string("prefix")
    n = r.length("content_length")
    return Message(xid, transactional, lsn, prefix, r.raw("content", n))


def _commit(r: _Reader, in_stream: bool) -> Commit:
    return Commit(r.u8("flags"), r.lsn("commit_lsn"), r.lsn("end_lsn"), r.i64("commit_ts"))


def _origin(r: _Reader, in_stream: bool) -> Origin:
    return Origin(r.lsn("commit_lsn"), r.string("name"))


def _relation(r: _Reader, in_stream: bool) -> Relation:
    xid = r.stream_xid(in_stream)
    oid = r.u32("oid")
    namespace = r.string("namespace")
    name = r.string("name")
    replica_identity = r.char("replica_identity", "dnfi")
    start = r.pos
    ncols = r.u16("ncolumns")
    # Smallest column: flags(1) + empty name(1) + type oid(4) + typmod(4).
    left = len(r.buf) - r.pos
    if ncols * 10 > left:
        raise r.fail(
            "ncolumns",
            f"column count {ncols} in 'ncolumns' at offset {start} needs at least "
            f"{ncols * 10} more bytes, {left} left",
            start,
        )
    columns = []
    for i in range(ncols):
        col = f"columns[{i}]"
        columns.append(
            RelationColumn(
                r.u8(f"{col}.flags"),
                r.string(f"{col}.name"),
                r.u32(f"{col}.type_oid"),
                r.i32(f"{col}.typmod"),
            )
        )
    return Relation(xid, oid, namespace, name, replica_identity, tuple(columns))


def _type(r: _Reader, in_stream: bool) -> Type:
    xid = r.stream_xid(in_stream)
    return Type(xid, r.u32("oid"), r.string("namespace"), r.string("name"))


def _insert(r: _Reader, in_stream: bool) -> Insert:
    xid = r.stream_xid(in_stream)
    oid = r.u32("relation_oid")
    r.char("tuple_kind", "N")
    return Insert(xid, oid, r.tuple_data("new"))


def _update(r: _Reader, in_stream: bool) -> Update:
    xid = r.stream_xid(in_stream)
    oid = r.u32("relation_oid")
    kind = r.char("tuple_kind", "KON")
    old_kind = old = None
    if kind != "N":
        old_kind = kind
        old = r.tuple_data("old")
        r.char("new_tuple_kind", "N")
    return Update(xid, oid, old_kind, old, r.tuple_data("new"))


def _delete(r: _Reader, in_stream: bool) -> Delete:
    xid = r.stream_xid(in_stream)
    oid = r.u32("relation_oid")
    kind = r.char("tuple_kind", "KO")
    return Delete(xid, oid, kind, r.tuple_data("old"))


def _truncate(r: _Reader, in_stream: bool) -> Truncate:
    xid = r.stream_xid(in_stream)
    start = r.pos
    n = r.u32("nrelations")
    options = r.u8("options")
    left = len(r.buf) - r.pos
    if n * 4 > left:
        raise r.fail(
            "nrelations",
            f"relation count {n} in 'nrelations' at offset {start} needs {n * 4} more bytes, "
            f"{left} left",
            start,
        )
    return Truncate(xid, options, tuple(r.u32(f"relation_oids[{i}]") for i in range(n)))


def _stream_start(r: _Reader, in_stream: bool) -> StreamStart:
    return StreamStart(r.u32("xid"), r.flag("first_segment"))


def _stream_stop(r: _Reader, in_stream: bool) -> StreamStop:
    return StreamStop()


def _stream_commit(r: _Reader, in_stream: bool) -> StreamCommit:
    return StreamCommit(
        r.u32("xid"), r.u8("flags"), r.lsn("commit_lsn"), r.lsn("end_lsn"), r.i64("commit_ts")
    )


def _stream_abort(r: _Reader, in_stream: bool) -> StreamAbort:
    xid = r.u32("xid")
    subxid = r.u32("subxid")
    if r.pos == len(r.buf):
        # Protocol < 4, or 4 without parallel streaming: no LSN and timestamp.
        return StreamAbort(xid, subxid, None, None)
    return StreamAbort(xid, subxid, r.lsn("abort_lsn"), r.i64("abort_ts"))


def _begin_prepare(r: _Reader, in_stream: bool) -> BeginPrepare:
    return BeginPrepare(
        r.lsn("prepare_lsn"), r.lsn("end_lsn"), r.i64("prepare_ts"), r.u32("xid"), r.string("gid")
    )


def _prepare_like(cls: Any) -> Callable[[_Reader, bool], Any]:
    def parse(r: _Reader, in_stream: bool) -> Any:
        return cls(
            r.u8("flags"),
            r.lsn(cls._fields[1]),
            r.lsn(cls._fields[2]),
            r.i64(cls._fields[3]),
            r.u32("xid"),
            r.string("gid"),
        )

    return parse


def _rollback_prepared(r: _Reader, in_stream: bool) -> RollbackPrepared:
    return RollbackPrepared(
        r.u8("flags"),
        r.lsn("prepare_end_lsn"),
        r.lsn("rollback_end_lsn"),
        r.i64("prepare_ts"),
        r.i64("rollback_ts"),
        r.u32("xid"),
        r.string("gid"),
    )


_PARSERS: dict[int, tuple[str, Callable[[_Reader, bool], Any]]] = {
    ord(cls.type_code): (cls.__name__, fn)
    for cls, fn in [
        (Begin, _begin),
        (Message, _message),
        (Commit, _commit),
        (Origin, _origin),
        (Relation, _relation),
        (Type, _type),
        (Insert, _insert),
        (Update, _update),
        (Delete, _delete),
        (Truncate, _truncate),
        (StreamStart, _stream_start),
        (StreamStop, _stream_stop),
        (StreamCommit, _stream_commit),
        (StreamAbort, _stream_abort),
        (BeginPrepare, _begin_prepare),
        (Prepare, _prepare_like(Prepare)),
        (CommitPrepared, _prepare_like(CommitPrepared)),
        (RollbackPrepared, _rollback_prepared),
        (StreamPrepare, _prepare_like(StreamPrepare)),
    ]
}


def decode_checked(payload: bytes, in_stream: bool = False) -> Any:
    """Decode one payload slowly, raising a DecodeError that pinpoints any defect."""
    buf = bytes(payload)
    if not buf:
        raise DecodeError(None, "type", 0, "empty payload (no message type byte at offset 0)")
    entry = _PARSERS.get(buf[0])
    if entry is None:
        raise DecodeError(None, "type", 0, f"unknown message type byte {buf[:1]!r} at offset 0")
    name, parse = entry
    r = _Reader(buf, name)
    msg = parse(r, in_stream)
    r.end()
    return msg
