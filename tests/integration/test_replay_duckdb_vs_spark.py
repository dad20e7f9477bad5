"""slotlake.replay_duckdb.fill_keyed_local against Spark's slotlake.state.fill_keyed on one
typed batch: the same change rows and finals, with the same Arrow types."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slotlake.catalog import TableCatalog
from slotlake.decode import arrow_schema_for, change_schema
from slotlake.replay_duckdb import fill_keyed_local
from slotlake.state import fill_keyed, state_schema_ddl
from tests.replay_cases import arrow_event_schema, arrow_prior_schema
from tests.unit.test_replay_duckdb import CAT as UNIT_CAT

# Key (id, since); since is NULL with the text "infinity" for one row.
CAT = TableCatalog(
    name="public.accounts",
    columns=[
        ("id", "bigint"),
        ("since", "timestamp"),
        ("name", "string"),
        ("amount", "decimal(38,6)"),
        ("tags", "array<string>"),
        ("body", "string"),
        ("gone", "string"),  # dropped during the batch: in the change log, not the state
    ],
    state_columns=["id", "since", "name", "amount", "tags", "body"],
    key_columns=["id", "since"],
)


def ts(day: int) -> datetime:
    return datetime(2024, 1, day, 12, 30, 15, 123456, tzinfo=timezone.utc)


def row(id_: int | None, since: datetime | None, **values: Any) -> dict[str, Any]:
    return {"id": id_, "since": since, **values}


def event(op: str, lsn: int, ordinal: int, new: dict | None, old: dict | None = None, **meta):  # type: ignore[no-untyped-def]
    out: dict[str, Any] = dict(new or {})
    out.update(
        _op=op,
        _commit_lsn=lsn,
        _lsn=lsn * 10 + ordinal,
        _tx_ordinal=ordinal,
        _xid=lsn,
        _commit_ts=ts(28),
        _batch=7,
        _old_kind="K" if old is not None else None,
        _missing_toast=[],
        _fallback=list(meta.pop("fallback", {}).items()),
        _seq=lsn * 100 + ordinal,
        _unchanged=list(meta.pop("unchanged", ())),
        _old=old,
    )
    assert not meta
    return out


EVENTS = [
    # Fills body and tags from the prior row.
    event("U", 10, 1, row(1, ts(1), name="uno", amount=Decimal("2.5")), unchanged=("body", "tags")),
    # Moves (2, t2) → (20, t2) with body and amount unchanged: amount is NaN (text only).
    event("U", 10, 2, row(20, ts(2), name="twenty"), row(2, ts(2)), unchanged=("body", "amount")),
    # At the new key: waits for the move's fill.
    event("U", 11, 1, row(20, ts(2), name="vingt"), unchanged=("body", "tags")),
    # A key kept as text: since is 'infinity'.
    event(
        "U", 11, 2, row(3, None, name="three"), unchanged=("body",), fallback={"since": "infinity"}
    ),
    event("I", 11, 3, row(5, ts(5), name="five", body="B5", tags=["f", None], gone="g")),
    event("D", 11, 4, None, row(4, None), fallback={"_old.since": "-infinity"}),
    # TRUNCATE at (11, 5): every earlier row is gone.
    event("I", 12, 1, row(6, ts(6), body="B6", amount=Decimal("-0.000001"), tags=[])),
    event("U", 12, 2, row(6, ts(6), name="six"), unchanged=("body", "tags", "amount")),
    event("U", 12, 3, row(1, ts(1), name="one again"), unchanged=("body",)),
    # Two keys a microsecond apart (Spark's default to_json keeps milliseconds only).
    event("I", 12, 4, row(7, ts(7), body="B7")),
    event("I", 12, 5, row(7, ts(7) + timedelta(microseconds=1), body="B7+")),
    event("U", 12, 6, row(7, ts(7), name="seven"), unchanged=("body",)),
    event(
        "U", 12, 7, row(7, ts(7) + timedelta(microseconds=1), name="seven+"), unchanged=("body",)
    ),
]
PRIOR = [
    row(1, ts(1), name="one", amount=Decimal("1.5"), tags=["a", "b"], body="B1"),
    row(2, ts(2), name="two", body="B2", tags=["x"], _fallback=[("amount", "NaN")]),
    row(3, None, body="B3", _fallback=[("since", "infinity")]),
    row(4, None, body="B4", _fallback=[("since", "-infinity")], _missing_toast=["tags"]),
    row(9, ts(9), body="untouched"),
]
TRUNCATIONS = [(11, 5)]


def test_test_schemas_are_the_decoders(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    # The unit tests and the benchmark build these schemas without a JVM.
    for cat in (UNIT_CAT, CAT):
        assert arrow_event_schema(cat) == arrow_schema_for(change_schema(cat))
        state = StructType.fromDDL(state_schema_ddl(cat))
        assert arrow_prior_schema(cat) == arrow_schema_for(state)


def sorted_rows(table: pa.Table, by: str) -> list[dict[str, Any]]:
    rows = (
        table.drop_columns(["_k"]).to_pylist() if "_k" in table.column_names else table.to_pylist()
    )
    return sorted(rows, key=lambda r: repr(r[by]))


def described(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    """Fields readably (a failed schema comparison shows only names): type, nullability,
    and those of nested fields (Spark's and Arrow's defaults differ there)."""

    def fields(t: pa.DataType, prefix: str) -> list[tuple[str, str, bool]]:
        out = []
        for i in range(t.num_fields):
            f = t.field(i)
            out += [
                (prefix + f.name, str(f.type), f.nullable),
                *fields(f.type, prefix + f.name + "."),
            ]
        return out

    return [(f.name, str(f.type), f.nullable) for f in schema] + [
        x for f in schema for x in fields(f.type, f.name + ".")
    ]


def test_matches_spark_fill_keyed(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.types import StructType

    schema = change_schema(CAT)
    events = pa.Table.from_pylist(EVENTS, arrow_schema_for(schema))
    prior_schema = StructType.fromDDL(state_schema_ddl(CAT))
    prior = pa.Table.from_pylist(
        [{"_fallback": [], "_missing_toast": [], **p} for p in PRIOR],
        arrow_schema_for(prior_schema),
    )
    calls = []

    def read_prior(values: list[Any], want_null: bool) -> pa.Table:
        calls.append((sorted(values), want_null))
        # A superset, as a file-skipping filter gives: the whole table.
        return prior

    changes, finals = fill_keyed_local(events, read_prior, CAT, TRUNCATIONS)
    # The keys with open TOAST: 1, 2 (before its move), 20, 3 (NULL since), 6 and 7.
    assert calls == [([1, 2, 3, 6, 7, 20], False)]

    spark_changes, spark_finals = fill_keyed(
        spark.createDataFrame(events, schema),
        spark.createDataFrame(prior, prior_schema),
        CAT,
        TRUNCATIONS,
    )
    expected_changes = spark_changes.toArrow()
    expected_finals = spark_finals.toArrow()
    # _seq, the driver's own (fast defaults): the raw row of each kept key's final image.
    by_seq = {r["_seq"]: r for r in changes.to_pylist()}
    for f in finals.to_pylist():
        if f["_deleted"]:
            assert f["_seq"] is None
        else:
            assert all(by_seq[f["_seq"]][c] == f[c] for c in CAT.state_columns), f
    finals = finals.drop_columns(["_seq"])
    assert described(changes.schema) == described(expected_changes.schema)
    assert described(finals.schema) == described(expected_finals.schema)
    assert changes.schema == expected_changes.schema
    assert finals.schema == expected_finals.schema
    assert sorted_rows(changes, "_seq") == sorted_rows(expected_changes, "_seq")
    assert sorted_rows(finals, "_key") == sorted_rows(expected_finals, "_key")
    # _k: one text per key, the same grouping as Spark's.
    assert finals.num_rows == len(pc.unique(finals.column("_k")))

    # A few values by hand, so that agreeing is not agreeing on nothing.
    by_seq = {r["_seq"]: r for r in changes.to_pylist()}
    assert by_seq[1001]["body"] == "B1" and by_seq[1001]["tags"] == ["a", "b"]
    assert by_seq[1002]["amount"] is None and dict(by_seq[1002]["_fallback"]) == {"amount": "NaN"}
    # The move set tags NULL (not unchanged): NULL is a value, carried to the new key.
    assert by_seq[1101]["body"] == "B2" and by_seq[1101]["tags"] is None
    assert by_seq[1102]["body"] == "B3"
    assert by_seq[1202]["tags"] == [] and by_seq[1202]["amount"] == Decimal("-0.000001")
    assert by_seq[1203]["_missing_toast"] == ["body"]
    live = {
        (r["_key"]["id"], r["_key"]["since"]): r for r in finals.to_pylist() if not r["_deleted"]
    }
    seven, seven_plus = ts(7), ts(7) + timedelta(microseconds=1)
    assert sorted(live, key=repr) == sorted(
        [(1, ts(1)), (6, ts(6)), (7, seven), (7, seven_plus)], key=repr
    )
    assert (live[7, seven]["body"], live[7, seven_plus]["body"]) == ("B7", "B7+")
    deleted = [r["_key"] for r in finals.to_pylist() if r["_deleted"]]
    assert {"id": 4, "since": None, "~id": None, "~since": "-infinity"} in deleted
