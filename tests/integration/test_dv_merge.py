"""The driver's MERGE (:mod:`slotlake.dv_merge`) against a Python model of the state, read
back by Spark and by deltalake, in both its ways of deleting (deletion vectors, and the
touched files rewritten): on top of Spark's own deletion vectors, across a checkpoint,
with keys kept as ``_fallback`` text, and the cases it must leave to another writer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from slotlake import delta, delta_log, dv_merge, key_index
from slotlake.catalog import ColumnSpec, RelationVersion, TableCatalog
from slotlake.decode import arrow_schema_for
from slotlake.delta import DRIVER_ENGINE, _struct_from_json, create_on_driver
from slotlake.lake import query_delta

HELPERS = [
    StructField("_fallback", MapType(StringType(), StringType())),
    StructField("_missing_toast", ArrayType(StringType())),
]
LONG_KEY = StructType([StructField("id", LongType()), StructField("v", StringType()), *HELPERS])
# No RelationVersion: the key counts as one that may have fallen back to text.
CAT = TableCatalog(
    name="public.t",
    columns=[("id", "bigint"), ("v", "string")],
    state_columns=["id", "v"],
    key_columns=["id"],
)
# The same table as its Relation message gives it: a bigint key no value of which can have
# fallen back to text, so its MERGE compares the key alone (and may use key indexes).
PLAIN_CAT = TableCatalog(
    name="public.t",
    columns=[("id", "bigint"), ("v", "string")],
    state_columns=["id", "v"],
    key_columns=["id"],
    versions=[
        RelationVersion(
            seq=0,
            oid=1,
            replica_identity="d",
            columns=(ColumnSpec("id", 20, -1, "bigint"), ColumnSpec("v", 25, -1, "string")),
            key_columns=("id",),
            type_names=(),
        )
    ],
)
Model = dict[Any, tuple[str | None, dict[str, str]]]
# merge_keyed's rewrite_up_to: 0 gives every touched file a deletion vector; the default
# rewrites the touched files of these small tables.
MODES = {"vectors": 0, "rewrite": dv_merge.REWRITE_BYTES}


@pytest.fixture(autouse=True)
def _checkpoints_every_10(checkpoint_every_10: None) -> None:
    """These tests reach a checkpoint in ten commits (the lake's tables take one every 30)."""


def _rows(
    schema: StructType, changes: list[tuple[Any, str | None, dict[str, str], bool]]
) -> pa.Table:
    """A batch's final rows: (key, v or None, _fallback, deleted), as the replay gives them."""
    state = arrow_schema_for(schema)
    key_type = state.field(schema.fields[0].name).type
    name = schema.fields[0].name
    return pa.table(
        {
            name: pa.array([k for k, _, _, _ in changes], key_type),
            "v": pa.array([v for _, v, _, _ in changes], pa.string()),
            "_fallback": pa.array(
                [list(f.items()) for _, _, f, _ in changes], state.field("_fallback").type
            ),
            "_missing_toast": pa.array([[] for _ in changes], pa.list_(pa.string())),
            "_key": pa.array(
                [{name: k, "~" + name: f.get(name)} for k, _, f, _ in changes],
                pa.struct([(name, key_type), ("~" + name, pa.string())]),
            ),
            "_deleted": pa.array([d for _, _, _, d in changes], pa.bool_()),
        }
    )


def _apply(model: Model, changes: list[tuple[Any, str | None, dict[str, str], bool]]) -> None:
    for key, v, fb, deleted in changes:
        ident = key if key is not None else ("~", fb.get("n") or fb.get("id"))
        model.pop(ident, None)
        if not deleted:
            model[ident] = (v, fb)


def _as_model(rows: list[dict[str, Any]], key: str) -> Model:
    out: Model = {}
    for r in rows:
        fb = dict(r["_fallback"] or {})
        ident = r[key] if r[key] is not None else ("~", fb.get(key))
        assert ident not in out, f"key {ident} twice in the state"
        out[ident] = (r["v"], fb)
    return out


def _read_deltalake(path: str, key: str) -> Model:
    return _as_model(
        query_delta(path, DeltaTable(path).version(), "SELECT * FROM t").to_pylist(), key
    )


def _read_both(spark: Any, path: str, key: str) -> tuple[Model, Model]:
    by_spark = [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()]
    return _as_model(by_spark, key), _read_deltalake(path, key)


def _seed(
    spark: Any, path: str, n: int, files: int, key: Any = int, schema: StructType = LONG_KEY
) -> Model:
    """A state of keys ``key(i)`` for i in 0..n-1, v = f"v{i}", in ``files`` files."""
    create_on_driver(path, schema)
    df = spark.createDataFrame([(key(i), f"v{i}", {}, []) for i in range(n)], schema)
    df.repartition(files).write.format("delta").mode("append").save(path)
    return {key(i): (f"v{i}", {}) for i in range(n)}


def vacuum(spark: Any, path: str, hours: int) -> None:
    """Spark's VACUUM of the table keeping ``hours``, below Delta's retention checks (set
    for this call only)."""
    settings = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false",
    }
    before = {k: spark.conf.get(k, None) for k in settings}
    try:
        for k, v in settings.items():
            spark.conf.set(k, v)
        spark.sql(f"VACUUM delta.`{path}` RETAIN {hours} HOURS")
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def physical_id(path: str) -> str:
    """The key column's physical name (column mapping)."""
    fields = delta_log.snapshot(path).schema.fields
    return next(f.metadata[delta_log.PHYSICAL] for f in fields if f.name == "id")


def _last_commit(path: str) -> list[dict[str, Any]]:
    version = DeltaTable(path).version()
    with open(Path(path) / "_delta_log" / f"{version:020d}.json") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("mode", list(MODES))
def test_merge_on_top_of_sparks_deletion_vectors(spark: Any, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "state")
    model = _seed(spark, path, 3000, 3)
    # Spark's own deletion vectors first: every tenth row goes.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 0")
    model = {k: v for k, v in model.items() if k % 10}
    files_before = {a["path"] for a in pa.table(DeltaTable(path).get_add_actions(True)).to_pylist()}

    changes = [
        (1, "one", {}, False),  # update
        (2, "two", {}, False),
        (20, "back", {}, False),  # deleted by Spark: an insert again
        (5000, "new", {}, False),  # new key
        (3, None, {}, True),  # delete
        (30, None, {}, True),  # already gone: nothing
        (7000, None, {}, True),  # never there: nothing
    ]
    rows = _rows(LONG_KEY, changes)
    result = dv_merge.merge_keyed(path, rows, CAT, "app", 1, rewrite_up_to=MODES[mode])
    assert result is not None
    _apply(model, changes)
    by_spark, by_deltalake = _read_both(spark, path, "id")
    assert by_spark == model
    assert by_deltalake == model
    assert result.metrics["numTargetRowsInserted"] == "2"
    assert result.metrics["numTargetRowsUpdated"] == "2"
    assert result.metrics["numTargetRowsDeleted"] == "1"
    actions = _last_commit(path)
    assert actions[0]["commitInfo"]["engineInfo"] == DRIVER_ENGINE
    assert actions[1] == {
        "txn": {"appId": "app", "version": 1, "lastUpdated": actions[1]["txn"]["lastUpdated"]}
    }
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    if mode == "rewrite":
        # The touched files (with Spark's vectors) replaced by one file without a vector.
        assert {a["path"] for a in removes} <= files_before
        assert all("deletionVector" in r for r in removes)
        assert len(adds) == 1 and "deletionVector" not in adds[0]
        assert result.metrics["numTargetFilesRemoved"] == str(len(removes))
        assert DeltaTable(path).transaction_version("app") == 1
        return
    # No data file rewritten: the old ones re-added with vectors, one new file.
    assert {a["path"] for a in removes} <= files_before
    assert len([a for a in adds if a["path"] not in files_before]) == 1
    for remove in removes:
        # The logical file removed is the one Spark left (its path and its vector).
        assert "deletionVector" in remove
    assert DeltaTable(path).transaction_version("app") == 1


def test_sparks_vectors_read_as_deltalake_reads_them(spark: Any, tmp_path: Path) -> None:
    """Every vector Spark wrote (scattered rows, a contiguous range, a whole file) read by
    :func:`slotlake.deletion_vector.read` from its add action equals deltalake's decoding."""
    import numpy as np

    from slotlake import deletion_vector

    path = str(tmp_path / "state")
    _seed(spark, path, 200_000, 3)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0 OR id BETWEEN 1000 AND 90000")
    table = DeltaTable(path)
    vectors = pa.table(table.deletion_vectors())
    by_deltalake = {
        uri.rsplit("/state/", 1)[1]: np.flatnonzero(~np.asarray(keep, dtype=bool)).tolist()
        for uri, keep in zip(
            vectors.column("filepath").to_pylist(),
            vectors.column("selection_vector").to_pylist(),
            strict=True,
        )
    }
    assert by_deltalake
    live = delta_log.snapshot(path, files=True).files
    assert live is not None
    adds = {file: live[file] for file in by_deltalake}
    for file, add in adds.items():
        assert deletion_vector.read(path, add["deletionVector"]).tolist() == by_deltalake[file]


@pytest.mark.parametrize("mode", [*MODES, "indexed"])
def test_many_merges_across_a_checkpoint(
    spark: Any, tmp_path: Path, monkeypatch, mode: str
) -> None:
    """``indexed``: deletion vectors and a key no value of which fell back to text, so that
    every file a MERGE looks into gets a key index (:mod:`slotlake.key_index`), the
    batches' small files too: however many there are, DuckDB is never asked."""
    import random

    cat = CAT
    up_to = MODES.get(mode, 0)
    path = str(tmp_path / "state")
    model = _seed(spark, path, 2000, 4)
    if mode == "indexed":
        cat = PLAIN_CAT

        def no_duckdb() -> Any:
            raise AssertionError("DuckDB was asked")

        monkeypatch.setattr(dv_merge, "_duckdb", no_duckdb)
    from_checkpoint = []
    real = delta_log._read_checkpoint

    def reading(parts: list[str], *state: Any) -> None:
        if state[-1] is not None:  # the live files were asked for
            from_checkpoint.append(parts)
        real(parts, *state)

    monkeypatch.setattr(delta_log, "_read_checkpoint", reading)
    # Each MERGE reads the log afresh, as in a process of its own (no snapshot kept).
    monkeypatch.setattr(delta, "KEPT_TABLES", 0)
    rng = random.Random(7)
    next_id = 2000
    for batch in range(1, 13):
        changes: list[tuple[Any, str | None, dict[str, str], bool]] = []
        for key in rng.sample(sorted(model), 40):
            changes.append(
                (key, None, {}, True) if rng.random() < 0.3 else (key, f"b{batch}", {}, False)
            )
        for _ in range(10):
            changes.append((next_id, f"new{batch}", {}, False))
            next_id += 1
        rows = _rows(LONG_KEY, changes)
        assert dv_merge.merge_keyed(path, rows, cat, "app", batch, rewrite_up_to=up_to)
        _apply(model, changes)
        if batch % 4 == 0:
            assert _read_deltalake(path, "id") == model, batch
    indexes = Path(path) / key_index.DIRECTORY
    if mode == "indexed":  # every data file a MERGE looked into has one: all but the newest
        live, indexed = _indexed_files(path)
        assert len(live) >= 12 and len(indexed) == len(live) - 1, (len(live), len(indexed))
    else:
        assert not indexes.exists()
    assert (Path(path) / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
    assert from_checkpoint, "no live file's add action was read from the checkpoint"
    live = delta_log.snapshot(path, files=True).files
    assert live is not None
    assert set(live) == {
        a["path"] for a in pa.table(DeltaTable(path).get_add_actions(True)).to_pylist()
    }
    by_spark, by_deltalake = _read_both(spark, path, "id")
    assert by_spark == model
    assert by_deltalake == model

    # `slotlake maintain`'s upkeep by Spark: OPTIMIZE purges the vectors, VACUUM deletes
    # what no version references; the driver MERGEs on over what they left.
    spark.sql(f"OPTIMIZE delta.`{path}`")
    vacuum(spark, path, 0)
    assert not list(Path(path).glob("deletion_vector_*.bin"))
    if mode == "indexed":
        # Spark's VACUUM leaves the index directory alone; maintain's prune then removes
        # the indexes of the files it deleted, and only those.
        before = {p.name for p in indexes.iterdir()}
        assert key_index.prune(path) == len(before) > 0
        assert not list(indexes.iterdir())
    changes = [(key, "after upkeep", {}, False) for key in sorted(model)[:50]]
    changes += [(key, None, {}, True) for key in sorted(model)[50:60]]
    rows = _rows(LONG_KEY, changes)
    assert dv_merge.merge_keyed(path, rows, cat, "app", 13, rewrite_up_to=up_to)
    _apply(model, changes)
    by_spark, by_deltalake = _read_both(spark, path, "id")
    assert by_spark == by_deltalake == model
    if mode == "indexed":  # the compacted file's index, made by that MERGE, is kept
        live = delta_log.snapshot(path, files=True).files or {}
        assert key_index.prune(path) == 0
        assert {p.name for p in indexes.iterdir()} <= {
            Path(key_index.index_path(path, a, physical_id(path))).name for a in live.values()
        }
        assert list(indexes.iterdir())


def test_keys_kept_as_text_match_through_fallback(spark: Any, tmp_path: Path) -> None:
    schema = StructType(
        [StructField("n", DecimalType(10, 2)), StructField("v", StringType()), *HELPERS]
    )
    cat = TableCatalog(
        name="public.n",
        columns=[("n", "decimal(10,2)"), ("v", "string")],
        state_columns=["n", "v"],
        key_columns=["n"],
    )
    path = str(tmp_path / "state")
    create_on_driver(path, schema)
    from decimal import Decimal

    first = [
        (Decimal("1.50"), "a", {}, False),
        (None, "nan", {"n": "NaN"}, False),
        (None, "inf", {"n": "Infinity"}, False),
    ]
    assert dv_merge.merge_keyed(path, _rows(schema, first), cat, "app", 1)
    second = [
        (None, "nan again", {"n": "NaN"}, False),
        (None, None, {"n": "Infinity"}, True),
        (Decimal("1.50"), "b", {}, False),
    ]
    result = dv_merge.merge_keyed(path, _rows(schema, second), cat, "app", 2)
    assert result is not None
    assert result.metrics["numTargetRowsUpdated"] == "2"
    assert result.metrics["numTargetRowsDeleted"] == "1"
    model: Model = {}
    _apply(model, first)
    _apply(model, second)
    by_spark, by_deltalake = _read_both(spark, path, "n")
    assert by_spark == by_deltalake == model


@pytest.mark.parametrize("mode", list(MODES))
def test_a_table_written_meanwhile_is_left_to_spark(
    spark: Any, tmp_path: Path, monkeypatch, mode: str
) -> None:
    path = str(tmp_path / "state")
    model = _seed(spark, path, 100, 1)
    version = DeltaTable(path).version()

    def taken(path: str, version: int, actions: list[dict[str, Any]]) -> None:
        raise FileExistsError(version)

    monkeypatch.setattr(delta_log, "_commit_on_driver", taken)
    rows = _rows(LONG_KEY, [(1, "x", {}, False), (2, None, {}, True)])
    listing = sorted(os.listdir(path))
    assert dv_merge.merge_keyed(path, rows, CAT, "app", 1, rewrite_up_to=MODES[mode]) is None
    assert sorted(os.listdir(path)) == listing  # its vector and data files removed again
    assert DeltaTable(path).version() == version
    assert _read_both(spark, path, "id")[1] == model

    # A log it cannot follow (say, a checkpoint missing a part): Spark's MERGE instead.
    def gap(path: str, files: bool = False) -> Any:
        raise LookupError("log entries missing")

    monkeypatch.setattr(delta_log, "snapshot", gap)
    assert dv_merge.merge_keyed(path, rows, CAT, "app", 1) is None
    monkeypatch.undo()
    # No rows: nothing committed.
    empty = dv_merge.merge_keyed(path, _rows(LONG_KEY, []), CAT, "app", 1)
    assert empty is not None and empty.version == version
    assert DeltaTable(path).version() == version


def test_protocols_it_does_not_write_are_left_to_spark(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    _seed(spark, path, 10, 1)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')")
    table = DeltaTable(path)
    assert "rowTracking" in (dv_merge.unsupported(delta_log.snapshot(path)) or "")
    rows = _rows(LONG_KEY, [(1, "x", {}, False)])
    assert dv_merge.merge_keyed(path, rows, CAT, "app", 1) is None
    assert DeltaTable(path).version() == table.version()

    # Deletion vectors turned off: the touched files are rewritten, whatever their size.
    plain = str(tmp_path / "plain")
    model = _seed(spark, plain, 10, 1)
    spark.sql(
        f"ALTER TABLE delta.`{plain}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')"
    )
    snap = delta_log.snapshot(plain)
    assert dv_merge.unsupported(snap) is None and not dv_merge.vectors_allowed(snap)
    changes = [(1, "x", {}, False), (2, None, {}, True)]
    result = dv_merge.merge_keyed(plain, _rows(LONG_KEY, changes), CAT, "app", 1, rewrite_up_to=0)
    assert result is not None and result.metrics["numTargetDeletionVectorsAdded"] == "0"
    assert not any(a["add"].get("deletionVector") for a in _last_commit(plain) if "add" in a)
    _apply(model, changes)
    assert _read_both(spark, plain, "id") == (model, model)


def test_files_are_pruned_by_key_statistics_and_keys_match_whole(
    spark: Any, tmp_path: Path
) -> None:
    """A two-column key: files whose first key column's range holds none of the batch's
    keys are not read; a row matches only on both columns."""
    schema = StructType(
        [
            StructField("a", StringType()),
            StructField("b", LongType()),
            StructField("v", StringType()),
            *HELPERS,
        ]
    )
    cat = TableCatalog(
        name="public.ab",
        columns=[("a", "string"), ("b", "bigint"), ("v", "string")],
        state_columns=["a", "b", "v"],
        key_columns=["a", "b"],
    )
    path = str(tmp_path / "state")
    create_on_driver(path, schema)
    # Three files with disjoint ranges of a: "a…", "m…", "x…".
    for prefix in ("a", "m", "x"):
        spark.createDataFrame(
            [
                (f"{prefix}{i:03d}", b, f"{prefix}{i}/{b}", {}, [])
                for i in range(50)
                for b in (1, 2)
            ],
            schema,
        ).coalesce(1).write.format("delta").mode("append").save(path)
    table = DeltaTable(path)
    physical = {
        f.name: f.metadata["delta.columnMapping.physicalName"]
        for f in _struct_from_json(table.schema().to_json()).fields
    }
    adds = pa.table(table.get_add_actions(True)).to_pylist()
    m_file = next(a["path"] for a in adds if a[f"min.{physical['a']}"].startswith("m"))
    keys = pa.array(["m010", "m011", "m049"])
    snap = delta_log.snapshot(path, files=True)
    assert dv_merge._candidates(snap, physical["a"], keys) == [m_file]

    def rows(changes: list[tuple[str, int, str | None, bool]]) -> pa.Table:
        state = arrow_schema_for(schema)
        n = len(changes)
        return pa.table(
            {
                "a": [c[0] for c in changes],
                "b": pa.array([c[1] for c in changes], pa.int64()),
                "v": [c[2] for c in changes],
                "_fallback": pa.array([[]] * n, state.field("_fallback").type),
                "_missing_toast": pa.array([[]] * n, pa.list_(pa.string())),
                "_key": pa.array(
                    [{"a": c[0], "b": c[1], "~b": None} for c in changes],
                    pa.struct([("a", pa.string()), ("b", pa.int64()), ("~b", pa.string())]),
                ),
                "_deleted": [c[3] for c in changes],
            }
        )

    model = {(f"{p}{i:03d}", b): f"{p}{i}/{b}" for p in "amx" for i in range(50) for b in (1, 2)}
    changes = [
        ("m010", 1, "changed", False),  # (m010, 2) stays as it was
        ("m011", 2, None, True),  # (m011, 1) stays
        ("m049", 3, "new", False),  # same a, new b: an insert
    ]
    result = dv_merge.merge_keyed(path, rows(changes), cat, "app", 1)
    assert result is not None
    assert (result.metrics["numTargetRowsUpdated"], result.metrics["numTargetRowsDeleted"]) == (
        "1",
        "1",
    )
    assert result.metrics["numTargetRowsInserted"] == "1"
    model[("m010", 1)] = "changed"
    del model[("m011", 2)]
    model[("m049", 3)] = "new"
    touched = {a["remove"]["path"] for a in _last_commit(path) if "remove" in a}
    assert touched == {m_file}
    for read in (
        [r.asDict() for r in spark.read.format("delta").load(path).collect()],
        query_delta(path, DeltaTable(path).version(), "SELECT * FROM t").to_pylist(),
    ):
        assert {(r["a"], r["b"]): r["v"] for r in read} == model
        assert len(read) == len(model)


def _pairs(found: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """What ``dv_merge._find`` found, comparable: per file, (position, row) pairs."""
    return {f: sorted(zip(p.tolist(), s.tolist(), strict=True)) for f, (p, s) in found.items()}


def _indexed_files(path: str) -> tuple[list[str], list[str]]:
    """The live data files of the state at ``path``, and those with a key index."""
    live = delta_log.snapshot(path, files=True).files or {}
    names = [p.name for p in (Path(path) / key_index.DIRECTORY).iterdir()]
    return list(live), [
        f for f in live if any(n.startswith(quote(unquote(f), safe="") + ".") for n in names)
    ]


def _no_key_indexes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No file is big enough for a key index: ``dv_merge._find`` reads key columns."""
    monkeypatch.setattr(key_index, "MIN_ROWS", 1 << 62)


def _uuid(i: int) -> str:
    """A text key as a uuid column's state holds it (lowercase, dashed), random-looking."""
    import hashlib
    import uuid

    return str(uuid.UUID(bytes=hashlib.md5(str(i).encode()).digest()))


TEXT_KEY = StructType([StructField("id", StringType()), StructField("v", StringType()), *HELPERS])
TEXT_CAT = TableCatalog(
    name="public.u",
    columns=[("id", "string"), ("v", "string")],
    state_columns=["id", "v"],
    key_columns=["id"],
)
# A key of each kind a key index is made for: (its i-th value, the state's schema, catalog).
KEY_KINDS = {"bigint": (int, LONG_KEY, PLAIN_CAT), "uuid": (_uuid, TEXT_KEY, TEXT_CAT)}


def _seed_with_a_repeated_key(
    spark: Any, path: str, n: int, files: int, kind: str = "bigint"
) -> tuple[pa.Table, Any, dict[str, str]]:
    """A state of keys 0..n-1 (``KEY_KINDS[kind]``'s values of them) in ``files`` files,
    every tenth deleted by Spark (its vectors), and a file of its own whose key 3n repeats
    (no state file has that; an index must not pick one of the two rows); the rows of a
    batch updating 1, 2, 10, n-1, 3n and 5n and deleting 3, 20 and 7n, the table's
    snapshot and physical names."""
    key, schema, _ = KEY_KINDS[kind]
    _seed(spark, path, n, files, key, schema)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE v LIKE '%0'")  # i % 10 == 0
    spark.createDataFrame([(key(3 * n), "a", {}, []), (key(3 * n), "b", {}, [])], schema).coalesce(
        1
    ).write.format("delta").mode("append").save(path)
    changes = [(key(k), "x", {}, False) for k in (1, 2, 10, n - 1, 3 * n, 5 * n)]
    changes += [(key(k), None, {}, True) for k in (3, 20, 7 * n)]
    snap = delta_log.snapshot(path, files=True)
    physical = {f.name: f.metadata[delta_log.PHYSICAL] for f in snap.schema.fields}
    return _rows(schema, changes), snap, physical


def test_a_small_state_is_looked_up_in_arrow_as_duckdb_finds_it(
    tmp_path: Path, monkeypatch
) -> None:
    """A one-column key that cannot fall back, in a small state: the keys are found with
    Arrow's ``index_in`` in the files read whole, the same rows DuckDB's join finds, and
    the rewritten state stays one file."""
    schema = StructType(
        [StructField("name", StringType()), StructField("v", StringType()), *HELPERS]
    )
    cat = TableCatalog(
        name="public.s",
        columns=[("name", "string"), ("v", "string")],
        state_columns=["name", "v"],
        key_columns=["name"],
    )
    path = str(tmp_path / "state")
    create_on_driver(path, schema)
    first = [(f"k{i}", f"v{i}", {}, False) for i in range(50)]
    assert dv_merge.merge_keyed(path, _rows(schema, first), cat, "app", 1)
    second = [("k1", "x", {}, False), ("k2", None, {}, True), ("new", "n", {}, False)]
    rows = _rows(schema, second)
    snap = delta_log.snapshot(path, files=True)
    physical = {f.name: f.metadata[delta_log.PHYSICAL] for f in snap.schema.fields}

    opened: dict[str, pa.Table] = {}
    in_arrow = dv_merge._find(path, snap, rows, cat, physical, opened)
    assert set(opened) == set(snap.files or {})
    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 0)  # DuckDB's join
    assert _pairs(in_arrow) == _pairs(dv_merge._find(path, snap, rows, cat, physical))
    monkeypatch.undo()
    assert sum(len(p) for p in _pairs(in_arrow).values()) == 2

    used = []
    real = dv_merge._find_in_arrow
    monkeypatch.setattr(dv_merge, "_find_in_arrow", lambda *a: used.append(1) or real(*a))
    result = dv_merge.merge_keyed(path, rows, cat, "app", 2)
    assert used and result is not None
    assert (result.metrics["numTargetRowsUpdated"], result.metrics["numTargetRowsDeleted"]) == (
        "1",
        "1",
    )
    after = delta_log.snapshot(path, files=True)
    assert len(after.files or {}) == 1  # the touched file rewritten with the new rows
    got = query_delta(path, after.version, "SELECT name, v FROM t").to_pylist()
    want = {f"k{i}": f"v{i}" for i in range(50)} | {"k1": "x", "new": "n"}
    del want["k2"]
    assert {r["name"]: r["v"] for r in got} == want and len(got) == len(want)


@pytest.mark.parametrize("kind", list(KEY_KINDS))
def test_big_files_are_looked_up_in_key_indexes_as_duckdb_finds_them(
    spark: Any, tmp_path: Path, monkeypatch, kind: str
) -> None:
    """A one-column integer or text key (every file past ``key_index.MIN_ROWS`` by
    default): the rows found through the files' key indexes are the ones DuckDB's join
    finds, deleted or not; a file whose keys repeat gets no index and goes to DuckDB; an
    index that does not fit its file is made again."""
    import numpy as np

    cat = KEY_KINDS[kind][2]
    path = str(tmp_path / "state")
    rows, snap, physical = _seed_with_a_repeated_key(spark, path, 3000, 3, kind)

    _no_key_indexes(monkeypatch)
    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 0)
    by_duckdb = _pairs(dv_merge._find(path, snap, rows, cat, physical))
    monkeypatch.undo()
    indexes = Path(path) / key_index.DIRECTORY
    assert not indexes.exists()
    # The file whose key repeats is the one left: Arrow reads its key column.
    by_index = _pairs(dv_merge._find(path, snap, rows, cat, physical))
    assert by_index == by_duckdb
    # 1, 2, 10, 2999, 3, 20 once each (10 and 20 behind Spark's vectors), 9000 twice.
    assert sum(len(v) for v in by_index.values()) == 8
    kept = list(indexes.iterdir())
    refused = [p for p in kept if np.load(p).dtype == np.int8]  # the file whose key repeats
    assert len(kept) == 4 and len(refused) == 1
    spoiled = next(p for p in kept if p not in refused)
    made = np.load(spoiled)
    assert (made.dtype == np.uint8) == (kind == "uuid")  # the text form

    np.save(spoiled, made[..., :-1])  # not this file's
    assert _pairs(dv_merge._find(path, snap, rows, cat, physical)) == by_duckdb
    assert np.array_equal(np.load(spoiled), made)  # made again


def test_text_key_indexes_made_ahead_are_the_ones_a_merge_uses(
    spark: Any, tmp_path: Path, monkeypatch
) -> None:
    """``make_key_indexes`` (the bootstrap's and ``maintain``'s) makes a uuid key's
    indexes for the files past ``AHEAD_MIN_ROWS``; the MERGE's find then makes none of
    them again and finds what DuckDB's join finds."""
    import numpy as np

    path = str(tmp_path / "state")
    rows, snap, physical = _seed_with_a_repeated_key(spark, path, 3000, 3, "uuid")
    monkeypatch.setattr(key_index, "AHEAD_MIN_ROWS", 500)
    assert dv_merge.make_key_indexes(path, ["id"]) == 3  # not the 2-row file
    made = {p: p.stat().st_mtime_ns for p in (Path(path) / key_index.DIRECTORY).iterdir()}
    assert len(made) == 3 and all(np.load(p).dtype == np.uint8 for p in made)
    by_index = _pairs(dv_merge._find(path, snap, rows, TEXT_CAT, physical))
    assert {p: p.stat().st_mtime_ns for p in made} == made
    _no_key_indexes(monkeypatch)
    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 0)
    assert by_index == _pairs(dv_merge._find(path, snap, rows, TEXT_CAT, physical))


def test_a_few_small_files_are_looked_up_in_arrow_as_duckdb_finds_them(
    spark: Any, tmp_path: Path, monkeypatch
) -> None:
    """A state MERGEd by deletion vectors whose candidate files (no key index) are at most
    ``ARROW_FIND_FILES``: their key columns are read and looked up in Arrow, the rows
    DuckDB's join finds (behind Spark's vectors or not, a repeated key twice), and
    DuckDB is not asked; past that many files, DuckDB."""
    path = str(tmp_path / "state")
    rows, snap, physical = _seed_with_a_repeated_key(spark, path, 300, 2)
    assert len(snap.files or {}) == 3
    _no_key_indexes(monkeypatch)

    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 0)
    by_duckdb = _pairs(dv_merge._find(path, snap, rows, PLAIN_CAT, physical))
    # 1, 2, 10, 299, 3, 20 once each (10 and 20 behind Spark's vectors), 900 twice.
    assert sum(len(v) for v in by_duckdb.values()) == 8
    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 3)

    def no_duckdb() -> Any:
        raise AssertionError("DuckDB was asked")

    monkeypatch.setattr(dv_merge, "_duckdb", no_duckdb)
    assert _pairs(dv_merge._find(path, snap, rows, PLAIN_CAT, physical)) == by_duckdb
    monkeypatch.setattr(dv_merge, "ARROW_FIND_FILES", 2)
    with pytest.raises(AssertionError, match="DuckDB was asked"):
        dv_merge._find(path, snap, rows, PLAIN_CAT, physical)


def test_the_drivers_restore_is_sparks_restore(spark: Any, tmp_path: Path) -> None:
    """Back past Spark's vectors and the driver's grown ones: the driver's RESTORE leaves
    the files (with their vectors) and rows that Spark's RESTORE leaves."""
    import shutil

    path = str(tmp_path / "state")
    model = _seed(spark, path, 3000, 3)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 0")
    model = {k: v for k, v in model.items() if k % 10}
    then = DeltaTable(path).version()
    for batch, first in enumerate((1, 2), 1):
        changes = [(k, f"b{batch}", {}, False) for k in range(first, 3000, 7)]
        changes += [(k, None, {}, True) for k in range(first + 3, 3000, 11)]
        assert dv_merge.merge_keyed(
            path, _rows(LONG_KEY, changes), CAT, "app", batch, rewrite_up_to=0
        )
    twin = str(tmp_path / "twin")
    shutil.copytree(path, twin)

    after = delta_log.restore(path, then)
    spark.sql(f"RESTORE TABLE delta.`{twin}` TO VERSION AS OF {then}")

    def live(p: str) -> set[tuple[str, str | None]]:
        files = delta_log.snapshot(p, files=True).files or {}
        return {(a["path"], delta_log._dv_id(a)) for a in files.values()}

    assert (
        live(path)
        == live(twin)
        == {
            (a["path"], delta_log._dv_id(a))
            for a in (delta_log.snapshot(path, files=True, version=then).files or {}).values()
        }
    )
    assert after.version == DeltaTable(twin).version()
    assert _read_both(spark, path, "id") == (model, model)


def test_clone_owns_a_versions_files_and_vectors(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delta_log.clone`` (a reprocess's new root starts from it): the table as of an older
    version, deletion vectors included, in files of its own (hard links) under one commit
    with the new root's marker; it outlives its source, and the driver merges on into it."""
    import shutil

    source, target = str(tmp_path / "source"), str(tmp_path / "target")
    model = _seed(spark, source, 600, 3)
    at: dict[int, tuple[int, Model]] = {}
    for batch in range(1, 13):  # past the checkpoint at version 10
        gone = range(batch * 40, batch * 40 + 5)  # a batch's final rows: a key once
        changes = [(k, f"b{batch}", {}, False) for k in range(batch, 600, 7) if k not in gone]
        changes += [(k, None, {}, True) for k in gone]
        assert dv_merge.merge_keyed(
            source, _rows(LONG_KEY, changes), CAT, "app", batch, rewrite_up_to=0
        )
        _apply(model, changes)
        at[batch] = (DeltaTable(source).version(), dict(model))
    version, expected = at[11]  # the checkpoint and the entries after it
    assert (Path(source) / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
    then = delta_log.snapshot(source, files=True, version=version)
    assert then.files and any(a.get("deletionVector") for a in then.files.values())

    clone = delta_log.clone(source, target, version, ("new-root", 11))
    assert clone.version == 0 and DeltaTable(target).version() == 0
    assert delta_log.snapshot(target).txns == {"new-root": 11}
    assert DeltaTable(target).history()[0]["operation"] == "CLONE"
    assert _read_both(spark, target, "id") == (expected, expected)
    for add in then.files.values():
        name = add["path"]
        assert os.stat(Path(target, name)).st_ino == os.stat(Path(source, name)).st_ino
    # The same columns, physical names included, as the source had then.
    assert delta_log.snapshot(target).schema == then.schema

    # A table already there is never overwritten; a log the driver does not follow is
    # left to Spark with nothing written.
    with pytest.raises(FileExistsError):
        delta_log.clone(source, target, version, ("new-root", 11))
    monkeypatch.setattr(delta_log, "unwritable", lambda snap, deletes=False: "refused")
    with pytest.raises(LookupError, match="not cloned on the driver: refused"):
        delta_log.clone(source, str(tmp_path / "other"), version)
    assert not (tmp_path / "other").exists()
    monkeypatch.undo()

    # Empty, with the columns only (a reprocess's change log).
    empty = delta_log.clone(source, str(tmp_path / "empty"), version, with_files=False)
    empty_rows = query_delta(str(tmp_path / "empty"), 0, "SELECT count(*) AS n FROM t")
    assert empty.files is None and empty_rows.column("n").to_pylist() == [0]
    assert delta_log.snapshot(str(tmp_path / "empty")).schema == then.schema

    # A file of the version vacuumed: named, and no table left half-made.
    os.remove(Path(source, next(iter(then.files))))
    with pytest.raises(FileNotFoundError, match=r"is gone \(vacuumed\)"):
        delta_log.clone(source, str(tmp_path / "late"), version)
    assert not delta_log.has_log(str(tmp_path / "late"))

    # Its own files: the source's removal leaves it whole, and it takes the next batch.
    shutil.rmtree(source)
    assert _read_deltalake(target, "id") == expected
    changes = [(k, "after", {}, False) for k in range(0, 600, 11)] + [(5000, "new", {}, False)]
    assert dv_merge.merge_keyed(
        target, _rows(LONG_KEY, changes), CAT, "new-root", 12, rewrite_up_to=0
    )
    _apply(expected, changes)
    assert _read_both(spark, target, "id") == (expected, expected)


@pytest.mark.one_pg_version  # the lake's MERGE is under test, not the source
def test_syncs_through_key_indexes_keep_the_mirror_exact(
    pg_dsn: str, slot: str, spark: Any, tmp_path: Path, monkeypatch
) -> None:
    """Batches of random inserts, updates (of the key too), deletes and keys deleted and
    inserted again, on an ``int``, a ``bigint``, a ``text``, a ``uuid`` and a
    ``(bigint, text)`` key (the last three: packed indexes), every state MERGEd with deletion
    vectors: after each sync the mirror equals the source, and the MERGEs found their rows
    through key indexes, made by default (the bootstrap's 300 rows are too few for one
    ahead) for every file they looked into, the batches' own small files too."""
    import random

    import psycopg

    from slotlake.batch import DriverWrites
    from slotlake.bootstrap import run_bootstrap
    from slotlake.lake import Lake
    from slotlake.sync import run_sync

    from .sync_helpers import assert_mirror, make_config

    monkeypatch.setattr(DriverWrites, "DV_FROM_BYTES", 0)
    monkeypatch.setattr(dv_merge, "REWRITE_BYTES", 0)
    used: list[int] = []
    real_find = key_index.find
    monkeypatch.setattr(key_index, "find", lambda *a: used.append(1) or real_find(*a))
    root = str(tmp_path / "lake")
    cfg = make_config(pg_dsn, root, slot)
    # name → (key type, the key of row g, a key moved)
    tables = {
        "public.k4": ("int", "g", "id + 100000"),
        "public.k8": ("bigint", "g", "id + 100000"),
        "public.kt": ("text", "'k' || g", "id || 'é'"),
        "public.ku": ("uuid", "md5(g::text)::uuid", "md5(id::text)::uuid"),
        "public.kc": ("bigint", "g", "id + 100000"),  # the key (id, t): packed
    }
    rng = random.Random(11)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name, (kind, key, _) in tables.items():
            if name == "public.kc":  # one row an id, its t random
                c.execute(
                    f"CREATE TABLE {name} (id {kind}, v text, "
                    "t text DEFAULT left(md5(random()::text), 1 + (random() * 8)::int), "
                    "PRIMARY KEY (id, t))"
                )
            else:
                c.execute(f"CREATE TABLE {name} (id {kind} PRIMARY KEY, v text)")
            c.execute(f"INSERT INTO {name} SELECT {key}, 'v' || g FROM generate_series(1, 300) g")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        run_bootstrap(cfg, spark=spark)  # the slot, and the 300 rows a table copied
        for batch in range(1, 6):
            for name, (_, key, moved) in tables.items():
                ids = [r[0] for r in c.execute(f"SELECT id FROM {name} ORDER BY id").fetchall()]
                picked = rng.sample(ids, 40)
                with c.transaction():
                    for i in picked[:20]:
                        c.execute(f"UPDATE {name} SET v = %s WHERE id = %s", (f"b{batch}", i))
                    for i in picked[20:28]:
                        c.execute(f"DELETE FROM {name} WHERE id = %s", (i,))
                    for i in picked[28:32]:  # the key itself moves
                        c.execute(f"UPDATE {name} SET id = {moved} WHERE id = %s", (i,))
                    for i in picked[32:36]:  # deleted and inserted again in the batch
                        c.execute(f"DELETE FROM {name} WHERE id = %s", (i,))
                        c.execute(f"INSERT INTO {name} VALUES (%s, 'again')", (i,))
                    c.execute(
                        f"INSERT INTO {name} SELECT {key}, 'new' "
                        "FROM generate_series(%s::int, %s::int) g",
                        (1000 * batch, 1000 * batch + 9),
                    )
            result = run_sync(cfg, spark=spark)
            assert result.status == "committed", result
            assert_mirror(c, root, list(tables))
    assert used, "no MERGE looked into a key index"
    lake = Lake(root)
    last = lake.read_commit(result.batch or 0)
    for name in tables:
        state = lake.path(last.tables[name].state or "")
        live, indexed = _indexed_files(state)
        # The bootstrap's file and each batch's but the last, which no MERGE looked into yet.
        assert len(live) == 6 and len(indexed) == 5, (name, sorted(live), indexed)
