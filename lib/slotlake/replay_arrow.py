"""Each key's final row in Arrow, for a batch that leaves no TOAST column open.

:func:`slotlake.replay_duckdb.fill_keyed_local` replays a table's events with DuckDB
window functions: the TOAST fill needs a window per open column, the pointer jumping a
loop of statements. A batch whose UPDATEs left no column unchanged — most batches of
most tables — needs none of that: its change rows are its events as they are, and the
state needs only each key's last record (replay_sql's records: every event under the key
it had before, plus an *arrival* under the new key for an UPDATE that moved its key).
That is a sort by (commit LSN, ordinal) and one hash aggregation over the key columns,
which Arrow does in C++ without copying a value into a database and back. Measured on
the 1M-change table of bench/sync_bench.py: 4.3 s and +580 MB in DuckDB, ~0.5 s here.

The results are what DuckDB returns (the unit tests compare both on random batches),
``_k`` aside: here it is the key's number in the call (the writers use ``_key``, not
``_k``). Key columns whose values Arrow's hash
grouping might not compare as PostgreSQL's equality does (floating point: -0.0 and 0.0)
or cannot group (nested types) are left to DuckDB: :func:`finals_without_toast` then
returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from slotlake.catalog import TableCatalog

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def _groupable(t: pa.DataType) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time(t)
    )


def no_toast_open(events: pa.Table) -> bool:
    """No event left a column unchanged and unfilled (``_unchanged`` empty or NULL)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(events.column("_unchanged"))
    return (pc.max(lengths).as_py() or 0) == 0


def _same(a: pa.Array, b: pa.Array) -> pa.Array:
    """Equal, or both NULL (the key texts' comparison: NULL fields print alike)."""
    import pyarrow.compute as pc

    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(pc.fill_null(pc.equal(a, b), False), both_null)


def _map_keep(maps: pa.Array, names: Sequence[str], null: np.ndarray) -> pa.Array:
    """Each map with only the entries whose key is in ``names``; NULL where ``null``, an
    empty map for any other NULL (as DuckDB's ``map_filter(coalesce(m, {}), …)``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys, items = maps.keys, maps.items
    keep = pc.is_in(keys, pa.array(list(names), keys.type)).to_numpy(zero_copy_only=False)
    offsets = maps.offsets.to_numpy()
    kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    mask = pa.array(keep)
    return pa.MapArray.from_arrays(
        pa.array(kept[offsets - offsets[0]].astype(np.int32)),
        keys.filter(mask),
        items.filter(mask),
        type=maps.type,
        mask=pa.array(null),
    )


def _coalesced(maps: pa.Array, where: pa.Array) -> pa.Array:
    """``maps`` with a NULL map made empty where ``where``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not maps.null_count:
        return maps
    null = pc.and_(pc.is_null(maps), pc.invert(where))
    # A NULL map's entries are empty: the offsets stand, only the validity changes.
    return pa.MapArray.from_arrays(maps.offsets, maps.keys, maps.items, type=maps.type, mask=null)


def finals_without_toast(
    events: pa.Table, cat: TableCatalog, truncations: Sequence[tuple[int, int]]
) -> tuple[pa.Table, pa.Table] | None:
    """``fill_keyed_local``'s (changes, finals) of a batch with no TOAST open, or None
    when a key column's type is not one this grouping compares exactly."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(cat.key_columns)
    schema = events.schema
    if not keys or not all(_groupable(schema.field(k).type) for k in keys):
        return None
    n = events.num_rows
    # The change rows are the events; Spark's _missing_toast is never NULL.
    missing_at = schema.get_field_index("_missing_toast")
    missing_field = schema.field(missing_at)
    changes = events.set_column(
        missing_at,
        missing_field.with_nullable(False),
        pc.fill_null(events.column("_missing_toast"), pa.scalar([], missing_field.type)),
    )

    op = events.column("_op").combine_chunks()  # the few columns read row by row: one chunk
    is_update, is_delete = pc.equal(op, "U"), pc.equal(op, "D")
    # bo: the key before the event is the old image's (a DELETE, or an UPDATE with one).
    before_old = pc.or_(
        is_delete,
        pc.and_(is_update, pc.is_valid(events.column("_old_kind").combine_chunks())),
    )
    # An UPDATE's _fallback is never NULL in DuckDB's change rows (its map_concat).
    fallback = _coalesced(events.column("_fallback").combine_chunks(), is_update)
    changes = changes.set_column(
        schema.get_field_index("_fallback"), schema.field("_fallback"), fallback
    )
    new_values = [events.column(k).combine_chunks() for k in keys]
    old_values = [pc.struct_field(events.column("_old"), k).combine_chunks() for k in keys]
    # Nearly always no value of the batch fell back to text: no key text to look up,
    # compare or group by (all NULL), a dozen kernel calls less for a small table.
    offsets = fallback.offsets.to_numpy()
    texts = bool(offsets[-1] > offsets[0])
    new_texts = [pc.map_lookup(fallback, k, "first") for k in keys] if texts else []
    old_texts = [pc.map_lookup(fallback, "_old." + k, "first") for k in keys] if texts else []
    # moved: an UPDATE whose key before (the old image's) differs from its key after.
    same_key = pa.array(np.ones(n, bool))
    for a, b in zip(new_values + new_texts, old_values + old_texts, strict=True):
        same_key = pc.and_(same_key, _same(a, b))
    moved = pc.and_(pc.and_(is_update, before_old), pc.invert(same_key))
    before_old_np = before_old.to_numpy(zero_copy_only=False)
    moved_np = moved.to_numpy(zero_copy_only=False)

    # Rank of each event in (commit LSN, ordinal) order; an arrival shares its event's.
    order = (
        pc.sort_indices(
            pa.table(
                [events.column("_commit_lsn"), events.column("_tx_ordinal")], names=["l", "o"]
            ),
            sort_keys=[("l", "ascending"), ("o", "ascending")],
        )
        .to_numpy()
        .astype(np.int64)
    )
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    arrivals = np.flatnonzero(moved_np)
    # Record r < n is event r under its key before; r = n + j is the arrival of event arrivals[j].
    event_of = np.concatenate([np.arange(n), arrivals])
    from_old = np.concatenate([before_old_np, np.zeros(len(arrivals), bool)])
    image = pa.array(event_of + np.where(from_old, n, 0))  # index into new ++ old images
    key_columns = {}
    for i in range(len(keys)):
        key_columns[f"k{i}"] = gather([new_values[i], old_values[i]], image)
        if texts:
            key_columns[f"t{i}"] = gather([new_texts[i], old_texts[i]], image)
    code = np.concatenate([rank[:n] * 2, rank[arrivals] * 2 + 1])  # max code = last record
    code_last = _last_codes(key_columns, code)
    is_arrival = (code_last & 1).astype(bool)
    i = order[code_last >> 1]

    lsn = events.column("_commit_lsn").to_numpy(zero_copy_only=False)[i]
    ordinal = events.column("_tx_ordinal").to_numpy(zero_copy_only=False)[i]
    truncated_after = np.zeros(len(i), bool)
    for t_lsn, t_ordinal in truncations:
        # The TRUNCATE comes after this record: the key's row is gone.
        truncated_after |= (lsn < t_lsn) | ((lsn == t_lsn) & (ordinal <= t_ordinal))
    is_delete_np = is_delete.to_numpy(zero_copy_only=False)
    deleted = truncated_after | (~is_arrival & (is_delete_np[i] | moved_np[i]))
    from_old_last = ~is_arrival & before_old_np[i]
    row = pa.array(i, mask=deleted)
    key_image = pa.array(i + np.where(from_old_last, n, 0))
    data = list(cat.state_columns)
    key_type = pa.struct(
        [pa.field(k, schema.field(k).type) for k in keys]
        + [pa.field("~" + k, pa.string()) for k in keys]
    )
    key = pa.StructArray.from_arrays(
        [gather([new_values[j], old_values[j]], key_image) for j in range(len(keys))]
        + [
            gather([new_texts[j], old_texts[j]], key_image)
            if texts
            else pa.nulls(len(key_image), pa.string())
            for j in range(len(keys))
        ],
        fields=list(key_type),
    )
    # One take for every column (the _seq of the final image: fast defaults ask whether
    # it was decoded before an ADD).
    taken = changes.select([*data, "_missing_toast", "_seq"]).take(row)
    finals = pa.table(
        {
            # The key's number in this call: unique per key, all that is asked of _k here.
            "_k": pa.array(np.arange(len(i))).cast(pa.string()),
            **{c: taken.column(c) for c in data},
            "_fallback": _map_keep(fallback.take(pa.array(i)), data, deleted),
            "_missing_toast": taken.column("_missing_toast"),
            "_seq": taken.column("_seq"),
            "_deleted": pa.array(deleted),
            "_key": key,
        }
    )
    return changes, finals


# Up to this many records of a one-integer-column key, each key's last is found by a sort
# in NumPy: 12 us for 200 records where Acero's hash grouping takes 70 us; even at ~1,000
# (0.064 vs 0.077 ms), Acero's ahead from there (4,000: 0.39 vs 0.13 ms; 1M: 280 vs 56 ms).
NUMPY_LAST_MAX = 1024


def _last_codes(keys: dict[str, pa.Array], code: np.ndarray) -> np.ndarray:
    """The greatest ``code`` of each distinct key (the values of ``keys`` at once)."""
    import numpy as np
    import pyarrow as pa

    if len(keys) == 1 and 0 < len(code) <= NUMPY_LAST_MAX:
        (column,) = keys.values()
        if pa.types.is_integer(column.type) and not column.null_count:
            values = column.to_numpy()
            order = np.lexsort((code, values))
            ordered = values[order]
            last = np.flatnonzero(np.r_[ordered[1:] != ordered[:-1], True])
            return code[order[last]]
    records = pa.table({**keys, "c": pa.array(code)})
    last_of = records.group_by(list(keys), use_threads=False).aggregate([("c", "max")])
    return last_of.column("c_max").to_numpy()


def gather(values: Sequence[pa.Array | pa.ChunkedArray], indices: pa.Array) -> pa.Array:
    """``take`` over the concatenation of ``values`` (all of one type)."""
    import pyarrow as pa

    chunks = [c for v in values for c in (v.chunks if isinstance(v, pa.ChunkedArray) else [v])]
    return pa.chunked_array(chunks, type=values[0].type).take(indices).combine_chunks()
