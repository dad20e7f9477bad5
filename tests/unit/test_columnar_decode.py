"""The column-wise split of DML payloads against the message-by-message decoder.

make_decoder takes the column-wise path (slotlake.pgoutput.columnar) for a batch of text
datums of one Relation version, nothing streamed; ``columnar=False`` forces the
reference path. Here both decode the same random batches (hypothesis: key and full old
images, unchanged TOAST filled or left open, short tuples, every fallback edge of the
column types, UTF-8 beyond ASCII) and must give identical record batches; crafted bytes
check that anything outside that path — malformed payloads, invalid UTF-8, a column with
text and binary datums — is declined, so the reference decoder reports it with its offset.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotlake import decode as decode_module
from slotlake.catalog import build_catalogs
from slotlake.decode import (
    RawDataError,
    StreamOutcome,
    arrow_schema_for,
    change_schema,
    make_decoder,
)
from slotlake.pgoutput import UNCHANGED_TOAST, decode
from slotlake.pgoutput.columnar import KIND_NULL, KIND_TEXT, KIND_UNCHANGED, split_dml
from tests.unit.test_make_decoder import V1, exact_rows, image, relation_payload
from tests.unit.test_pgoutput_decode import i32, tuple_data, u16, u32

OID = 16384


@pytest.fixture(autouse=True)
def _every_batch_column_wise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of any size take the column-wise path here (make_decoder sends those of
    fewer than COLUMNAR_FROM_ROWS message by message)."""
    monkeypatch.setattr(decode_module, "COLUMNAR_FROM_ROWS", 0)


COMMIT_TS = datetime(2024, 4, 3, 4, 1, 49, tzinfo=timezone.utc)
# V1 plus a second key column: key images ('K') then carry two columns.
TWO_KEYS = [("k2", 25, -1, True), *V1]
TWO_TEXT = [("id", 20, -1, True), ("v", 25, -1, False)]


def catalog(columns: list[tuple[str, int, int, bool]]) -> Any:
    return build_catalogs([(0, decode(relation_payload(columns)))], [])["public.t"]


@st.composite
def dml_change(
    draw: st.DrawFn, columns: list[tuple[str, int, int, bool]], binary: bool = False
) -> bytes:
    """One Insert/Update/Delete payload of text (or binary) datums, outside any stream."""
    op = draw(st.sampled_from("IUUD"))
    old_kind = draw(st.sampled_from(["K", "O"] + ([None] if op == "U" else [])))
    old = b""
    if op != "I" and old_kind is not None:
        values = draw(image(columns, binary, toast=False))
        if old_kind == "K":
            values = tuple(v if key else None for v, (*_, key) in zip(values, columns, strict=True))
        old = old_kind.encode() + tuple_data(values)
    new_values = draw(image(columns, binary, toast=op == "U"))
    # A tuple may stop short of the relation's columns: the rest read as NULL.
    new_values = new_values[: draw(st.integers(len(new_values) - 2, len(new_values)))]
    new = b"N" + tuple_data(new_values)
    if op == "I":
        return b"I" + u32(OID) + new
    if op == "U":
        return b"U" + u32(OID) + old + new
    return b"D" + u32(OID) + old


def raw_batch(payloads: list[bytes], first_seq: int = 1) -> pa.RecordBatch:
    n = len(payloads)
    seqs = list(range(first_seq, first_seq + n))
    return pa.RecordBatch.from_pydict(
        {
            "seq": pa.array(seqs, pa.int64()),
            "lsn": pa.array([5000 + s for s in seqs], pa.int64()),
            "xid": pa.array([700] * n, pa.int64()),
            "data": pa.array(payloads, pa.binary()),
            "rel_oid": pa.array([OID] * n, pa.int64()),
            "commit_lsn": pa.array([0x100] * n, pa.int64()),
            "commit_ts": pa.array([COMMIT_TS] * n, pa.timestamp("us", "UTC")),
            "tx_ordinal": pa.array([s % 3 for s in seqs], pa.int64()),
            "stream_xid": pa.nulls(n, pa.int64()),
        }
    )


def both_paths(cat: Any, raw: pa.RecordBatch) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    schema = arrow_schema_for(change_schema(cat))
    outs = []
    for columnar in (True, False):
        run = make_decoder(cat, StreamOutcome(), {}, 7, schema, columnar=columnar)
        outs.append(list(run(iter([raw]))))
    return outs[0], outs[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), two_keys=st.booleans(), binary=st.booleans(), n=st.integers(1, 40))
def test_columnar_split_equals_the_message_by_message_decoder(
    data: st.DataObject, two_keys: bool, binary: bool, n: int
) -> None:
    columns = TWO_KEYS if two_keys else V1
    payloads = data.draw(st.lists(dml_change(columns, binary), min_size=n, max_size=n))
    assert split_dml(pa.array(payloads, pa.binary()), len(columns)) is not None
    columnar, reference = both_paths(catalog(columns), raw_batch(payloads))
    assert len(columnar) == len(reference) == 1
    assert columnar[0].schema == reference[0].schema
    assert exact_rows(columnar[0].to_pylist()) == exact_rows(reference[0].to_pylist())


def test_split_kinds_and_texts_of_each_image() -> None:
    payloads = [
        b"I" + u32(OID) + b"N" + tuple_data(["1", "é€𝄞", None]),
        b"U"
        + u32(OID)
        + b"O"
        + tuple_data(["2", "", "x"])
        + b"N"
        + tuple_data(["2", UNCHANGED_TOAST]),
        b"D" + u32(OID) + b"K" + tuple_data(["3", None, None]),
        b"U" + u32(OID) + b"N" + tuple_data(["4", "a" * 40, "b"]),
    ]
    split = split_dml(pa.array(payloads, pa.binary()), 3)
    assert split is not None
    assert bytes(split.op) == b"IUDU"
    assert split.old_kind.tolist() == [0, ord("O"), ord("K"), 0]
    t, n, u = KIND_TEXT, KIND_NULL, KIND_UNCHANGED
    assert split.new_kinds.T.tolist() == [[t, t, n], [t, u, n], [n, n, n], [t, t, t]]
    assert split.old_kinds.T.tolist() == [[n, n, n], [t, t, t], [t, n, n], [n, n, n]]
    assert [c.to_pylist() for c in split.new] == [
        ["1", "2", None, "4"],
        ["é€𝄞", None, None, "a" * 40],
        [None, None, None, "b"],
    ]
    assert [c.to_pylist() for c in split.old] == [
        [None, "2", "3", None],
        [None, "", None, None],
        [None, "x", None, None],
    ]


def test_split_of_a_sliced_array_reads_its_own_rows() -> None:
    payloads = [b"I" + u32(OID) + b"N" + tuple_data([str(i), "v" * i]) for i in range(20)]
    split = split_dml(pa.array(payloads, pa.binary()).slice(5, 10), 2)
    assert split is not None
    assert split.new[0].to_pylist() == [str(i) for i in range(5, 15)]
    assert split.new[1].to_pylist() == ["v" * i for i in range(5, 15)]


GOOD = b"I" + u32(OID) + b"N" + tuple_data(["1", "a"])
DECLINED = {
    "text and binary datums in one column": b"I" + u32(OID) + b"N" + tuple_data(["1", b"\x00\x01"]),
    "trailing byte": GOOD + b"\x00",
    "value past the end": b"I" + u32(OID) + b"N" + u16(2) + b"t" + i32(1) + b"1t" + i32(9) + b"a",
    "negative length": b"I" + u32(OID) + b"N" + u16(2) + b"t" + i32(-1) + b"n",
    "unknown kind": b"I" + u32(OID) + b"N" + u16(2) + b"t" + i32(1) + b"1x",
    "more columns than the relation": b"I" + u32(OID) + b"N" + tuple_data(["1", "a", "b"]),
    "insert without N": b"I" + u32(OID) + b"K" + tuple_data(["1", "a"]),
    "delete without old image": b"D" + u32(OID) + b"N" + tuple_data(["1", "a"]),
    "update: no N after the old image": b"U"
    + u32(OID)
    + b"K"
    + tuple_data(["1", None])
    + b"X"
    + tuple_data(["1", "a"]),
    "truncated header": b"I" + u32(OID),
    "empty payload": b"",
    "not a DML message": b"T" + u32(1) + b"\x00" + u32(OID),
    "invalid UTF-8": b"I" + u32(OID) + b"N" + u16(2) + b"t" + i32(1) + b"1t" + i32(2) + b"\xc3(",
}


@pytest.mark.parametrize("what", sorted(DECLINED))
def test_anything_else_is_declined(what: str) -> None:
    assert split_dml(pa.array([GOOD, DECLINED[what], GOOD], pa.binary()), 2) is None


@pytest.mark.parametrize("what", sorted(set(DECLINED) - {"text and binary datums in one column"}))
def test_a_malformed_payload_gets_the_reference_error(what: str) -> None:
    """Declined, the batch goes message by message: the same error as with columnar off."""
    columns = [("id", 20, -1, True), ("v", 25, -1, False)]
    raw = raw_batch([GOOD, DECLINED[what], GOOD])
    errors = []
    for columnar in (True, False):
        run = make_decoder(
            catalog(columns),
            StreamOutcome(),
            {},
            7,
            arrow_schema_for(change_schema(catalog(columns))),
            columnar=columnar,
        )
        with pytest.raises(RawDataError) as err:
            list(run(iter([raw])))
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "seq 2" in errors[0] and "lsn" in errors[0]


def test_zero_column_relation_and_all_null_columns() -> None:
    split = split_dml(pa.array([b"I" + u32(OID) + b"N" + u16(0)] * 3, pa.binary()), 0)
    assert split is not None and split.new == [] and len(split.op) == 3
    nulls = split_dml(pa.array([b"I" + u32(OID) + b"N" + tuple_data([None])], pa.binary()), 1)
    assert nulls is not None and nulls.new[0].to_pylist() == [None]
    assert nulls.new[0].type == pa.string()


def test_big_batch_matches_per_message_values() -> None:
    """Thousands of rows with values of every length class (inline ≤ 12 bytes and not)."""
    rng = np.random.default_rng(7)
    payloads, expected = [], []
    for i in range(5000):
        text = "x" * int(rng.integers(0, 40)) if i % 7 else None
        payloads.append(b"I" + u32(OID) + b"N" + tuple_data([str(i), text]))
        expected.append(text)
    split = split_dml(pa.array(payloads, pa.binary()), 2)
    assert split is not None
    assert split.new[1].to_pylist() == expected
    assert split.new[0].to_pylist() == [str(i) for i in range(5000)]


@pytest.fixture
def split_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each column-wise split make_decoder asks for, as they come."""
    import slotlake.pgoutput.columnar as columnar_module

    calls: list[int] = []
    real = columnar_module.split_dml

    def counting(data: pa.Array, ncols: int) -> Any:
        calls.append(len(data))
        return real(data, ncols)

    monkeypatch.setattr(columnar_module, "split_dml", counting)
    return calls


def test_the_columnar_path_is_the_one_taken(split_calls: list[int]) -> None:
    calls = split_calls
    columnar, reference = both_paths(catalog(TWO_TEXT), raw_batch([GOOD, GOOD]))
    assert calls == [2]
    assert columnar[0].to_pylist() == reference[0].to_pylist()
    # A streamed row anywhere in the batch sends it message by message.
    streamed = raw_batch([GOOD, GOOD]).to_pydict()
    streamed["stream_xid"] = [None, 5]
    streamed["data"] = [GOOD, GOOD[:1] + u32(5) + GOOD[1:]]  # in a stream: the xid first
    calls.clear()
    both_paths(
        catalog(TWO_TEXT), pa.RecordBatch.from_pydict(streamed, schema=raw_batch([GOOD]).schema)
    )
    assert calls == []


def test_small_batches_go_message_by_message(
    monkeypatch: pytest.MonkeyPatch, split_calls: list[int]
) -> None:
    """Below COLUMNAR_FROM_ROWS rows a batch is decoded message by message, from it on
    column-wise: the same rows either way."""
    calls = split_calls
    monkeypatch.setattr(decode_module, "COLUMNAR_FROM_ROWS", 3)
    small, reference = both_paths(catalog(TWO_TEXT), raw_batch([GOOD, GOOD]))
    assert calls == []
    assert small[0].to_pylist() == reference[0].to_pylist()
    big, reference = both_paths(catalog(TWO_TEXT), raw_batch([GOOD, GOOD, GOOD]))
    assert calls == [3]
    assert big[0].to_pylist() == reference[0].to_pylist()


def test_binary_datums_come_as_a_binary_column() -> None:
    payloads = [
        b"I" + u32(OID) + b"N" + tuple_data([b"\x00\x00\x00\x01", b"\xff\x00"]),
        b"I" + u32(OID) + b"N" + tuple_data([b"\x00\x00\x00\x02", None]),
    ]
    split = split_dml(pa.array(payloads, pa.binary()), 2)
    assert split is not None
    assert split.new[0].type == pa.binary() and split.new[1].type == pa.binary()
    assert split.new[1].to_pylist() == [b"\xff\x00", None]  # not UTF-8, and kept as bytes
