"""slotlake.decode.arrow_schema_for: the Arrow schema pyspark's ``to_arrow_schema`` gives
(UTC timestamps, no large types), field metadata included, made without its isinstance
chain."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    DayTimeIntervalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from slotlake.ddltypes import parse_struct
from slotlake.decode import arrow_schema_for
from slotlake.delta import _column_mapped


def _pyspark(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def _same(schema: StructType) -> None:
    ours, theirs = arrow_schema_for(schema), _pyspark(schema)
    assert ours.equals(theirs, check_metadata=True), (ours, theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.equals(b, check_metadata=True), (a, b)


EVERY_TYPE = (
    "b boolean, i1 tinyint, i2 smallint, i4 int, i8 bigint, f4 float, f8 double, "
    "d decimal(12,2), dmax decimal(38,18), s string, bin binary, dt date, ts timestamp, "
    "ntz timestamp_ntz, arr array<bigint>, arr2 array<array<string>>, "
    "m map<string,string>, mi map<bigint,array<decimal(5,1)>>, "
    "st struct<a: int, `b c`: struct<x: string, y: array<timestamp>>>, "
    "sa array<struct<k: string, v: double>>"
)


def test_every_type_slotlake_writes_converts_as_pyspark_does() -> None:
    _same(parse_struct(EVERY_TYPE))


def test_field_metadata_and_nullability_as_pyspark_gives_them() -> None:
    mapped, _ = _column_mapped(parse_struct(EVERY_TYPE))
    _same(mapped)  # every field, nested ones too, with column mapping metadata
    _same(
        StructType(
            [
                StructField("k", LongType(), nullable=False, metadata={"comment": "key"}),
                StructField("v", StringType(), nullable=True),
            ]
        )
    )


def test_a_type_without_a_shortcut_goes_through_pyspark() -> None:
    schema = StructType([StructField("iv", DayTimeIntervalType())])
    assert arrow_schema_for(schema).field("iv").type == pa.duration("us")
    _same(schema)
