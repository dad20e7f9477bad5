"""TOAST replay cases shared by the tests of every replay: the Spark SQL window replay
(tests/integration/test_replay_sql.py) and the DuckDB one (tests/unit/test_replay_duckdb.py).

Events are dicts keyed by comparable strings (``_k_before``/``_k_after``, as
:func:`slotlake.toast.replay` takes them); hand-built cases carry their expected change
rows and finals; :func:`random_batch` makes random batches for a comparison with the
per-row Python oracle (:func:`oracle`).
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slotlake.catalog import TableCatalog
from slotlake.decode import META_COLUMNS, WORK_COLUMNS
from slotlake.toast import PRIOR, replay

if TYPE_CHECKING:
    import pyarrow as pa

COLS = ["id", "a", "b", "n"]

Row = dict[str, Any]


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
) -> Row:
    row: Row = dict.fromkeys(COLS)
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
) -> Row:
    row: Row = dict.fromkeys(COLS)
    row.update(values, _fallback=dict(fallback or {}), _missing_toast=list(missing), _pk=key)
    return row


def filled(event: Row, missing: tuple[str, ...] = (), **changes: Any) -> Row:
    """The change row ``event`` becomes: ``changes`` applied, ``_missing_toast`` set."""
    row = copy.deepcopy(event)
    fallback = changes.pop("fallback", None)
    row.update(changes)
    if fallback is not None:
        row["_fallback"] = fallback
    row["_missing_toast"] = list(missing)
    return row


# --- hand-built cases ------------------------------------------------------------------


@dataclass
class Case:
    events: list[Row]
    priors: list[Row]
    changes: list[Row]  # the expected change rows (filled events)
    # The expected finals: "_k" and what differs from a live row with NULL data columns,
    # empty _fallback and _missing_toast (a deleted key: "_deleted": True alone).
    finals: list[Row]
    truncations: list[tuple[int, int]] = field(default_factory=list)


HAND_BUILT: dict[str, Callable[[], Case]] = {}


def hand_built(fn: Callable[[], Case]) -> Callable[[], Case]:
    HAND_BUILT[fn.__name__] = fn
    return fn


@hand_built
def update_fills_from_prior_row() -> Case:
    u = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",), fallback={"a": "ta"})
    return Case(
        [u],
        [prior("k1", id=1, a="x", b="BIG", fallback={"b": "tb"})],
        [filled(u, b="BIG", fallback={"a": "ta", "b": "tb"})],
        [{"_k": "k1", "id": 1, "a": "y", "b": "BIG", "_fallback": {"a": "ta", "b": "tb"}}],
    )


@hand_built
def update_fills_from_earlier_event_in_batch() -> Case:
    i = ev("I", 10, 1, after="k1", id=1, a="x", b="B1", n=5)
    u1 = ev("U", 10, 2, after="k1", id=1, a="y", unchanged=("b",), n=6)
    u2 = ev("U", 11, 1, after="k1", id=1, a="z", unchanged=("b", "n"))
    # A prior row of k1 must lose against the events of the batch.
    return Case(
        [u2, i, u1],
        [prior("k1", id=1, b="OLD", n=0)],
        [filled(i), filled(u1, b="B1"), filled(u2, b="B1", n=6)],
        [{"_k": "k1", "id": 1, "a": "z", "b": "B1", "n": 6}],
    )


@hand_built
def unknown_without_prior_row_is_missing() -> Case:
    u1 = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",))
    u2 = ev("U", 10, 2, after="k1", id=1, unchanged=("a", "b"))
    return Case(
        [u1, u2],
        [],
        [filled(u1, ("b",)), filled(u2, ("b",), a="y")],
        [{"_k": "k1", "id": 1, "a": "y", "_missing_toast": ["b"]}],
    )


@hand_built
def key_change_then_update_at_new_key() -> Case:
    move = ev("U", 10, 1, before="k1", after="k2", id=2, a="m", unchanged=("b",))
    u = ev("U", 11, 1, after="k2", id=2, a="n", unchanged=("a", "b"))
    return Case(
        [move, u],
        [prior("k1", id=1, a="x", b="P", fallback={"b": "tb"})],
        [filled(move, b="P", fallback={"b": "tb"}), filled(u, a="m", b="P", fallback={"b": "tb"})],
        [
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "id": 2, "a": "m", "b": "P", "_fallback": {"b": "tb"}},
        ],
    )


@hand_built
def chain_of_key_changes() -> Case:
    m1 = ev("U", 10, 1, before="k0", after="k1", id=1, a="a1", unchanged=("b", "n"))
    m2 = ev("U", 11, 1, before="k1", after="k2", id=2, unchanged=("a", "b"), n=7)
    u = ev("U", 12, 1, after="k2", id=2, unchanged=("a", "b", "n"))
    back = ev("U", 13, 1, before="k2", after="k0", id=0, a="a0", unchanged=("b",))
    return Case(
        [back, u, m2, m1],
        [prior("k0", id=0, a="x", b="P", n=3)],
        [
            filled(m1, b="P", n=3),
            filled(m2, a="a1", b="P"),
            filled(u, a="a1", b="P", n=7),
            filled(back, b="P"),
        ],
        [
            {"_k": "k0", "id": 0, "a": "a0", "b": "P"},
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "_deleted": True},
        ],
    )


@hand_built
def delete_then_reinsert() -> Case:
    d = ev("D", 10, 1, before="k1")
    u1 = ev("U", 10, 2, after="k1", id=1, unchanged=("b",))
    i = ev("I", 11, 1, after="k1", id=1, a="new", b="N", fallback={"b": "tn"})
    u2 = ev("U", 12, 1, after="k1", id=1, a="newer", unchanged=("b",))
    d2 = ev("D", 12, 2, before="k9")
    return Case(
        [d, u1, i, u2, d2],
        [prior("k1", id=1, b="P")],
        [
            filled(d),
            filled(u1, ("b",)),
            filled(i),
            filled(u2, b="N", fallback={"b": "tn"}),
            filled(d2),
        ],
        [
            {"_k": "k1", "id": 1, "a": "newer", "b": "N", "_fallback": {"b": "tn"}},
            {"_k": "k9", "_deleted": True},
        ],
    )


@hand_built
def every_column_sent_needs_no_prior_row() -> Case:
    u = ev("U", 10, 1, after="k1", id=1, a="y", b="B", n=2)
    d = ev("D", 10, 2, before="k2")
    return Case(
        [u, d],
        [prior("k1", id=1, a="x", b="OLD", n=1), prior("k2", id=2, a="z")],
        [filled(u), filled(d)],
        [{"_k": "k1", "id": 1, "a": "y", "b": "B", "n": 2}, {"_k": "k2", "_deleted": True}],
    )


@hand_built
def truncate_in_the_middle() -> Case:
    u1 = ev("U", 10, 1, after="k1", id=1, unchanged=("b",))
    i1 = ev("I", 10, 2, after="k4", id=4, b="I4")
    # TRUNCATE at (11, 1)
    u2 = ev("U", 12, 1, after="k2", id=2, unchanged=("b",))
    i3 = ev("I", 12, 2, after="k3", id=3, b="B3")
    u3 = ev("U", 12, 3, after="k3", id=3, unchanged=("b",))
    u4 = ev("U", 12, 4, after="k4", id=4, unchanged=("b",))
    return Case(
        [u1, i1, u2, i3, u3, u4],
        [prior("k1", id=1, b="P1"), prior("k2", id=2, b="P2"), prior("k4", id=4, b="P4")],
        [
            filled(u1, b="P1"),
            filled(i1),
            filled(u2, ("b",)),
            filled(i3),
            filled(u3, b="B3"),
            filled(u4, ("b",)),
        ],
        [
            {"_k": "k1", "_deleted": True},
            {"_k": "k2", "id": 2, "_missing_toast": ["b"]},
            {"_k": "k3", "id": 3, "b": "B3"},
            {"_k": "k4", "id": 4, "_missing_toast": ["b"]},
        ],
        [(11, 1)],
    )


@hand_built
def truncate_after_every_event_empties_touched_keys() -> Case:
    i = ev("I", 10, 1, after="k1", id=1)
    return Case([i], [], [filled(i)], [{"_k": "k1", "_deleted": True}], [(10, 1), (11, 1)])


@hand_built
def null_value_is_not_unknown() -> Case:
    u1 = ev("U", 10, 1, after="k1", id=1, a="y", unchanged=("b",))
    u2 = ev("U", 10, 2, after="k2", id=2, a="y", unchanged=("b",))
    i = ev("I", 10, 3, after="k3", id=3, a=None, b=None)
    u3 = ev("U", 10, 4, after="k3", id=3, unchanged=("a", "b"))
    return Case(
        [u1, u2, i, u3],
        [prior("k1", id=1, b=None), prior("k2", ("b",), id=2, b=None)],
        [filled(u1), filled(u2, ("b",)), filled(i), filled(u3)],
        [
            {"_k": "k1", "id": 1, "a": "y"},
            {"_k": "k2", "id": 2, "a": "y", "_missing_toast": ["b"]},
            {"_k": "k3", "id": 3},
        ],
    )


@hand_built
def insert_with_a_value_left_out_is_missing() -> Case:
    # A row filter turns an UPDATE that moves a row in into an INSERT, which leaves an
    # unchanged out-of-line value out: the lake never had the row, nothing fills it, not
    # even the prior row of a key deleted before (another row).
    d = ev("D", 10, 1, before="k1")
    i1 = ev("I", 10, 2, after="k1", id=1, a="in", unchanged=("b",))
    u = ev("U", 11, 1, after="k1", id=1, a="later", unchanged=("b",))
    i2 = ev("I", 11, 2, after="k2", id=2, a="two", unchanged=("b", "n"))
    return Case(
        [d, i1, u, i2],
        [prior("k1", id=1, b="P")],
        [filled(d), filled(i1, ("b",)), filled(u, ("b",)), filled(i2, ("b", "n"))],
        [
            {"_k": "k1", "id": 1, "a": "later", "_missing_toast": ["b"]},
            {"_k": "k2", "id": 2, "a": "two", "_missing_toast": ["b", "n"]},
        ],
    )


@hand_built
def long_chain_of_moves_resolves() -> Case:
    # k0 → k1 → … → k9, each move leaving b unchanged, then an update at k9: pointer
    # jumping needs several rounds.
    events = [
        ev("U", 10 + j, 1, before=f"k{j}", after=f"k{j + 1}", id=j + 1, unchanged=("b",))
        for j in range(9)
    ]
    events.append(ev("U", 30, 1, after="k9", id=9, a="end", unchanged=("b",)))
    finals: list[Row] = [{"_k": f"k{j}", "_deleted": True} for j in range(9)]
    finals.append({"_k": "k9", "id": 9, "a": "end", "b": "P", "_fallback": {"b": "t"}})
    return Case(
        events,
        [prior("k0", id=0, b="P", fallback={"b": "t"})],
        [filled(e, b="P", fallback={"b": "t"}) for e in events],
        finals,
    )


def full_finals(expected: list[Row], columns: Sequence[str] = COLS) -> list[Row]:
    """A case's finals with every field: NULLs, empty texts and missing list filled in."""
    rows = []
    for r in expected:
        full: Row = dict.fromkeys(columns)
        full.update(_fallback=None, _missing_toast=None, _deleted=False)
        full.update(r)
        if not full["_deleted"]:
            full["_fallback"] = full["_fallback"] or {}
            full["_missing_toast"] = full["_missing_toast"] or []
        rows.append(full)
    return rows


# --- random cases ----------------------------------------------------------------------


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

    events: list[Row] = []
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
            # Now and then one that leaves a value out (a row filter's moved-in row).
            open_cols = tuple(c for c in COLS[1:] if rng.random() < 0.1 * open_p)
            vals, fb = row_values(open_cols)
            vals.update(dict.fromkeys(open_cols))
            events.append(
                ev("I", *at, after=rng.choice(keys), unchanged=open_cols, fallback=fb, **vals)
            )
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


def sorted_texts(fallback) -> tuple | None:  # type: ignore[no-untyped-def]
    """A ``_fallback`` (dict, pairs or NULL) as sorted pairs: maps compare in any order."""
    if fallback is None:
        return None
    return tuple(sorted(dict(fallback).items()))


def final_tuple(row: Row, columns: Sequence[str] = COLS) -> tuple:
    missing = row["_missing_toast"]
    return (
        row["_k"],
        row["_deleted"],
        *[row[c] for c in columns],
        sorted_texts(row["_fallback"]),
        None if missing is None else tuple(missing),
    )


def change_tuple(row, columns: Sequence[str] = COLS, keys: bool = True) -> tuple:  # type: ignore[no-untyped-def]
    """A change row, comparable; ``keys``: with the ``_k_before``/``_k_after`` it kept."""
    old = row["_old"]
    if old is not None and not isinstance(old, dict):
        old = old.asDict()
    return (
        row["_commit_lsn"],
        row["_tx_ordinal"],
        row["_op"],
        *[row[c] for c in columns],
        sorted_texts(row["_fallback"]),
        tuple(row["_missing_toast"]),
        row["_seq"],
        None if old is None else tuple(sorted(old.items())),
        *((row["_k_before"], row["_k_after"]) if keys else ()),
        tuple(row["_unchanged"]),
    )


def oracle(events, priors, truncations, columns: Sequence[str] = COLS, keys: bool = True):  # type: ignore[no-untyped-def]
    """(changes, finals) of :func:`slotlake.toast.replay` as sorted tuples."""
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
    for kind, row in replay(rows, columns, truncations):
        if kind == "E":
            changes.append(change_tuple(row, columns, keys))
        elif kind == "S":
            finals.append(final_tuple({**row, "_deleted": False}, columns))
        else:
            deleted = dict.fromkeys(columns)
            deleted.update(row, _deleted=True, _fallback=None, _missing_toast=None)
            finals.append(final_tuple(deleted, columns))
    return sorted(changes, key=repr), sorted(finals, key=repr)


# --- Arrow schemas without a JVM -------------------------------------------------------


def arrow_type(ddl: str) -> pa.DataType:
    """``decode.arrow_schema_for`` of a few Spark types, without the JVM that parsing a
    Spark DDL needs (tests/integration/test_replay_duckdb_vs_spark.py checks both agree)."""
    import pyarrow as pa

    simple = {
        "string": pa.string(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "boolean": pa.bool_(),
        "double": pa.float64(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "map<string,string>": pa.map_(pa.string(), pa.string()),
    }
    if ddl in simple:
        return simple[ddl]
    if m := re.fullmatch(r"decimal\((\d+),(\d+)\)", ddl):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if m := re.fullmatch(r"array<(.+)>", ddl):
        return pa.list_(pa.field("element", arrow_type(m.group(1))))
    raise ValueError(f"no Arrow type for {ddl} here")


def arrow_event_schema(cat: TableCatalog) -> pa.Schema:
    """The decoded events' schema: ``arrow_schema_for(change_schema(cat))``."""
    import pyarrow as pa

    data = [pa.field(n, arrow_type(t)) for n, t in cat.columns]
    meta = [pa.field(n, arrow_type(t)) for n, t in META_COLUMNS + WORK_COLUMNS]
    return pa.schema([*data, *meta, pa.field("_old", pa.struct(data))])


def arrow_prior_schema(cat: TableCatalog) -> pa.Schema:
    """The state's schema (``state.state_schema_ddl``): what ``read_prior`` returns."""
    import pyarrow as pa

    events = arrow_event_schema(cat)
    return pa.schema([events.field(c) for c in [*cat.state_columns, "_fallback", "_missing_toast"]])
