"""Property-based tests of the pgoutput decoder (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slotlake.pgoutput import (
    MESSAGE_TYPES_BY_CODE,
    UNCHANGED_TOAST,
    DecodeError,
    Delete,
    Insert,
    Update,
    decode,
)
from slotlake.pgoutput.checked import decode_checked
from tests.unit.test_pgoutput_decode import VECTORS, tuple_data, u32

column_value = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(max_size=40),  # default alphabet: any code point UTF-8 can encode
    st.text(alphabet=st.characters(max_codepoint=127), max_size=40),
    st.binary(max_size=40),
)
row = st.lists(column_value, max_size=30)
xid = st.one_of(st.none(), st.integers(0, 2**32 - 1))
oid = st.integers(0, 2**32 - 1)


def stream_prefix(x: int | None) -> bytes:
    return b"" if x is None else u32(x)


@given(values=row, x=xid, relation=oid)
def test_insert_round_trip(values: list[Any], x: int | None, relation: int) -> None:
    payload = b"I" + stream_prefix(x) + u32(relation) + b"N" + tuple_data(values)
    msg = decode(payload, in_stream=x is not None)
    assert msg == Insert(x, relation, tuple(values))
    # Identity, not just equality, for the sentinel.
    assert [v is UNCHANGED_TOAST for v in msg.new] == [v is UNCHANGED_TOAST for v in values]


@given(old=st.one_of(st.none(), row), new=row, kind=st.sampled_from("KO"), x=xid, relation=oid)
def test_update_round_trip(
    old: list[Any] | None, new: list[Any], kind: str, x: int | None, relation: int
) -> None:
    old_part = b"" if old is None else kind.encode() + tuple_data(old)
    payload = b"U" + stream_prefix(x) + u32(relation) + old_part + b"N" + tuple_data(new)
    expected = Update(
        x, relation, None if old is None else kind, None if old is None else tuple(old), tuple(new)
    )
    assert decode(payload, in_stream=x is not None) == expected


@given(old=row, kind=st.sampled_from("KO"), x=xid, relation=oid)
def test_delete_round_trip(old: list[Any], kind: str, x: int | None, relation: int) -> None:
    payload = b"D" + stream_prefix(x) + u32(relation) + kind.encode() + tuple_data(old)
    assert decode(payload, in_stream=x is not None) == Delete(x, relation, kind, tuple(old))


@given(
    key=st.lists(st.one_of(st.text(max_size=8), st.none()), max_size=4),
    nulls=st.integers(0, 40),
    tail=st.lists(st.sampled_from(["n", "nnnn", "", None, UNCHANGED_TOAST]), max_size=3),
)
def test_rows_with_runs_of_nulls_round_trip(key: list[Any], nulls: int, tail: list[Any]) -> None:
    # Key-only old tuples end in a run of NULLs, which the decoder takes in one step.
    values = tuple([*key, *[None] * nulls, *tail])
    assert decode(b"D" + u32(5) + b"K" + tuple_data(values)) == Delete(None, 5, "K", values)


def same_outcome(payload: bytes, in_stream: bool) -> None:
    """decode() either fails with DecodeError, or agrees with the reference parser."""
    try:
        got = decode(payload, in_stream)
    except DecodeError as e:
        try:
            decode_checked(payload, in_stream)
        except DecodeError as ref:
            assert str(e) == str(ref)
        else:
            raise AssertionError("fast parser failed where the reference parser succeeded") from e
        return
    assert got == decode_checked(payload, in_stream)


@settings(max_examples=500)
@given(payload=st.binary(max_size=64), in_stream=st.booleans())
@example(payload=b"", in_stream=False)
def test_random_bytes_only_raise_decode_error(payload: bytes, in_stream: bool) -> None:
    same_outcome(payload, in_stream)


@settings(max_examples=1000)
@given(
    code=st.sampled_from(sorted(MESSAGE_TYPES_BY_CODE)),
    body=st.binary(max_size=64),
    in_stream=st.booleans(),
)
def test_random_bodies_behind_a_valid_type_byte(code: bytes, body: bytes, in_stream: bool) -> None:
    same_outcome(code + body, in_stream)


@st.composite
def mutated_vector(draw: st.DrawFn) -> tuple[bytes, bool]:
    _, payload, in_stream, _ = draw(st.sampled_from(VECTORS))
    buf = bytearray(payload)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "insert", "delete"]))
        at = draw(st.integers(0, len(buf)))
        if op == "replace" and at < len(buf):
            buf[at] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif at < len(buf):
            del buf[at : at + draw(st.integers(1, 4))]
    return bytes(buf), draw(st.booleans()) if draw(st.booleans()) else in_stream


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_vector())
def test_mutated_vectors_agree_with_reference_parser(case: tuple[bytes, bool]) -> None:
    payload, in_stream = case
    same_outcome(payload, in_stream)
