import json
from pathlib import Path

import pytest

from slotlake.lake import (
    RAW,
    BatchPlan,
    Lake,
    LakeError,
    OldLayoutError,
    TableCommit,
    make_record,
    read_state,
    table_dir_name,
)


def test_plain_table_names_stay_readable() -> None:
    assert table_dir_name("public.orders") == "public.orders"


@pytest.mark.parametrize(
    "name", ["public.a/b", "public.x:y", 'public."Mixed Case"', "..hidden", "s.ü"]
)
def test_unsafe_table_names_become_distinct_safe_directories(name: str) -> None:
    d = table_dir_name(name)
    assert all(c.isalnum() or c in "._-" for c in d) and not d.startswith(".")
    assert d != table_dir_name(name + "x")


def _record(batch: int, **tables: TableCommit):  # type: ignore[no-untyped-def]
    return make_record(
        batch=batch,
        attempt=f"a{batch}",
        slot="s",
        start_lsn="0/0",
        end_lsn=f"0/{batch}",
        target_lsn=f"0/{batch}",
        raw=None,
        tables=dict(tables),
    )


def test_commit_is_atomic_and_never_overwritten(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    assert lake.last_commit() is None
    lake.write_commit(_record(1))
    with pytest.raises(LakeError, match="already committed"):
        lake.write_commit(_record(1))
    lake.write_commit(_record(2))
    assert lake.commit_batches() == [1, 2]
    assert lake.last_commit().end_lsn == "0/2"
    # No temporary file is left beside the records.
    assert sorted(p.name for p in (tmp_path / "_commits").iterdir()) == [
        "00000000000000000001.json",
        "00000000000000000002.json",
    ]


def test_uncommitted_raw_and_stale_plans_are_removed_and_committed_kept(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    kept = lake.batch_path(RAW, 1, "aaa")
    pending = lake.batch_path(RAW, 2, "bbb")
    orphan = lake.batch_path(RAW, 3, "ccc")
    for rel in (kept, pending, orphan):
        (tmp_path / rel).mkdir(parents=True)
    rec = _record(1)
    rec.raw = kept
    lake.write_commit(rec)
    lake.write_plan(_plan(1, "aaa"))  # left behind by a kill right after the commit
    lake.write_plan(_plan(2, "bbb"))  # an unfinished batch: its raw is kept for the rerun
    (tmp_path / "_commits" / ".00000000000000000002.json.abc.tmp").write_text("{")
    removed = lake.remove_uncommitted()
    assert sorted(removed) == sorted([orphan, "_commits/.00000000000000000002.json.abc.tmp"])
    assert lake.commit_batches() == [1]
    assert (tmp_path / kept).is_dir() and (tmp_path / pending).is_dir()
    assert not (tmp_path / orphan).exists()
    assert lake.read_plan(1) is None and lake.read_plan(2) == _plan(2, "bbb")
    assert not list((tmp_path / "_commits").glob(".*"))


def _plan(batch: int, attempt: str) -> BatchPlan:
    return BatchPlan(
        batch=batch,
        attempt=attempt,
        slot="s",
        start_lsn="0/0",
        end_lsn="0/9",
        target_lsn="0/9",
        raw=f"_raw/b{batch:020d}-{attempt}",
        raw_messages=3,
        raw_bytes=10,
        txn_app_id="slotlake-x",
    )


def test_a_plan_is_written_once(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    lake.write_plan(_plan(4, "aaa"))
    with pytest.raises(LakeError, match="already has a plan"):
        lake.write_plan(_plan(4, "bbb"))
    assert lake.read_plan(4).attempt == "aaa"  # type: ignore[union-attr]


def test_layout_marker_and_app_id_are_stable(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    assert lake.layout() is None
    app = lake.app_id()
    assert app.startswith("slotlake-") and Lake(tmp_path).app_id() == app
    assert Lake(tmp_path).app_id("r1") == f"{app}-r1"
    assert json.loads((tmp_path / "_slotlake.json").read_text())["layout"] == "delta"


def test_old_parquet_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "_commits").mkdir()
    (tmp_path / "_commits" / "00000000000000000001.json").write_text(
        json.dumps({"batch": 1, "tables": {}})
    )
    for call in (
        lambda: Lake(tmp_path).last_commit(),
        lambda: read_state(tmp_path, "public.t"),
        lambda: Lake(tmp_path).ensure_layout(),
    ):
        with pytest.raises(OldLayoutError) as err:
            call()
        msg = str(err.value)
        assert "old Parquet layout" in msg and "\n" not in msg and str(tmp_path) in msg


def test_readers_refuse_what_is_not_committed(tmp_path: Path) -> None:
    with pytest.raises(LakeError, match="no committed state"):
        read_state(tmp_path, "public.t")
    lake = Lake(tmp_path)
    lake.write_commit(
        _record(
            1,
            **{"public.t": TableCommit(changes=None, state="state/public.t", state_version=0)},
        )
    )
    with pytest.raises(LakeError, match="is missing"):
        read_state(tmp_path, "public.t")
    with pytest.raises(LakeError, match="batch 7 is not committed"):
        read_state(tmp_path, "public.t", batch=7)
