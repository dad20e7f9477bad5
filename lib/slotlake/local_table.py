"""A small table's batch on the driver, in Arrow: no Spark job at all.

A Spark job costs its scheduling whatever its rows. Measured on the 2-core machine, a
table with a few hundred changes paid about 0.9 s of jobs (decode, the key collect of
the prior-row read, the window replay, two collects) before the driver-side writer
wrote a byte, so a batch touching a hundred small tables paid over a minute of job
chains for seconds of work. A table the driver-side writer takes anyway
(:class:`slotlake.batch.DriverWrites`: few changes, small state, a lake on local disk) is
done here instead, from raw Parquet to Delta commit:

1. its DML rows are cut from the raw batch, which is read once for all such tables
   (:func:`read_raw_dml`);
2. they are decoded by the function the executors run (:func:`slotlake.decode.make_decoder`,
   column-wise with NumPy for text datums), so both paths share one decoder;
3. the prior state's rows of keys whose UPDATEs left TOAST unchanged are read through
   ``deltalake`` at the version the previous commit record names;
4. the TOAST fill and each key's final row are DuckDB window functions over the Arrow
   tables (:mod:`slotlake.replay_duckdb`), the same rules as Spark's ``replay_window``;
   a batch with no TOAST left open needs only each key's last record, found in Arrow
   (:mod:`slotlake.replay_arrow`);
5. the change log is appended and the state MERGEd (:mod:`slotlake.dv_merge`) or, after a
   TRUNCATE, overwritten, each one commit carrying the batch's (txnAppId, txnVersion)
   pair, written by the driver itself (:mod:`slotlake.delta_log`; ``deltalake`` where a
   table's log or protocol asks for more).

A table re-based on a per-table snapshot (:mod:`slotlake.snapshot`) takes the same steps
on its two sides of the copy's consistent point: the changes before it are filled from
the previous state and only logged, those from it on are filled from the copy, and the
copy is written as the state (one overwrite under the snapshot's txnAppId) before the
usual MERGE.

A multiset table (rows matched by their whole value) skips 3 and 4: its small state is
read whole and rebuilt with the batch's images counted in Arrow
(:func:`slotlake.multiset_arrow.multiset_state`), then overwritten in one commit; re-based
on a copy, the copy's rows stand for that state and only the images from its consistent
point on are counted onto them.

A new table is created by the driver, and so are renamed, added and dropped columns (DDL
at the source, :func:`slotlake.delta.ensure_local`); Spark is asked only to rewrite a
column whose type changed. Fast defaults (``ADD COLUMN … DEFAULT``) are applied here too
(:mod:`slotlake.fastdefault`: ``update_state_local`` and ``fill_finals_arrow`` for a keyed
table, ``fill_events_arrow`` and ``apply_arrow`` for a multiset's images and prior rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slotlake.catalog import TableCatalog
from slotlake.decode import DML_TYPES, arrow_schema_for, change_schema, make_decoder
from slotlake.delta import (
    WriteResult,
    arrow_append,
    arrow_merge_keyed,
    arrow_overwrite,
    sql_ident,
    written_already,
)
from slotlake.state import arrow_merge_predicate

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from slotlake.decode import BatchCatalog
    from slotlake.fastdefault import FastDefault

RAW_BATCH_ROWS = 32_768
# The raw columns make_decoder reads.
DECODER_COLUMNS = [
    "seq",
    "lsn",
    "xid",
    "data",
    "rel_oid",
    "commit_lsn",
    "commit_ts",
    "tx_ordinal",
    "stream_xid",
]


def read_raw_dml(
    raw_dir: str,
    oids: Mapping[str, set[int]],
    max_bytes: int | None = None,
    shared: Mapping[str, Mapping[int, Sequence[tuple[int, int]]]] | None = None,
) -> dict[str, pa.Table]:
    """The raw DML rows of each named table (by its relation oids), in one pass over the
    batch's raw Parquet; only the rows of these tables are kept in memory.

    ``shared``: a table's seq ranges of an oid that several tables of the batch named
    (:attr:`slotlake.catalog.TableCatalog.shared`); that oid's rows are split by seq, and
    its rows in no named table's ranges (another table's) are left out.

    ``max_bytes`` bounds the payload bytes kept for all of them: past it the table with
    the most bytes is given up (left out of the result, for Spark to do) until the rest
    fits, so the driver never holds more than about that plus one read batch.

    Each read batch is copied once at most: its wanted rows are taken grouped by table
    (a stable order, so each table's rows keep theirs), and each table's rows are a slice
    of that; a batch whose rows are all one wanted table's is kept as it was read.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from slotlake.raw import payload_bytes, raw_files

    names = list(oids)
    oid_list = sorted({oid for table_oids in oids.values() for oid in table_oids})
    value_set = pa.array(oid_list, pa.int64())
    # Position in oid_list of a shared oid → (after, before, index in names) of its spans.
    by_seq: dict[int, list[tuple[int, int, int]]] = {}
    for i, n in enumerate(names):
        for oid, spans in (shared or {}).get(n, {}).items():
            by_seq.setdefault(oid_list.index(oid), []).extend((a, b, i) for a, b in spans)
    # Position in oid_list → index of its table in names (-1: by seq, above).
    table_at = np.array(
        [
            -1 if pos in by_seq else next(i for i, n in enumerate(names) if oid in oids[n])
            for pos, oid in enumerate(oid_list)
        ],
        np.int64,
    )
    kept: dict[int, list[pa.RecordBatch]] = {i: [] for i in range(len(names))}
    # Payload bytes read so far of each table still kept; a table given up leaves it.
    sizes: dict[int, int] = dict.fromkeys(kept, 0)
    dml_types = pa.array(DML_TYPES)
    for f in raw_files(raw_dir):
        with pq.ParquetFile(f) as pf:
            # In batches, not row groups: a raw row group holds up to a million payloads,
            # most of them a big table's that Spark decodes.
            for batch in pf.iter_batches(
                batch_size=RAW_BATCH_ROWS, columns=[*DECODER_COLUMNS, "msg_type"]
            ):
                at = pc.index_in(batch.column("rel_oid"), value_set=value_set)
                at = pc.if_else(pc.is_in(batch.column("msg_type"), dml_types), at, None)
                found = at.to_numpy(zero_copy_only=False)
                rows = np.flatnonzero(~np.isnan(found)) if at.null_count else None
                positions = found.astype(np.int64) if rows is None else found[rows].astype(np.int64)
                tables = table_at[positions]
                if by_seq and (tables < 0).any():
                    rows, tables = _split_by_seq(batch, rows, positions, tables, by_seq)
                if not len(tables):
                    continue
                batch = batch.drop_columns(["msg_type"])
                if rows is None and (tables == tables[0]).all():
                    pieces = {int(tables[0]): batch}
                else:
                    order = np.argsort(tables, kind="stable")
                    taken = batch.take(pa.array(order if rows is None else rows[order]))
                    counts = np.bincount(tables, minlength=len(names))
                    bounds = np.concatenate([[0], np.cumsum(counts)])
                    pieces = {
                        t: taken.slice(bounds[t], counts[t])
                        for t in np.flatnonzero(counts).tolist()
                    }
                for t, piece in pieces.items():
                    if t not in kept:
                        continue  # given up
                    kept[t].append(piece)
                    if max_bytes is not None:
                        sizes[t] += payload_bytes(piece.column("data"))
                while max_bytes is not None and sum(sizes.values()) > max_bytes:
                    biggest = max(sizes, key=sizes.__getitem__)
                    del sizes[biggest], kept[biggest]
    empty = None
    out: dict[str, pa.Table] = {}
    for t, pieces in kept.items():
        if pieces:
            out[names[t]] = pa.Table.from_batches(pieces)
        else:
            empty = empty if empty is not None else _empty_raw(raw_dir)
            out[names[t]] = empty
    return out


def _split_by_seq(
    batch: pa.RecordBatch,
    rows: np.ndarray | None,
    positions: np.ndarray,
    tables: np.ndarray,
    by_seq: Mapping[int, Sequence[tuple[int, int, int]]],
) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a shared oid given to the table whose seq range holds them; those in
    no named table's range dropped (with the rows and tables of the others kept)."""
    import numpy as np

    rows = np.arange(len(batch)) if rows is None else rows
    seqs = batch.column("seq").to_numpy()[rows]
    tables = tables.copy()
    for pos, spans in by_seq.items():
        mine = positions == pos
        if not mine.any():
            continue
        owner = np.full(len(rows), -1, np.int64)
        for after, before, table in spans:
            owner[mine & (seqs > after) & (seqs < before)] = table
        tables[mine] = owner[mine]
    keep = tables >= 0
    return rows[keep], tables[keep]


class RawRows:
    """A table's raw DML rows, handed over once: whoever decodes them takes them, and
    the batch keeps no reference, so their memory goes as soon as they are decoded."""

    __slots__ = ("_rows",)

    def __init__(self, rows: pa.Table) -> None:
        self._rows: pa.Table | None = rows

    def take(self) -> pa.Table:
        rows, self._rows = self._rows, None
        if rows is None:
            raise RuntimeError("these raw rows were taken already")
        return rows


def _empty_raw(raw_dir: str) -> pa.Table:
    import pyarrow.parquet as pq

    from slotlake.raw import RAW_SCHEMA, raw_files

    files = raw_files(raw_dir)
    schema = pq.read_schema(files[0]) if files else RAW_SCHEMA
    return schema.empty_table().select(DECODER_COLUMNS)


def decode_local(
    raw: pa.Table, cat: TableCatalog, bcat: BatchCatalog, batch: int
) -> tuple[pa.Table, pa.Schema]:
    """The table's decoded change rows (what ``decode_table`` yields on the executors)."""
    import pyarrow as pa

    schema = arrow_schema_for(change_schema(cat))
    run = make_decoder(cat, bcat.streams, bcat.origins, batch, schema)
    batches = list(run(iter(raw.to_batches())))
    return pa.Table.from_batches(batches, schema=schema), schema


def missing_toast_rows(changes: pa.Table, since: int | None = None) -> int:
    """Change rows whose ``_missing_toast`` names a column (``since``: those at or after
    that signed commit LSN only)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if changes.num_rows == 0:
        return 0
    missing = pc.greater(pc.list_value_length(changes.column("_missing_toast")), 0)
    if since is not None:
        missing = pc.and_(missing, pc.greater_equal(changes.column("_commit_lsn"), since))
    return int(pc.sum(missing.cast(pa.int64())).as_py() or 0)


def in_commit_order(table: pa.Table) -> pa.Table:
    """The change rows by commit LSN, then ordinal in the transaction (a stable sort).

    The decoded rows nearly always are in that order already (the peek's order; streamed
    transactions and marker rows are the exceptions), and sorting a million wide rows
    costs a second and a copy of every column: the order is checked first."""
    import numpy as np

    if table.num_rows <= 1:
        return table
    lsn, ordinal = table.column("_commit_lsn"), table.column("_tx_ordinal")
    if lsn.null_count == 0 and ordinal.null_count == 0:
        a, b = lsn.to_numpy(), ordinal.to_numpy()
        if np.all((a[:-1] < a[1:]) | ((a[:-1] == a[1:]) & (b[:-1] <= b[1:]))):
            return table
    return table.sort_by([("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending")])


def conform_arrow(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with exactly ``target``'s columns in its order and types: columns it lacks
    (dropped at the source earlier) are NULL, the ``_old`` struct is padded alike (the
    Arrow twin of :func:`slotlake.batch.conform`)."""
    import pyarrow as pa

    if table.schema.equals(target):
        return table  # the usual batch: nothing dropped, renamed or widened
    n = table.num_rows
    have = set(table.column_names)
    columns = []
    for f in target:
        if f.name not in have:
            columns.append(pa.nulls(n, f.type))
            continue
        col = table.column(f.name)
        if col.type != f.type:
            col = col.combine_chunks()
            if pa.types.is_struct(f.type):
                col = _conform_struct(col, f.type)
            col = col.cast(f.type)
        # A column of the target's type is taken as it is: the usual difference is a
        # field's nullability (each table's batch paid a copy of every column for it).
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=target)


def _conform_struct(col: pa.Array, target: pa.StructType) -> pa.Array:
    import pyarrow as pa

    names = {col.type.field(i).name for i in range(col.type.num_fields)}
    children = [
        col.field(t.name).cast(t.type) if t.name in names else pa.nulls(len(col), t.type)
        for t in target
    ]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=col.is_null())


def align_prior_arrow(
    prior: pa.Table, cat: TableCatalog, state: pa.Schema, lake: bool = True
) -> pa.Table:
    """The prior state's rows renamed/cast/trimmed to this batch's state columns (the
    Arrow twin of :func:`slotlake.state.align_prior`; ``lake``: as
    :meth:`TableCatalog.prior_name`)."""
    from slotlake.lake import COPIES, one_copy_each

    have = set(prior.column_names)
    pairs = [(f.name, cat.prior_name(f.name, have, lake)) for f in state]
    pairs = [(name, src) for name, src in pairs if src in have]
    picked = prior.select([src for _, src in pairs]).rename_columns([n for n, _ in pairs])
    if COPIES in state.names:
        # A state stored keyed (the identity became FULL, or the key went): each row once.
        picked = one_copy_each(picked)
    return conform_arrow(picked, state)


# Key types whose values render as SQL literals exactly; other keys read the whole (small)
# state and filter it in Arrow.
def _literal(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return None


def prior_reader(
    state_path: str, version: int | None, cat: TableCatalog, state: pa.Schema
) -> Callable[[list[Any], bool], pa.Table]:
    """``read_prior`` for :func:`slotlake.replay_duckdb.fill_keyed_local`: the prior rows
    whose first key column is one of ``values`` (or NULL), read through deltalake's SQL
    so that Delta's file statistics prune what cannot match."""

    def read(values: list[Any], want_null: bool) -> pa.Table:
        import pyarrow as pa
        import pyarrow.compute as pc

        from slotlake.lake import query_delta

        if version is None:
            return state.empty_table()
        first = cat.key_columns[0]
        old_first = cat.prior_name(first)
        literals = [_literal(v) for v in values]
        sql = "SELECT * FROM t"
        if all(lit is not None for lit in literals):
            conds = [f"{sql_ident(old_first)} IN ({', '.join(literals)})"] if literals else []
            if want_null:
                conds.append(f"{sql_ident(old_first)} IS NULL")
            sql += " WHERE " + (" OR ".join(conds) if conds else "FALSE")
        rows = align_prior_arrow(query_delta(state_path, version, sql), cat, state)
        if any(lit is None for lit in literals):
            keep = pc.is_in(rows.column(first), pa.array(values, rows.schema.field(first).type))
            if want_null:
                keep = pc.or_(pc.fill_null(keep, False), pc.is_null(rows.column(first)))
            rows = rows.filter(pc.fill_null(keep, False))
        return rows

    return read


def read_copy(
    directory: str, cat: TableCatalog, state: pa.Schema, defaults: Sequence[FastDefault] = ()
) -> pa.Table:
    """A per-table snapshot's copy (its staging Parquet) as ``state``'s rows, with the
    fast ``defaults`` of columns added after it was taken
    (:func:`slotlake.fastdefault.lacking_in_copy`)."""
    import pyarrow.parquet as pq

    from slotlake.fastdefault import apply_arrow, lacking_in_copy

    copy = pq.read_table(directory)
    lacking = lacking_in_copy(list(defaults), cat, set(copy.column_names))
    rows = align_prior_arrow(copy, cat, state, lake=False)
    return apply_arrow(rows, lacking, None) if lacking else rows


def rows_reader(rows: pa.Table, cat: TableCatalog) -> Callable[[list[Any], bool], pa.Table]:
    """``read_prior`` over rows held in Arrow (a snapshot's copy): those whose first key
    column is one of ``values`` (or NULL)."""

    def read(values: list[Any], want_null: bool) -> pa.Table:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = rows.column(cat.key_columns[0])
        keep = pc.fill_null(pc.is_in(col, pa.array(values, col.type)), False)
        if want_null:
            keep = pc.or_(keep, pc.is_null(col))
        return rows.filter(keep)

    return read


def write_local(
    cat: TableCatalog,
    changes: pa.Table,
    finals: pa.Table,
    truncated: bool,
    changes_path: str,
    state_path: str,
    app_id: str,
    batch: int,
    held: tuple[int | None, int | None],
    schemas: tuple[StructType, StructType],
    merge_state: Callable[[pa.Table], WriteResult] | None = None,
    concurrent: bool = True,
    whole: bool = False,
    append: bool = False,
) -> tuple[WriteResult, WriteResult]:
    """A table's change log and state at local paths, each one Delta commit.

    ``held``: the txn versions of ``app_id`` the two tables hold and ``schemas`` their
    schemas (both read by the caller). ``merge_state``: who merges the final rows into
    the state (:mod:`slotlake.dv_merge`, or Spark's MERGE), else deltalake's MERGE does;
    with ``concurrent`` the change log is appended meanwhile (a big state's MERGE spends
    its time outside the GIL). An overwrite after TRUNCATE writes only the rows left, so
    it stays here. ``whole``: ``finals`` are the whole new state (a multiset's are),
    written as one overwrite; ``append``: a multiset's rows to add to it (an INSERT-only
    table's, see :func:`slotlake.batch.appends_only`), appended."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.compute as pc

    changes = conform_arrow(changes, arrow_schema_for(schemas[0]))
    data = list(cat.state_columns)
    whole = whole or cat.is_multiset
    if merge_state is not None and not truncated and not whole:
        from slotlake.lake import COPIES

        state_cols = arrow_schema_for(schemas[1])
        # A multiset kept unique on a key (slotlake.unique_multiset) counts its copies.
        kept = [*data, "_fallback", "_missing_toast"]
        kept += [COPIES] if COPIES in finals.column_names and COPIES in state_cols.names else []
        rows = finals.select([*kept, "_key", "_deleted"])
        typed = conform_arrow(rows.select(kept), state_cols)
        for name in ("_key", "_deleted"):
            typed = typed.append_column(name, rows.column(name))
        if not concurrent:
            c = arrow_append(changes_path, changes, app_id, batch, held[0])
            return c, written_already(state_path, app_id, batch, held[1]) or merge_state(typed)
        # A big state's MERGE spends its time reading key columns outside the GIL (DuckDB
        # or Spark): the change log's append runs meanwhile, a commit to another table.
        with ThreadPoolExecutor(1) as pool:
            logged = pool.submit(arrow_append, changes_path, changes, app_id, batch, held[0])
            s = written_already(state_path, app_id, batch, held[1]) or merge_state(typed)
            return logged.result(), s
    c = arrow_append(changes_path, changes, app_id, batch, held[0])
    if whole:  # slotlake.multiset_arrow, slotlake.identity_segments
        rows = conform_arrow(finals, arrow_schema_for(schemas[1]))
        if append:
            return c, arrow_append(state_path, rows, app_id, batch, held[1])
        return c, arrow_overwrite(state_path, rows, app_id, batch, held[1])
    if truncated:
        alive = finals.filter(pc.invert(finals.column("_deleted")))
        rows = conform_arrow(
            alive.select([*data, "_fallback", "_missing_toast"]), arrow_schema_for(schemas[1])
        )
        return c, arrow_overwrite(state_path, rows, app_id, batch, held[1])
    rows = finals.select([*data, "_fallback", "_missing_toast", "_key", "_deleted"])
    s = arrow_merge_keyed(
        state_path, rows, arrow_merge_predicate(cat), ["_key", "_deleted"], app_id, batch, held[1]
    )
    return c, s
