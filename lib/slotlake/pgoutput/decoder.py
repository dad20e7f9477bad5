"""The fast pgoutput decoder: one payload in, one message object out.

Speed comes from doing as little Python as possible per message: one dict
dispatch on the type byte, precompiled ``struct`` unpackers reading straight
from the payload at an offset, ``bytes``/``str`` slices for strings and values,
and message objects built with ``tuple.__new__`` (they are NamedTuples) instead
of their Python-level constructors.

Most of the time goes into TupleData, the column values of Insert, Update and
Delete, so that has a parser per column count, generated from a template and
compiled on first use (:func:`_compile_tuple_parser`): the loop over the columns
unrolled, one local per value, one tuple built at the end. On the
``bench/decode_bench.py`` corpus (8-column rows) that takes 7–10 % off an Insert or
Update against a loop over the columns, and (with a run of NULLs read in one step)
a third off a key-only Delete.

The fast parsers do not track *where* they are for error messages. Every
malformed input makes them raise something — ``struct.error`` or
``IndexError`` when a read runs past the end, ``ValueError`` for a missing NUL
or invalid UTF-8, ``_Malformed`` for the checks Python would not do by itself
(a value length past the end, a bad kind byte, trailing bytes). :func:`decode`
catches all of these once, at the top, and hands the payload to the reference
parser in :mod:`slotlake.pgoutput.checked`, which re-reads it field by field and
raises a :class:`DecodeError` naming the message type, field and offset. A
valid message therefore pays for no bookkeeping at all.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from slotlake.lsn import Lsn
from slotlake.pgoutput.checked import _Reader, decode_checked
from slotlake.pgoutput.messages import (
    MESSAGE_TYPES_BY_CODE,
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

__all__ = ["decode"]

AnyMessage = (
    Begin
    | Message
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)


class _Malformed(Exception):
    """Raised by the fast parsers; never escapes decode()."""


# Bound methods of precompiled structs; all read big-endian (network order).
_u16 = struct.Struct(">H").unpack_from
_kind_len = struct.Struct(">BI").unpack_from
_head = struct.Struct(">IBH").unpack_from  # relation oid, tuple marker, column count
_stream_head = struct.Struct(">IIBH").unpack_from  # the same after a streamed xid
_u32 = struct.Struct(">I").unpack_from
_u32_u32 = struct.Struct(">II").unpack_from
_begin_s = struct.Struct(">QqI")
_commit_s = struct.Struct(">BQQq")
_u64 = struct.Struct(">Q").unpack_from
_message_s = struct.Struct(">BQ")
_column_s = struct.Struct(">Ii")  # type oid (unsigned), typmod (signed: -1 is common)
_stream_start_s = struct.Struct(">IB")
_stream_commit_s = struct.Struct(">IBQQq")
_stream_abort_s = struct.Struct(">II")
_stream_abort_v4_s = struct.Struct(">IIQq")
_begin_prepare_s = struct.Struct(">QQqI")
_prepare_s = struct.Struct(">BQQqI")
_rollback_prepared_s = struct.Struct(">BQQqqI")

_new_tuple = tuple.__new__
_new_int = int.__new__
_PAD = bytes(4)

_N, _K, _O = 0x4E, 0x4B, 0x4F  # 'N', 'K', 'O' tuple markers
_REPLICA_IDENTITY = {0x64: "d", 0x6E: "n", 0x66: "f", 0x69: "i"}


_TupleParser = Callable[[bytes, int], tuple[tuple[TupleValue, ...], int]]

# PostgreSQL's MaxTupleAttributeNumber: no server sends a TupleData with more columns.
_MAX_COLUMNS = 1664

# One column of a TupleData, as source text for _compile_tuple_parser: what would
# be the body of a loop over the columns, unrolled. With the column index fixed,
# each value goes to its own local (v0, v1, …) and the row is one BUILD_TUPLE at
# the end: no loop counter, no list to fill, no list-to-tuple copy. One struct call
# reads the kind byte and the 4 bytes after it (the value length for 't'/'b'); the
# payload is zero-padded so that this read also works for an 'n'/'u' in the last
# 4 bytes, and a kind read in the padding is 0, which is no valid kind. The locals
# start as None, so an 'n' column only steps over its byte.
_COLUMN = """
        kind, n = _kind_len(padded, pos)
        if kind == 0x74:  # 't'
            pos += 5
            if text is None:
                v{i} = padded[pos : (pos := pos + n)].decode()
            else:
                v{i} = text[pos : (pos := pos + n)]
        elif kind == 0x6E:  # 'n'{null_run}
            pos += 1
        elif kind == 0x75:  # 'u'
            v{i} = _toast
            pos += 1
        elif kind == 0x62:  # 'b'
            pos += 5
            v{i} = padded[pos : (pos := pos + n)]
        else:
            raise _Malformed"""

# A key-only old tuple (that of a DELETE under the default replica identity) is its
# key columns and then an 'n' byte per other column. When the 4 bytes after an 'n'
# are 'nnnn' as well, one count() tells whether all the columns left are NULL and,
# if they are, the row ends there instead of reading them one by one.
_NULL_RUN = """
            if n == 0x6E6E6E6E and padded.count(0x6E, pos, pos + {left}) == {left}:
                pos += {left}
                break"""


def _compile_tuple_parser(ncols: int) -> _TupleParser:
    """A parser of a TupleData of ``ncols`` columns: ``(buf, pos) → (values, end)``.

    ``pos`` is the offset of the first column (after the column count), ``end``
    the offset after the last one. Nothing is bounds-checked per value: a value
    running past the end of ``buf`` pushes ``end`` past ``len(buf)`` (lengths are
    read unsigned, so a negative Int32 does the same), and the caller must compare
    ``end`` with where the message goes on. Text values are slices of one ASCII
    decode of the whole payload when it is ASCII (byte offsets are then character
    offsets), else decoded value by value.
    """
    names = [f"v{i}" for i in range(ncols)]
    columns = "".join(
        _COLUMN.format(i=i, null_run=_NULL_RUN.format(left=ncols - i) if ncols - i >= 5 else "")
        for i in range(ncols)
    )
    source = f"""\
def parse(buf, pos, _kind_len=_kind_len, _toast=UNCHANGED_TOAST, _pad=_PAD):
    padded = buf + _pad
    text = padded.decode("ascii") if buf.isascii() else None
    {" = ".join([*names, "None"])}
    while True:  # runs once: a break is a run of NULLs ending the row early{columns}
        break
    return ({"".join(f"{name}, " for name in names)}), pos
"""
    namespace: dict[str, Any] = {
        "_kind_len": _kind_len,
        "UNCHANGED_TOAST": UNCHANGED_TOAST,
        "_PAD": _PAD,
        "_Malformed": _Malformed,
    }
    exec(compile(source, f"<pgoutput TupleData of {ncols} columns>", "exec"), namespace)
    return namespace["parse"]  # type: ignore[no-any-return]


def _wide_tuple(buf: bytes, pos: int) -> tuple[tuple[TupleValue, ...], int]:
    # More columns than PostgreSQL allows, so never sent by a server: not worth
    # compiling a parser that size for; the reference parser reads it instead.
    reader = _Reader(buf, "TupleData")
    reader.pos = pos - 2  # at the column count, which it reads itself
    return reader.tuple_data("tuple"), reader.pos


class _TupleParsers(dict[int, _TupleParser]):
    """Column count → the TupleData parser for it, compiled on first use.

    A table's column count rarely changes, so a process compiles few of them
    (about 1 ms for 10 columns, 0.25 s for 1664).
    """

    def __missing__(self, ncols: int) -> _TupleParser:
        def first_use(buf: bytes, pos: int) -> tuple[tuple[TupleValue, ...], int]:
            # Every column takes a byte at least: a column count the payload cannot
            # hold is malformed, and is not worth compiling a parser for.
            if ncols > len(buf) - pos:
                raise _Malformed
            if ncols > _MAX_COLUMNS:
                return _wide_tuple(buf, pos)
            parser = self.get(ncols)  # compiled since, if this was held on to
            if parser is None:
                parser = self[ncols] = _compile_tuple_parser(ncols)
            return parser(buf, pos)

        return first_use


_TUPLE_PARSERS = _TupleParsers()


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode(), end + 1


def _begin(buf: bytes, in_stream: bool) -> Begin:
    if len(buf) != 21:
        raise _Malformed
    final_lsn, ts, xid = _begin_s.unpack_from(buf, 1)
    return _new_tuple(Begin, (_new_int(Lsn, final_lsn), ts, xid))  # type: ignore[no-any-return]


def _commit(buf: bytes, in_stream: bool) -> Commit:
    if len(buf) != 26:
        raise _Malformed
    flags, commit_lsn, end_lsn, ts = _commit_s.unpack_from(buf, 1)
    return _new_tuple(  # type: ignore[no-any-return]
        Commit, (flags, _new_int(Lsn, commit_lsn), _new_int(Lsn, end_lsn), ts)
    )


def _insert(buf: bytes, in_stream: bool) -> Insert:
    if in_stream:
        xid, oid, marker, ncols = _stream_head(buf, 1)
        pos = 12
    else:
        xid = None
        oid, marker, ncols = _head(buf, 1)
        pos = 8
    if marker != _N:
        raise _Malformed
    new, pos = _TUPLE_PARSERS[ncols](buf, pos)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(Insert, (xid, oid, new))  # type: ignore[no-any-return]


def _update(buf: bytes, in_stream: bool) -> Update:
    if in_stream:
        xid, oid, marker, ncols = _stream_head(buf, 1)
        pos = 12
    else:
        xid = None
        oid, marker, ncols = _head(buf, 1)
        pos = 8
    if marker == _N:
        old_kind = old = None
    elif marker in (_K, _O):
        old_kind = "K" if marker == _K else "O"
        old, pos = _TUPLE_PARSERS[ncols](buf, pos)
        # buf, not a padded copy: a position at or past the end raises here.
        if buf[pos] != _N:
            raise _Malformed
        (ncols,) = _u16(buf, pos + 1)
        pos += 3
    else:
        raise _Malformed
    new, pos = _TUPLE_PARSERS[ncols](buf, pos)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(Update, (xid, oid, old_kind, old, new))  # type: ignore[no-any-return]


def _delete(buf: bytes, in_stream: bool) -> Delete:
    if in_stream:
        xid, oid, marker, ncols = _stream_head(buf, 1)
        pos = 12
    else:
        xid = None
        oid, marker, ncols = _head(buf, 1)
        pos = 8
    if marker == _K:
        old_kind = "K"
    elif marker == _O:
        old_kind = "O"
    else:
        raise _Malformed
    old, pos = _TUPLE_PARSERS[ncols](buf, pos)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(Delete, (xid, oid, old_kind, old))  # type: ignore[no-any-return]


def _relation(buf: bytes, in_stream: bool) -> Relation:
    if in_stream:
        xid, oid = _u32_u32(buf, 1)
        pos = 9
    else:
        xid = None
        (oid,) = _u32(buf, 1)
        pos = 5
    namespace, pos = _string(buf, pos)
    name, pos = _string(buf, pos)
    replica_identity = _REPLICA_IDENTITY[buf[pos]]
    (ncols,) = _u16(buf, pos + 1)
    pos += 3
    if ncols * 10 > len(buf) - pos:  # 10 = smallest column; bounds the loop below
        raise _Malformed
    columns = []
    for _ in range(ncols):
        flags = buf[pos]
        end = buf.index(0, pos + 1)
        col_name = buf[pos + 1 : end].decode()
        type_oid, typmod = _column_s.unpack_from(buf, end + 1)
        pos = end + 9
        columns.append(_new_tuple(RelationColumn, (flags, col_name, type_oid, typmod)))
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(  # type: ignore[no-any-return]
        Relation, (xid, oid, namespace, name, replica_identity, tuple(columns))
    )


def _type(buf: bytes, in_stream: bool) -> Type:
    if in_stream:
        xid, oid = _u32_u32(buf, 1)
        pos = 9
    else:
        xid = None
        (oid,) = _u32(buf, 1)
        pos = 5
    namespace, pos = _string(buf, pos)
    name, pos = _string(buf, pos)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(Type, (xid, oid, namespace, name))  # type: ignore[no-any-return]


def _truncate(buf: bytes, in_stream: bool) -> Truncate:
    if in_stream:
        xid, n = _u32_u32(buf, 1)
        pos = 9
    else:
        xid = None
        (n,) = _u32(buf, 1)
        pos = 5
    options = buf[pos]
    pos += 1
    if len(buf) - pos != 4 * n:
        raise _Malformed
    oids = struct.unpack_from(f">{n}I", buf, pos)
    return _new_tuple(Truncate, (xid, options, oids))  # type: ignore[no-any-return]


def _message(buf: bytes, in_stream: bool) -> Message:
    if in_stream:
        (xid,) = _u32(buf, 1)
        pos = 5
    else:
        xid = None
        pos = 1
    flags, lsn = _message_s.unpack_from(buf, pos)
    if flags > 1:
        raise _Malformed
    prefix, pos = _string(buf, pos + 9)
    (n,) = _u32(buf, pos)
    pos += 4
    if len(buf) - pos != n:
        raise _Malformed
    return _new_tuple(  # type: ignore[no-any-return]
        Message, (xid, flags == 1, _new_int(Lsn, lsn), prefix, buf[pos:])
    )


def _origin(buf: bytes, in_stream: bool) -> Origin:
    (lsn,) = _u64(buf, 1)
    name, pos = _string(buf, 9)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(Origin, (_new_int(Lsn, lsn), name))  # type: ignore[no-any-return]


def _stream_start(buf: bytes, in_stream: bool) -> StreamStart:
    if len(buf) != 6:
        raise _Malformed
    xid, first = _stream_start_s.unpack_from(buf, 1)
    if first > 1:
        raise _Malformed
    return _new_tuple(StreamStart, (xid, first == 1))  # type: ignore[no-any-return]


_STREAM_STOP = StreamStop()


def _stream_stop(buf: bytes, in_stream: bool) -> StreamStop:
    if len(buf) != 1:
        raise _Malformed
    return _STREAM_STOP


def _stream_commit(buf: bytes, in_stream: bool) -> StreamCommit:
    if len(buf) != 30:
        raise _Malformed
    xid, flags, commit_lsn, end_lsn, ts = _stream_commit_s.unpack_from(buf, 1)
    return _new_tuple(  # type: ignore[no-any-return]
        StreamCommit, (xid, flags, _new_int(Lsn, commit_lsn), _new_int(Lsn, end_lsn), ts)
    )


def _stream_abort(buf: bytes, in_stream: bool) -> StreamAbort:
    # The payload length is the only thing telling the two protocol-4 shapes apart.
    size = len(buf)
    if size == 9:
        xid, subxid = _stream_abort_s.unpack_from(buf, 1)
        return _new_tuple(StreamAbort, (xid, subxid, None, None))  # type: ignore[no-any-return]
    if size == 25:
        xid, subxid, lsn, ts = _stream_abort_v4_s.unpack_from(buf, 1)
        return _new_tuple(  # type: ignore[no-any-return]
            StreamAbort, (xid, subxid, _new_int(Lsn, lsn), ts)
        )
    raise _Malformed


def _begin_prepare(buf: bytes, in_stream: bool) -> BeginPrepare:
    prepare_lsn, end_lsn, ts, xid = _begin_prepare_s.unpack_from(buf, 1)
    gid, pos = _string(buf, 29)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(  # type: ignore[no-any-return]
        BeginPrepare, (_new_int(Lsn, prepare_lsn), _new_int(Lsn, end_lsn), ts, xid, gid)
    )


def _prepare_like(cls: Any) -> Callable[[bytes, bool], Any]:
    # Prepare, CommitPrepared and StreamPrepare share one layout.
    def parse(buf: bytes, in_stream: bool) -> Any:
        flags, lsn1, lsn2, ts, xid = _prepare_s.unpack_from(buf, 1)
        gid, pos = _string(buf, 30)
        if pos != len(buf):
            raise _Malformed
        return _new_tuple(cls, (flags, _new_int(Lsn, lsn1), _new_int(Lsn, lsn2), ts, xid, gid))

    return parse


def _rollback_prepared(buf: bytes, in_stream: bool) -> RollbackPrepared:
    flags, lsn1, lsn2, ts1, ts2, xid = _rollback_prepared_s.unpack_from(buf, 1)
    gid, pos = _string(buf, 38)
    if pos != len(buf):
        raise _Malformed
    return _new_tuple(  # type: ignore[no-any-return]
        RollbackPrepared, (flags, _new_int(Lsn, lsn1), _new_int(Lsn, lsn2), ts1, ts2, xid, gid)
    )


_PARSERS: dict[int, Callable[[bytes, bool], Any]] = {
    ord(cls.type_code): fn
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

# Everything a fast parser can raise on malformed input. UnicodeDecodeError is a
# ValueError; KeyError covers an unknown type byte or replica identity.
_FAST_FAILURES = (_Malformed, struct.error, IndexError, ValueError, KeyError)


def decode(payload: bytes | bytearray | memoryview, in_stream: bool = False) -> AnyMessage:
    """Decode one pgoutput payload (a ``data`` value of ``pg_logical_slot_*_binary_changes``).

    ``in_stream`` says the payload lies between Stream Start and Stream Stop, where
    Relation, Type, Insert, Update, Delete, Truncate and Message carry a leading xid.
    Raises :class:`DecodeError` for any malformed payload.
    """
    if type(payload) is not bytes:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"pgoutput payload must be bytes-like, not {type(payload).__name__}")
        payload = bytes(payload)
    try:
        return _PARSERS[payload[0]](payload, in_stream)  # type: ignore[no-any-return]
    except _FAST_FAILURES:
        pass
    # Outside the except block, so the DecodeError does not chain the fast
    # parser's uninformative exception.
    decode_checked(payload, in_stream)
    cls = MESSAGE_TYPES_BY_CODE.get(payload[:1])
    raise DecodeError(
        cls and cls.__name__, None, 0, "internal error: the fast and checked decoders disagree"
    )
