"""Human-readable rendering of pgoutput messages, in the spirit of pg_recvlogical output
with test_decoding: one line per message, prefixed by its LSN.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from slotlake.lsn import Lsn
from slotlake.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    decode,
    pg_timestamp_to_datetime,
)

if TYPE_CHECKING:
    from slotlake.config import Config

_MAX_VALUE = 120


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if v is UNCHANGED_TOAST:
        return "unchanged-toast-datum"
    text = "\\x" + v.hex() if isinstance(v, bytes) else "'" + v.replace("'", "''") + "'"
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."


def _tuple(values: tuple, rel: Relation | None, key_only: bool = False) -> str:
    parts = []
    for i, v in enumerate(values):
        if rel is not None and i < len(rel.columns):
            col = rel.columns[i]
            if key_only and not col.is_key:
                continue
            parts.append(f"{col.name}[{col.type_oid}]:{_value(v)}")
        else:
            parts.append(f"${i + 1}:{_value(v)}")
    return " ".join(parts)


def _ts(us: int) -> str:
    try:
        return pg_timestamp_to_datetime(us).isoformat()
    except ValueError:
        return f"{us}us"


def format_message(msg: Any, relations: dict[int, Relation]) -> str:
    """One line for one decoded message; ``relations`` is updated by Relation messages."""
    if isinstance(msg, Begin):
        return f"BEGIN {msg.xid} (commit {msg.final_lsn} at {_ts(msg.commit_ts)})"
    if isinstance(msg, Commit):
        return f"COMMIT (lsn {msg.commit_lsn}, end {msg.end_lsn}, at {_ts(msg.commit_ts)})"
    if isinstance(msg, Relation):
        relations[msg.oid] = msg
        cols = ", ".join(f"{c.name} {c.type_oid}{' key' if c.is_key else ''}" for c in msg.columns)
        return f"RELATION {msg.namespace}.{msg.name} (oid {msg.oid}, replica identity {msg.replica_identity}): {cols}"
    if isinstance(msg, Type):
        return f"TYPE {msg.oid} = {msg.namespace or 'pg_catalog'}.{msg.name}"
    if isinstance(msg, (Insert, Update, Delete)):
        rel = relations.get(msg.relation_oid)
        name = f"{rel.namespace}.{rel.name}" if rel else f"oid {msg.relation_oid}"
        if isinstance(msg, Insert):
            return f"table {name}: INSERT: {_tuple(msg.new, rel)}"
        if isinstance(msg, Update):
            old = ""
            if msg.old_kind == "K":
                old = f"old-key: {_tuple(msg.old, rel, key_only=True)} new-tuple: "
            elif msg.old_kind == "O":
                old = f"old-row: {_tuple(msg.old, rel)} new-tuple: "
            return f"table {name}: UPDATE: {old}{_tuple(msg.new, rel)}"
        label = "old-key" if msg.old_kind == "K" else "old-row"
        return (
            f"table {name}: DELETE: {label}: {_tuple(msg.old, rel, key_only=msg.old_kind == 'K')}"
        )
    if isinstance(msg, Truncate):
        names = [
            f"{relations[o].namespace}.{relations[o].name}" if o in relations else f"oid {o}"
            for o in msg.relation_oids
        ]
        opts = [
            o
            for o, on in (("cascade", msg.cascade), ("restart_identity", msg.restart_identity))
            if on
        ]
        return f"TRUNCATE {', '.join(names)}" + (f" ({', '.join(opts)})" if opts else "")
    if isinstance(msg, Message):
        kind = "transactional" if msg.transactional else "non-transactional"
        return f"MESSAGE {kind} prefix {msg.prefix!r} ({len(msg.content)} bytes): {_value(bytes(msg.content))}"
    if isinstance(msg, Origin):
        return f"ORIGIN {msg.name!r} (commit {msg.commit_lsn})"
    if isinstance(msg, StreamStart):
        return f"STREAM START {msg.xid}{' (first segment)' if msg.first_segment else ''}"
    if isinstance(msg, StreamStop):
        return "STREAM STOP"
    if isinstance(msg, StreamCommit):
        return f"STREAM COMMIT {msg.xid} (lsn {msg.commit_lsn}, end {msg.end_lsn}, at {_ts(msg.commit_ts)})"
    if isinstance(msg, StreamAbort):
        return f"STREAM ABORT {msg.xid} subxact {msg.subxid}"
    return f"{type(msg).__name__.upper()} {msg}"


def format_rows(rows: Iterator[tuple[int, int, bytes]]) -> Iterator[str]:
    """(lsn, xid, payload) rows in peek order → lines."""
    relations: dict[int, Relation] = {}
    in_stream = False
    for lsn, xid, data in rows:
        msg = decode(data, in_stream=in_stream and data[:1] not in (b"E", b"c", b"A", b"S"))
        if isinstance(msg, StreamStart):
            in_stream = True
        elif isinstance(msg, StreamStop):
            in_stream = False
        yield f"{Lsn(lsn)} {xid:>10} {format_message(msg, relations)}"


class RawPathError(ValueError):
    """``--raw`` names no raw batch: a missing path, or a directory without part files."""


def check_raw_path(path: str) -> None:
    """Raise :class:`RawPathError` unless ``path`` is a raw Parquet file or a raw batch's
    directory. A lake's ``_raw`` holds one directory per batch: the message names them,
    as a silent run that prints nothing reads as an empty batch."""
    from pathlib import Path

    from slotlake.lake import first_names
    from slotlake.raw import PART_GLOB

    p = Path(path)
    if not p.exists():
        raise RawPathError(f"{path}: no such file or directory")
    if not p.is_dir() or any(p.glob(PART_GLOB)):
        return
    batches = sorted(d.name for d in p.iterdir() if d.is_dir() and any(d.glob(PART_GLOB)))
    if not batches:
        raise RawPathError(f"{path} holds no raw Parquet files ({PART_GLOB})")
    raise RawPathError(
        f"{path} is not one raw batch but holds {len(batches)} ({first_names(batches)}): "
        "pass one of them to --raw, or a committed batch's number to --batch with the "
        "lake's --config"
    )


def inspect_raw(path: str, limit: int = 0) -> Iterator[str]:
    """Lines for the messages of the raw batch at ``path`` (see :func:`check_raw_path`)."""
    from slotlake.raw import iter_raw

    check_raw_path(path)

    def rows() -> Iterator[tuple[int, int, bytes]]:
        for batch in iter_raw(path):
            for lsn, xid, data in zip(
                batch.column("lsn").to_pylist(),
                batch.column("xid").to_pylist(),
                batch.column("data").to_pylist(),
                strict=True,
            ):
                yield Lsn.from_signed(lsn), xid, data

    for i, line in enumerate(format_rows(rows())):
        if limit and i >= limit:
            return
        yield line


def inspect_live(cfg: Config, limit: int = 0) -> Iterator[str]:
    """Peek (never consume) the slot and render what it would deliver now."""
    from slotlake.sync import open_source

    with open_source(cfg, "inspect") as source:
        source.check()
        rows = source.peek_rows(source.current_flush_lsn(), limit=limit or None)
        yield from format_rows((Lsn(lsn), xid, data) for lsn, xid, data in rows)
