"""A table whose replica identity changed inside a batch, replayed one identity at a time.

The state's shape follows the identity: a keyed table holds one row per key and is
updated by key; a multiset (REPLICA IDENTITY FULL, or no key) holds distinct rows with
``_copies`` and counts whole images (README, "State"). What an event carries follows the
identity its Relation message announced: a keyed UPDATE has no old image unless its key
changed, a keyed DELETE only its key, a FULL one the whole old row. So neither replay is
exact over the other identity's events: a keyed replay deletes every copy of a
multiset's row, and a multiset replay cannot find the old row of a keyed UPDATE.

PostgreSQL changes an identity under an ACCESS EXCLUSIVE lock (``ALTER TABLE … REPLICA
IDENTITY``, ``DROP``/``ADD PRIMARY KEY``), so in commit order a table's events come in runs
of one identity each. :func:`replay` applies run after run to the whole state (the prior
one, held in Arrow: only tables small enough for the driver come here), each with its own
replay — :func:`slotlake.replay_duckdb.fill_keyed_local` or
:func:`slotlake.multiset_arrow.multiset_state` — and returns the whole new state in the
table's final shape, which the caller writes as one overwrite commit.
:func:`replay_frames` is the same replay in Spark SQL, for a state too big for the driver
(or a lake off the local disk): a batch that changes a table's identity rewrites its
state whole, once, whatever its changes alone would cost.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from slotlake.catalog import TableCatalog, identity
from slotlake.lake import expand_copies, one_copy_each

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

    from slotlake.fastdefault import FastDefault

log = logging.getLogger(__name__)

Position = tuple[int, int]  # (commit LSN, ordinal in its transaction)


def runs(events: pa.Table, cat: TableCatalog) -> list[tuple[tuple[str, ...] | None, pa.Table]]:
    """The events in commit order, cut where the identity of their Relation version
    changes: (identity, events) per run."""
    import numpy as np

    ordered = events.sort_by([("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending")])
    versions = sorted(cat.versions, key=lambda v: v.seq)
    starts = np.array([v.seq for v in versions], dtype=np.int64)
    seqs = ordered.column("_seq").to_numpy()
    # Each event was decoded with the latest version before it.
    which = np.searchsorted(starts, seqs, side="right") - 1
    if len(which) and which.min() < 0:
        raise ValueError(f"{cat.name}: an event before the batch's first Relation message")
    ids = [identity(v) for v in versions]
    out: list[tuple[tuple[str, ...] | None, pa.Table]] = []
    begin = 0
    for i in range(1, len(which) + 1):
        if i == len(which) or ids[which[i]] != ids[which[begin]]:
            out.append((ids[which[begin]], ordered.slice(begin, i - begin)))
            begin = i
    return out


def _position(table: pa.Table, row: int) -> Position:
    return (
        int(table.column("_commit_lsn")[row].as_py()),
        int(table.column("_tx_ordinal")[row].as_py()),
    )


def _without_keys(rows: pa.Table, finals: pa.Table, key: list[str]) -> pa.Table:
    """``rows`` without those whose key is one of ``finals``' (Arrow joins carry no map
    columns: the join runs on the keys and row numbers only)."""
    import numpy as np
    import pyarrow as pa

    numbered = rows.select(key).append_column("__row", pa.array(np.arange(rows.num_rows)))
    # _key: the typed key a final row replaces (a deleted key's columns are NULL).
    struct = finals.column("_key").combine_chunks()
    keys = pa.Table.from_arrays(struct.flatten(), names=[f.name for f in struct.type])
    kept = numbered.join(keys.select(key), keys=key, join_type="left anti")
    return rows.take(np.sort(kept.column("__row").to_numpy()))


def replay(
    events: pa.Table,
    prior: pa.Table | None,
    cat: TableCatalog,
    truncations: Sequence[Position],
    keyed_state: pa.Schema,
    multiset_state: pa.Schema,
    defaults: Sequence[FastDefault] = (),
) -> tuple[pa.Table, pa.Table]:
    """(change rows, the whole new state) of one table's batch, run by run.

    ``prior``: the whole prior state, aligned to this batch's columns with ``_copies``
    (one each for a state stored keyed), with the defaults its rows read already applied;
    None for none. ``keyed_state`` / ``multiset_state``: the state's Arrow schema without and with
    ``_copies``. The state comes back in the table's final shape (``cat``'s identity).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from slotlake import fastdefault
    from slotlake.local_table import rows_reader
    from slotlake.multiset_arrow import multiset_state as replay_multiset
    from slotlake.replay_duckdb import fill_keyed_local

    state = prior if prior is not None else keyed_state.empty_table()
    parts = runs(events, cat)
    changes: list[pa.Table] = []
    for i, (key, rows) in enumerate(parts):
        # A TRUNCATE goes with the run in force when it ran: from the run's first event up
        # to the next run's (the first run also takes those before any event).
        start = _position(rows, 0) if i else None
        stop = _position(parts[i + 1][1], 0) if i + 1 < len(parts) else None
        truncs = [
            t for t in truncations if (start is None or t >= start) and (stop is None or t < stop)
        ]
        if key is None:
            images = fastdefault.fill_events_arrow(rows, list(defaults))
            state = replay_multiset(images, one_copy_each(state), cat, truncs, multiset_state)
            at = rows.schema.get_field_index("_missing_toast")
            changes.append(rows.set_column(at, "_missing_toast", rows.column("_unchanged")))
            continue
        run_cat = dataclasses.replace(cat, key_columns=list(key), replica_identity="d")
        base = expand_copies(state).select(keyed_state.names).cast(keyed_state)
        logged, finals = fill_keyed_local(rows, rows_reader(base, run_cat), run_cat, truncs)
        finals = fastdefault.fill_finals_arrow(finals, list(defaults))
        # Every key the run touched is replaced by its final row (or gone).
        base = keyed_state.empty_table() if truncs else _without_keys(base, finals, list(key))
        alive = finals.filter(pc.invert(finals.column("_deleted")))
        state = pa.concat_tables(
            [base.select(keyed_state.names), alive.select(keyed_state.names).cast(keyed_state)]
        )
        changes.append(logged)
    if not parts and truncations:  # truncated, and no change of it after
        state = keyed_state.empty_table()
    final = (
        one_copy_each(state).select(multiset_state.names).cast(multiset_state)
        if cat.is_multiset
        else expand_copies(state).select(keyed_state.names).cast(keyed_state)
    )
    if not changes:
        return events.slice(0, 0), final
    names = changes[0].column_names
    logged = pa.concat_tables([c.select(names) for c in changes], promote_options="permissive")
    return logged, final


def _version_index(seq: Column, cat: TableCatalog) -> Column:
    """The index (in ``seq`` order) of the Relation version an event at ``seq`` was decoded
    with: the latest one before it; -1 before the first."""
    from pyspark.sql import functions as F

    out = F.lit(-1)
    for i, v in enumerate(sorted(cat.versions, key=lambda v: v.seq)):
        out = F.when(seq >= F.lit(v.seq), F.lit(i)).otherwise(out)
    return out


FrameRun = tuple[tuple[str, ...] | None, list[int], Position]


def frame_runs(events: DataFrame, cat: TableCatalog) -> tuple[DataFrame, list[FrameRun]]:
    """:func:`runs` for a DataFrame: the events tagged ``_v`` (their version's index) and,
    per run, (identity, its versions' indexes, its first position in commit order).

    One small aggregation job. A table's events never go back to an older version in
    commit order (the DDL behind a new Relation message waited, under its lock, for every
    transaction that had changed the table to end), so each run is consecutive versions
    of one identity, as :func:`runs` cuts them."""
    from pyspark.sql import functions as F

    versions = sorted(cat.versions, key=lambda v: v.seq)
    tagged = events.withColumn("_v", _version_index(F.col("_seq"), cat))
    firsts = (
        tagged.groupBy("_v")
        .agg(F.min(F.struct("_commit_lsn", "_tx_ordinal")).alias("_first"))
        .collect()
    )
    seen = sorted((int(r["_v"]), (int(r["_first"][0]), int(r["_first"][1]))) for r in firsts)
    if seen and seen[0][0] < 0:
        raise ValueError(f"{cat.name}: an event before the batch's first Relation message")
    out: list[FrameRun] = []
    for v, first in seen:
        key = identity(versions[v])
        if out and out[-1][0] == key:
            out[-1][1].append(v)
        else:
            out.append((key, [v], first))
    return tagged, out


class FrameReplay(NamedTuple):
    """What :func:`replay_frames` returns."""

    changes: DataFrame
    state: DataFrame
    # Whether the multiset state holds each value of the key asked about once (None: not
    # asked, or not a multiset).
    unique: bool | None = None


def replay_frames(
    events: DataFrame,
    prior: DataFrame,
    cat: TableCatalog,
    truncations: Sequence[Position],
    defaults: Sequence[FastDefault] = (),
    expected_rows: int = 0,
    persisted: list[DataFrame] | None = None,
    key: Sequence[str] | None = None,
) -> FrameReplay:
    """(change rows, the whole new state) of one table's batch, run by run, in Spark:
    :func:`replay` with :func:`slotlake.state.fill_keyed` and
    :func:`slotlake.state.merge_multiset` as the runs' replays.

    ``prior``: the whole prior state as plain rows (a multiset's repeated by its
    ``_copies``), aligned to this batch's columns, with the defaults its rows read
    already applied. The state comes back in the table's final shape: the state's
    columns, ``_fallback``, ``_missing_toast`` and, for a multiset, ``_copies`` (one row
    per distinct value). Each run's state but the last is persisted (and appended to
    ``persisted``, for the caller to release): the next run reads it, and so do the
    change log's job and the state's.

    ``key``: a key the multiset's new state may be unique on
    (:func:`slotlake.unique_multiset.switched_key`). Its rows are then persisted and
    checked on it first: unique, each row is already one distinct value, and the
    grouping of every column (and of ``_fallback``'s text) that counts copies is
    skipped, as is a read of the written state to check the key after."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from slotlake import fastdefault
    from slotlake.bootstrap import multiset_rows
    from slotlake.state import apply_finals, fill_keyed, merge_multiset

    tagged, parts = frame_runs(events, cat)
    log.info(
        "%s: its replica identity changed between its changes (%d runs: %s): the state is "
        "rebuilt whole by Spark, one identity at a time",
        cat.name,
        len(parts),
        ", ".join("whole rows" if k is None else "by " + "+".join(k) for k, _, _ in parts),
    )
    state = prior
    changes: list[DataFrame] = []
    for i, (run_key, versions, first) in enumerate(parts):
        rows = tagged.filter(F.col("_v").isin(versions)).drop("_v")
        # A TRUNCATE goes with the run in force when it ran (as in replay).
        start = first if i else None
        stop = parts[i + 1][2] if i + 1 < len(parts) else None
        truncs = [
            t for t in truncations if (start is None or t >= start) and (stop is None or t < stop)
        ]
        if run_key is None:
            images = fastdefault.fill_events(rows, list(defaults))
            state = merge_multiset(images, state, cat, truncs)
            changes.append(rows.withColumn("_missing_toast", F.col("_unchanged")))
        else:
            run_cat = dataclasses.replace(cat, key_columns=list(run_key), replica_identity="d")
            logged, finals = fill_keyed(rows, state, run_cat, truncs, expected_rows, persisted)
            finals = fastdefault.fill_finals(finals, rows, list(run_key), list(defaults))
            state = apply_finals(state, finals, run_cat, bool(truncs))
            changes.append(logged)
        if i + 1 < len(parts):
            state = state.persist(StorageLevel.DISK_ONLY)
            if persisted is not None:
                persisted.append(state)
    if not parts and truncations:  # truncated, and no change of it after
        state = state.limit(0)
    unique = None
    if cat.is_multiset and key and all(k in state.columns for k in key):
        state = state.persist(StorageLevel.DISK_ONLY)
        if persisted is not None:
            persisted.append(state)
        unique = rows_unique_on(state, key)
    # A multiset's plain rows are counted as a copy's are; known distinct, one copy each.
    final = multiset_rows(state, cat.state_columns, not unique) if cat.is_multiset else state
    if not changes:
        logged = events.withColumn("_missing_toast", F.col("_unchanged")).limit(0)
        return FrameReplay(logged, final, unique)
    logged = changes[0]
    for more in changes[1:]:
        logged = logged.unionByName(more, allowMissingColumns=True)
    return FrameReplay(logged, final, unique)


def rows_unique_on(rows: DataFrame, key: Sequence[str]) -> bool:
    """Whether plain rows (each one copy) hold each value of ``key`` once, none NULL: one
    aggregation, as :func:`slotlake.snapshot.unique_state_rows` checks a written state."""
    from pyspark.sql import functions as F

    from slotlake.delta import quote

    row = rows.agg(
        F.count(F.lit(1)).alias("n"),
        F.count_distinct(*[F.col(quote(k)) for k in key]).alias("keys"),
    ).first()
    assert row is not None
    return int(row["keys"]) == int(row["n"])
