"""make_decoder's function over hand-built raw batches, against a per-row reference.

The decoder gathers each column's datums and converts them a column at a time; this
pins everything around the conversion to the row-by-row rules it replaced (hypothesis):
two Relation versions in one batch (a widened type, a type change that forces a column
to string, an added and a dropped column), key ('K') and full ('O') old images,
unchanged TOAST filled from an old image or left open, ``_fallback`` keys and their
order, streamed rows committed or aborted, origins — in text and binary format.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotlake.catalog import build_catalogs
from slotlake.decode import StreamOutcome, arrow_schema_for, change_schema, make_decoder
from slotlake.pgoutput import UNCHANGED_TOAST, decode
from slotlake.pgtypes import Fallback, resolve_type
from tests.unit.test_pgoutput_decode import cstr, relation_column, tuple_data, u16, u32
from tests.unit.test_pgtypes import numeric_binary, typmod_numeric
from tests.unit.test_vector_convert import exact

OID = 16384
BATCH = 7
STREAM_COMMITTED, STREAM_ABORTED = 901, 902
COMMIT_LSN, STREAM_COMMIT_LSN = 0x100, 0x200
COMMIT_TS = datetime(2024, 4, 3, 4, 1, 49, tzinfo=timezone.utc)
STREAM_TS_PG = 765_432_169_000_000  # 2024-04-03T04:02:49Z in PostgreSQL µs

N12_2, N14_3 = typmod_numeric(12, 2), typmod_numeric(14, 3)
# (name, type oid, typmod, key) of the two versions: `a` widens to decimal(14,3), `x`
# changes int4 → bool (so it becomes a string column), `f` is dropped and `y` added.
V1 = [
    ("id", 20, -1, True),
    ("a", 1700, N12_2, False),
    ("d", 1082, -1, False),
    ("t", 25, -1, False),
    ("arr", 1009, -1, False),
    ("f", 701, -1, False),
    ("x", 23, -1, False),
]
V2 = [
    ("id", 20, -1, True),
    ("a", 1700, N14_3, False),
    ("d", 1082, -1, False),
    ("t", 25, -1, False),
    ("arr", 1009, -1, False),
    ("x", 16, -1, False),
    ("y", 21, -1, False),
]
V2_SEQ = 1000  # rows with a larger seq are shaped by V2


def relation_payload(columns: list[tuple[str, int, int, bool]]) -> bytes:
    return (
        b"R"
        + u32(OID)
        + cstr("public")
        + cstr("t")
        + b"d"
        + u16(len(columns))
        + b"".join(relation_column(int(key), n, oid, typmod) for n, oid, typmod, key in columns)
    )


def binary_datums(oid: int, typmod: int) -> st.SearchStrategy[bytes]:
    """Binary datums of each column type, fallback edges included."""
    if oid == 20:
        return st.integers(-(2**63), 2**63 - 1).map(lambda v: struct.pack(">q", v))
    if oid in (23, 21):
        return st.integers(-(2**15), 2**15 - 1).map(
            lambda v: struct.pack(">i" if oid == 23 else ">h", v)
        )
    if oid == 1700:
        scale = 2 if typmod == N12_2 else 3
        return st.sampled_from(["NaN", "Infinity", "-1.5", "0", "12345.67", "-0.01"]).map(
            lambda v: numeric_binary(v, None if v[-1] == "y" or v == "NaN" else scale)
        )
    if oid == 1082:
        return st.sampled_from([0, 2**31 - 1, -(2**31), -800_000, 3_000_000, 8000]).map(
            lambda v: struct.pack(">i", v)
        )
    if oid == 25:
        return st.text(max_size=8).filter(lambda s: "\x00" not in s).map(str.encode)
    if oid == 1009:
        return st.lists(st.sampled_from([None, "a", "b c", "NULL", ""]), max_size=3).map(
            lambda items: _text_array(items)
        )
    if oid == 701:
        return st.sampled_from([0.5, -0.0, float("nan"), float("inf")]).map(
            lambda v: struct.pack(">d", v)
        )
    assert oid == 16
    return st.sampled_from([b"\x00", b"\x01"])


def _text_array(items: list[str | None]) -> bytes:
    out = [struct.pack(">iii", 1 if items else 0, int(None in items), 25)]
    if items:
        out.append(struct.pack(">ii", len(items), 1))
    out += [
        struct.pack(">i", -1) if v is None else struct.pack(">i", len(v.encode())) + v.encode()
        for v in items
    ]
    return b"".join(out)


@st.composite
def image(
    draw: st.DrawFn, columns: list[tuple[str, int, int, bool]], binary: bool, toast: bool
) -> tuple:
    values: list[Any] = []
    for _, oid, typmod, key in columns:
        choices = (
            [st.none(), binary_datums(oid, typmod)] if not key else [binary_datums(oid, typmod)]
        )
        if toast and not key:
            choices.append(st.just(UNCHANGED_TOAST))
        datum = draw(st.one_of(*choices))
        if datum is None or datum is UNCHANGED_TOAST or binary:
            values.append(datum)
        else:
            values.append(resolve_type(oid, typmod).binary_to_text(datum))
    return tuple(values)


@st.composite
def change(
    draw: st.DrawFn, binary: bool, version: list[tuple[str, int, int, bool]]
) -> dict[str, Any]:
    op = draw(st.sampled_from("IUUD"))
    old_kind = draw(st.sampled_from(["K", "O"] + ([None] if op == "U" else [])))
    old = None
    if op != "I" and old_kind is not None:
        old = draw(image(version, binary, toast=False))
        if old_kind == "K" and draw(st.integers(0, 4)):
            # PostgreSQL sends NULLs for the other columns; the decoder must ignore them anyway.
            old = tuple(v if key else None for v, (_, _, _, key) in zip(old, version, strict=True))
    new = None if op == "D" else draw(image(version, binary, toast=op == "U"))
    stream = draw(st.sampled_from([None, None, STREAM_COMMITTED, STREAM_ABORTED]))
    return {
        "op": op,
        "old_kind": old_kind if op != "I" else None,
        "old": old,
        "new": new,
        "stream": stream,
    }


def payload(c: dict[str, Any]) -> bytes:
    xid = b"" if c["stream"] is None else u32(c["stream"])
    old = b"" if c["old"] is None else c["old_kind"].encode() + tuple_data(c["old"])
    if c["op"] == "I":
        return b"I" + xid + u32(OID) + b"N" + tuple_data(c["new"])
    if c["op"] == "U":
        return b"U" + xid + u32(OID) + old + b"N" + tuple_data(c["new"])
    return b"D" + xid + u32(OID) + old


# --- the reference: the row-by-row rules -------------------------------------------------


def expected_row(c: dict[str, Any], seq: int, cat: Any, names: list[str]) -> dict[str, Any]:
    version = cat.version_at(OID, seq)
    types = {oid: (ns, nm) for oid, ns, nm in version.type_names}
    fallback: dict[str, str] = {}

    def shape(
        values: tuple, prefix: str, only: set[int] | None
    ) -> tuple[dict[str, Any], list[int]]:
        out: dict[str, Any] = dict.fromkeys(names)
        unchanged = []
        for i, raw in enumerate(values):
            column = version.columns[i]
            if raw is None or (only is not None and i not in only):
                continue
            if raw is UNCHANGED_TOAST:
                unchanged.append(i)
                continue
            text_column = column.name in cat.text_columns
            if text_column and isinstance(raw, str):
                out[column.name] = raw
                continue
            value = resolve_type(column.type_oid, column.typmod, types).convert(raw)
            if isinstance(value, Fallback):
                fallback[prefix + column.name] = value.text
            else:
                out[column.name] = str(value) if text_column else value
        return out, unchanged

    keys = {i for i, col in enumerate(version.columns) if col.name in version.key_columns}
    new, unchanged = (dict.fromkeys(names), []) if c["new"] is None else shape(c["new"], "", None)
    old = None
    if c["old"] is not None:
        old, _ = shape(c["old"], "_old.", keys if c["old_kind"] == "K" else None)
    still = []
    for i in unchanged:
        name = version.columns[i].name
        if old is not None and (c["old_kind"] == "O" or i in keys):
            new[name] = old[name]
            if "_old." + name in fallback:
                fallback[name] = fallback["_old." + name]
        else:
            still.append(name)
    streamed = c["stream"] is not None
    commit_lsn = STREAM_COMMIT_LSN if streamed else COMMIT_LSN
    return {
        **new,
        "_op": c["op"],
        "_commit_lsn": commit_lsn,
        "_lsn": 5000 + seq,
        "_tx_ordinal": seq % 3,
        "_xid": c["stream"] if streamed else 700,
        "_commit_ts": datetime(2024, 4, 3, 4, 2, 49, tzinfo=timezone.utc)
        if streamed
        else COMMIT_TS,
        "_origin": "upstream" if streamed else None,
        "_batch": BATCH,
        "_old_kind": c["old_kind"],
        "_missing_toast": [],
        "_fallback": list(fallback.items()),
        "_truncate_options": None,
        "_seq": seq,
        "_unchanged": still,
        "_old": old,
    }


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), binary=st.booleans(), n1=st.integers(0, 12), n2=st.integers(0, 12))
def test_decoder_matches_the_row_by_row_rules(
    data: st.DataObject, binary: bool, n1: int, n2: int
) -> None:
    changes = data.draw(st.lists(change(binary, V1), min_size=n1, max_size=n1), label="v1 rows")
    changes += data.draw(st.lists(change(binary, V2), min_size=n2, max_size=n2), label="v2 rows")
    relations = [(0, decode(relation_payload(V1))), (V2_SEQ, decode(relation_payload(V2)))]
    cat = build_catalogs(relations, [])["public.t"]
    assert cat.text_columns == {"x"}
    names = [n for n, _ in cat.columns]
    seqs = [1 + i for i in range(n1)] + [V2_SEQ + 1 + i for i in range(n2)]
    stream_xids = [c["stream"] for c in changes]
    raw = pa.RecordBatch.from_pydict(
        {
            "seq": pa.array(seqs, pa.int64()),
            "lsn": pa.array([5000 + s for s in seqs], pa.int64()),
            "xid": pa.array([700] * len(seqs), pa.int64()),
            "data": pa.array([payload(c) for c in changes], pa.binary()),
            "rel_oid": pa.array([OID] * len(seqs), pa.int64()),
            "commit_lsn": pa.array([None if x else COMMIT_LSN for x in stream_xids], pa.int64()),
            "commit_ts": pa.array(
                [None if x else COMMIT_TS for x in stream_xids], pa.timestamp("us", "UTC")
            ),
            "tx_ordinal": pa.array([s % 3 for s in seqs], pa.int64()),
            "stream_xid": pa.array(stream_xids, pa.int64()),
        }
    )
    streams = StreamOutcome(
        commits={STREAM_COMMITTED: (STREAM_COMMIT_LSN, 0x210, STREAM_TS_PG)},
        aborted_subxacts={(STREAM_ABORTED, STREAM_ABORTED)},
    )
    schema = arrow_schema_for(change_schema(cat))
    run = make_decoder(cat, streams, {STREAM_COMMIT_LSN: "upstream"}, BATCH, schema)
    out = list(run(iter([raw, raw.slice(0, 0)])))
    kept = [(c, s) for c, s in zip(changes, seqs, strict=True) if c["stream"] != STREAM_ABORTED]
    if not kept:
        assert out == []
        return
    assert len(out) == 1 and out[0].schema == schema
    rows = [expected_row(c, s, cat, names) for c, s in kept]
    # Through Arrow, as the decoder's output went: the column types decide the Python values.
    want = pa.Table.from_pylist(rows, schema=schema).to_pylist()
    assert exact_rows(out[0].to_pylist()) == exact_rows(want)


def exact_rows(rows: list[dict[str, Any]]) -> list[Any]:
    return [
        {k: exact(v) if not isinstance(v, dict) else exact_rows([v])[0] for k, v in r.items()}
        for r in rows
    ]
