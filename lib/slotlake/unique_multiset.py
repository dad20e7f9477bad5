"""A REPLICA IDENTITY FULL table with a primary key, MERGEd by that key.

A FULL identity makes pgoutput send whole old rows, so the state is a multiset matched by
whole rows (README, "State"): a big one costs Spark's whole-row MERGE each batch, which
reads every file (no statistics prune a whole row), what the table weighs. Yet a table
with a primary key holds each key once: its multiset is a set, each row one copy, and a
batch's events by the key's values are a keyed table's. The state is then MERGEd by that
key on the driver (:mod:`slotlake.dv_merge`, key indexes and deletion vectors), what the
batch's changes cost.

The key comes from the source's catalog when the table is copied
(:attr:`slotlake.lake.TableCommit.unique_on`); nothing here trusts it to stay a key.
Uniqueness is kept by induction instead: the state is unique on the key after the copy,
and a batch keeps it unique when, in the order of its events, each key's copies go
0 → 1 → 0 … (an INSERT or an UPDATE's new row adds one, a DELETE or an UPDATE's old row
removes one) and no key the batch adds first is live in the state already. A batch past
the driver's bounds (or any batch of a lake off the local disk) is MERGEd by the key by
Spark (:func:`slotlake.state.unique_rows`: each key's net change, at most one row removed
and one added, a fresh key raising the MERGE's error if live). A batch that breaks that
(the key dropped at the source and a duplicate inserted) is matched whole, by Spark,
exactly as any multiset's; the state Spark wrote is then checked whole once
(:func:`slotlake.snapshot.unique_state_rows`): still unique, the key is kept; else the
table no longer counts as unique.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from slotlake.catalog import TableCatalog
    from slotlake.lake import TableCommit


class Broken(Exception):
    """The batch cannot be applied by the table's unique key (nothing was written for
    its state): its rows are matched whole instead."""


class KeyedRows(NamedTuple):
    """A batch's final row per key: the state's columns, ``_key`` and ``_deleted``, and
    ``fresh``, the rows whose key the batch adds before removing it (it must not be live
    in the state: :func:`slotlake.dv_merge.merge_keyed`)."""

    rows: pa.Table
    fresh: np.ndarray


def unique_key(cat: TableCatalog, prior: TableCommit | None) -> list[str] | None:
    """The key a multiset's state is known unique on and that this batch's rows can be
    matched by (None: its rows are matched whole): the table has the FULL identity in
    every version of the batch, is the relation the lake last wrote it from, and the
    key's columns are in the state as they were, neither renamed nor retyped."""
    if prior is None or not prior.unique_on or not prior.state or not cat.versions:
        return None
    if cat.replica_identity != "f" or any(v.replica_identity != "f" for v in cat.versions):
        return None
    if cat.oids != {prior.oid}:  # another relation of that name now (created again)
        return None
    key = list(prior.unique_on)
    types = dict(cat.columns)
    before = {c[0]: c[1] for c in prior.columns}
    moved = set(cat.renames) | set(cat.renames.values()) | set(cat.lake_names)
    for k in key:
        if k not in cat.state_columns or k in moved or k in cat.text_columns:
            return None
        if types.get(k) != before.get(k):
            return None
    return key


def switched_key(cat: TableCatalog) -> list[str] | None:
    """The key a multiset's state rebuilt across an identity change inside the batch
    (:mod:`slotlake.identity_segments`) may be unique on: the last key its versions had
    (the primary key or identity index of a table made FULL), its columns still the
    state's under their names. Only a candidate: the rebuilt state is checked whole
    before the key is kept (:attr:`slotlake.lake.TableCommit.unique_on`), as a copy's
    is, so that later batches are MERGEd by it instead of by whole rows."""
    from slotlake.catalog import identity

    if not cat.is_multiset or cat.replica_identity != "f":
        return None
    keys = [k for k in (identity(v) for v in sorted(cat.versions, key=lambda v: v.seq)) if k]
    if not keys:
        return None
    key = list(keys[-1])
    moved = set(cat.renames) | set(cat.renames.values()) | set(cat.lake_names)
    if any(k not in cat.state_columns or k in moved or k in cat.text_columns for k in key):
        return None
    return key


def merged_by(state_path: str, version: int, key: Sequence[str]) -> bool:
    """Whether version ``version`` of the local state at ``state_path`` is a MERGE by
    ``key`` (the driver's :func:`slotlake.dv_merge.merge_keyed` of :func:`keyed_rows`, or
    Spark's, :func:`slotlake.batch._merge_unique`): a rerun of a batch whose tables an
    earlier attempt wrote then knows the key was kept (that MERGE commits only rows whose
    key was not live)."""
    import os

    from slotlake import delta_log
    from slotlake.dv_merge import merge_predicate

    log_dir = os.path.join(state_path, "_delta_log")
    try:
        for action in delta_log.entry_actions(log_dir, version):
            info = action.get("commitInfo")
            if info is not None:
                if info.get("operation") != "MERGE":
                    return False
                predicate = (info.get("operationParameters") or {}).get("predicate")
                return predicate == merge_predicate(key) or (
                    info.get("userMetadata") == merged_by_key_text(key)
                )
    except (OSError, ValueError):  # a checkpointed-away entry: not known
        return False
    return False


def merged_by_key_text(key: Sequence[str]) -> str:
    """The ``userMetadata`` of Spark's MERGE of a multiset by ``key`` (Spark records its
    predicate with the plan's expression ids, which no later run can compare)."""
    return f"slotlake: MERGE by unique key {list(key)}"


def keyed_view(cat: TableCatalog, key: Sequence[str]) -> TableCatalog:
    """``cat`` as a table keyed by ``key`` (for the writers of keyed rows)."""
    return dataclasses.replace(cat, key_columns=list(key), replica_identity="d")


def keyed_rows(events: pa.Table, key: Sequence[str], state: pa.Schema) -> KeyedRows:
    """Each key's final row of a FULL table's decoded ``events`` (the state's ``state``
    columns, with ``_key``, ``_deleted`` and ``_seq``, the final image's raw row);
    :class:`Broken` when the batch's own events break the key's uniqueness, or an image
    lacks what matching by key needs."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from slotlake.lake import COPIES
    from slotlake.multiset_arrow import images, normalised

    data = [f.name for f in state if f.name not in ("_fallback", "_missing_toast", COPIES)]
    adds, removes, added, removed = images(events, data, state)
    whole_old = pc.fill_null(pc.equal(removes.column("_old_kind"), "O"), False)
    if removes.num_rows and not pc.all(whole_old).as_py():
        raise Broken("an old row is not whole (its identity was not FULL when written)")
    if adds.num_rows and pc.max(pc.list_value_length(adds.column("_unchanged"))).as_py():
        raise Broken("a new row has an unchanged TOAST value its old row did not fill")
    both = pa.concat_tables([added, removed])
    # An UPDATE removes its old row before it adds its new one.
    order = np.concatenate(
        [
            adds.column("_seq").to_numpy() * 2 + 1,
            removes.column("_seq").to_numpy() * 2,
        ]
    )
    sign = np.concatenate([np.ones(added.num_rows, np.int8), -np.ones(removed.num_rows, np.int8)])
    keys = both.select(list(key))
    if any(keys.column(k).null_count for k in key):
        raise Broken("a row's key is NULL")
    entries = keys.append_column("_order", pa.array(order, pa.int64()))
    try:
        at = pc.sort_indices(
            entries, sort_keys=[(k, "ascending") for k in [*key, "_order"]]
        ).to_numpy()
        n = len(at)
        starts = np.ones(n, dtype=bool)
        if n > 1:
            ordered = keys.take(pa.array(at))
            same = np.ones(n - 1, dtype=bool)
            for k in key:
                col = ordered.column(k).combine_chunks()
                equal = pc.equal(col.slice(1), col.slice(0, n - 1))
                same &= equal.to_numpy(zero_copy_only=False)
            starts[1:] = ~same
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise Broken(f"its key's values cannot be ordered in Arrow ({exc})") from exc
    signs = sign[at]
    # Within a key the copies go 0 → 1 → 0 or 1 → 0 → 1: the signs alternate.
    if n > 1 and np.any(~starts[1:] & (signs[1:] == signs[:-1])):
        raise Broken("the batch adds a row whose key is live, or removes one that is not")
    ends = np.r_[starts[1:], True] if n else starts
    last = at[ends]
    fresh = signs[starts] > 0
    rows = both.take(pa.array(last))
    rows = pa.Table.from_arrays(
        [normalised(rows.column(c)) if c not in key else rows.column(c) for c in data]
        + [rows.column("_fallback")],
        schema=both.schema,
    )
    rows = rows.append_column(
        state.field("_missing_toast"),
        pa.array([[]] * len(last), state.field("_missing_toast").type),
    )
    rows = rows.append_column(COPIES, pa.repeat(pa.scalar(1, pa.int64()), len(last)))
    # The keyed writers' shape: each key column beside its value kept as text, which no
    # key here has (a NULL key, as such a value's typed column is, was refused above).
    key_struct = pa.StructArray.from_arrays(
        [rows.column(k).combine_chunks() for k in key]
        + [pa.nulls(len(last), pa.string()) for _ in key],
        names=[*key, *("~" + k for k in key)],
    )
    rows = rows.append_column("_key", key_struct)
    deleted = sign[last] < 0
    rows = rows.append_column("_deleted", pa.array(deleted))
    # The final image's raw row (a fast default applies to images from before its ADD).
    seqs = np.concatenate([adds.column("_seq").to_numpy(), removes.column("_seq").to_numpy()])
    rows = rows.append_column("_seq", pa.array(seqs[last], pa.int64(), mask=deleted))
    return KeyedRows(rows, fresh)


def holds(state: pa.Table, key: Sequence[str]) -> bool:
    """Whether a multiset's whole state (rows with ``_copies``) is unique on ``key``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from slotlake.lake import COPIES

    if state.num_rows == 0:
        return True
    if pc.max(state.column(COPIES)).as_py() != 1:
        return False
    if any(state.column(k).null_count for k in key):
        return False
    try:
        return state.group_by(list(key)).aggregate([]).num_rows == state.num_rows
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False  # a key Arrow cannot group: not known unique
