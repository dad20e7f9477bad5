"""slotlake.udf on tiny hand-built frames: decode_payload, lsn_text, shape_table."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from slotlake.decode import collect_catalog, decode_table, raw_dml, scan_raw
from slotlake.pgoutput import MESSAGE_TYPES, UNCHANGED_TOAST, DecodeError, decode
from slotlake.raw import RawWriter
from slotlake.udf import (
    PAYLOAD_SCHEMA,
    decode_payload,
    decode_payload_udf,
    lsn_text,
    payload_record,
    shape_table,
    table_catalog,
)
from tests.unit.test_pgoutput_decode import (
    LSN_A,
    LSN_B,
    TS,
    VECTORS,
    XID,
    cstr,
    i32,
    i64,
    relation_column,
    tuple_data,
    u8,
    u16,
    u32,
    u64,
)

# TS and the LSNs of the byte builders, as the struct holds them.
TS_AT = datetime(2024, 4, 3, 4, 1, 49, 876543, tzinfo=timezone.utc)
LSN_A_SIGNED = 97500059720  # 16/B374D848
LSN_B_SIGNED = -4294967295  # FFFFFFFF/1, above int64: stored in two's complement
OID = 16384
INT4, TEXT, NUMERIC = 23, 25, 1700


def struct_row(**fields: Any) -> tuple[Any, ...]:
    unknown = set(fields) - set(PAYLOAD_SCHEMA.fieldNames())
    assert not unknown, unknown
    return tuple(fields.get(n) for n in PAYLOAD_SCHEMA.fieldNames())


def decoded(spark, payloads: list[bytes | None], in_stream: Any = None, errors: str = "raise"):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(
        [(i, None if p is None else bytearray(p)) for i, p in enumerate(payloads)],
        "i int, data binary",
    )
    return df.select("i", decode_payload("data", in_stream, errors=errors).alias("m")).select("m.*")


def expected(spark, *rows: tuple[Any, ...]):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(list(rows), PAYLOAD_SCHEMA)


# -- decode_payload: one hand-built payload per case ------------------------------------

CASES: list[tuple[str, bytes, bool, tuple[Any, ...]]] = [
    (
        "begin",
        b"B" + u64(LSN_B) + i64(TS) + u32(XID),
        False,
        struct_row(
            type="B",
            message_name="Begin",
            final_lsn=LSN_B_SIGNED,
            commit_ts=TS_AT,
            xid=XID,
        ),
    ),
    (
        "commit",
        b"C" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS),
        False,
        struct_row(
            type="C",
            message_name="Commit",
            flags=0,
            commit_lsn=LSN_A_SIGNED,
            end_lsn=LSN_B_SIGNED,
            commit_ts=TS_AT,
        ),
    ),
    (
        "relation",
        b"R"
        + u32(OID)
        + cstr("public")
        + cstr("orders")
        + b"d"
        + u16(3)
        + relation_column(1, "id", INT4, -1)
        + relation_column(0, "note", TEXT, -1)
        + relation_column(0, "price", NUMERIC, 655366),
        False,
        struct_row(
            type="R",
            message_name="Relation",
            relation_oid=OID,
            namespace="public",
            relation="orders",
            replica_identity="d",
            columns=[
                {"name": "id", "type_oid": INT4, "typmod": -1, "is_key": True},
                {"name": "note", "type_oid": TEXT, "typmod": -1, "is_key": False},
                {"name": "price", "type_oid": NUMERIC, "typmod": 655366, "is_key": False},
            ],
        ),
    ),
    (
        "insert-null-text-toast-binary",
        b"I" + u32(OID) + b"N" + tuple_data(["1", None, "Zoë 🐘", UNCHANGED_TOAST, b"\x00\xff"]),
        False,
        struct_row(
            type="I",
            message_name="Insert",
            relation_oid=OID,
            new_values=["1", None, "Zoë 🐘", None, "00ff"],
            new_kinds="tntub",
            unchanged=[3],
        ),
    ),
    (
        "update-old-key",
        b"U"
        + u32(OID)
        + b"K"
        + tuple_data(["7", None, None])
        + b"N"
        + tuple_data(["8", "b", UNCHANGED_TOAST]),
        False,
        struct_row(
            type="U",
            message_name="Update",
            relation_oid=OID,
            old_kind="K",
            old_values=["7", None, None],
            old_kinds="tnn",
            new_values=["8", "b", None],
            new_kinds="ttu",
            unchanged=[2],
        ),
    ),
    (
        "update-new-only",
        b"U" + u32(OID) + b"N" + tuple_data(["8", ""]),
        False,
        struct_row(
            type="U",
            message_name="Update",
            relation_oid=OID,
            new_values=["8", ""],
            new_kinds="tt",
            unchanged=[],
        ),
    ),
    (
        "delete-key",
        b"D" + u32(OID) + b"K" + tuple_data(["7", None]),
        False,
        struct_row(
            type="D",
            message_name="Delete",
            relation_oid=OID,
            old_kind="K",
            old_values=["7", None],
            old_kinds="tn",
        ),
    ),
    (
        "truncate-cascade-restart",
        b"T" + u32(2) + u8(3) + u32(OID) + u32(0xFFFF_FFFF),
        False,
        struct_row(
            type="T",
            message_name="Truncate",
            truncate_options=3,
            relation_oids=[OID, 0xFFFF_FFFF],
        ),
    ),
    (
        "message",
        b"M" + u8(1) + u64(LSN_A) + cstr("slotlake") + i32(5) + b"hello",
        False,
        struct_row(
            type="M",
            message_name="Message",
            transactional=True,
            lsn=LSN_A_SIGNED,
            prefix="slotlake",
            content=bytearray(b"hello"),
        ),
    ),
    (
        "insert-in-stream",
        b"I" + u32(XID) + u32(OID) + b"N" + tuple_data(["1"]),
        True,
        struct_row(
            type="I",
            message_name="Insert",
            xid=XID,
            relation_oid=OID,
            new_values=["1"],
            new_kinds="t",
            unchanged=[],
        ),
    ),
    (
        "type",
        b"Y" + u32(16390) + cstr("public") + cstr("mood"),
        False,
        struct_row(
            type="Y", message_name="Type", type_oid=16390, namespace="public", type_name="mood"
        ),
    ),
    (
        "origin",
        b"O" + u64(LSN_A) + cstr("pg_16385"),
        False,
        struct_row(type="O", message_name="Origin", commit_lsn=LSN_A_SIGNED, origin="pg_16385"),
    ),
    (
        "stream-abort-v4",
        b"A" + u32(100) + u32(101) + u64(LSN_B) + i64(TS),
        False,
        struct_row(
            type="A",
            message_name="StreamAbort",
            xid=100,
            subxid=101,
            abort_lsn=LSN_B_SIGNED,
            abort_ts=TS_AT,
        ),
    ),
    (
        "rollback-prepared",
        b"r" + u8(0) + u64(LSN_A) + u64(LSN_B) + i64(TS) + i64(TS + 1) + u32(XID) + cstr("g1"),
        False,
        struct_row(
            type="r",
            message_name="RollbackPrepared",
            flags=0,
            prepare_end_lsn=LSN_A_SIGNED,
            rollback_end_lsn=LSN_B_SIGNED,
            prepare_ts=TS_AT,
            rollback_ts=datetime(2024, 4, 3, 4, 1, 49, 876544, tzinfo=timezone.utc),
            xid=XID,
            gid="g1",
        ),
    ),
]


@pytest.mark.parametrize(("name", "payload", "in_stream", "row"), CASES, ids=[c[0] for c in CASES])
def test_decode_payload(spark, name: str, payload: bytes, in_stream: bool, row: tuple) -> None:  # type: ignore[no-untyped-def]
    assert_df_equality(decoded(spark, [payload], in_stream), expected(spark, row))


def test_every_message_type_through_spark(spark) -> None:  # type: ignore[no-untyped-def]
    """All vectors of the decoder's unit tests, one frame, in_stream from a column."""
    assert {type(v[3]) for v in VECTORS} == set(MESSAGE_TYPES)
    df = spark.createDataFrame(
        [(i, bytearray(p), s) for i, (_, p, s, _) in enumerate(VECTORS)],
        "i int, data binary, in_stream boolean",
    )
    actual = df.select("i", decode_payload("data", "in_stream").alias("m")).orderBy("i")
    want = spark.createDataFrame(
        [(i, struct_row(**payload_record(msg))) for i, (_, _, _, msg) in enumerate(VECTORS)],
        f"i int, m {PAYLOAD_SCHEMA.simpleString()}",
    )
    assert_df_equality(actual, want)


def test_payload_record_covers_every_message_field() -> None:
    """Every field of every message type lands in the struct (or in old/new_* and unchanged)."""
    for _, payload, in_stream, msg in VECTORS:
        record = payload_record(decode(payload, in_stream=in_stream))
        assert set(record) <= set(PAYLOAD_SCHEMA.fieldNames())
        assert record["type"] == type(msg).type_code.decode()
        expected_keys = len(msg._fields) + 2 + sum(f in ("old", "new") for f in msg._fields)
        expected_keys += "new" in msg._fields  # unchanged
        assert len(record) == expected_keys, (type(msg).__name__, record)


def test_null_in_stream_counts_as_false_and_null_payload_gives_nulls(spark) -> None:  # type: ignore[no-untyped-def]
    insert = b"I" + u32(OID) + b"N" + tuple_data(["1"])
    df = spark.createDataFrame(
        [(0, bytearray(insert), None), (1, None, True)], "i int, data binary, s boolean"
    )
    actual = df.select(decode_payload("data", F.col("s")).alias("m")).select("m.*")
    want = expected(
        spark,
        struct_row(
            type="I",
            message_name="Insert",
            relation_oid=OID,
            new_values=["1"],
            new_kinds="t",
            unchanged=[],
        ),
        struct_row(),
    )
    assert_df_equality(actual, want, ignore_row_order=True)


# -- malformed payloads -------------------------------------------------------------------

TRUNCATED = b"I" + u32(OID) + b"N" + u16(1) + b"t" + i32(10) + b"ab"  # value past the end


def test_malformed_payload_raises_naming_the_offset(spark) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=r"DecodeError") as info:
        decoded(spark, [TRUNCATED]).collect()
    text = str(info.value)
    assert "Insert: truncated reading 'new[0].value' at offset 13" in text
    assert "payload of 15 bytes: 49 00 00 40 00" in text
    assert "errors='null'" in text


def test_errors_null_returns_the_error_in_fields(spark) -> None:  # type: ignore[no-untyped-def]
    good = b"D" + u32(OID) + b"K" + tuple_data(["7"])
    infinity = b"B" + u64(LSN_A) + i64(2**63 - 1) + u32(1)  # commit time 'infinity'
    payloads = [good, TRUNCATED, b"\xff", b"", None, infinity]
    actual = decoded(spark, payloads, errors="null")
    errors = []
    for p in (TRUNCATED, b"\xff", b""):
        with pytest.raises(DecodeError) as info:
            decode(p)
        errors.append(info.value)
    assert [e.offset for e in errors] == [13, 0, 0]
    want = expected(
        spark,
        struct_row(
            type="D",
            message_name="Delete",
            relation_oid=OID,
            old_kind="K",
            old_values=["7"],
            old_kinds="t",
        ),
        struct_row(type="I", message_name="Insert", error=str(errors[0]), error_offset=13),
        struct_row(error=str(errors[1]), error_offset=0),
        struct_row(error=str(errors[2]), error_offset=0),
        struct_row(),
        struct_row(
            type="B",
            message_name="Begin",
            error="PostgreSQL timestamp infinity is outside Python's datetime range (years 1–9999)",
        ),
    )
    assert_df_equality(actual, want, ignore_row_order=True)


def test_errors_argument_is_checked() -> None:
    with pytest.raises(ValueError, match="errors must be"):
        decode_payload("data", errors="ignore")  # type: ignore[arg-type]


def test_udf_object_registers_for_sql(spark) -> None:  # type: ignore[no-untyped-def]
    spark.udf.register("slotlake_decode_payload", decode_payload_udf)
    spark.createDataFrame(
        [(bytearray(b"S" + u32(5) + u8(1)),)], "data binary"
    ).createOrReplaceTempView("udf_payloads")
    row = spark.sql("SELECT slotlake_decode_payload(data, false) AS m FROM udf_payloads").first()
    assert (row.m.type, row.m.xid, row.m.first_segment) == ("S", 5, True)


def test_lsn_text(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(
        [(0, LSN_A_SIGNED), (1, LSN_B_SIGNED), (2, 0), (3, None)], "i int, lsn bigint"
    )
    actual = df.select("i", lsn_text("lsn").alias("lsn"))
    want = spark.createDataFrame(
        [(0, "16/B374D848"), (1, "FFFFFFFF/1"), (2, "0/0"), (3, None)], "i int, lsn string"
    )
    assert_df_equality(actual, want, ignore_nullable=True)


# -- shape_table --------------------------------------------------------------------------

T1 = TS
T2 = TS + 60_000_000
OTHER = 16390


def begin(final_lsn: int, ts: int, xid: int) -> bytes:
    return b"B" + u64(final_lsn) + i64(ts) + u32(xid)


def commit(commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"C" + u8(0) + u64(commit_lsn) + u64(end_lsn) + i64(ts)


def relation(oid: int, name: str, *columns: tuple[str, int, bool]) -> bytes:
    return (
        b"R"
        + u32(oid)
        + cstr("public")
        + cstr(name)
        + b"d"
        + u16(len(columns))
        + b"".join(relation_column(int(key), n, t, -1) for n, t, key in columns)
    )


def write_raw(tmp_path: Path, payloads: list[tuple[int, bytes]]) -> str:
    """A raw batch directory as the pull writes it: (xid, payload) in peek order."""
    directory = tmp_path / "raw"
    with RawWriter(directory, background=False) as w:
        w.append(
            [1000 + i for i in range(len(payloads))],
            [x for x, _ in payloads],
            [p for _, p in payloads],
        )
    return str(directory)


T_COLUMNS = (("id", INT4, True), ("txt", TEXT, False), ("big", TEXT, False))

BATCH = [
    # seq 0..8: a plain transaction touching two tables, with a TRUNCATE
    (700, begin(0x100, T1, 700)),
    (700, relation(OID, "t", *T_COLUMNS)),
    (700, relation(OTHER, "other", ("v", TEXT, False))),
    (700, b"I" + u32(OID) + b"N" + tuple_data(["1", "a", "x"])),
    (
        700,
        b"U"
        + u32(OID)
        + b"K"
        + tuple_data(["1", None, None])
        + b"N"
        + tuple_data(["2", "b", UNCHANGED_TOAST]),
    ),
    (700, b"I" + u32(OTHER) + b"N" + tuple_data(["hello"])),
    (700, b"D" + u32(OID) + b"K" + tuple_data(["2", None, None])),
    (700, b"T" + u32(1) + u8(0) + u32(OID)),
    (700, commit(0x100, 0x110, T1)),
    # seq 9..11: a streamed segment of xid 701, committed at seq 16
    (701, b"S" + u32(701) + u8(1)),
    (701, b"I" + u32(701) + u32(OID) + b"N" + tuple_data(["3", "c", "y"])),
    (701, b"E"),
    # seq 12..15: a streamed segment of xid 702, aborted
    (702, b"S" + u32(702) + u8(1)),
    (702, b"I" + u32(702) + u32(OID) + b"N" + tuple_data(["4", "d", "z"])),
    (702, b"E"),
    (702, b"A" + u32(702) + u32(702)),
    # seq 16
    (701, b"c" + u32(701) + u8(0) + u64(0x200) + u64(0x210) + i64(T2)),
]

T1_AT = TS_AT
T2_AT = datetime(2024, 4, 3, 4, 2, 49, 876543, tzinfo=timezone.utc)


def change(schema, **values: Any) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    row: dict[str, Any] = {
        "_origin": None,
        "_batch": 7,
        "_missing_toast": [],
        "_fallback": {},
        "_truncate_options": None,
        "_unchanged": [],
        "_old": None,
        "_old_kind": None,
    }
    row.update(values)
    return tuple(row.get(n) for n in schema.fieldNames())


def test_shape_table_equals_the_expected_typed_rows(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = spark.read.parquet(write_raw(tmp_path, BATCH))
    actual = shape_table(raw, "public.t", batch=7).orderBy("_seq")
    schema = actual.schema
    assert [(f.name, f.dataType.simpleString()) for f in schema][:3] == [
        ("id", "int"),
        ("txt", "string"),
        ("big", "string"),
    ]
    tx = {"_commit_lsn": 0x100, "_xid": 700, "_commit_ts": T1_AT}
    want = spark.createDataFrame(
        [
            change(schema, id=1, txt="a", big="x", _op="I", _lsn=1003, _tx_ordinal=3, _seq=3, **tx),
            change(
                schema,
                id=2,
                txt="b",
                big=None,
                _op="U",
                _lsn=1004,
                _tx_ordinal=4,
                _seq=4,
                _old_kind="K",
                _unchanged=["big"],  # a key image cannot fill a non-key column
                _old={"id": 1, "txt": None, "big": None},
                **tx,
            ),
            change(
                schema,
                _op="D",
                _lsn=1006,
                _tx_ordinal=6,
                _seq=6,
                _old_kind="K",
                _old={"id": 2, "txt": None, "big": None},
                **tx,
            ),
            # streamed: the Stream Commit's LSN and time; xid 702's aborted insert is absent
            change(
                schema,
                id=3,
                txt="c",
                big="y",
                _op="I",
                _commit_lsn=0x200,
                _lsn=1010,
                _tx_ordinal=1,
                _xid=701,
                _commit_ts=T2_AT,
                _seq=10,
            ),
        ],
        schema,
    )
    assert_df_equality(actual, want)


def test_shape_table_equals_the_pipelines_own_route(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Same rows as batch.process_batch's scan_raw → collect_catalog → decode_table."""
    path = write_raw(tmp_path, BATCH)
    raw = spark.read.parquet(path)
    bcat = collect_catalog(scan_raw(path).catalog_rows, 7)
    for name in ("public.t", "public.other"):
        pipeline = decode_table(raw_dml(raw), bcat.tables[name], bcat, 7).orderBy("_seq")
        mine = shape_table(raw, name, batch=7).orderBy("_seq")
        assert_df_equality(mine, pipeline)
    catalog = table_catalog(raw, 7)
    assert [t.tables for t in catalog.truncates] == [["public.t"]]
    assert [(t.seq, t.commit_lsn) for t in catalog.truncates] == [
        (t.seq, t.commit_lsn) for t in bcat.truncates
    ]
    assert catalog.streams == bcat.streams


def test_shape_table_by_bare_name_and_unknown_table(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = spark.read.parquet(write_raw(tmp_path, BATCH))
    rows = shape_table(raw, "other", batch=7).select("v", "_op", "_seq").collect()
    assert [tuple(r) for r in rows] == [("hello", "I", 5)]
    with pytest.raises(KeyError, match=r"public\.missing.*tables: public\.other, public\.t"):
        shape_table(raw, "public.missing")


def test_shape_table_refuses_a_reserved_column_name(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from slotlake.batch import SchemaCollisionError

    raw = spark.read.parquet(
        write_raw(
            tmp_path,
            [
                (700, begin(0x100, T1, 700)),
                (700, relation(OID, "t", ("_op", TEXT, True))),
                (700, b"I" + u32(OID) + b"N" + tuple_data(["x"])),
                (700, commit(0x100, 0x110, T1)),
            ],
        )
    )
    with pytest.raises(SchemaCollisionError, match="_op"):
        shape_table(raw, "public.t")


def test_shape_table_splits_a_table_renamed_in_the_batch(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``t`` renamed to ``t2`` between two changes of one relation: each name gets the
    changes its own Relation message precedes. Before, ``t`` got both and ``t2`` failed on
    the first (no Relation message of the oid before it in ``t2``'s versions)."""
    columns = (("id", INT4, True), ("v", TEXT, False))
    raw = spark.read.parquet(
        write_raw(
            tmp_path,
            [
                (700, begin(0x100, T1, 700)),
                (700, relation(OID, "t", *columns)),
                (700, b"I" + u32(OID) + b"N" + tuple_data(["1", "a"])),
                (700, commit(0x100, 0x110, T1)),
                (701, begin(0x200, T2, 701)),
                (701, relation(OID, "t2", *columns)),
                (701, b"I" + u32(OID) + b"N" + tuple_data(["2", "b"])),
                (701, b"D" + u32(OID) + b"K" + tuple_data(["1", None])),
                (701, commit(0x200, 0x210, T2)),
            ],
        )
    )
    bcat = table_catalog(raw, batch=7)

    def ops(name: str) -> list[tuple[Any, ...]]:
        rows = shape_table(raw, name, batch=7, catalog=bcat).orderBy("_seq")
        return [tuple(r) for r in rows.select("_op", "id", "v", "_old.id").collect()]

    assert ops("public.t") == [("I", 1, "a", None)]
    assert ops("public.t2") == [("I", 2, "b", None), ("D", None, None, 1)]
