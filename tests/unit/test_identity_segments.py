"""Replica identity changes inside a batch (slotlake.catalog.identity,
slotlake.identity_segments.runs) from hand-made Relation messages and event positions."""

from __future__ import annotations

import pyarrow as pa
import pytest

from slotlake.catalog import build_catalogs, identity
from slotlake.identity_segments import runs
from slotlake.pgoutput import Relation, RelationColumn
from slotlake.unique_multiset import switched_key

INT4, TEXT = 23, 25


def rel(identity_: str, *keys: str) -> Relation:
    columns = tuple(
        RelationColumn(1 if n in keys else 0, n, INT4 if n == "id" else TEXT, -1)
        for n in ("id", "code", "v")
    )
    return Relation(None, 16400, "public", "t", identity_, columns)


def catalog(*versions: tuple[int, Relation]):  # type: ignore[no-untyped-def]
    return build_catalogs(list(versions), [], None)["public.t"]


def events(*rows: tuple[int, int, int]) -> pa.Table:
    """(commit LSN, ordinal, seq) of each event, in raw order."""
    lsn, ordinal, seq = zip(*rows, strict=True)
    return pa.table(
        {
            "_commit_lsn": pa.array(lsn, pa.int64()),
            "_tx_ordinal": pa.array(ordinal, pa.int64()),
            "_seq": pa.array(seq, pa.int64()),
        }
    )


def test_identity_is_the_key_or_none_for_a_multiset() -> None:
    keyed, full, none = (
        catalog((10, rel("d", "id"))),
        catalog((10, rel("f", "id", "code", "v"))),
        catalog((10, rel("d"))),
    )
    assert identity(keyed.versions[0]) == ("id",)
    assert identity(full.versions[0]) is None  # FULL flags every column: still a multiset
    assert identity(none.versions[0]) is None
    assert not keyed.identity_switches


@pytest.mark.parametrize(
    ("first", "second", "switches"),
    [
        (rel("d", "id"), rel("d", "id"), False),
        (rel("d", "id"), rel("f", "id", "code", "v"), True),
        (rel("f", "id", "code", "v"), rel("d", "id"), True),
        (rel("d", "id"), rel("d", "code"), True),
        (rel("d", "id"), rel("d"), True),  # the key dropped
        (rel("f", "id", "code", "v"), rel("d"), False),  # a multiset either way
    ],
)
def test_identity_switches(first: Relation, second: Relation, switches: bool) -> None:
    assert catalog((10, first), (20, second)).identity_switches is switches


def test_runs_follow_commit_order_and_the_version_each_event_was_decoded_with() -> None:
    cat = catalog((10, rel("d", "id")), (40, rel("f", "id", "code", "v")), (70, rel("d", "code")))
    # Raw order is seq; commit order is (commit LSN, ordinal): the second transaction's
    # events (seq 20, 30) commit first, under the first version all the same.
    table = events(
        (200, 1, 11), (100, 1, 20), (100, 2, 30), (300, 1, 41), (300, 2, 42), (400, 1, 71)
    )
    out = runs(table, cat)
    assert [key for key, _ in out] == [("id",), None, ("code",)]
    assert [r.column("_seq").to_pylist() for _, r in out] == [[20, 30, 11], [41, 42], [71]]


def test_an_event_before_any_relation_message_is_refused() -> None:
    cat = catalog((10, rel("d", "id")), (40, rel("f", "id", "code", "v")))
    with pytest.raises(ValueError, match=r"public\.t: an event before"):
        runs(events((100, 1, 5)), cat)


@pytest.mark.parametrize(
    ("versions", "key"),
    [
        ([rel("d", "id"), rel("f", "id", "code", "v")], ["id"]),  # made FULL: its old key
        ([rel("d", "id"), rel("d", "code"), rel("f", "id", "code", "v")], ["code"]),  # the last
        ([rel("f", "id", "code", "v"), rel("d", "id")], None),  # keyed in the end
        ([rel("d"), rel("f", "id", "code", "v")], None),  # no key before FULL
        ([rel("d", "id"), rel("d")], None),  # the key dropped: INSERTs only, no FULL
    ],
)
def test_the_key_a_state_rebuilt_across_the_change_may_be_unique_on(
    versions: list[Relation], key: list[str] | None
) -> None:
    cat = catalog(*[(10 * (i + 1), r) for i, r in enumerate(versions)])
    assert switched_key(cat) == key
