"""Bootstrap: create the slot, copy every published table in its exported snapshot, commit.

Without an initial copy the state holds only rows changed since the slot was created, and
an UPDATE that leaves a TOAST column unchanged on an older row cannot be completed. The
bootstrap closes that gap with PostgreSQL's own guarantee for logical replication:

1. Refuse early (one line saying what to do): ``wal_level`` not logical, a role without
   the REPLICATION attribute, a missing publication, no SELECT on a published table or
   column (named), a slot that already exists, a lake written from another slot or one
   that already has commits (see the re-bootstrap rule below). Every check runs before
   anything is created or dropped.
2. ``CREATE_REPLICATION_SLOT <slot> LOGICAL pgoutput (SNAPSHOT 'export')`` on a
   replication connection (``replication=database``). The reply names the slot's
   ``consistent_point`` and a snapshot: a transaction that committed before the
   consistent point is in the snapshot, one that commits after it is decoded by the slot.
   The connection stays open and idle until the copy ends (the snapshot lives as long as
   it does).
3. Copy what the publications publish (``pg_publication_tables``: ``FOR ALL TABLES``,
   ``FOR TABLES IN SCHEMA``, column lists, row filters, leaf partitions or the root under
   ``publish_via_partition_root``) with ``COPY (SELECT cols FROM [ONLY] t WHERE <row
   filter> AND <ctid range>) TO STDOUT (FORMAT csv)`` in ``REPEATABLE READ`` transactions
   that ``SET TRANSACTION SNAPSHOT`` to the exported one. The text is what the types'
   output functions print under the peek's session settings (:data:`SESSION_SETTINGS`):
   the very text pgoutput sends with ``binary=false``. Each value goes through
   ``slotlake.pgtypes.resolve_type(...).from_text`` (or an Arrow kernel proven equal to
   it: identity for string types, integer/float/boolean parsing), so a row copied here
   and the same row written later by sync compare equal.
4. Write each table's rows as its initial state: the Delta table ``state/<table>`` (the
   sync job's state columns: published columns in attnum order + ``_fallback`` +
   ``_missing_toast``; a table matched by whole rows — REPLICA IDENTITY FULL or no key —
   keeps one row per distinct value with its ``_copies`` count, as the sync job's MERGE
   expects) in one Delta commit carrying the txn marker of this bootstrap; an empty Delta
   change log ``changes/<table>`` with the change schema; an empty ``transactions`` Delta
   table. Then commit batch 1 (``kind="bootstrap"``) ending at the consistent point,
   naming each Delta table's version. The slot's ``confirmed_flush_lsn`` is the
   consistent point, so the next sync starts exactly there: nothing missed, nothing twice.

Parallelism. Each table is split into at most ``parallel`` ranges of heap blocks
(``ctid >= '(a,0)' AND ctid < '(b,0)'``: TID range scans, PostgreSQL 14+; the first and
last ranges are open so rows on blocks added after planning are never lost). Each range
opens its own connection, imports the snapshot and streams its COPY through the converters
into Arrow batches. Progress: a driver thread polls ``pg_stat_progress_copy`` for the
bootstrap's own backends (live rows and bytes) and each table ends with a line of rows,
bytes and rates.

Three ways a table is copied, by what it needs:

* **Small tables, several at once on the driver.** Through Spark every table pays a chain
  of jobs whatever its size (creating the state, the copy's write, its history read,
  creating the change log: seven jobs and 1.3–2.3 s on two cores for a 1,000-row table),
  so a database of hundreds of small tables took minutes. A table of one range (not worth
  splitting) and at most ``lake.bootstrap_driver_mb`` on disk (heap and TOAST, from the
  file sizes) is copied on the driver, ``parallel`` tables at a time on a thread pool
  (each thread keeps one connection in the snapshot), through the same :func:`copy_rows`
  and :func:`convert_csv`; a multiset is grouped by
  :func:`slotlake.multiset_arrow.multiset_table` (pyarrow, the
  twin of the Spark path's :func:`multiset_rows`).
* **Bigger keyed tables, streamed on the driver** (:func:`streamed_on_driver`), and
  bigger INSERT-only ones (no key, identity DEFAULT or NOTHING: not grouped, each row one
  copy, the state marked ``spread`` as sync's appends leave it): their
  ranges copied at once on ``parallel`` threads (:func:`concurrent_ranges`; COPY, Arrow's
  CSV parser and the column kernels release the GIL) and written as they arrive, one
  ``deltalake`` overwrite from a stream of batches (files rolled at ~100 MB), so the
  driver holds a few batches whatever the table weighs. Measured on two cores: a
  5M-row table in ~2× the time of ``psql``'s own COPY to /dev/null, where the Spark path
  (Spark's Arrow transfer and Delta write on top of the same conversion) took 24×. A
  lake whose tables all go this way or the previous one starts no JVM.
* **Through Spark**, one task per range: a multiset too big for the driver (it is grouped
  whole), and every table of a lake on a Hadoop file system (executors reach it, and
  scale the copy past one machine). ``lake.bootstrap_driver_mb = 0`` sends every table
  this way.

The driver's Delta tables are created by the driver exactly as Spark creates them
(:func:`slotlake.delta.create_on_driver`: same protocol, features, configuration and
column mapping ids) and the copy is written by ``deltalake`` in one overwrite commit
carrying the same txn marker: the lake cannot tell the paths apart except by the commits'
``engineInfo``. The small tables go first, then the streamed ones, then Spark's.

Re-bootstrap rule (nothing is ever dropped silently):

* Slot absent, lake without commits → bootstrap.
* Slot exists → refused, unless ``rebootstrap=True`` (``--rebootstrap``); then the slot
  is dropped *after* every other check passed, and its position is logged. An active
  slot (a consumer is attached) is always refused.
* Lake with commits → refused, unless ``onto_existing_lake=True``
  (``--onto-existing-lake``), which appends a bootstrap commit (batch N+1): earlier
  commits, change logs and state versions stay (Delta time travel); every published
  table's state is replaced by the new copy in one Delta commit (an overwrite); the
  record's ``start_lsn`` is the previous commit's end and its ``end_lsn`` the new
  consistent point, so the gap in the change log is visible. Tables no longer published
  keep their last state, as a sync batch would. A column whose type changed at the source
  in a way the earlier type does not widen to losslessly is copied as its text (the sync
  job's own rule), so the change log's history is never cast lossily.
* A lake written from another slot name is always refused (one lake per slot).
* A lake of slotlake's old Parquet layout is refused (one line: bootstrap a new lake.path).
* A bootstrap that fails after creating its slot drops that slot again (it is its own,
  unfinished work) and says so; the lake is left as it was: Delta tables it created are
  removed, tables it had already overwritten are restored (Delta RESTORE) to the version
  they had before it. A bootstrap killed outright leaves the slot: rerun with
  ``--rebootstrap``. Each attempt writes with a Delta txnAppId of its own (the lake's writer
  id + ``bootstrap-<attempt>``): a rerun for the same batch number must never be skipped
  as "already written" by a table that holds a dead attempt's copy.

Consistency note: the table list, column lists and row filters are read in the exported
snapshot; a publication altered while the bootstrap runs is a DDL race it does not
detect. Row filters of several publications are ORed and a publication without one
means no filter, as PostgreSQL's own initial table sync does.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from slotlake.batch import TRANSACTIONS_DDL, _Steps
from slotlake.config import Config
from slotlake.ddltypes import parse_struct, parse_type
from slotlake.lake import (
    CHANGES,
    COPIES,
    DDL,
    MESSAGES,
    STATE,
    TRANSACTIONS,
    CommitRecord,
    Lake,
    TableCommit,
    local_path,
    make_record,
    mark_gone,
    new_attempt,
)
from slotlake.lsn import Lsn
from slotlake.redact import describe_dsn, dsn_password, redact_text
from slotlake.snapshot import SnapshotError, check_lake_names, source_catalog
from slotlake.source import (
    PUBLICATIONS_SQL,
    SESSION_SETTINGS,
    keep_alive,
    lock_holder,
    lock_key,
    locked_message,
    publication_problem,
    quote_ident,
    relation_sql,
)
from slotlake.spark import LazySession

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from slotlake.delta import WriteResult

log = logging.getLogger(__name__)

DEFAULT_PARALLEL = 4
# Ranges smaller than this are not worth a task of their own (blocks of 8 kB: 64 MB).
DEFAULT_MIN_RANGE_BLOCKS = 8192
# COPY text gathered per Arrow batch a task yields (bounds each task's memory).
BATCH_BYTES = 8 << 20
APPLICATION_NAME = "slotlake-bootstrap"
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


class BootstrapError(RuntimeError):
    """A bootstrap that stopped on purpose; the message says what to do."""


# -- the plan: what is copied, shaped how ---------------------------------------------------


@dataclass(frozen=True)
class ColumnPlan:
    name: str
    type_oid: int
    typmod: int
    type_name: tuple[str, str] | None  # (namespace, name) as pgoutput's Type message says
    spark_ddl: str
    kind: str  # how the text becomes the value: str | int | bool | float8 | float4 | py
    attnum: int | None = None  # the column's identity (recorded: sync tells renames by it)


@dataclass
class TablePlan:
    name: str  # "schema.table", as sync names it
    oid: int
    relkind: str
    replica_identity: str  # relreplident: d | n | f | i
    columns: list[ColumnPlan]
    key_columns: list[str]
    row_filter: str | None
    blocks: int
    # On-disk bytes to copy (heap + TOAST of every leaf): what decides the driver path.
    bytes: int = 0
    ranges: list[tuple[int | None, int | None]] = field(default_factory=list)
    natts: int | None = None  # pg_class.relnatts (recorded: see TableCommit.natts)
    # FULL identity: its primary key's columns (TableCommit.unique_on), if it has one.
    unique_on: list[str] = field(default_factory=list)

    @property
    def multiset(self) -> bool:
        """FULL identity or no key: the state keeps distinct rows and their ``_copies``."""
        return self.replica_identity == "f" or not self.key_columns

    @property
    def insert_only(self) -> bool:
        """No key and no FULL identity: PostgreSQL publishes its INSERTs only, and its state
        may hold a value in several rows (:attr:`slotlake.lake.TableCommit.spread`), so a
        big one is streamed a row a copy, not grouped."""
        return self.multiset and self.replica_identity != "f"

    @property
    def from_clause(self) -> str:
        schema, _, table = self.name.partition(".")
        return relation_sql(schema, table, self.relkind)

    def copy_query(self, lo: int | None, hi: int | None) -> str:
        cols = ", ".join(quote_ident(c.name) for c in self.columns) or "1"
        conds = []
        if self.row_filter:
            conds.append(f"({self.row_filter})")
        if lo is not None:
            conds.append(f"ctid >= '({lo},0)'::tid")
        if hi is not None:
            conds.append(f"ctid < '({hi},0)'::tid")
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        return f"COPY (SELECT {cols} FROM {self.from_clause}{where}) TO STDOUT (FORMAT csv)"


def _column_kind(type_oid: int, typmod: int, type_name: tuple[str, str] | None) -> tuple[str, str]:
    """(Spark DDL, conversion kind) of a column: str | int | bool | float8 | float4 | py."""
    from slotlake.pgtypes import resolve_type

    t = resolve_type(type_oid, typmod, {type_oid: type_name} if type_name else None)
    # The Arrow kernels used for these kinds give exactly what the codecs give:
    # PostgreSQL's integer, float ('Infinity', 'NaN', shortest round-trip digits) and
    # boolean ('t'/'f') text parse the same way, and string codecs whose from_text is
    # str keep the text verbatim. Everything else goes through from_text itself.
    if t._codec.from_text is str:
        return t.spark_ddl, "str"
    if t.name in ("int2", "int4", "int8", "oid", "xid", "cid"):
        return t.spark_ddl, "int"
    if t.name in ("bool", "float8", "float4"):
        return t.spark_ddl, t.name
    return t.spark_ddl, "py"


def split_ranges(
    blocks: int, parallel: int, min_range_blocks: int
) -> list[tuple[int | None, int | None]]:
    """Block ranges [lo, hi) covering a heap; the first and last are open-ended."""
    n = max(1, min(parallel, math.ceil(blocks / max(1, min_range_blocks))))
    if n == 1:
        return [(None, None)]
    bounds = [round(blocks * i / n) for i in range(1, n)]
    lows: list[int | None] = [None, *bounds]
    highs: list[int | None] = [*bounds, None]
    return list(zip(lows, highs, strict=True))


# -- catalog queries (pgoutput's view of the published tables) ------------------------------

_TYPE_NAMES_SQL = """
SELECT t.oid::int, CASE WHEN bn.nspname = 'pg_catalog' THEN '' ELSE bn.nspname END, b.typname
FROM pg_type t
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
JOIN pg_namespace bn ON bn.oid = b.typnamespace
WHERE t.oid >= 10000 AND t.oid = ANY(%s)
"""


def _published(conn: psycopg.Connection[Any], publications: Sequence[str]) -> list[tuple[Any, ...]]:
    has_lists = bool(
        conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_publication_tables'::regclass"
            " AND attname = 'rowfilter'"
        ).fetchone()
    )
    extra = "pt.attnames::text[], pt.rowfilter" if has_lists else "NULL::text[], NULL::text"
    return conn.execute(
        f"""
        SELECT c.oid::int, pt.schemaname::text, pt.tablename::text, c.relkind::text,
               c.relreplident::text, {extra}
        FROM pg_publication_tables pt
        JOIN pg_namespace n ON n.nspname = pt.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
        WHERE pt.pubname = ANY(%s)
        ORDER BY 2, 3
        """,
        (list(publications),),
    ).fetchall()


def read_plan(
    conn: psycopg.Connection[Any],
    publications: Sequence[str],
    parallel: int = DEFAULT_PARALLEL,
    min_range_blocks: int = DEFAULT_MIN_RANGE_BLOCKS,
) -> list[TablePlan]:
    """Every published table as pgoutput presents it: columns, key flags, filter, ranges."""
    merged: dict[int, dict[str, Any]] = {}
    for oid, schema, table, relkind, replident, attnames, rowfilter in _published(
        conn, publications
    ):
        entry = merged.setdefault(
            oid,
            {
                "name": f"{schema}.{table}",
                "relkind": relkind,
                "replident": replident,
                "attnames": set(),
                "all_columns": False,
                "filters": [],
                "unfiltered": False,
            },
        )
        if attnames is None:
            entry["all_columns"] = True
        else:
            entry["attnames"].update(attnames)
        if rowfilter is None:
            entry["unfiltered"] = True
        elif rowfilter not in entry["filters"]:
            entry["filters"].append(rowfilter)
    plans: list[TablePlan] = []
    for oid, entry in merged.items():
        cols = conn.execute(
            """
            SELECT a.attname::text, a.atttypid::int, a.atttypmod, a.attnum::int
            FROM pg_attribute a
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
            ORDER BY a.attnum
            """,
            (oid,),
        ).fetchall()
        if not entry["all_columns"]:
            cols = [c for c in cols if c[0] in entry["attnames"]]
        type_names = {
            r[0]: (r[1], r[2])
            for r in conn.execute(_TYPE_NAMES_SQL, ([c[1] for c in cols],)).fetchall()
        }
        columns = []
        for name, type_oid, typmod, attnum in cols:
            type_name = type_names.get(type_oid)
            ddl, kind = _column_kind(type_oid, typmod, type_name)
            columns.append(ColumnPlan(name, type_oid, typmod, type_name, ddl, kind, attnum))
        published = [c.name for c in columns]
        replident = entry["replident"]
        # Exactly the columns pgoutput's Relation message flags as key: all of them under
        # FULL, else those of the primary key (DEFAULT) or the identity index (INDEX).
        keys, unique_on = [], []
        if replident in ("d", "i", "f"):
            # FULL: the primary key, which the state is then kept unique on
            # (slotlake.unique_multiset), though pgoutput flags every column as key.
            index_flag = "indisreplident" if replident == "i" else "indisprimary"
            rows = conn.execute(
                f"""
                SELECT a.attname::text FROM pg_index i
                JOIN pg_attribute a ON a.attrelid = i.indrelid
                 AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1])
                WHERE i.indrelid = %s AND i.{index_flag}
                """,
                (oid,),
            ).fetchall()
            index_cols = {r[0] for r in rows}
            keys = [c for c in published if c in index_cols]
            if replident == "f":
                # A key column left out of the publication's column list: no key to keep.
                unique_on = keys if index_cols <= set(keys) else []
                keys = published
        # Heap blocks to split; a partitioned root spans its largest leaf (a ctid range
        # applies to every partition's scan alike). pg_partition_tree lists nothing for a
        # table that is neither partitioned nor a partition. The size (heap and TOAST of
        # every leaf) is the file size, not a statistic: right even before any ANALYZE.
        blocks, nbytes, natts = conn.execute(
            "SELECT coalesce((SELECT max(pg_relation_size(relid)) FROM pg_partition_tree(%s::oid)"
            " WHERE isleaf), pg_relation_size(%s::oid))::bigint"
            " / current_setting('block_size')::int,"
            " coalesce((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree(%s::oid)"
            " WHERE isleaf), pg_table_size(%s::oid))::bigint,"
            " (SELECT relnatts::int FROM pg_class WHERE oid = %s::oid)",
            (oid, oid, oid, oid, oid),
        ).fetchone() or (0, 0, None)
        row_filter = None
        if not entry["unfiltered"] and entry["filters"]:
            row_filter = " OR ".join(f"({f})" for f in entry["filters"])
        plan_ = TablePlan(
            name=entry["name"],
            oid=oid,
            relkind=entry["relkind"],
            replica_identity=replident,
            columns=columns,
            key_columns=keys,
            unique_on=unique_on,
            row_filter=row_filter,
            blocks=int(blocks),
            bytes=int(nbytes),
            natts=natts,
        )
        plan_.ranges = split_ranges(plan_.blocks, parallel, min_range_blocks)
        plans.append(plan_)
    return sorted(plans, key=lambda p: p.name)


def missing_privileges(conn: psycopg.Connection[Any], plans: Sequence[TablePlan]) -> list[str]:
    """Published tables (or columns) the current role cannot SELECT."""
    lacking = []
    for p in plans:
        (ok,) = conn.execute("SELECT has_table_privilege(%s, 'SELECT')", (p.oid,)).fetchone() or (
            False,
        )
        if ok:
            continue
        cols = [
            c.name
            for c in p.columns
            if not (
                conn.execute(
                    "SELECT has_column_privilege(%s, %s, 'SELECT')", (p.oid, c.name)
                ).fetchone()
                or (False,)
            )[0]
        ]
        if cols or not p.columns:
            lacking.append(p.name + (f" ({', '.join(cols)})" if p.columns else ""))
    return lacking


def hidden_by_row_security(conn: psycopg.Connection[Any], plans: Sequence[TablePlan]) -> list[str]:
    """Published tables whose row-level security applies to the current role: a copy would
    lack the rows their policies hide, while pgoutput sends every change. A superuser, a
    role with BYPASSRLS, and the owner (unless FORCE ROW LEVEL SECURITY) read every row."""
    rows = conn.execute(
        """SELECT c.oid::int FROM pg_class c
           WHERE c.oid = ANY(%s) AND c.relrowsecurity
             AND NOT (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r
                      WHERE r.rolname = current_user)
             AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))""",
        ([p.oid for p in plans],),
    ).fetchall()
    hidden = {r[0] for r in rows}
    return [p.name for p in plans if p.oid in hidden]


def row_security_advice(role: str, tables: Sequence[str]) -> str:
    return (
        f"role {role!r} reads published table(s) {', '.join(tables)} through row-level "
        "security: a copy would lack the rows its policies hide, while the slot sends every "
        f"change. ALTER ROLE {quote_ident(role)} BYPASSRLS (as a superuser), or copy as the "
        "tables' owner (without FORCE ROW LEVEL SECURITY)"
    )


# -- executor side: one range of one table → Arrow batches ---------------------------------


@dataclass(frozen=True)
class CopyTask:
    """Everything a Spark task needs to copy ranges of one table (pickled to executors)."""

    dsn: str
    snapshot: str
    application_name: str
    settings: tuple[tuple[str, str], ...]
    plan: TablePlan
    arrow_schema: pa.Schema
    batch_bytes: int = BATCH_BYTES


def open_snapshot_connection(
    dsn: str, snapshot: str, application_name: str, settings: Sequence[tuple[str, str]]
) -> psycopg.Connection[Any]:
    """A connection inside a REPEATABLE READ READ ONLY transaction in the exported snapshot."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=application_name)
    try:
        for name, value in settings:
            try:
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            except psycopg.errors.InsufficientPrivilege:
                # As in SlotSource: lc_monetary may be superuser-only; money stays exact.
                log.warning("could not SET %s=%r on a copy connection", name, value)
        # A table's row-level security would hide rows from the copy that the slot sends
        # changes of: with it off, such a query fails instead (hidden_by_row_security
        # says so first).
        conn.execute("SET row_security = off")
        conn.autocommit = False
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
    except BaseException:
        conn.close()
        raise
    return conn


def convert_csv(chunk: bytes, plan: TablePlan, schema: pa.Schema) -> pa.RecordBatch:
    """COPY CSV rows of the plan's columns → one Arrow batch of the table's state schema."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from slotlake.decode import sparse_lists
    from slotlake.pgtypes import resolve_type

    names = [f"c{i}" for i in range(len(plan.columns))] or ["c"]
    table = pacsv.read_csv(
        pa.py_buffer(chunk),
        read_options=pacsv.ReadOptions(
            column_names=names, use_threads=False, block_size=max(1 << 20, len(chunk) + 1)
        ),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        # PostgreSQL's CSV: NULL is an unquoted empty field, an empty string is "".
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            null_values=[""],
        ),
    )
    n = table.num_rows
    fallbacks: dict[int, dict[str, str]] = {}
    arrays = []
    for i, col in enumerate(plan.columns):
        target = schema.field(col.name).type
        text = table.column(i).combine_chunks()
        if col.kind == "str":
            arr = text
        elif col.kind == "int":
            arr = pc.cast(text, target)
        elif col.kind == "bool":
            arr = pc.equal(text, pa.scalar("t"))
        elif col.kind == "float8":
            arr = pc.cast(text, pa.float64())
        elif col.kind == "float4":
            # As the codec: parse to double, then round to float4.
            arr = pc.cast(pc.cast(text, pa.float64()), pa.float32(), safe=False)
        else:
            # numeric, timestamptz, arrays, …: the sync decoder's whole-column kernels
            # (COPY CSV under the session settings is the text pgoutput sends); only
            # the rows a kernel rejects go value by value, their Fallback texts kept.
            pg_type = resolve_type(
                col.type_oid, col.typmod, {col.type_oid: col.type_name} if col.type_name else None
            )
            arr, fell = pg_type.convert_column(text, target)
            for j, fb_text in fell.items():
                fallbacks.setdefault(j, {})[col.name] = fb_text
        arrays.append(arr.cast(target) if arr.type != target else arr)
    # Empty except at the rows that fell back: built from offsets, not row by row.
    fell_rows = {j: list(fb.items()) for j, fb in fallbacks.items()}
    arrays.append(sparse_lists(n, fell_rows, schema.field("_fallback").type))
    arrays.append(sparse_lists(n, {}, schema.field("_missing_toast").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def copy_range(
    task: CopyTask, index: int, on_done: Callable[[int, int], None] | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream range ``index`` of the task's table as state batches over a connection of its
    own; reports (rows, bytes)."""
    conn = snapshot_connection(task)
    try:
        yield from copy_rows(conn, task, index, on_done)
        with contextlib.suppress(psycopg.Error):  # read only: nothing to undo
            conn.rollback()
    finally:
        conn.close()


def concurrent_ranges(
    task: CopyTask, workers: int, on_done: Callable[[int, int], None] | None = None
) -> Iterator[pa.RecordBatch]:
    """Every range of the task's table, ``workers`` ranges copied at once on threads (each
    over a connection of its own), their batches in arrival order.

    A few batches are in flight at most (the queue is bounded), so the driver holds a few
    times ``task.batch_bytes`` whatever the table weighs. Threads rather than processes:
    COPY, Arrow's CSV parser and the column kernels release the GIL for the bulk of the
    work. Closing the iterator early (the writer failed) stops the threads and closes
    their connections; a thread's error is raised here as itself.
    """
    import queue

    ranges = iter(range(len(task.plan.ranges)))
    lock = threading.Lock()
    stop = threading.Event()
    out: queue.Queue[Any] = queue.Queue(maxsize=2 * workers)
    ended = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                with lock:
                    index = next(ranges, None)
                if index is None:
                    break
                stream = copy_range(task, index, on_done)
                try:
                    for rb in stream:
                        if not put(rb):
                            return
                finally:
                    stream.close()  # its connection, also when stopped mid-range
        except BaseException as exc:
            put(exc)
        finally:
            put(ended)

    threads = [
        threading.Thread(target=work, name=f"bootstrap-range-{i}", daemon=True)
        for i in range(max(1, min(workers, len(task.plan.ranges))))
    ]
    for t in threads:
        t.start()
    try:
        running = len(threads)
        while running:
            item = out.get()
            if item is ended:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for t in threads:
            t.join()


def snapshot_connection(task: CopyTask) -> psycopg.Connection[Any]:
    """:func:`open_snapshot_connection` for the task, failing with a BootstrapError."""
    try:
        return open_snapshot_connection(
            task.dsn, task.snapshot, task.application_name, task.settings
        )
    except psycopg.Error as exc:
        secrets = [p for p in (dsn_password(task.dsn),) if p]
        raise BootstrapError(
            redact_text(
                f"cannot open a copy connection in snapshot {task.snapshot}: {exc}", secrets
            )
        ) from None


def copy_rows(
    conn: psycopg.Connection[Any],
    task: CopyTask,
    index: int,
    on_done: Callable[[int, int], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream range ``index`` of the task's table over ``conn``, a connection in the
    snapshot; its transaction stays open (the driver copies several tables over one)."""
    lo, hi = task.plan.ranges[index]
    query = task.plan.copy_query(lo, hi)
    rows = nbytes = 0
    try:
        with conn.cursor().copy(query) as copy:
            buf = bytearray()
            # One CopyData message is one row, so a chunk always ends on a row boundary.
            for data in copy:
                buf += data
                if len(buf) >= task.batch_bytes:
                    batch = convert_csv(bytes(buf), task.plan, task.arrow_schema)
                    rows += batch.num_rows
                    nbytes += len(buf)
                    buf.clear()
                    yield batch
            if buf:
                batch = convert_csv(bytes(buf), task.plan, task.arrow_schema)
                rows += batch.num_rows
                nbytes += len(buf)
                yield batch
    except psycopg.Error as exc:
        secrets = [p for p in (dsn_password(task.dsn),) if p]
        raise BootstrapError(
            redact_text(f"copy of {task.plan.name} range {lo}..{hi} failed: {exc}", secrets)
        ) from None
    if on_done is not None:
        on_done(rows, nbytes)


# -- driver side ---------------------------------------------------------------------------


@dataclass
class TableResult:
    rows: int
    bytes: int
    seconds: float
    ranges: int
    driver: bool = False  # copied and written on the driver (a small table)


@dataclass
class BootstrapResult:
    batch: int
    slot: str
    consistent_point: Lsn
    snapshot: str
    tables: dict[str, TableResult]
    seconds: float
    dropped_slot: str | None = None  # "<slot> at <lsn>" when --rebootstrap dropped one


class _ProgressPoller:
    """Live rows/bytes of the bootstrap's COPY backends, from pg_stat_progress_copy."""

    def __init__(
        self, dsn: str, application_name: str, interval: float, progress: Callable[[str], None]
    ) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.interval = interval
        self.progress = progress
        self.table = ""
        self.started = time.monotonic()
        # Rows and bytes of the COPYs that ended (they are gone from pg_stat_progress_copy):
        # Spark accumulators of one table's ranges, or the driver's running totals.
        self.finished: tuple[Any, Any] | None = None
        self._shown = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bootstrap-progress", daemon=True)

    def begin(self, table: str, finished: tuple[Any, Any] | None = None) -> None:
        """Report what follows as ``table`` (a name, or the small tables together)."""
        self.table, self.started, self._shown, self.finished = (
            table,
            time.monotonic(),
            (0, 0),
            finished,
        )

    def start(self) -> None:
        if self.interval > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            conn = psycopg.connect(self.dsn, autocommit=True)
        except psycopg.Error:
            return
        with conn:
            while not self._stop.wait(self.interval):
                try:
                    row = conn.execute(
                        "SELECT coalesce(sum(p.tuples_processed), 0)::bigint,"
                        " coalesce(sum(p.bytes_processed), 0)::bigint, count(*)::int"
                        " FROM pg_stat_progress_copy p JOIN pg_stat_activity a ON a.pid = p.pid"
                        " WHERE a.application_name = %s",
                        (self.application_name,),
                    ).fetchone()
                except psycopg.Error:
                    return
                if row is None:
                    continue
                rows, nbytes, active = row
                if not active:
                    continue  # between tables, or a table too small to be seen copying
                finished = self.finished
                if finished is not None:
                    rows += finished[0].value
                    nbytes += finished[1].value
                # A range between its COPY's end and its task's end is counted nowhere
                # for a moment: never show a smaller figure than before.
                rows, nbytes = max(rows, self._shown[0]), max(nbytes, self._shown[1])
                self._shown = (rows, nbytes)
                secs = max(time.monotonic() - self.started, 1e-9)
                self.progress(
                    f"bootstrap: {self.table}: {rows:,} rows, {nbytes / 1e6:,.1f} MB so far "
                    f"({rows / secs:,.0f} rows/s, {nbytes / 1e6 / secs:,.1f} MB/s, "
                    f"{active} connections copying)"
                )


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def preflight(
    conn: psycopg.Connection[Any], cfg: Config, parallel: int
) -> tuple[str, list[TablePlan]]:
    """All refusals that need only the source (no slot yet); returns (role, plans)."""
    (wal_level,) = conn.execute("SHOW wal_level").fetchone() or ("",)
    if wal_level != "logical":
        raise BootstrapError(
            f"wal_level is {wal_level!r} on the source; logical decoding needs wal_level = "
            "logical (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)"
        )
    role, can_replicate, version, encoding = conn.execute(
        "SELECT current_user::text, rolreplication OR rolsuper,"
        " current_setting('server_version_num')::int,"
        " (SELECT pg_encoding_to_char(encoding)::text FROM pg_database"
        "  WHERE datname = current_database())"
        " FROM pg_roles WHERE rolname = current_user"
    ).fetchone() or ("?", False, 0, "")
    if version < 140000:
        raise BootstrapError(
            f"PostgreSQL {version // 10000} is not supported: slotlake needs 14 or newer"
        )
    if encoding != "UTF8":
        raise BootstrapError(
            f"database {conn.info.dbname!r} has encoding {encoding}; slotlake needs UTF8: "
            "replicate from a UTF8 database"
        )
    if not can_replicate:
        raise BootstrapError(
            f"role {role!r} lacks the REPLICATION attribute needed to create a replication "
            f"slot: ALTER ROLE {quote_ident(role)} REPLICATION (as a superuser), or bootstrap as a role "
            "that has it"
        )
    rows = conn.execute(PUBLICATIONS_SQL, (cfg.source.publications,)).fetchall()
    problem = publication_problem(
        rows, cfg.source.publications, conn.info.dbname, "it must exist before the slot is created"
    )
    if problem is not None:
        raise BootstrapError(problem)
    plans = read_plan(conn, cfg.source.publications, parallel)
    try:
        check_lake_names(conn, ((p.name, p.oid) for p in plans))
    except SnapshotError as exc:
        raise BootstrapError(str(exc)) from None
    _refuse_missing_privileges(conn, role, plans)
    from slotlake.batch import colliding

    for p in plans:
        clash = colliding(c.name for c in p.columns)
        if clash:
            # The sync job would refuse this table at its first change; refuse it now.
            raise BootstrapError(
                f"table {p.name} has column(s) {', '.join(clash)} that collide with slotlake's "
                "metadata columns: rename them at the source or leave the table out of the "
                "publication"
            )
    return role, plans


def _refuse_missing_privileges(
    conn: psycopg.Connection[Any], role: str, plans: Sequence[TablePlan]
) -> None:
    lacking = missing_privileges(conn, plans)
    if lacking:
        raise BootstrapError(
            f"role {role!r} lacks SELECT on published table(s) {', '.join(lacking)}: "
            f"GRANT SELECT ON … TO {quote_ident(role)}, or leave them out of the publication"
        )
    hidden = hidden_by_row_security(conn, plans)
    if hidden:
        raise BootstrapError(row_security_advice(role, hidden))


def _check_lake(lake: Lake, slot: str, onto_existing_lake: bool) -> Any:
    last = lake.last_commit()
    if last is None:
        return None
    if last.slot != slot:
        raise BootstrapError(
            f"lake {lake.uri} was written from slot {last.slot!r}, not {slot!r}: use a "
            "separate lake.path per slot"
        )
    if not onto_existing_lake:
        raise BootstrapError(
            f"lake {lake.uri} already has {len(lake.commit_batches())} committed batch(es) "
            f"(last: batch {last.batch}, ending at {last.end_lsn}): bootstrap a new lake.path, "
            "or pass --onto-existing-lake to append a new bootstrap commit (nothing is deleted; "
            "every published table's state is replaced by the new copy)"
        )
    return last


def _slot_row(conn: psycopg.Connection[Any], slot: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT database::text, active, active_pid, confirmed_flush_lsn::text, restart_lsn::text,"
        " slot_type FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()


# How long a drop waits for the slot's last user to let go of it.
DROP_WAIT_S = 10.0


def _drop_slot(conn: psycopg.Connection[Any], slot: str, wait_s: float = DROP_WAIT_S) -> None:
    """Drop ``slot`` once no session uses it: the replication connection that created it
    (closed just before, when a bootstrap gives up) keeps it active until its backend has
    exited, which the server does after the client has moved on."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _create_slot(dsn: str, slot: str, version: int) -> tuple[psycopg.Connection[Any], Lsn, str]:
    """CREATE_REPLICATION_SLOT … (SNAPSHOT 'export') on a replication connection.

    Returns the connection (keep it open and idle while the snapshot is in use), the
    consistent point and the snapshot name.
    """
    repl = psycopg.connect(
        dsn, autocommit=True, replication="database", application_name=APPLICATION_NAME
    )
    command = (
        f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'export')"
        if version >= 150000
        else f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT"
    )
    try:
        row = repl.execute(command).fetchone()
    except BaseException:
        repl.close()
        raise
    assert row is not None
    _, consistent_point, snapshot, _plugin = row
    return repl, Lsn.parse(consistent_point), str(snapshot)


def _state_ddl(plan: TablePlan) -> str:
    """The rows a copy task yields: published columns + ``_fallback`` + ``_missing_toast``."""
    from slotlake.state import STATE_META

    cols = [(c.name, c.spark_ddl) for c in plan.columns] + STATE_META
    return ", ".join(f"`{n.replace('`', '``')}` {t}" for n, t in cols)


def _delta_state_ddl(plan: TablePlan) -> str:
    """The Delta state's columns (what ``slotlake.batch._state_schema`` gives the sync)."""
    return _state_ddl(plan) + (f", `{COPIES}` bigint" if plan.multiset else "")


def _change_ddl(plan: TablePlan) -> str:
    from slotlake.catalog import TableCatalog
    from slotlake.decode import META_COLUMNS, spark_schema_ddl

    cat = TableCatalog(name=plan.name, columns=[(c.name, c.spark_ddl) for c in plan.columns])
    return spark_schema_ddl(cat, META_COLUMNS)


def _simple_type(ddl: str) -> str:

    return parse_type(ddl).simpleString()


def keep_history_types(plan: TablePlan, earlier: dict[str, str]) -> TablePlan:
    """The plan with every column whose earlier lake type does not widen losslessly to its
    type now copied as text (the sync job's rule for ALTER COLUMN TYPE, catalog.py).

    ``earlier`` maps column name → Spark type the lake's tables have had it as. Without
    this, a re-bootstrap after e.g. ``ALTER COLUMN … TYPE int USING …`` on a text column
    would have Delta cast the change log's history to int.
    """
    from slotlake.catalog import widens_to

    columns = []
    for c in plan.columns:
        old = earlier.get(c.name)
        if old is not None and not widens_to(old, _simple_type(c.spark_ddl)):
            log.info(
                "bootstrap: %s.%s was %s in the lake and is %s now: kept as text",
                plan.name,
                c.name,
                old,
                c.spark_ddl,
            )
            c = ColumnPlan(c.name, c.type_oid, c.typmod, c.type_name, "string", "str", c.attnum)
        columns.append(c)
    plan.columns = columns
    return plan


def multiset_rows(df: DataFrame, columns: Sequence[str], grouped: bool = True) -> DataFrame:
    """Identical copied rows (values and value texts alike) → one row with ``_copies``:
    the multiset state of a copy (bootstrap, per-table snapshots). Not ``grouped`` (an
    INSERT-only table's: :attr:`slotlake.lake.TableCommit.spread`, or rows known
    distinct), each row one copy.

    Maps are not groupable: ``_fallback`` is grouped on its sorted JSON text, the form
    the sync job's multiset MERGE compares (``slotlake.state.multiset_condition``).
    """
    from pyspark.sql import functions as F

    from slotlake.delta import quote

    data = [F.col(quote(c)) for c in columns]
    if grouped:
        from slotlake.state import sorted_json

        df = (
            df.withColumn("_fbj", sorted_json(F.col("_fallback")))
            .groupBy(*data, "_fbj")
            .agg(F.count(F.lit(1)).alias(COPIES))
            .withColumn("_fallback", F.from_json("_fbj", "map<string,string>"))
        )
    else:
        df = df.withColumn(COPIES, F.lit(1).cast("long"))
    return df.select(
        *data,
        "_fallback",
        F.array().cast("array<string>").alias("_missing_toast"),
        F.col(COPIES),
    )


def copy_table(
    spark: SparkSession,
    lake: Lake,
    task: CopyTask,
    state_rel: str,
    app_id: str,
    batch: int,
    poller: _ProgressPoller | None = None,
    steps: Callable[[str], None] = lambda step: None,
) -> tuple[int, int, WriteResult]:
    """Copy one table as Spark tasks (one per range) into its Delta state, in one commit.

    The state table is created (or evolved to the table's columns now), then overwritten
    with the copy, the commit carrying ``(app_id, batch)``. Returns (source rows, COPY
    bytes, the write's Delta version and metrics).
    """

    from slotlake.delta import ensure_table, overwrite

    schema = parse_struct(_state_ddl(task.plan))
    sc = spark.sparkContext
    rows_acc = sc.accumulator(0)
    bytes_acc = sc.accumulator(0)
    if poller is not None:
        poller.begin(task.plan.name, (rows_acc, bytes_acc))

    def done(rows: int, nbytes: int) -> None:
        rows_acc.add(rows)
        bytes_acc.add(nbytes)

    def run(batches):  # type: ignore[no-untyped-def]
        for rb in batches:
            for index in rb.column(0).to_pylist():
                yield from copy_range(task, int(index), done)

    n = len(task.plan.ranges)
    df = spark.range(0, n, 1, n).mapInArrow(run, schema)
    if task.plan.multiset:
        # A primary key makes each row distinct: one copy each, nothing to group.
        grouped = not task.plan.unique_on
        df = multiset_rows(df, [c.name for c in task.plan.columns], grouped=grouped)
    path = lake.path(state_rel)
    ensure_table(spark, path, parse_struct(_delta_state_ddl(task.plan)), drop_missing=True)
    steps("state table ready")
    result = overwrite(df, path, app_id, batch)
    steps("copied into the state")
    # The copy runs once, in the write's job (a multiset's in its map stage): Spark merges
    # each successful task's accumulator updates once, so these are the rows copied.
    return int(rows_acc.value), int(bytes_acc.value), result


def ensure_empty(
    spark: LazySession, lake: Lake, rel: str, ddl: str, on_driver: bool = False
) -> int:
    """Create the Delta table ``rel`` with these columns (or add the missing ones to it);
    returns its current version. A new table is empty: what sync finds before its first
    append (a change log, the transactions table). ``on_driver``: a local lake's table,
    created without Spark (:func:`ensure_on_driver`)."""

    from slotlake.delta import ensure_table, last_commit

    schema = parse_struct(ddl)
    if on_driver:
        return ensure_on_driver(spark, lake, rel, schema)
    path = lake.path(rel)
    ensure_table(spark(), path, parse_struct(ddl))
    return last_commit(spark(), path).version


def ensure_on_driver(
    spark: LazySession, lake: Lake, rel: str, schema: Any, drop_missing: bool = False
) -> int:
    """:func:`slotlake.delta.ensure_local` for the lake's table ``rel``: a new table is
    created by the driver, so are renamed, added and dropped columns of a re-bootstrap
    onto an existing lake; only a changed column type runs Spark (a rewrite of the
    values). Returns the table's version."""
    from slotlake.delta import ensure_local, local_version

    local = _local(lake, rel)
    ensure_local(spark, lake.path(rel), local, schema, drop_missing=drop_missing)
    version = local_version(local)
    assert version is not None
    return version


def _local(lake: Lake, rel: str) -> str:
    return str(local_path(lake.path(rel)))


def _head(spark: LazySession, lake: Lake, rel: str) -> int | None:
    """The latest version of the lake's Delta table ``rel`` (None: there is none)."""
    from slotlake.delta import is_delta_table, last_commit, local_version

    if lake.on_local_disk:
        return local_version(_local(lake, rel))  # from the log, no Spark job
    path = lake.path(rel)
    if not lake.exists(rel) or not is_delta_table(spark(), path):
        return None
    return last_commit(spark(), path).version


def _earlier_types(spark: LazySession, lake: Lake, rels: Sequence[str]) -> dict[str, str]:
    """Column → Spark type in the lake's existing Delta tables ``rels`` (log first)."""
    from slotlake.delta import delta_schema

    out: dict[str, str] = {}
    for rel in rels:
        if lake.on_local_disk:
            schema = delta_schema(_local(lake, rel))
        elif _head(spark, lake, rel) is not None:
            schema = spark().read.format("delta").load(lake.path(rel)).schema
        else:
            schema = None
        for f in schema.fields if schema is not None else []:
            out.setdefault(f.name, f.dataType.simpleString())
    return out


# -- one table's copy, on either path -------------------------------------------------------


@dataclass
class _Attempt:
    """What the copies of one bootstrap attempt share."""

    spark: LazySession  # started by the first table that needs Spark, if any
    lake: Lake
    dsn: str
    snapshot: str
    application_name: str
    settings: tuple[tuple[str, str], ...]
    app_id: str  # the attempt's Delta txnAppId
    batch: int
    last: CommitRecord | None
    parallel: int
    driver_bytes: int  # tables up to this size are copied on the driver (0: none)
    poller: _ProgressPoller
    touch: Callable[[str], None]  # record a table's version before the attempt writes it

    def prepare(self, plan: TablePlan) -> tuple[str, str]:
        """The table's (state, change log) paths, recorded for an undo; on a lake with
        history, columns whose earlier type does not widen are planned as text."""
        state_rel = Lake.table_path(STATE, plan.name)
        changes_rel = Lake.table_path(CHANGES, plan.name)
        self.touch(state_rel)
        self.touch(changes_rel)
        if self.last is not None:
            keep_history_types(
                plan, _earlier_types(self.spark, self.lake, [changes_rel, state_rel])
            )
        return state_rel, changes_rel

    def task(self, plan: TablePlan) -> CopyTask:

        from slotlake.decode import arrow_schema_for

        schema = arrow_schema_for(parse_struct(_state_ddl(plan)))
        return CopyTask(self.dsn, self.snapshot, self.application_name, self.settings, plan, schema)


def on_driver(plan: TablePlan, limit_bytes: int) -> bool:
    """Whether a table is one of the small ones copied on the driver several at once: one
    range (not worth splitting) and at most ``limit_bytes`` on disk."""
    return limit_bytes > 0 and len(plan.ranges) == 1 and plan.bytes <= limit_bytes


def streamed_on_driver(plan: TablePlan, limit_bytes: int) -> bool:
    """Whether a bigger table is streamed on the driver, its ranges copied at once: any
    keyed or INSERT-only table of a lake whose small tables go there (``limit_bytes`` >
    0). A multiset of FULL identity must be grouped whole, so one past the small tables'
    bound goes through Spark, unless its primary key makes each row distinct already
    (:attr:`TablePlan.unique_on`)."""
    streams = not plan.multiset or plan.insert_only or bool(plan.unique_on)
    return limit_bytes > 0 and streams and not on_driver(plan, limit_bytes)


def _session(cfg: Config) -> SparkSession:
    from slotlake.spark import build_session

    return build_session("slotlake-bootstrap", cfg.spark)


def _table_commit(
    plan: TablePlan,
    rels: tuple[str, str],
    state: WriteResult,
    rows: int,
    changes_version: int,
    spread: bool = False,
) -> TableCommit:
    state_rel, changes_rel = rels
    return TableCommit(
        changes=changes_rel,
        state=state_rel,
        change_rows=0,
        # Rows of the Delta state: a multiset's distinct rows, as sync counts them.
        state_rows=int(state.metrics.get("numOutputRows", rows)),
        columns=[[c.name, c.spark_ddl, "state"] for c in plan.columns],
        key_columns=list(plan.key_columns),
        replica_identity=plan.replica_identity,
        attnums={c.name: c.attnum for c in plan.columns if c.attnum is not None},
        natts=plan.natts,
        oid=plan.oid,
        changes_version=changes_version,
        state_version=state.version,
        written=True,
        spread=spread,
        unique_on=list(plan.unique_on),
    )


def _table_line(name: str, r: TableResult) -> str:
    secs = max(r.seconds, 1e-9)
    where = f"{r.ranges} range(s)"
    if r.driver:
        where = "on the driver" + (f", {where}" if r.ranges > 1 else "")
    return (
        f"bootstrap: {name}: {r.rows:,} rows, {r.bytes / 1e6:,.1f} MB in {r.seconds:.1f}s "
        f"({r.rows / secs:,.0f} rows/s, {r.bytes / 1e6 / secs:,.1f} MB/s, {where})"
    )


def _copy_with_spark(att: _Attempt, plan: TablePlan) -> tuple[TableResult, TableCommit]:
    """A big table: its ranges copied by Spark tasks into its state (one Spark write)."""
    t0 = time.monotonic()
    spark = att.spark()
    steps = _Steps(f"bootstrap: {plan.name}", spark, log)
    rels = att.prepare(plan)
    steps("lake tables looked up")
    rows, nbytes, state = copy_table(
        spark, att.lake, att.task(plan), rels[0], att.app_id, att.batch, att.poller, steps
    )
    changes_version = ensure_empty(att.spark, att.lake, rels[1], _change_ddl(plan))
    steps("empty change log created")
    result = TableResult(rows, nbytes, time.monotonic() - t0, len(plan.ranges))
    return result, _table_commit(plan, rels, state, rows, changes_version)


class _Total:
    """A running sum several copy threads add to (the progress poller reads ``value``)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def _copy_on_driver(
    att: _Attempt,
    small: Sequence[TablePlan],
    streamed: Sequence[TablePlan],
    report: Callable[[TablePlan, TableResult, TableCommit], None],
) -> None:
    """Tables copied and written on the driver: the small ones ``att.parallel`` at a time
    (COPY, Arrow's CSV parser and delta-rs release the GIL), then the ``streamed`` ones
    one after another, each with ``att.parallel`` ranges at once; ``report`` sees each
    table as it ends, on this thread."""
    if small or streamed:
        copies = _DriverCopies(att)
        try:
            copies.run(small, streamed, report)
        finally:
            copies.close()


def _selected(batches: Iterator[pa.RecordBatch], names: list[str]) -> Iterator[pa.RecordBatch]:
    """The batches with their columns in the table's order (an INSERT-only multiset's
    with ``_copies`` 1 a row); closing it closes ``batches``."""
    import pyarrow as pa

    try:
        for rb in batches:
            if COPIES in names:
                ones = pa.repeat(pa.scalar(1, pa.int64()), rb.num_rows)
                rb = rb.append_column(pa.field(COPIES, pa.int64()), ones)
            yield rb.select(names)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


class _DriverCopies:
    """The driver's copies: the small tables on a thread pool, one connection in the
    exported snapshot per thread, then the streamed tables one by one; and the running
    totals the progress poller shows.

    A thread keeps its connection (and the snapshot's transaction on it) for every table
    it copies: opening one per table (connect, session settings, snapshot import) would
    cost more than the COPY of a small table.
    """

    def __init__(self, att: _Attempt) -> None:
        self.att = att
        self.totals = (_Total(), _Total())
        self._local = threading.local()
        self._opened: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def run(
        self,
        small: Sequence[TablePlan],
        streamed: Sequence[TablePlan],
        report: Callable[[TablePlan, TableResult, TableCommit], None],
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor, as_completed

        # Before any write: for an undo.
        rels = {p.name: self.att.prepare(p) for p in [*small, *streamed]}
        if small:
            self.att.poller.begin(f"{len(small)} small table(s)", self.totals)
            workers = max(1, min(self.att.parallel, len(small)))
            with ThreadPoolExecutor(workers, thread_name_prefix="bootstrap-copy") as pool:
                futures = {pool.submit(self.copy, p, rels[p.name]): p for p in small}
                try:
                    for future in as_completed(futures):
                        report(futures[future], *future.result())
                except BaseException:
                    # An undo must not race a table still being written: leaving the
                    # pool's block waits for the running copies; the queued ones never
                    # start.
                    for f in futures:
                        f.cancel()
                    raise
        for plan in streamed:
            self.totals = (_Total(), _Total())
            self.att.poller.begin(plan.name, self.totals)
            report(plan, *self.copy(plan, rels[plan.name]))

    def close(self) -> None:
        for conn in self._opened:
            conn.close()

    def _connection(self, task: CopyTask) -> psycopg.Connection[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = snapshot_connection(task)
            with self._lock:
                self._opened.append(conn)
        return conn

    def copy(self, plan: TablePlan, rels: tuple[str, str]) -> tuple[TableResult, TableCommit]:
        """One table: COPY → Arrow → its Delta state (created by the driver, then one
        ``deltalake`` overwrite carrying the attempt's txn marker) and empty change log.

        A keyed table's batches are written as they arrive (a few in memory, whatever the
        table weighs; its ranges copied at once over connections of their own); a
        multiset, a small table by construction, is held whole to be grouped."""
        import pyarrow as pa

        from slotlake.delta import arrow_overwrite, arrow_overwrite_stream, delta_schema

        att = self.att
        t0 = time.monotonic()
        steps = _Steps(f"bootstrap: {plan.name} (driver)", logger=log)
        task = att.task(plan)
        copied = (_Total(), _Total())

        def ended(rows: int, nbytes: int) -> None:
            for rows_total, bytes_total in (copied, self.totals):
                rows_total.add(rows)
                bytes_total.add(nbytes)

        if len(plan.ranges) == 1:
            batches = copy_rows(self._connection(task), task, 0, ended)
        else:
            batches = concurrent_ranges(task, att.parallel, ended)
        state_rel, changes_rel = rels
        local = _local(att.lake, state_rel)
        ensure_on_driver(
            att.spark, att.lake, state_rel, parse_struct(_delta_state_ddl(plan)), drop_missing=True
        )
        # An existing (re-bootstrapped) table may order its columns differently.
        order = delta_schema(local)
        assert order is not None
        names = order.fieldNames()
        spread = plan.insert_only and not on_driver(plan, att.driver_bytes)
        if plan.multiset and not spread and not plan.unique_on:
            whole = pa.Table.from_batches(list(batches), schema=task.arrow_schema)
            from slotlake.multiset_arrow import multiset_table

            grouped = multiset_table(whole, [c.name for c in plan.columns])
            state = arrow_overwrite(local, grouped.select(names), att.app_id, att.batch)
        else:
            fields = {f.name: f for f in task.arrow_schema}
            fields[COPIES] = pa.field(COPIES, pa.int64())
            schema = pa.schema([fields[n] for n in names])
            state = arrow_overwrite_stream(
                local, schema, _selected(batches, names), att.app_id, att.batch
            )
        steps("copied into the state")
        changes_version = ensure_empty(
            att.spark, att.lake, changes_rel, _change_ddl(plan), on_driver=True
        )
        steps("empty change log created")
        rows, nbytes = copied[0].value, copied[1].value
        result = TableResult(rows, nbytes, time.monotonic() - t0, len(plan.ranges), driver=True)
        return result, _table_commit(plan, rels, state, rows, changes_version, spread)


def run_bootstrap(
    cfg: Config,
    spark: SparkSession | None = None,
    rebootstrap: bool = False,
    onto_existing_lake: bool = False,
    parallel: int = DEFAULT_PARALLEL,
    min_range_blocks: int = DEFAULT_MIN_RANGE_BLOCKS,
    progress: Callable[[str], None] = log.info,
    progress_interval: float = 10.0,
) -> BootstrapResult:
    """Create the slot, copy every published table in its snapshot, commit batch 1 (or N+1)."""
    t_start = time.monotonic()
    slot = cfg.source.slot
    dsn = cfg.source.dsn
    secrets = [p for p in (dsn_password(dsn),) if p]
    if not _SLOT_NAME.match(slot):
        raise BootstrapError(
            f"slot name {slot!r} is not valid: use lower-case letters, digits and underscores"
        )
    if parallel < 1:
        raise BootstrapError(f"parallel must be 1 or more, not {parallel}")
    if spark is None and "://" in cfg.lake.path:
        # A Hadoop file system lake is reached through Spark's JVM, even for the checks.
        spark = _session(cfg)
    lake = Lake(cfg.lake.path)
    # A lake of the old Parquet layout: OldLayoutError (one line), before the source is
    # touched.
    lake.layout()
    try:
        ctl = psycopg.connect(dsn, autocommit=True, application_name=APPLICATION_NAME)
    except psycopg.Error as exc:
        raise BootstrapError(
            redact_text(_one_line(f"cannot connect to {describe_dsn(dsn)}: {exc}"), secrets)
        ) from None
    with ctl:
        try:
            role, _ = preflight(ctl, cfg, parallel)
            version = int(ctl.info.server_version)
            keep_alive(ctl, cfg.source.settings)
            (locked,) = ctl.execute(
                "SELECT pg_try_advisory_lock(%s)", (lock_key(slot),)
            ).fetchone() or (False,)
            if not locked:
                raise BootstrapError(
                    locked_message(slot, lock_holder(ctl, slot), "wait for it to end")
                )
            last = _check_lake(lake, slot, onto_existing_lake)
            existing = _slot_row(ctl, slot)
            dropped = None
            if existing is not None:
                database, active, active_pid, confirmed, restart, slot_type = existing
                where = (
                    f"{slot_type} slot in database {database!r}, confirmed_flush_lsn {confirmed}, "
                    f"restart_lsn {restart}"
                )
                if not rebootstrap:
                    raise BootstrapError(
                        f"replication slot {slot!r} already exists ({where}): sync from it, or "
                        "pass --rebootstrap to drop it and take a new initial copy"
                    )
                if active:
                    raise BootstrapError(
                        f"replication slot {slot!r} is in use by PID {active_pid}: stop that "
                        "consumer before re-bootstrapping"
                    )
                if database != ctl.info.dbname:
                    raise BootstrapError(
                        f"replication slot {slot!r} belongs to database {database!r}, not "
                        f"{ctl.info.dbname!r}: refusing to drop another database's slot"
                    )
            for removed in lake.remove_uncommitted():
                log.info("removed %s left by an attempt that never committed", removed)
            if cfg.source.capture_ddl:
                _install_ddl_capture(ctl, progress)
            if existing is not None:
                progress(f"bootstrap: --rebootstrap: dropping replication slot {slot!r} ({where})")
                _drop_slot(ctl, slot)
                dropped = f"{slot} at {existing[3]}"
            return _bootstrap(
                cfg,
                ctl,
                lake,
                spark,
                role,
                version,
                last,
                parallel,
                min_range_blocks,
                progress,
                progress_interval,
                t_start,
                dropped,
            )
        except psycopg.Error as exc:
            raise BootstrapError(
                redact_text(_one_line(f"bootstrap of slot {slot!r} failed: {exc}"), secrets)
            ) from None
        finally:
            # Released now, not when the server's backend exits after the close: a sync
            # started right after the bootstrap must not find the lock still held.
            if not ctl.closed:
                with contextlib.suppress(psycopg.Error):
                    ctl.execute("SELECT pg_advisory_unlock_all()")


def _install_ddl_capture(ctl: psycopg.Connection[Any], progress: Callable[[str], None]) -> None:
    """The DDL capture trigger (slotlake.ddl), before the slot: every later DDL is in the
    stream. Without SUPERUSER the bootstrap goes on and says what to run."""
    from slotlake.ddl import DdlCaptureError, install

    try:
        created = install(ctl)
    except DdlCaptureError as exc:
        log.warning(
            "bootstrap: DDL capture trigger not installed (%s); fast defaults then rely on "
            "the catalog read at each batch's target. Install it with: slotlake capture-ddl "
            "--config <this configuration>, as a superuser",
            exc,
        )
        return
    progress(
        "bootstrap: DDL capture trigger "
        + ("installed" if created else "already installed (function refreshed)")
    )


def _bootstrap(
    cfg: Config,
    ctl: psycopg.Connection[Any],
    lake: Lake,
    started: SparkSession | None,
    role: str,
    version: int,
    last: CommitRecord | None,
    parallel: int,
    min_range_blocks: int,
    progress: Callable[[str], None],
    progress_interval: float,
    t_start: float,
    dropped: str | None,
) -> BootstrapResult:
    slot = cfg.source.slot
    dsn = cfg.source.dsn
    batch = last.batch + 1 if last is not None else 1
    attempt = new_attempt()
    # A lake on local disk whose tables are all copied on the driver starts no JVM.
    spark = LazySession(lambda: _session(cfg), started)
    # Before the slot: what the first sync compares the source with (slotlake.snapshot).
    seen = source_catalog(ctl, cfg.source.publications, cfg.source.pulls_messages)
    try:
        repl, consistent, snapshot = _create_slot(dsn, slot, version)
    except psycopg.Error as exc:
        hint = ""
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            hint = f" (role {role!r} needs the REPLICATION attribute and a replication entry in pg_hba.conf)"
        raise BootstrapError(
            _one_line(f"cannot create replication slot {slot!r}: {exc}{hint}")
        ) from None
    progress(
        f"bootstrap: created slot {slot} at consistent point {consistent}, snapshot {snapshot}"
    )
    committed = False
    poller: _ProgressPoller | None = None
    # Delta tables this attempt wrote → their version before it (None: it created them),
    # so that a failed attempt leaves the lake as it found it.
    touched: dict[str, int | None] = {}
    try:
        had_layout = lake.layout() is not None
        app_id = lake.app_id(f"bootstrap-{attempt}")
        if last is None and had_layout:
            # Nothing is committed, so any table here is a dead attempt's (a killed
            # bootstrap or first sync batch): start from a clean lake.
            for folder in (STATE, CHANGES, TRANSACTIONS, MESSAGES, DDL):
                if lake.exists(folder):
                    log.info("removing %s left by an attempt that never committed", folder)
                    lake.fs.rmtree(lake.path(folder))

        def touch(rel: str) -> None:
            if rel not in touched:
                touched[rel] = _head(spark, lake, rel)

        settings = tuple(
            {**SESSION_SETTINGS, **cfg.source.settings, "client_encoding": "UTF8"}.items()
        )
        app = f"{APPLICATION_NAME}:{slot}"
        snap_conn = open_snapshot_connection(dsn, snapshot, "slotlake", settings)
        with snap_conn:
            plans = read_plan(snap_conn, cfg.source.publications, parallel, min_range_blocks)
            _refuse_missing_privileges(snap_conn, role, plans)
            snap_conn.rollback()
        poller = _ProgressPoller(dsn, app, progress_interval, progress)
        att = _Attempt(
            spark,
            lake,
            dsn,
            snapshot,
            app,
            settings,
            app_id,
            batch,
            last,
            parallel,
            cfg.lake.bootstrap_driver_mb << 20 if lake.on_local_disk else 0,
            poller,
            touch,
        )
        small = [p for p in plans if on_driver(p, att.driver_bytes)]
        streamed = [p for p in plans if streamed_on_driver(p, att.driver_bytes)]
        commits: dict[str, TableCommit] = {}
        results: dict[str, TableResult] = {}

        def report(plan: TablePlan, result: TableResult, commit: TableCommit) -> None:
            results[plan.name], commits[plan.name] = result, commit
            progress(_table_line(plan.name, result))

        poller.start()
        _copy_on_driver(att, small, streamed, report)
        for plan in plans:
            if plan.name not in commits:
                report(plan, *_copy_with_spark(att, plan))
        tables = {p.name: commits[p.name] for p in plans}
        poller.stop()
        # The copy is done: the snapshot may go. The slot stays (it is not temporary).
        repl.close()
        touch(TRANSACTIONS)
        transactions_version = ensure_empty(
            spark, lake, TRANSACTIONS, TRANSACTIONS_DDL, on_driver=att.driver_bytes > 0
        )
        if last is not None:
            for name, t in last.tables.items():
                if name not in tables:
                    # No longer published: kept as of the previous batch, as sync keeps it.
                    kept = TableCommit(**{**t.__dict__})
                    kept.change_rows, kept.written, kept.renames = 0, False, {}
                    tables[name] = kept
            mark_gone(tables, {p.name for p in plans}, batch)
        total = time.monotonic() - t_start
        record = make_record(
            batch=batch,
            attempt=attempt,
            slot=slot,
            start_lsn=str(last.end if last is not None else consistent),
            end_lsn=str(consistent),
            target_lsn=str(consistent),
            raw=None,
            transactions=TRANSACTIONS,
            transactions_version=transactions_version,
            messages=last.messages if last is not None else None,
            messages_version=last.messages_version if last is not None else None,
            ddl=last.ddl if last is not None else None,
            ddl_version=last.ddl_version if last is not None else None,
            txn_app_id=app_id,
            tables=tables,
            timings={"total": round(total, 3)},
            kind="bootstrap",
            # The tables copied, as of the copy, and the source's files before it: the
            # first sync's checks start from them (a re-created table, a rewrite, a
            # partition detached or attached since).
            snapshot={"published": {p.name: p.oid for p in plans}, **seen},
        )
        lake.write_commit(record)
        committed = True
        # A plan of an unfinished sync batch is obsolete: its slot position is gone.
        lake.drop_plans(batch)
        if lake.on_local_disk:
            _make_key_indexes(lake, [tables[p.name] for p in plans], progress)
        progress(
            f"bootstrap: batch {batch} committed: {len(plans)} table(s), "
            f"{sum(r.rows for r in results.values()):,} rows, slot {slot} at {consistent} "
            f"({total:.1f}s)"
        )
        return BootstrapResult(batch, slot, consistent, snapshot, results, total, dropped)
    finally:
        if poller is not None:
            poller.stop()
        if not repl.closed:
            repl.close()
        if not committed:
            _abandon(ctl, lake, spark, slot, touched, progress)


def _make_key_indexes(
    lake: Lake, copied: Sequence[TableCommit], progress: Callable[[str], None]
) -> None:
    """The key indexes of the big states just copied (:mod:`slotlake.key_index`), made
    now rather than by the first sync's MERGE (~0.1 s a million rows). A cache: one not
    made is a warning, and the bootstrap stands."""
    from slotlake import dv_merge, key_index

    for t in copied:
        key = t.unique_on if t.multiset else t.key_columns
        if t.state is None or not key or t.state_rows < key_index.AHEAD_MIN_ROWS:
            continue
        t0 = time.monotonic()
        made = dv_merge.make_key_indexes(_local(lake, t.state), key)
        if made:
            progress(
                f"bootstrap: {t.state}: key indexes of {made} files made "
                f"({time.monotonic() - t0:.1f}s)"
            )


def _abandon(
    ctl: psycopg.Connection[Any],
    lake: Lake,
    spark: LazySession,
    slot: str,
    touched: dict[str, int | None],
    progress: Callable[[str], None],
) -> None:
    """Undo an unfinished bootstrap: its own slot, and its writes to the lake's tables.

    A Delta table it created is removed; one that existed is restored to the version it
    had before (the sync job MERGEs into a table's latest version, which must be the one
    the last commit record names).
    """
    try:
        if ctl.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            ctl.rollback()
        _drop_slot(ctl, slot)
        progress(f"bootstrap failed: dropped the slot {slot!r} it had created")
    except psycopg.Error as exc:
        progress(
            f"bootstrap failed and could not drop its slot {slot!r} ({_one_line(str(exc))}): "
            "drop it, or rerun with --rebootstrap"
        )
    from slotlake.delta import table_ref

    for rel, before in touched.items():
        try:
            if before is None:
                lake.fs.rmtree(lake.path(rel))
            elif _head(spark, lake, rel) != before:
                spark().sql(f"RESTORE TABLE {table_ref(lake.path(rel))} TO VERSION AS OF {before}")
                progress(f"bootstrap failed: restored {rel} to its version {before}")
        except Exception as exc:  # never hide the bootstrap's own error behind this
            log.warning("could not undo the bootstrap's writes to %s: %s", rel, exc)


# -- command line --------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bootstrap options (shared by ``slotlake bootstrap`` and jobs/bootstrap.py)."""
    p.add_argument(
        "--rebootstrap",
        action="store_true",
        help="drop an existing slot of that name (its position is logged) and take a new copy",
    )
    p.add_argument(
        "--onto-existing-lake",
        action="store_true",
        help="append a bootstrap commit to a lake that already has commits (nothing is deleted)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=DEFAULT_PARALLEL,
        help="copy connections at most: ranges of a big table, small tables at once "
        f"(default {DEFAULT_PARALLEL})",
    )


def run_from_args(args: argparse.Namespace, cfg: Config, spark: SparkSession | None = None) -> int:
    result = run_bootstrap(
        cfg,
        spark=spark,
        rebootstrap=args.rebootstrap,
        onto_existing_lake=args.onto_existing_lake,
        parallel=args.parallel,
    )
    for name, t in sorted(result.tables.items()):
        print(f"{name}: {t.rows} rows, {t.bytes / 1e6:.1f} MB in {t.seconds:.1f}s")
    print(
        f"status: bootstrapped, batch {result.batch}, slot {result.slot} at {result.consistent_point}"
    )
    return 0
