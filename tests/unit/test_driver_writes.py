"""Who writes a driver-lane table's state (:meth:`slotlake.batch.DriverWrites.take`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotlake.batch import DriverWrites
from slotlake.catalog import TableCatalog
from slotlake.lake import Lake

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
