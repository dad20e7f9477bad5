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
    mark_gone,
    read_state,
    table_dir_name,
    table_names,
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


def _committed_with_raw(lake: Lake, root: Path, batches: range, no_raw: int = 0) -> None:
    """Committed records for ``batches``, each naming a raw directory made for it (but
    batch ``no_raw``'s, which has none, as a bootstrap's)."""
    for b in batches:
        rec = _record(b)
        if b != no_raw:
            rec.raw = lake.batch_path(RAW, b, f"a{b}")
            (root / rec.raw).mkdir(parents=True)
        lake.write_commit(rec)


def _reads_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch numbers of the commit records read from now on, in order."""
    read: list[int] = []
    real = Lake.read_commit
    monkeypatch.setattr(Lake, "read_commit", lambda self, b: read.append(b) or real(self, b))
    return read


def test_the_quick_sweep_reads_only_the_records_that_can_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync sweeps before every batch: it must not read the lake's whole history."""
    lake = Lake(tmp_path)
    _committed_with_raw(lake, tmp_path, range(1, 6))
    # Batch 4's crashed first attempt, beside the raw it committed with: its record tells.
    twin = lake.batch_path(RAW, 4, "dead")
    (tmp_path / twin).mkdir()
    # A lone directory the record does not name (only a skipped sweep leaves one): kept by
    # the quick sweep, removed by the thorough one.
    stray = lake.batch_path(RAW, 6, "f6")
    rec = _record(6)
    lake.write_commit(rec)
    (tmp_path / stray).mkdir()
    read = _reads_counted(monkeypatch)
    assert lake.remove_uncommitted() == [twin]
    assert read == [4]
    assert lake.remove_uncommitted(thorough=True) == [stray]
    assert sorted(set(read[1:])) == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / RAW).iterdir()) == [
        f"b{b:020d}-a{b}" for b in range(1, 6)
    ]


def test_expiry_keeps_the_newest_batches_raw_without_reading_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(tmp_path)
    # Batch 1 (a bootstrap's) has no raw, and still counts as a batch.
    _committed_with_raw(lake, tmp_path, range(1, 6), no_raw=1)
    (tmp_path / lake.batch_path(RAW, 2, "dead")).mkdir()  # an expired batch's stray
    pending = lake.batch_path(RAW, 6, "next")  # the next batch's pull: not a commit's
    (tmp_path / pending).mkdir()
    monkeypatch.setattr(Lake, "read_commit", lambda self, b: pytest.fail(f"read {b}"))
    assert lake.expire_raw(-1) == []
    assert lake.expire_raw(2) == [
        lake.batch_path(RAW, 2, "a2"),
        lake.batch_path(RAW, 2, "dead"),
        lake.batch_path(RAW, 3, "a3"),
    ]
    assert sorted(p.name for p in (tmp_path / RAW).iterdir()) == [
        "b00000000000000000004-a4",
        "b00000000000000000005-a5",
        "b00000000000000000006-next",
    ]


def test_the_thorough_sweep_reads_only_the_records_of_batches_with_raw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """maintain's sweep must not read a long lake's whole history either: the records of
    batches whose raw was expired cannot name a directory that is there."""
    lake = Lake(tmp_path)
    _committed_with_raw(lake, tmp_path, range(1, 31))
    assert len(lake.expire_raw(4)) == 26
    stray = lake.batch_path(RAW, 29, "dead")  # a crashed first attempt of batch 29
    gap = lake.batch_path(RAW, 12, "beef")  # its record names the expired a12
    for rel in (stray, gap):
        (tmp_path / rel).mkdir()
    read = _reads_counted(monkeypatch)
    assert sorted(lake.remove_uncommitted(thorough=True)) == sorted([gap, stray])
    assert sorted(set(read)) == [12, 27, 28, 29, 30]


def test_expired_commit_records_are_a_prefix_that_spares_raw_and_the_window(
    tmp_path: Path,
) -> None:
    lake = Lake(tmp_path)
    # Batch 1 (a bootstrap's) has no raw; every later batch kept its raw so far.
    _committed_with_raw(lake, tmp_path, range(1, 21), no_raw=1)
    assert lake.expire_commits(-1, 3) == []
    # Raw kept for every sync batch: the bootstrap's record is the one before the oldest
    # raw (a reprocess of batch 2 starts from it), so nothing may go.
    assert lake.expire_commits(5, 3) == []
    assert lake.commits_expired_upto() == 0
    lake.expire_raw(9)  # raw of batches 12..20 left
    # Keep 5, but the raw of 12..20 needs its records and the one before (11).
    removed = lake.expire_commits(5, 3)
    assert removed == [f"_commits/{b:020d}.json" for b in range(1, 11)]
    assert lake.commit_batches() == list(range(11, 21))
    assert lake.commits_expired_upto() == 10
    with pytest.raises(LakeError, match=r"batch 4's commit record .* was expired by slotlake"):
        table_names(tmp_path, 4)
    with pytest.raises(LakeError, match="batch 21 is not committed"):
        table_names(tmp_path, 21)
    assert table_names(tmp_path, 11) == []
    # Without raw, the window of readable batches (state_versions + 1) bounds it.
    lake.expire_raw(0)
    assert lake.expire_commits(0, 3) == [f"_commits/{b:020d}.json" for b in range(11, 17)]
    assert lake.commit_batches() == [17, 18, 19, 20]
    assert lake.commits_expired_upto() == 16
    # The newest record always stays; the marker is no commit record.
    assert lake.expire_commits(0, 0) == [f"_commits/{b:020d}.json" for b in (17, 18, 19)]
    assert lake.commit_batches() == [20] and lake.last_commit().batch == 20
    assert lake.remove_uncommitted(thorough=True) == []
    assert (tmp_path / "_commits" / "expired.json").exists()


def test_snapshot_copies_are_judged_by_their_own_batch_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotlake.snapshot import SNAPSHOTS, remove_orphans

    lake = Lake(tmp_path)

    def copy(batch: int, attempt: str) -> dict[str, dict[str, str]]:
        rel = f"{SNAPSHOTS}/b{batch:020d}-{attempt}"
        (tmp_path / rel / "public.t").mkdir(parents=True)
        return {"public.t": {"staging": f"{rel}/public.t"}}

    for b in range(1, 5):
        rec = _record(b)
        rec.raw = lake.batch_path(RAW, b, f"a{b}")
        if b in (2, 3):
            rec.snapshot = {"tables": copy(b, f"a{b}")}
        if b != 2:  # batch 2's raw expired: its copy goes with it
            (tmp_path / rec.raw).mkdir(parents=True)
        lake.write_commit(rec)
    killed = copy(5, "dead")  # a run killed before its plan
    planned = _plan(6, "b6")
    planned.snapshot = {"tables": copy(6, "b6")}  # an unfinished batch's copy: kept
    lake.write_plan(planned)
    read = _reads_counted(monkeypatch)
    assert killed and sorted(remove_orphans(lake)) == [
        f"{SNAPSHOTS}/b{2:020d}-a2",
        f"{SNAPSHOTS}/b{5:020d}-dead",
    ]
    assert sorted(read) == [2, 3]
    assert sorted(p.name for p in (tmp_path / SNAPSHOTS).iterdir()) == [
        f"b{3:020d}-a3",
        f"b{6:020d}-b6",
    ]


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


def test_the_thorough_sweep_removes_checkpoint_scratch_files_of_the_lakes_tables(
    tmp_path: Path,
) -> None:
    """A checkpoint write killed before its rename leaves a scratch file in the table's
    log: maintain (thorough, under the slot's lock) removes it, a sync's sweep does not
    list every table's log."""
    from slotlake import delta_checkpoint

    lake = Lake(tmp_path)
    lake.write_commit(_record(1, **{"public.t": TableCommit("changes/public.t", "state/public.t")}))
    logs = {rel: tmp_path / rel / "_delta_log" for rel in ("state/public.t", "changes/public.t")}
    for d in logs.values():
        d.mkdir(parents=True)
    scratch = logs["state/public.t"] / delta_checkpoint._scratch_name("checkpoint")
    hint = logs["changes/public.t"] / delta_checkpoint._scratch_name("last_checkpoint")
    foreign = logs["state/public.t"] / ".other.tmp"
    for f in (scratch, hint, foreign):
        f.write_text("x")
    assert lake.remove_uncommitted() == []
    assert sorted(lake.remove_uncommitted(thorough=True)) == sorted(
        [str(p.relative_to(tmp_path)) for p in (scratch, hint)]
    )
    assert not scratch.exists() and not hint.exists() and foreign.exists()


def test_mark_gone_marks_unwritten_unpublished_tables_from_their_first_batch() -> None:
    def table(written: bool, gone_since: int | None = None) -> TableCommit:
        return TableCommit("c", "s", written=written, gone_since=gone_since)

    tables = {
        "public.kept": table(False),
        "public.left": table(False),
        "public.wrote": table(True),  # published after the set was read, or dropped later
        "public.before": table(False, gone_since=3),
        "public.back": table(True, gone_since=3),
    }
    mark_gone(tables, {"public.kept": 1, "public.back": 2}, 7)
    assert {n: t.gone_since for n, t in tables.items()} == {
        "public.kept": None,
        "public.left": 7,
        "public.wrote": None,
        "public.before": 3,
        "public.back": None,
    }
    mark_gone(tables, None, 8)  # a published set not known: nothing changes
    assert tables["public.left"].gone_since == 7 and tables["public.kept"].gone_since is None


def test_state_rows_say_what_they_count() -> None:
    def table(**kw: object) -> TableCommit:
        return TableCommit("c", "s", state_rows=5, **kw)  # type: ignore[arg-type]

    assert table(key_columns=["id"], replica_identity="d").state_rows_text() == "5 rows"
    full = {"key_columns": ["id"], "replica_identity": "f"}
    assert table(**full).state_rows_text() == "5 distinct rows (multiset)"
    assert table(replica_identity="d").state_rows_text() == "5 distinct rows (multiset)"
    assert (
        table(**full, unique_on=["id", "k"]).state_rows_text()
        == "5 rows (multiset unique on id, k)"
    )
    assert (
        table(replica_identity="n", spread=True).state_rows_text()
        == "5 rows with their copies (multiset)"
    )


def test_a_root_that_is_no_lake_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A new, empty or first-attempt root (``_raw`` …) is a lake to be; a file, or a
    directory holding other files, is refused naming them, and left as it was."""
    from slotlake.lake import NotALakeError

    assert Lake(tmp_path / "new").layout() is None
    first = tmp_path / "first"
    (first / "_raw" / "b00000000000000000001-abc").mkdir(parents=True)
    (first / ".hidden").write_text("")
    assert Lake(first).layout() is None

    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotALakeError, match=r"a_file is a file, not a directory"):
        Lake(tmp_path / "a_file").layout()
    other = tmp_path / "other"
    other.mkdir()
    for name in ("readme.txt", "data", "b", "c"):
        (other / name).write_text("")
    with pytest.raises(NotALakeError) as err:
        Lake(other).ensure_layout()
    assert str(err.value) == (
        f"lake.path {other} holds no lake (_slotlake.json) but other files "
        "(b, c, data and 1 more): give slotlake a new or empty directory"
    )
    assert sorted(p.name for p in other.iterdir()) == ["b", "c", "data", "readme.txt"]
