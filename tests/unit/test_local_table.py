"""slotlake.local_table: the Arrow pieces of a small table's batch on the driver (no Spark)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from slotlake.catalog import TableCatalog
from slotlake.delta import delta_schema, ensure_local, needs_evolution
from slotlake.local_table import (
    DECODER_COLUMNS,
    align_prior_arrow,
    conform_arrow,
    missing_toast_rows,
    prior_reader,
    read_raw_dml,
)
from slotlake.raw import RAW_SCHEMA


def _raw_rows(rows: list[tuple[int, str, int | None]]) -> pa.Table:
    n = len(rows)
    return pa.table(
        {
            "seq": [r[0] for r in rows],
            "lsn": [100 + r[0] for r in rows],
            "xid": [7] * n,
            "data": [b"payload-%d" % r[0] for r in rows],
            "msg_type": [r[1] for r in rows],
            "rel_oid": [r[2] for r in rows],
            "commit_lsn": [500] * n,
            "commit_ts": [None] * n,
            "tx_ordinal": [r[0] for r in rows],
            "stream_xid": [None] * n,
        },
        schema=RAW_SCHEMA,
    )


def test_read_raw_dml_splits_one_pass_by_table(tmp_path: Path) -> None:
    pq.write_table(
        _raw_rows([(1, "B", None), (2, "R", 10), (3, "I", 10), (4, "U", 20), (5, "C", None)]),
        tmp_path / "part-0.parquet",
    )
    pq.write_table(
        _raw_rows([(6, "D", 10), (7, "I", 30), (8, "T", 10), (9, "U", 11)]),
        tmp_path / "part-1.parquet",
    )
    out = read_raw_dml(str(tmp_path), {"a": {10, 11}, "b": {20}, "c": {40}})
    assert out["a"].column("seq").to_pylist() == [3, 6, 9]
    assert out["b"].column("seq").to_pylist() == [4]
    assert out["c"].num_rows == 0
    assert out["c"].column_names == DECODER_COLUMNS
    assert out["a"].column_names == DECODER_COLUMNS


def test_read_raw_dml_splits_a_renamed_tables_oid_by_seq(tmp_path: Path) -> None:
    """Oid 10 is ``a`` up to its Relation message as ``b`` (seq 5), then ``b``; the rows
    of a span whose table is not asked for (``c``'s, from seq 9) are left out."""
    rows = [(2, "R", 10), (3, "I", 10), (4, "I", 20), (5, "R", 10), (6, "U", 10)]
    pq.write_table(_raw_rows(rows), tmp_path / "part-0.parquet")
    pq.write_table(
        _raw_rows([(7, "D", 10), (9, "R", 10), (10, "I", 10)]), tmp_path / "part-1.parquet"
    )
    shared = {"a": {10: [(-1, 5)]}, "b": {10: [(5, 9)]}, "c": {10: [(9, 1 << 62)]}}
    out = read_raw_dml(str(tmp_path), {"a": {10, 20}, "b": {10}}, shared=shared)
    assert out["a"].column("seq").to_pylist() == [3, 4]
    assert out["b"].column("seq").to_pylist() == [6, 7]
    # Only b asked: a's rows of oid 10 go too.
    only_b = read_raw_dml(str(tmp_path), {"b": {10}}, shared={"b": shared["b"]})
    assert only_b["b"].column("seq").to_pylist() == [6, 7]


def test_read_raw_dml_gives_up_the_biggest_tables_past_max_bytes(tmp_path: Path) -> None:
    # Payloads are b"payload-<seq>": 9 bytes for seq < 10, 10 for 10..99.
    rows = [(i, "I", 10) for i in range(1, 9)]  # a: 8 × 9 = 72 bytes
    rows += [(i, "U", 20) for i in range(10, 13)]  # b: 3 × 10 = 30 bytes
    rows += [(13, "D", 30)]  # c: 10 bytes
    pq.write_table(_raw_rows(rows[:6]), tmp_path / "part-0.parquet")
    pq.write_table(_raw_rows(rows[6:]), tmp_path / "part-1.parquet")
    oids = {"a": {10}, "b": {20}, "c": {30}}
    assert set(read_raw_dml(str(tmp_path), oids, max_bytes=112)) == {"a", "b", "c"}
    # a passes 40 while the first file is read and is given up; b and c (40) stay whole.
    out = read_raw_dml(str(tmp_path), oids, max_bytes=40)
    assert set(out) == {"b", "c"}
    assert out["b"].column("seq").to_pylist() == [10, 11, 12]
    # Under 40, b (the bigger of the two left) goes too; c stays.
    out = read_raw_dml(str(tmp_path), oids, max_bytes=35)
    assert set(out) == {"c"}
    assert out["c"].column("seq").to_pylist() == [13]
    assert read_raw_dml(str(tmp_path), oids, max_bytes=0) == {}


def test_conform_pads_missing_columns_and_old_struct() -> None:
    old = pa.struct([("id", pa.int64())])
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),
            "_old": pa.array([{"id": 5}, None], old),
        }
    )
    target = pa.schema(
        [
            ("id", pa.int64()),
            ("gone", pa.string()),
            ("_old", pa.struct([("id", pa.int64()), ("gone", pa.string())])),
        ]
    )
    out = conform_arrow(table, target)
    assert out.schema == target
    assert out.to_pylist() == [
        {"id": 1, "gone": None, "_old": {"id": 5, "gone": None}},
        {"id": 2, "gone": None, "_old": None},
    ]


def _cat(**kw: object) -> TableCatalog:
    base = {
        "name": "public.t",
        "columns": [("id", "bigint"), ("name", "string")],
        "state_columns": ["id", "name"],
        "key_columns": ["id"],
    }
    base.update(kw)
    return TableCatalog(**base)  # type: ignore[arg-type]


STATE = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("_fallback", pa.map_(pa.string(), pa.string())),
        ("_missing_toast", pa.list_(pa.string())),
    ]
)


def test_align_prior_follows_renames() -> None:
    prior = pa.table(
        {
            "id": [1],
            "label": ["x"],
            "dropped": [True],
            "_fallback": pa.array([[]], pa.map_(pa.string(), pa.string())),
            "_missing_toast": pa.array([[]], pa.list_(pa.string())),
        }
    )
    out = align_prior_arrow(prior, _cat(renames={"label": "name"}), STATE)
    assert out.schema == STATE
    assert out.to_pylist() == [{"id": 1, "name": "x", "_fallback": [], "_missing_toast": []}]


def _state_table(path: Path, ids: pa.Array) -> None:
    write_deltalake(
        str(path),
        pa.table(
            {
                "id": ids,
                "name": [f"n{i}" for i in range(len(ids))],
                "_fallback": pa.array([[]] * len(ids), pa.map_(pa.string(), pa.string())),
                "_missing_toast": pa.array([[]] * len(ids), pa.list_(pa.string())),
            }
        ),
    )


def test_prior_reader_filters_by_first_key(tmp_path: Path) -> None:
    _state_table(tmp_path / "s", pa.array([1, 2, 3, None], pa.int64()))
    read = prior_reader(str(tmp_path / "s"), 0, _cat(), STATE)
    assert sorted(read([1, 3], False).column("id").to_pylist()) == [1, 3]
    assert sorted(read([2], True).column("id").to_pylist(), key=str) == [2, None]
    assert read([], False).num_rows == 0
    # No recorded state version: nothing to read.
    assert prior_reader(str(tmp_path / "s"), None, _cat(), STATE)([1], False).num_rows == 0


def test_prior_reader_quotes_text_keys(tmp_path: Path) -> None:
    _state_table(tmp_path / "s", pa.array(["a'b", "c"]))
    state = STATE.set(0, pa.field("id", pa.string()))
    cat = _cat(columns=[("id", "string"), ("name", "string")])
    assert prior_reader(str(tmp_path / "s"), 0, cat, state)(["a'b"], False).num_rows == 1


def test_prior_reader_filters_other_key_types_in_arrow(tmp_path: Path) -> None:
    dec = pa.decimal128(12, 2)
    _state_table(tmp_path / "s", pa.array([Decimal("1.50"), Decimal("2.00")], dec))
    state = STATE.set(0, pa.field("id", dec))
    cat = _cat(columns=[("id", "decimal(12,2)"), ("name", "string")])
    rows = prior_reader(str(tmp_path / "s"), 0, cat, state)([Decimal("2.00")], False)
    assert rows.column("id").to_pylist() == [Decimal("2.00")]


_TYPES = {"bigint": LongType(), "int": IntegerType(), "string": StringType()}


def _struct(ddl: str) -> StructType:
    """'name type, …' without a JVM (StructType.fromDDL needs one)."""
    pairs = [part.split() for part in ddl.split(",")]
    return StructType([StructField(n, _TYPES[t]) for n, t in pairs])


@pytest.mark.parametrize(
    ("want", "renames", "drop", "ready"),
    [
        ("id bigint, name string", {}, True, True),
        ("id bigint, name string, extra int", {}, True, False),  # ADD COLUMN
        ("id bigint", {}, True, False),  # DROP COLUMN (state)
        ("id bigint", {}, False, True),  # the change log keeps dropped columns
        ("id bigint, label string", {"name": "label"}, True, False),  # RENAME
        ("id int, name string", {}, True, False),  # type change
    ],
)
def test_needs_evolution_matches_ensure_table(
    tmp_path: Path, want: str, renames: dict[str, str], drop: bool, ready: bool
) -> None:
    path = str(tmp_path / "t")
    assert delta_schema(path) is None  # no table yet
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64()), "name": ["x"]}))
    current = delta_schema(path)
    assert current is not None and current.fieldNames() == ["id", "name"]
    assert needs_evolution(current, _struct(want), renames, drop) is not ready

    class AskedForSpark(Exception):
        pass

    def spark() -> None:
        raise AskedForSpark

    # ensure_local asks for Spark exactly when the table's columns must change.
    if ready:
        assert ensure_local(spark, path, path, _struct(want), renames, drop) == current  # type: ignore[arg-type]
    else:
        with pytest.raises(AskedForSpark):
            ensure_local(spark, path, path, _struct(want), renames, drop)  # type: ignore[arg-type]


def test_ensure_local_creates_a_new_table_without_spark(tmp_path: Path) -> None:
    def spark() -> None:
        raise AssertionError("a new table needs no Spark")

    path = str(tmp_path / "t")
    got = ensure_local(spark, path, path, _struct("id bigint, name string"))  # type: ignore[arg-type]
    assert got.fieldNames() == ["id", "name"]
    assert delta_schema(path) == got


def test_in_commit_order_sorts_only_when_needed() -> None:
    from slotlake.local_table import in_commit_order

    ordered = pa.table(
        {"_commit_lsn": [1, 1, 2, 5], "_tx_ordinal": [0, 1, 0, 0], "v": ["a", "b", "c", "d"]}
    )
    assert in_commit_order(ordered) is ordered  # no copy
    shuffled = pa.table(
        {"_commit_lsn": [5, 1, 2, 1], "_tx_ordinal": [0, 1, 0, 0], "v": ["d", "b", "c", "a"]}
    )
    assert in_commit_order(shuffled).column("v").to_pylist() == ["a", "b", "c", "d"]
    ties = pa.table({"_commit_lsn": [2, 2], "_tx_ordinal": [3, 1], "v": ["y", "x"]})
    assert in_commit_order(ties).column("v").to_pylist() == ["x", "y"]
    nulls = pa.table(
        {
            "_commit_lsn": pa.array([3, None, 1], pa.int64()),
            "_tx_ordinal": [0, 0, 0],
            "v": [3, 0, 1],
        }
    )
    assert in_commit_order(nulls).column("v").to_pylist() == [1, 3, 0]  # nulls last
    empty = ordered.slice(0, 0)
    assert in_commit_order(empty) is empty


def test_missing_toast_rows_counts_changes_naming_a_column_from_a_commit_on() -> None:
    changes = pa.table(
        {
            "_commit_lsn": pa.array([10, 20, 20, 30, 40], pa.int64()),
            "_missing_toast": pa.array(
                [["big"], [], None, ["big", "doc"], ["doc"]], pa.list_(pa.string())
            ),
        }
    )
    assert missing_toast_rows(changes) == 3
    # From a copy's consistent point on: the rows before it were filled from before.
    assert missing_toast_rows(changes, since=30) == 2
    assert missing_toast_rows(changes, since=41) == 0
    assert missing_toast_rows(changes.slice(0, 0)) == 0
