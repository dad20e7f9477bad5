"""Per-table snapshots while syncing: rows the slot never carries, copied consistently.

A table added to a publication keeps the rows it already had out of the stream, and a
table rewrite (``ALTER COLUMN … TYPE … USING``, a volatile ``ADD COLUMN … DEFAULT``)
changes rows without decoding them. Both are repaired by re-basing the table's state on a
copy taken consistently with the change stream — PostgreSQL's own table-sync method:

1. Before a sync run chooses its target LSN, it opens a replication connection and
   creates a **temporary** logical slot with an exported snapshot
   (``CREATE_REPLICATION_SLOT … TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')``). The
   reply's consistent point CP splits the history: a transaction whose commit record
   starts before CP is in the snapshot, one at or after CP is not (a slot created there
   would decode it). One temporary slot serves every table snapshotted by the run.
2. Each table is copied in that snapshot (``SET TRANSACTION SNAPSHOT`` on plain
   connections: a plain ``SELECT``'s lock, nothing more) by the bootstrap's COPY and Arrow
   conversion (:func:`slotlake.bootstrap.concurrent_ranges`: a big table's block ranges
   at once, each over a connection of its own) into staging Parquet inside the lake
   (``_snapshots/b<N>-<attempt>/<table>/``). Then the replication connection is closed,
   which drops the temporary slot; the main slot never moves for it.
3. The batch's target is chosen (at least CP) and the batch plan records the snapshot
   tables, their staging directories and CP before any table is written: a rerun after a
   kill at any instant finishes the same batch from them.
4. In that batch (on the driver when the copy fits ``lake.driver_write_state_mb``, see
   :mod:`slotlake.local_table`; else through Spark, :func:`rebase`) the table's change
   log gets every change the slot delivered, in order,
   plus one marker row ``_op = 'S'`` at (``_commit_lsn`` = CP, ``_tx_ordinal`` = -1): the
   state was re-based on a copy there; changes before the marker are inside the copy.
   The state is replaced by the copy (one overwrite commit, idempotent under the txnAppId
   ``<lake app id>-snapshot``) and the changes with commit LSN ≥ CP are applied on top
   (the usual MERGE, under the usual txn marker); their unchanged TOAST is filled from
   the copy. Changes before CP are filled from the previous state, as always.

When: (a) a table in ``pg_publication_tables`` now that was not in the previous commit's
published set (each commit records it), except on a lake's very first batch (start with
``slotlake bootstrap`` to copy existing rows); (b) a table rewritten at the source — a
transactional ``slotlake.ddl`` message with ``"rewrite": true`` for it (the DDL capture
trigger), or, without the trigger, a changed ``pg_class.relfilenode`` that no TRUNCATE in
the stream explains (logged as a warning; VACUUM FULL and CLUSTER change it too and cost
a needless but harmless snapshot, unless the DDL capture was in place since the
previous commit: :func:`slotlake.ddl.capture_fingerprint`) — snapshotted by the next
run; (c) a partitioned table published as itself that lost a leaf (the same run:
:func:`partitions_left`; with the DDL capture trigger also one no run read), rewrote one
(the next run), or gained one attached with rows it had before (the same run:
:func:`attached_with_rows`); (d) by hand, ``slotlake resnapshot --table schema.table`` records a request the next sync
honours.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg

from slotlake.ddl import DDL_PREFIX
from slotlake.ddltypes import parse_struct
from slotlake.lake import (
    COPIES,
    STATE,
    CommitRecord,
    Lake,
    TableCommit,
    batch_dir_name,
    batch_dirs,
    table_dir_name,
    utcnow_iso,
)
from slotlake.lsn import Lsn
from slotlake.redact import dsn_password, redact_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from slotlake.bootstrap import TablePlan
    from slotlake.catalog import RelationChange, TableCatalog
    from slotlake.config import Config
    from slotlake.fastdefault import FastDefault

log = logging.getLogger(__name__)

SNAPSHOTS = "_snapshots"
REQUESTS = f"{SNAPSHOTS}/requests"
PROGRESS = f"{SNAPSHOTS}/progress.json"
SNAPSHOT_OP = "S"
APPLICATION_NAME = "slotlake-snapshot"
# Fault steps of the hand-over (tests of the exactly-once contract; see sync.fault_point).
FAULT_STEPS = ("snapshot_copied", "snapshot_rebased")


class SnapshotError(RuntimeError):
    """A snapshot that cannot be taken; the message names the table and what to do."""


@dataclass
class TableSnapshot:
    """One table's copy for batch N: where it is, and where the stream takes over."""

    table: str
    oid: int
    reason: str
    consistent_point: str  # CP: changes committing at or after it are applied on the copy
    staging: str  # Parquet directory of the copied rows, relative to the lake root
    rows: int
    columns: list[list[str]]  # [name, spark ddl] of the copy, in attnum order
    key_columns: list[str]
    replica_identity: str
    # name → attnum of the copy's columns: matches them to the target's (a rename after
    # the copy, or a DROP and an ADD: copy_names); a plan written before it has none.
    attnums: dict[str, int] = field(default_factory=dict)
    # FULL identity: the primary key the copy is unique on (TableCommit.unique_on).
    unique_on: list[str] = field(default_factory=list)

    @property
    def cp_signed(self) -> int:
        return Lsn.parse(self.consistent_point).to_signed()


def _fault(step: str) -> None:
    from slotlake.sync import fault_point

    fault_point(step)


# -- what the source publishes ---------------------------------------------------------------


def published_tables(
    conn: psycopg.Connection[Any], publications: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """schema.table → (oid, relfilenode) of every table the publications publish now."""
    return published_catalog(conn, publications).tables


class Published(NamedTuple):
    """What :func:`published_catalog` reads of the published set, per table
    (``schema.table``)."""

    tables: dict[str, tuple[int, int]]  # (oid, relfilenode)
    xmins: dict[str, str]  # pg_class.xmin
    joins: dict[str, str]  # a partition's pg_inherits xmins up its path
    scopes: dict[str, list[Any]]  # the publications' row filters and column list
    # The enum and composite types the tables' columns hold (held_types).
    types: dict[str, Any]
    # The pg_publication_rel and pg_publication_namespace rows (oids) that publish each
    # table, its partitioned ancestors' and their schemas' included (rejoined).
    memberships: dict[str, list[int]]
    # The attnums of each table's stored generated columns (tables without one left out):
    # pgoutput of PostgreSQL 15 and 16 sends none of them.
    generated: dict[str, list[int]]
    # Of the generated columns a commit recorded (``since``), those that are ordinary
    # columns now (``DROP EXPRESSION``): table → {attnum: name} (ungenerated).
    ordinary: dict[str, dict[int, str]]
    # A partition published as itself → its partitioned ancestors' oids.
    ancestors: dict[str, list[int]]


def published_catalog(
    conn: psycopg.Connection[Any],
    publications: Sequence[str],
    since: CommitRecord | None = None,
) -> Published:
    """:func:`read_published` in a transaction without JIT: the estimates of its queries
    (the subqueries per table, the types' recursion) pass ``jit_above_cost``, and a
    server built with LLVM (Debian's 15) spent 20 ms compiling for 300 tables, 0.3 s for
    the recursion."""
    with conn.transaction():
        conn.execute("SET LOCAL jit = off")
        return read_published(conn, publications, since)


def read_published(
    conn: psycopg.Connection[Any],
    publications: Sequence[str],
    since: CommitRecord | None = None,
) -> Published:
    """:func:`published_tables`, each table's ``pg_class.xmin`` read with it, each
    partition's ``pg_inherits`` xmins up its path (``xid/xid…``, the table's first), and
    what the publications publish of it (:func:`scope_of`).

    The xmin is the transaction that last set its relfilenode (among other fields): a
    TRUNCATE in the stream explains a new relfilenode only when it is that transaction,
    as a rewrite after it (``ALTER COLUMN … TYPE … USING``) changes rows unseen
    (:func:`for_record`). A partition published as itself (a publication of its
    partitioned table without ``publish_via_partition_root``) that was detached, written
    and attached again between two runs has other ``pg_inherits`` rows: the rows written
    meanwhile were in no publication (:func:`_wanted`)."""
    lists = int(conn.info.server_version) >= 150000
    if lists:
        # The function pg_publication_tables is a view of, called as it does, with the row
        # filter and the column list (attnums) it reads: the view finds each table's
        # pg_class row by name, which cost 4× the function (300 tables: 1.8 vs 0.4 ms).
        # Its attnums are NULL (15) or every column (16) for a publication without a list:
        # the list is the relation's pg_publication_rel row's, when it has one (a
        # partitioned table has one only when published through its root).
        source = """pg_publication p
        CROSS JOIN LATERAL pg_get_publication_tables(p.pubname::text) gpt
        JOIN pg_class c ON c.oid = gpt.relid
        JOIN pg_namespace n ON n.oid = c.relnamespace"""
        scope = """pg_get_expr(gpt.qual, gpt.relid),
               CASE WHEN EXISTS (SELECT FROM pg_publication_rel pr
                                 WHERE pr.prpubid = p.oid AND pr.prrelid = gpt.relid
                                   AND pr.prattrs IS NOT NULL)
               THEN gpt.attrs::int2[]::int[] END"""
    else:
        # PostgreSQL 14: no row filters nor column lists.
        source = """pg_publication_tables p
        JOIN pg_namespace n ON n.nspname = p.schemaname
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename"""
        scope = "NULL::text, NULL::int[]"
    rows = conn.execute(
        f"""
        SELECT n.nspname::text || '.' || c.relname::text, c.oid::int,
               c.relfilenode::bigint, c.xmin::text,
               CASE WHEN c.relispartition THEN
                 (SELECT string_agg(i.xmin::text, '/' ORDER BY a.n)
                  FROM pg_partition_ancestors(c.oid) WITH ORDINALITY a(relid, n)
                  JOIN pg_inherits i ON i.inhrelid = a.relid) END,
               {scope},
               CASE WHEN c.relispartition THEN
                 ARRAY(SELECT k.oid::int FROM pg_partition_ancestors(c.oid) a
                       JOIN pg_class k ON k.oid = a.relid)
               ELSE ARRAY[c.oid::int] END,
               CASE WHEN c.relispartition THEN
                 ARRAY(SELECT k.relnamespace::int FROM pg_partition_ancestors(c.oid) a
                       JOIN pg_class k ON k.oid = a.relid)
               ELSE ARRAY[c.relnamespace::int] END
        FROM {source}
        WHERE p.pubname = ANY(%s)
        """,
        (list(publications),),
    ).fetchall()
    # Each table's rows in the publications: its own, its partitioned ancestors', their
    # schemas' — one read of the publications' rows, matched here (a subquery per table
    # cost 1,000 tables 5 ms); the stored generated columns in the same statement.
    by_rel: dict[int, list[int]] = {}
    by_schema: dict[int, list[int]] = {}
    generated_in: dict[int, list[int]] = {}
    kinds = {"r": by_rel, "n": by_schema, "g": generated_in}
    lookup = _MEMBERS_SQL + "UNION ALL " + _GENERATED_SQL if lists else _GENERATED_SQL
    for kind, target, oid in conn.execute(lookup, {"p": list(publications)} if lists else None):
        kinds[kind].setdefault(target, []).append(oid)
    # One pass over the rows (a row per publication and table): 1,000 tables are read
    # before every batch, twice.
    tables: dict[str, tuple[int, int]] = {}
    xmins: dict[str, str] = {}
    joins: dict[str, str] = {}
    ancestors: dict[str, list[int]] = {}
    per_publication: dict[str, list[tuple[str | None, list[int] | None]]] = {}
    members: dict[str, set[int]] = {}
    clashing: set[str] = set()
    for name, oid, node, xmin, path, rowfilter, attnums, rels, schemas in rows:
        had = tables.get(name)
        if had is not None and had[0] != oid:
            clashing.add(name)
        tables[name] = (oid, node)
        xmins[name] = xmin
        if path is not None:
            joins[name] = path
            ancestors[name] = sorted(int(r) for r in rels if int(r) != oid)
        per_publication.setdefault(name, []).append((rowfilter, attnums))
        if lists:
            found = members.setdefault(name, set())
            for rel in rels:
                found.update(by_rel.get(rel, ()))
            for schema in schemas:
                found.update(by_schema.get(schema, ()))
    if clashing:
        check_lake_names(conn, ((r[0], r[1]) for r in rows if r[0] in clashing))
    generated = {
        name: sorted(generated_in[oid]) for name, (oid, _) in tables.items() if oid in generated_in
    }
    return Published(
        tables,
        xmins,
        joins,
        {name: scope_of(pubs) for name, pubs in per_publication.items()} if lists else {},
        held_types(conn, {name: t[0] for name, t in tables.items()}),
        {k: sorted(v) for k, v in members.items()},
        generated,
        _ordinary_now(conn, since, tables, generated),
        ancestors,
    )


# Every stored generated column: its expression's pg_attrdef row depends on it as
# INTERNAL (a default's as AUTO), read through pg_depend's index on the depending class
# (1,000 tables with a serial key each: 0.2-0.45 ms; joining pg_attrdef to pg_attribute
# to read attgenerated, 1.5-5 ms).
_GENERATED_SQL = """
SELECT 'g', d.refobjid::int, d.refobjsubid::int FROM pg_depend d
WHERE d.classid = 'pg_attrdef'::regclass AND d.refclassid = 'pg_class'::regclass
  AND d.deptype = 'i'
"""


def _ordinary_now(
    conn: psycopg.Connection[Any],
    since: CommitRecord | None,
    tables: Mapping[str, tuple[int, int]],
    generated: Mapping[str, Sequence[int]],
) -> dict[str, dict[int, str]]:
    """:attr:`Published.ordinary`: the columns ``since`` recorded generated that are not
    any more, looked up when there are any (a column dropped is gone, not ordinary)."""
    before = (since.snapshot.get("generated") if since is not None else None) or {}
    oids = _baseline(since) or {}
    pairs = [
        (tables[name][0], attnum)
        for name, had in before.items()
        if name in tables and oids.get(name) in (None, tables[name][0])
        for attnum in had
        if attnum not in generated.get(name, ())
    ]
    if not pairs:
        return {}
    names = {oid: name for name, (oid, _) in tables.items()}
    out: dict[str, dict[int, str]] = {}
    for rel, attnum, column in conn.execute(
        """SELECT a.attrelid::int, a.attnum::int, a.attname::text
           FROM unnest(%s::oid[], %s::int2[]) p(rel, num)
           JOIN pg_attribute a ON a.attrelid = p.rel AND a.attnum = p.num
           WHERE NOT a.attisdropped AND a.attgenerated = ''""",
        ([p[0] for p in pairs], [p[1] for p in pairs]),
    ):
        out.setdefault(names[rel], {})[attnum] = column
    return out


# The enum and composite types a table's columns reach, through domains, arrays,
# composites, ranges and multiranges. It starts from the columns' dependencies on their
# types, which PostgreSQL records for every type but the pinned ones, of every table (the
# few that are not published are left out after); types made at initdb (below 16384:
# information_schema's domains, say) hold neither.
# (1,000 tables of built-in types: 0.3 ms; from their pg_attribute rows 3.5 ms.)
_TYPES_SQL = """
WITH RECURSIVE reach(rel, typ) AS (
  SELECT DISTINCT d.objid, d.refobjid FROM pg_depend d
  WHERE d.classid = 'pg_class'::regclass AND d.objsubid > 0
    AND d.refclassid = 'pg_type'::regclass AND d.deptype = 'n' AND d.refobjid >= 16384
  UNION
  SELECT r.rel, n.t FROM reach r JOIN pg_type ty ON ty.oid = r.typ
  CROSS JOIN LATERAL (
    SELECT ty.typbasetype WHERE ty.typtype = 'd'
    UNION ALL SELECT ty.typelem WHERE ty.typelem <> 0
    UNION ALL SELECT ca.atttypid FROM pg_attribute ca
      WHERE ty.typtype = 'c' AND ca.attrelid = ty.typrelid AND ca.attnum > 0
        AND NOT ca.attisdropped
    UNION ALL SELECT rg.rngsubtype FROM pg_range rg
      WHERE rg.rngtypid = ty.oid OR rg.rngmultitypid = ty.oid
  ) n(t)
)
SELECT h.rel::int, h.typ::int, h.typtype::text,
       CASE WHEN NOT h.first THEN NULL
            WHEN h.typtype = 'e' THEN
              (SELECT json_object_agg(e.oid::text, e.enumlabel) FROM pg_enum e
               WHERE e.enumtypid = h.typ)
            ELSE json_build_object('name', format_type(h.typ, NULL), 'attributes',
              (SELECT json_agg(json_build_array(ca.attnum, ca.atttypid) ORDER BY ca.attnum)
               FROM pg_attribute ca
               WHERE ca.attrelid = h.typrelid AND ca.attnum > 0 AND NOT ca.attisdropped))
       END
FROM (SELECT r.rel, r.typ, ty.typtype, ty.typrelid,
             row_number() OVER (PARTITION BY r.typ) = 1 AS first
      FROM reach r JOIN pg_type ty ON ty.oid = r.typ
      WHERE ty.typtype IN ('e', 'c')) h
"""


def held_types(conn: psycopg.Connection[Any], tables: Mapping[str, int]) -> dict[str, Any]:
    """:attr:`Published.types` of ``tables`` (name → oid): {"uses": {table: [type oid]},
    "enums": {type oid: {label oid: label}}, "composites": {type oid: {"name": …,
    "attributes": [[attnum, type oid], …]}}}.

    ``ALTER TYPE … RENAME VALUE`` changes what every row holding the label reads as (a
    row stores the label's oid), and ``ALTER TYPE … ADD/DROP ATTRIBUTE`` (or a column
    added to or dropped from a table whose row type a column holds) what every value of
    the composite reads as: neither with a change in the stream or a rewrite
    (:func:`retyped`)."""
    names = {oid: name for name, oid in tables.items()}
    uses: dict[str, list[str]] = {}
    enums: dict[str, dict[str, str]] = {}
    composites: dict[str, dict[str, Any]] = {}
    for rel, typ, kind, shape in conn.execute(_TYPES_SQL).fetchall():
        if shape is not None:  # once a type (a table not published may hold it alone)
            (enums if kind == "e" else composites)[str(typ)] = shape
        if rel in names:
            uses.setdefault(names[rel], []).append(str(typ))
    return {
        "uses": {k: sorted(v) for k, v in sorted(uses.items())},
        "enums": enums,
        "composites": composites,
    }


def retyped(last: CommitRecord, types: Mapping[str, Any]) -> dict[str, str]:
    """The tables whose columns hold an enum a label of which was renamed, or a composite
    type that gained, lost or changed attributes, since ``last`` was planned (name →
    why): the lake holds the values as they read then. A label added changes no row, nor
    does an attribute renamed (a composite's text names none)."""
    before = last.snapshot.get("types") or {}
    changed: dict[str, str] = {}
    had_enums = before.get("enums") or {}
    for typ, now in (types.get("enums") or {}).items():
        had = had_enums.get(typ) or {}
        pairs = sorted((had[o], label) for o, label in now.items() if had.get(o, label) != label)
        if pairs:
            changed[typ] = (
                f"an enum value it holds was renamed ({pairs[0][0]!r} to {pairs[0][1]!r})"
            )
    had_composites = before.get("composites") or {}
    for typ, now in (types.get("composites") or {}).items():
        had = had_composites.get(typ)
        if had is not None and had["attributes"] != now["attributes"]:
            changed[typ] = f"the attributes of the composite type {now['name']} it holds changed"
    out = {}
    for table, held in sorted((types.get("uses") or {}).items()):
        why = next((changed[t] for t in held if t in changed), None)
        if why is not None:
            out[table] = why
    return out


_MEMBERS_SQL = """
SELECT 'r', pr.prrelid::int, pr.oid::int FROM pg_publication_rel pr
JOIN pg_publication p ON p.oid = pr.prpubid WHERE p.pubname = ANY(%(p)s)
UNION ALL
SELECT 'n', pn.pnnspid::int, pn.oid::int FROM pg_publication_namespace pn
JOIN pg_publication p ON p.oid = pn.pnpubid WHERE p.pubname = ANY(%(p)s)
"""


def scope_of(publications: Sequence[tuple[str | None, list[int] | None]]) -> list[Any]:
    """What the publications publish of one table, from each one's (row filter, attnums of
    its column list or None): ``[filters, attnums]`` — the filters' texts (None: a
    publication without one, so every row) and the column list's attnums (None: no list,
    every column).

    A change of it between two batches moves rows or values in or out of what the lake
    mirrors without a change in the stream (:func:`scope_widened`)."""
    if len(publications) == 1 and publications[0][1] is None:
        # The common case, said at once: 1,000 tables are read before every batch.
        rowfilter = publications[0][0]
        return [None if rowfilter is None else [rowfilter], None]
    filters = sorted({f for f, _ in publications if f is not None})
    unfiltered = any(f is None for f, _ in publications)
    # pgoutput refuses a table whose publications give it two column lists: one decides.
    lists = [cols for _, cols in publications]
    attnums = None if any(c is None for c in lists) else sorted({n for c in lists for n in c or ()})
    return [None if unfiltered else filters, attnums]


def drifted(last: CommitRecord, catalog: Published) -> dict[str, str]:
    """The tables whose mirror the source changed since ``last`` was planned without a
    change in the stream (name → why): a generated column made ordinary
    (:func:`ungenerated`), put back into a publication (:func:`rejoined`), holding a type
    whose values read otherwise (:func:`retyped`), or published with another row filter
    or a wider column list (:func:`rescoped`; the last named wins)."""
    return {
        **ungenerated(catalog.ordinary, catalog.scopes),
        **rejoined(last, catalog.memberships),
        **retyped(last, catalog.types),
        **rescoped(last, catalog.scopes),
    }


def ungenerated(
    ordinary: Mapping[str, Mapping[int, str]], scopes: Mapping[str, Sequence[Any]]
) -> dict[str, str]:
    """The tables a generated column of which became an ordinary one (``ALTER COLUMN …
    DROP EXPRESSION``: no rewrite, no change in the stream) that their publications now
    publish (name → why): every row holds a value pgoutput never sent, which the stream's
    Relation messages would add as NULL. A column list that leaves it out needs nothing
    until it publishes it (:func:`rescoped`)."""
    out = {}
    for name, columns in sorted(ordinary.items()):
        listed = scopes.get(name, [None, None])[1]
        sent = sorted(c for n, c in columns.items() if listed is None or n in listed)
        if sent:
            out[name] = f"its generated column {sent[0]} became an ordinary column"
    return out


def rejoined(last: CommitRecord, members: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """The tables published since ``last`` was planned by a publication's row that was not
    there then (name → why): the table, or its schema or partitioned ancestor, was taken
    out of a publication and put back (``ALTER PUBLICATION … DROP TABLE``, then ``ADD
    TABLE``), and its changes in between were published by none. Also a row replaced in
    one transaction (``SET TABLE`` with another row filter or column list, which a copy
    follows anyway); a table newly published by a second publication costs a needless
    copy."""
    before = last.snapshot.get("memberships")
    if before is None:
        return {}  # a record from before they were kept
    out = {}
    for name, rows in sorted(members.items()):
        had = before.get(name)
        if had is not None and set(rows) - set(had):
            out[name] = "put back into its publication"
    return out


def rescoped(last: CommitRecord, scopes: Mapping[str, Sequence[Any]]) -> dict[str, str]:
    """The tables whose publications publish other rows or more columns of them than
    when ``last`` was planned (name → why): :func:`scope_widened` of each one ``last``
    recorded (a record from before scopes were kept tells nothing)."""
    before = last.snapshot.get("scopes") or {}
    out = {}
    for name, scope in sorted(scopes.items()):
        why = scope_widened(before[name], scope) if name in before else None
        if why is not None:
            out[name] = why
    return out


def scope_widened(before: Sequence[Any], now: Sequence[Any]) -> str | None:
    """Why a table whose publications published ``before`` and now ``now``
    (:func:`scope_of`) needs a copy, or None.

    Another row filter lets in rows the lake never had, or leaves rows it had. A column
    list that now publishes a column it left out (or no list any more) lets in values the
    lake never had; one that leaves one out needs nothing (the Relation messages drop
    it), nor does a column added to a table without a list (its values come in the
    stream)."""
    if len(before) != len(now):
        return None  # recorded in another form: nothing to compare with
    if before[0] != now[0]:
        return "its publication's row filter changed"
    if before[1] is None:
        return None
    if now[1] is None:
        return "its publication's column list was removed"
    gained = sorted(set(now[1]) - set(before[1]))
    if gained:
        return f"its publication's column list now publishes attnums {gained}"
    return None


def check_lake_names(conn: psycopg.Connection[Any], tables: Iterable[tuple[str, int]]) -> None:
    """Refuse published relations (lake name, oid) of which two have one lake name: the
    lake names a table ``schema.table``, so ``"a.b".c`` and ``a."b.c"`` would write one
    Delta table. Said before anything is copied or pulled; their quoted names are read
    only then."""
    oids: dict[str, set[int]] = {}
    for name, oid in tables:
        oids.setdefault(name, set()).add(oid)
    clashes = sorted((n, o) for n, o in oids.items() if len(o) > 1)
    if not clashes:
        return
    name, both = clashes[0]
    quoted = [
        r[0]
        for r in conn.execute(
            "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s) ORDER BY 1",
            (sorted(both),),
        )
    ]
    raise SnapshotError(
        f"published tables {' and '.join(quoted)} both have the lake name {name} (schema "
        "and table joined by a dot): rename one, or leave one out of the publication"
    )


class PartitionNode(NamedTuple):
    """A relation in a published root's partition tree (the root itself excluded)."""

    parent: int
    leaf: bool
    relfilenode: int
    # The xid that made it a partition when it existed before that transaction (ATTACH
    # PARTITION); None when that transaction made its row type too (``CREATE TABLE …
    # PARTITION OF``, or created and attached in one transaction).
    attached_by: str | None
    name: tuple[str, str]  # schema, relation
    # pg_class.xmin: the transaction that last set its relfilenode (among other fields),
    # to tell a leaf rewritten by a TRUNCATE of its root in the stream from one truncated
    # alone after it (for_record).
    xmin: str
    # pg_inherits.xmin: the transaction that made it a partition of its parent (created or
    # attached); another one than the last commit read: detached and attached again.
    joined: str
    # pg_inherits.cmin: the command of that transaction that made it a partition. A row
    # that transaction wrote by an earlier command was there before (filled, then
    # attached); one written by a later command came through the root, in the stream.
    # None when a transaction since tried to delete the row (an aborted DETACH): its
    # command number then took the place of the cmin.
    joined_cid: int | None


def partition_trees(
    conn: psycopg.Connection[Any], published: Mapping[str, tuple[int, int]]
) -> dict[str, dict[int, PartitionNode]]:
    """schema.table → {oid: node} of the partitions below each partitioned table among
    ``published`` (one published as itself, ``publish_via_partition_root``). Its rows move
    without a change in the stream when a partition is detached, dropped, truncated alone
    (pgoutput sends no TRUNCATE of a partition published through its root) or rewritten,
    and when a table that has rows is attached: the leaves tell the first
    (:func:`for_record`), the attach xids the last (:func:`attached_with_rows`)."""
    names = {oid: name for name, (oid, _) in published.items()}
    out: dict[str, dict[int, PartitionNode]] = {}
    for root, oid, parent, leaf, node, attached_by, schema, rel, xmin, joined, cid in conn.execute(
        """
        SELECT c.oid::int, x.* FROM pg_class c LEFT JOIN LATERAL (
          SELECT t.relid::int, t.parentrelid::int, t.isleaf, l.relfilenode::bigint,
                 CASE WHEN NOT (ty.xmin = i.xmin) THEN i.xmin::text END,
                 n.nspname::text, l.relname::text, l.xmin::text, i.xmin::text,
                 CASE WHEN i.xmax::text = '0' THEN i.cmin::text::bigint END
          FROM pg_partition_tree(c.oid) t
          JOIN pg_class l ON l.oid = t.relid
          JOIN pg_namespace n ON n.oid = l.relnamespace
          LEFT JOIN pg_type ty ON ty.oid = l.reltype
          LEFT JOIN pg_inherits i ON i.inhrelid = t.relid AND i.inhparent = t.parentrelid
          WHERE t.relid <> c.oid
        ) x ON true
        WHERE c.oid = ANY(%s) AND c.relkind = 'p'
        """,
        (list(names),),
    ):
        nodes = out.setdefault(names[int(root)], {})  # a root without partitions: none
        if oid is None:
            continue
        nodes[int(oid)] = PartitionNode(
            int(parent),
            bool(leaf),
            int(node),
            attached_by,
            (schema, rel),
            str(xmin),
            str(joined),
            None if cid is None else int(cid),
        )
    return out


def leaves_of(trees: Mapping[str, Mapping[int, PartitionNode]]) -> dict[str, dict[str, int]]:
    """The commit record's ``leaves``: root → {leaf oid: relfilenode}; a root without
    leaves too (they were all detached or dropped: its rows are gone)."""
    return {
        root: {str(oid): n.relfilenode for oid, n in nodes.items() if n.leaf}
        for root, nodes in trees.items()
    }


def source_catalog(
    conn: psycopg.Connection[Any], publications: Sequence[str], messages: bool = False
) -> dict[str, Any]:
    """What a bootstrap records of the source for the first sync's checks
    (:func:`for_record`, :func:`attached_with_rows`): each published table's relfilenode
    and each partitioned table's leaves (and the DDL capture, when the syncs pull
    ``messages``). Read before the bootstrap's slot exists: a rewrite, DETACH or ATTACH
    between this and the copy's consistent point costs at most a needless copy, one
    after it is seen."""
    horizon = xid_horizon(conn)
    capture = _capture_around(conn, publications, messages)
    catalog = published_catalog(conn, publications)
    trees = partition_trees(conn, catalog.tables)
    return {
        "xid_horizon": horizon,
        "relfilenodes": {k: v[1] for k, v in catalog.tables.items()},
        "xmins": catalog.xmins,
        "joins": catalog.joins,
        "scopes": catalog.scopes,
        "types": catalog.types,
        "memberships": catalog.memberships,
        "generated": catalog.generated,
        "leaves": leaves_of(trees),
        "leaf_xmins": leaf_xmins_of(trees),
        "partition_joins": joins_of(trees),
        "truncated_oids": [],
        "truncation_xids": {},
        "ddl_capture": capture(),
    }


def capture_held(capture: str | None, last: CommitRecord | None) -> bool:
    """Whether the DDL capture read now (:func:`_capture_around`) is the one the previous
    commit recorded: in place, unchanged, since then, so that every rewrite that changes
    values sent its message and a new relfilenode no message explains kept them."""
    return capture is not None and last is not None and last.snapshot.get("ddl_capture") == capture


def _capture_around(
    conn: psycopg.Connection[Any], publications: Sequence[str], messages: bool
) -> Callable[[], str | None]:
    """The DDL capture (:func:`slotlake.ddl.capture_fingerprint`) read now, before the
    relfilenodes, and by the function returned, after them: the same both times, it was
    in place throughout their reading (which is not one snapshot). None when the run does
    not pull the messages (``messages``) or the two differ."""
    from slotlake.ddl import capture_fingerprint

    if not messages:
        return lambda: None
    before = capture_fingerprint(conn, publications)
    return lambda: before if capture_fingerprint(conn, publications) == before else None


def joins_of(trees: Mapping[str, Mapping[int, PartitionNode]]) -> dict[str, dict[str, str]]:
    """The plan's ``partition_joins``: root → {partition oid: pg_inherits xmin}, every
    level's."""
    return {root: {str(oid): n.joined for oid, n in nodes.items()} for root, nodes in trees.items()}


def leaf_xmins_of(trees: Mapping[str, Mapping[int, PartitionNode]]) -> dict[str, dict[str, str]]:
    """The plan's ``leaf_xmins``: root → {leaf oid: pg_class xmin}."""
    return {
        root: {str(oid): n.xmin for oid, n in nodes.items() if n.leaf}
        for root, nodes in trees.items()
        if any(n.leaf for n in nodes.values())
    }


def attached_with_rows(
    conn: psycopg.Connection[Any],
    trees: Mapping[str, Mapping[int, PartitionNode]],
    last: CommitRecord | None,
) -> dict[str, str]:
    """Roots published as themselves that gained, since the last commit read their leaves,
    a partition attached with rows it had before (``ATTACH PARTITION`` of a filled table,
    or of a tree of them): name → reason. Those rows reach the root without a change in
    the stream, so this run copies it.

    Only a leaf new since, or below a partition made one since (detached and attached
    again: another pg_inherits row), is looked at, and only up to the first partition on
    its path that the last commit knew. A partition attached empty, and filled through the
    root since, costs no copy: its rows are newer than the attach, which reads only the new
    leaf's rows (as few as arrived since the last run, or one when the table brought
    rows). Rows the attaching transaction wrote itself are told by their command: before
    the ATTACH (filled, then attached; also created, filled and attached in one
    transaction) or after it (through the root, in the stream). Not told: rows written in
    a savepoint of that transaction (their xmin is the subtransaction's)."""
    before = (last.snapshot.get("leaves") if last else None) or {}
    joins_before = (last.snapshot.get("partition_joins") if last else None) or {}
    out: dict[str, str] = {}
    for root, nodes in sorted(trees.items()):
        had = before.get(root)
        if had is None:
            continue  # not recorded: a root copied or first read by this run
        joined = joins_before.get(root)
        known: set[int] = set()
        if joined is not None:
            known = {oid for oid, n in nodes.items() if joined.get(str(oid)) == n.joined}
        else:  # a record from before the joins were kept: the leaves it had, and above
            for oid in map(int, had):
                while oid in nodes and oid not in known:
                    known.add(oid)
                    oid = nodes[oid].parent
        for oid, node in sorted(nodes.items()):
            if not node.leaf or oid in known:
                continue
            step = oid
            while step in nodes and step not in known:
                at = nodes[step]
                if _rows_before(conn, node.name, at.joined, at.joined_cid, at.attached_by):
                    out[root] = f"partition {'.'.join(node.name)} attached with rows"
                    break
                step = nodes[step].parent
            if root in out:
                break
    return out


def partitions_left(
    trees: Mapping[str, Mapping[int, PartitionNode]], last: CommitRecord | None
) -> dict[str, str]:
    """Roots published as themselves whose partitions left them since the last commit:
    name → reason. A leaf gone (detached or dropped, maybe with the partition above it),
    or one that left and came back (detached and attached again: another ``pg_inherits``
    row on its path than the last commit read): the rows it held left the root without a
    change in the stream, and those it brought back may have changed meanwhile, so this
    run copies it. The leaves looked at are those the last commit read, and those its
    batch's DDL messages showed (``leaves_seen``: a partition created or attached, and
    removed, between two runs)."""
    if last is None:
        return {}
    before = last.snapshot.get("leaves") or {}
    joins_before = last.snapshot.get("partition_joins") or {}
    seen_before = last.snapshot.get("leaves_seen") or {}
    out: dict[str, str] = {}
    for root, nodes in sorted(trees.items()):
        had = before.get(root)
        if had is None:
            continue  # not recorded: a root copied or first read by this run
        seen: dict[str, list[str]] = seen_before.get(root) or {}
        now = {str(oid) for oid, n in nodes.items() if n.leaf}
        gone = sorted((set(had) | set(seen)) - now, key=int)
        if gone:
            out[root] = f"partitions detached or dropped ({', '.join(gone)})"
            continue
        joined = joins_before.get(root) or {}
        back = sorted(
            (
                str(oid)
                for oid, n in nodes.items()
                if joined.get(str(oid), n.joined) != n.joined
                or (n.leaf and (path := seen.get(str(oid))) and path != _path(nodes, oid))
            ),
            key=int,
        )
        if back:
            out[root] = f"partitions detached and attached again ({', '.join(back)})"
    return out


def _path(nodes: Mapping[int, PartitionNode], oid: int) -> list[str]:
    """The ``pg_inherits`` xmins from ``oid`` up to its root (leaf's first)."""
    out = []
    while oid in nodes:
        out.append(nodes[oid].joined)
        oid = nodes[oid].parent
    return out


def _rows_before(
    conn: psycopg.Connection[Any],
    name: tuple[str, str],
    xid: str,
    cid: int | None,
    older: str | None,
) -> bool:
    """Whether ``name`` holds a row written before command ``cid`` of transaction ``xid``
    (the one that made it, or a partition above it, a partition): by that transaction's
    earlier commands, or, when the table existed before it (``older``), by an earlier
    transaction. A row it cannot read counts: a copy is the safe side, and so does any
    row of that transaction when the command is not known (``cid`` None), or a row of it
    another transaction tried to change since (its cmin then is that one's command)."""
    from psycopg import sql

    # cid has no ordering operator: its text is the command's number.
    where = "(xmin = {x}::xid AND (cmin::text::bigint < {c} OR xmax::text <> '0'))"
    if cid is None:
        where = "xmin = {x}::xid"
    if older is not None:
        where = "age(xmin) > age({x}::xid) OR " + where
    query = sql.SQL("SELECT EXISTS (SELECT 1 FROM ONLY {t} WHERE " + where + ")").format(
        t=sql.Identifier(*name), x=sql.Literal(xid), c=sql.Literal(cid)
    )
    row = _row_or_warn(
        conn, query, f"partition {'.'.join(name)} to see whether it brought rows when attached"
    )
    return row is _UNREAD or bool(row and row[0])


# A probe of the source that could not be read: its caller copies (the safe side).
_UNREAD: Any = object()


def _row_or_warn(conn: psycopg.Connection[Any], query: Any, what: str) -> Any:
    """The query's first row (None: no row), or :data:`_UNREAD`, logged as a warning
    that names ``what`` could not be read."""
    try:
        return conn.execute(query).fetchone()
    except psycopg.Error as exc:
        log.warning(
            "cannot read %s (%s): taken as yes, a copy is the safe side",
            what,
            " ".join(str(exc).split()),
        )
        return _UNREAD


# The blocks of a table whose relfilenode a TRUNCATE in the stream may explain that are
# read for rows written before it (rewritten_after_writes): 256 kB with 8 kB blocks.
REWRITE_BLOCKS = 32


def renewed_leaves(had: Mapping[str, Any], leaves: Mapping[str, Any]) -> list[str]:
    """The leaves (oid → relfilenode) whose relfilenode is another than the one ``had``
    records. A partition created since (CREATE TABLE … PARTITION OF) starts empty: not
    told, unless it was rewritten since (truncated alone, say, after rows were routed
    into it): a table starts with its oid for relfilenode."""
    return sorted(k for k in leaves if int(had.get(k, k)) != int(leaves[k]))


def rewritten_after_writes(
    conn: psycopg.Connection[Any],
    published: Mapping[str, tuple[int, int]],
    xmins: Mapping[str, str],
    leaves: Mapping[str, Mapping[str, int]],
    leaf_xmins: Mapping[str, Mapping[str, str]],
    last: CommitRecord | None,
) -> list[int]:
    """The oids of the published tables and leaves whose relfilenode changed since the
    last commit read them, and which hold rows that the transaction that set it wrote
    no later than that: a TRUNCATE of that transaction in the stream does not explain
    such a relfilenode, a rewrite after the TRUNCATE did
    (``TRUNCATE t; INSERT …; ALTER … TYPE … USING`` in one transaction: the inserted rows
    were changed unseen; found by the partitioned tables' random workload, seed 518).
    Two small queries a changed table (rare: a TRUNCATE or a rewrite since the last run)."""
    if last is None:
        return []
    before = last.snapshot.get("relfilenodes") or {}
    leaves_before = last.snapshot.get("leaves") or {}
    changed: list[tuple[int, str]] = []
    for name, (oid, node) in published.items():
        old = before.get(name)
        if old is not None and int(old) != node and name in xmins:
            changed.append((oid, xmins[name]))
    for root, now in leaves.items():
        had = leaves_before.get(root)
        if had is not None:
            changed.extend((int(k), leaf_xmins[root][k]) for k in renewed_leaves(had, now))
    return sorted(oid for oid, xid in changed if _written_before_its_node(conn, oid, xid))


def _qualified_name(conn: psycopg.Connection[Any], oid: int) -> tuple[str, str] | None:
    """(schema, name) of relation ``oid`` now, or None when it is gone."""
    row = conn.execute(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        (oid,),
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _written_before_its_node(conn: psycopg.Connection[Any], oid: int, xid: str) -> bool:
    """Whether table ``oid`` holds a row that transaction ``xid`` wrote by the command
    that last wrote the table's ``pg_class`` row (its ``cmin``: a rewrite writes the rows
    again by the command that sets the new relfilenode) or an earlier one. The rows a
    TRUNCATE left room for are all written by later commands. A row with an ``xmax``
    (changed, deleted or locked since) is not looked at: its cid may be another command's
    than its insert's, and a rewrite wrote every row again, so others tell; a truncated
    and refilled table changed since by its writers costs no needless copy.

    Only the first :data:`REWRITE_BLOCKS` blocks are read (a TID range scan): a rewrite
    writes the table again from its first block, so a batch pays the same for a table
    truncated and filled with a billion rows as for one with ten. Its pg_class row
    another transaction's by now, or the table unreadable: counted (a copy is the safe
    side); the table gone: not (its absence is told elsewhere)."""
    from psycopg import sql

    found = _qualified_name(conn, oid)
    if found is None:
        return False
    # cid has no ordering operator: its text is the command's number.
    query = sql.SQL(
        "SELECT p.x = {x}::xid, EXISTS (SELECT 1 FROM ONLY {t} WHERE ctid < {b}::tid "
        "AND xmin = p.x AND xmax::text = '0' AND cmin::text::bigint <= p.c) "
        "FROM (SELECT xmin AS x, cmin::text::bigint AS c FROM pg_class WHERE oid = {o}) p"
    ).format(
        t=sql.Identifier(*found),
        b=sql.Literal(f"({REWRITE_BLOCKS},0)"),
        x=sql.Literal(xid),
        o=sql.Literal(oid),
    )
    what = f"table {'.'.join(found)} to see whether it was rewritten after rows were written"
    row = _row_or_warn(conn, query, what)
    return row is _UNREAD or (row is not None and (not row[0] or bool(row[1])))


def xid_horizon(conn: psycopg.Connection[Any]) -> str:
    """The oldest transaction still running now (a 64-bit xid, as text): every row whose
    xmin is older was written by a transaction that had ended. Read before the
    relfilenodes a run records, it dates them for :func:`leaves_with_old_rows`."""
    row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
    assert row is not None
    return str(row[0])


# How far back a recorded horizon is still compared by age (xid ages wrap at 2^31).
HORIZON_AGE_LIMIT = 1 << 30


def leaves_with_old_rows(
    conn: psycopg.Connection[Any],
    leaves: Mapping[str, Mapping[str, int]],
    last: CommitRecord,
) -> list[int]:
    """The leaves (of partitioned tables published through their root) that the last
    commit read and that have another relfilenode since, which still hold a row written
    before that reading (its xmin older than the horizon read before it,
    :func:`xid_horizon`).

    A partition truncated alone leaves no trace in the stream (pgoutput sends no TRUNCATE
    of a partition published through its root, and no event trigger fires on TRUNCATE),
    and every row it holds after that was written later. VACUUM FULL and CLUSTER keep
    each row's xmin. So a row from before the reading proves that no TRUNCATE emptied the
    leaf since; with the DDL capture in place throughout, the new relfilenode then kept
    the values (:func:`for_record`). pg_repack writes the rows again (new xmins): its
    leaf is copied, as before.

    Only the first :data:`REWRITE_BLOCKS` blocks are read (a TID range scan, stopped at
    the first such row): a rewrite writes the table again from its first block. A leaf
    whose rows there are all newer, or that cannot be read, is left out (a copy is the
    safe side). One query a renewed leaf: rare (a rewrite or TRUNCATE since the last run)."""
    from psycopg import sql

    horizon = last.snapshot.get("xid_horizon")
    had_by_root = last.snapshot.get("leaves") or {}
    if horizon is None:
        return []  # a record from before horizons were kept
    out = []
    for root, now in sorted(leaves.items()):
        had = had_by_root.get(root)
        if had is None:
            continue
        for leaf in renewed_leaves(had, now):
            if leaf not in had:
                continue  # a partition new since: attached_with_rows speaks for it
            found = _qualified_name(conn, int(leaf))
            if found is None:
                continue
            # xid has no ordering operator; age() orders xids within 2^31 of now, so a
            # horizon much older than that proves nothing and the leaf is copied.
            query = sql.SQL(
                "SELECT CASE WHEN pg_snapshot_xmin(pg_current_snapshot())::text::numeric "
                "- {h}::numeric BETWEEN 0 AND {limit} THEN EXISTS (SELECT 1 FROM ONLY {t} "
                "WHERE ctid < {b}::tid AND age(xmin) > age(({h}::numeric % 4294967296)"
                "::text::xid)) ELSE false END"
            ).format(
                t=sql.Identifier(*found),
                b=sql.Literal(f"({REWRITE_BLOCKS},0)"),
                h=sql.Literal(str(horizon)),
                limit=sql.Literal(HORIZON_AGE_LIMIT),
            )
            what = f"partition {'.'.join(found)} for rows from before the last run"
            row = _row_or_warn(conn, query, what)
            if row is not _UNREAD and row is not None and row[0]:
                out.append(int(leaf))
    return out


def _baseline(last: CommitRecord | None) -> dict[str, int | None] | None:
    """The previous commit's published set (name → oid), or None when it is unknown."""
    if last is None:
        return None
    known = last.snapshot.get("published")
    if known is not None:
        return {k: int(v) for k, v in known.items()}
    if last.kind == "bootstrap":
        # A bootstrap copied every table published then; its record predates the field.
        return dict.fromkeys(last.tables)
    return None


# -- hand-made requests (slotlake resnapshot) ------------------------------------------------


def request(lake: Lake, table: str, reason: str = "requested by hand") -> dict[str, str]:
    """Record that the next sync must snapshot ``table`` (a file under _snapshots/requests)."""
    entry = {"id": uuid.uuid4().hex[:12], "table": table, "reason": reason, "at": utcnow_iso()}
    lake.fs.mkdirs(lake.path(REQUESTS))
    lake.fs.replace(lake.path(f"{REQUESTS}/{table_dir_name(table)}.json"), json.dumps(entry))
    return entry


def pending_requests(lake: Lake) -> list[dict[str, str]]:
    out = []
    for name in lake.fs.listdir(lake.path(REQUESTS)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            out.append(json.loads(lake.fs.read_text(lake.path(f"{REQUESTS}/{name}"))))
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable snapshot request %s/%s: %s", REQUESTS, name, exc)
    return sorted(out, key=lambda r: r.get("table", ""))


def drop_requests(lake: Lake, ids: Sequence[str]) -> None:
    """Remove the request files a committed batch honoured (a newer request stays)."""
    done = set(ids)
    for entry in pending_requests(lake):
        if entry.get("id") in done:
            lake.fs.rmtree(lake.path(f"{REQUESTS}/{table_dir_name(entry['table'])}.json"))


# -- progress (slotlake status) --------------------------------------------------------------


def _write_progress(lake: Lake, progress: dict[str, Any]) -> None:
    lake.fs.mkdirs(lake.path(SNAPSHOTS))
    lake.fs.replace(lake.path(PROGRESS), json.dumps(progress, indent=2, sort_keys=True))


def read_progress(lake: Lake) -> dict[str, Any]:
    if not lake.fs.exists(lake.path(PROGRESS)):
        return {}
    try:
        return dict(json.loads(lake.fs.read_text(lake.path(PROGRESS))))
    except (OSError, ValueError):
        return {}


def clear_progress(lake: Lake) -> None:
    lake.fs.rmtree(lake.path(PROGRESS))


def waiting(lake: Lake, published: Published | None) -> dict[str, str]:
    """Tables the next sync will snapshot, and why (for status)."""
    last = lake.last_commit()
    out: dict[str, str] = {}
    if last is not None:
        out.update(last.snapshot.get("wanted", {}))
        base = _baseline(last)
        if published is not None and base is not None:
            for name, (oid, _) in published.tables.items():
                if name not in base or (base[name] is not None and base[name] != oid):
                    out[name] = "new in the publication"
        if published is not None:
            for name, why in drifted(last, published).items():
                out.setdefault(name, why)
    for r in pending_requests(lake):
        out.setdefault(r["table"], r.get("reason", "requested by hand"))
    return out


# -- step 1-2: the copy, before the batch's target -------------------------------------------


@dataclass
class Prepared:
    """What a run learnt and copied before its target: goes into the batch plan as is."""

    published: dict[str, int] = field(default_factory=dict)
    relfilenodes: dict[str, int] = field(default_factory=dict)
    # Each table's pg_class.xmin, read with its relfilenode (published_catalog).
    xmins: dict[str, str] = field(default_factory=dict)
    # Each partition's pg_inherits xmins up its path (published_catalog).
    joins: dict[str, str] = field(default_factory=dict)
    # What the publications publish of each table (published_catalog's scopes).
    scopes: dict[str, list[Any]] = field(default_factory=dict)
    # The enum and composite types their columns hold (held_types).
    types: dict[str, Any] = field(default_factory=dict)
    # The publications' rows that publish each table (Published.memberships).
    memberships: dict[str, list[int]] = field(default_factory=dict)
    # Each table's stored generated columns (Published.generated).
    generated: dict[str, list[int]] = field(default_factory=dict)
    # Each partition published as itself → its ancestors' oids (Published.ancestors).
    ancestors: dict[str, list[int]] = field(default_factory=dict)
    # A partitioned table published as itself → its leaf partitions (oid → relfilenode).
    leaves: dict[str, dict[str, int]] = field(default_factory=dict)
    # ... and their pg_class xmins (root → leaf oid → xid).
    leaf_xmins: dict[str, dict[str, str]] = field(default_factory=dict)
    # ... and every level's pg_inherits xmin (root → partition oid → xid).
    partition_joins: dict[str, dict[str, str]] = field(default_factory=dict)
    # Tables and leaves rewritten after rows were written by the same transaction
    # (rewritten_after_writes): no TRUNCATE explains their relfilenodes.
    rewritten_oids: list[int] = field(default_factory=list)
    # The DDL capture as read when the run pulls its messages (ddl.capture_fingerprint).
    ddl_capture: str | None = None
    # The oldest running transaction before the relfilenodes were read (xid_horizon).
    xid_horizon: str | None = None
    # Renewed leaves that still hold rows from before the last reading, read when the DDL
    # capture is the last commit's (leaves_with_old_rows).
    leaves_with_old_rows: list[int] = field(default_factory=list)
    tables: dict[str, TableSnapshot] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # ids of the requests honoured

    def to_plan(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "relfilenodes": self.relfilenodes,
            "xmins": self.xmins,
            "joins": self.joins,
            "scopes": self.scopes,
            "types": self.types,
            "memberships": self.memberships,
            "generated": self.generated,
            "ancestors": self.ancestors,
            "leaves": self.leaves,
            "leaf_xmins": self.leaf_xmins,
            "partition_joins": self.partition_joins,
            "rewritten_oids": self.rewritten_oids,
            "ddl_capture": self.ddl_capture,
            "xid_horizon": self.xid_horizon,
            "leaves_with_old_rows": self.leaves_with_old_rows,
            "tables": {k: asdict(v) for k, v in self.tables.items()},
            "requests": self.requests,
        }

    @property
    def consistent_point(self) -> Lsn | None:
        cps = [Lsn.parse(t.consistent_point) for t in self.tables.values()]
        return max(cps) if cps else None


def table_snapshots(plan_snapshot: dict[str, Any]) -> dict[str, TableSnapshot]:
    return {k: TableSnapshot(**v) for k, v in plan_snapshot.get("tables", {}).items()}


def _wanted(
    lake: Lake,
    last: CommitRecord | None,
    catalog: Published,
    moved: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Tables to snapshot in this run (name → reason) and the request ids honoured.
    ``moved``: roots that gained a partition with rows (:func:`attached_with_rows`) or
    lost one (:func:`partitions_left`). Of ``catalog``, each partition's ``pg_inherits``
    xmins, another than the last commit's for one published as itself: detached and
    attached again since, rows written meanwhile unseen; and :func:`drifted`."""
    if last is None:
        # A lake's first batch: existing rows come from `slotlake bootstrap`, not here.
        return {}, []
    drop_requests(lake, last.snapshot.get("requests", []))
    published = catalog.tables
    wanted: dict[str, str] = {}
    base = _baseline(last)
    if base is not None:
        for name, (oid, _) in sorted(published.items()):
            if name not in base:
                wanted[name] = "new in the publication"
            elif base[name] is not None and base[name] != oid:
                wanted[name] = f"recreated (oid {base[name]} → {oid})"
    joins_before = last.snapshot.get("joins") or {}
    for name, path in sorted(catalog.joins.items()):
        if joins_before.get(name, path) != path:
            wanted.setdefault(name, "detached and attached again")
    for name, why in drifted(last, catalog).items():
        wanted.setdefault(name, why)
    for name, reason in last.snapshot.get("wanted", {}).items():
        if name in published:
            wanted.setdefault(name, reason)
    for name, reason in (moved or {}).items():
        wanted.setdefault(name, reason)
    ids = []
    for entry in pending_requests(lake):
        name = entry.get("table", "")
        if name not in published:
            log.warning(
                "snapshot request for %s: not published by the slot's publications; dropped",
                name,
            )
            lake.fs.rmtree(lake.path(f"{REQUESTS}/{table_dir_name(name)}.json"))
            continue
        wanted.setdefault(name, entry.get("reason", "requested by hand"))
        ids.append(entry["id"])
    return wanted, ids


def _create_temporary_slot(dsn: str, name: str) -> tuple[psycopg.Connection[Any], Lsn, str]:
    """A temporary logical slot with an exported snapshot: (connection, CP, snapshot name).

    The snapshot lives while the connection stays idle; closing it drops the slot.
    """
    repl = psycopg.connect(
        dsn, autocommit=True, replication="database", application_name=APPLICATION_NAME
    )
    try:
        version = int(repl.info.server_version)
        command = (
            f"CREATE_REPLICATION_SLOT {name} TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
            if version >= 150000
            else f"CREATE_REPLICATION_SLOT {name} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT"
        )
        row = repl.execute(command).fetchone()
    except BaseException:
        repl.close()
        raise
    assert row is not None
    return repl, Lsn.parse(row[1]), str(row[2])


def _earlier_types(last: CommitRecord | None, table: str, oid: int) -> dict[str, str]:
    """The types the lake's tables have had ``table``'s columns as; none when the lake
    wrote them from another relation (``oid`` now: dropped and created again, so its
    columns are new ones, :func:`slotlake.catalog.build_catalogs`)."""
    if last is None or table not in last.tables:
        return {}
    from slotlake.bootstrap import _simple_type
    from slotlake.catalog import another_relation

    before = last.tables[table].oid
    if before is None:
        before = (_baseline(last) or {}).get(table)
    if another_relation(before, oid):
        return {}

    return {c[0]: _simple_type(c[1]) for c in last.tables[table].columns}


def prepare(
    cfg: Config,
    lake: Lake,
    last: CommitRecord | None,
    batch: int,
    attempt: str,
    conn: psycopg.Connection[Any],
    progress: Callable[[str], None] = log.info,
) -> Prepared:
    """Read the published set, and copy every table that needs a snapshot (before the target).

    ``conn``: the sync's open autocommit connection to the source, which the published set
    is read on (a connection of its own cost a batch 3-7 ms).

    No SparkSession: the copy is Arrow and Parquet, its schema from
    :func:`slotlake.ddltypes.parse_struct`; the batch starts Spark only for a table the
    driver does not take.
    """
    prep, wanted = _read(cfg, lake, last, conn)
    if not wanted:
        return prep
    from slotlake.batch import check_published_columns
    from slotlake.ddl import read_catalog

    # The sync refuses such a table once the copies are made (before its plan): refused
    # first, a table added to the publication is not copied run after run for nothing.
    check_published_columns(read_catalog(conn, cfg.source.publications))
    progress(f"batch {batch}: snapshot of {', '.join(f'{n} ({r})' for n, r in wanted.items())}")
    try:
        prep.tables = _copy(cfg, lake, last, batch, attempt, wanted, progress)
    except psycopg.Error as exc:
        raise SnapshotError(
            redact_text(
                f"snapshot of {', '.join(wanted)} failed: {' '.join(str(exc).split())}",
                _secrets(cfg),
            )
        ) from None
    return prep


def due(
    cfg: Config, lake: Lake, last: CommitRecord, conn: psycopg.Connection[Any]
) -> dict[str, str]:
    """The tables the batch after ``last`` would copy, as the source is now (name →
    reason): the checks of :func:`prepare`, without the copies.

    A run reads its published set before its target, and its copies can take minutes:
    a table added to a publication, renamed or created again, a partition attached or
    gone between that read and the target, is in no copy of the batch and has rows from
    before in no change of it. The run asks this once its batch committed, and takes one
    more batch when it names any (``lake.copy_wanted_in_same_run``). A rewrite there is
    not among these checks: the DDL capture trigger's message names it in the batch's
    record, else the next run's relfilenodes do (README, "Known limits")."""
    return _read(cfg, lake, last, conn)[1]


def _secrets(cfg: Config) -> list[str]:
    return [p for p in (dsn_password(cfg.source.dsn),) if p]


def _read(
    cfg: Config, lake: Lake, last: CommitRecord | None, conn: psycopg.Connection[Any]
) -> tuple[Prepared, dict[str, str]]:
    """The published set as the plan records it (with the snapshot requests honoured) and
    the tables it needs copied (name → reason)."""
    try:
        # The run pulls the messages: the capture may be relied on (for_record).
        horizon = xid_horizon(conn)
        capture = _capture_around(conn, cfg.source.publications, cfg.source.pulls_messages)
        catalog = published_catalog(conn, cfg.source.publications, last)
        published, xmins = catalog.tables, catalog.xmins
        trees = partition_trees(conn, published)
        moved = {**partitions_left(trees, last), **attached_with_rows(conn, trees, last)}
        leaves, leaf_xmins = leaves_of(trees), leaf_xmins_of(trees)
        rewritten = rewritten_after_writes(conn, published, xmins, leaves, leaf_xmins, last)
        ddl_capture = capture()
        # Only where for_record may rely on the capture.
        old_rows = (
            leaves_with_old_rows(conn, leaves, last)
            if last is not None and capture_held(ddl_capture, last)
            else []
        )
    except psycopg.Error as exc:
        raise SnapshotError(
            redact_text(
                f"cannot read the published tables: {' '.join(str(exc).split())}", _secrets(cfg)
            )
        ) from None
    prep = Prepared(
        published={k: v[0] for k, v in published.items()},
        relfilenodes={k: v[1] for k, v in published.items()},
        xmins=xmins,
        joins=catalog.joins,
        scopes=catalog.scopes,
        types=catalog.types,
        memberships=catalog.memberships,
        generated=catalog.generated,
        ancestors=catalog.ancestors,
        leaves=leaves,
        leaf_xmins=leaf_xmins,
        partition_joins=joins_of(trees),
        rewritten_oids=rewritten,
        ddl_capture=ddl_capture,
        xid_horizon=horizon,
        leaves_with_old_rows=old_rows,
    )
    wanted, prep.requests = _wanted(lake, last, catalog, moved)
    return prep, wanted


def _copy(
    cfg: Config,
    lake: Lake,
    last: CommitRecord | None,
    batch: int,
    attempt: str,
    wanted: dict[str, str],
    progress: Callable[[str], None],
) -> dict[str, TableSnapshot]:

    from slotlake.bootstrap import (
        DEFAULT_PARALLEL,
        CopyTask,
        _state_ddl,
        hidden_by_row_security,
        keep_history_types,
        missing_privileges,
        open_snapshot_connection,
        read_plan,
        row_security_advice,
    )
    from slotlake.decode import arrow_schema_for
    from slotlake.source import SESSION_SETTINGS

    dsn = cfg.source.dsn
    # Lower-case letters, digits and '_' only, at most 63 bytes: a slot name.
    slot_name = re.sub(r"[^a-z0-9_]", "_", f"{cfg.source.slot}"[:40].lower()) + f"_snap_{attempt}"
    repl, cp, snapshot_name = _create_temporary_slot(dsn, slot_name)
    out: dict[str, TableSnapshot] = {}
    status: dict[str, Any] = {
        name: {"batch": batch, "reason": r, "rows": 0, "state": "waiting"}
        for name, r in wanted.items()
    }
    try:
        progress(f"batch {batch}: temporary slot {slot_name} consistent at {cp}")
        settings = tuple(
            {**SESSION_SETTINGS, **cfg.source.settings, "client_encoding": "UTF8"}.items()
        )
        with open_snapshot_connection(dsn, snapshot_name, APPLICATION_NAME, settings) as conn:
            plans = {
                p.name: p
                for p in read_plan(conn, cfg.source.publications, parallel=DEFAULT_PARALLEL)
                if p.name in wanted
            }
            lacking = missing_privileges(conn, list(plans.values()))
            hidden = hidden_by_row_security(conn, list(plans.values()))
            role = conn.info.user
            conn.rollback()
        if lacking:
            raise SnapshotError(
                f"cannot snapshot {', '.join(lacking)}: the role lacks SELECT (GRANT SELECT ON … "
                "to the sync role)"
            )
        if hidden:
            raise SnapshotError(f"cannot snapshot: {row_security_advice(role, hidden)}")
        for name, reason in wanted.items():
            plan = plans.get(name)
            if plan is None:
                # Unpublished between the two reads: nothing to copy, no state to repair.
                log.warning("snapshot of %s skipped: no longer published", name)
                status.pop(name, None)
                continue
            keep_history_types(plan, _earlier_types(last, name, plan.oid))
            schema = arrow_schema_for(parse_struct(_state_ddl(plan)))
            task = CopyTask(dsn, snapshot_name, APPLICATION_NAME, settings, plan, schema)
            rel = f"{SNAPSHOTS}/{batch_dir_name(batch, attempt)}/{table_dir_name(name)}"
            status[name]["state"] = "copying"
            t0 = time.monotonic()
            rows = _copy_table(lake, task, rel, status, name)
            secs = time.monotonic() - t0
            status[name].update(state="copied", rows=rows)
            _write_progress(lake, status)
            progress(
                f"batch {batch}: snapshot {name}: {rows:,} rows in {secs:.1f}s "
                f"({rows / max(secs, 1e-9):,.0f} rows/s), consistent point {cp}"
            )
            out[name] = _table_snapshot(plan, reason, cp, rel, rows)
        _fault("snapshot_copied")
    finally:
        # Ends the exported snapshot and drops the temporary slot.
        repl.close()
    return out


def _table_snapshot(plan: TablePlan, reason: str, cp: Lsn, rel: str, rows: int) -> TableSnapshot:
    return TableSnapshot(
        table=plan.name,
        oid=plan.oid,
        reason=reason,
        consistent_point=str(cp),
        staging=rel,
        rows=rows,
        columns=[[c.name, c.spark_ddl] for c in plan.columns],
        key_columns=list(plan.key_columns),
        replica_identity=plan.replica_identity,
        attnums={c.name: c.attnum for c in plan.columns if c.attnum is not None},
        unique_on=list(plan.unique_on),
    )


def _copy_table(lake: Lake, task: Any, rel: str, status: dict[str, Any], name: str) -> int:
    """COPY one table into a Parquet file under ``rel``; returns its rows. A big table's
    ranges are copied at once, each over a connection of its own in the snapshot."""
    import pyarrow.parquet as pq

    from slotlake.bootstrap import DEFAULT_PARALLEL, concurrent_ranges

    staging = None if lake.local else tempfile.mkdtemp(prefix="slotlake-snapshot-")
    local = lake.path(rel) if staging is None else os.path.join(staging, "t")
    os.makedirs(local, exist_ok=True)
    rows = 0
    last_report = time.monotonic()
    with pq.ParquetWriter(os.path.join(local, "part-00000.parquet"), task.arrow_schema) as w:
        for rb in concurrent_ranges(task, DEFAULT_PARALLEL):
            w.write_batch(rb)
            rows += rb.num_rows
            if time.monotonic() - last_report > 2:
                status[name]["rows"] = rows
                _write_progress(lake, status)
                last_report = time.monotonic()
    if staging is not None:
        lake.fs.upload_dir(local, lake.path(rel))
        shutil.rmtree(staging, ignore_errors=True)
    return rows


# -- after the batch: what the next run must snapshot ---------------------------------------


def _raw_messages(
    spark: SparkSession | None, lake: Lake, raw_rel: str
) -> list[tuple[str, int | None, Any, int, int]]:
    """(msg_type, commit_lsn, decoded message, xid, seq) of the raw batch's Truncate and
    Message rows, in peek order."""
    from slotlake.pgoutput import decode

    columns = ["msg_type", "data", "stream_xid", "commit_lsn", "xid", "seq"]
    out = []
    for r in _raw_rows(spark, lake, raw_rel, ("T", "M"), columns):
        msg = decode(bytes(r["data"]), in_stream=r["stream_xid"] is not None)
        out.append((r["msg_type"], r["commit_lsn"], msg, int(r["xid"]), int(r["seq"])))
    return out


def _raw_rows(
    spark: SparkSession | None,
    lake: Lake,
    raw_rel: str,
    types: Sequence[str],
    columns: Sequence[str],
    rel_oids: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """``columns`` of the raw batch's rows of message ``types`` (of ``rel_oids`` only,
    when given), in peek order."""
    if lake.on_local_disk:
        import pyarrow.compute as pc

        from slotlake.lake import local_path
        from slotlake.raw import raw_rows_of_types

        raw_dir = str(local_path(lake.path(raw_rel)))
        wanted = list(columns) if "rel_oid" in columns else [*columns, "rel_oid"]
        table = raw_rows_of_types(raw_dir, types, wanted)
        if rel_oids is not None:
            table = table.filter(
                pc.is_in(table.column("rel_oid"), pc.cast(list(rel_oids), "int64"))
            )
        return table.select(list(columns)).to_pylist()
    assert spark is not None
    from pyspark.sql import functions as F

    df = spark.read.parquet(lake.path(raw_rel)).filter(F.col("msg_type").isin(*types))
    if rel_oids is not None:
        df = df.filter(F.col("rel_oid").isin(*rel_oids))
    return [r.asDict() for r in df.orderBy("seq").select(*columns).collect()]


def refilled_roots(
    spark: SparkSession | None,
    lake: Lake,
    raw_rel: str,
    messages: list[tuple[str, int | None, Any, int, int]],
    roots: Mapping[str, int],
) -> dict[str, int | None]:
    """The partitioned tables published through their root (``roots``: name → oid) that a
    transaction of the batch truncated and then wrote through the root (name → its commit
    LSN). Its partitions' relfilenodes were then new in that transaction, and PostgreSQL
    truncates such a table in place: a partition it truncated alone after the writes
    (which pgoutput does not send either) leaves no trace in the catalog, and the rows
    it removed stay in the mirror unless the root is copied. A TRUNCATE and refill of
    such a table in one transaction therefore costs a copy of it.

    ``messages``: the batch's (:func:`_raw_messages`); its DML rows are read only when
    it truncated one of ``roots``."""
    by_oid = {oid: name for name, oid in roots.items()}
    seq_of: dict[tuple[int, int], int] = {}
    for t, _, m, xid, seq in messages:  # in peek order: each xid's first TRUNCATE counts
        if t == "T":
            for oid in m.relation_oids:
                if oid in by_oid:
                    seq_of.setdefault((oid, xid), seq)
    if not seq_of:
        return {}
    out: dict[str, int | None] = {}
    for r in _raw_rows(
        spark,
        lake,
        raw_rel,
        ("I", "U", "D"),
        ["rel_oid", "xid", "seq", "commit_lsn"],
        sorted({oid for oid, _ in seq_of}),
    ):
        first = seq_of.get((int(r["rel_oid"]), int(r["xid"])))
        if first is not None and int(r["seq"]) > first:
            out[by_oid[int(r["rel_oid"])]] = r["commit_lsn"]
    return out


def _truncations(messages: list[tuple[str, int | None, Any, int, int]]) -> dict[int, set[int]]:
    """Relation oid → the xids of the transactions that truncated it in the batch."""
    out: dict[int, set[int]] = {}
    for t, _, m, xid, _ in messages:
        if t == "T":
            for oid in m.relation_oids:
                out.setdefault(oid, set()).add(xid)
    return out


def _ddl_contents(messages: list[tuple[Any, ...]]) -> list[tuple[int | None, dict[str, Any]]]:
    """(commit LSN, JSON content) of the DDL capture trigger's messages among ``messages``."""
    out = []
    for t, commit_lsn, m, *_ in messages:
        if t != "M" or m.prefix != DDL_PREFIX or not m.transactional:
            continue
        try:
            content = json.loads(bytes(m.content).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            log.warning("ignoring a %s message at %s that is not JSON: %s", DDL_PREFIX, m.lsn, exc)
            continue
        if isinstance(content, dict):
            out.append((commit_lsn, content))
    return out


def leaves_in_ddl(
    messages: list[tuple[Any, ...]],
    roots: Mapping[str, int],
    copied_at: Mapping[str, int] | None = None,
) -> dict[str, dict[str, list[str]]]:
    """The leaves the DDL capture trigger's messages showed below each of ``roots`` (name
    → oid): root name → leaf oid → the ``pg_inherits`` xmins on its path up to the root
    (leaf's first), as the batch's last message showing it had them. A partition created
    or attached and then removed between two runs is in no run's reading of the leaves,
    only here (:func:`partitions_left`). ``copied_at``: roots the batch copied → the
    copy's consistent point (signed): a message committed before it is in the copy, and
    shows nothing the copy lacks."""
    out: dict[int, dict[str, list[str]]] = {}
    before_copy = {roots[name]: cp for name, cp in (copied_at or {}).items() if name in roots}
    for commit_lsn, content in _ddl_contents(messages):
        for entry in content.get("partitions") or []:
            try:
                leaf = str(int(entry["leaf"]))
                ancestors = [int(a) for a in entry.get("ancestors") or []]
                joined = [str(x) for x in entry.get("joined") or []]
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring a malformed partitions entry in a %s message", DDL_PREFIX)
                continue
            for i, ancestor in enumerate(ancestors):
                cp = before_copy.get(ancestor)
                if cp is not None and commit_lsn is not None and commit_lsn < cp:
                    continue
                out.setdefault(ancestor, {})[leaf] = joined[: i + 1]
    return {
        name: dict(sorted(out[oid].items())) for name, oid in sorted(roots.items()) if oid in out
    }


def rewritten_by_ddl(messages: list[tuple[Any, ...]]) -> dict[str, int | None]:
    """Tables the DDL capture trigger reported rewritten: name → commit LSN (signed)."""
    out: dict[str, int | None] = {}
    for commit_lsn, content in _ddl_contents(messages):
        for entry in content.get("tables") or []:
            if entry.get("rewrite") and entry.get("name"):
                prev = out.get(entry["name"])
                out[entry["name"]] = (
                    commit_lsn if prev is None or commit_lsn is None else max(prev, commit_lsn)
                )
    return out


def for_record(
    spark: SparkSession | None,
    lake: Lake,
    plan_snapshot: dict[str, Any],
    last: CommitRecord | None,
    raw_rel: str,
    changed: Mapping[str, RelationChange] | None = None,
    missing_toast: Mapping[str, int] | None = None,
    streamed: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The commit record's ``snapshot`` entry: the plan's, plus the tables the next run must
    snapshot (``wanted``). Derived from the plan, the raw batch, the tables' change logs
    and the previous record alone, so a rerun of the batch records the same.

    ``missing_toast``: per table, the change rows of the batch with an unchanged TOAST
    value nothing in the lake had (:attr:`TableCommit.missing_toast`); in a lake whose
    tables were all copied (:func:`began_with_copies`) those are rows the lake never had,
    and the table is wanted.

    ``changed``: the tables whose relation changed in the batch
    (:func:`slotlake.catalog.relation_changes`): wanted unless this batch copied that
    relation. The next run's own check (a published oid against the one this batch
    recorded) misses what happened inside a batch that recorded the new oids: a lake's
    first batch, or a table renamed away and back.

    ``streamed``: the relations the batch's changes were published under (oid → name).
    A partitioned table's changes published under another relation than the plan's
    reading publishes it as: ``publish_via_partition_root`` switched and switched back
    between two runs (:func:`switched_meanwhile`). (A TRUNCATE in between renews the
    partitions' relfilenodes, and the switch changed the publication's row: the
    relfilenode rule copies them without relying on the DDL capture.)"""
    out = dict(plan_snapshot)
    taken = table_snapshots(plan_snapshot)
    messages = _raw_messages(spark, lake, raw_rel)
    wanted: dict[str, str] = {}
    for name, change in sorted((changed or {}).items()):
        snap = taken.get(name)
        if snap is None or snap.oid != change.oid:
            wanted[name] = change.reason
    for name, (why, oids) in switched_meanwhile(plan_snapshot, streamed or {}).items():
        snap = taken.get(name)
        if snap is None or _committed_since(spark, lake, raw_rel, oids, snap.cp_signed):
            wanted.setdefault(name, why)
    for name, commit_lsn in rewritten_by_ddl(messages).items():
        snap = taken.get(name)
        if snap is not None and commit_lsn is not None and commit_lsn < snap.cp_signed:
            continue  # rewritten before the copy's consistent point: the copy has it
        where = "" if commit_lsn is None else f" at {Lsn.from_signed(commit_lsn)}"
        wanted[name] = f"rewritten (DDL message{where})"
    truncations = _truncations(messages)
    oids = plan_snapshot.get("published", {})
    roots = {name: oids[name] for name in plan_snapshot.get("leaves", {}) if name in oids}
    if any(oid in truncations for oid in roots.values()):
        for name, commit_lsn in refilled_roots(spark, lake, raw_rel, messages, roots).items():
            snap = taken.get(name)
            if name in wanted or (
                snap is not None and commit_lsn is not None and commit_lsn < snap.cp_signed
            ):
                continue
            log.info(
                "partitioned table %s was truncated and written through its root by one "
                "transaction: the next batch copies it (a partition truncated alone after "
                "the writes is not told)",
                name,
            )
            where = "" if commit_lsn is None else f" at {Lsn.from_signed(commit_lsn)}"
            wanted[name] = f"truncated and written by one transaction{where}"
    truncated_now = set(truncations)
    truncated_before = set((last.snapshot.get("truncated_oids") if last else None) or [])
    # The xids of those TRUNCATEs, this batch's and the previous one's (None: a record
    # from before they were kept).
    xids_before = last.snapshot.get("truncation_xids") if last else None
    truncating: dict[int, set[int]] | None = None
    if last is None or xids_before is not None:
        truncating = {k: set(v) for k, v in truncations.items()}
        for k, v in (xids_before or {}).items():
            truncating.setdefault(int(k), set()).update(v)
    before = (last.snapshot.get("relfilenodes") if last else None) or {}
    now = plan_snapshot.get("relfilenodes", {})
    # Rewritten by the TRUNCATE's own transaction after it wrote rows: not explained.
    after_writes = {int(o) for o in plan_snapshot.get("rewritten_oids", [])}
    # The DDL capture in place since the previous reading: a rewrite that changes values
    # sent its message (above), so an unexplained relfilenode kept them.
    capture = plan_snapshot.get("ddl_capture")
    captured = capture_held(capture, last)
    for name, node in sorted(now.items()):
        old = before.get(name)
        if old is None or int(old) == int(node) or name in taken or name in wanted:
            continue
        oid = oids.get(name)
        # The reading before a run's target sees changes from the previous batch and this
        # one: a TRUNCATE in either explains a new relfilenode, when it set the one read
        # (the table's pg_class row is that TRUNCATE's): a rewrite after it did not.
        if (oid in truncated_now or oid in truncated_before) and oid not in after_writes:
            xmin = plan_snapshot.get("xmins", {}).get(name)
            if truncating is None or xmin is None or int(xmin) in truncating.get(oid, set()):
                continue
        if captured:
            log.info(
                "table %s got another relfilenode (%s → %s) that no rewrite message names, "
                "the DDL capture in place throughout: its values were kept (VACUUM FULL, "
                "CLUSTER, pg_repack), no copy",
                name,
                old,
                node,
            )
            continue
        log.warning(
            "table %s was rewritten at the source (relfilenode %s → %s) without a TRUNCATE in "
            "the stream, or after one: its rows may have changed without being decoded; the "
            "next sync re-snapshots it (with the DDL capture trigger in place since the last "
            "run, a VACUUM FULL or CLUSTER would need no copy)",
            name,
            old,
            node,
        )
        wanted[name] = f"relfilenode changed ({old} → {node})"
    leaves_before = (last.snapshot.get("leaves") if last else None) or {}
    for name, leaves in sorted(plan_snapshot.get("leaves", {}).items()):
        had = leaves_before.get(name)
        if had is None or name in taken or name in wanted:
            continue
        # A leaf gone is found, and its root copied, by prepare (partitions_left) for a
        # plan this code made; ``gone`` here serves a plan an earlier release made.
        # (A partition attached since, truncated before, costs a needless copy.)
        gone = sorted(set(had) - set(leaves))
        rewritten = renewed_leaves(had, leaves)
        if not gone and not rewritten:
            continue
        root = oids.get(name)
        if root in truncated_now | truncated_before and not gone:
            # The whole table truncated in the stream rewrote every leaf, and said so;
            # unless a leaf was rewritten again since (truncated alone after it): its
            # pg_class row is then another transaction's than that TRUNCATE.
            xmins = plan_snapshot.get("leaf_xmins", {}).get(name)
            if truncating is None or xmins is None:
                continue  # a plan or record from before xmins were kept
            ours = truncating.get(root, set())
            rewritten = [
                k
                for k in rewritten
                if xmins.get(k) is None or int(xmins[k]) not in ours or int(k) in after_writes
            ]
            if not rewritten:
                continue
        if captured and rewritten:
            old_rows = {str(o) for o in plan_snapshot.get("leaves_with_old_rows") or []}
            if kept := [k for k in rewritten if k in old_rows]:
                log.info(
                    "partitioned table %s: partitions %s got another relfilenode that no "
                    "rewrite message names and still hold rows from before the last run "
                    "(no TRUNCATE since), the DDL capture in place throughout: their values "
                    "were kept (VACUUM FULL, CLUSTER)",
                    name,
                    ", ".join(kept),
                )
                rewritten = [k for k in rewritten if k not in old_rows]
                if not gone and not rewritten:
                    continue
        log.warning(
            "partitioned table %s lost or rewrote partitions at the source (oids %s) without "
            "a change in the stream: the next sync re-snapshots it",
            name,
            ", ".join(gone + rewritten),
        )
        wanted[name] = f"partitions detached or rewritten ({', '.join(gone + rewritten)})"
    out["complete"] = began_with_copies(lake, last)
    if out["complete"]:
        wanted.update(unseen_rows(missing_toast or {}, wanted))
    out["wanted"] = wanted
    out["leaves_seen"] = leaves_in_ddl(
        messages, roots, {name: snap.cp_signed for name, snap in taken.items()}
    )
    out["truncated_oids"] = sorted(truncated_now)
    out["truncation_xids"] = {str(k): sorted(v) for k, v in sorted(truncations.items())}
    return out


def _committed_since(
    spark: SparkSession | None, lake: Lake, raw_rel: str, oids: Sequence[int], cp: int
) -> bool:
    """Whether a change of the batch under one of ``oids`` committed at or after ``cp``
    (a copy's consistent point, signed): the copy taken in the batch lacks it. Read
    only for a table both copied and switched around in one batch (rare)."""
    from slotlake.decode import DML_TYPES

    rows = _raw_rows(spark, lake, raw_rel, DML_TYPES, ["commit_lsn"], list(oids))
    return any(r["commit_lsn"] is None or r["commit_lsn"] >= cp for r in rows)


def switched_meanwhile(
    plan_snapshot: Mapping[str, Any], streamed: Mapping[int, str]
) -> dict[str, tuple[str, list[int]]]:
    """The published tables that the batch's changes of a partitioned table went around
    (name → why, and the oids the changes came under): ``publish_via_partition_root`` switched and switched back between two
    runs, each of which read the same published set. A root published through itself at
    the plan's reading whose leaf's changes came under the leaf's name (the switch off
    meanwhile); or partitions published as themselves whose ancestor's changes came under
    its name (the switch on meanwhile). Those changes went to a table of their own name,
    not to the published one: it is copied (each partition under such an ancestor, as
    the changes do not say which partition a row is in). Found by the publications'
    random workload (seed 6704)."""
    published = {int(oid) for oid in (plan_snapshot.get("published") or {}).values()}
    out: dict[str, tuple[str, list[int]]] = {}
    for root, leaves in sorted((plan_snapshot.get("leaves") or {}).items()):
        went = sorted(int(k) for k in leaves if int(k) in streamed and int(k) not in published)
        if went:
            out[root] = (
                f"changes published under its partition {streamed[went[0]]}'s name "
                "(publish_via_partition_root switched meanwhile)",
                went,
            )
    for name, above in sorted((plan_snapshot.get("ancestors") or {}).items()):
        went = sorted(int(a) for a in above if int(a) in streamed and int(a) not in published)
        if went and name not in out:
            out[name] = (
                f"changes published under its partitioned table {streamed[went[0]]}'s name "
                "(publish_via_partition_root switched meanwhile)",
                went,
            )
    return out


def began_with_copies(lake: Lake, last: CommitRecord | None) -> bool:
    """Whether the lake holds every row of each table it has: it began with ``slotlake
    bootstrap``, which copied them (each later table is copied when it joins). A lake
    begun by a plain sync keeps what it had: the rows from before its slot are not in it.
    Each sync's record says so (``snapshot.complete``); a lake of records from before that
    is judged once by its first record."""
    if last is None:
        return False
    if last.kind == "bootstrap":
        return True
    said = last.snapshot.get("complete")
    if said is not None:
        return bool(said)
    batches = lake.commit_batches()
    return bool(batches) and lake.read_commit(batches[0]).kind == "bootstrap"


def unseen_rows(missing_toast: Mapping[str, int], wanted: Mapping[str, str]) -> dict[str, str]:
    """The tables of a lake that holds every row whose batch still found an unchanged
    TOAST value nowhere (name → reason): an UPDATE of a row the lake never had. That is
    how rows that reached a table without a change in the stream, which no check of the
    published set told, show themselves: the partitioned table's partition every row of
    which was changed through it between its attach and the run's read (README,
    "Snapshots"). A copy gives the mirror those rows whole."""
    found = {}
    for name, rows in sorted(missing_toast.items()):
        if rows and name not in wanted:
            log.warning(
                "table %s: %d changes of the batch left out an unchanged TOAST value the lake "
                "does not have: rows reached the table unseen; it is named for a copy",
                name,
                rows,
            )
            found[name] = f"unchanged TOAST values of rows the lake never had ({rows} changes)"
    return found


# -- housekeeping ----------------------------------------------------------------------------


def remove_orphans(lake: Lake) -> list[str]:
    """Staging copies no plan or commit names (a run killed before its plan), and those of
    committed batches whose raw directory was expired (they only serve the same purpose).

    A copy's directory carries the number of the batch that made it, so only that batch's
    record (or plan) is read: a sync runs this before every batch, and the lake's whole
    history read there would make a batch cost more the longer the lake lived."""
    dirs = batch_dirs(lake.fs, lake.path(SNAPSHOTS))
    committed = set(lake.commit_batches()) if dirs else set()
    removed = []
    for batch, d in dirs:
        rel = f"{SNAPSHOTS}/{d}"
        named = lake.read_commit(batch) if batch in committed else lake.read_plan(batch)
        tables = named.snapshot.get("tables", {}) if named is not None else {}
        referenced = any("/".join(t["staging"].split("/")[:2]) == rel for t in tables.values())
        raw = named.raw if batch in committed and named is not None else None
        expired = raw is not None and not lake.exists(raw)
        if not referenced or expired:
            lake.fs.rmtree(lake.path(rel))
            removed.append(rel)
    return removed


# -- the batch side: re-basing one table on its copy ----------------------------------------


def catalog_for(snap: TableSnapshot, prior: TableCommit | None) -> TableCatalog:
    """The table's catalog from its copy, for a snapshot table without changes in the batch.

    Columns the change log still has but the table no longer has (dropped at the source)
    follow the copy's, as the batch catalog orders a dropped column, so the log's schema
    (and its ``_old`` struct) stays the one it has.
    """
    from slotlake.catalog import TableCatalog

    columns = [(c[0], c[1]) for c in snap.columns]
    have = {c[0] for c in columns}
    if prior is not None:
        columns += [(c[0], c[1]) for c in prior.columns if c[0] not in have]
    return TableCatalog(
        name=snap.table,
        versions=[],
        columns=columns,
        state_columns=[c[0] for c in snap.columns],
        key_columns=list(snap.key_columns),
        replica_identity=snap.replica_identity,
    )


def copy_names(snap: TableSnapshot, target_attnums: Mapping[str, int]) -> dict[str, str]:
    """Each column at the target → the copy's name of it ('' for none), by attnum: a
    column renamed after the copy (even renamed before it too, or after a rename the lake
    has not seen) keeps its values, and one dropped and added again under its name after
    the copy is a new column. Empty when either side's attnums are unknown (a plan or a
    catalog file written before they were recorded, or a copy column without one)."""
    if not target_attnums or set(snap.attnums) != {c[0] for c in snap.columns}:
        return {}  # unknown for some of the copy's columns: by names
    by_attnum = {attnum: name for name, attnum in snap.attnums.items()}
    return {name: by_attnum.get(attnum, "") for name, attnum in target_attnums.items()}


def snapshot_app_id(app_id: str) -> str:
    """The txnAppId of a state's re-basing overwrite (its MERGE carries ``app_id``)."""
    return f"{app_id}-snapshot"


def marker_row(snap: TableSnapshot, batch: int) -> dict[str, Any]:
    """The change-log row ``_op = 'S'`` that says where the state was re-based."""
    return {
        "_op": SNAPSHOT_OP,
        "_commit_lsn": snap.cp_signed,
        "_lsn": snap.cp_signed,
        # Before any change of a transaction committing exactly at CP (those are after it).
        "_tx_ordinal": -1,
        "_xid": None,
        "_commit_ts": None,
        "_origin": None,
        "_batch": batch,
        "_old_kind": None,
        "_missing_toast": [],
        "_fallback": {},
        "_truncate_options": None,
        "_seq": -1,
        "_unchanged": [],
        "_old": None,
    }


def _marker(spark: SparkSession, cat: TableCatalog, snap: TableSnapshot, batch: int) -> DataFrame:
    from slotlake.decode import META_COLUMNS, WORK_COLUMNS, spark_schema_ddl

    return spark.createDataFrame(
        [marker_row(snap, batch)], parse_struct(spark_schema_ddl(cat, META_COLUMNS + WORK_COLUMNS))
    )


@dataclass
class Rebased:
    changes: DataFrame  # every change of the batch + the 'S' marker (TOAST filled)
    state_source: DataFrame  # what the usual state write applies on top of ``base``
    base: DataFrame  # the copy, in the Delta state's columns (overwrite before the MERGE)
    truncated: bool  # a TRUNCATE at or after CP (the state write overwrites again)


def rebase(
    session: SparkSession,
    lake: Lake,
    cat: TableCatalog,
    snap: TableSnapshot,
    events: DataFrame,
    prior: DataFrame,
    truncs: Sequence[tuple[int, int]],
    expected_rows: int,
    persisted: list[DataFrame],
    batch: int,
    defaults: Sequence[FastDefault] = (),
    spread: bool = False,
) -> Rebased:
    """One snapshot table of batch N: the changes before CP are logged (filled from the
    previous state, as ever); the state becomes the copy plus the changes from CP on.
    ``defaults``: the table's fast defaults (:mod:`slotlake.fastdefault`): the copy's rows
    take those of columns added after it, the images from CP on those of columns added
    after them. ``spread``: an INSERT-only multiset's copy, each row one copy (not grouped:
    :attr:`slotlake.lake.TableCommit.spread`)."""
    from pyspark.sql import functions as F

    from slotlake import fastdefault
    from slotlake.bootstrap import multiset_rows
    from slotlake.state import align_prior, fill_keyed, multiset_delta

    cp = snap.cp_signed
    defaults = list(defaults)
    copied = session.read.parquet(lake.path(snap.staging))
    lacking = fastdefault.lacking_in_copy(defaults, cat, set(copied.columns))
    copy = fastdefault.fill_rows(align_prior(copied, cat, lake=False), lacking)
    before = events.filter(F.col("_commit_lsn") < cp)
    after = events.filter(F.col("_commit_lsn") >= cp)
    truncs_before = [t for t in truncs if t[0] < cp]
    truncs_after = [t for t in truncs if t[0] >= cp]
    if cat.is_multiset:
        changes = events.withColumn("_missing_toast", F.col("_unchanged"))
        after = fastdefault.fill_events(after, defaults)
        state_source = multiset_delta(after, cat, truncs_after)
        # A primary key makes each copied row distinct: one copy each, nothing to group.
        base = multiset_rows(copy, cat.state_columns, grouped=not (spread or snap.unique_on))
    else:
        logged_before, _ = fill_keyed(
            before, prior, cat, truncs_before, expected_rows, persisted=persisted
        )
        logged_after, state_source = fill_keyed(
            after, copy, cat, truncs_after, expected_rows, persisted=persisted
        )
        state_source = fastdefault.fill_finals(state_source, after, cat.key_columns, defaults)
        changes = logged_before.unionByName(logged_after)
        base = copy
    marker = _marker(session, cat, snap, batch)
    changes = changes.unionByName(marker.select(*changes.columns))
    return Rebased(changes, state_source, base, bool(truncs_after))


def write_base(
    session: SparkSession, lake: Lake, cat: TableCatalog, base: DataFrame, app_id: str, batch: int
) -> None:
    """Replace the state by the copy: one overwrite commit, skipped when batch N did it."""
    from slotlake.delta import overwrite

    overwrite(base, lake.path(Lake.table_path(STATE, cat.name)), snapshot_app_id(app_id), batch)
    _fault("snapshot_rebased")


def unique_state_rows(
    session: SparkSession, path: str, version: int | None, key: Sequence[str]
) -> tuple[int, bool]:
    """Rows of the state as of ``version`` (a re-based state's count is not a MERGE delta),
    and whether the multiset state holds each value of ``key`` once
    (every row one copy, no key NULL): a copy of a FULL table with a primary key, with the
    batch's changes from its consistent point on applied, as the table's later batches
    are then MERGEd by that key (:mod:`slotlake.unique_multiset`). One scan for both."""
    from pyspark.sql import functions as F

    from slotlake.delta import quote

    reader = session.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    state = reader.load(path)
    if not key or any(k not in state.columns for k in key):
        return int(state.count()), False
    row = state.agg(
        F.count(F.lit(1)).alias("n"),
        F.count_distinct(*[F.col(quote(k)) for k in key]).alias("keys"),
        F.max(COPIES).alias("copies"),
    ).first()
    assert row is not None
    n = int(row["n"])
    return n, n == 0 or (int(row["keys"]) == n and row["copies"] == 1)
