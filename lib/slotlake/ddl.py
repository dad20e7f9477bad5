"""DDL capture: an event trigger that puts every DDL command touching a table into the WAL.

Logical decoding carries no DDL. A fast-default ``ADD COLUMN`` changes every existing row
without a WAL record for any of them, and a rewrite (``ALTER COLUMN … TYPE … USING``, a
volatile default) changes them without decoded changes. ``install`` creates, in schema
``slotlake`` of the source database, a plpgsql function and two event triggers
(``ddl_command_end`` and ``table_rewrite``) that emit, inside the DDL's own transaction::

    pg_logical_emit_message(true, 'slotlake.ddl', <json>)

so the message is decoded at the DDL's position in the change stream, only if the DDL
commits. **Message contract** (other parts of slotlake consume it; keep it stable): UTF-8
JSON object with

* ``event``: ``"ddl_command_end"`` or ``"table_rewrite"``
* ``tag``: the command tag (``"ALTER TABLE"``), ``query``: ``current_query()``
* ``tables``: ``[{"name": "<schema>.<table>", "oid": <int>, "rewrite": <bool>}]`` (the
  name as :func:`slotlake.catalog.table_name` writes it); a ``table_rewrite`` event emits
  its own message with ``"rewrite": true`` before the rewrite, and the command's
  ``ddl_command_end`` message flags the tables it rewrote as well
* ``columns``: ``{"<table>": {"<column>": <attnum>}}``, every live column after the
  command (a DROP and re-ADD of a same-named column shows as a new attnum), of the tables
  in ``tables`` and, for a ``ddl_command_end`` on a partitioned table, of every partition
  below it (the command acted on them too; their names are not in ``tables``)
* ``missing``: ``{"<table>": {"<column>": "<attmissingval text>"}}``, every column with a
  fast default (``atthasmissing``; a partitioned table's from its leaves, where the ADD
  put them), for the same tables as ``columns``, as text in the peek session's formats
  (ISO dates, UTC, ISO 8601 intervals, hex bytea, ``extra_float_digits = 3``)
* ``partitions``: ``[{"leaf": <oid>, "ancestors": [<oid>, …], "joined": ["<xid>", …]}]``,
  every leaf partition of the partition trees of the tables the command touched, after
  it (a table that is no partition and has none: nothing), with its ancestors from its
  parent up and the ``pg_inherits`` xmin of each level below the top (the leaf's first:
  a partition detached and attached again has another)

Creating event triggers needs a superuser on PostgreSQL 15 and 16. The function is
``SECURITY DEFINER`` (owned by that superuser, fixed ``search_path``) so DDL run by any
role can emit. It never fails a DDL command: an error inside it becomes a WARNING (and
the message is then missing, which is what a sync without the trigger sees).
"""

from __future__ import annotations

import json
import logging
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slotlake.catalog import TargetRelation
from slotlake.pgoutput import Relation, RelationColumn, Type

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from slotlake.catalog import TableCatalog
    from slotlake.lake import Lake, TableCommit

log = logging.getLogger(__name__)

DDL_PREFIX = "slotlake.ddl"
# A raw 'M' row as BatchDdl.read hands it to ddl_messages_from_rows.
_Row = namedtuple("_Row", ["seq", "data", "stream_xid"])
SCHEMA = "slotlake"
FUNCTION = "slotlake.capture_ddl"
TRIGGERS = ("slotlake_ddl_end", "slotlake_table_rewrite")
# Transaction-local: the table_rewrite event leaves the oids it saw for ddl_command_end.
_REWRITE_GUC = "slotlake.rewritten"

# The text of attmissingval must be what pgoutput would send for the value: the function
# runs with the peek session's formats whatever the DDL session uses (SET clauses).
FUNCTION_SQL = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' SET IntervalStyle = 'iso_8601'
SET extra_float_digits = 3 SET bytea_output = 'hex'
AS $fn$
DECLARE
  rels oid[];
  named oid[];
  rewritten oid[];
  msg jsonb;
BEGIN
  BEGIN
    IF TG_EVENT = 'table_rewrite' THEN
      rels := ARRAY[pg_event_trigger_table_rewrite_oid()];
      PERFORM set_config('{_REWRITE_GUC}',
        concat_ws(',', nullif(current_setting('{_REWRITE_GUC}', true), ''), rels[1]::text), true);
      rewritten := rels;
    ELSE
      SELECT array_agg(DISTINCT c.oid) INTO rels
      FROM pg_event_trigger_ddl_commands() d
      JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass
      WHERE c.relkind IN ('r', 'p');
      rewritten := string_to_array(nullif(current_setting('{_REWRITE_GUC}', true), ''), ',')::oid[];
      PERFORM set_config('{_REWRITE_GUC}', '', true);
    END IF;
    IF rels IS NULL OR cardinality(rels) = 0 THEN
      RETURN;
    END IF;
    -- A command on a partitioned table acts on every partition below it but names the
    -- table alone; a publication without publish_via_partition_root sends the leaves,
    -- whose columns must be seen to change with it.
    named := rels;
    IF TG_EVENT <> 'table_rewrite' THEN
      SELECT array_agg(x) INTO named FROM (  -- UNION: each once
        SELECT unnest(rels) AS x
        UNION SELECT t.relid FROM unnest(rels) r, LATERAL pg_partition_tree(r) t
      ) s;
    END IF;
    SELECT jsonb_build_object(
      'event', TG_EVENT,
      'tag', TG_TAG,
      'query', current_query(),
      'tables', (SELECT jsonb_agg(jsonb_build_object(
                   'name', n.nspname || '.' || c.relname, 'oid', c.oid::bigint,
                   'rewrite', c.oid = ANY(coalesce(rewritten, '{{}}'::oid[])))
                   ORDER BY c.oid)
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = ANY(rels)),
      'columns', (SELECT coalesce(jsonb_object_agg(t.name, t.cols), '{{}}'::jsonb) FROM (
                   SELECT n.nspname || '.' || c.relname AS name,
                          jsonb_object_agg(a.attname, a.attnum) AS cols
                   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_attribute a ON a.attrelid = c.oid
                   WHERE c.oid = ANY(named) AND a.attnum > 0 AND NOT a.attisdropped
                   GROUP BY 1) t),
      -- A partitioned table stores no rows: its leaves hold the fast defaults.
      'missing', (SELECT coalesce(jsonb_object_agg(t.name, t.vals), '{{}}'::jsonb) FROM (
                   SELECT m.name, jsonb_object_agg(m.attname, m.val) AS vals FROM (
                     SELECT s.name, a.attname, min((a.attmissingval::text::text[])[1]) AS val
                     FROM (SELECT n.nspname || '.' || c.relname AS name,
                                  unnest(CASE WHEN c.relkind = 'p'
                                    THEN ARRAY(SELECT relid FROM pg_partition_tree(c.oid)
                                               WHERE isleaf)
                                    ELSE ARRAY[c.oid] END) AS rel
                           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                           WHERE c.oid = ANY(named)) s,
                          -- Looked up by each relation (OFFSET 0 keeps the planner from
                          -- flattening it): the statistics do not know the columns the
                          -- command just gave a fast default, and a join planned on them
                          -- walked the tables once per such column (a thousand partitions'
                          -- ALTER took 6-8 s instead of 0.3).
                          LATERAL (SELECT a.attname, a.attmissingval FROM pg_attribute a
                                   WHERE a.attrelid = s.rel AND a.attnum > 0
                                     AND NOT a.attisdropped AND a.atthasmissing
                                   OFFSET 0) a
                     GROUP BY 1, 2
                     HAVING count(DISTINCT (a.attmissingval::text::text[])[1]) = 1) m
                   GROUP BY 1) t),
      -- Every leaf of the partition trees the command touched, with its ancestors: a
      -- partition created (or attached) and removed between two syncs was seen here.
      'partitions', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'leaf', l.relid::bigint, 'ancestors', p.ancestors, 'joined', p.joined)
                     ORDER BY l.relid), '[]'::jsonb)
                     FROM (SELECT DISTINCT t.relid
                           FROM (SELECT DISTINCT pg_partition_root(r) AS top
                                 FROM unnest(rels) r) roots,
                                LATERAL pg_partition_tree(roots.top) t
                           WHERE roots.top IS NOT NULL AND t.isleaf) l,
                          -- One walk up each leaf's path: the levels above it, and the
                          -- pg_inherits row of each level below the top.
                          LATERAL (SELECT jsonb_agg(a.relid::bigint ORDER BY a.n)
                                            FILTER (WHERE a.relid <> l.relid) AS ancestors,
                                          jsonb_agg(i.xmin::text ORDER BY a.n)
                                            FILTER (WHERE i.xmin IS NOT NULL) AS joined
                                   FROM pg_partition_ancestors(l.relid)
                                        WITH ORDINALITY a(relid, n)
                                   -- By its index (a join scanned pg_inherits once a leaf).
                                   LEFT JOIN LATERAL (SELECT h.xmin FROM pg_inherits h
                                                      WHERE h.inhrelid = a.relid
                                                      OFFSET 0) i ON true) p)
    ) INTO msg;
    PERFORM pg_logical_emit_message(true, '{DDL_PREFIX}', msg::text);
  EXCEPTION WHEN OTHERS THEN
    -- Never fail the user's DDL: the sync then behaves as without the trigger. A rewrite
    -- is still told in the least message there is: a sync takes a new relfilenode that
    -- no message names for one that kept the values (VACUUM FULL, CLUSTER).
    IF TG_EVENT = 'table_rewrite' THEN
      BEGIN
        PERFORM pg_logical_emit_message(true, '{DDL_PREFIX}', jsonb_build_object(
          'event', TG_EVENT, 'tag', TG_TAG, 'tables', jsonb_build_array(jsonb_build_object(
            'name', n.nspname || '.' || c.relname, 'oid', c.oid::bigint, 'rewrite', true)))::text)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = pg_event_trigger_table_rewrite_oid();
      EXCEPTION WHEN OTHERS THEN
        NULL;
      END;
    END IF;
    RAISE WARNING 'slotlake DDL capture failed (%: %); the DDL is not in the change stream',
      SQLSTATE, SQLERRM;
  END;
END
$fn$;
"""
# What PostgreSQL stores as the function's source (pg_proc.prosrc): a sync relies on the
# triggers' messages only while this very body is installed (capture_fingerprint).
FUNCTION_BODY = FUNCTION_SQL.split("$fn$")[1]


class DdlCaptureError(RuntimeError):
    """The DDL capture trigger cannot be installed or removed; the message says why."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def is_superuser(conn: psycopg.Connection[Any]) -> tuple[str, bool]:
    row = conn.execute(
        "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    return str(row[0]), bool(row[1])


def installed(conn: psycopg.Connection[Any]) -> bool:
    """Whether both event triggers exist and are enabled in this database."""
    (n,) = conn.execute(
        "SELECT count(*) FROM pg_event_trigger WHERE evtname = ANY(%s) AND evtenabled <> 'D'",
        (list(TRIGGERS),),
    ).fetchone() or (0,)
    return int(n) == len(TRIGGERS)


# The triggers, their function and the publications as a sync reads them with its
# published set. A PostgreSQL 17 session can turn event triggers off (event_triggers =
# off) without a trace in the catalog: there, nothing is relied on.
_FINGERPRINT_SQL = """
SELECT (SELECT array_agg(e.evtname::text || ':' || e.xmin::text ORDER BY e.evtname)
          FROM pg_event_trigger e
         WHERE e.evtname = ANY(%(triggers)s) AND e.evtenabled = 'A' AND e.evttags IS NULL
           AND e.evtfoid = p.oid),
       p.xmin::text, p.prosrc = %(body)s,
       (SELECT array_agg(b.pubname::text || ':' || b.xmin::text ORDER BY b.pubname)
          FROM pg_publication b WHERE b.pubname = ANY(%(publications)s)),
       current_setting('server_version_num')::int
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = %(schema)s AND p.proname = %(name)s AND p.pronargs = 0
"""


def capture_fingerprint(conn: psycopg.Connection[Any], publications: Sequence[str]) -> str | None:
    """What the DDL capture is as of now, or None when it cannot be relied on (a trigger
    missing, not enabled ALWAYS or limited to some commands, another function body, a
    PostgreSQL that can switch event triggers off).

    Two readings that give the same text had the triggers in place between them: altering,
    disabling or re-creating a trigger, its function or a publication writes its catalog
    row again, with another xmin. Then every rewrite that can change values (ALTER TABLE's
    ``table_rewrite`` event) sent a message in between, and a new relfilenode that no
    message and no TRUNCATE explains kept the values (VACUUM FULL, CLUSTER, pg_repack): it
    needs no copy. The publications are part of it: one that stopped publishing TRUNCATE
    for a while leaves a TRUNCATE out of the stream."""
    row = conn.execute(
        _FINGERPRINT_SQL,
        {
            "triggers": list(TRIGGERS),
            "body": FUNCTION_BODY,
            "publications": list(publications),
            "schema": SCHEMA,
            "name": FUNCTION.split(".")[1],
        },
    ).fetchone()
    if row is None:
        return None
    triggers, function_xmin, same_body, pubs, version = row
    if len(triggers or []) != len(TRIGGERS) or not same_body or version >= 170000:
        return None
    if len(pubs or []) != len(set(publications)):
        return None
    return ";".join([*triggers, f"function:{function_xmin}", *pubs])


def install(conn: psycopg.Connection[Any]) -> bool:
    """Install (or refresh) the DDL capture in the connection's database.

    Idempotent: the function is replaced, a trigger that exists is kept. Returns True when
    something was created. Raises DdlCaptureError naming the missing privilege.
    """
    role, superuser = is_superuser(conn)
    if not superuser:
        raise DdlCaptureError(
            f"role {role!r} lacks SUPERUSER, which creating event triggers needs on "
            f"PostgreSQL 15/16: run `slotlake capture-ddl` as a superuser (or ALTER ROLE "
            f'"{role}" SUPERUSER)'
        )
    was = installed(conn)
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(FUNCTION_SQL)
        existing = {
            r[0]
            for r in conn.execute(
                "SELECT evtname::text FROM pg_event_trigger WHERE evtname = ANY(%s)",
                (list(TRIGGERS),),
            )
        }
        if TRIGGERS[0] not in existing:
            conn.execute(
                f"CREATE EVENT TRIGGER {TRIGGERS[0]} ON ddl_command_end "
                f"EXECUTE FUNCTION {FUNCTION}()"
            )
        if TRIGGERS[1] not in existing:
            conn.execute(
                f"CREATE EVENT TRIGGER {TRIGGERS[1]} ON table_rewrite EXECUTE FUNCTION {FUNCTION}()"
            )
        for name in TRIGGERS:
            # ALWAYS: a trigger enabled plainly does not fire in a session with
            # session_replication_role = replica (replication and migration tools set
            # it), whose DDL would reach the lake without its messages.
            conn.execute(f"ALTER EVENT TRIGGER {name} ENABLE ALWAYS")
    return not was


def drop(conn: psycopg.Connection[Any]) -> bool:
    """Remove the triggers and the function (and the schema when nothing else is in it)."""
    role, superuser = is_superuser(conn)
    if not superuser:
        raise DdlCaptureError(
            f"role {role!r} lacks SUPERUSER, which dropping event triggers needs: run "
            "`slotlake capture-ddl --drop` as a superuser"
        )
    (existed,) = conn.execute(
        "SELECT count(*) > 0 FROM pg_event_trigger WHERE evtname = ANY(%s)", (list(TRIGGERS),)
    ).fetchone() or (False,)
    with conn.transaction():
        for name in TRIGGERS:
            conn.execute(f"DROP EVENT TRIGGER IF EXISTS {name}")
        conn.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
        (others,) = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            (SCHEMA,),
        ).fetchone() or (0,)
        (procs,) = conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s",
            (SCHEMA,),
        ).fetchone() or (0,)
        if not others and not procs:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA}")
    return bool(existed)


# -- the messages ------------------------------------------------------------------------


@dataclass(frozen=True)
class DdlTable:
    name: str
    oid: int
    rewrite: bool


@dataclass(frozen=True)
class DdlMessage:
    """One ``slotlake.ddl`` message, parsed; ``seq`` is its position in the raw batch."""

    seq: int
    event: str
    tag: str
    query: str
    tables: tuple[DdlTable, ...]
    columns: dict[str, dict[str, int]] = field(default_factory=dict)
    missing: dict[str, dict[str, str | None]] = field(default_factory=dict)


def parse_message(content: bytes | str, seq: int = -1) -> DdlMessage:
    """The content of a ``slotlake.ddl`` message → DdlMessage; ValueError says what is wrong."""
    try:
        text = content.decode("utf-8") if isinstance(content, bytes | bytearray) else content
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"slotlake.ddl message at seq {seq} is not UTF-8 JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"slotlake.ddl message at seq {seq} is not a JSON object")
    try:
        tables = tuple(
            DdlTable(str(t["name"]), int(t["oid"]), bool(t.get("rewrite", False)))
            for t in obj.get("tables") or ()
        )
        columns = {
            str(t): {str(c): int(n) for c, n in (cols or {}).items()}
            for t, cols in (obj.get("columns") or {}).items()
        }
        missing = {
            str(t): {str(c): (None if v is None else str(v)) for c, v in (vals or {}).items()}
            for t, vals in (obj.get("missing") or {}).items()
        }
        return DdlMessage(
            seq=seq,
            event=str(obj.get("event", "ddl_command_end")),
            tag=str(obj["tag"]),
            query=str(obj.get("query", "")),
            tables=tables,
            columns=columns,
            missing=missing,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"slotlake.ddl message at seq {seq} is malformed: {exc!r}") from exc


def ddl_messages_from_rows(
    rows: list[Any], committed_streams: set[int] | None = None
) -> list[DdlMessage]:
    """Raw rows of type 'M' (``seq``, ``data``, ``stream_xid``) → the batch's DDL messages.

    A message inside a stream that did not commit in the batch (``committed_streams``:
    the xids whose Stream Commit is in it) is left out like its transaction's changes.
    """
    from slotlake.pgoutput import decode

    out = []
    for r in rows:
        in_stream = r.stream_xid is not None
        if in_stream and r.stream_xid not in (committed_streams or set()):
            continue
        msg = decode(bytes(r.data), in_stream=in_stream)
        if getattr(msg, "prefix", None) != DDL_PREFIX or not msg.transactional:
            continue
        out.append(parse_message(msg.content, r.seq))
    return sorted(out, key=lambda m: m.seq)


@dataclass
class BatchDdl:
    """What one batch knows about DDL: its ``slotlake.ddl`` messages and the catalog sync
    read at its target (None for a batch pulled before slotlake recorded it)."""

    messages: list[DdlMessage]
    catalog: dict[str, TableColumns] | None
    fault: Callable[[str], None] = lambda step: None

    @classmethod
    def read(
        cls,
        spark: SparkSession | None,
        lake: Lake,
        raw_rel: str,
        committed_streams: set[int],
        fault: Callable[[str], None] = lambda step: None,
        raw_dir: str | None = None,
        *,
        catalog: dict[str, TableColumns] | None,
    ) -> BatchDdl:
        """From the raw Parquet (only 'M' rows mentioning the prefix reach the driver: user
        messages can be many) and the catalog file beside it (``catalog``, as the caller
        read it with :func:`read_catalog_file`): read with pyarrow from
        ``raw_dir`` (the batch's raw on the driver's disk), else through ``spark``; neither
        when the raw batch has no messages at all. ``committed_streams``: the xids whose
        Stream Commit is in the batch (a message streamed without one is left out)."""
        messages: list[DdlMessage] = []
        if raw_dir is not None:
            import pyarrow.compute as pc

            from slotlake.raw import raw_rows_of_types

            table = raw_rows_of_types(raw_dir, ("M",), _Row._fields)
            # The same pre-filter, on the bytes (match_substring takes binary columns).
            table = table.filter(pc.match_substring(table.column("data"), DDL_PREFIX))
            rows = [_Row(**r) for r in table.to_pylist()]
            messages = ddl_messages_from_rows(rows, committed_streams)
        elif spark is not None:
            from pyspark.sql import functions as F

            # A pre-filter on the hex text (binary-safe; payloads are not valid UTF-8);
            # the decoder checks the prefix exactly.
            mentions = F.hex(F.col("data")).contains(DDL_PREFIX.encode().hex().upper())
            rows = (
                spark.read.parquet(lake.path(raw_rel))
                .filter((F.col("msg_type") == "M") & mentions)
                .select("seq", "data", "stream_xid")
                .collect()
            )
            messages = ddl_messages_from_rows(rows, committed_streams)
        return cls(messages, catalog, fault)

    def plan(
        self, cat: TableCatalog, prior: TableCommit | None, commit: TableCommit, copied: bool
    ) -> list[Any]:
        """The table's fast defaults (slotlake.fastdefault); records its attnums in ``commit``.
        ``copied``: the table's state is a copy taken for the batch."""
        from slotlake.fastdefault import final_attnums, plan_defaults

        table_catalog = None if self.catalog is None else self.catalog.get(cat.name)
        commit.attnums = final_attnums(prior, self.messages, table_catalog, cat.name)
        if table_catalog is not None:
            commit.natts = table_catalog.natts
        elif prior is not None and not any(cat.name in m.columns for m in self.messages):
            commit.natts = prior.natts  # no DDL of it seen: unchanged
        return plan_defaults(cat, prior, self.messages, table_catalog, copied)


def write_ddl(messages: DataFrame, lake: Lake, app_id: str, batch: int) -> tuple[str, int]:
    """Append the batch's DDL messages (from its decoded messages) to the ``ddl`` dataset,
    idempotently for the batch: the dataset and version the commit record names."""
    from slotlake.delta import append
    from slotlake.lake import DDL

    rows = ddl_frame(messages).repartition(1).sortWithinPartitions("lsn")
    version = append(rows, lake.path(DDL), app_id, batch).version
    return DDL, version


DDL_SCHEMA = (
    "lsn bigint, commit_lsn bigint, tx_ordinal bigint, xid bigint, event string, tag string, "
    "query string, tables array<struct<name: string, oid: bigint, rewrite: boolean>>, "
    "columns map<string, map<string, int>>, missing map<string, map<string, string>>, "
    "content string, _batch bigint"
)


def ddl_frame(messages: DataFrame) -> DataFrame:
    """The ``ddl`` dataset's rows from the batch's decoded messages (slotlake.batch)."""
    from pyspark.sql import functions as F

    parsed = F.from_json(
        F.col("text"),
        "event string, tag string, query string, "
        "tables array<struct<name: string, oid: bigint, rewrite: boolean>>, "
        "columns map<string, map<string, int>>, missing map<string, map<string, string>>",
    )
    rows = (
        messages.filter((F.col("prefix") == DDL_PREFIX) & F.col("transactional"))
        .withColumn("text", F.col("content").cast("string"))
        .withColumn("p", parsed)
    )
    return rows.select(
        "lsn",
        "commit_lsn",
        "tx_ordinal",
        "xid",
        F.coalesce(F.col("p.event"), F.lit("ddl_command_end")).alias("event"),
        F.col("p.tag").alias("tag"),
        F.col("p.query").alias("query"),
        F.col("p.tables").alias("tables"),
        F.col("p.columns").alias("columns"),
        F.col("p.missing").alias("missing"),
        F.col("text").alias("content"),
        "_batch",
    )


def ddl_rows_arrow(messages: pa.Table) -> pa.Table:
    """:func:`ddl_frame` on the driver: the ``ddl`` rows of the batch's ``messages`` rows
    (an Arrow table), field for field what Spark's ``from_json`` makes of them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from slotlake.ddltypes import parse_struct
    from slotlake.decode import arrow_schema_for

    schema = arrow_schema_for(parse_struct(DDL_SCHEMA))
    ours = messages.filter(
        pc.and_(pc.equal(messages.column("prefix"), DDL_PREFIX), messages.column("transactional"))
    )
    out: dict[str, list[Any]] = {n: [] for n in schema.names}
    for r in ours.to_pylist():
        text = r["content"].decode("utf-8")  # BatchDdl.read parsed each one already
        obj = json.loads(text)
        tables = obj.get("tables")
        columns, missing = obj.get("columns"), obj.get("missing")
        out["lsn"].append(r["lsn"])
        out["commit_lsn"].append(r["commit_lsn"])
        out["tx_ordinal"].append(r["tx_ordinal"])
        out["xid"].append(r["xid"])
        out["event"].append(obj["event"] if obj.get("event") is not None else "ddl_command_end")
        out["tag"].append(obj.get("tag"))
        out["query"].append(obj.get("query"))
        out["tables"].append(
            None
            if tables is None
            else [
                {"name": t.get("name"), "oid": t.get("oid"), "rewrite": t.get("rewrite")}
                for t in tables
            ]
        )
        out["columns"].append(
            None
            if columns is None
            else [(t, None if c is None else list(c.items())) for t, c in columns.items()]
        )
        out["missing"].append(
            None
            if missing is None
            else [(t, None if v is None else list(v.items())) for t, v in missing.items()]
        )
        out["content"].append(text)
        out["_batch"].append(r["_batch"])
    return pa.Table.from_pydict(out, schema=schema).sort_by("lsn")


def write_ddl_local(messages: pa.Table, lake: Lake, app_id: str, batch: int) -> tuple[str, int]:
    """:func:`write_ddl` on the driver for a lake on local disk (``deltalake``, no Spark)."""
    from slotlake.ddltypes import parse_struct
    from slotlake.delta import arrow_append_creating
    from slotlake.lake import DDL, local_path

    path, schema = str(local_path(lake.path(DDL))), parse_struct(DDL_SCHEMA)
    return DDL, arrow_append_creating(path, schema, ddl_rows_arrow(messages), app_id, batch).version


# -- the catalog at the batch's target ---------------------------------------------------

CATALOG_FILE = "_slotlake_catalog.json"

# Every live column of every published table, in one statement: its attnum (a DROP and
# re-ADD shows as a new one), for a fast default the text of attmissingval in the
# session's formats, and whether pgoutput's Relation message sends it (no generated
# column, the publication's column list applied) with what that message would say of it:
# type, typmod, and the replica identity flag as logicalrep_write_attrs sets it (every
# column under FULL; else the primary key's for DEFAULT, the identity index's for INDEX,
# none for NOTHING or a missing index; never an INCLUDE column), and the type's Type
# message for a user-defined type.
# It is read every batch, for every published table whether it changed or not: the
# statement starts from the published tables and reaches their attributes by index.
# Joining pg_attribute whole to every relation first, and reading the Relation side in a
# second statement, took 22-28 ms for 300 tables on PostgreSQL 15 and 16 (5,460
# attribute rows hashed and sorted twice); this way ~10 ms. ``published`` is
# MATERIALIZED: the view's attnames is a subquery per table, computed once.
CATALOG_SQL = """
WITH published AS MATERIALIZED (
    SELECT (quote_ident(schemaname) || '.' || quote_ident(tablename))::regclass::oid AS rel,
           {attnames} AS attnames
    FROM pg_publication_tables WHERE pubname = ANY(%s)
), rels AS MATERIALIZED (SELECT DISTINCT rel AS oid FROM published
), leaves_missing AS MATERIALIZED (
    -- A partitioned table published as itself stores no rows: its leaves hold the fast
    -- defaults (one value a column, as the ADD gave every leaf that had rows then).
    SELECT r.oid AS root, la.attname, min((la.attmissingval::text::text[])[1]) AS val
    FROM rels r
    JOIN pg_class rc ON rc.oid = r.oid AND rc.relkind = 'p'
    CROSS JOIN LATERAL pg_partition_tree(r.oid) pt
    JOIN pg_attribute la ON la.attrelid = pt.relid AND pt.isleaf AND la.attnum > 0
        AND NOT la.attisdropped AND la.atthasmissing
    GROUP BY 1, 2
    HAVING count(DISTINCT (la.attmissingval::text::text[])[1]) = 1
)
SELECT n.nspname::text || '.' || c.relname::text, a.attname::text, a.attnum::int,
       CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] ELSE lm.val END,
       a.atthasmissing OR lm.val IS NOT NULL,
       -- Uncorrelated IN lists: each is hashed once, not scanned for every attribute.
       a.attgenerated = '' AND (
           c.oid IN (SELECT rel FROM published WHERE attnames IS NULL)
           OR (c.oid, a.attname) IN (
               SELECT rel, unnest(attnames) FROM published WHERE attnames IS NOT NULL)),
       c.oid::int8, n.nspname::text, c.relname::text, c.relreplident::text,
       a.atttypid::int8, a.atttypmod::int,
       c.relreplident = 'f' OR a.attnum = ANY(ident.indkey),
       CASE WHEN a.atttypid >= 10000 THEN
           CASE WHEN bn.nspname = 'pg_catalog' THEN '' ELSE bn.nspname::text END END,
       CASE WHEN a.atttypid >= 10000 THEN b.typname::text END,
       c.relnatts::int
FROM rels r
JOIN pg_class c ON c.oid = r.oid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
JOIN pg_namespace bn ON bn.oid = b.typnamespace
LEFT JOIN LATERAL (
    -- The key columns only: an INCLUDE column is not part of the identity.
    SELECT ARRAY(
        SELECT k FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS u(k, n)
        WHERE n <= i.indnkeyatts) AS indkey
    FROM pg_index i
    WHERE i.indrelid = c.oid
      AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
    LIMIT 1
) ident ON true
LEFT JOIN leaves_missing lm ON lm.root = c.oid AND lm.attname = a.attname
ORDER BY c.oid, a.attnum
"""


@dataclass
class TableColumns:
    """One table's columns at one point: attnum of each, fast-default text of some, and
    (in a catalog file of this release on) what its Relation message would say."""

    attnums: dict[str, int] = field(default_factory=dict)
    missing: dict[str, str | None] = field(default_factory=dict)
    relation: TargetRelation | None = None
    # pg_class.relnatts: the attnums given so far, dropped columns' too (the next ADD
    # gets natts + 1); None in a catalog file written before it was recorded.
    natts: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attnums": self.attnums, "missing": self.missing}
        if self.relation is not None:
            out["relation"] = self.relation.to_json()
        if self.natts is not None:
            out["natts"] = self.natts
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TableColumns:
        relation = obj.get("relation")
        return cls(
            {str(k): int(v) for k, v in (obj.get("attnums") or {}).items()},
            {
                str(k): (None if v is None else str(v))
                for k, v in (obj.get("missing") or {}).items()
            },
            None if relation is None else TargetRelation.from_json(relation),
            None if obj.get("natts") is None else int(obj["natts"]),
        )


def read_catalog_file(lake: Lake, raw_rel: str) -> dict[str, TableColumns] | None:
    """The catalog sync read at the batch's target, stored beside its raw batch (None for a
    batch pulled before slotlake recorded it)."""
    path = lake.path(f"{raw_rel}/{CATALOG_FILE}")
    return catalog_from_json(lake.fs.read_text(path)) if lake.fs.exists(path) else None


def read_catalog(conn: psycopg.Connection[Any], publications: list[str]) -> dict[str, TableColumns]:
    """Each published table's columns now, and what pgoutput's Relation and Type messages
    would say of it (:data:`CATALOG_SQL`)."""
    # Column lists (pg_publication_tables.attnames) came with PostgreSQL 15.
    attnames = "attnames" if conn.info.server_version >= 150000 else "NULL::name[]"
    out: dict[str, TableColumns] = {}
    sent: dict[str, list[Any]] = {}
    for full in conn.execute(CATALOG_SQL.format(attnames=attnames), (publications,)):
        row, natts = full[:-1], full[-1]
        table, column, attnum, missing, has_missing, is_sent = row[:6]
        tc = out.get(table)
        if tc is None:
            tc = out[table] = TableColumns(natts=natts)
        tc.attnums[column] = attnum
        if has_missing:
            tc.missing[column] = missing
        if is_sent:
            sent.setdefault(table, []).append(row)
    for table, rows in sent.items():
        _, _, _, _, _, _, oid, namespace, name, identity = rows[0][:10]
        columns = tuple(
            RelationColumn(1 if is_key else 0, col, type_oid, typmod)
            for _, col, *_, type_oid, typmod, is_key, _, _ in rows
        )
        types = {
            type_oid: Type(None, type_oid, type_ns, type_name)
            for *_, type_oid, _, _, type_ns, type_name in rows
            if type_name is not None
        }
        relation = Relation(None, oid, namespace, name, identity, columns)
        out[table].relation = TargetRelation(relation, tuple(types[o] for o in sorted(types)))
    return out


def catalog_to_json(target: str, tables: dict[str, TableColumns]) -> str:
    # Compact: an indented dump takes json's pure-Python encoder, and this file lists every
    # published table each batch (100 tables: 3.8 ms indented, 0.8 ms compact).
    return json.dumps(
        {"target_lsn": target, "tables": {k: v.to_json() for k, v in sorted(tables.items())}},
        separators=(",", ":"),
        sort_keys=True,
    )


def catalog_from_json(text: str) -> dict[str, TableColumns]:
    obj = json.loads(text)
    return {str(k): TableColumns.from_json(v) for k, v in (obj.get("tables") or {}).items()}


__all__ = [
    "CATALOG_FILE",
    "DDL_PREFIX",
    "BatchDdl",
    "DdlCaptureError",
    "DdlMessage",
    "TableColumns",
    "catalog_from_json",
    "catalog_to_json",
    "ddl_frame",
    "drop",
    "install",
    "installed",
    "parse_message",
    "read_catalog",
    "read_catalog_file",
]
