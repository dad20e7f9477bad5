"""A multiset table's state in Arrow: rows matched by their whole value, counted.

A table with REPLICA IDENTITY FULL and no unique key (or no identity at all) is stored
as one row per distinct value with a ``_copies`` count (README, "State"). Spark builds
that state with a grouping (:func:`slotlake.bootstrap.multiset_rows` for a copy,
:func:`slotlake.state.multiset_delta` and a MERGE on the whole row for a batch); these
are the driver's twins, for tables small enough to be held whole:

* :func:`multiset_table` groups copied rows (bootstrap, a table copied on the driver);
* :func:`multiset_state` replays a batch's events onto the prior state: every INSERT adds
  one copy of its row, a DELETE removes one copy of its old image, an UPDATE does both,
  a TRUNCATE drops the prior state and the events before it. The result is the whole new
  state, which the caller writes as one overwrite commit.

Spark's grouping normalises floats (-0.0 is 0.0; every NaN is one NaN), also inside
arrays, and compares arrays and maps whole. Arrow groups floats by value and cannot
group nested values: columns are normalised first, and nested values and ``_fallback``
are grouped on their JSON text (built in Python, only for the rows that have one: the
tables on this path are small).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from slotlake.lake import COPIES

if TYPE_CHECKING:
    import pyarrow as pa

    from slotlake.catalog import TableCatalog

OLD_PREFIX = "_old."


def multiset_table(
    table: pa.Table, columns: Sequence[str], copies: pa.Array | None = None
) -> pa.Table:
    """Identical rows (values and value texts alike) → one row with ``_copies``.

    Each row counts once, or ``copies[i]`` times when given (negative removes); a value
    whose count ends at zero or below is dropped. The representative of a value is its
    first row, normalised as Spark's grouping returns it.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    data = {c: normalised(table.column(c)) for c in columns}
    keys: dict[str, Any] = {f"k{i}": _groupable(col) for i, col in enumerate(data.values())}
    keys["kfb"] = _map_text(table.column("_fallback"))
    keys["row"] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    if copies is None:
        aggregations = [("row", "min"), ("row", "count")]
        counted = "row_count"
    else:
        keys["w"] = copies
        aggregations = [("row", "min"), ("w", "sum")]
        counted = "w_sum"
    groups = (
        pa.table(keys)
        .group_by([k for k in keys if k not in ("row", "w")], use_threads=False)
        .aggregate(aggregations)
    )
    if copies is not None:
        groups = groups.filter(pc.greater(groups.column(counted), 0))
    first = groups.column("row_min")
    out = pa.table({c: col.take(first) for c, col in data.items()})
    out = out.append_column(table.schema.field("_fallback"), table.column("_fallback").take(first))
    missing = (
        table.schema.field("_missing_toast")
        if "_missing_toast" in table.column_names
        else pa.field("_missing_toast", pa.list_(pa.string()))
    )
    out = out.append_column(missing, pa.array([[]] * len(first), missing.type))
    return out.append_column(COPIES, pc.cast(groups.column(counted), pa.int64()))


def multiset_state(
    events: pa.Table,
    prior: pa.Table | None,
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    state: pa.Schema,
) -> pa.Table:
    """The state after a batch: ``prior`` (the state as of the previous batch, with
    ``_copies``; None for none) plus the batch's decoded ``events``, as ``state``'s rows.

    The same counting as Spark's :func:`slotlake.state.merge_multiset`; the value texts of
    an old image are the ``_fallback`` entries under ``_old.``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = list(cat.state_columns)
    if truncations:
        lsn, ordinal = max(truncations)
        after = pc.or_(
            pc.greater(events.column("_commit_lsn"), lsn),
            pc.and_(
                pc.equal(events.column("_commit_lsn"), lsn),
                pc.greater(events.column("_tx_ordinal"), ordinal),
            ),
        )
        events = events.filter(pc.fill_null(after, False))
        prior = None
    split = images(events, columns, state)
    added, removed = split.added, split.removed
    parts = [added, removed]
    weights = [pa.repeat(1, added.num_rows), pa.repeat(-1, removed.num_rows)]
    if prior is not None and prior.num_rows:
        image = added.schema
        parts.insert(0, prior.select(image.names).cast(image))
        weights.insert(0, pc.cast(prior.column(COPIES), pa.int64()))
    whole = pa.concat_tables(parts)
    copies = pa.chunked_array(weights, pa.int64())
    return multiset_table(whole, columns, copies).select(state.names).cast(state)


class Images(NamedTuple):
    """A batch's events split by what they do to a multiset, in their order: ``adds``
    (INSERT, UPDATE) and ``removes`` (UPDATE, DELETE), and their images as rows of the
    state's columns and ``_fallback``: ``added`` the new ones, ``removed`` the old ones
    (the ``_fallback`` entries under ``_old.``, the prefix stripped)."""

    adds: pa.Table
    removes: pa.Table
    added: pa.Table
    removed: pa.Table


def images(events: pa.Table, columns: Sequence[str], state: pa.Schema) -> Images:
    """The batch's new and old images of a multiset (:class:`Images`), typed as the
    ``state``'s ``columns``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    image = pa.schema([state.field(c) for c in [*columns, "_fallback"]])
    op = events.column("_op")
    adds = events.filter(pc.is_in(op, pa.array(["I", "U"])))
    removes = events.filter(pc.is_in(op, pa.array(["U", "D"])))
    added = pa.Table.from_arrays(
        [*(adds.column(c) for c in columns), _entries(adds.column("_fallback"), old=False)],
        schema=image,
    )
    old = removes.column("_old").combine_chunks()
    # flatten(), not field(): a NULL image leaves its fields NULL (Spark's getField).
    fields = dict(zip([f.name for f in old.type], old.flatten(), strict=True))
    removed = pa.Table.from_arrays(
        [
            *(
                fields[c] if c in fields else pa.nulls(len(old), image.field(c).type)
                for c in columns
            ),
            _entries(removes.column("_fallback"), old=True),
        ],
        schema=image,
    )
    return Images(adds, removes, added, removed)


def _entries(col: pa.ChunkedArray, old: bool) -> pa.Array:
    """A ``_fallback`` map with only its new-image entries, or only its old-image entries
    (``_old.`` stripped): Spark's ``map_filter`` and ``transform_keys``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    m = col.combine_chunks()
    n = len(m)
    offsets = m.offsets.to_numpy()  # into the whole child arrays, even for a slice
    parents = np.repeat(np.arange(n), np.diff(offsets))
    start, stop = int(offsets[0]), int(offsets[-1])
    keys, items = m.keys.slice(start, stop - start), m.items.slice(start, stop - start)
    is_old = pc.starts_with(keys, OLD_PREFIX).to_numpy(zero_copy_only=False)
    keep = is_old if old else ~is_old
    keys, items = keys.filter(pa.array(keep)), items.filter(pa.array(keep))
    if old:
        keys = pc.utf8_slice_codeunits(keys, len(OLD_PREFIX))
    counts = np.bincount(parents[keep], minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, type=m.type)


def _map_text(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each map's entries in key order as JSON text ('' for an empty map, NULL for NULL):
    the grouping key of ``_fallback``, as Spark groups its sorted JSON."""
    import numpy as np
    import pyarrow as pa

    m = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lengths = np.diff(m.offsets.to_numpy())  # a NULL map has none
    texts = np.full(len(m), "", dtype=object)
    texts[np.asarray(m.is_null())] = None
    some = np.flatnonzero(lengths)
    for i, value in zip(some, m.take(pa.array(some)).to_pylist(), strict=True):
        texts[i] = json.dumps(sorted(value))
    return pa.array(texts, pa.string())


def normalised(col: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """A column as Spark's grouping keys hold it: -0.0 is 0.0 (NaN is one value in both),
    inside arrays and maps too."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_floating(col.type):
        return pc.if_else(pc.equal(col, 0), pa.scalar(0.0, col.type), col)
    if pa.types.is_nested(col.type):
        return pa.array([_normal_value(v) for v in col.to_pylist()], col.type)
    return col


def _normal_value(value: Any) -> Any:
    if isinstance(value, float):
        return 0.0 if value == 0 else value
    if isinstance(value, list):
        return [_normal_value(v) for v in value]
    if isinstance(value, tuple):  # a map entry
        return tuple(_normal_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _normal_value(v) for k, v in value.items()}
    return value


def _groupable(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A column Arrow can group by: nested values as their JSON text, anything else as it is."""
    import pyarrow as pa

    if not pa.types.is_nested(col.type):
        return col
    return pa.array(
        [None if v is None else json.dumps(v, default=repr) for v in col.to_pylist()], pa.string()
    )
