"""slotlake.replay_sql.replay_window: hand-built cases and a randomized comparison with
slotlake.toast.replay (the per-row Python oracle)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from chispa import assert_df_equality

from slotlake.replay_sql import replay_window
from slotlake.toast import PRIOR, replay

COLS = ["id", "a", "b", "n"]
# Passthrough columns in between the data columns: the output keeps this order.
EVENT_DDL = (
    "_op string, id int, a string, _old struct<id:int,a:string>, b string, n bigint, "
    "_commit_lsn bigint, _tx_ordinal bigint, _seq bigint, _k_before string, "
    "_k_after string, _unchanged array<string>, _fallback map<string,string>, "
    "_missing_toast array<string>"
)
PRIOR_DDL = (
    "id int, a string, b string, n bigint, _fallback map<string,string>, "
    "_missing_toast array<string>, _pk string"
)
FINAL_DDL = (
    "_k string, id int, a string, b string, n bigint, _fallback map<string,string>, "
    "_missing_toast array<string>, _deleted boolean"
)


def ev(
    op: str,
    lsn: int,
    ordinal: int,
    *,
    before: str | None = None,
    after: str | None = None,
    unchanged: tuple[str, ...] = (),
    fallback: dict[str, str] | None = None,
    **values: Any,
) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLS)
    row.update(values)
    if op == "U" and before is None:
        before = after
    row.update(
        _op=op,
        _commit_lsn=lsn,
        _tx_ordinal=ordinal,
        _seq=lsn * 1000 + ordinal,
        _old={"id": values.get("id"), "a": "old"} if op in "UD" else None,
        _k_before=before,
        _k_after=after,
        _unchanged=list(unchanged),
        _fallback=dict(fallback or {}),
        _missing_toast=[],
    )
    return row


def prior(
    key: str,
    missing: tuple[str, ...] = (),
    fallback: dict[str, str] | None = None,
    **values: Any,
) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLS)
    row.update(values, _fallback=dict(fallback or {}), _missing_toast=list(missing), _pk=key)
    return row


def frame(spark, rows: list[dict[str, Any]], ddl: str):  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(ddl)
    return spark.createDataFrame([tuple(r[f] for f in schema.fieldNames()) for r in rows], schema)


def run(spark, events, priors, truncations=()):  # type: ignore[no-untyped-def]
    return replay_window(
        frame(spark, events, EVENT_DDL),
        frame(spark, priors, PRIOR_DDL),
        list(COLS),
        list(truncations),
    )


def normalized(df, order: list[str]):  # type: ignore[no-untyped-def]
    """Maps as sorted entry arrays (maps neither sort nor compare in Spark), rows in order."""
    from pyspark.sql import functions as F

    # One partition sorted in place: no range-partitioning sample job per comparison.
    entries = F.array_sort(F.map_entries("_fallback"))
    return df.withColumn("_fallback", entries).coalesce(1).sortWithinPartitions(*order)


def assert_changes(spark, actual, expected_rows):  # type: ignore[no-untyped-def]
    expected = frame(spark, expected_rows, EVENT_DDL)
    order = ["_commit_lsn", "_tx_ordinal"]
    assert actual.columns == expected.columns
    assert_df_equality(normalized(actual, order), normalized(expected, order), ignore_nullable=True)


def assert_finals(spark, actual, expected_rows):  # type: ignore[no-untyped-def]
    rows = []
    for r in expected_rows:
        full: dict[str, Any] = dict.fromkeys(COLS)
        full.update(_fallback=None, _missing_toast=None, _deleted=False)
        full.update(r)
        if not full["_deleted"]:
            full["_fallback"] = full["_fallback"] or {}
            full["_missing_toast"] = full["_missing_toast"] or []
        rows.append(full)
    expected = frame(spark, rows, FINAL_DDL)
    assert actual.columns == expected.columns
    assert_df_equality(
        normalized(actual, ["_k"]), normalized(expected, ["_k"]), ignore_nullable=True
    )


def filled(event: dict[str, Any], missing: tuple[str, ...] = (), **changes: Any):
    row = copy.deepcopy(event)
    fallback = changes.pop("fallback", None)
    row.update(changes)
    if fallback is not None:
        row["_fallback"] = fallback
    row["_missing_toast"] = list(missing)
    return row


# --- hand-built cases ------------------------------------------------------------------


def test_update_fills_from_prior_row(spark) -> None:  # type: ignore[no-untyped-def]
    u = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",), fallback={"a": "ta"})
    changes, finals = run(spark, [u], [prior("k1", id=1, a="x", b="BIG", fallback={"b": "tb"})])
    assert_changes(spark, changes, [filled(u, b="BIG", fallback={"a": "ta", "b": "tb"})])
    assert_finals(
        spark,
        finals,
        [{"_k": "k1", "id": 1, "a": "y", "b": "BIG", "_fallback": {"a": "ta", "b": "tb"}}],
    )


def test_update_fills_from_earlier_event_in_batch(spark) -> None:  # type: ignore[no-untyped-def]
    i = ev("I", 10, 1, after="k1", id=1, a="x", b="B1", n=5)
    u1 = ev("U", 10, 2, after="k1", id=1, a="y", unchanged=("b",), n=6)
    u2 = ev("U", 11, 1, after="k1", id=1, a="z", unchanged=("b", "n"))
    # A prior row of k1 must lose against the events of the batch.
    changes, finals = run(spark, [u2, i, u1], [prior("k1", id=1, b="OLD", n=0)])
    assert_changes(spark, changes, [filled(i), filled(u1, b="B1"), filled(u2, b="B1", n=6)])
    assert_finals(spark, finals, [{"_k": "k1", "id": 1, "a": "z", "b": "B1", "n": 6}])


def test_unknown_without_prior_row_is_missing(spark) -> None:  # type: ignore[no-untyped-def]
    u1 = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",))
    u2 = ev("U", 10, 2, after="k1", id=1, unchanged=("a", "b"))
    changes, finals = run(spark, [u1, u2], [])
    assert_changes(spark, changes, [filled(u1, ("b",)), filled(u2, ("b",), a="y")])
    assert_finals(spark, finals, [{"_k": "k1", "id": 1, "a": "y", "_missing_toast": ["b"]}])


def test_key_change_then_update_at_new_key(spark) -> None:  # type: ignore[no-untyped-def]
    move = ev("U", 10, 1, before="k1", after="k2", id=2, a="m", unchanged=("b",))
    u = ev("U", 11, 1, after="k2", id=2, a="n", unchanged=("a", "b"))
    p = prior("k1", id=1, a="x", b="P", fallback={"b": "tb"})
    changes, finals = run(spark, [move, u], [p])
    assert_changes(
        spark,
        changes,
        [filled(move, b="P", fallback={"b": "tb"}), filled(u, a="m", b="P", fallback={"b": "tb"})],
    )
    assert_finals(
        spark,
        finals,
        [
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "id": 2, "a": "m", "b": "P", "_fallback": {"b": "tb"}},
        ],
    )


def test_chain_of_key_changes(spark) -> None:  # type: ignore[no-untyped-def]
    m1 = ev("U", 10, 1, before="k0", after="k1", id=1, a="a1", unchanged=("b", "n"))
    m2 = ev("U", 11, 1, before="k1", after="k2", id=2, unchanged=("a", "b"), n=7)
    u = ev("U", 12, 1, after="k2", id=2, unchanged=("a", "b", "n"))
    back = ev("U", 13, 1, before="k2", after="k0", id=0, a="a0", unchanged=("b",))
    p = prior("k0", id=0, a="x", b="P", n=3)
    changes, finals = run(spark, [back, u, m2, m1], [p])
    assert_changes(
        spark,
        changes,
        [
            filled(m1, b="P", n=3),
            filled(m2, a="a1", b="P"),
            filled(u, a="a1", b="P", n=7),
            filled(back, b="P"),
        ],
    )
    assert_finals(
        spark,
        finals,
        [
            {"_k": "k0", "id": 0, "a": "a0", "b": "P"},
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "_deleted": True},
        ],
    )


def test_delete_then_reinsert(spark) -> None:  # type: ignore[no-untyped-def]
    d = ev("D", 10, 1, before="k1")
    u1 = ev("U", 10, 2, after="k1", id=1, unchanged=("b",))
    i = ev("I", 11, 1, after="k1", id=1, a="new", b="N", fallback={"b": "tn"})
    u2 = ev("U", 12, 1, after="k1", id=1, a="newer", unchanged=("b",))
    d2 = ev("D", 12, 2, before="k9")
    changes, finals = run(spark, [d, u1, i, u2, d2], [prior("k1", id=1, b="P")])
    assert_changes(
        spark,
        changes,
        [
            filled(d),
            filled(u1, ("b",)),
            filled(i),
            filled(u2, b="N", fallback={"b": "tn"}),
            filled(d2),
        ],
    )
    assert_finals(
        spark,
        finals,
        [
            {"_k": "k1", "id": 1, "a": "newer", "b": "N", "_fallback": {"b": "tn"}},
            {"_k": "k9", "_deleted": True},
        ],
    )


def test_truncate_in_the_middle(spark) -> None:  # type: ignore[no-untyped-def]
    u1 = ev("U", 10, 1, after="k1", id=1, unchanged=("b",))
    i1 = ev("I", 10, 2, after="k4", id=4, b="I4")
    # TRUNCATE at (11, 1)
    u2 = ev("U", 12, 1, after="k2", id=2, unchanged=("b",))
    i3 = ev("I", 12, 2, after="k3", id=3, b="B3")
    u3 = ev("U", 12, 3, after="k3", id=3, unchanged=("b",))
    u4 = ev("U", 12, 4, after="k4", id=4, unchanged=("b",))
    priors = [prior("k1", id=1, b="P1"), prior("k2", id=2, b="P2"), prior("k4", id=4, b="P4")]
    changes, finals = run(spark, [u1, i1, u2, i3, u3, u4], priors, [(11, 1)])
    assert_changes(
        spark,
        changes,
        [
            filled(u1, b="P1"),
            filled(i1),
            filled(u2, ("b",)),
            filled(i3),
            filled(u3, b="B3"),
            filled(u4, ("b",)),
        ],
    )
    assert_finals(
        spark,
        finals,
        [
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "id": 2, "_missing_toast": ["b"]},
            {"_k": "k3", "id": 3, "b": "B3"},
            {"_k": "k4", "id": 4, "_missing_toast": ["b"]},
        ],
    )


def test_truncate_after_every_event_empties_touched_keys(spark) -> None:  # type: ignore[no-untyped-def]
    i = ev("I", 10, 1, after="k1", id=1)
    changes, finals = run(spark, [i], [], [(10, 1), (11, 1)])
    assert_changes(spark, changes, [filled(i)])
    assert_finals(spark, finals, [{"_k": "k1", "_deleted": True}])


def test_null_value_is_not_unknown(spark) -> None:  # type: ignore[no-untyped-def]
    u1 = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",))
    u2 = ev("U", 10, 2, after="k2", id=2, a="y", unchanged=("b",))
    i = ev("I", 10, 3, after="k3", id=3, a=None, b=None)
    u3 = ev("U", 10, 4, after="k3", id=3, unchanged=("a", "b"))
    priors = [prior("k1", id=1, b=None), prior("k2", ("b",), id=2, b=None)]
    changes, finals = run(spark, [u1, u2, i, u3], priors)
    assert_changes(spark, changes, [filled(u1), filled(u2, ("b",)), filled(i), filled(u3)])
    assert_finals(
        spark,
        finals,
        [
            {"_k": "k1", "id": 1, "a": "y"},
            {"_k": "k2", "id": 2, "a": "y", "_missing_toast": ["b"]},
            {"_k": "k3", "id": 3},
        ],
    )


def test_long_chain_of_moves_resolves(spark) -> None:  # type: ignore[no-untyped-def]
    # k0 → k1 → … → k9, each move leaving b unchanged, then an update at k9: pointer
    # jumping needs several rounds.
    events = [
        ev("U", 10 + j, 1, before=f"k{j}", after=f"k{j + 1}", id=j + 1, unchanged=("b",))
        for j in range(9)
    ]
    last = ev("U", 30, 1, after="k9", id=9, a="end", unchanged=("b",))
    changes, finals = run(spark, [*events, last], [prior("k0", id=0, b="P", fallback={"b": "t"})])
    assert_changes(spark, changes, [filled(e, b="P", fallback={"b": "t"}) for e in [*events, last]])
    expected = [{"_k": f"k{j}", "_deleted": True} for j in range(9)]
    expected.append({"_k": "k9", "id": 9, "a": "end", "b": "P", "_fallback": {"b": "t"}})
    assert_finals(spark, finals, expected)


# --- randomized comparison with the oracle ---------------------------------------------


def random_case(  # type: ignore[no-untyped-def]
    rng: random.Random,
    group: int = 0,
    groups: int = 1,
    move_p: float = 0.3,
    open_p: float = 0.45,
    truncate_p: float = 0.02,
):
    """Events, prior rows and truncations over a few keys of their own ("g<group>.k<i>").

    Positions are (lsn, ordinal * groups + group): cases of one batch interleave without
    ever sharing a position.
    """
    keys = [f"g{group}.k{i}" for i in range(rng.randint(2, 4))]
    values = {
        "id": [None, 1, 2, 3],
        "a": [None, "x", "y", "z"],
        "b": [None, "B1", "B2", "B3"],
        "n": [None, 0, 7],
    }

    def row_values(skip: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
        vals = {c: rng.choice(values[c]) for c in COLS}
        # The decoder never gives a still-unchanged column a text of its own.
        fallback = {
            c: f"t{rng.randint(0, 9)}" for c in COLS if c not in skip and rng.random() < 0.2
        }
        if rng.random() < 0.2:
            fallback["_old.a"] = "old"
        return vals, fallback

    def position(lsn: int, ordinal: int) -> tuple[int, int]:
        return lsn, ordinal * groups + group

    events: list[dict[str, Any]] = []
    truncations: list[tuple[int, int]] = []
    lsn, ordinal = rng.randint(-20, 20), 0
    for _ in range(rng.randint(2, 16)):
        if rng.random() < 0.35:
            lsn += rng.randint(1, 3)
            ordinal = 0
        ordinal += 1
        if rng.random() < truncate_p:
            truncations.append(position(lsn, ordinal))
            ordinal += 1
        op = rng.choice("IUUUUD")
        at = position(lsn, ordinal)
        if op == "I":
            vals, fb = row_values()
            events.append(ev("I", *at, after=rng.choice(keys), fallback=fb, **vals))
        elif op == "D":
            events.append(ev("D", *at, before=rng.choice(keys)))
        else:
            before = rng.choice(keys)
            after = rng.choice(keys) if rng.random() < move_p else before
            open_cols = tuple(c for c in COLS if rng.random() < (0.1 if c == "id" else open_p))
            vals, fb = row_values(open_cols)
            for c in open_cols:
                if rng.random() < 0.8:
                    vals[c] = None
            events.append(
                ev("U", *at, before=before, after=after, unchanged=open_cols, fallback=fb, **vals)
            )
    for e in events:
        if rng.random() < 0.05:
            e["_fallback"] = None  # not from the decoder, but the oracle takes it
    if rng.random() < truncate_p:
        truncations.append(position(lsn + 1, 0))
    if rng.random() < truncate_p:
        truncations.append(position(lsn - 100, 0))
    priors = []
    for k in keys:
        if rng.random() < 0.7:
            vals, fb = row_values()
            fb.pop("_old.a", None)
            missing = tuple(c for c in COLS if rng.random() < 0.15)
            priors.append(prior(k, missing, fb, **vals))
    return events, priors, truncations


# (key-change probability, unchanged-column probability, truncate probability) per batch.
BATCHES = [
    (0.3, 0.45, 0.02),
    (0.3, 0.45, 0.0),
    (0.1, 0.45, 0.02),
    (0.0, 0.45, 0.0),
    (0.3, 0.0, 0.02),
]


def random_batch(seed: int, groups: int = 8):  # type: ignore[no-untyped-def]
    """Several random cases in one batch (one Spark run), over disjoint keys.

    A truncation of one case empties the keys of all (it is the table's): that is part of
    what the oracle replays too.
    """
    rng = random.Random(seed)
    move_p, open_p, truncate_p = BATCHES[seed % len(BATCHES)]
    events, priors, truncations = [], [], []
    for g in range(groups):
        e, p, t = random_case(rng, g, groups, move_p, open_p, truncate_p)
        events += e
        priors += p
        truncations += t
    rng.shuffle(events)
    return events, priors, truncations


def _fb(fallback) -> tuple | None:  # type: ignore[no-untyped-def]
    if fallback is None:
        return None
    return tuple(sorted(dict(fallback).items()))


def oracle(events, priors, truncations):  # type: ignore[no-untyped-def]
    rows = []
    for e in copy.deepcopy(events):
        e["_fallback"] = None if e["_fallback"] is None else sorted(e["_fallback"].items())
        rows.append(e)
    for p in copy.deepcopy(priors):
        p["_fallback"] = sorted(p["_fallback"].items())
        p["_op"] = PRIOR
        p["_k_after"] = p.pop("_pk")
        rows.append(p)
    changes, finals = [], []
    for kind, row in replay(rows, COLS, truncations):
        if kind == "E":
            changes.append(change_tuple(row))
        elif kind == "S":
            finals.append(
                (
                    row["_k"],
                    False,
                    *[row[c] for c in COLS],
                    _fb(row["_fallback"]),
                    tuple(row["_missing_toast"]),
                )
            )
        else:
            finals.append((row["_k"], True, *[None] * len(COLS), None, None))
    return sorted(changes, key=repr), sorted(finals, key=repr)


def change_tuple(row) -> tuple:  # type: ignore[no-untyped-def]
    old = row["_old"]
    if old is not None and not isinstance(old, dict):
        old = old.asDict()
    return (
        row["_commit_lsn"],
        row["_tx_ordinal"],
        row["_op"],
        *[row[c] for c in COLS],
        _fb(row["_fallback"]),
        tuple(row["_missing_toast"]),
        row["_seq"],
        None if old is None else tuple(sorted(old.items())),
        row["_k_before"],
        row["_k_after"],
        tuple(row["_unchanged"]),
    )


def spark_result(spark, events, priors, truncations):  # type: ignore[no-untyped-def]
    changes, finals = run(spark, events, priors, truncations)
    c = [change_tuple(r.asDict()) for r in changes.collect()]
    f = [
        (
            r["_k"],
            r["_deleted"],
            *[r[c] for c in COLS],
            _fb(r["_fallback"]),
            None if r["_missing_toast"] is None else tuple(r["_missing_toast"]),
        )
        for r in finals.collect()
    ]
    return sorted(c, key=repr), sorted(f, key=repr)


@pytest.mark.parametrize("seed", range(len(BATCHES)))
def test_matches_oracle_on_random_batches(spark, seed: int) -> None:  # type: ignore[no-untyped-def]
    # 5 batches of 8 independent random cases: 40 cases in 5 Spark runs.
    events, priors, truncations = random_batch(seed)
    expected = oracle(events, priors, truncations)
    actual = spark_result(spark, events, priors, truncations)
    assert actual[0] == expected[0], "changes"
    assert actual[1] == expected[1], "finals"
