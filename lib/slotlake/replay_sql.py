"""The TOAST fill and each key's final row with Spark SQL window functions.

Same semantics as :func:`slotlake.toast.replay` (the oracle), without per-row Python:
every value stays in the JVM.

Records. Each event is a record under its own key (the key before it for U and D, the
key after it for I); an UPDATE that changes its key (k0 → k1) adds a second record under
k1, the "arrival". The prior rows are records that sort before every event of their key.
One window, partitioned by key and ordered by (prior first, commit_lsn, tx_ordinal),
runs over all of them.

Slots. For each column that some UPDATE of the batch left unchanged (the "open"
columns), every record provides a slot ``struct<e, s, v, f, x>`` to the records after it
under the same key: ``e`` the truncate epoch of the record (how many TRUNCATEs of the
batch precede it), ``s`` the state (known, missing, pending), ``v`` the value (NULL is a
value: "unknown" is ``s``), ``f`` the value's text fallback and ``x`` the position of the
moving UPDATE a pending slot waits for.

* a prior row provides its values, missing where its ``_missing_toast`` says so;
* an INSERT, or an UPDATE for the columns it carries, provides its own values;
* a DELETE, and a key-changing UPDATE under its old key, provide "missing": no row;
* an UPDATE that leaves the column unchanged provides nothing (NULL): whatever it
  inherits is what the record before it had, so ``last(..., ignorenulls)`` over the
  preceding rows finds the value a chain of such UPDATEs carries;
* an arrival provides its UPDATE's own values, and for the UPDATE's unchanged columns a
  *pending* slot pointing at that UPDATE: its values are filled under the old key, in
  another partition of the same window.

An UPDATE's base slot is the last non-NULL slot before it under its old key; a slot of an
earlier truncate epoch (or none at all) means no base: the column is missing.

Pending slots. After the window, the moving UPDATEs with unchanged columns (rare) form a
small table: position → its own fill, which may itself be pending on an earlier moving
UPDATE (chains k0 → k1 → k2). Pointer jumping on that table resolves every chain in
log₂(length) driver-side rounds, each a count of what is still pending; then the events
that inherited a pending slot take the resolved one, and so does each arrival, whose open
columns wait on its own UPDATE. Without moving UPDATEs that leave columns unchanged there
is no round at all.

Finals. The last record under each key gives the key's row after the batch: a DELETE or
a departing UPDATE means none (deleted), as does a TRUNCATE after it; an arrival is the
filled row of its UPDATE.

One difference from the oracle, for input the decoder never makes: if an UPDATE lists a
column as unchanged *and* carries a ``_fallback`` text for it, the oracle hands that text
on to a later UPDATE that inherits the column (when the base had none); here the later
UPDATE only sees the base's text. (The decoder gives text only to values it has.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

# Internal column names; event columns are passed through untouched, so these must not
# look like a PostgreSQL column or a slotlake metadata column.
_ROLE = "__rw_role"  # 0 prior row, 1 the event under its own key, 2 arrival under k1
_KEY = "__rw_key"
_EPOCH = "__rw_epoch"
_MOVED = "__rw_moved"
_LAST = "__rw_last"
_PMISS = "__rw_prior_missing"
_POS = "__rw_pos"
_REF = "__rw_ref"
_RES = "__rw_res"

PRIOR_ROLE, EVENT_ROLE, ARRIVAL_ROLE = 0, 1, 2
KNOWN, MISSING, PENDING = 0, 1, 2


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _fill(i: int) -> str:
    return f"__rw_fill{i}"


def _base(i: int) -> str:
    return f"__rw_base{i}"


def _pos_type() -> StructType:
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("l", LongType()), StructField("o", LongType())])


def _slot_type(value_type: DataType) -> StructType:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    return StructType(
        [
            StructField("e", IntegerType()),
            StructField("s", IntegerType()),
            StructField("v", value_type),
            StructField("f", StringType()),
            StructField("x", _pos_type()),
        ]
    )


def _slot(
    epoch: Column,
    state: int | Column,
    value: Column | None,
    text: Column | None,
    ref: Column | None,
    value_type: DataType,
) -> Column:
    from pyspark.sql import functions as F

    def or_null(c: Column | None, t: DataType | str) -> Column:
        return (F.lit(None) if c is None else c).cast(t)

    return F.struct(
        epoch.cast("int").alias("e"),
        (state if not isinstance(state, int) else F.lit(state)).cast("int").alias("s"),
        or_null(value, value_type).alias("v"),
        or_null(text, "string").alias("f"),
        or_null(ref, _pos_type()).alias("x"),
    )


def _position() -> Column:
    from pyspark.sql import functions as F

    return F.struct(F.col("_commit_lsn").alias("l"), F.col("_tx_ordinal").alias("o"))


def _epoch(truncations: Sequence[tuple[int, int]]) -> Column:
    """How many of the batch's TRUNCATEs precede the event."""
    from pyspark.sql import functions as F

    if not truncations:
        return F.lit(0)
    points = F.array(
        *[
            F.struct(F.lit(lsn).cast("bigint").alias("l"), F.lit(o).cast("bigint").alias("o"))
            for lsn, o in truncations
        ]
    )
    position = _position()
    return F.size(F.filter(points, lambda t: t < position))


def _is_pending(i: int) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.col(_fill(i)).getField("s") == PENDING, F.lit(False))


def _any_pending(n: int) -> Column:
    return reduce(lambda a, b: a | b, [_is_pending(i) for i in range(n)])


def _take_resolved(df: DataFrame, table: DataFrame, n: int) -> DataFrame:
    """Replace each pending fill of ``df`` by ``table``'s fill of the UPDATE it points at.

    One lookup frame for every column, so that its broadcast is planned once and reused.
    """
    from pyspark.sql import functions as F

    columns = df.columns
    lookup = table.select(
        F.col(_POS).alias(_REF), *[F.col(_fill(i)).alias(f"{_RES}{i}") for i in range(n)]
    )
    for i in range(n):
        joined = df.join(lookup, F.col(_fill(i)).getField("x") == F.col(_REF), "left")
        df = joined.select(
            *[
                F.when(_is_pending(i), F.col(f"{_RES}{i}")).otherwise(F.col(c)).alias(c)
                if c == _fill(i)
                else _col(c)
                for c in columns
            ]
        )
    return df


def _resolve_moves(windowed: DataFrame, n: int) -> DataFrame:
    """Resolve the pending fills (slots of moving UPDATEs) by pointer jumping."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    unchanged = F.coalesce(F.col("_unchanged"), F.array().cast("array<string>"))
    # Lazy checkpoints: each round's count materializes its table (no job of its own).
    table = (
        windowed.filter((F.col(_ROLE) == EVENT_ROLE) & F.col(_MOVED) & (F.size(unchanged) > 0))
        .select(_position().alias(_POS), *[F.col(_fill(i)) for i in range(n)])
        .localCheckpoint(eager=False)
    )
    previous = None
    while True:
        pending = table.filter(_any_pending(n)).count()
        if pending == 0:
            break
        if previous is not None and pending >= previous:
            raise RuntimeError(
                f"replay_window: {pending} moving UPDATEs stay pending (a cycle in positions?)"
            )
        previous = pending
        table = _take_resolved(table, table, n).localCheckpoint(eager=False)
    waiting = _take_resolved(windowed.filter(_any_pending(n)), table, n)
    # Both outputs read the few rows that waited: resolve them once.
    waiting = waiting.persist(StorageLevel.DISK_ONLY)
    return windowed.filter(~_any_pending(n)).unionByName(waiting)


def replay_window(
    events: DataFrame,
    prior_rows: DataFrame | Callable[[], DataFrame] | None,
    data_columns: list[str],
    truncations: list[tuple[int, int]],
) -> tuple[DataFrame, DataFrame]:
    """returns (changes, finals)

    ``events``: one row per I/U/D event of one table in the batch: the data columns,
    ``_fallback`` (map), ``_op``, ``_commit_lsn``, ``_tx_ordinal`` (unique order),
    ``_k_before``, ``_k_after``, ``_unchanged`` (array) and any passthrough columns.
    ``prior_rows``: previous-state rows of the keys that need them: the data columns,
    ``_fallback``, ``_missing_toast`` and ``_pk`` (the key); or a function that returns
    them, called only when some column is open (finding the keys costs Spark jobs).
    ``truncations``: (commit_lsn, tx_ordinal) of the table's TRUNCATEs in the batch.

    ``changes``: the events, same columns in the same order (``_missing_toast`` appended if
    absent), the unchanged columns filled, ``_fallback`` with the base's texts of filled
    columns, ``_missing_toast`` the unchanged columns that stayed unknown.
    ``finals``: one row per key the batch touched: ``_k``, the data columns, ``_fallback``
    (data-column entries only), ``_missing_toast`` and ``_deleted`` (no row after the
    batch; every other column is NULL then).

    Spark jobs: one aggregate over ``events`` (which columns are open, whether keys
    change), then one per output written; only when a key-changing UPDATE leaves columns
    unchanged, one small count per pointer-jumping round (1 + ⌈log₂ of the longest chain⌉).
    ``events`` is read by the aggregate and by the window: persist it if it is costly to
    recompute. The window's result is persisted (DISK_ONLY) since both outputs read it; it
    stays cached until ``spark.catalog.clearCache()`` or the session's end.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    event_columns = list(events.columns)
    types = {f.name: f.dataType for f in events.schema.fields}
    truncs = sorted((int(lsn), int(o)) for lsn, o in truncations)
    n_truncs = len(truncs)
    op = F.col("_op")
    empty_names = F.array().cast("array<string>")
    empty_map = F.create_map().cast("map<string,string>")
    unchanged = F.coalesce(F.col("_unchanged"), empty_names)
    moved = F.coalesce((op == "U") & (F.col("_k_before") != F.col("_k_after")), F.lit(False))

    stats = (
        # An INSERT leaves a value out after a row filter only (toast.replay).
        events.filter(op.isin("U", "I"))
        .agg(
            F.array_distinct(F.flatten(F.collect_set(unchanged))).alias("open"),
            F.count_if(moved).alias("moves"),
            F.count_if(moved & (F.size(unchanged) > 0)).alias("open_moves"),
        )
        .first()
    )
    open_names = set(stats["open"] or ()) if stats is not None else set()
    moves = bool(stats and stats["moves"])
    open_moves = bool(stats and stats["open_moves"])
    # Columns of the events first, in their order; names that are no column last.
    open_cols = [c for c in event_columns if c in open_names] + sorted(
        open_names - set(event_columns)
    )
    n = len(open_cols)

    if moves:
        roles = F.when(moved, F.array(F.lit(EVENT_ROLE), F.lit(ARRIVAL_ROLE))).otherwise(
            F.array(F.lit(EVENT_ROLE))
        )
        records = events.withColumn(_ROLE, F.explode(roles))
    else:
        records = events.withColumn(_ROLE, F.lit(EVENT_ROLE))
    own_key = F.when(F.col(_ROLE) == ARRIVAL_ROLE, F.col("_k_after")).otherwise(
        F.coalesce(F.col("_k_before"), F.col("_k_after"))
    )
    records = (
        records.withColumn(_KEY, own_key)
        .withColumn(_EPOCH, _epoch(truncs))
        .withColumn(_MOVED, moved)
    )
    if not n:
        # Nothing to fill: the change rows need no shuffle; only the finals do, and only
        # the narrow columns.
        records = records.select(
            *[_col(c) for c in data_columns],
            "_fallback",
            "_op",
            "_commit_lsn",
            "_tx_ordinal",
            _ROLE,
            _KEY,
            _EPOCH,
            _MOVED,
        )
    if n and callable(prior_rows):
        prior_rows = prior_rows()
    if n and prior_rows is not None:
        prior = prior_rows.select(
            *[_col(c).cast(types[c]).alias(c) for c in open_cols if c in prior_rows.columns],
            F.col("_fallback").cast("map<string,string>").alias("_fallback"),
            F.col("_missing_toast").cast("array<string>").alias(_PMISS),
            F.col("_pk").alias(_KEY),
            F.lit(PRIOR_ROLE).alias(_ROLE),
            F.lit(0).alias(_EPOCH),
            F.lit(False).alias(_MOVED),
        )
        records = records.unionByName(prior, allowMissingColumns=True)
    if _PMISS not in records.columns:
        records = records.withColumn(_PMISS, empty_names)

    # Shuffle first, so that the slots (which repeat the open values) are built after the
    # exchange: each value crosses it once.
    records = records.repartition(_KEY)
    role = F.col(_ROLE)
    epoch = F.col(_EPOCH)
    sort = F.when(role == PRIOR_ROLE, 0).otherwise(1)
    by_key = Window.partitionBy(_KEY).orderBy(sort, "_commit_lsn", "_tx_ordinal")
    before = by_key.rowsBetween(Window.unboundedPreceding, -1)
    fallback = F.col("_fallback")

    def value_type(c: str) -> DataType:
        return types.get(c, StringType())

    def own_value(c: str) -> Column | None:
        return _col(c) if c in records.columns else None

    def provided(c: str) -> Column:
        t = value_type(c)
        text = F.element_at(fallback, F.lit(c))
        is_open = F.array_contains(unchanged, c)
        known = _slot(epoch, KNOWN, own_value(c), text, None, t)
        gone = _slot(epoch, MISSING, None, None, None, t)
        prior_state = F.when(
            F.array_contains(F.coalesce(F.col(_PMISS), empty_names), c), MISSING
        ).otherwise(KNOWN)
        return (
            F.when(role == PRIOR_ROLE, _slot(epoch, prior_state, own_value(c), text, None, t))
            .when(
                role == ARRIVAL_ROLE,
                F.when(is_open, _slot(epoch, PENDING, None, None, _position(), t)).otherwise(known),
            )
            .when(op == "I", F.when(is_open, gone).otherwise(known))
            .when((op == "D") | F.col(_MOVED), gone)
            .when(is_open, F.lit(None).cast(_slot_type(t)))
            .otherwise(known)
        )

    windowed = records.select(
        "*",
        *[
            F.last(provided(c), ignorenulls=True).over(before).alias(_base(i))
            for i, c in enumerate(open_cols)
        ],
        F.lead(F.lit(1)).over(by_key).isNull().alias(_LAST),
    )
    consumer = (role == EVENT_ROLE) & (op == "U")
    fills = []
    for i, c in enumerate(open_cols):
        base = F.col(_base(i))
        no_base = base.isNull() | (base.getField("e") != epoch)
        t = value_type(c)
        gone = _slot(epoch, MISSING, None, None, None, t)
        # An arrival is filled like its UPDATE under the old key: it waits for it.
        own_wait = _slot(epoch, PENDING, None, None, _position(), t)
        fills.append(
            F.when(
                consumer & F.array_contains(unchanged, c),
                F.when(no_base, gone).otherwise(base),
            )
            .when((role == ARRIVAL_ROLE) & F.array_contains(unchanged, c), own_wait)
            # An INSERT with a value left out: toast.replay's rule, nothing fills it.
            .when((role == EVENT_ROLE) & (op == "I") & F.array_contains(unchanged, c), gone)
            .alias(_fill(i))
        )
    keep = [c for c in windowed.columns if not c.startswith("__rw_base")]
    windowed = windowed.select(*[_col(c) for c in keep], *fills)
    windowed = windowed.persist(StorageLevel.DISK_ONLY)
    if open_moves:
        windowed = _resolve_moves(windowed, n)

    # The events' new values, fallback texts and missing columns.
    def state(i: int) -> Column:
        return F.col(_fill(i)).getField("s")

    filled = {
        c: F.when(state(i) == KNOWN, F.col(_fill(i)).getField("v")).otherwise(_col(c))
        for i, c in enumerate(open_cols)
        if c in records.columns
    }
    is_update = op == "U"
    if n:
        texts = F.array_compact(
            F.array(
                *[
                    F.when(
                        (state(i) == KNOWN) & F.col(_fill(i)).getField("f").isNotNull(),
                        F.struct(
                            F.lit(c).alias("key"), F.col(_fill(i)).getField("f").alias("value")
                        ),
                    )
                    for i, c in enumerate(open_cols)
                ]
            )
        )
        inherited = F.map_from_entries(texts)
        kept = F.map_filter(
            F.coalesce(fallback, empty_map),
            lambda k, v: ~F.array_contains(F.map_keys(inherited), k),
        )
        missing = F.array_compact(
            F.array(*[F.when(state(i) == MISSING, F.lit(c)) for i, c in enumerate(open_cols)])
        )
        new_fallback = F.when(is_update, F.map_concat(kept, inherited)).otherwise(fallback)
        new_missing = F.when(
            op.isin("U", "I"), F.filter(unchanged, lambda x: F.array_contains(missing, x))
        ).otherwise(empty_names)
    else:
        new_fallback = fallback
        new_missing = empty_names
    out = windowed.select(
        *[
            filled[c].alias(c) if c in filled else _col(c)
            for c in windowed.columns
            if c not in ("_fallback", "_missing_toast")
        ],
        new_fallback.alias("_fallback"),
        new_missing.alias("_missing_toast"),
    )

    change_columns = event_columns + (
        [] if "_missing_toast" in event_columns else ["_missing_toast"]
    )
    if n:
        changes = out.filter(role == EVENT_ROLE).select(*[_col(c) for c in change_columns])
    else:
        changes = events.select(
            *[
                (
                    F.when(is_update, F.coalesce(fallback, empty_map)).otherwise(fallback)
                    if c == "_fallback"
                    else _col(c)
                ).alias(c)
                for c in event_columns
                if c != "_missing_toast"
            ],
            empty_names.alias("_missing_toast"),
        ).select(*[_col(c) for c in change_columns])

    # One row per touched key: its last record. An arrival was filled like its UPDATE.
    data_set = list(data_columns)
    gone = (epoch < F.lit(n_truncs)) | ((role == EVENT_ROLE) & ((op == "D") | F.col(_MOVED)))
    alive = ~F.col("_deleted")
    finals = (
        out.filter(F.col(_LAST) & (role != PRIOR_ROLE))
        .withColumn("_deleted", gone)
        .select(
            F.col(_KEY).alias("_k"),
            *[F.when(alive, _col(c)).alias(c) for c in data_set],
            F.when(
                alive, F.map_filter(F.coalesce(fallback, empty_map), lambda k, v: k.isin(data_set))
            ).alias("_fallback"),
            F.when(alive, F.col("_missing_toast")).alias("_missing_toast"),
            F.col("_deleted"),
        )
    )
    return changes, finals
