"""The driver's streamed bootstrap copy, without PostgreSQL: ``concurrent_ranges`` (ranges
on threads, their batches in one stream) and ``arrow_overwrite_stream`` (a stream into one
Delta overwrite). The COPY itself is covered by the bootstrap integration tests; here each
range is a generator standing in for one, so that failures can be placed exactly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from slotlake import bootstrap
from slotlake.bootstrap import BootstrapError, CopyTask, TablePlan, concurrent_ranges
from slotlake.delta import arrow_overwrite_stream, txn_version

SCHEMA = pa.schema([("id", pa.int64())])


def _task(ranges: int) -> CopyTask:
    plan = TablePlan(
        name="public.t",
        oid=1,
        relkind="r",
        replica_identity="d",
        columns=[],
        key_columns=["id"],
        row_filter=None,
        blocks=ranges,
        ranges=[(i, i + 1) for i in range(ranges)],
    )
    return CopyTask("dbname=x", "snap", "test", (), plan, SCHEMA)


class FakeRanges:
    """copy_range stand-in: range i yields ``per_range`` batches of ids i*1000+j; ``fail``
    maps a range to the batch index where it raises. Records which streams were closed."""

    def __init__(self, per_range: int, fail: dict[int, int] | None = None) -> None:
        self.per_range, self.fail = per_range, fail or {}
        self.opened: set[int] = set()
        self.closed: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, task: CopyTask, index: int, on_done: Any = None) -> Iterator[pa.RecordBatch]:
        with self.lock:
            self.opened.add(index)
        try:
            for j in range(self.per_range):
                if self.fail.get(index) == j:
                    raise BootstrapError(f"copy of range {index} failed")
                yield pa.record_batch([pa.array([index * 1000 + j], pa.int64())], schema=SCHEMA)
            if on_done is not None:
                on_done(self.per_range, 10 * self.per_range)
        finally:
            with self.lock:
                self.closed.add(index)


def test_every_range_once_and_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRanges(per_range=7)
    monkeypatch.setattr(bootstrap, "copy_range", fake)
    done: list[tuple[int, int]] = []
    ids = [
        rb.column(0)[0].as_py()
        for rb in concurrent_ranges(_task(5), 3, lambda r, b: done.append((r, b)))
    ]
    assert sorted(ids) == sorted(i * 1000 + j for i in range(5) for j in range(7))
    assert sorted(done) == [(7, 70)] * 5
    assert fake.opened == fake.closed == set(range(5))
    assert not [t for t in threading.enumerate() if t.name.startswith("bootstrap-range")]


def test_a_range_error_is_raised_as_itself_and_stops_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRanges(per_range=50, fail={2: 3})
    monkeypatch.setattr(bootstrap, "copy_range", fake)
    with pytest.raises(BootstrapError, match="copy of range 2 failed"):
        for _ in concurrent_ranges(_task(6), 2):
            pass
    # Every range that started was closed (its connection released); the threads are gone.
    assert fake.opened == fake.closed
    assert 2 in fake.opened
    assert not [t for t in threading.enumerate() if t.name.startswith("bootstrap-range")]


def test_closing_early_stops_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRanges(per_range=10_000)
    monkeypatch.setattr(bootstrap, "copy_range", fake)
    stream = concurrent_ranges(_task(4), 2)
    assert next(stream).num_rows == 1
    stream.close()  # what the writer does when it fails
    assert fake.opened and fake.opened == fake.closed
    assert len(fake.opened) <= 2  # the two running ranges; none started after the close
    assert not [t for t in threading.enumerate() if t.name.startswith("bootstrap-range")]


def _batches(n: int, fail_at: int | None = None) -> Iterator[pa.RecordBatch]:
    for i in range(n):
        if i == fail_at:
            raise BootstrapError(f"copy failed at batch {i}")
        yield pa.record_batch([pa.array(range(i * 10, i * 10 + 10), pa.int64())], schema=SCHEMA)


def test_overwrite_stream_replaces_the_rows_in_one_commit(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([-1, -2], pa.int64())}))
    result = arrow_overwrite_stream(path, SCHEMA, _batches(30), "boot", 1)
    assert (result.version, result.metrics["numOutputRows"]) == (1, "300")
    got = DeltaTable(path).to_pyarrow_table()
    assert sorted(got.column("id").to_pylist()) == list(range(300))
    assert txn_version(path, "boot") == 1
    # Run again as the same batch: nothing written, the stream not even started.
    again = arrow_overwrite_stream(path, SCHEMA, _batches(1, fail_at=0), "boot", 1)
    assert again.version == 1 and DeltaTable(path).version() == 1


def test_overwrite_stream_error_commits_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([-1, -2], pa.int64())}))
    closed = []

    def stream() -> Iterator[pa.RecordBatch]:
        try:
            yield from _batches(30, fail_at=12)
        finally:
            closed.append(True)

    with pytest.raises(BootstrapError, match="copy failed at batch 12"):
        arrow_overwrite_stream(path, SCHEMA, stream(), "boot", 1)
    assert closed == [True]
    table = DeltaTable(path)
    assert table.version() == 0  # the old rows, untouched
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [-2, -1]
