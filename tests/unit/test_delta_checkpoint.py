"""The driver's checkpoint writer (slotlake.delta_checkpoint) against delta-rs's
``create_checkpoint`` of the same table: the same protocol, metadata, txns, live files and
tombstones, read back by delta-rs and by the driver's log reader, also once the entries
it covers are gone; tombstones expire by the table's retention; a log it does not follow
is left to delta-rs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import ArrayType, LongType, MapType, StringType, StructField, StructType

from slotlake import delta_checkpoint, delta_log, dv_merge
from slotlake.catalog import TableCatalog
from slotlake.decode import arrow_schema_for
from slotlake.delta import create_on_driver
from slotlake.delta_checkpoint import write_checkpoint
from slotlake.delta_log import checkpoint_actions
from slotlake.lake import query_delta

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("v", StringType()),
        StructField("_fallback", MapType(StringType(), StringType())),
        StructField("_missing_toast", ArrayType(StringType())),
    ]
)
CAT = TableCatalog(
    name="public.t",
    columns=[("id", "bigint"), ("v", "string")],
    state_columns=["id", "v"],
    key_columns=["id"],
)
WEEK_MS = 7 * 24 * 3600 * 1000


def _data(ids: list[int], v: str) -> pa.Table:
    return (
        pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{v}{i}" for i in ids]})
        .append_column("_fallback", pa.array([[] for _ in ids], pa.map_(pa.string(), pa.string())))
        .append_column("_missing_toast", pa.array([[] for _ in ids], pa.list_(pa.string())))
    )


def _merged(ids: list[int], v: str, deleted: list[int]) -> pa.Table:
    """Final rows for dv_merge: ``ids`` updated to ``v``, ``deleted`` deleted."""
    every = ids + deleted
    state = arrow_schema_for(SCHEMA)
    rows = _data(every, v).cast(state)
    rows = rows.append_column(
        "_key",
        pa.array(
            [{"id": i, "~id": None} for i in every],
            pa.struct([("id", pa.int64()), ("~id", pa.string())]),
        ),
    )
    return rows.append_column("_deleted", pa.array([i in deleted for i in every]))


def _history(path: str) -> int:
    """Appends under two app ids, an overwrite (tombstones), MERGEs with deletion vectors
    (a file re-added with a vector, then with a grown one); the last version."""
    create_on_driver(path, SCHEMA)
    snap = delta_log.snapshot(path, files=True)
    snap, _ = delta_log.append(snap, _data([1, 2, 3], "a"), "app", 1)
    snap, _ = delta_log.append(snap, _data([4, 5], "a"), "app", 2)
    snap, _ = delta_log.append(snap, _data(list(range(10)), "o"), "app", 3, overwrite=True)
    snap, _ = delta_log.append(snap, _data([20, 21], "b"), "other", 7)
    for batch, (ids, gone) in enumerate([([1, 2], [3]), ([4], [5, 6])], start=4):
        assert dv_merge.merge_keyed(
            path, _merged(ids, f"m{batch}", gone), CAT, "app", batch, True, 0
        )
    return delta_log.snapshot(path).version


def _actions(path: str) -> dict[str, Any]:
    """A checkpoint's actions by kind, comparable across writers."""
    out: dict[str, Any] = {"add": {}, "remove": {}, "txn": {}}
    for kind, action in checkpoint_actions(path):
        if kind in ("add", "remove"):
            key = (action["path"], delta_log._dv_id(action))
            out[kind][key] = {k: v for k, v in action.items() if k != "dataChange"}
        elif kind == "txn":
            out["txn"][action["appId"]] = action
        else:
            out[kind] = action
    return out


def _checkpoint_file(path: str, version: int) -> str:
    return str(Path(path) / "_delta_log" / f"{version:020d}.checkpoint.parquet")


def test_the_checkpoint_is_the_one_deltalake_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    theirs = str(tmp_path / "copy")
    shutil.copytree(path, theirs)
    DeltaTable(theirs).create_checkpoint()
    assert write_checkpoint(path, version) == [
        _checkpoint_file(path, version),
        str(Path(path) / "_delta_log" / "_last_checkpoint"),
    ]
    ours, reference = (
        _actions(_checkpoint_file(path, version)),
        _actions(_checkpoint_file(theirs, version)),
    )
    assert ours["protocol"] == reference["protocol"]
    assert ours["metaData"] == reference["metaData"]
    assert ours["txn"] == reference["txn"] and set(ours["txn"]) == {"app", "other"}
    assert ours["add"] == reference["add"]
    assert ours["remove"].keys() == reference["remove"].keys()
    # Tombstones of the overwrite, and of the file whose vector grew: its plain and
    # first-vector pairs (the second is live).
    vectored = [k for k in ours["add"] if k[1] is not None]
    assert len(vectored) == 1
    assert len([k for k in ours["remove"] if k[0] == vectored[0][0]]) == 2
    assert len(ours["remove"]) == 4
    assert all(ours["remove"][k]["deletionTimestamp"] for k in ours["remove"])
    assert _shape(pq.read_schema(_checkpoint_file(path, version))) == _shape(
        pq.read_schema(_checkpoint_file(theirs, version))
    )
    hint = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
    assert hint["version"] == version and hint["numOfAddFiles"] == len(ours["add"])
    assert hint["size"] == pq.read_metadata(_checkpoint_file(path, version)).num_rows


def _shape(t: Any) -> Any:
    """A schema's names, types and nullability, whatever its maps' entries are called."""
    if isinstance(t, pa.Schema):
        return [(f.name, f.nullable, _shape(f.type)) for f in t]
    if isinstance(t, pa.MapType):
        return ("map", _shape(t.key_type), _shape(t.item_type))
    if isinstance(t, pa.ListType):
        return ("list", t.value_field.nullable, _shape(t.value_type))
    if isinstance(t, pa.StructType):
        return [(f.name, f.nullable, _shape(f.type)) for f in t]
    return str(t)


def _files(snap: delta_log.Snapshot) -> dict[str, tuple[str | None, int]]:
    return {p: (delta_log._dv_id(a), a["size"]) for p, a in (snap.files or {}).items()}


def test_readers_take_the_checkpoint_for_the_entries_it_covers(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    before = delta_log.snapshot(path, files=True)
    rows = query_delta(path, version, "SELECT * FROM t ORDER BY id")
    write_checkpoint(path, version)
    for v in range(version + 1):  # as log cleanup leaves them
        (Path(path) / "_delta_log" / f"{v:020d}.json").unlink()
    table = DeltaTable(path)
    assert table.version() == version
    assert table.transaction_version("app") == 5 and table.transaction_version("other") == 7
    assert query_delta(path, version, "SELECT * FROM t ORDER BY id") == rows
    assert [r["id"] for r in rows.select(["id"]).to_pylist()] == [0, 1, 2, 4, 7, 8, 9, 20, 21]
    after = delta_log.snapshot(path, files=True)
    assert (after.version, after.txns) == (before.version, before.txns)
    assert _files(after) == _files(before)
    # The log goes on from it: a commit after the checkpoint, read by both.
    snap, _ = delta_log.append(after, _data([30], "c"), "app", 6)
    assert query_delta(path, snap.version, "SELECT count(*) AS n FROM t").column(0)[0].as_py() == 10
    assert DeltaTable(path).transaction_version("app") == 6


def test_tombstones_expire_by_the_tables_retention(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    state = delta_checkpoint.replay(path, version)
    stamps = sorted(int(r["deletionTimestamp"]) for r in state.tombstones.values())
    assert stamps

    def removes(now_ms: int) -> int:
        write_checkpoint(path, version, now_ms=now_ms)
        return len(_actions(_checkpoint_file(path, version))["remove"])

    assert removes(stamps[0] + WEEK_MS) == len(stamps)
    # A table with a retention of its own (replayed from the checkpoint just written).
    snap = delta_log.snapshot(path)
    metadata = dict(snap.metadata)
    metadata["configuration"] = {
        **snap.configuration,
        delta_checkpoint.TOMBSTONE_RETENTION: "interval 1 hour",
    }
    delta_log.commit(snap, [{"metaData": metadata}])
    version += 1
    assert removes(stamps[-1] + 3_600_000) >= 1
    assert removes(stamps[-1] + 3_600_001) == 0
    # Expired tombstones are gone for good: the next checkpoint replays from this one.
    snap = delta_log.snapshot(path)
    metadata["configuration"][delta_checkpoint.TOMBSTONE_RETENTION] = "interval 1 week"
    delta_log.commit(snap, [{"metaData": metadata}])
    version += 1
    assert removes(stamps[0]) == 0


def test_the_hint_never_goes_back(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    write_checkpoint(path, version)
    assert write_checkpoint(path, version - 2) == [_checkpoint_file(path, version - 2)]
    hint = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
    assert hint["version"] == version
    # The older one is whole too: what that version's replay gives.
    then = delta_log.snapshot(path, files=True, version=version - 2).files or {}
    older = _actions(_checkpoint_file(path, version - 2))["add"]
    assert set(older) == {(a["path"], delta_log._dv_id(a)) for a in then.values()}
    assert not list((Path(path) / "_delta_log").glob(".*tmp"))


def test_a_log_it_does_not_follow_is_left_to_deltalake(tmp_path: Path, caplog: Any) -> None:
    """An action kind this writer does not know (domain metadata) in the log: LookupError,
    and the commit's checkpoint is written by delta-rs."""
    path = str(tmp_path / "t")
    version = _history(path)
    entry = Path(path) / "_delta_log" / f"{version:020d}.json"
    domain = {"domainMetadata": {"domain": "x", "configuration": "{}", "removed": False}}
    entry.write_text(entry.read_text() + json.dumps(domain) + "\n")
    with pytest.raises(LookupError, match="domainMetadata"):
        write_checkpoint(path, version)
    with caplog.at_level("INFO", logger="slotlake.delta_log"):
        delta_log.checkpoint(path, version)
    assert "through delta-rs" in caplog.text
    written_by = pq.read_metadata(_checkpoint_file(path, version)).created_by
    assert written_by.startswith("parquet-rs"), written_by


def test_entries_missing_before_the_version_are_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    version = _history(path)
    (Path(path) / "_delta_log" / f"{2:020d}.json").unlink()
    with pytest.raises(LookupError, match="missing"):
        write_checkpoint(path, version)
    with pytest.raises(LookupError, match="no log entry"):
        write_checkpoint(path, version + 1)


def test_a_big_tables_checkpoint_is_left_to_deltalake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Past ROWS_MAX actions (replayed, or in the checkpoint it would start from) delta-rs
    writes the checkpoint: it takes thousands of files in Rust."""
    path = str(tmp_path / "t")
    version = _history(path)
    rows = len(_actions_of(delta_checkpoint.replay(path, version)))
    monkeypatch.setattr(delta_checkpoint, "ROWS_MAX", rows - 1)
    with pytest.raises(LookupError, match="actions"):
        write_checkpoint(path, version)
    with caplog.at_level("INFO", logger="slotlake.delta_log"):
        delta_log.checkpoint(path, version)
    assert "through delta-rs" in caplog.text
    assert pq.read_metadata(_checkpoint_file(path, version)).created_by.startswith("parquet-rs")
    # The next one would start from that checkpoint, already too big: refused unread.
    snap, _ = delta_log.append(delta_log.snapshot(path), _data([40], "e"), "app", 6)
    monkeypatch.setattr(delta_checkpoint, "ROWS_MAX", 2)
    with pytest.raises(LookupError, match="more than 2"):
        write_checkpoint(path, snap.version)


def _actions_of(state: delta_checkpoint.TableState) -> list[Any]:
    return [*state.live, *state.tombstones]


def _killed_mid_write(path: str, version: int) -> None:
    """A forked writer SIGKILLed between writing the checkpoint beside its name and the
    rename (what a job killed mid-checkpoint leaves)."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies before reporting
        os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
        write_checkpoint(path, version)
        os._exit(0)  # never reached: the rename kills it
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_write_killed_before_its_rename_leaves_a_scratch_file_readers_ignore(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t")
    last = _history(path)
    _killed_mid_write(path, last)
    (scratch,) = delta_checkpoint.leftovers(path)
    assert Path(scratch).name.endswith(".checkpoint.tmp") and Path(scratch).stat().st_size > 0
    assert not Path(_checkpoint_file(path, last)).exists()
    # Neither reader takes it for a checkpoint; a later write succeeds beside it.
    assert DeltaTable(path).version() == last
    assert delta_log.snapshot(path, files=True).version == last
    write_checkpoint(path, last)
    assert Path(_checkpoint_file(path, last)).exists()
    assert delta_checkpoint.leftovers(path) == [scratch]
    # Other hidden files of the log are not its own.
    (Path(path) / "_delta_log" / ".00000000000000000003.json.tmp").write_text("{")
    assert delta_checkpoint.leftovers(path) == [scratch]
    assert delta_checkpoint.leftovers(str(tmp_path / "missing")) == []
