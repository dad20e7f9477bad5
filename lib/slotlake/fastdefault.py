"""Fast defaults, exactly: the value ``ADD COLUMN … DEFAULT x`` gives rows the WAL never shows.

``ALTER TABLE t ADD COLUMN c … DEFAULT <non-volatile>`` writes nothing per row: existing
rows read ``c`` from ``pg_attribute.attmissingval``. The rule slotlake applies per table
and batch (documented in the README, "Schema changes"):

* Find, for every state column ``c``, the last time it was (re-)added. A column's
  identity is its attnum (never reused: a DROP and re-ADD of the same name gets a new
  one). The points in time known to a batch, in order: the attnums the table had when
  the lake last wrote it (``TableCommit.attnums``), each ``slotlake.ddl`` message of the
  DDL capture trigger (``slotlake.ddl``; at its exact position in the stream), and the
  catalog read by sync in the transaction that chose the batch's target LSN (the file
  ``_slotlake_catalog.json`` beside the raw batch). ``c`` is added at the first point
  where its attnum is new.
* The value: the ``missing`` text of that point (the trigger's message, else the catalog),
  converted by the decoder's own type conversion (:mod:`slotlake.pgtypes`), so it equals
  what a decoded row carries (a value the Spark type cannot hold goes to ``_fallback``).
* Where: at the message's position (``seq``); when only the catalog saw the ADD, at the
  Relation message from which on every version of the table has ``c`` (pgoutput sends
  one before the first change after an ALTER), or before the batch when all have it.
* Every row that existed before that point gets the value: the prior state's rows (one
  Delta UPDATE of the state before the batch's MERGE, idempotent through its own Delta
  txnAppId) and the rows whose final image in the batch was decoded before the point.
  Rows inserted or updated after it keep their decoded values. The change log keeps
  the images as decoded.

Everything here works from raw Parquet, the commit records and the catalog file: a
reprocess recomputes the same values without PostgreSQL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slotlake.catalog import ColumnSpec, RelationVersion, TableCatalog
from slotlake.ddl import DdlMessage, TableColumns
from slotlake.pgtypes import Fallback, resolve_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from slotlake.lake import TableCommit

log = logging.getLogger(__name__)

BEFORE_BATCH = -1
# The fault-injection step right after the UPDATE committed (slotlake.sync.fault_point).
FAULT_STEP = "fastdefault_applied"
_END = 1 << 62


@dataclass(frozen=True)
class FastDefault:
    """Column ``column`` was (re-)added at ``seq`` (BEFORE_BATCH: before this batch's first
    change of the table): rows older than that hold ``value`` (``fallback`` is the text of
    a value kept in ``_fallback`` instead, the column then NULL)."""

    column: str
    seq: int
    text: str | None
    value: Any
    fallback: str | None
    spark_type: str
    source: str  # "trigger" or "catalog"
    update_prior: bool  # the prior state's rows need the value


def _latest(renames: dict[str, str], name: str) -> str:
    # TableCatalog.renames maps every earlier name to the latest: one lookup.
    return renames.get(name, name)


def _version_after(cat: TableCatalog, column: str, seq: int) -> tuple[RelationVersion, ColumnSpec]:
    """The Relation version (and its spec of ``column``) in force right after ``seq``."""
    for v in cat.versions:
        if v.seq > seq:
            for c in v.columns:
                if c.name == column:
                    return v, c
    v = cat.versions[-1]
    return v, next(c for c in v.columns if c.name == column)


def convert_missing(
    cat: TableCatalog, column: str, seq: int, text: str | None
) -> tuple[Any, str | None]:
    """(value, fallback text) of attmissingval text, as the decoder shapes a text datum."""
    if text is None:
        return None, None
    if column in cat.text_columns:
        # A column forced to string by a type change keeps PostgreSQL's text as sent.
        return text, None
    version, spec = _version_after(cat, column, seq)
    names = {oid: (ns, nm) for oid, ns, nm in version.type_names}
    value = resolve_type(spec.type_oid, spec.typmod, names).from_text(text)
    if isinstance(value, Fallback):
        return None, value.text
    return value, None


def plan_defaults(
    cat: TableCatalog,
    prior: TableCommit | None,
    messages: list[DdlMessage],
    catalog: TableColumns | None,
    copied: bool = False,
) -> list[FastDefault]:
    """The fast defaults one table's batch must apply (pure: tested with crafted input).
    ``copied``: the state is a copy taken for the batch, whose rows may predate a column
    the batch's changes all have (:func:`lacking_in_copy` picks those)."""
    if not cat.versions:
        # No change of the table decoded in the batch: it is here only because a snapshot
        # replaces its state with a copy, which holds the columns as its catalog had them.
        # No row to fill, and no Relation to convert a default's text with.
        return []
    prior_cols = set()
    if prior is not None:
        prior_cols = {
            _latest(cat.renames, c[0]) for c in prior.columns if len(c) > 2 and c[2] == "state"
        }
    has_prior_rows = prior is not None and bool(prior.state) and prior.state_version is not None
    baseline = dict(prior.attnums) if prior is not None and prior.attnums else None
    points: list[tuple[int, dict[str, int], dict[str, str | None], str]] = []
    final = _final_oid(cat, catalog)
    for m in messages:
        cols = m.columns.get(cat.name)
        if cols is None:
            continue
        oid = next((t.oid for t in m.tables if t.name == cat.name), None)
        if oid is not None and oid != final:
            # Another relation under the name (dropped and created again in the batch):
            # its columns' defaults are not the final one's, whose rows the run copies.
            continue
        points.append((m.seq, cols, m.missing.get(cat.name, {}), "trigger"))
    if catalog is not None:
        points.append((_END, catalog.attnums, catalog.missing, "catalog"))
    out = []
    for col in cat.state_columns:
        found = _last_add(cat, col, prior_cols, baseline, points)
        if found is None:
            continue
        seq, text, source = found
        if seq == _END:
            seq = _relation_add_point(cat, col)
        if seq == BEFORE_BATCH and not has_prior_rows and not copied:
            continue  # no row is older than the column
        update_prior = has_prior_rows and (text is not None or col in prior_cols)
        if text is None and not update_prior:
            # NULL for older rows: only images decoded under an earlier column of the same
            # name (DROP and re-ADD inside the batch) carry something to overwrite.
            earlier = any(
                v.seq < seq and any(c.name == col for c in v.columns) for v in cat.versions
            )
            if seq == BEFORE_BATCH or not earlier:
                continue
        value, fallback = convert_missing(cat, col, seq, text)
        out.append(
            FastDefault(
                column=col,
                seq=seq,
                text=text,
                value=value,
                fallback=fallback,
                spark_type=dict(cat.columns)[col],
                source=source,
                update_prior=update_prior,
            )
        )
    return out


def _final_oid(cat: TableCatalog, catalog: TableColumns | None) -> int:
    """The oid of the relation the table has at the batch's end (``cat`` has versions)."""
    if catalog is not None and catalog.relation is not None:
        return int(catalog.relation.relation.oid)
    return cat.versions[-1].oid


def _last_add(
    cat: TableCatalog,
    col: str,
    prior_cols: set[str],
    baseline: dict[str, int] | None,
    points: list[tuple[int, dict[str, int], dict[str, str | None], str]],
) -> tuple[int, str | None, str] | None:
    """(seq, missing text, source) of the point at which ``col`` got the attnum it has now."""
    # The column is its attnum as the latest point naming it gives it: from there back,
    # each point's name of that attnum is the one of its time. Names alone would miss a
    # RENAME seen only by the trigger and the catalog (no Relation message between: the
    # table unchanged after it in the batch), which ``cat.renames`` does not know.
    current = None
    for _, cols, _, _ in reversed(points):
        current = cols.get(col)
        if current is None:
            current = {_latest(cat.renames, n): a for n, a in cols.items()}.get(col)
        if current is not None:
            break
    if current is None:
        return None
    prev: set[int] | None = None if baseline is None else set(baseline.values())
    found = None
    for seq, cols, missing, source in points:
        name_then = next((n for n, a in cols.items() if a == current), None)
        if name_then is not None:
            if prev is not None:
                new = current not in prev
            elif source == "trigger":
                # No earlier attnums known (first batch since the lake began recording
                # them): a column the lake never had and no earlier Relation showed.
                new = col not in prior_cols and not any(
                    v.seq < seq and any(c.name == col for c in v.columns) for v in cat.versions
                )
            else:
                new = col not in prior_cols or any(
                    all(c.name != col for c in v.columns) for v in cat.versions
                )
            if new:
                found = (seq, missing.get(name_then), source)
        prev = set(cols.values())
    return found


def _relation_add_point(cat: TableCatalog, col: str) -> int:
    """Seq of the first Relation version from which every version has ``col`` (the one
    the attnums say re-added it, when a column of that name was dropped before)."""
    if col in cat.readded_at:
        return cat.readded_at[col]
    start = BEFORE_BATCH
    for v in cat.versions:
        if all(c.name != col for c in v.columns):
            start = _END
        elif start == _END:
            start = v.seq
    return BEFORE_BATCH if start == _END else start


def final_attnums(
    prior: TableCommit | None, messages: list[DdlMessage], catalog: TableColumns | None, name: str
) -> dict[str, int]:
    """The attnums to record for the table after this batch (the next batch's baseline)."""
    if catalog is not None:
        return dict(catalog.attnums)
    for m in reversed(messages):
        if name in m.columns:
            return dict(m.columns[name])
    return dict(prior.attnums) if prior is not None else {}


# -- Arrow (a table done on the driver: slotlake.local_table) -----------------------------


def _fallback_with_arrow(
    maps: Any, defaults: list[FastDefault], rows: Any = None, prefix: str = ""
) -> pa.Array:
    """:func:`_fallback_with` on the rows of the boolean mask ``rows`` (all when None): the
    defaults' entries removed, their fallback texts appended; a NULL map stays NULL."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(maps, pa.ChunkedArray):
        maps = maps.combine_chunks()
    n = len(maps)
    valid = maps.is_valid().to_numpy(zero_copy_only=False)
    chosen = valid if rows is None else valid & rows
    # The entries of these rows: .keys/.items are the whole child arrays, the offsets the
    # rows' own (a NULL row's entries, if any, go to a row that stays NULL).
    offsets = maps.offsets.to_numpy()
    start, end = int(offsets[0]), int(offsets[-1])
    parent = np.repeat(np.arange(n), np.diff(offsets))
    names = pa.array([prefix + d.column for d in defaults], pa.string())
    keys = maps.keys.slice(start, end - start)
    values = maps.items.slice(start, end - start)
    named = pc.fill_null(pc.is_in(keys, value_set=names), False).to_numpy(zero_copy_only=False)
    keep = ~(chosen[parent] & named)
    extra = [(prefix + d.column, d.fallback) for d in defaults if d.fallback is not None]
    targets = np.flatnonzero(chosen)
    new_parent = np.concatenate([parent[keep], np.repeat(targets, len(extra))])
    new_keys = pa.concat_arrays(
        [keys.filter(pa.array(keep)), pa.array([k for _ in targets for k, _ in extra], keys.type)]
    )
    new_values = pa.concat_arrays(
        [
            values.filter(pa.array(keep)),
            pa.array([v for _ in targets for _, v in extra], values.type),
        ]
    )
    # Each row's kept entries, then its added ones (Spark's map_concat(kept, added)).
    order = pa.array(np.argsort(new_parent, kind="stable"))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(new_parent, minlength=n), out=offsets[1:])
    return pa.MapArray.from_arrays(
        pa.array(offsets),
        new_keys.take(order),
        new_values.take(order),
        type=maps.type,
        mask=pa.array(~valid),
    )


def _before(seq: Any, d: FastDefault) -> Any:
    """The rows whose raw row ``seq`` comes before the column's ADD (a NULL one does not:
    a deleted key's final row), as a NumPy mask."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.less(seq, d.seq), False).to_numpy(zero_copy_only=False)


def _with_value(column: Any, d: FastDefault, rows: Any = None) -> pa.Array:
    """``column`` holding the default's value on the rows of ``rows`` (all when None)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    value = pa.scalar(d.value, type=column.type)
    if rows is None:
        return pa.repeat(value, len(column))
    return pc.if_else(pa.array(rows), value, column)


def apply_arrow(table: pa.Table, defaults: list[FastDefault], seq_column: str | None) -> pa.Table:
    """The defaults on a table's rows: all of them (``seq_column`` None: the prior state, as
    :func:`update_state`), or those whose ``seq_column`` is before the column's ADD (a
    keyed table's final rows, as :func:`fill_finals`)."""
    fallback = table.column("_fallback")
    for d in defaults:
        rows = None if seq_column is None else _before(table.column(seq_column), d)
        at = table.schema.get_field_index(d.column)
        table = table.set_column(
            at, table.schema.field(at), _with_value(table.column(at).combine_chunks(), d, rows)
        )
        fallback = _fallback_with_arrow(fallback, [d], rows)
    at = table.schema.get_field_index("_fallback")
    return table.set_column(at, table.schema.field(at), fallback)


def update_state_local(
    path: str, state: pa.Schema, defaults: list[FastDefault], app_id: str, batch: int
) -> bool:
    """:func:`update_state` for a small state on local disk: read whole, the defaults set
    in Arrow, overwritten in one commit under the same txnAppId (``<app>.fastdefault``,
    the batch as version: a rerun skips it). True when it wrote."""
    from slotlake.delta import UNREAD, arrow_overwrite, txn_version
    from slotlake.lake import query_delta
    from slotlake.local_table import conform_arrow

    todo = [d for d in defaults if d.update_prior]
    app = f"{app_id}.fastdefault"
    done = txn_version(path, app)
    if not todo or (done is not None and done >= batch):
        return False
    rows = conform_arrow(query_delta(path), state)
    log.info(
        "%s: fast default(s) %s applied to the state's existing rows (on the driver)",
        path,
        ", ".join(f"{d.column}={d.text!r} ({d.source})" for d in todo),
    )
    # done: the txn version just read (None may be a log it could not read: read again).
    held = done if done is not None else UNREAD
    arrow_overwrite(path, apply_arrow(rows, todo, None), app, batch, held)
    return True


def fill_finals_arrow(finals: pa.Table, defaults: list[FastDefault]) -> pa.Table:
    """:func:`fill_finals` for the driver's final rows (their ``_seq``: the final image's
    raw row, NULL for a deleted key)."""
    todo = in_batch(defaults)
    return apply_arrow(finals, todo, "_seq") if todo else finals


def fill_events_arrow(events: pa.Table, defaults: list[FastDefault]) -> pa.Table:
    """:func:`fill_events` for a multiset's events on the driver: images decoded before the
    column was added, new and old, carry its default."""
    import pyarrow as pa

    todo = in_batch(defaults)
    if not todo:
        return events
    out = apply_arrow(events, todo, "_seq")
    old = events.column("_old").combine_chunks()
    names = [f.name for f in old.type]
    fields = {n: old.field(n) for n in names}
    fallback = out.column("_fallback")
    for d in todo:
        rows = _before(events.column("_seq"), d)
        if d.column in fields:
            fields[d.column] = _with_value(fields[d.column], d, rows)
        fallback = _fallback_with_arrow(fallback, [d], rows, "_old.")
    rebuilt = pa.StructArray.from_arrays(
        [fields[n] for n in names], fields=list(old.type), mask=old.is_null()
    )
    out = out.set_column(out.schema.get_field_index("_old"), out.schema.field("_old"), rebuilt)
    at = out.schema.get_field_index("_fallback")
    return out.set_column(at, out.schema.field(at), fallback)


# -- Spark -------------------------------------------------------------------------------


def _value(d: FastDefault) -> Column:
    from pyspark.sql import functions as F

    return F.lit(d.value).cast(d.spark_type)


def _fallback_with(fallback: Column, defaults: list[FastDefault], prefix: str = "") -> Column:
    """``_fallback`` without the defaults' columns, plus the texts of values kept as text."""
    from pyspark.sql import functions as F

    names = [prefix + d.column for d in defaults]
    kept = F.map_filter(fallback, lambda k, v: ~k.isin(names))
    extra = [(prefix + d.column, d.fallback) for d in defaults if d.fallback is not None]
    if not extra:
        return kept
    added = F.create_map(*[F.lit(x) for kv in extra for x in kv])
    return F.map_concat(kept, added)


def update_state(
    session: SparkSession,
    path: str,
    defaults: list[FastDefault],
    app_id: str,
    batch: int,
) -> int | None:
    """UPDATE the state's rows to the defaults' values: one Delta commit, before the MERGE.

    It carries its own txnAppId (``<app>.fastdefault``) with the batch as version, so a rerun
    of the batch skips it once it committed — it would otherwise overwrite what the
    batch's MERGE wrote after it. Returns the Delta version written (None: nothing to do).
    """
    from delta.tables import DeltaTable

    from slotlake.delta import TXN_APP_ID, TXN_VERSION, last_commit, quote

    todo = [d for d in defaults if d.update_prior]
    if not todo:
        return None

    table = DeltaTable.forPath(session, path)
    sets = {quote(name): value for name, value in _values(todo).items()}
    log.info(
        "%s: fast default(s) %s applied to the state's existing rows",
        path,
        ", ".join(f"{d.column}={d.text!r} ({d.source})" for d in todo),
    )
    session.conf.set(TXN_APP_ID, f"{app_id}.fastdefault")
    session.conf.set(TXN_VERSION, str(batch))
    try:
        table.update(set=sets)
    finally:
        session.conf.unset(TXN_APP_ID)
        session.conf.unset(TXN_VERSION)
    return last_commit(session, path).version


def lacking_in_copy(
    defaults: list[FastDefault], cat: TableCatalog, copied: set[str]
) -> list[FastDefault]:
    """The defaults a snapshot's copy needs on every row: those of columns it does not
    hold (``copied``: its column names), added after it was taken. The copy's rows were
    there when the column came, so each reads its default at the source until a change
    after the copy replaces it (the batch's MERGE of its final rows does)."""
    return [d for d in defaults if cat.prior_name(d.column, copied, False) not in copied]


def _values(defaults: list[FastDefault]) -> dict[str, Column]:
    """Column name → what every row takes: each default's value, and ``_fallback`` without
    their columns' old texts (plus the texts of values kept as text)."""
    from pyspark.sql import functions as F

    values = {d.column: _value(d) for d in defaults}
    values["_fallback"] = _fallback_with(F.col("_fallback"), defaults)
    return values


def fill_rows(rows: DataFrame, defaults: list[FastDefault]) -> DataFrame:
    """Every row of ``rows`` (state columns) with the defaults' values, as
    :func:`update_state` sets them: a snapshot's copy taken before the columns were added
    (:func:`lacking_in_copy`)."""
    return rows.withColumns(_values(defaults)) if defaults else rows


def in_batch(defaults: list[FastDefault]) -> list[FastDefault]:
    """Defaults whose column was added inside the batch (older rows of the batch need them)."""
    return [d for d in defaults if d.seq != BEFORE_BATCH]


def fill_finals(
    finals: DataFrame, events: DataFrame, keys: list[str], defaults: list[FastDefault]
) -> DataFrame:
    """A keyed table's final rows: those whose final image was decoded before the column
    was added get its default (the MERGE then writes it)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from slotlake.state import with_keys

    todo = in_batch(defaults)
    if not todo:
        return finals
    # The final image of key k is the last event (in commit order) that left the row at k.
    w = Window.partitionBy("_k").orderBy(F.col("_commit_lsn").desc(), F.col("_tx_ordinal").desc())
    last = (
        with_keys(events, keys)
        .filter(F.col("_op").isin("I", "U"))
        .select(F.col("_k_after").alias("_k"), "_seq", "_commit_lsn", "_tx_ordinal")
        .withColumn("_rn", F.row_number().over(w))
        .filter(F.col("_rn") == 1)
        .select("_k", F.col("_seq").alias("_fd_seq"))
    )
    out = finals.join(last, "_k", "left")
    return _apply(out, "_fd_seq", todo).drop("_fd_seq")


def fill_events(events: DataFrame, defaults: list[FastDefault]) -> DataFrame:
    """A multiset table's events for its state: images decoded before the column was added
    (new and old) carry its default, as the prior rows will after the UPDATE."""
    from pyspark.sql import functions as F

    todo = in_batch(defaults)
    if not todo:
        return events
    out = _apply(events, "_seq", todo)
    old = F.col("_old")
    for d in todo:
        if d.column in events.schema["_old"].dataType.fieldNames():  # type: ignore[attr-defined]
            old = old.withField(
                d.column,
                F.when(F.col("_seq") < d.seq, _value(d)).otherwise(old.getField(d.column)),
            )
    out = out.withColumn("_old", F.when(F.col("_old").isNull(), None).otherwise(old))
    # _fallback of the old image ("_old.<column>" entries).
    fb = F.col("_fallback")
    for d in todo:
        before = F.col("_seq") < d.seq
        fb = F.when(before, _fallback_with(fb, [d], "_old.")).otherwise(fb)
    return out.withColumn("_fallback", fb)


def _apply(df: DataFrame, seq_col: str, defaults: list[FastDefault]) -> DataFrame:
    from pyspark.sql import functions as F

    from slotlake.delta import quote

    fb = F.col("_fallback")
    for d in defaults:
        before = F.col(seq_col).isNotNull() & (F.col(seq_col) < d.seq)
        df = df.withColumn(d.column, F.when(before, _value(d)).otherwise(F.col(quote(d.column))))
        fb = F.when(before, _fallback_with(fb, [d])).otherwise(fb)
    return df.withColumn("_fallback", fb)


__all__ = [
    "BEFORE_BATCH",
    "FAULT_STEP",
    "FastDefault",
    "apply_arrow",
    "convert_missing",
    "fill_events",
    "fill_events_arrow",
    "fill_finals",
    "fill_finals_arrow",
    "final_attnums",
    "plan_defaults",
    "update_state",
    "update_state_local",
]
