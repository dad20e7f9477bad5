"""The PostgreSQL side of a batch: lock, slot checks, peek into raw Parquet, advance.

``SlotSource`` owns one psycopg 3 connection (autocommit) to the source database.
The advisory lock, the session settings the decoder relies on, the peek and the
advance all happen on it, so one object is one run's view of the slot.

Transport (DESIGN.md §1 step 4). The peek function materialises its whole result
in a server-side tuplestore before the first row is returned, so the transport
only decides how fast the client drains that tuplestore and how much it holds at
once. Four are implemented, bounded to ``fetch_rows`` rows in flight (ADBC: one record
batch of the driver's):

* ``"adbc"`` (default; ``adbc-driver-postgresql`` is a dependency): Arrow's ADBC driver
  on a connection of its own (same DSN and libpq conventions, the same session
  settings), which runs the query as a binary COPY and parses it into Arrow record
  batches in C++. pg_lsn and xid arrive as their 8- and 4-byte send formats and are read
  with NumPy; the payloads stay one Arrow column into the raw writer. No Python runs per
  row: on the 1M-change backlog of bench/sync_bench.py the client's CPU went from
  4.3 s (``"stream"``) to 1.9 s and the pull from 2.1–2.9× to 1.5–1.7× the floor.
  Its connection first loads the database's type catalog, every table's row type
  included: 50 ms for a database of one table, 120 ms of 300, 370 ms of 2,000. A pull
  over less WAL than ``adbc_min_bytes`` (``source.adbc_min_mb``) is read by ``"stream"``
  on the session's connection instead: 27–72 ms for 10k–30k messages whatever the
  catalog; the two meet near 60 MiB of WAL (300k messages: 0.63 vs 0.68 s).
* ``"stream"`` (default without ADBC, libpq ≥ 17): one plain binary query in libpq's chunked
  rows mode (``Cursor.stream(size=fetch_rows)``). The server writes rows without
  waiting for a FETCH round trip, so its sending overlaps the client's work; TCP
  flow control bounds what is in flight. pg_lsn and xid use psycopg's C int8/oid
  loaders, as below.
* ``"cursor"`` (without ADBC, with an older libpq): ``DECLARE … CURSOR`` + ``FETCH
  fetch_rows`` with binary results; pg_lsn and xid are read by psycopg's C int8/oid
  loaders, so no Python code runs per value and only the row tuples are transposed
  into columns. The server idles while the client handles each batch.
* ``"copy"``: ``COPY (SELECT lsn, xid, data FROM peek(…)) TO STDOUT (FORMAT binary)``,
  each CopyData message parsed in place with one precompiled ``struct`` unpack.

A pull over at least ``split_bytes`` of WAL (``source.split_peek_mb``) with ADBC is cut
in two peeks the server decodes at once, the second from a temporary copy of the slot
advanced to the cut (``_pull_split``): the single peek's decoding runs on one core while
the other idles, and its client waits for all of it.

Measured on 255,001 changes (2,500 transactions of 60 inserts, 30 updates, 10
deletes; 34 MB of payload), 9 interleaved runs, PostgreSQL 16 / 15, on a shared
2-vCPU machine (medians; wall time is noisy there, client CPU is not):

                          wall s (median)   messages/s        x count(*) floor
                          PG16     PG15     PG16     PG15     PG16     PG15
    count(*) floor        0.83     0.57     308k     447k     1.00     1.00
    cursor → RawWriter    2.68     2.03      95k     125k     3.24     3.56
    copy   → RawWriter    2.89     2.17      88k     117k     3.50     3.80
    cursor, drain only    1.61     1.16     158k     220k     1.95     2.03
    copy,   drain only    2.19     1.30     117k     197k     2.64     2.27

Client CPU for the drain alone: cursor 0.38 / 0.27 s, COPY 0.69 / 0.49 s. COPY is
not faster: the server sends one CopyData message per row and psycopg's
``Copy.read()`` costs a Python generator round per message, more than FETCH's
per-row tuple construction in C. COPY is kept (``transport="copy"``, tested) for
re-measuring.

Later (bench/sync_bench.py, bench/README.md): the raw writer was made columnar
(vectorised envelope, Parquet on a writer thread), which took its client CPU from
about 2.5 to about 1 µs per row, and ``"stream"`` became the default: the same drain
CPU as the cursor (about 1.2 µs per row, libpq + psycopg row construction) without
the FETCH round trips. What is left is the server's decoding (the floor, which
ends before the first row leaves the server) plus that per-row receive cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count, islice
from types import TracebackType
from typing import Any, Literal, NamedTuple, get_args

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import capabilities, pq, sql

from slotlake.lsn import Lsn
from slotlake.raw import RawSummary, RawWriter, payload_bytes
from slotlake.redact import describe_dsn, dsn_password, redact_text

log = logging.getLogger(__name__)

TRANSPORT_NOTE = (
    "The peek is read through Arrow's ADBC PostgreSQL driver on a connection of its own "
    "(binary COPY parsed into Arrow record batches in C++, no Python per row); without "
    "adbc-driver-postgresql, as one binary query in libpq's chunked rows mode (10000 rows "
    "per chunk; a server-side cursor with FETCH 10000 when libpq is older than 17). "
    "Memory is bounded by one batch and TCP flow control (see lib/slotlake/source.py)."
)

Transport = Literal["adbc", "copy", "cursor", "stream"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)

# Session settings the decoder's text formats rely on: pgoutput runs the types' output
# functions in *this* backend (the SQL interface), so these GUCs shape every text value.
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
}

# The server's TCP keepalives for slotlake's sessions (ignored over a Unix socket). The
# operating system's default probes an idle connection first after two hours: a run whose
# host vanished (a node lost, a network cut: nothing closed its sockets) would hold the
# slot's advisory lock, and with it every later run, that long. With these the server
# ends such a session within about 90 s. ``source.settings`` may set others.
KEEPALIVE_SETTINGS: dict[str, str] = {
    "tcp_keepalives_idle": "30",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "6",
}


def set_all(conn: psycopg.Connection[Any], settings: Mapping[str, str]) -> None:
    """Every one of ``settings`` on the session, in one round trip."""
    if settings:
        conn.execute(
            "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(settings)),
            [x for item in settings.items() for x in item],
        )


def keep_alive(conn: psycopg.Connection[Any], configured: Mapping[str, str]) -> None:
    """:data:`KEEPALIVE_SETTINGS` on a session that holds the slot's lock, as
    ``configured`` (``source.settings``) sets them."""
    set_all(conn, {k: configured.get(k, v) for k, v in KEEPALIVE_SETTINGS.items()})


# Highest pgoutput proto_version per server major version.
_MAX_PROTO = {14: 2, 15: 3, 16: 4}
# A batch over less WAL than this does not log the running transactions
# (SlotSource.log_restart_point): decoding so little again costs nothing, and a record
# of its own (~100 bytes) past an idle source's last batch must not start another.
LOG_SNAPSHOT_MIN_BYTES = 64 * 1024

# A wait for another session's lock is reported after this many seconds, then every
# LOCK_REPORT_EVERY: the catalog reads take each published table's lock, which an open
# ALTER TABLE holds until it ends.
LOCK_REPORT_AFTER = 10.0
LOCK_REPORT_EVERY = 60.0
# The sessions a backend waits for, each with the relations it holds locks on that the
# backend waits for, and how long its transaction has been open. No query text: another
# session's statement may carry secrets.
_BLOCKERS = """
SELECT b.pid,
       coalesce((SELECT string_agg(DISTINCT format('%%s on %%s', l.mode, l.relation::regclass), ', ')
                 FROM pg_locks l
                 WHERE l.pid = b.pid AND l.granted AND l.relation IN
                       (SELECT w.relation FROM pg_locks w WHERE w.pid = %(pid)s AND NOT w.granted)),
                ''),
       coalesce(extract(epoch FROM now() - a.xact_start)::bigint, 0)
FROM unnest(pg_blocking_pids(%(pid)s)) AS b(pid)
LEFT JOIN pg_stat_activity a ON a.pid = b.pid
ORDER BY b.pid
"""

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER = struct.Struct(">11sII")  # signature, flags, header extension length
# One row of (lsn pg_lsn, xid xid, data bytea) in binary COPY: field count, then
# (length, value) per field; lsn and xid are fixed-width so the prefix is one unpack.
_COPY_ROW = struct.Struct(">hiQiIi")
_COPY_ROW_SIZE = _COPY_ROW.size  # 26
_COPY_TRAILER = -1
# The longest WAL page header (a segment's first page's).
_WAL_LONG_PAGE_HEADER = 40


class SourceError(RuntimeError):
    """A problem with the source database or the slot; the message says what to do.

    Messages are always redacted: they never carry a password.
    """

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class SlotInfo:
    slot_name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    two_phase: bool
    confirmed_flush_lsn: Lsn | None
    restart_lsn: Lsn | None
    wal_status: str | None
    safe_wal_size: int | None
    retained_bytes: int | None
    conflicting: bool | None = None  # PG16+
    invalidation_reason: str | None = None  # PG17+

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.restart_lsn is None or bool(self.conflicting)


@dataclass(frozen=True)
class PullProgress:
    messages: int
    bytes: int
    seconds: float
    messages_per_second: float
    bytes_per_second: float

    def __str__(self) -> str:
        return (
            f"{self.messages:,} messages, {self.bytes / 1e6:,.1f} MB in {self.seconds:.1f}s "
            f"({self.messages_per_second:,.0f} msg/s, {self.bytes_per_second / 1e6:,.1f} MB/s)"
        )


@dataclass(frozen=True)
class PullResult:
    messages: int
    bytes: int
    seconds: float
    upto: Lsn
    transport: str
    summary: RawSummary = field(repr=False)
    # Where the pull was cut in two peeks decoded at once (None: one peek).
    split_at: Lsn | None = None

    @property
    def messages_per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def lock_key(slot: str) -> int:
    """Stable signed 64-bit advisory-lock key for a slot (same on every host and run)."""
    digest = hashlib.blake2b(f"slotlake:{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# A backend as pg_stat_activity shows it. No query text: another session's statement may
# carry secrets. (Another role's session shows its PID only, without pg_read_all_stats.)
_BACKEND_COLUMNS = """
SELECT p.pid, a.application_name,
       CASE WHEN a.client_port = -1 THEN 'local' ELSE host(a.client_addr) END, a.state,
       to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
       extract(epoch FROM now() - a.state_change)::bigint
"""
# The session holding a bigint advisory lock in this database: pg_locks splits the key
# into its high and low 32 bits (classid, objid), objsubid 1.
_LOCK_HOLDER = (
    _BACKEND_COLUMNS
    + """  FROM pg_locks p LEFT JOIN pg_stat_activity a ON a.pid = p.pid
 WHERE p.locktype = 'advisory' AND p.granted AND p.objsubid = 1
   AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND p.classid = %s::bigint::oid AND p.objid = %s::bigint::oid
"""
)
_BACKEND = (
    _BACKEND_COLUMNS
    + """  FROM (SELECT %s::int AS pid) p LEFT JOIN pg_stat_activity a ON a.pid = p.pid"""
)


class Backend(NamedTuple):
    """A server session (one holding the slot's lock, or the slot), for a message."""

    pid: int
    application: str | None
    client: str | None  # an address, "local" (a Unix socket) or None (not shown)
    connected: str | None  # UTC
    state: str | None
    seconds_in_state: int | None

    def describe(self) -> str:
        parts = [f"PID {self.pid}"]
        if self.application:
            parts.append(f"application {self.application!r}")
        if self.client == "local":
            parts.append("over a local socket")
        elif self.client:
            parts.append(f"from {self.client}")
        if self.connected is not None:
            parts.append(f"connected {self.connected} UTC")
        if self.state is not None and self.seconds_in_state is not None:
            parts.append(f"{self.state} for {_duration(self.seconds_in_state)}")
        return ", ".join(parts)


def _backend(conn: psycopg.Connection[Any], query: str, params: Sequence[Any]) -> Backend | None:
    # Best effort: this only adds to a message.
    try:
        rows = conn.execute(query, params).fetchall()
    except psycopg.Error:
        return None
    if not rows:
        return None
    pid, app, addr, state, started, seconds = rows[0]
    return Backend(int(pid), app, addr, started, state, None if seconds is None else int(seconds))


def lock_holder(conn: psycopg.Connection[Any], slot: str) -> Backend | None:
    """Who holds ``slot``'s advisory lock: what an operator needs to tell a live run from
    a session its vanished host left behind, and to end the latter. None when no session
    holds it any more (or it could not be read)."""
    key = lock_key(slot) & 0xFFFF_FFFF_FFFF_FFFF
    return _backend(conn, _LOCK_HOLDER, (key >> 32, key & 0xFFFF_FFFF))


def locked_message(slot: str, holder: Backend | None, then: str) -> str:
    """The line of a run that found ``slot``'s lock held; ``then``: what it does about it."""
    if holder is None:
        return f"another slotlake run holds the lock for slot {slot}; {then}"
    return (
        f"another slotlake run holds the lock for slot {slot} ({holder.describe()}); {then}. "
        f"If that run is gone, end its session: SELECT pg_terminate_backend({holder.pid})"
    )


def _duration(seconds: int) -> str:
    hours, rest = divmod(max(0, seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# What a publication must publish for the mirror to equal the source.
PUBLISH_ACTIONS = ("insert", "update", "delete", "truncate")
PUBLICATIONS_SQL = (
    "SELECT pubname::text, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication"
    " WHERE pubname = ANY(%s)"
)


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (a double quote in it doubled)."""
    return '"' + name.replace('"', '""') + '"'


def relation_sql(schema: str, table: str, relkind: str | None) -> str:
    """A table as a query reads its own rows, as pgoutput sends them: ``ONLY`` (a table
    inheriting from it is published as itself), but for a partitioned table, which has
    no rows of its own (scanning it covers its partitions)."""
    ident = f"{quote_ident(schema)}.{quote_ident(table)}"
    return ident if relkind == "p" else f"ONLY {ident}"


def _sql_name(name: str) -> str:
    """``name`` as a statement to copy would spell it: quoted unless plain."""
    if name.isidentifier() and name.isascii() and name == name.lower():
        return name
    return quote_ident(name)


def publication_problem(
    rows: Sequence[tuple[Any, ...]],
    wanted: Sequence[str],
    database: str,
    when_missing: str = "it must exist before the slot's start point, so recreate the slot "
    "after creating it",
) -> str | None:
    """What is wrong with the publications ``wanted`` (``rows``: :data:`PUBLICATIONS_SQL`'s
    answer), or None. A missing one, or one that leaves out an action: a delete or
    truncate it does not publish leaves the rows in the mirror, an update leaves old
    values, for good."""
    found = {str(r[0]): r[1:] for r in rows}
    missing = [p for p in wanted if p not in found]
    if missing:
        names = ", ".join(repr(p) for p in missing)
        return (
            f"publication {names} does not exist in database {database!r}: "
            f"CREATE PUBLICATION {_sql_name(missing[0])} FOR TABLE …; {when_missing}"
        )
    for name in wanted:
        left_out = [a for a, on in zip(PUBLISH_ACTIONS, found[name], strict=True) if not on]
        if left_out:
            published = ", ".join(a for a in PUBLISH_ACTIONS if a not in left_out) or "nothing"
            return (
                f"publication {name!r} does not publish {', '.join(left_out)} (publish = "
                f"'{published}'): its tables' mirror would keep what those changes remove or "
                f"change. ALTER PUBLICATION {_sql_name(name)} SET (publish = "
                f"'{', '.join(PUBLISH_ACTIONS)}'), then re-snapshot the tables changed "
                "meanwhile (slotlake resnapshot --table …)"
            )
    return None


def _quote_ident_list(names: Sequence[str]) -> str:
    # pgoutput splits publication_names with SplitIdentifierString: quoting keeps the
    # names' case and allows commas or spaces in them.
    return ",".join(map(quote_ident, names))


_NO_PUBLICATION_THEN = re.compile(r'publication ".*" does not exist.* output plugin "pgoutput"')


class SlotSource:
    """One run's connection to the source: lock, checks, peek → raw, advance."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        publications: Sequence[str],
        proto_version: int = 1,
        binary: bool = False,
        messages: bool = False,
        streaming: bool = False,
        application_name: str = "slotlake",
        session_settings: Mapping[str, str] | None = None,
        transport: Transport | None = None,
        connect_timeout: int = 30,
        split_bytes: int | None = None,
        adbc_min_bytes: int | None = None,
        log_snapshots: bool = True,
    ) -> None:
        if not publications:
            raise SourceError("no publication given: pgoutput needs at least one")
        if proto_version < 1:
            raise SourceError(f"proto_version must be 1 or higher, not {proto_version}")
        if streaming and proto_version < 2:
            raise SourceError(
                f"streaming needs proto_version 2 or higher (got {proto_version}): "
                "raise proto_version or turn streaming off"
            )
        if transport is None:
            transport = default_transport()
        if transport not in TRANSPORTS:
            raise SourceError(
                f"unknown transport {transport!r}: use 'adbc', 'stream', 'cursor' or 'copy'"
            )
        if transport == "adbc" and not _has_adbc():
            raise SourceError(
                "transport 'adbc' needs the adbc-driver-postgresql package: "
                "pip install adbc-driver-postgresql, or use transport 'stream'"
            )
        if transport == "stream" and not capabilities.has_stream_chunked():
            raise SourceError(
                "transport 'stream' needs libpq 17 or newer (chunked rows mode): "
                "use transport 'cursor'"
            )
        self._dsn = dsn
        self._secrets = [p for p in (dsn_password(dsn),) if p]
        self.slot = slot
        self.publications = list(publications)
        self.proto_version = proto_version
        self.binary = binary
        self.messages = messages
        self.streaming = streaming
        self.application_name = application_name
        self.session_settings = dict(session_settings or {})
        self.transport: Transport = transport
        self.connect_timeout = connect_timeout
        # A pull over at least this much WAL runs as two peeks at once (``_pull_split``).
        self.split_bytes = split_bytes
        # With ADBC, a pull over less WAL than this reads on the session's own connection
        # instead: ADBC's connection loads the database's whole type catalog first (every
        # table's row type), which costs more than its faster drain saves on small pulls.
        self.adbc_min_bytes = adbc_min_bytes
        # Whether a batch asks the server to log its running transactions before reading
        # its target (``log_restart_point``); None once asked: not yet known if it may.
        self.log_snapshots: bool | None = None if log_snapshots else False
        self.wal_block_size = 8192
        self.server_version_num: int | None = None
        self.database: str | None = None
        self.notes: list[str] = []  # settings that could not be applied, for the run log
        self._conn: psycopg.Connection[Any] | None = None
        self._locked = False
        # Each split pull's copy gets a name of its own: the copy of the pull before, if
        # not dropped, lives until its backend exits, which the server does after the
        # client has moved on.
        self._copies = count(1)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def dsn_redacted(self) -> str:
        return describe_dsn(self._dsn)

    def _error(self, what: str, exc: BaseException | None = None) -> SourceError:
        text = what if exc is None else f"{what}: {str(exc).strip()}"
        text = " ".join(text.split())  # one line: server errors carry DETAIL/HINT lines
        sqlstate = getattr(exc, "sqlstate", None) if exc is not None else None
        if sqlstate == "42704" and _NO_PUBLICATION_THEN.search(text):
            # pgoutput reads the publications as of each change: one dropped and created
            # again after the slot's position stops the slot at the first change made
            # while it did not exist, on every later peek too (PostgreSQL 15 and 16).
            text += (
                " (the publication did not exist when that change was made: dropped and "
                "created again since the lake's last batch? The slot cannot be read past "
                "it: take a new slot and copy, `slotlake bootstrap --rebootstrap "
                "--onto-existing-lake`)"
            )
        return SourceError(redact_text(text, self._secrets), sqlstate)

    def connect(self) -> SlotSource:
        if self._conn is not None:
            return self
        try:
            self._conn = self._new_connection(self.application_name)
        except psycopg.Error as exc:
            # `from None`: the chained psycopg error would print unredacted text.
            raise self._error(f"cannot connect to {self.dsn_redacted}", exc) from None
        try:
            self._setup_session()
        except psycopg.Error as exc:
            self.close()
            raise self._error(f"cannot set up the session on {self.dsn_redacted}", exc) from None
        except SourceError:
            self.close()
            raise
        log.info(
            "connected to %s (server %s, database %s)",
            self.dsn_redacted,
            self.server_version_num,
            self.database,
        )
        return self

    def _new_connection(self, application_name: str) -> psycopg.Connection[Any]:
        """A connection to the source in autocommit, as the session's own is opened."""
        return psycopg.connect(
            self._dsn,
            autocommit=True,
            application_name=application_name,
            connect_timeout=self.connect_timeout,
        )

    def _setup_session(self) -> None:
        conn = self._require()
        row = conn.execute(
            "SELECT current_setting('server_version_num')::int, current_database(),"
            " pg_encoding_to_char(encoding), current_setting('wal_block_size')::int"
            " FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        # In a SQL_ASCII database psycopg cannot decode text and hands over bytes.
        self.server_version_num, database, encoding, self.wal_block_size = (
            v.decode("ascii", "replace") if isinstance(v, bytes) else v for v in row
        )
        self.database = str(database)
        if encoding != "UTF8":
            raise SourceError(
                f"database {self.database!r} has encoding {encoding}; slotlake needs UTF8 "
                "(text values are decoded as UTF-8): replicate from a UTF8 database"
            )
        major = self.server_version_num // 10000
        if major < 14:
            raise SourceError(f"PostgreSQL {major} is not supported: slotlake needs 14 or newer")
        max_proto = _MAX_PROTO.get(major, 4)
        if self.proto_version > max_proto:
            raise SourceError(
                f"proto_version {self.proto_version} is not supported by PostgreSQL {major} "
                f"(highest: {max_proto})"
            )
        settings = self._settings()
        try:  # setting by setting only when one of them is refused
            set_all(conn, settings)
            settings = {}
        except psycopg.errors.InsufficientPrivilege:
            pass
        for name, value in settings.items():
            try:
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            except psycopg.errors.InsufficientPrivilege as exc:
                # lc_monetary is superuser-only on some versions; money values then follow
                # the server default locale, which the decoder keeps as text anyway.
                self.notes.append(redact_text(f"could not SET {name}={value!r}: {exc}"))
                log.warning("%s", self.notes[-1])

    def _settings(self) -> dict[str, str]:
        """The session settings of every connection that peeks: the decoder's, then the
        configuration's."""
        return {**SESSION_SETTINGS, **KEEPALIVE_SETTINGS, **self.session_settings}

    def close(self) -> None:
        if self._conn is not None:
            # Closing the session would release the advisory lock too, but only once the
            # server's backend has exited, which happens after the client has moved on: a
            # run started right after this one could find the lock still held.
            if self._locked and not self._conn.closed:
                with contextlib.suppress(psycopg.Error):
                    self.unlock()
            try:
                self._conn.close()
            finally:
                self._conn = None
                self._locked = False

    def __enter__(self) -> SlotSource:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise SourceError("SlotSource is not connected: call connect() first")
        return self._conn

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The open autocommit connection, for a catalog read outside a transaction (the
        published set: slotlake.snapshot.prepare). Not for statements that leave session
        state behind: the slot's advisory lock is held on it."""
        return self._require()

    def _query(self, what: str, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
        try:
            return self._require().execute(query, params).fetchall()
        except psycopg.Error as exc:
            raise self._error(f"{what} failed on {self.dsn_redacted}", exc) from None

    # -- lock ------------------------------------------------------------------------------
    def try_lock(self) -> bool:
        """Take the per-slot session advisory lock; False when another run holds it."""
        if self._locked:
            return True
        (got,) = self._query(
            "pg_try_advisory_lock", "SELECT pg_try_advisory_lock(%s)", (lock_key(self.slot),)
        )[0]
        self._locked = bool(got)
        return self._locked

    def lock_holder(self) -> Backend | None:
        """Who holds the slot's advisory lock (:func:`lock_holder`), after ``try_lock``
        returned False."""
        return lock_holder(self._require(), self.slot)

    def backend(self, pid: int) -> Backend | None:
        """Server session ``pid`` as pg_stat_activity shows it (the slot's user, say)."""
        return _backend(self._require(), _BACKEND, (pid,))

    def unlock(self) -> None:
        if self._locked:
            self._query(
                "pg_advisory_unlock", "SELECT pg_advisory_unlock(%s)", (lock_key(self.slot),)
            )
            self._locked = False

    # -- slot state ------------------------------------------------------------------------
    def _slot_columns(self) -> set[str]:
        rows = self._query(
            "reading pg_replication_slots columns",
            "SELECT attname FROM pg_attribute"
            " WHERE attrelid = 'pg_catalog.pg_replication_slots'::regclass AND attnum > 0",
        )
        return {r[0] for r in rows}

    def slot_info(self) -> SlotInfo | None:
        cols = self._slot_columns()
        optional = [c for c in ("two_phase", "conflicting", "invalidation_reason") if c in cols]
        select_list = sql.SQL(", ").join(
            [
                sql.SQL(
                    "slot_name::text, plugin::text, slot_type, database::text, temporary, active,"
                    " active_pid, confirmed_flush_lsn::text, restart_lsn::text, wal_status,"
                    " safe_wal_size,"
                    " pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
                    " ELSE pg_current_wal_lsn() END, restart_lsn)::bigint"
                ),
                *(sql.Identifier(c) for c in optional),
            ]
        )
        rows = self._query(
            "reading the slot",
            sql.SQL("SELECT {} FROM pg_replication_slots WHERE slot_name = %s").format(select_list),
            (self.slot,),
        )
        if not rows:
            return None
        r = rows[0]
        extra = dict(zip(optional, r[12:], strict=True))
        return SlotInfo(
            slot_name=r[0],
            plugin=r[1],
            slot_type=r[2],
            database=r[3],
            temporary=r[4],
            active=r[5],
            active_pid=r[6],
            confirmed_flush_lsn=Lsn.parse(r[7]) if r[7] else None,
            restart_lsn=Lsn.parse(r[8]) if r[8] else None,
            wal_status=r[9],
            safe_wal_size=r[10],
            retained_bytes=r[11],
            two_phase=bool(extra.get("two_phase", False)),
            conflicting=extra.get("conflicting"),
            invalidation_reason=extra.get("invalidation_reason"),
        )

    def check(self) -> SlotInfo:
        """Everything a peek needs, verified up front; raises SourceError saying what to do."""
        slot = self.slot
        (wal_level,) = self._query("reading wal_level", "SHOW wal_level")[0]
        if wal_level != "logical":
            raise SourceError(
                f"wal_level is {wal_level!r} on the source; logical decoding needs "
                "wal_level = logical (ALTER SYSTEM SET wal_level = logical, then restart)"
            )
        info = self.slot_info()
        create = (
            f"create it with `slotlake bootstrap` or "
            f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
        )
        if info is None:
            raise SourceError(
                f"replication slot {slot!r} does not exist on the source: {create} "
                f"in database {self.database!r}"
            )
        if info.slot_type != "logical":
            raise SourceError(
                f"replication slot {slot!r} is a {info.slot_type} slot, not logical: "
                f"use another slot name, or drop it and {create}"
            )
        if info.database != self.database:
            raise SourceError(
                f"replication slot {slot!r} belongs to database {info.database!r}, not "
                f"{self.database!r}: connect to that database or {create} in this one"
            )
        if info.plugin != "pgoutput":
            raise SourceError(
                f"replication slot {slot!r} uses plugin {info.plugin!r}; slotlake needs "
                f"'pgoutput': drop it and {create}"
            )
        if info.invalidated:
            reason = (
                f"wal_status={info.wal_status}"
                + (", conflicting with recovery" if info.conflicting else "")
                + (f", {info.invalidation_reason}" if info.invalidation_reason else "")
            )
            raise SourceError(
                f"replication slot {slot!r} is invalidated ({reason}): the WAL it needed is "
                "gone; drop it, recreate it and take a new initial snapshot (slotlake bootstrap)"
            )
        if info.two_phase:
            raise SourceError(
                f"replication slot {slot!r} was created with two_phase = true: two-phase "
                "decoding is not supported by slotlake; drop it and recreate it without "
                "two_phase"
            )
        if info.active and info.active_pid != self._backend_pid():
            user = self.backend(info.active_pid) if info.active_pid is not None else None
            who = user.describe() if user is not None else f"PID {info.active_pid}"
            raise SourceError(
                f"replication slot {slot!r} is in use by another process ({who}): stop that "
                "consumer or wait until it finishes"
            )
        rows = self._query("reading publications", PUBLICATIONS_SQL, (self.publications,))
        problem = publication_problem(rows, self.publications, self.database)
        if problem is not None:
            raise SourceError(problem)
        return info

    def _backend_pid(self) -> int:
        return int(self._require().info.backend_pid)

    @contextlib.contextmanager
    def lock_waits_reported(self, what: str) -> Iterator[None]:
        """While the body runs, log (a warning) each other session whose lock this
        session's backend waits for — its pid, the locks and its transaction's age, never
        its statement — first after :data:`LOCK_REPORT_AFTER` seconds, then every
        :data:`LOCK_REPORT_EVERY`; ``what``: the step, for the message. Best effort: a
        watcher that cannot connect stays silent."""
        pid = self._backend_pid()
        stop = threading.Event()

        def watch() -> None:
            wait = LOCK_REPORT_AFTER
            while not stop.wait(wait):
                wait = LOCK_REPORT_EVERY
                try:
                    with self._new_connection(f"{self.application_name} (lock watch)") as conn:
                        rows = conn.execute(_BLOCKERS, {"pid": pid}).fetchall()
                except psycopg.Error:
                    return
                for blocker, locks, age in rows:
                    held = f" holding {locks}" if locks else ""
                    log.warning(
                        "%s: waiting for session pid %s%s (its transaction open %ss); the "
                        "run goes on when that transaction ends",
                        what,
                        blocker,
                        held,
                        age,
                    )

        watcher = threading.Thread(target=watch, name="slotlake-lock-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join(self.connect_timeout + 5)

    def current_flush_lsn(self) -> Lsn:
        (value,) = self._query(
            "reading the flush LSN",
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
            " ELSE pg_current_wal_flush_lsn() END)::text",
        )[0]
        return Lsn.parse(value)

    def log_restart_point(self, after: Lsn) -> Lsn | None:
        """Have the server log its running transactions now, where a batch's target is
        about to be read (``pg_log_standby_snapshot()``, PostgreSQL 16 on a primary, for
        a role that may execute it: superusers, or by GRANT); the record's LSN, or None
        when not done. Only when the server has written at least
        :data:`LOG_SNAPSHOT_MIN_BYTES` of WAL past ``after`` (the batch's start): the
        record lies past the target (below), so the next run finds WAL past its start
        even on an idle source, and must not log another for it (each run would then
        be a batch).

        Why: a logical slot's restart point moves only to where decoding last saw such a
        record, which the server itself logs every 15 s at most, and the SQL functions
        decode from the restart point every time. Runs closer together than that decoded
        the WAL of earlier batches again, twice a batch (peek and advance): measured on
        back-to-back 10k-change batches, the restart point stayed put for 40-60 s and the
        pull grew from 29 to 75 ms. With the record just below the target the advance
        moves the restart point to the end of the batch before: the server leaves the
        record's flush to its WAL writer (within ``wal_writer_delay``), so the target read
        next usually lies below it and the next batch's advance passes it. Waiting for
        the flush cost ~0.17 s a batch and saved nothing measurable.
        """
        if self.log_snapshots is False:
            return None
        conn = self._require()
        try:
            if self.log_snapshots is None:
                version = self.server_version_num or 0
                allowed = version >= 160000 and bool(
                    conn.execute(
                        "SELECT NOT pg_is_in_recovery() AND has_function_privilege("
                        "'pg_catalog.pg_log_standby_snapshot()', 'EXECUTE')"
                    ).fetchone()[0]  # type: ignore[index]
                )
                self.log_snapshots = allowed
                if not allowed:
                    log.info(
                        "slot %s: the restart point moves with the server's own snapshots "
                        "of running transactions (every 15 s at most): %s",
                        self.slot,
                        "PostgreSQL 16 logs one on request"
                        if version < 160000
                        else "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() to this "
                        "role lets each batch log one (not on a standby)",
                    )
                    return None
            row = conn.execute(
                "SELECT CASE WHEN pg_current_wal_insert_lsn() - %s::pg_lsn >= %s"
                " THEN pg_log_standby_snapshot()::text END",
                (str(after), LOG_SNAPSHOT_MIN_BYTES),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            return Lsn.parse(row[0])
        except psycopg.Error as exc:
            # Only the restart point's pace depends on it: the batch goes on without (a
            # broken connection fails the statements that follow, with their own errors).
            self.log_snapshots = False
            log.warning(
                "slot %s: could not log the running transactions (pg_log_standby_snapshot) "
                "on %s: %s",
                self.slot,
                self.dsn_redacted,
                redact_text(str(exc).strip(), self._secrets),
            )
            return None

    def flush_lsn_and_catalog(self) -> tuple[Lsn, dict[str, Any]]:
        """The flush LSN and, in the same snapshot, the published tables' columns
        (:func:`slotlake.ddl.read_catalog`: attnums and fast-default values).

        One REPEATABLE READ transaction: the snapshot is taken by the statement that reads
        the LSN, so the catalog is the one of (about) the batch's target.
        """
        from slotlake.ddl import read_catalog

        conn = self._require()
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                row = conn.execute(
                    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
                    " ELSE pg_current_wal_flush_lsn() END)::text"
                ).fetchone()
                assert row is not None
                catalog = read_catalog(conn, self.publications)
        except psycopg.Error as exc:
            raise self._error(
                f"reading the flush LSN and the catalog failed on {self.dsn_redacted}", exc
            ) from None
        return Lsn.parse(row[0]), catalog

    # -- peek ------------------------------------------------------------------------------
    def peek_options(self, streaming: bool | None = None) -> list[str]:
        """The pgoutput options as the flat name, value list the SQL functions take
        (``streaming``: instead of the source's own setting)."""
        opts = [
            "proto_version",
            str(self.proto_version),
            "publication_names",
            _quote_ident_list(self.publications),
        ]
        # Defaults are left out so that an older server never sees an option it lacks.
        if self.binary:
            opts += ["binary", "true"]
        if self.messages:
            opts += ["messages", "true"]
        if self.streaming if streaming is None else streaming:
            opts += ["streaming", "true"]
        return opts

    def _peek_call(
        self,
        upto: Lsn | None,
        nchanges: int | None = None,
        slot: str | None = None,
        streaming: bool | None = None,
    ) -> sql.Composed:
        args: list[sql.Composable] = [
            sql.Literal(self.slot if slot is None else slot),
            sql.SQL("NULL") if upto is None else sql.SQL("{}::pg_lsn").format(str(Lsn(upto))),
            sql.SQL("NULL") if nchanges is None else sql.Literal(int(nchanges)),
            *(sql.Literal(o) for o in self.peek_options(streaming)),
        ]
        return sql.SQL("pg_logical_slot_peek_binary_changes({})").format(sql.SQL(", ").join(args))

    def _peek_select(self, upto: Lsn | None, **call: Any) -> sql.Composed:
        """``SELECT lsn, xid, data`` of the peek (``call``: :meth:`_peek_call`'s options),
        what every transport reads."""
        return sql.SQL("SELECT lsn, xid, data FROM {}").format(self._peek_call(upto, **call))

    def count_floor(self, upto: Lsn) -> int:
        """Rows the peek returns, counted server side: the floor any transport can reach."""
        query = sql.SQL("SELECT count(*) FROM {}").format(self._peek_call(upto))
        return int(self._query("counting the peek", query)[0][0])

    def peek_rows(
        self, upto: Lsn | None, limit: int | None = None, fetch_rows: int = 1_000
    ) -> Iterator[tuple[Lsn, int, bytes]]:
        """(lsn, xid, data) of the peek, streamed, for humans (``slotlake inspect``).

        ``limit`` is passed on as upto_nchanges, which the server treats as a soft cap
        (it finishes the transaction it is in), and then enforced here.
        """
        seen = 0
        try:
            for lsns, xids, datas in self._pull_cursor(upto, fetch_rows, limit):
                for lsn, xid, data in zip(lsns, xids, datas, strict=True):
                    if limit is not None and seen >= limit:
                        return
                    seen += 1
                    yield Lsn.from_signed(lsn), xid, data
        except psycopg.Error as exc:
            raise self._error(
                f"peek of slot {self.slot!r} failed on {self.dsn_redacted}", exc
            ) from None

    def pull(
        self,
        upto: Lsn,
        writer: RawWriter,
        progress: Callable[[PullProgress], None] | None = None,
        fetch_rows: int = 10_000,
        transport: Transport | None = None,
        split_at: Lsn | None = None,
    ) -> PullResult:
        """Peek up to ``upto`` (inclusive of the record reaching it) into ``writer``.

        The writer is closed here and its summary returned; on error it is aborted.
        Nothing is consumed: the slot moves only through ``advance``. Over at least
        ``split_bytes`` of WAL the ADBC transport runs two peeks at once, cut at
        ``split_point``; ``split_at`` forces that cut (tests, benchmarks: it must lie
        between the slot's confirmed_flush and ``upto``, and off a page header).
        """
        forced = transport is not None
        transport = transport or self.transport
        conn = self._require()
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            raise SourceError("the source session is inside a transaction; cannot peek")
        started = time.monotonic()
        meter = _Meter(started, progress)
        chunks: Iterator[tuple[Any, Any, Any]]
        mid = split_at
        min_bytes = None if forced else self.adbc_min_bytes
        sized = self.split_bytes is not None or min_bytes is not None
        if mid is None and transport == "adbc" and sized:
            info = self.slot_info()
            if info is not None and info.confirmed_flush_lsn is not None:
                mid = self.split_point(info.confirmed_flush_lsn, upto)
                wal = int(upto) - int(info.confirmed_flush_lsn)
                if mid is None and min_bytes is not None and wal < min_bytes:
                    transport = session_transport()
        if mid is not None:
            if transport != "adbc":
                raise SourceError(f"a split pull needs transport 'adbc', not {transport!r}")
            pair = self._copy_slot()
            if pair is None:
                mid = None
        if mid is not None:
            chunks = self._pull_split(upto, mid, pair, fetch_rows)
        elif transport == "adbc":
            chunks = self._pull_adbc(upto, fetch_rows)
        elif transport == "copy":
            chunks = self._pull_copy(upto, fetch_rows)
        elif transport == "stream":
            chunks = self._pull_stream(upto, fetch_rows)
        else:
            chunks = self._pull_cursor(upto, fetch_rows)
        try:
            for lsns, xids, datas in chunks:
                writer.append(lsns, xids, datas)
                meter.add(len(datas), payload_bytes(datas))
        except psycopg.Error as exc:
            writer.abort()
            raise self._error(
                f"peek of slot {self.slot!r} failed on {self.dsn_redacted}", exc
            ) from None
        except BaseException:
            writer.abort()
            raise
        summary = writer.close()
        seconds = time.monotonic() - started
        meter.report(force=True)
        log.info(
            "pulled %d messages (%d bytes) from slot %s up to %s in %.1fs via %s%s",
            meter.messages,
            meter.bytes,
            self.slot,
            Lsn(upto),
            seconds,
            transport,
            "" if mid is None else f", two peeks cut at {mid}",
        )
        return PullResult(
            messages=meter.messages,
            bytes=meter.bytes,
            seconds=seconds,
            upto=Lsn(upto),
            transport=transport,
            summary=summary,
            split_at=mid,
        )

    def _pull_cursor(
        self, upto: Lsn | None, fetch_rows: int, nchanges: int | None = None
    ) -> Iterator[tuple[Sequence[int], Sequence[int], Sequence[bytes]]]:
        conn = self._require()
        query = self._peek_select(upto, nchanges=nchanges)
        with conn.transaction():
            cur = conn.cursor(
                name=f"slotlake_peek_{self._backend_pid()}", binary=True, scrollable=False
            )
            self._register_loaders(cur)
            try:
                cur.execute(query)
                while rows := cur.fetchmany(fetch_rows):
                    lsns, xids, datas = zip(*rows, strict=True)
                    yield lsns, xids, datas
            finally:
                cur.close()

    def _pull_stream(
        self, upto: Lsn, fetch_rows: int
    ) -> Iterator[tuple[Sequence[int], Sequence[int], Sequence[bytes]]]:
        """One plain query in libpq's chunked rows mode: the server writes rows without
        waiting for a FETCH, so its sending overlaps the client's work, and libpq hands
        them over ``fetch_rows`` at a time (memory stays bounded: TCP flow control stops
        the server when the client falls behind)."""
        conn = self._require()
        query = self._peek_select(upto)
        cur = conn.cursor(binary=True)
        self._register_loaders(cur)
        rows = cur.stream(query, size=fetch_rows)
        try:
            while chunk := list(islice(rows, fetch_rows)):
                lsns, xids, datas = zip(*chunk, strict=True)
                yield lsns, xids, datas
        finally:
            # Closing the generator early cancels the query (psycopg's stream() cleanup).
            rows.close()
            cur.close()

    def _adbc_connect(self, what: str) -> Any:
        """An ADBC connection with the session settings the decoder relies on."""
        from adbc_driver_postgresql import dbapi as adbc

        conn = self._require()
        calls = [
            sql.SQL("set_config({}, {}, false)").format(sql.Literal(name), sql.Literal(value))
            for name, value in self._settings().items()
        ]
        together = sql.SQL("SELECT {}").format(sql.SQL(", ").join(calls)).as_string(conn)
        one_by_one = [sql.SQL("SELECT {}").format(c).as_string(conn) for c in calls]
        conninfo = psycopg.conninfo.make_conninfo(
            self._dsn,
            application_name=self.application_name,
            connect_timeout=str(self.connect_timeout),
        )
        try:
            peek = adbc.connect(conninfo, autocommit=True)
        except adbc.Error as exc:
            raise self._error(f"cannot connect to {self.dsn_redacted} for {what}", exc) from None
        try:
            with peek.cursor() as cur:
                # One round trip; setting by setting only when one of them is refused.
                try:
                    cur.execute(together)
                    cur.fetchall()
                except adbc.ProgrammingError:
                    for single in one_by_one:
                        try:
                            cur.execute(single)
                            cur.fetchall()
                        except adbc.ProgrammingError as exc:
                            # The main session noted it already (lc_monetary and the like).
                            log.debug("peek session: %s", redact_text(str(exc), self._secrets))
        except BaseException:
            peek.close()
            raise
        return peek

    def _pull_adbc(
        self, upto: Lsn, fetch_rows: int, streaming: bool | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray, pa.Array]]:
        """The peek through Arrow's ADBC PostgreSQL driver, on a connection of its own.

        The driver runs the query as ``COPY (…) TO STDOUT (FORMAT binary)`` and parses the
        stream into Arrow record batches in C++: no Python per row. Its connection gets the
        session settings the decoder relies on, as the main one did; pg_lsn and xid come
        as their binary send formats (8 and 4 big-endian bytes), read with NumPy.
        """
        from adbc_driver_postgresql import dbapi as adbc

        peek = self._adbc_connect("the peek")
        try:
            with peek.cursor() as cur:
                cur.execute(self._peek_select(upto, streaming=streaming).as_string(self._require()))
                yield from self._adbc_chunks(cur, fetch_rows)
        except (adbc.Error, OSError) as exc:
            raise self._error(
                f"peek of slot {self.slot!r} failed on {self.dsn_redacted}", exc
            ) from None
        finally:
            # Closing mid-stream ends the backend's COPY: nothing is consumed by a peek.
            peek.close()

    @staticmethod
    def _adbc_chunks(
        cur: Any, fetch_rows: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray, pa.Array]]:
        # The cursor's own reader turns a failure while reading into ADBC's error, with
        # the server's SQLSTATE; fetch_record_batch() hands out the bare pyarrow reader,
        # whose OSError has only the message.
        reader = getattr(getattr(cur, "_results", None), "reader", None)
        for batch in reader if reader is not None else cur.fetch_record_batch():
            lsns = _fixed_be(batch.column(0), 8).view(np.int64)
            xids = _fixed_be(batch.column(1), 4).astype(np.int64)
            datas = batch.column(2)
            if datas.type != pa.binary():
                datas = datas.cast(pa.binary())
            for i in range(0, len(datas), fetch_rows):
                j = i + fetch_rows
                yield lsns[i:j], xids[i:j], datas.slice(i, fetch_rows)

    def split_point(self, start: Lsn, upto: Lsn) -> Lsn | None:
        """Where a pull from ``start`` to ``upto`` is cut in two peeks, or None.

        Half of the WAL between them, moved back to its page's start when it falls in
        the first 40 bytes of a page. A record ending at a page boundary is followed by
        the page header, and the next record starts after it; an ``upto_lsn`` past the
        boundary, up to that start, would make the first peek take the next record too
        (it stops after the first record whose end reaches ``upto_lsn``), while the copy
        advanced there would not skip it (it skips only the transactions whose commit
        record starts before its confirmed_flush): a commit there would come twice.
        """
        if self.split_bytes is None:
            return None
        page = self.wal_block_size
        if int(upto) - int(start) < max(self.split_bytes, 2 * page):
            return None
        mid = off_page_headers(int(start) + (int(upto) - int(start)) // 2, page)
        return Lsn(mid) if int(start) < mid < int(upto) else None

    def _copy_slot(self) -> tuple[Any, str] | None:
        """A connection holding a temporary copy of the slot, and the copy's name; None
        when the server refuses the copy (no free slot under max_replication_slots)."""
        from adbc_driver_postgresql import dbapi as adbc

        second = self._adbc_connect("the second peek")
        copy = f"{self.slot[:40]}_half_{self._backend_pid()}_{next(self._copies)}"
        try:
            with second.cursor() as cur:
                cur.execute(
                    sql.SQL("SELECT pg_copy_logical_replication_slot({}, {}, true)::text")
                    .format(sql.Literal(self.slot), sql.Literal(copy))
                    .as_string(self._require())
                )
                cur.fetchall()
        except adbc.Error as exc:
            second.close()
            log.warning(
                "pulling in one peek: cannot copy slot %s for a second one (%s); "
                "source.split_peek_mb = 0 always pulls in one peek",
                self.slot,
                redact_text(" ".join(str(exc).split()), self._secrets),
            )
            return None
        except BaseException:
            second.close()
            raise
        return second, copy

    def _pull_split(
        self, upto: Lsn, mid: Lsn, pair: tuple[Any, str], fetch_rows: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray, pa.Array]]:
        """The peek to ``upto`` as two peeks whose servers decode at the same time.

        The second half comes from a temporary copy of the slot advanced to ``mid``
        (fast-forward: no output plugin), on a connection of its own, while the slot
        itself is peeked to ``mid``. The first peek returns the transactions whose
        commit record starts before ``mid``, the copy the others, so their rows in that
        order are the single peek's, apart from the Relation and Type messages the second
        decoding session sends again and, with streaming, the first half's transactions
        sent whole rather than streamed (DESIGN.md §2; pinned by
        tests/integration/test_split_peek.py). The server materialises each result before
        sending it, so the second half is being built while the client drains the first.
        """
        from adbc_driver_postgresql import dbapi as adbc

        second, copy = pair
        cursor = second.cursor()
        failure: list[BaseException] = []
        drained = False

        def start_second() -> None:
            try:
                cursor.execute(
                    sql.SQL("SELECT pg_replication_slot_advance({}, {}::pg_lsn)::text")
                    .format(sql.Literal(copy), str(mid))
                    .as_string(self._require())
                )
                cursor.fetchall()
                cursor.execute(self._peek_select(upto, slot=copy).as_string(self._require()))
            except BaseException as exc:  # handed over to the pulling thread
                failure.append(exc)

        thread = threading.Thread(target=start_second, name="slotlake-second-peek", daemon=True)
        thread.start()
        try:
            # Without streaming: a transaction open at ``mid`` would be streamed in part by
            # the first peek and whole by the second. Unstreamed, the first peek leaves it
            # out (it sends a transaction at its commit) and spills to disk past
            # logical_decoding_work_mem, as any slot without streaming does.
            yield from self._pull_adbc(mid, fetch_rows, streaming=False)
            thread.join()
            if failure:
                raise failure[0]
            yield from self._adbc_chunks(cursor, fetch_rows)
            drained = True
        except (adbc.Error, OSError) as exc:
            raise self._error(
                f"peek of slot {self.slot!r} (second half, from {mid}) failed on "
                f"{self.dsn_redacted}",
                exc,
            ) from None
        finally:
            if thread.is_alive():
                with contextlib.suppress(Exception):
                    second.adbc_cancel()
                thread.join()
            if drained:
                # Dropped here, so that its slot is free when this returns; the session's
                # end would drop it too, but only once the server has seen the close.
                with contextlib.suppress(Exception):
                    cursor.execute(
                        sql.SQL("SELECT pg_drop_replication_slot({})")
                        .format(sql.Literal(copy))
                        .as_string(self._require())
                    )
                    cursor.fetchall()
            with contextlib.suppress(Exception):
                cursor.close()
            # The copy is temporary: it goes with the session, if not dropped above (a
            # pull cut short, whose connection may be mid-COPY).
            second.close()

    def _register_loaders(self, cur: psycopg.Cursor[Any]) -> None:
        # psycopg's own C loaders: int8 reads pg_lsn's 8 bytes (as signed — exactly the
        # raw store's int64), oid reads xid's 4 unsigned bytes. No Python per value.
        adapters = self._require().adapters
        types = adapters.types
        int8_loader = adapters.get_loader(types["int8"].oid, pq.Format.BINARY)
        oid_loader = adapters.get_loader(types["oid"].oid, pq.Format.BINARY)
        assert int8_loader is not None and oid_loader is not None
        cur.adapters.register_loader(_PG_LSN_OID, int8_loader)
        cur.adapters.register_loader(_XID_OID, oid_loader)

    def _pull_copy(
        self, upto: Lsn, fetch_rows: int
    ) -> Iterator[tuple[Sequence[int], Sequence[int], Sequence[bytes]]]:
        conn = self._require()
        query = sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(self._peek_select(upto))
        with conn.cursor().copy(query) as copy:
            yield from _copy_chunks(copy, fetch_rows)

    # -- advance ---------------------------------------------------------------------------
    def advance(self, to: Lsn) -> Lsn:
        """Move the slot's confirmed_flush_lsn to ``to`` (never backwards); the new position.

        The server errors when asked to go below confirmed_flush on some versions, so a
        lower or equal target is a no-op here. Above the flush LSN the server clamps.
        """
        info = self.slot_info()
        if info is None:
            raise SourceError(f"replication slot {self.slot!r} does not exist: cannot advance")
        current = info.confirmed_flush_lsn
        if current is not None and Lsn(to) <= current:
            return current
        self._query(
            "pg_replication_slot_advance",
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
            (self.slot, str(Lsn(to))),
        )
        after = self.slot_info()
        assert after is not None and after.confirmed_flush_lsn is not None
        log.info("advanced slot %s from %s to %s", self.slot, current, after.confirmed_flush_lsn)
        return after.confirmed_flush_lsn


_PG_LSN_OID = 3220
_XID_OID = 28


def off_page_headers(lsn: int, page: int = 8192) -> int:
    """``lsn``, or the start of its WAL page when it falls within the page's header
    (``split_point`` says why)."""
    return lsn - lsn % page if lsn % page <= _WAL_LONG_PAGE_HEADER else lsn


def _has_adbc() -> bool:
    import importlib.util

    return importlib.util.find_spec("adbc_driver_postgresql") is not None


def session_transport() -> Transport:
    """The fastest transport on the session's own connection (no connection of its own)."""
    return "stream" if capabilities.has_stream_chunked() else "cursor"


def default_transport() -> Transport:
    """ADBC when installed (a dependency of slotlake), else libpq's chunked rows."""
    if _has_adbc():
        return "adbc"
    return session_transport()


def _fixed_be(column: pa.Array, width: int) -> np.ndarray:
    """A column of ``width``-byte big-endian unsigned integers (the binary send format of
    pg_lsn or xid, as ADBC hands over types it has no Arrow type for) as NumPy."""
    values = column.storage if isinstance(column, pa.ExtensionArray) else column
    if values.null_count or not (
        pa.types.is_binary(values.type) or pa.types.is_fixed_size_binary(values.type)
    ):
        raise SourceError(
            f"unexpected {values.type} column from the peek (nulls: {values.null_count})"
        )
    n = len(values)
    if pa.types.is_fixed_size_binary(values.type):
        start = values.offset * width
    else:
        offsets = np.frombuffer(values.buffers()[1], np.int32, n + 1, values.offset * 4)
        if not (np.diff(offsets) == width).all():
            raise SourceError(f"unexpected value width in a {width}-byte peek column")
        start = int(offsets[0])
    dtype = np.dtype(">u8" if width == 8 else ">u4")
    return np.frombuffer(values.buffers()[-1], dtype, n, start).astype(dtype.newbyteorder("="))


class _Meter:
    """Progress callback at most about once a second."""

    def __init__(self, started: float, callback: Callable[[PullProgress], None] | None) -> None:
        self.started = started
        self.callback = callback
        self.messages = 0
        self.bytes = 0
        self._next = started + 1.0

    def add(self, messages: int, nbytes: int) -> None:
        self.messages += messages
        self.bytes += nbytes
        if self.callback is not None and time.monotonic() >= self._next:
            self.report()

    def report(self, force: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + 1.0
        seconds = now - self.started
        rate = 1 / seconds if seconds > 0 else 0.0
        self.callback(
            PullProgress(
                messages=self.messages,
                bytes=self.bytes,
                seconds=seconds,
                messages_per_second=self.messages * rate,
                bytes_per_second=self.bytes * rate,
            )
        )


def _copy_chunks(
    copy: psycopg.Copy, fetch_rows: int
) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
    """Binary COPY of (pg_lsn, xid, bytea) rows → columnar chunks of at most fetch_rows.

    Each CopyData message is parsed in place with one struct unpack per row. The
    server sends one row per message (the header rides on the first, the trailer has
    its own), which is the fast path; a row split across messages still parses,
    through a small carry-over.
    """
    unpack = _COPY_ROW.unpack_from
    row_size = _COPY_ROW_SIZE
    lsns: list[int] = []
    xids: list[int] = []
    datas: list[bytes] = []
    carry = b""
    header_done = ended = False
    for mv in copy:
        buf: bytes | memoryview = carry + bytes(mv) if carry else mv
        carry = b""
        pos = 0
        end = len(buf)
        if not header_done:
            if end < _COPY_HEADER.size:
                carry = bytes(buf)
                continue
            sig, _flags, ext = _COPY_HEADER.unpack_from(buf, 0)
            if sig != _COPY_SIGNATURE:
                raise SourceError("unexpected binary COPY header from the server")
            pos = _COPY_HEADER.size + ext
            header_done = True
        while pos < end:
            if pos + row_size > end:
                if end - pos >= 2 and buf[pos : pos + 2] == b"\xff\xff":
                    ended = True
                    pos += 2
                    continue
                break
            nfields, _, lsn, _, xid, size = unpack(buf, pos)
            if nfields != 3:
                if nfields == _COPY_TRAILER:
                    ended = True
                    pos += 2
                    continue
                raise SourceError(f"unexpected binary COPY row with {nfields} fields")
            start = pos + row_size
            stop = start + size
            if stop > end:
                break
            lsns.append(lsn)
            xids.append(xid)
            datas.append(bytes(buf[start:stop]))
            pos = stop
        if pos < end:
            carry = bytes(buf[pos:])
        if len(datas) >= fetch_rows:
            yield lsns, xids, datas
            lsns, xids, datas = [], [], []
    if datas:
        yield lsns, xids, datas
    if not ended or carry:
        raise SourceError(
            "binary COPY from the server ended early or with trailing bytes "
            f"({len(carry)} left over)"
        )
