"""The pgoutput message types, the unchanged-TOAST sentinel and the decode error.

Layouts: PostgreSQL "Logical Replication Message Formats" (protocol 1–4), see
/work/shared/reference/pg16-logical-replication-message-formats.txt.

The classes are ``NamedTuple``\\s rather than dataclasses because the decoder builds
them with ``tuple.__new__`` (about three times cheaper than a frozen dataclass's
``__init__``), and they are immutable, hashable and picklable, which is what the
Spark executors need. Equality is tightened to "same class and same fields", so a
``Prepare`` never compares equal to a ``StreamPrepare`` (or to a plain tuple) that
happens to hold the same values.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from slotlake.lsn import Lsn

__all__ = [
    "MESSAGE_TYPES",
    "MESSAGE_TYPES_BY_CODE",
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "Commit",
    "CommitPrepared",
    "DecodeError",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "Prepare",
    "Relation",
    "RelationColumn",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
    "pg_timestamp_to_datetime",
]


class UnchangedToast:
    """Type of :data:`UNCHANGED_TOAST`: a column PostgreSQL did not send ('u').

    Only an UPDATE's new tuple carries it: the value is stored out of line and did
    not change, so the server omits it. It is *not* NULL; the value must come from
    elsewhere (old row, earlier event, prior state).
    """

    __slots__ = ()
    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        # One instance per process, so `is UNCHANGED_TOAST` works, including after
        # a pickle round trip to a Spark executor (see __reduce__).
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"

    def __copy__(self) -> UnchangedToast:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> UnchangedToast:
        return self


UNCHANGED_TOAST = UnchangedToast()

TupleValue = str | bytes | UnchangedToast | None
"""One column of TupleData: None ('n'), UNCHANGED_TOAST ('u'), str ('t'), bytes ('b')."""


class DecodeError(ValueError):
    """A payload that is not a well-formed pgoutput message.

    ``message_type`` is the class name of the message being decoded (None when the
    type byte itself is missing or unknown), ``field`` the field being read when the
    problem showed (e.g. ``'new[3].length'``), ``offset`` its byte offset in the
    payload.
    """

    def __init__(self, message_type: str | None, field: str | None, offset: int, problem: str):
        self.message_type = message_type
        self.field = field
        self.offset = offset
        self.problem = problem
        super().__init__(f"{message_type or 'pgoutput'}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message_type, self.field, self.offset, self.problem))


_PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_PG_TS_NOBEGIN = -(2**63)
_PG_TS_NOEND = 2**63 - 1


def pg_timestamp_to_datetime(us: int) -> datetime:
    """A PostgreSQL TimestampTz (int64 µs since 2000-01-01 UTC) as an aware UTC datetime."""
    try:
        return _PG_EPOCH + timedelta(microseconds=us)
    except OverflowError:
        if us == _PG_TS_NOBEGIN:
            what = "-infinity"
        elif us == _PG_TS_NOEND:
            what = "infinity"
        else:
            what = f"{us} µs since 2000-01-01"
        raise ValueError(
            f"PostgreSQL timestamp {what} is outside Python's datetime range (years 1–9999)"
        ) from None


def _strict_eq(self: tuple[Any, ...], other: object) -> bool:
    return type(self) is type(other) and tuple.__eq__(self, other)  # type: ignore[arg-type]


def _strict_ne(self: tuple[Any, ...], other: object) -> bool:
    return type(self) is not type(other) or tuple.__ne__(self, other)  # type: ignore[arg-type]


class Begin(NamedTuple):
    final_lsn: Lsn
    commit_ts: int
    xid: int

    type_code = b"B"

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


class Message(NamedTuple):
    """A logical decoding message (``pg_logical_emit_message``)."""

    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes

    type_code = b"M"


class Commit(NamedTuple):
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int

    type_code = b"C"

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


class Origin(NamedTuple):
    commit_lsn: Lsn
    name: str

    type_code = b"O"


class RelationColumn(NamedTuple):
    """One published column of a Relation message."""

    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


class Relation(NamedTuple):
    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]

    type_code = b"R"


class Type(NamedTuple):
    xid: int | None
    oid: int
    namespace: str
    name: str

    type_code = b"Y"


class Insert(NamedTuple):
    xid: int | None
    relation_oid: int
    new: tuple[TupleValue, ...]

    type_code = b"I"


class Update(NamedTuple):
    xid: int | None
    relation_oid: int
    old_kind: str | None
    old: tuple[TupleValue, ...] | None
    new: tuple[TupleValue, ...]

    type_code = b"U"


class Delete(NamedTuple):
    xid: int | None
    relation_oid: int
    old_kind: str
    old: tuple[TupleValue, ...]

    type_code = b"D"


class Truncate(NamedTuple):
    xid: int | None
    options: int
    relation_oids: tuple[int, ...]

    type_code = b"T"

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


class StreamStart(NamedTuple):
    xid: int
    first_segment: bool

    type_code = b"S"


class StreamStop(NamedTuple):
    type_code = b"E"


class StreamCommit(NamedTuple):
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int

    type_code = b"c"

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


class StreamAbort(NamedTuple):
    """Abort of a streamed (sub)transaction; ``xid == subxid`` aborts the whole transaction.

    ``abort_lsn``/``abort_ts`` exist only when protocol 4 parallel streaming was requested.
    """

    xid: int
    subxid: int
    abort_lsn: Lsn | None
    abort_ts: int | None

    type_code = b"A"

    @property
    def abort_time(self) -> datetime | None:
        return None if self.abort_ts is None else pg_timestamp_to_datetime(self.abort_ts)


class BeginPrepare(NamedTuple):
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    type_code = b"b"

    @property
    def prepare_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.prepare_ts)


class Prepare(NamedTuple):
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    type_code = b"P"

    @property
    def prepare_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.prepare_ts)


class CommitPrepared(NamedTuple):
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: int
    xid: int
    gid: str

    type_code = b"K"

    @property
    def commit_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.commit_ts)


class RollbackPrepared(NamedTuple):
    flags: int
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str

    type_code = b"r"

    @property
    def prepare_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.prepare_ts)

    @property
    def rollback_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.rollback_ts)


class StreamPrepare(NamedTuple):
    flags: int
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_ts: int
    xid: int
    gid: str

    type_code = b"p"

    @property
    def prepare_time(self) -> datetime:
        return pg_timestamp_to_datetime(self.prepare_ts)


MESSAGE_TYPES: tuple[type[Any], ...] = (
    Begin,
    Message,
    Commit,
    Origin,
    Relation,
    Type,
    Insert,
    Update,
    Delete,
    Truncate,
    StreamStart,
    StreamStop,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    StreamPrepare,
)

MESSAGE_TYPES_BY_CODE: dict[bytes, type[Any]] = {cls.type_code: cls for cls in MESSAGE_TYPES}

# Assigned after class creation: a NamedTuple body may define __eq__, but then
# __hash__ would silently become None; tuple's hash stays consistent with the
# stricter equality (equal objects are equal tuples).
for _cls in (*MESSAGE_TYPES, RelationColumn):
    _cls.__eq__ = _strict_eq  # type: ignore[method-assign,assignment]
    _cls.__ne__ = _strict_ne  # type: ignore[method-assign,assignment]
    _cls.__hash__ = tuple.__hash__  # type: ignore[method-assign,assignment]
del _cls
