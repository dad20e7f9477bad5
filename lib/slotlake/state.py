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

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slotlake.catalog import TableCatalog
from slotlake.ddltypes import parse_struct
from slotlake.decode import ddl_columns
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
# The TOAST fill and each key's final row: Spark SQL window functions (slotlake.replay_sql),
# or the per-row Python reference (slotlake.toast.replay) with SLOTLAKE_REPLAY=python.
REPLAY = os.environ.get("SLOTLAKE_REPLAY", "window")
ROWS_PER_REPLAY_BUCKET = 50_000


def replay_buckets(expected_rows: int) -> int:
    return max(MIN_REPLAY_BUCKETS, -(-expected_rows // ROWS_PER_REPLAY_BUCKET))


def state_schema_ddl(cat: TableCatalog) -> str:
    types = dict(cat.columns)
    cols = [(n, types[n]) for n in cat.state_columns] + STATE_META
    return ddl_columns(cols)


def empty_state(spark, cat: TableCatalog) -> DataFrame:  # type: ignore[no-untyped-def]

    return spark.createDataFrame([], parse_struct(state_schema_ddl(cat)))


def align_prior(prior: DataFrame, cat: TableCatalog, lake: bool = True) -> DataFrame:
    """The previous state version, renamed/cast/trimmed to this batch's state columns
    (``lake``: as :meth:`TableCatalog.prior_name`)."""
    from pyspark.sql import functions as F

    types = dict(cat.columns)
    existing = set(prior.columns)
    cols: list[Column] = []
    for name in cat.state_columns:
        source = cat.prior_name(name, existing, lake)
        if source not in existing:
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


def _key_struct(
    values: Sequence[Column], names: Sequence[str], fallback: Column, prefix: str
) -> Column:
    from pyspark.sql import functions as F

    # A value kept as text (infinite timestamp, NaN numeric) is NULL in its typed column:
    # the text must be part of the key or two such rows would collide.
    parts = [v.alias(n) for v, n in zip(values, names, strict=True)]
    parts += [F.element_at(fallback, F.lit(prefix + n)).alias(f"~{n}") for n in names]
    return F.struct(*parts)


# Spark's to_json writes timestamps to the millisecond: two keys a microsecond apart
# would share one key text (one row's final lost, another's TOAST taken).
_KEY_JSON = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}


def key_json(key: Column | str) -> Column:
    """A key struct as comparable text, exact to the microsecond."""
    from pyspark.sql import functions as F

    return F.to_json(key, _KEY_JSON)


def state_key(df: DataFrame, keys: Sequence[str]) -> Column:
    from pyspark.sql import functions as F

    return key_json(_key_struct([F.col(f"`{k}`") for k in keys], keys, F.col("_fallback"), ""))


def with_keys(events: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Adds the row's key before/after each event: typed (``_kb``/``_ka`` structs, what the
    MERGE matches on) and as comparable JSON text (``_k_before``/``_k_after``)."""
    from pyspark.sql import functions as F

    after = _key_struct([F.col(f"`{k}`") for k in keys], keys, F.col("_fallback"), "")
    old = _key_struct([F.col("_old").getField(k) for k in keys], keys, F.col("_fallback"), "_old.")
    op = F.col("_op")
    return (
        events.withColumn("_ka", F.when(op.isin("I", "U"), after))
        .withColumn(
            "_kb",
            F.when((op == "D") | ((op == "U") & F.col("_old_kind").isNotNull()), old).when(
                op == "U", after
            ),
        )
        .withColumn("_k_after", key_json("_ka"))
        .withColumn("_k_before", key_json("_kb"))
    )


# Above this many keys with open TOAST, the prior rows are found by a semi-join (a scan of
# the table) instead of a key filter that Delta's data skipping can prune files with.
MAX_FILTER_KEYS = 20_000


def prior_rows_for(prior: DataFrame, needed: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The prior state's rows of the keys in ``needed`` (a ``_kb`` struct column), with ``_pk``.

    Few keys (the usual case) become an ``IN`` filter on the first key column, which Delta's
    data skipping (per-file min/max) and Parquet's row-group statistics prune with, so the
    read costs what the keys cost, not what the table weighs; the semi-join on the whole
    key then removes the false positives.
    """
    from pyspark.sql import functions as F

    wanted = needed.select(key_json("_kb").alias("_nk"), "_kb").dropDuplicates(["_nk"])
    sample = wanted.select(F.col("_kb").getField(keys[0]).alias("v")).limit(MAX_FILTER_KEYS + 1)
    values = [r["v"] for r in sample.collect()]
    rows = prior
    if len(values) <= MAX_FILTER_KEYS:
        if not values:
            return prior.limit(0).withColumn("_pk", state_key(prior, keys))
        present = [v for v in values if v is not None]
        first = F.col(f"`{keys[0]}`")
        cond = first.isin(present) if present else F.lit(False)
        if len(present) < len(values):
            cond = cond | first.isNull()
        rows = prior.filter(cond)
    rows = rows.withColumn("_pk", state_key(rows, keys))
    return rows.join(F.broadcast(wanted.select("_nk")), F.col("_pk") == F.col("_nk"), "left_semi")


def fill_keyed(
    events: DataFrame,
    prior: DataFrame,
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    expected_rows: int = 0,
    persisted: list[DataFrame] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """(change rows with TOAST filled, final row of every key the batch touched).

    ``prior`` is the table's state before the batch (aligned to this batch's columns);
    only the rows of keys whose events still have unchanged TOAST open are read from it.
    The finals carry ``_key`` (the typed key struct the MERGE matches on) and ``_deleted``
    (the key has no row after the batch). ``expected_rows`` sizes the replay buckets;
    frames persisted on the way are appended to ``persisted`` for the caller to release.
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
    if persisted is not None:
        persisted.append(events)
    # Lineage (Python replay only: the window replay follows key changes itself): a key
    # change links the old key and the new one, so one row's events share a replay bucket.
    # Key changes are rare; collecting their edges is cheap.
    edges = []
    if REPLAY != "window":
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

    def prior_rows() -> DataFrame:
        # No count first: finding the keys with open TOAST is the one job, and none → no read.
        return prior_rows_for(prior, events.filter(F.size("_unchanged") > 0), keys)

    data_columns = list(cat.state_columns)
    if REPLAY == "window":
        from slotlake.replay_sql import replay_window

        # Asked for only when the replay's first aggregate finds a column open: a batch
        # without unchanged TOAST (most) spends no job on finding keys it would not read.
        changes, finals = replay_window(
            events.drop("_gid"), prior_rows, data_columns, list(truncations)
        )
        changes = changes.drop("_k_before", "_k_after", "_ka", "_kb")
    else:
        changes, finals = _replay_python(
            events, prior_rows(), cat, truncations, expected_rows, root_df, persisted
        )
    keymap = (
        events.select(F.col("_k_after").alias("_k"), F.col("_ka").alias("_key"))
        .unionByName(events.select(F.col("_k_before").alias("_k"), F.col("_kb").alias("_key")))
        .filter(F.col("_k").isNotNull())
        .dropDuplicates(["_k"])
    )
    finals = finals.join(keymap, "_k", "left")
    return changes, finals


def _replay_python(
    events: DataFrame,
    prior_rows: DataFrame,
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    expected_rows: int,
    root_df: DataFrame | None,
    persisted: list[DataFrame] | None,
) -> tuple[DataFrame, DataFrame]:
    """The per-row Python replay (:func:`slotlake.toast.replay`) per lineage bucket: the
    reference the window replay is tested against, kept selectable (SLOTLAKE_REPLAY=python)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

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
    if persisted is not None:
        persisted.append(out)
    changes = out.filter(F.col("_kind") == "E").drop(
        "_kind", "_k", "_k_before", "_k_after", "_ka", "_kb"
    )
    finals = out.filter(F.col("_kind").isin("S", "K")).select(
        *[F.col(f"`{c}`") for c in data_columns],
        "_fallback",
        "_missing_toast",
        "_k",
        (F.col("_kind") == "K").alias("_deleted"),
    )
    return changes, finals


def apply_finals(
    prior: DataFrame, finals: DataFrame, cat: TableCatalog, truncated: bool
) -> DataFrame:
    """The new state as a DataFrame: what the Delta MERGE of ``finals`` produces.

    Untouched prior rows stay, touched keys take their final row or go. Used by tests and
    by tools that want the state without writing it.
    """
    from pyspark.sql import functions as F

    keys = list(cat.key_columns)
    kept = finals.filter(~F.col("_deleted")).select(
        *[F.col(f"`{c}`") for c in cat.state_columns], "_fallback", "_missing_toast"
    )
    if truncated:
        return kept
    prior_k = prior.withColumn("_pk", state_key(prior, keys))
    touched = finals.select("_k")
    untouched = prior_k.join(touched, prior_k["_pk"] == touched["_k"], "left_anti").drop("_pk")
    return untouched.unionByName(kept)


def fill_and_merge_keyed(
    events: DataFrame,
    prior: DataFrame,
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    expected_rows: int = 0,
) -> tuple[DataFrame, DataFrame]:
    """(change rows with TOAST filled, the whole new state) of a keyed table, as DataFrames."""
    changes, finals = fill_keyed(events, prior, cat, truncations, expected_rows)
    return changes, apply_finals(prior, finals, cat, bool(truncations))


def merge_condition(cat: TableCatalog) -> str:
    """MERGE ON: the replica identity, null-safe, plus the text of a key kept as text
    where the key's type can keep one."""
    from slotlake.delta import quote, sql_string

    types = dict(cat.columns)
    parts = []
    for k in cat.key_columns:
        q = quote(k)
        parts.append(f"t.{q} <=> s._key.{q}")
        if types.get(k) != "string" and cat.may_fall_back(k):
            parts.append(
                f"try_element_at(t._fallback, {sql_string(k)}) <=> s._key.{quote('~' + k)}"
            )
    return " AND ".join(parts)


def arrow_merge_predicate(cat: TableCatalog) -> str:
    """:func:`merge_condition` in the SQL of ``deltalake``'s MERGE (DataFusion)."""
    from slotlake.delta import sql_ident

    def lit(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    types = dict(cat.columns)
    parts = []
    for k in cat.key_columns:
        parts.append(f"(t.{sql_ident(k)} IS NOT DISTINCT FROM get_field(s._key, {lit(k)}))")
        if types.get(k) != "string" and cat.may_fall_back(k):
            parts.append(
                f"(t._fallback[{lit(k)}] IS NOT DISTINCT FROM get_field(s._key, {lit('~' + k)}))"
            )
    return " AND ".join(parts)


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


def sorted_json(m: Column) -> Column:
    """A map's entries sorted by key, as JSON text: maps are not groupable, so multisets
    are grouped on this (the form :func:`multiset_condition` compares)."""
    from pyspark.sql import functions as F

    return F.to_json(F.map_from_entries(F.array_sort(F.map_entries(m))))


def multiset_delta(
    events: DataFrame, cat: TableCatalog, truncations: Sequence[tuple[int, int]]
) -> DataFrame:
    """Net change of each distinct row of a multiset table: data columns, ``_fallback``,
    ``_fbj`` (its sorted JSON, what the MERGE compares) and ``_d`` (copies added − removed).

    With a TRUNCATE in the batch only the events after the last one count, and the result
    is the table's whole content (the caller overwrites).
    """
    from pyspark.sql import functions as F

    data = list(cat.state_columns)
    if truncations:
        last = max(truncations)
        events = events.filter(
            (F.col("_commit_lsn") > last[0])
            | ((F.col("_commit_lsn") == last[0]) & (F.col("_tx_ordinal") > last[1]))
        )
    new_fb = F.map_filter("_fallback", lambda k, v: ~k.startswith("_old."))
    old_fb = F.transform_keys(
        F.map_filter("_fallback", lambda k, v: k.startswith("_old.")),
        lambda k, v: F.substring(k, 6, 1 << 20),
    )
    adds = events.filter(F.col("_op").isin("I", "U")).select(
        *[F.col(f"`{c}`") for c in data], new_fb.alias("_fallback"), F.lit(1).alias("_n")
    )
    removes = events.filter(F.col("_op").isin("U", "D")).select(
        *[F.col("_old").getField(c).alias(c) for c in data],
        old_fb.alias("_fallback"),
        F.lit(-1).alias("_n"),
    )
    grouped = (
        adds.unionByName(removes)
        .withColumn("_fbj", sorted_json(F.col("_fallback")))
        .groupBy(*[F.col(f"`{c}`") for c in data], "_fbj")
        .agg(F.sum("_n").alias("_d"))
        .filter(F.col("_d") != 0)
    )
    return grouped.select(
        *[F.col(f"`{c}`") for c in data],
        F.from_json("_fbj", "map<string,string>").alias("_fallback"),
        "_fbj",
        "_d",
    )


def unique_rows(delta: DataFrame, cat: TableCatalog, key: Sequence[str]) -> DataFrame:
    """Each key's final row of a multiset unique on ``key`` (:mod:`slotlake.unique_multiset`)
    from its batch's net change by value (:func:`multiset_delta`): the state's columns,
    ``_key`` (as :func:`merge_condition` of the table keyed by ``key`` matches it),
    ``_deleted`` (the key's row removed, none added), ``_fresh`` (a row added, none
    removed: the key must not be live in the state) and ``_bad`` (more than one copy of
    the key added or removed, or a NULL in it: the batch does not keep the state unique,
    as :func:`slotlake.snapshot.unique_state_rows` counts it).

    The net change is what the state ends with whatever the order of the batch's events:
    with each key at most once in the state before, at most one row removed and one added
    by the key leaves it at most once after, the fresh ones checked by the MERGE."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = [F.col(f"`{k}`") for k in key]
    by_key = Window.partitionBy(*keys)
    d = F.col("_d")
    ranked = delta.select(
        "*",
        F.sum(F.greatest(d, F.lit(0))).over(by_key).alias("_adds"),
        F.sum(F.greatest(-d, F.lit(0))).over(by_key).alias("_removes"),
        # The added row is the key's final one; a removed one stands for a deletion.
        F.row_number().over(by_key.orderBy(d.desc())).alias("_rank"),
    )
    return ranked.filter(F.col("_rank") == 1).select(
        *[F.col(f"`{c}`") for c in cat.state_columns],
        "_fallback",
        _key_struct(keys, list(key), F.col("_fallback"), "").alias("_key"),
        (F.col("_adds") == 0).alias("_deleted"),
        (F.col("_removes") == 0).alias("_fresh"),
        functools.reduce(
            lambda a, b: a | b,
            [k.isNull() for k in keys],
            (F.col("_adds") > 1) | (F.col("_removes") > 1),
        ).alias("_bad"),
    )


def multiset_condition(cat: TableCatalog) -> str:
    """MERGE ON for a multiset: every column null-safe equal, and the same value texts."""
    from slotlake.delta import quote

    parts = [f"t.{quote(c)} <=> s.{quote(c)}" for c in cat.state_columns]
    parts.append("to_json(map_from_entries(array_sort(map_entries(t._fallback)))) <=> s._fbj")
    return " AND ".join(parts)


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
        combined.withColumn("_fb", sorted_json(F.col("_fallback")))
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
