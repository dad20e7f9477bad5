"""Spark SQL DDL type strings → ``pyspark.sql.types`` without a JVM.

``StructType.fromDDL`` asks the JVM to parse, so every schema slotlake builds would need a
running SparkSession. A batch whose tables are all done on the driver
(:mod:`slotlake.local_table`) must not start one just to name its columns' types. The
grammar here is the part of Spark's DDL that slotlake writes: the primitive names of
:mod:`slotlake.pgtypes`, ``decimal(p,s)``, ``array<…>``, ``map<…,…>`` and
``struct<name: type, …>`` / ``struct<`name` type, …>``, with backtick-quoted names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotlake import schema_memo

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType


class DdlError(ValueError):
    """A DDL string outside the supported grammar; names the text and the position."""


def _primitives() -> dict[str, DataType]:
    from pyspark.sql import types as T

    return {
        "boolean": T.BooleanType(),
        "tinyint": T.ByteType(),
        "byte": T.ByteType(),
        "smallint": T.ShortType(),
        "short": T.ShortType(),
        "int": T.IntegerType(),
        "integer": T.IntegerType(),
        "bigint": T.LongType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "real": T.FloatType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "timestamp_ltz": T.TimestampType(),
        "timestamp_ntz": T.TimestampNTZType(),
        "void": T.NullType(),
    }


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.primitives = _primitives()

    def fail(self, what: str) -> DdlError:
        return DdlError(f"DDL {self.text!r}, offset {self.pos}: {what}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def eat(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.eat(token):
            raise self.fail(f"expected {token!r}")

    def word(self) -> str:
        self.skip()
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isalnum() or self.text[self.pos] == "_"
        ):
            self.pos += 1
        if start == self.pos:
            raise self.fail("expected a name")
        return self.text[start : self.pos]

    def name(self) -> str:
        self.skip()
        if not self.eat("`"):
            return self.word()
        out = []
        while True:
            end = self.text.find("`", self.pos)
            if end < 0:
                raise self.fail("unterminated `name`")
            out.append(self.text[self.pos : end])
            self.pos = end + 1
            if not self.text.startswith("`", self.pos):  # `` is a literal backtick
                return "".join(out)
            out.append("`")
            self.pos += 1

    def fields(self, close: str | None) -> StructType:
        from pyspark.sql.types import StructField, StructType

        out = []
        while True:
            if close is not None and self.eat(close):
                break
            name = self.name()
            self.eat(":")
            out.append(StructField(name, self.type()))
            if not self.eat(","):
                if close is not None:
                    self.expect(close)
                break
        return StructType(out)

    def type(self) -> DataType:
        from pyspark.sql.types import ArrayType, DecimalType, MapType

        word = self.word().lower()
        if word in ("decimal", "dec", "numeric"):
            if not self.eat("("):
                return DecimalType(10, 0)
            precision = int(self.word())
            scale = int(self.word()) if self.eat(",") else 0
            self.expect(")")
            return DecimalType(precision, scale)
        if word == "array":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return ArrayType(element)
        if word == "map":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(">")
            return MapType(key, value)
        if word == "struct":
            self.expect("<")
            return self.fields(">")
        if word not in self.primitives:
            raise self.fail(f"unknown type {word!r}")
        return self.primitives[word]

    def end(self) -> None:
        self.skip()
        if self.pos != len(self.text):
            raise self.fail("unexpected text")


def parse_type(ddl: str) -> DataType:
    """One DDL type, e.g. ``decimal(12,2)`` or ``array<array<string>>``."""
    p = _Parser(ddl)
    out = p.type()
    p.end()
    return out


def parse_struct(ddl: str) -> StructType:
    """A column list, e.g. ``a bigint, `b c` array<string>`` — what ``StructType.fromDDL``
    takes.

    Kept (:mod:`slotlake.schema_memo`; a batch asks for each table's schemas several
    times, a hundred tables' parses cost more than their writes, and forked workers hand
    theirs back): the result is shared, never to be mutated."""
    hit = schema_memo.parsed("ddl", ddl)
    if hit is not None:
        return hit
    p = _Parser(ddl)
    out = p.fields(None)
    p.end()
    schema_memo.keep_parsed("ddl", ddl, out)
    return out
