"""Decoder for PostgreSQL's ``pgoutput`` logical replication protocol (1–4).

``decode(payload, in_stream=False)`` turns one payload into one immutable
message object; malformed input raises :class:`DecodeError` (a ValueError)
naming the message type, field and byte offset. No Spark, no database.
:mod:`slotlake.pgoutput.columnar` splits a whole Arrow column of one relation's
Insert/Update/Delete payloads at once, with NumPy, and declines (returns None) anything
but well-formed text datums outside streams, which then go through ``decode``.
"""

from slotlake.pgoutput.decoder import AnyMessage, decode
from slotlake.pgoutput.messages import (
    MESSAGE_TYPES,
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
    UnchangedToast,
    Update,
    pg_timestamp_to_datetime,
)

__all__ = [
    "MESSAGE_TYPES",
    "MESSAGE_TYPES_BY_CODE",
    "UNCHANGED_TOAST",
    "AnyMessage",
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
    "decode",
    "pg_timestamp_to_datetime",
]
