"""slotlake.ddltypes: Spark DDL type strings parsed without a JVM."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from slotlake.ddltypes import DdlError, parse_struct, parse_type


def test_nested_types() -> None:
    assert parse_type("array<array<decimal(12,2)>>") == T.ArrayType(
        T.ArrayType(T.DecimalType(12, 2))
    )
    assert parse_type("map<string,string>") == T.MapType(T.StringType(), T.StringType())
    assert parse_type("struct<a: bigint, `b c`: timestamp_ntz>") == T.StructType(
        [T.StructField("a", T.LongType()), T.StructField("b c", T.TimestampNTZType())]
    )


def test_column_list_with_quoted_names() -> None:
    got = parse_struct("`we``ird` int, `_old` struct<`x` date, `y` binary>, plain boolean")
    assert got.fieldNames() == ["we`ird", "_old", "plain"]
    assert got["_old"].dataType == T.StructType(
        [T.StructField("x", T.DateType()), T.StructField("y", T.BinaryType())]
    )
    assert all(f.nullable for f in got.fields)


@pytest.mark.parametrize(
    ("ddl", "where"),
    [("a bigint,", "offset 9"), ("a frobnicate", "unknown type"), ("a array<int", "'>'")],
)
def test_errors_name_text_and_offset(ddl: str, where: str) -> None:
    with pytest.raises(DdlError, match=where):
        parse_struct(ddl)
