"""PostgreSQL log sequence numbers (XLogRecPtr)."""

from __future__ import annotations

import re

_LSN_TEXT = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
_MAX = 0xFFFF_FFFF_FFFF_FFFF


class Lsn(int):
    """A 64-bit WAL position that prints and parses like PostgreSQL (``16/B374D848``).

    It is an ``int`` so that comparisons, sorting, Parquet storage (int64 after
    ``to_signed``) and arithmetic (bytes of WAL between two positions) stay plain.
    """

    __slots__ = ()

    def __new__(cls, value: int | str | Lsn = 0) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        value = int(value)
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        m = _LSN_TEXT.match(text)
        if m is None:
            raise ValueError(f"not an LSN (expected X/Y in hex, like 0/16B3748): {text!r}")
        return super().__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def to_signed(self) -> int:
        """Two's-complement int64, for storage in signed 64-bit columns (Parquet, Spark)."""
        v = int(self)
        return v - (1 << 64) if v >= 1 << 63 else v

    @classmethod
    def from_signed(cls, value: int) -> Lsn:
        return cls(value + (1 << 64) if value < 0 else value)


INVALID_LSN = Lsn(0)
