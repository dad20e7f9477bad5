"""The TOAST replay and the key lineage, on hand-built event dicts (no Spark, no server)."""

from __future__ import annotations

from typing import Any

from slotlake.toast import PRIOR, lineage_roots, replay

COLS = ["id", "txt", "big"]


def ev(
    op: str,
    commit: int,
    ordinal: int,
    *,
    before: str | None = None,
    after: str | None = None,
    unchanged: tuple[str, ...] = (),
    fallback: tuple[tuple[str, str], ...] = (),
    **values: Any,
) -> dict[str, Any]:
    """One event as the Spark side hands it to the replay (keys are opaque strings)."""
    row: dict[str, Any] = dict.fromkeys(COLS)
    row.update(values)
    row.update(
        _op=op,
        _commit_lsn=commit,
        _tx_ordinal=ordinal,
        _k_before=before,
        _k_after=after,
        _unchanged=list(unchanged),
        _fallback=list(fallback),
    )
    return row


def prior(key: str, missing: tuple[str, ...] = (), **values: Any) -> dict[str, Any]:
    row = ev(PRIOR, 0, 0, after=key, **values)
    row["_missing_toast"] = list(missing)
    del row["_commit_lsn"], row["_tx_ordinal"]  # prior rows carry neither
    return row


def run(
    events: list[dict[str, Any]], truncations: tuple[tuple[int, int], ...] = ()
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], set[str]]:
    """(changes in replay order, final rows by key, keys deleted/cleared)."""
    changes: list[dict[str, Any]] = []
    finals: dict[str, dict[str, Any]] = {}
    gone: set[str] = set()
    for kind, row in replay(events, COLS, truncations):
        if kind == "E":
            changes.append(row)
        elif kind == "S":
            assert row["_k"] not in finals, "one final row per key"
            finals[row["_k"]] = row
        else:
            assert kind == "K"
            gone.add(row["_k"])
    assert not (set(finals) & gone)
    return changes, finals, gone


def test_insert_then_update_fills_unchanged_column_from_the_insert() -> None:
    changes, finals, gone = run(
        [
            # Given out of order on purpose: the replay sorts by (commit_lsn, ordinal).
            ev("U", 20, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="new"),
            ev("I", 10, 1, after="k1", id=1, txt="old", big="B" * 5),
        ]
    )
    assert [c["_op"] for c in changes] == ["I", "U"]
    update = changes[1]
    assert update["big"] == "B" * 5 and update["txt"] == "new"
    assert update["_missing_toast"] == []
    assert finals["k1"] == {
        "id": 1,
        "txt": "new",
        "big": "B" * 5,
        "_fallback": [],
        "_missing_toast": [],
        "_k": "k1",
    }
    assert gone == set()


def test_update_filled_from_prior_state_row() -> None:
    changes, finals, _ = run(
        [
            prior("k1", id=1, txt="before", big="prior big"),
            ev("U", 10, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="after"),
        ]
    )
    # Prior rows are inputs only: they never come out as change events.
    assert [c["_op"] for c in changes] == ["U"]
    assert changes[0]["big"] == "prior big" and changes[0]["_missing_toast"] == []
    assert (finals["k1"]["txt"], finals["k1"]["big"]) == ("after", "prior big")


def test_prior_row_of_an_untouched_key_is_not_emitted() -> None:
    changes, finals, gone = run(
        [
            prior("k9", id=9, txt="t", big="b"),
            ev("I", 10, 1, after="k1", id=1, txt="x", big="y"),
        ]
    )
    assert set(finals) == {"k1"} and gone == set()
    assert [c["_op"] for c in changes] == ["I"]


def test_update_without_any_base_lists_the_column_as_missing() -> None:
    changes, finals, _ = run(
        [ev("U", 10, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="t")]
    )
    assert changes[0]["_missing_toast"] == ["big"]
    assert changes[0]["big"] is None
    assert finals["k1"]["_missing_toast"] == ["big"]


def test_base_that_itself_missed_the_column_keeps_it_missing() -> None:
    changes, finals, _ = run(
        [
            prior("k1", missing=("big",), id=1, txt="p", big=None),
            ev("U", 10, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="one"),
            ev("U", 11, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="two"),
        ]
    )
    assert [c["_missing_toast"] for c in changes] == [["big"], ["big"]]
    assert finals["k1"]["_missing_toast"] == ["big"]
    assert finals["k1"]["txt"] == "two"


def test_missing_column_is_only_the_one_the_base_lacked() -> None:
    changes, _, _ = run(
        [
            prior("k1", missing=("big",), id=1, txt="p", big=None),
            ev("U", 10, 1, before="k1", after="k1", unchanged=("big", "txt"), id=1),
        ]
    )
    assert changes[0]["_missing_toast"] == ["big"]
    assert changes[0]["txt"] == "p"


def test_key_change_chain_is_followed_for_the_fill() -> None:
    changes, finals, gone = run(
        [
            prior("k0", id=0, txt="p", big="carried"),
            ev("U", 10, 1, before="k0", after="k1", unchanged=("big",), id=1, txt="p"),
            ev("U", 11, 1, before="k1", after="k2", unchanged=("big",), id=2, txt="p"),
            ev("U", 12, 1, before="k2", after="k2", unchanged=("big",), id=2, txt="last"),
        ]
    )
    assert [c["big"] for c in changes] == ["carried"] * 3
    assert all(c["_missing_toast"] == [] for c in changes)
    # The old keys are touched (their prior rows must not survive), the new one holds the row.
    assert gone == {"k0", "k1"}
    assert finals["k2"]["id"] == 2 and finals["k2"]["txt"] == "last"
    assert finals["k2"]["big"] == "carried"


def test_lineage_roots_joins_a_chain_and_keeps_chains_apart() -> None:
    roots = lineage_roots([("k0", "k1"), ("k1", "k2"), ("x5", "x4")])
    assert roots["k0"] == roots["k1"] == roots["k2"]
    assert roots["x5"] == roots["x4"]
    assert roots["k0"] != roots["x5"]
    # Only keys that appear in an edge are in the result.
    assert set(roots) == {"k0", "k1", "k2", "x4", "x5"}


def test_lineage_roots_merges_chains_that_meet_later() -> None:
    roots = lineage_roots([("a", "b"), ("c", "d"), ("d", "b")])
    assert len({roots[k] for k in "abcd"}) == 1
    # The root is the smallest key of the component: deterministic across runs.
    assert roots["c"] == "a"


def test_lineage_roots_of_no_edges_is_empty() -> None:
    assert lineage_roots([]) == {}


def test_delete_then_reinsert_of_the_same_key() -> None:
    changes, finals, gone = run(
        [
            prior("k1", id=1, txt="p", big="prior big"),
            ev("D", 10, 1, before="k1", id=None),
            ev("I", 11, 1, after="k1", id=1, txt="again", big=None),
            # The re-inserted row had no big: the fill must take it from the insert, not
            # from the prior row that was deleted.
            ev("U", 12, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="upd"),
        ]
    )
    assert [c["_op"] for c in changes] == ["D", "I", "U"]
    assert changes[2]["big"] is None and changes[2]["_missing_toast"] == []
    assert finals["k1"]["txt"] == "upd" and gone == set()


def test_update_after_a_delete_in_the_batch_does_not_use_the_prior_row() -> None:
    changes, _, _ = run(
        [
            prior("k1", id=1, txt="p", big="prior big"),
            ev("D", 10, 1, before="k1"),
            ev("U", 11, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="odd"),
        ]
    )
    assert changes[1]["big"] is None and changes[1]["_missing_toast"] == ["big"]


def test_delete_leaves_only_a_touched_key() -> None:
    _, finals, gone = run([prior("k1", id=1, big="b"), ev("D", 10, 1, before="k1")])
    assert finals == {} and gone == {"k1"}


def test_truncate_clears_rows_before_it_and_keeps_rows_after_it() -> None:
    changes, finals, gone = run(
        [
            ev("I", 10, 1, after="k1", id=1, txt="a", big="b1"),
            ev("I", 10, 2, after="k2", id=2, txt="b", big="b2"),
            # TRUNCATE at (20, 1); a row inserted after it in the same transaction survives.
            ev("I", 20, 2, after="k3", id=3, txt="c", big="b3"),
        ],
        truncations=((20, 1),),
    )
    assert [c["_op"] for c in changes] == ["I", "I", "I"]
    assert set(finals) == {"k3"}
    assert gone == {"k1", "k2"}


def test_truncate_after_every_event_still_empties_the_rows() -> None:
    _, finals, gone = run(
        [ev("I", 10, 1, after="k1", id=1, txt="a", big="b1")], truncations=((30, 1),)
    )
    assert finals == {} and gone == {"k1"}


def test_prior_rows_are_not_used_after_a_truncate() -> None:
    changes, finals, _ = run(
        [
            prior("k1", id=1, txt="p", big="prior big"),
            ev("I", 10, 1, after="k7", id=7, txt="x", big="y"),
            ev("U", 30, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="after"),
        ],
        truncations=((20, 1),),
    )
    update = changes[-1]
    assert update["big"] is None and update["_missing_toast"] == ["big"]
    assert set(finals) == {"k1"} and finals["k1"]["_missing_toast"] == ["big"]


def test_row_updated_before_a_truncate_is_no_base_after_it() -> None:
    changes, finals, gone = run(
        [
            ev("I", 10, 1, after="k1", id=1, txt="a", big="b1"),
            ev("U", 30, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="z"),
        ],
        truncations=((20, 5),),
    )
    assert changes[1]["_missing_toast"] == ["big"]
    assert finals["k1"]["big"] is None and gone == set()


def test_truncate_in_same_transaction_orders_by_ordinal() -> None:
    _, finals, gone = run(
        [
            ev("I", 10, 3, after="k1", id=1, big="before"),
            ev("I", 10, 5, after="k2", id=2, big="after"),
        ],
        truncations=((10, 4),),
    )
    assert set(finals) == {"k2"} and gone == {"k1"}


def test_fallback_text_of_a_filled_column_comes_from_the_base() -> None:
    changes, finals, _ = run(
        [
            # big is NULL in its typed column and kept as text (e.g. a value the Spark type
            # cannot hold): the fill must carry the text, not just the NULL.
            prior("k1", id=1, txt="p", big=None, fallback=(("big", "infinity"),)),
            ev(
                "U",
                10,
                1,
                before="k1",
                after="k1",
                unchanged=("big",),
                fallback=(("txt", "NaN"), ("_old.id", "x")),
                id=1,
                txt=None,
            ),
        ]
    )
    update = changes[0]
    assert dict(update["_fallback"]) == {"big": "infinity", "txt": "NaN", "_old.id": "x"}
    assert update["_missing_toast"] == []
    # The state keeps only fallbacks of its own columns, never the old image's.
    assert sorted(finals["k1"]["_fallback"]) == [("big", "infinity"), ("txt", "NaN")]


def test_fallback_of_a_column_not_filled_is_not_copied() -> None:
    changes, _, _ = run(
        [
            prior("k1", id=1, txt=None, big="b", fallback=(("txt", "old text"),)),
            ev("U", 10, 1, before="k1", after="k1", unchanged=("big",), id=1, txt="new"),
        ]
    )
    assert dict(changes[0]["_fallback"]) == {}
    assert changes[0]["big"] == "b"


def test_final_items_one_per_touched_key() -> None:
    items = list(
        replay(
            [
                ev("I", 10, 1, after="a", id=1, txt="x", big="y"),
                ev("I", 10, 2, after="b", id=2, txt="x", big="y"),
                ev("D", 11, 1, before="b"),
                ev("U", 12, 1, before="a", after="c", id=3, txt="x", big="y"),
            ],
            COLS,
        )
    )
    assert [k for k, _ in items[:4]] == ["E"] * 4
    finals = sorted((k, r["_k"]) for k, r in items[4:])
    assert finals == [("K", "a"), ("K", "b"), ("S", "c")]
    s_row = next(r for k, r in items if k == "S")
    # S rows carry exactly the data columns and the state metadata.
    assert set(s_row) == {*COLS, "_fallback", "_missing_toast", "_k"}
