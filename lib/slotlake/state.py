"""Per-table state (the mirror) and the Spark side of the TOAST fill.

Small functions from DataFrame to DataFrame:

* :func:`align_prior` brings the previous state version to this batch's schema.
* :func:`with_keys` adds the comparable row keys before/after each event.
* :func:`fill_and_merge_keyed` fills unchanged TOAST (joining only the prior rows that
  are needed) and yields the change rows and the new state of a table keyed by its
  replica identity.
* :func:`merge_multiset` advances a table matched by whole rows (REPLICA IDENTITY FULL,
  or no identity at all: INSERT-only tables) by counting row occurrences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from slotlake.catalog import TableCatalog
from slotlake.toast import PRIOR, lineage_roots, replay

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

STATE_META: list[tuple[str, str]] = [
    ("_fallback", "map<string,string>"),
    ("_missing_toast", "array<string>"),
]
# applyInArrow hands each group to Python whole, buffered in the JVM first: the replay
# bucket count grows with the batch so a group stays near ROWS_PER_REPLAY_BUCKET rows
# (8 fixed buckets ran the 2 GB driver heap out at 5M changes).
MIN_REPLAY_BUCKETS = 8
ROWS_PER_REPLAY_BUCKET = 50_000


def replay_buckets(expected_rows: int) -> int:
    return max(MIN_REPLAY_BUCKETS, -(-expected_rows // ROWS_PER_REPLAY_BUCKET))


def state_schema_ddl(cat: TableCatalog) -> str:
    types = dict(cat.columns)
    cols = [(n, types[n]) for n in cat.state_columns] + STATE_META
    return ", ".join(f"`{n}` {t}" for n, t in cols)


def empty_state(spark, cat: TableCatalog) -> DataFrame:  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    return spark.createDataFrame([], StructType.fromDDL(state_schema_ddl(cat)))


def align_prior(prior: DataFrame, cat: TableCatalog) -> DataFrame:
    """The previous state version, renamed/cast/trimmed to this batch's state columns."""
    from pyspark.sql import functions as F

    types = dict(cat.columns)
    existing = set(prior.columns)
    renamed_from = {new: old for old, new in cat.renames.items()}
    cols: list[Column] = []
    for name in cat.state_columns:
        source = name if name in existing else renamed_from.get(name)
        if source is None or source not in existing:
            cols.append(F.lit(None).cast(types[name]).alias(name))
        else:
            cols.append(F.col(f"`{source}`").cast(types[name]).alias(name))
    fallback = (
        F.col("_fallback") if "_fallback" in existing else F.create_map().cast("map<string,string>")
    )
    missing = (
        F.col("_missing_toast") if "_missing_toast" in existing else F.array().cast("array<string>")
    )
    return prior.select(*cols, fallback.alias("_fallback"), missing.alias("_missing_toast"))


def _key_json(
    values: Sequence[Column], names: Sequence[str], fallback: Column, prefix: str
) -> Column:
    from pyspark.sql import functions as F

    # A value kept as text (infinite timestamp, NaN numeric) is NULL in its typed column:
    # the text must be part of the key or two such rows would collide.
    parts = [v.alias(n) for v, n in zip(values, names, strict=True)]
    parts += [F.element_at(fallback, F.lit(prefix + n)).alias(f"~{n}") for n in names]
    return F.to_json(F.struct(*parts))


def state_key(df: DataFrame, keys: Sequence[str]) -> Column:
    from pyspark.sql import functions as F

    return _key_json([F.col(f"`{k}`") for k in keys], keys, F.col("_fallback"), "")


def with_keys(events: DataFrame, keys: Sequence[str]) -> DataFrame:
    from pyspark.sql import functions as F

    after = state_key(events, keys)
    old = _key_json([F.col("_old").getField(k) for k in keys], keys, F.col("_fallback"), "_old.")
    op = F.col("_op")
    return events.withColumn("_k_after", F.when(op.isin("I", "U"), after)).withColumn(
        "_k_before",
        F.when((op == "D") | ((op == "U") & F.col("_old_kind").isNotNull()), old).when(
            op == "U", after
        ),
    )


def fill_and_merge_keyed(
    events: DataFrame,
    prior: DataFrame,
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    expected_rows: int = 0,
) -> tuple[DataFrame, DataFrame]:
    """(change rows with TOAST filled, new state) of a table keyed by its replica identity.

    ``expected_rows`` (the table's DML rows in the batch) sizes the replay buckets.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    spark = events.sparkSession
    keys = list(cat.key_columns)
    key_change = (F.col("_op") == "U") & (F.col("_k_before") != F.col("_k_after"))
    # DISK_ONLY: a MEMORY_AND_DISK block that spilled is read back into one heap buffer,
    # which is what ran the driver out of heap on multi-million-row batches.
    events = with_keys(events, keys).persist(StorageLevel.DISK_ONLY)
    stats = events.agg(
        F.sum(F.when(key_change, 1).otherwise(0)).alias("key_changes"),
        F.sum(F.when(F.size("_unchanged") > 0, 1).otherwise(0)).alias("open_toast"),
    ).first()
    # Lineage: a key change links the old key and the new one, so one row's events share
    # a replay bucket. Key changes are rare; collecting their edges is cheap.
    edges = []
    if stats is not None and stats["key_changes"]:
        edges = [
            (r[0], r[1])
            for r in events.filter(key_change).select("_k_before", "_k_after").collect()
        ]
    own_key = F.coalesce(F.col("_k_before"), F.col("_k_after"))
    if edges:
        roots = lineage_roots(edges)
        root_df = spark.createDataFrame(
            list(roots.items()),
            StructType([StructField("_rk", StringType()), StructField("_root", StringType())]),
        )
    else:
        root_df = None
    events = _with_lineage(events, own_key, root_df)
    open_toast = bool(stats is not None and stats["open_toast"])

    # Prior rows only for the keys whose events still have unchanged TOAST open.
    prior_k = prior.withColumn("_pk", state_key(prior, keys))
    if open_toast:
        needed = (
            events.filter(F.size("_unchanged") > 0)
            .select(F.col("_k_before").alias("_nk"))
            .distinct()
        )
        prior_rows = prior_k.join(needed, prior_k["_pk"] == needed["_nk"], "left_semi")
    else:
        prior_rows = prior_k.limit(0)
    prior_rows = _with_lineage(prior_rows, F.col("_pk"), root_df)
    as_events = prior_rows.select(
        *[F.col(f"`{c}`") for c in cat.state_columns],
        F.col("_fallback"),
        F.col("_missing_toast"),
        F.lit(PRIOR).alias("_op"),
        F.col("_pk").alias("_k_after"),
        F.col("_gid"),
    )
    combined = events.unionByName(as_events, allowMissingColumns=True)
    combined = combined.withColumn(
        "_bucket", F.pmod(F.xxhash64("_gid"), F.lit(replay_buckets(expected_rows)))
    )

    out_schema = StructType(
        [f for f in events.schema.fields if f.name != "_gid"]
        + [StructField("_kind", StringType()), StructField("_k", StringType())]
    )
    data_columns = list(cat.state_columns)
    fn = _replay_fn(data_columns, list(truncations), out_schema)
    out = combined.groupBy("_bucket").applyInArrow(fn, out_schema)
    out = out.persist(StorageLevel.DISK_ONLY)
    changes = out.filter(F.col("_kind") == "E").drop("_kind", "_k", "_k_before", "_k_after")
    final_rows = out.filter(F.col("_kind") == "S").select(
        *[F.col(f"`{c}`") for c in data_columns], "_fallback", "_missing_toast"
    )
    if truncations:
        state = final_rows
    else:
        touched = out.filter(F.col("_kind").isin("S", "K")).select("_k")
        untouched = prior_k.join(touched, prior_k["_pk"] == touched["_k"], "left_anti").drop("_pk")
        state = untouched.unionByName(final_rows)
    return changes, state


def _with_lineage(df: DataFrame, key: Column, roots: DataFrame | None) -> DataFrame:
    """``_gid``: the row's lineage root when a key change links ``key`` to one, else ``key``."""
    from pyspark.sql import functions as F

    if roots is None:
        return df.withColumn("_gid", key)
    joined = df.join(F.broadcast(roots), key == F.col("_rk"), "left")
    return joined.withColumn("_gid", F.coalesce(F.col("_root"), key)).drop("_rk", "_root")


def _replay_fn(data_columns: list[str], truncations: list[tuple[int, int]], out_schema):  # type: ignore[no-untyped-def]
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(out_schema, timezone="UTC", prefers_large_types=False)

    def fn(table):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        rows = table.to_pylist()
        out = []
        for kind, row in replay(rows, data_columns, truncations):
            row["_kind"] = kind
            out.append(row)
        # from_pylist takes the schema's fields from each dict and fills absent ones with null.
        return pa.Table.from_pylist(out, schema=arrow_schema)

    return fn


def merge_multiset(
    events: DataFrame, prior: DataFrame, cat: TableCatalog, truncations: Sequence[tuple[int, int]]
) -> DataFrame:
    """New state of a table whose rows are matched by their whole value.

    Every INSERT adds one occurrence of its row, a DELETE removes one occurrence of its old
    row, an UPDATE does both; a TRUNCATE drops the prior state and every event before it.
    Occurrences are counted per distinct row, so duplicates (no unique key) stay exact.
    """
    from pyspark.sql import functions as F

    data = list(cat.state_columns)
    if truncations:
        last = max(truncations)
        events = events.filter(
            (F.col("_commit_lsn") > last[0])
            | ((F.col("_commit_lsn") == last[0]) & (F.col("_tx_ordinal") > last[1]))
        )
        base = None
    else:
        base = prior.select(*[F.col(f"`{c}`") for c in data], "_fallback", F.lit(1).alias("_n"))

    def new_image() -> list[Column]:
        fb = F.map_filter("_fallback", lambda k, v: ~k.startswith("_old."))
        return [F.col(f"`{c}`") for c in data] + [fb.alias("_fallback")]

    def old_image() -> list[Column]:
        fb = F.map_filter("_fallback", lambda k, v: k.startswith("_old."))
        fb = F.transform_keys(fb, lambda k, v: F.substring(k, 6, 1 << 20))
        return [F.col("_old").getField(c).alias(c) for c in data] + [fb.alias("_fallback")]

    adds = events.filter(F.col("_op").isin("I", "U")).select(*new_image(), F.lit(1).alias("_n"))
    removes = events.filter(F.col("_op").isin("U", "D")).select(*old_image(), F.lit(-1).alias("_n"))
    combined = adds.unionByName(removes)
    if base is not None:
        combined = base.unionByName(combined)
    # Maps are not groupable: group on their JSON text and parse it back.
    grouped = (
        combined.withColumn(
            "_fb", F.to_json(F.map_from_entries(F.array_sort(F.map_entries("_fallback"))))
        )
        .groupBy(*[F.col(f"`{c}`") for c in data], "_fb")
        .agg(F.sum("_n").alias("_n"))
        .filter(F.col("_n") > 0)
    )
    return grouped.select(
        *[F.col(f"`{c}`") for c in data],
        F.from_json("_fb", "map<string,string>").alias("_fallback"),
        F.array().cast("array<string>").alias("_missing_toast"),
        F.explode(F.sequence(F.lit(1), F.col("_n"))).alias("_copy"),
    ).drop("_copy")
