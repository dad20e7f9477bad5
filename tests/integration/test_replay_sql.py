"""slotlake.replay_sql.replay_window: the hand-built cases of tests/replay_cases.py and a
randomized comparison with slotlake.toast.replay (the per-row Python oracle)."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality

from slotlake.replay_sql import replay_window
from tests.replay_cases import (
    BATCHES,
    COLS,
    HAND_BUILT,
    change_tuple,
    final_tuple,
    full_finals,
    oracle,
    random_batch,
)

# Passthrough columns in between the data columns: the output keeps this order.
EVENT_DDL = (
    "_op string, id int, a string, _old struct<id:int,a:string>, b string, n bigint, "
    "_commit_lsn bigint, _tx_ordinal bigint, _seq bigint, _k_before string, "
    "_k_after string, _unchanged array<string>, _fallback map<string,string>, "
    "_missing_toast array<string>"
)
PRIOR_DDL = (
    "id int, a string, b string, n bigint, _fallback map<string,string>, "
    "_missing_toast array<string>, _pk string"
)
FINAL_DDL = (
    "_k string, id int, a string, b string, n bigint, _fallback map<string,string>, "
    "_missing_toast array<string>, _deleted boolean"
)


def frame(spark, rows: list[dict[str, Any]], ddl: str):  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    return spark.createDataFrame([tuple(r[f] for f in schema.fieldNames()) for r in rows], schema)


def run(spark, events, priors, truncations=()):  # type: ignore[no-untyped-def]
    return replay_window(
        frame(spark, events, EVENT_DDL),
        frame(spark, priors, PRIOR_DDL),
        list(COLS),
        list(truncations),
    )


def normalized(df, order: list[str]):  # type: ignore[no-untyped-def]
    """Maps as sorted entry arrays (maps neither sort nor compare in Spark), rows in order."""
    from pyspark.sql import functions as F

    # One partition sorted in place: no range-partitioning sample job per comparison.
    entries = F.array_sort(F.map_entries("_fallback"))
    return df.withColumn("_fallback", entries).coalesce(1).sortWithinPartitions(*order)


def assert_changes(spark, actual, expected_rows):  # type: ignore[no-untyped-def]
    expected = frame(spark, expected_rows, EVENT_DDL)
    order = ["_commit_lsn", "_tx_ordinal"]
    assert actual.columns == expected.columns
    assert_df_equality(normalized(actual, order), normalized(expected, order), ignore_nullable=True)


def assert_finals(spark, actual, expected_rows):  # type: ignore[no-untyped-def]
    expected = frame(spark, full_finals(expected_rows), FINAL_DDL)
    assert actual.columns == expected.columns
    assert_df_equality(
        normalized(actual, ["_k"]), normalized(expected, ["_k"]), ignore_nullable=True
    )


# --- hand-built cases ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(HAND_BUILT))
def test_hand_built(spark, name: str) -> None:  # type: ignore[no-untyped-def]
    case = HAND_BUILT[name]()
    changes, finals = run(spark, case.events, case.priors, case.truncations)
    assert_changes(spark, changes, case.changes)
    assert_finals(spark, finals, case.finals)


# --- randomized comparison with the oracle ---------------------------------------------


def spark_result(spark, events, priors, truncations):  # type: ignore[no-untyped-def]
    changes, finals = run(spark, events, priors, truncations)
    c = [change_tuple(r.asDict()) for r in changes.collect()]
    f = [final_tuple(r.asDict()) for r in finals.collect()]
    return sorted(c, key=repr), sorted(f, key=repr)


@pytest.mark.parametrize("seed", range(len(BATCHES)))
def test_matches_oracle_on_random_batches(spark, seed: int) -> None:  # type: ignore[no-untyped-def]
    # 5 batches of 8 independent random cases: 40 cases in 5 Spark runs.
    events, priors, truncations = random_batch(seed)
    expected = oracle(events, priors, truncations)
    actual = spark_result(spark, events, priors, truncations)
    assert actual[0] == expected[0], "changes"
    assert actual[1] == expected[1], "finals"


@pytest.mark.parametrize(
    "name", ["update_fills_from_prior_row", "every_column_sent_needs_no_prior_row"]
)
def test_prior_rows_are_asked_for_only_when_a_column_is_open(spark, name: str) -> None:  # type: ignore[no-untyped-def]
    """Given as a function, the prior rows (whose keys cost Spark jobs to find) are asked
    for once a column is left unchanged, and not at all otherwise; the result is the same."""
    case = HAND_BUILT[name]()
    asked = []

    def priors():  # type: ignore[no-untyped-def]
        asked.append(True)
        return frame(spark, case.priors, PRIOR_DDL)

    changes, finals = replay_window(
        frame(spark, case.events, EVENT_DDL), priors, list(COLS), list(case.truncations)
    )
    assert_changes(spark, changes, case.changes)
    assert_finals(spark, finals, case.finals)
    open_events = [e for e in case.events if e["_op"] in ("U", "I") and e["_unchanged"]]
    assert asked == ([True] if open_events else [])
