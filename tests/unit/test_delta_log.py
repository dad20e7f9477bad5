"""The driver's own Delta log reader and writer (slotlake.delta_log), against delta-rs as
the reference: the same version, files and txn versions from JSON entries, single and
multi-part checkpoints; its commits read back by delta-rs with the table's logical names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql.types import (
    ArrayType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from slotlake import delta_log
from slotlake.delta import DRIVER_ENGINE, arrow_append, create_on_driver
from slotlake.lake import query_delta


@pytest.fixture(autouse=True)
def _checkpoints_every_10(checkpoint_every_10: None) -> None:
    """These tests reach a checkpoint in ten commits (the lake's tables take one every 30)."""


def _txn(app: str, version: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app, version)])


def _history(path: str) -> int:
    """A table with appends under two txn app ids, an overwrite and a checkpoint (its
    version, returned), then one more append."""
    write_deltalake(path, pa.table({"x": [1, 2]}), commit_properties=_txn("a", 1))
    write_deltalake(path, pa.table({"x": [3]}), mode="append", commit_properties=_txn("a", 2))
    write_deltalake(path, pa.table({"x": [4]}), mode="overwrite", commit_properties=_txn("b", 7))
    write_deltalake(path, pa.table({"x": [5]}), mode="append")
    DeltaTable(path).create_checkpoint()
    write_deltalake(path, pa.table({"x": [6]}), mode="append", commit_properties=_txn("a", 3))
    return 3


def _same_as_deltalake(path: str, snap: delta_log.Snapshot) -> None:
    table = DeltaTable(path)
    assert snap.version == table.version()
    assert snap.files is not None
    assert set(snap.files) == set(pa.table(table.get_add_actions(True)).column("path").to_pylist())
    for app in ("a", "b", "c"):
        assert snap.txns.get(app) == table.transaction_version(app)
    assert json.loads(snap.metadata["schemaString"]) == json.loads(table.schema().to_json())


def test_snapshot_is_what_deltalake_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _history(path)
    snap = delta_log.snapshot(path, files=True)
    _same_as_deltalake(path, snap)
    assert snap.txns == {"a": 3, "b": 7}
    assert sorted(snap.files or {}) and snap.file_bytes() > 0
    # Without files: the same version and txns, no file list.
    bare = delta_log.snapshot(path)
    assert (bare.version, bare.txns, bare.files) == (snap.version, snap.txns, None)


def test_the_checkpoint_stands_for_the_entries_before_it(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    cp = _history(path)
    before = delta_log.snapshot(path, files=True)
    log_dir = Path(path) / "_delta_log"
    assert (log_dir / f"{cp:020d}.checkpoint.parquet").exists()
    for v in range(cp + 1):  # entries the checkpoint covers: as log cleanup leaves them
        (log_dir / f"{v:020d}.json").unlink()
    after = delta_log.snapshot(path, files=True)
    assert (after.version, after.txns, after.files) == (before.version, before.txns, before.files)


@pytest.mark.parametrize("small_rows", [0, 1000])
def test_a_big_checkpoint_is_read_as_a_small_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_rows: int
) -> None:
    """A checkpoint past SMALL_CHECKPOINT_ROWS has its NULL rows filtered out in Arrow,
    a smaller one skips them in Python: the same snapshot, and deltalake's."""
    path = str(tmp_path / "t")
    cp = _history(path)
    monkeypatch.setattr(delta_log, "SMALL_CHECKPOINT_ROWS", small_rows)
    log_dir = Path(path) / "_delta_log"
    for v in range(cp + 1):
        (log_dir / f"{v:020d}.json").unlink()
    snap = delta_log.snapshot(path, files=True)
    assert snap.version >= cp and snap.txns and snap.files and snap.protocol
    _same_as_deltalake(path, snap)


def test_multi_part_checkpoints_are_read_whole_or_not_at_all(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    cp = _history(path)
    before = delta_log.snapshot(path, files=True)
    log_dir = Path(path) / "_delta_log"
    single = log_dir / f"{cp:020d}.checkpoint.parquet"
    rows = pq.read_table(single)
    half = rows.num_rows // 2
    parts = [log_dir / f"{cp:020d}.checkpoint.{i:010d}.{2:010d}.parquet" for i in (1, 2)]
    pq.write_table(rows.slice(0, half), parts[0])
    pq.write_table(rows.slice(half), parts[1])
    single.unlink()
    (log_dir / "_last_checkpoint").unlink()
    whole = delta_log.snapshot(path, files=True)
    assert (whole.version, whole.txns, whole.files) == (before.version, before.txns, before.files)
    # One part missing: the checkpoint is incomplete, the JSON entries are replayed.
    parts[1].unlink()
    replayed = delta_log.snapshot(path, files=True)
    assert (replayed.version, replayed.txns) == (before.version, before.txns)
    assert replayed.files is not None and set(replayed.files) == set(before.files or {})
    # ... and with the entries gone too, the log cannot be followed.
    (log_dir / f"{0:020d}.json").unlink()
    with pytest.raises(LookupError, match="missing"):
        delta_log.snapshot(path)


def test_logs_it_does_not_follow(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        delta_log.snapshot(str(tmp_path / "none"))
    path = str(tmp_path / "t")
    cp = _history(path)
    log_dir = Path(path) / "_delta_log"
    # A gap after the checkpoint: the last entry moved one version on.
    (log_dir / f"{cp + 1:020d}.json").rename(log_dir / f"{cp + 2:020d}.json")
    with pytest.raises(LookupError, match=f"missing after version {cp}"):
        delta_log.snapshot(path)
    # A V2-checkpoint table (its feature in the protocol).
    v2 = tmp_path / "v2" / "_delta_log"
    v2.mkdir(parents=True)
    _entry(
        v2,
        0,
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["v2Checkpoint"],
                "writerFeatures": ["v2Checkpoint"],
            }
        },
        _metadata(),
    )
    with pytest.raises(LookupError, match="V2"):
        delta_log.snapshot(str(v2.parent))


def _metadata(**config: str) -> dict[str, Any]:
    schema = {
        "type": "struct",
        "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": {}}],
    }
    return {
        "metaData": {
            "id": "t",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(schema),
            "partitionColumns": [],
            "configuration": config,
        }
    }


def _entry(log_dir: Path, version: int, *actions: dict[str, Any]) -> None:
    text = "".join(json.dumps(a) + "\n" for a in actions)
    (log_dir / f"{version:020d}.json").write_text(text)


def _add(path: str, dv: str | None = None) -> dict[str, Any]:
    add: dict[str, Any] = {"path": path, "size": 1, "partitionValues": {}, "dataChange": True}
    if dv is not None:
        add["deletionVector"] = {
            "storageType": "u",
            "pathOrInlineDv": dv,
            "offset": 1,
            "sizeInBytes": 10,
            "cardinality": 1,
        }
    return add


def _remove(path: str, dv: str | None = None) -> dict[str, Any]:
    remove = _add(path, dv)
    remove.pop("size")
    return {"remove": remove}


def test_a_file_re_added_with_a_vector_stays_live_in_either_order(tmp_path: Path) -> None:
    log_dir = tmp_path / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    protocol = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    _entry(log_dir, 0, protocol, _metadata(), {"add": _add("a")}, {"add": _add("b")})
    # a: removed (no vector) then re-added with one; b: re-added first, then removed.
    _entry(log_dir, 1, _remove("a"), {"add": _add("a", "dv1")})
    _entry(log_dir, 2, {"add": _add("b", "dv2")}, _remove("b"))
    snap = delta_log.snapshot(str(log_dir.parent), files=True)
    assert snap.files is not None
    assert snap.files["a"]["deletionVector"]["pathOrInlineDv"] == "dv1"
    assert snap.files["b"]["deletionVector"]["pathOrInlineDv"] == "dv2"
    # Removing the pair with its current vector removes the file.
    _entry(log_dir, 3, _remove("a", "dv1"))
    assert set(delta_log.snapshot(str(log_dir.parent), files=True).files or {}) == {"b"}


MAPPED = StructType(
    [
        StructField("id", LongType()),
        StructField("v", StringType()),
        StructField("tags", ArrayType(StringType())),
        StructField("_fallback", MapType(StringType(), StringType())),
        StructField(
            "_old", StructType([StructField("id", LongType()), StructField("v", StringType())])
        ),
    ]
)


def _read(path: str) -> pa.Table:
    return query_delta(path, DeltaTable(path).version(), "SELECT * FROM t")


def _mapped_rows() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([3, 1, 2], pa.int64()),
            "v": ["c", None, "b"],
            "tags": [["x"], [], None],
            "_fallback": pa.array([[("k", "v")], [], None], pa.map_(pa.string(), pa.string())),
            "_old": [{"id": 30, "v": "old"}, None, {"id": None, "v": "o2"}],
        }
    )


def test_an_append_is_read_back_by_deltalake_with_logical_names(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    snap = delta_log.snapshot(path)
    after, metrics = delta_log.append(snap, _mapped_rows(), "app", 5)
    assert metrics["numOutputRows"] == "3"
    assert after.version == 1 and after.txns == {"app": 5}
    table = DeltaTable(path)
    assert table.version() == 1 and table.transaction_version("app") == 5
    got = _read(path).sort_by("id").to_pylist()
    assert got == _mapped_rows().sort_by("id").to_pylist()
    # The data file: physical names and field ids, nested fields of _old included.
    entry = [json.loads(line) for line in (Path(path) / "_delta_log" / f"{1:020d}.json").open()]
    assert entry[0]["commitInfo"]["engineInfo"] == DRIVER_ENGINE
    (add,) = [a["add"] for a in entry if "add" in a]
    written = pq.read_schema(Path(path) / add["path"])
    mapped = {f.name: f for f in snap.schema.fields}
    old = mapped["_old"].dataType
    assert written.names == [f.metadata[delta_log.PHYSICAL] for f in snap.schema.fields]
    assert (
        written.field(0).metadata[b"PARQUET:field_id"]
        == str(mapped["id"].metadata[delta_log.FIELD_ID]).encode()
    )
    assert [f.name for f in written.field(4).type] == [
        f.metadata[delta_log.PHYSICAL] for f in old.fields
    ]
    stats = json.loads(add["stats"])
    id_physical = mapped["id"].metadata[delta_log.PHYSICAL]
    assert (stats["numRecords"], stats["minValues"][id_physical]) == (3, 1)
    assert stats["maxValues"][id_physical] == 3


def test_an_overwrite_replaces_every_live_file(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    snap, _ = delta_log.append(delta_log.snapshot(path), _mapped_rows(), "app", 1)
    snap, _ = delta_log.append(delta_log.snapshot(path), _mapped_rows(), "app", 2)
    assert _read(path).num_rows == 6
    snap = delta_log.snapshot(path, files=True)
    after, metrics = delta_log.append(snap, _mapped_rows().slice(0, 1), "app", 3, overwrite=True)
    assert metrics["numRemovedFiles"] == "2" and after.files is not None and len(after.files) == 1
    assert _read(path).column("id").to_pylist() == [3]
    assert delta_log.snapshot(path, files=True).files == after.files


def test_a_version_taken_meanwhile_commits_nothing_and_leaves_no_file(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    snap = delta_log.snapshot(path)
    delta_log.append(snap, _mapped_rows(), "other", 1)  # another writer takes version 1
    listing = sorted(os.listdir(path))
    with pytest.raises(FileExistsError):
        delta_log.append(snap, _mapped_rows(), "app", 1)
    assert sorted(os.listdir(path)) == listing
    assert DeltaTable(path).transaction_version("app") is None


def test_big_writes_roll_over_files(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    monkeypatch.setattr(delta_log, "FILE_BYTES", 200)
    rows = pa.concat_tables([_mapped_rows()] * 20)
    after, metrics = delta_log.append(delta_log.snapshot(path, files=True), rows, "app", 1)
    assert int(metrics["numFiles"]) > 1 and len(after.files or {}) == int(metrics["numFiles"])
    assert _read(path).num_rows == 60


def test_small_files_are_written_without_dictionaries(tmp_path: Path, monkeypatch) -> None:
    """... without Parquet statistics and without the Arrow schema in the footer: read back
    alike, by deltalake and by the driver's reader (physical types from Parquet's own)."""
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    monkeypatch.setattr(delta_log, "DICTIONARY_FROM_ROWS", 10)
    small = _mapped_rows()
    big = pa.concat_tables([small] * 5)  # 15 rows
    for batch, rows in enumerate((small, big), 1):
        delta_log.append(delta_log.snapshot(path), rows, "app", batch)
    shape = {}
    read = {}
    for add in delta_log.snapshot(path, files=True).files or {}:
        meta = pq.ParquetFile(Path(path) / add).metadata
        id_column = meta.row_group(0).column(0)
        shape[meta.num_rows] = (
            any("DICTIONARY" in e for e in id_column.encodings),
            id_column.is_stats_set,
            b"ARROW:schema" in (meta.metadata or {}),
        )
        read[meta.num_rows] = delta_log.read_data_file(str(Path(path) / add))
    assert shape == {3: (False, False, False), 15: (True, True, True)}
    assert read[3].schema == read[15].schema
    assert read[3].to_pylist() == read[15].slice(0, 3).to_pylist()
    assert _read(path).num_rows == 18


def test_unknown_columns_are_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    with pytest.raises(ValueError, match="nope"):
        delta_log.append(delta_log.snapshot(path), pa.table({"nope": [1]}), "app", 1)


def test_protocols_it_does_not_write_go_to_deltalake(tmp_path: Path) -> None:
    path = str(tmp_path / "cdf")
    write_deltalake(
        path, pa.table({"x": [1]}), configuration={"delta.enableChangeDataFeed": "true"}
    )
    why = delta_log.unwritable(delta_log.snapshot(path))
    assert why is not None and "4" in why
    # arrow_append still writes it, through deltalake.
    result = arrow_append(path, pa.table({"x": [2]}), "app", 1)
    assert result.version == 1 and DeltaTable(path).transaction_version("app") == 1
    assert DeltaTable(path).history(1)[0].get("engineInfo") != DRIVER_ENGINE

    log_dir = tmp_path / "p" / "_delta_log"
    log_dir.mkdir(parents=True)
    features = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": []}
    _entry(log_dir, 0, {"protocol": features | {"writerFeatures": ["rowTracking"]}}, _metadata())
    assert "rowTracking" in (delta_log.unwritable(delta_log.snapshot(str(log_dir.parent))) or "")
    _entry(
        log_dir,
        1,
        {"protocol": features | {"writerFeatures": ["columnMapping"]}},
        _metadata(**{"delta.columnMapping.mode": "id"}),
    )
    assert "mapping mode id" in (
        delta_log.unwritable(delta_log.snapshot(str(log_dir.parent))) or ""
    )


def test_the_checkpoint_hint_spares_the_listing(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / "t")
    cp = _history(path)
    listed = []
    real = delta_log._names
    monkeypatch.setattr(delta_log, "_names", lambda d: listed.append(d) or real(d))
    before = delta_log.snapshot(path, files=True)
    assert not listed  # the hint's checkpoint, then the entries after it opened in turn
    _same_as_deltalake(path, before)
    log_dir = Path(path) / "_delta_log"
    # A stale hint whose next entries log cleanup removed: the listing finds the newer
    # checkpoint instead of taking the hint's version for the latest.
    DeltaTable(path).create_checkpoint()  # at cp + 1
    stale = json.loads((log_dir / "_last_checkpoint").read_text()) | {"version": cp}
    (log_dir / "_last_checkpoint").write_text(json.dumps(stale))
    for v in range(cp + 1):
        (log_dir / f"{v:020d}.json").unlink()
    (log_dir / f"{cp + 1:020d}.json").unlink()
    after = delta_log.snapshot(path, files=True)
    assert listed and (after.version, after.txns) == (before.version, before.txns)
    assert set(after.files or {}) == set(before.files or {})
    # A hint of a V2 checkpoint: not followed here.
    (log_dir / "_last_checkpoint").write_text(json.dumps(stale | {"v2Checkpoint": {}}))
    with pytest.raises(LookupError, match="V2"):
        delta_log.snapshot(path)


def test_append_only_tables_take_appends_not_removes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}), configuration={"delta.appendOnly": "true"})
    snap = delta_log.snapshot(path)
    assert delta_log.unwritable(snap) is None
    assert "append-only" in (delta_log.unwritable(snap, deletes=True) or "")


@pytest.mark.parametrize("writer", ["driver", "deltalake"])
def test_a_checkpoint_that_fails_leaves_the_commit_standing(
    tmp_path: Path, monkeypatch, caplog, writer: str
) -> None:
    """The driver's checkpoint writer fails (the disk is full) or does not follow the log,
    and delta-rs's, tried next, fails: the commit stands, no checkpoint is left."""
    from slotlake import delta_checkpoint

    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)

    class Broken:
        def create_checkpoint(self) -> None:
            raise OSError("disk full")

    def refused(path: str, version: int) -> list[str]:
        if writer == "driver":
            raise OSError("disk full")
        raise LookupError("a log it does not follow")

    monkeypatch.setattr(delta_checkpoint, "write_checkpoint", refused)
    monkeypatch.setattr(delta_log, "open_local", lambda p: Broken())
    snap = delta_log.snapshot(path)
    for batch in range(1, 11):
        snap, _ = delta_log.append(snap, _mapped_rows(), "app", batch)
    assert snap.version == 10 and DeltaTable(path).transaction_version("app") == 10
    assert "no checkpoint at version 10 (disk full)" in caplog.text
    if writer == "driver":
        assert "the driver's checkpoint at version 10 failed (disk full)" in caplog.text
    assert not list((Path(path) / "_delta_log").glob("*.checkpoint.parquet"))
    monkeypatch.undo()
    snap, _ = delta_log.append(snap, _mapped_rows(), "app", 11)
    assert delta_log.snapshot(path).txns == {"app": 11}


def test_a_checkpoint_at_the_interval_is_read_back(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    create_on_driver(path, MAPPED)
    snap = delta_log.snapshot(path, files=True)
    for batch in range(1, 12):
        snap, _ = delta_log.append(snap, _mapped_rows(), "app", batch)
    assert (Path(path) / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
    read = delta_log.snapshot(path, files=True)
    assert (read.version, read.txns) == (11, {"app": 11})
    assert set(read.files or {}) == set(snap.files or {})
    assert read.schema == snap.schema
    assert _read(path).num_rows == 33


def test_a_snapshot_as_of_a_version_is_what_deltalake_reads_then(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    cp = _history(path)
    for version in range(cp + 2):  # before, at and after the checkpoint
        snap = delta_log.snapshot(path, files=True, version=version)
        then = DeltaTable(path, version=version)
        assert snap.version == version
        assert set(snap.files or {}) == set(
            pa.table(then.get_add_actions(True)).column("path").to_pylist()
        )
        assert snap.txns.get("a") == then.transaction_version("a")
    with pytest.raises(LookupError, match="version 9"):
        delta_log.snapshot(path, version=9)
    # Entries before the checkpoint cleaned up: versions before it are out of reach.
    (Path(path) / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(LookupError):
        delta_log.snapshot(path, version=1)
    assert delta_log.snapshot(path, version=cp).version == cp


def _evolved(path: str) -> list[pa.Table]:
    """A column-mapped table through two appends, a column added, an append and an
    overwrite: each version's rows as deltalake reads them."""
    create_on_driver(path, MAPPED)
    snap, _ = delta_log.append(delta_log.snapshot(path), _mapped_rows(), "app", 1)
    snap, _ = delta_log.append(snap, _mapped_rows().slice(0, 1), "app", 2)
    schema = json.loads(snap.metadata["schemaString"])
    top = int(snap.configuration["delta.columnMapping.maxColumnId"]) + 1
    schema["fields"].append(
        {
            "name": "extra",
            "type": "long",
            "nullable": True,
            "metadata": {delta_log.FIELD_ID: top, delta_log.PHYSICAL: "col-extra"},
        }
    )
    config = {**snap.configuration, "delta.columnMapping.maxColumnId": str(top)}
    snap = delta_log.commit(
        snap,
        [
            {
                "metaData": {
                    **snap.metadata,
                    "schemaString": json.dumps(schema),
                    "configuration": config,
                }
            }
        ],
    )
    more = _mapped_rows().append_column("extra", pa.array([7, 8, 9], pa.int64()))
    snap, _ = delta_log.append(snap, more, "app", 3)
    snap, _ = delta_log.append(
        delta_log.snapshot(path, files=True), more.slice(1, 1), "app", 4, overwrite=True
    )
    return [query_delta(path, v, "SELECT * FROM t").sort_by("id") for v in range(snap.version + 1)]


def test_a_restore_gives_back_the_rows_and_schema_of_the_version(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    versions = _evolved(path)
    latest = len(versions) - 1
    before = delta_log.snapshot(path)
    after = delta_log.restore(path, 2)
    assert after.version == latest + 1
    assert query_delta(path, after.version, "SELECT * FROM t").sort_by("id") == versions[2]
    assert DeltaTable(path).version() == after.version
    assert "extra" not in DeltaTable(path).schema().to_arrow().names
    # Ids handed out stay handed out; txns and the protocol stay as they were.
    assert (
        after.configuration["delta.columnMapping.maxColumnId"]
        == before.configuration["delta.columnMapping.maxColumnId"]
    )
    assert after.txns == before.txns == {"app": 4}
    assert after.protocol == before.protocol
    entry = [
        json.loads(line)
        for line in (Path(path) / "_delta_log" / f"{after.version:020d}.json").open()
    ]
    assert entry[0]["commitInfo"]["operation"] == "RESTORE"
    # ... and forward again, to the overwrite; at the version already, nothing is written.
    again = delta_log.restore(path, latest)
    assert query_delta(path, again.version, "SELECT * FROM t").sort_by("id") == versions[latest]
    assert delta_log.restore(path, again.version).version == again.version
    assert delta_log.snapshot(path).version == again.version


def test_a_restore_brings_back_the_vector_a_file_had(tmp_path: Path) -> None:
    """A file live then with no vector and now with one is the same path, another file."""
    table = tmp_path / "t"
    log_dir = table / "_delta_log"
    log_dir.mkdir(parents=True)
    for name in ("a", "b", "c"):
        (table / name).write_bytes(b"")
    protocol = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    _entry(log_dir, 0, protocol, _metadata(), {"add": _add("a")}, {"add": _add("b")})
    _entry(log_dir, 1, _remove("a"), {"add": _add("a", "i" * 5)}, {"add": _add("c")})
    _entry(log_dir, 2, _remove("b"))
    zero = delta_log.snapshot(str(table), files=True, version=0).files
    after = delta_log.restore(str(table), 0)
    assert after.files == delta_log.snapshot(str(table), files=True).files
    assert (
        {k: delta_log._dv_id(v) for k, v in (after.files or {}).items()}
        == {k: delta_log._dv_id(v) for k, v in (zero or {}).items()}
        == {"a": None, "b": None}
    )


def test_a_restore_to_vacuumed_files_commits_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _evolved(path)
    gone = next(iter(delta_log.snapshot(path, files=True, version=1).files or {}))
    os.remove(os.path.join(path, gone))
    latest = delta_log.snapshot(path).version
    with pytest.raises(FileNotFoundError, match="vacuumed"):
        delta_log.restore(path, 1)
    assert delta_log.snapshot(path).version == latest


def test_rows_of_later_batches_go_by_whole_files(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    schema = StructType([StructField("_batch", LongType()), StructField("v", StringType())])
    create_on_driver(path, schema)
    for batch in (1, 2, 3):
        rows = pa.table({"_batch": pa.array([batch] * 2, pa.int64()), "v": ["x", "y"]})
        delta_log.append(delta_log.snapshot(path), rows, "app", batch)
    after = delta_log.remove_where_at_least(path, "_batch", 2)
    assert query_delta(path, after.version, "SELECT _batch FROM t").column(0).to_pylist() == [1, 1]
    assert delta_log.remove_where_at_least(path, "_batch", 2).version == after.version
    # A file with rows on both sides is refused, nothing committed.
    mixed = pa.table({"_batch": pa.array([1, 5], pa.int64()), "v": ["x", "y"]})
    delta_log.append(delta_log.snapshot(path), mixed, "app", 5)
    latest = delta_log.snapshot(path).version
    with pytest.raises(LookupError, match="both sides"):
        delta_log.remove_where_at_least(path, "_batch", 4)
    assert delta_log.snapshot(path).version == latest
    emptied = delta_log.empty(path)
    assert query_delta(path, emptied.version, "SELECT * FROM t").num_rows == 0
    assert DeltaTable(path).version() == emptied.version


def test_string_statistics_are_kept_when_their_bounds_are_short() -> None:
    """Only the bounds are written: a long string between them does not matter, a long
    bound drops the column's min/max (its null count stays)."""
    long = "m" + "x" * 40
    data = pa.table(
        {
            "inside": ["a", long, "z"],
            "bound": ["a", "b", "z" * 33],
            "n": [3, None, 1],
            "d": pa.array([None, None, None], pa.string()),
        }
    )
    stats = delta_log.file_stats(data)
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"inside": "a", "n": 1}
    assert stats["maxValues"] == {"inside": "z", "n": 3}
    assert stats["nullCount"] == {"inside": 0, "bound": 0, "n": 1, "d": 3}
