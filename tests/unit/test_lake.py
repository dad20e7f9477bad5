from pathlib import Path

import pytest

from slotlake.lake import Lake, LakeError, TableCommit, make_record, read_state, table_dir_name


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


def test_uncommitted_attempts_are_removed_and_committed_kept(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    kept = lake.batch_path("state", 1, "aaa", "public.t")
    orphan = lake.batch_path("state", 2, "bbb", "public.t")
    orphan_raw = lake.batch_path("_raw", 2, "bbb")
    for rel in (kept, orphan, orphan_raw):
        (tmp_path / rel).mkdir(parents=True)
    lake.write_commit(_record(1, **{"public.t": TableCommit(changes=None, state=kept)}))
    (tmp_path / "_commits" / ".00000000000000000002.json.abc.tmp").write_text("{")
    removed = lake.remove_uncommitted()
    assert sorted(removed) == sorted(
        [orphan, orphan_raw, "_commits/.00000000000000000002.json.abc.tmp"]
    )
    assert lake.commit_batches() == [1]
    assert (tmp_path / kept).is_dir() and not (tmp_path / orphan).exists()


def test_readers_refuse_what_is_not_committed(tmp_path: Path) -> None:
    with pytest.raises(LakeError, match="no committed state"):
        read_state(tmp_path, "public.t")
    lake = Lake(tmp_path)
    lake.write_commit(
        _record(1, **{"public.t": TableCommit(changes=None, state="state/public.t/gone")})
    )
    with pytest.raises(LakeError, match="is missing"):
        read_state(tmp_path, "public.t")
