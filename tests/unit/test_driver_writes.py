"""Who writes a driver-lane table's state (:meth:`slotlake.batch.DriverWrites.take`), and
whether an INSERT-only table's rows are appended to it (:func:`slotlake.batch.appends_only`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlake.batch import DriverWrites, _state_rows, appends_only
from slotlake.catalog import RelationVersion, TableCatalog
from slotlake.delta import WriteResult
from slotlake.lake import CommitRecord, Lake, TableCommit, make_record

MIB = 1 << 20
KEYED = TableCatalog(name="public.k", key_columns=["id"], replica_identity="d")
MULTISET = TableCatalog(name="public.m", key_columns=[], replica_identity="f")


@pytest.mark.parametrize(
    ("cat", "size", "vectors", "expected"),
    [
        (KEYED, None, True, "driver"),  # created by this batch
        (KEYED, 1 * MIB, True, "driver"),  # small: deltalake rewrites it
        (KEYED, 5 * MIB, True, "driver-dv"),  # mid-sized: vectors, still on the driver
        (KEYED, 5 * MIB, False, "driver"),
        (KEYED, 100 * MIB, True, "dv"),  # past driver_write_state_mb
        (KEYED, 100 * MIB, False, "spark"),
        (MULTISET, 5 * MIB, True, "driver"),  # rebuilt whole: no vectors
        (MULTISET, 100 * MIB, True, None),  # too big to rebuild: Spark does it all
    ],
)
def test_state_merge_by_size(
    tmp_path: Path, cat: TableCatalog, size: int | None, vectors: bool, expected: str | None
) -> None:
    driver = DriverWrites(max_rows=1000, max_state_bytes=64 * MIB, deletion_vectors=vectors)
    assert driver.take(Lake(tmp_path), cat, "state", 10, size) == expected


def test_too_many_changes_or_no_driver_lane(tmp_path: Path) -> None:
    driver = DriverWrites(max_rows=1000, max_state_bytes=64 * MIB)
    assert driver.take(Lake(tmp_path), KEYED, "state", 1001, MIB) is None
    assert DriverWrites(max_rows=0).take(Lake(tmp_path), KEYED, "state", 0, MIB) is None
    assert "deletion vectors" in driver.describe()


def _version(identity: str, key: tuple[str, ...] = (), seq: int = 1) -> RelationVersion:
    return RelationVersion(seq, 16384, identity, (), key, ())


def _table(*versions: RelationVersion) -> TableCatalog:
    last = versions[-1]
    return TableCatalog(
        name="public.ev",
        versions=list(versions),
        key_columns=list(last.key_columns),
        replica_identity=last.replica_identity,
    )


def _prior(identity: str, key: list[str], state: str | None = "state/public.ev") -> TableCommit:
    return TableCommit(
        changes="changes/public.ev", state=state, replica_identity=identity, key_columns=key
    )


@pytest.mark.parametrize(
    ("versions", "prior", "expected"),
    [
        ((_version("d"),), None, True),  # no key, identity DEFAULT: INSERTs only
        ((_version("n"),), _prior("d", []), True),  # identity NOTHING, state counted
        ((_version("d"),), _prior("f", []), True),  # was FULL: its state is counted too
        ((_version("d"),), _prior("d", [], state=None), True),  # never written
        ((_version("f"),), None, False),  # FULL: updates and deletes are published
        ((_version("d", ("id",)),), None, False),  # keyed
        ((_version("f"), _version("d", seq=2)), _prior("f", []), False),  # FULL in the batch
        ((_version("d"),), _prior("d", ["id"]), False),  # the state is still keyed
        ((), None, False),  # no relation in the batch (a snapshot table): nothing to append
    ],
)
def test_appends_only(
    versions: tuple[RelationVersion, ...], prior: TableCommit | None, expected: bool
) -> None:
    cat = _table(*versions) if versions else TableCatalog(name="public.ev", replica_identity="d")
    assert appends_only(cat, prior) is expected


def test_an_insert_only_state_is_appended_on_the_driver_whatever_it_weighs(tmp_path: Path) -> None:
    driver = DriverWrites(max_rows=1000, max_state_bytes=64 * MIB)
    cat = _table(_version("d"))
    lake = Lake(tmp_path)
    assert driver.take(lake, cat, "state", 10, 100 * MIB, appends=True) == "append"
    assert driver.take(lake, cat, "state", 10, 100 * MIB) is None  # as a rebuilt multiset
    assert driver.take(lake, cat, "state", 1001, MIB, appends=True) is None  # too many rows
    assert driver.pick(lake, [cat], {cat.name: 10}, {cat.name: 100 * MIB}, {cat.name}) == {
        cat.name: "append"
    }


@pytest.mark.parametrize(
    ("metrics", "appended", "expected"),
    [
        ({"numOutputRows": "3"}, True, 10 + 3),  # appended to the prior's 10 rows
        ({"numOutputRows": "3"}, False, 3),  # an overwrite: all of the state
        ({"numTargetRowsInserted": "2", "numTargetRowsDeleted": "1"}, False, 10 + 2 - 1),
    ],
)
def test_state_rows_after_the_write(metrics: dict[str, str], appended: bool, expected: int) -> None:
    prior = TableCommit(changes=None, state="s", state_rows=10)
    assert _state_rows(prior, WriteResult(1, metrics), appended) == expected


def test_the_spread_mark_is_kept_in_the_record_and_absent_means_not_spread() -> None:
    lsns = {"start_lsn": "0/0", "end_lsn": "0/1", "target_lsn": "0/1"}
    table = TableCommit(changes=None, state="s", spread=True)
    record = make_record(batch=1, attempt="a", slot="s", raw=None, **lsns, tables={"t": table})
    text = record.to_json()
    assert CommitRecord.from_json(text).tables["t"].spread is True
    older = json.loads(text)
    del older["tables"]["t"]["spread"]  # a record written before the mark
    assert CommitRecord.from_json(json.dumps(older)).tables["t"].spread is False
