"""The shape every type converter has, and the value that marks a lossless text fallback."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from ._vector import Kernel, identity, utf8_kernel


class Fallback(NamedTuple):
    """A value that cannot be represented in the column's Spark type.

    ``text`` is its exact PostgreSQL text representation under the peek session's
    settings, so nothing is ever silently changed: the lake keeps it verbatim.
    """

    text: str


class Codec(NamedTuple):
    """Converters for one resolved column type, all chosen once at resolve time.

    ``binary_text`` exists because a binary datum that falls back (an infinite date,
    a two-dimensional array…) must be kept as the text PostgreSQL would have printed,
    and array fallbacks need that text for every element.
    """

    spark_ddl: str
    from_text: Callable[[str], object]
    from_binary: Callable[[bytes], object]
    binary_text: Callable[[bytes], str]
    # False when no value of the type can become a Fallback: lets arrays skip a scan.
    may_fall_back: bool = True
    # Whole-column kernels over text / binary datums (see _vector), or None: that format
    # is converted value by value.
    vector_text: Kernel | None = None
    vector_binary: Kernel | None = None


# Shared precompiled layouts of the binary send formats (network byte order).
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT16 = struct.Struct(">H")
UINT32 = struct.Struct(">I")
UINT64 = struct.Struct(">Q")
FLOAT4 = struct.Struct(">f")
FLOAT8 = struct.Struct(">d")


def utf8(value: bytes) -> str:
    # The database encoding is UTF8 (a documented precondition); bytes.decode is
    # strict, so a wrong assumption shows up as an error rather than mojibake.
    return value.decode("utf-8")


def string_codec(binary_text: Callable[[bytes], str] = utf8) -> Codec:
    """A type mapped to Spark string whose Python value *is* PostgreSQL's text."""
    return Codec(
        "string",
        str,
        binary_text,
        binary_text,
        may_fall_back=False,
        vector_text=identity,
        vector_binary=utf8_kernel if binary_text is utf8 else None,
    )
