"""Delta tables the driver creates (bootstrap's small tables): their first log entry, and
when an existing table needs Spark's ALTER TABLE. (That Spark creates the very same
tables is checked against Spark itself in tests/integration/test_bootstrap_small.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql.types import (
    ArrayType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from slotlake.delta import create_on_driver, delta_schema, local_version, needs_evolution


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])  # type: ignore[arg-type]


OLD = _schema(("id", LongType()), ("a", StringType()), ("c", StringType()))
CURRENT = _schema(("id", LongType()), ("a", StringType()), ("_old", OLD))


def test_needs_evolution_follows_what_ensure_table_would_change() -> None:
    same_image = _schema(("id", LongType()), ("a", StringType()))
    # The old image keeps columns the table no longer has: not a difference.
    assert not needs_evolution(
        CURRENT, _schema(("id", LongType()), ("a", StringType()), ("_old", same_image)), {}, False
    )
    new_field = _schema(
        ("id", LongType()), ("a", StringType()), ("_old", _schema(("d", LongType())))
    )
    assert needs_evolution(CURRENT, new_field, {}, False)
    retyped = _schema(("id", LongType()), ("a", LongType()), ("_old", _schema(("a", LongType()))))
    assert needs_evolution(CURRENT, retyped, {}, False)
    fewer = _schema(("id", LongType()), ("_old", _schema(("id", LongType()))))
    assert not needs_evolution(CURRENT, fewer, {}, False)
    assert needs_evolution(CURRENT, fewer, {}, True)


def test_create_on_driver_writes_sparks_first_entry(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    nested = _schema(("x", TimestampNTZType()), ("y", ArrayType(_schema(("z", LongType())))))
    schema = _schema(
        ("id", LongType()),
        ("m", MapType(StringType(), StringType())),
        ("_old", nested),
    )
    assert local_version(path) is None and delta_schema(path) is None
    assert create_on_driver(path, schema) == 0
    entry = {
        k: v
        for line in (tmp_path / "t/_delta_log/00000000000000000000.json").read_text().splitlines()
        for k, v in json.loads(line).items()
    }
    features = ["columnMapping", "deletionVectors", "timestampNtz"]
    assert entry["protocol"] == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": features,
        "writerFeatures": features,
    }
    assert entry["metaData"]["configuration"] == {
        "delta.enableDeletionVectors": "true",
        "delta.columnMapping.mode": "name",
        "delta.checkpointInterval": "30",
        "delta.columnMapping.maxColumnId": "6",
    }
    # Ids depth-first, a struct before its fields (as Delta numbers them).
    got = delta_schema(path)
    assert got is not None and got.simpleString() == schema.simpleString()
    ids = {f.name: f.metadata["delta.columnMapping.id"] for f in got.fields}
    assert ids == {"id": 1, "m": 2, "_old": 3}
    old = got["_old"].dataType
    assert [f.metadata["delta.columnMapping.id"] for f in old.fields] == [4, 5]
    assert old["y"].dataType.elementType["z"].metadata["delta.columnMapping.id"] == 6
    names = [f.metadata["delta.columnMapping.physicalName"] for f in got.fields]
    assert len(set(names)) == 3 and all(n.startswith("col-") for n in names)
    assert DeltaTable(path).version() == 0
    # Put-if-absent: a second creation fails instead of replacing the table.
    with pytest.raises(FileExistsError):
        create_on_driver(path, schema)


def test_rename_order_frees_a_name_before_it_is_taken() -> None:
    from slotlake.delta import rename_order, renamed_names

    assert rename_order({"c": "a", "a": "b"}, {"a", "c", "v"}) == [("a", "b"), ("c", "a")]
    # A rename whose new name stays taken, or of a column the table lacks, is left out.
    assert rename_order({"a": "v", "x": "y"}, {"a", "v"}) == []
    assert rename_order({"a": "b", "b": "b2"}, {"a"}) == [("a", "b")]
    # A name two renames want goes to the first; a cycle is left out; the driver's one
    # entry makes the same renames.
    assert rename_order({"c": "a", "b": "a"}, {"a", "b", "c"}) == []
    assert rename_order({"a": "x", "b": "a", "c": "a"}, {"a", "b", "c"}) == [
        ("a", "x"),
        ("b", "a"),
    ]
    assert rename_order({"a": "b", "b": "a"}, {"a", "b"}) == []
    assert renamed_names({"a": "b", "c": "a"}, {"a", "c", "v"}) == {"a": "b", "c": "a"}


def test_a_cycle_of_renames_only_when_asked() -> None:
    from slotlake.delta import renamed_names, swaps

    names = {"id", "a", "c", "x"}
    # A swap (a ↔ c) beside a plain rename (x → y).
    renames = {"a": "c", "c": "a", "x": "y"}
    assert swaps(renames) and not swaps({"a": "b", "c": "a"})
    assert renamed_names(renames, names) == {"x": "y"}
    assert renamed_names(renames, names, cycles=True) == {"a": "c", "c": "a", "x": "y"}
    # A three-way cycle; through a name the table lacks it is a chain.
    three = {"a": "b", "b": "c", "c": "a"}
    assert renamed_names(three, {"a", "b", "c"}, cycles=True) == three
    assert renamed_names(three, {"a", "b"}) == {"a": "b", "b": "c"}


def test_a_swap_is_one_entry_made_once(tmp_path: Path) -> None:
    """The driver swaps two columns' names in one entry that carries the batch's marker;
    asked again for the same batch (a rerun), it leaves the table as it is. The values
    follow their columns (column mapping: only the names move)."""
    import pyarrow as pa

    from slotlake.delta import arrow_append, ensure_local, renames_done

    path = str(tmp_path / "t")
    schema = _schema(("id", LongType()), ("a", StringType()), ("c", StringType()))
    create_on_driver(path, schema)
    arrow_append(path, pa.table({"id": [1], "a": ["A"], "c": ["C"]}), "app", 1)
    swapped = _schema(("id", LongType()), ("c", StringType()), ("a", StringType()))
    marker = ("app.renames", 2)
    assert not renames_done(path, marker)

    def no_spark() -> None:
        raise AssertionError("the driver evolves this table")

    for _ in range(2):
        got = ensure_local(no_spark, path, path, swapped, {"a": "c", "c": "a"}, True, marker)
        assert got.fieldNames() == ["id", "c", "a"]
        assert local_version(path) == 2
        assert renames_done(path, marker)
        read = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t")
        assert pa.table(read.read_all()).to_pylist() == [{"id": 1, "c": "A", "a": "C"}]
    # Without a marker, no swap (what Spark's ALTERs would do, one at a time).
    ensure_local(no_spark, path, path, schema, {"a": "c", "c": "a"}, True)
    assert local_version(path) == 2


def test_names_taken_are_the_columns_a_rename_replaces() -> None:
    from slotlake.delta import names_taken

    # DROP a, RENAME c TO a: the state's a goes first.
    assert names_taken({"c": "a"}, {"id", "a", "c"}) == {"a"}
    # A name handed on (a moves away first) or swapped: nothing is replaced.
    assert names_taken({"a": "b", "c": "a"}, {"id", "a", "c"}) == set()
    assert names_taken({"a": "c", "c": "a"}, {"id", "a", "c"}) == set()
    # A rename of a column the table lacks replaces nothing.
    assert names_taken({"x": "a"}, {"id", "a"}) == set()


def _mapped(*columns: tuple[str, str], old: tuple[tuple[str, str], ...] = ()) -> StructType:
    """A column-mapped schema: (name, physical name) pairs, ``old`` the ``_old`` struct's
    (a column with a physical name of its own, as every column of a mapped table)."""
    key = "delta.columnMapping.physicalName"

    def fields(pairs: tuple[tuple[str, str], ...]) -> list[StructField]:
        return [StructField(n, StringType(), True, {key: p}) for n, p in pairs]

    top = fields(columns)
    if old:
        top.append(StructField("_old", StructType(fields(old)), True, {key: "p_old"}))
    return StructType(top)


def test_renames_left_by_physical_name() -> None:
    """A rerun's renames, told done by physical name: ``DROP a``, ``RENAME c TO a`` made
    (a's column moved to a__dropped, c's took a) leaves nothing to do, though ``a`` still
    names a column; half made (the top level only, as Spark's ALTERs can stop) leaves what
    the old image still needs; a name the table did not have is not for it."""
    from slotlake.delta import renames_left

    renames = {"a": "a__dropped", "c": "a"}
    before = _mapped(("id", "p1"), ("a", "p2"), ("c", "p3"), old=(("a", "q2"), ("c", "q3")))
    assert renames_left(before, before, renames) == renames
    made = _mapped(
        ("id", "p1"), ("a__dropped", "p2"), ("a", "p3"), old=(("a__dropped", "q2"), ("a", "q3"))
    )
    assert renames_left(before, made, renames) == {}
    top_only = _mapped(
        ("id", "p1"), ("a__dropped", "p2"), ("a", "p3"), old=(("a", "q2"), ("c", "q3"))
    )
    assert renames_left(before, top_only, renames) == renames
    # The state: a dropped before the rename (its column gone), c's column now a.
    state = _mapped(("id", "p1"), ("a", "p3"))
    assert renames_left(_mapped(("id", "p1"), ("a", "p2"), ("c", "p3")), state, renames) == {}
    # The change log kept a from an earlier batch; the state never had it.
    assert renames_left(
        _mapped(("id", "p1"), ("c", "p3")), _mapped(("id", "p1"), ("c", "p3")), renames
    ) == {"c": "a"}
    # Without column mapping nothing can be told: all of them, as before.
    plain = _schema(("id", LongType()), ("a", StringType()), ("c", StringType()))
    assert renames_left(plain, plain, renames) == renames


def test_a_version_the_log_does_not_hold_is_read_as_none(tmp_path: Path) -> None:
    """The schema a rerun compares against (the last commit record's version): a version
    the log no longer holds gives None, and the caller decides by the latest schema."""
    from slotlake.batch import schema_as_of
    from slotlake.lake import Lake

    create_on_driver(str(tmp_path / "t"), _schema(("id", LongType()), ("a", StringType())))
    lake = Lake(str(tmp_path))
    schema = schema_as_of(lake, "t", 0)
    assert schema is not None and schema.fieldNames() == ["id", "a"]
    assert schema_as_of(lake, "t", 7) is None
