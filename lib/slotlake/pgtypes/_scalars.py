"""Numbers, strings, bytes and the small fixed formats (uuid, json, inet, macaddr, bit…)."""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa

from . import _vector as vec
from ._codec import (
    FLOAT4,
    FLOAT8,
    INT16,
    INT32,
    INT64,
    UINT16,
    UINT32,
    UINT64,
    Codec,
    Fallback,
    string_codec,
    utf8,
)

# --- booleans and integers ----------------------------------------------------------

_BOOL_TEXT = {"t": True, "f": False}
_BOOL_BINARY = {b"\x01": True, b"\x00": False}


def _bool_binary_text(value: bytes) -> str:
    return "t" if _BOOL_BINARY[value] else "f"


BOOL = Codec(
    "boolean",
    _BOOL_TEXT.__getitem__,
    _BOOL_BINARY.__getitem__,
    _bool_binary_text,
    False,
    vec.bool_text_kernel,
    vec.bool_binary_kernel,
)


def _int_codec(ddl: str, layout: struct.Struct, arrow_type: pa.DataType, dtype: str) -> Codec:
    unpack_from = layout.unpack

    def from_binary(value: bytes) -> int:
        return unpack_from(value)[0]

    def binary_text(value: bytes) -> str:
        return str(unpack_from(value)[0])

    return Codec(
        ddl,
        int,
        from_binary,
        binary_text,
        False,
        vec.int_text_kernel(arrow_type),
        vec.fixed_binary_kernel(dtype, arrow_type),
    )


INT2 = _int_codec("smallint", INT16, pa.int16(), ">i2")
INT4 = _int_codec("int", INT32, pa.int32(), ">i4")
INT8 = _int_codec("bigint", INT64, pa.int64(), ">i8")
# oid, xid and cid are unsigned 32-bit: only bigint holds all of them.
UINT4 = _int_codec("bigint", UINT32, pa.int64(), ">u4")

_INT64_MAX = 2**63 - 1


def _xid8_text(value: str) -> object:
    number = int(value)
    # xid8 is unsigned 64-bit; an epoch that large is theoretical, but never wrap it.
    return number if number <= _INT64_MAX else Fallback(value)


def _xid8_binary(value: bytes) -> object:
    number = UINT64.unpack(value)[0]
    return number if number <= _INT64_MAX else Fallback(str(number))


XID8 = Codec("bigint", _xid8_text, _xid8_binary, lambda value: str(UINT64.unpack(value)[0]))


def _pg_lsn_binary_text(value: bytes) -> str:
    lsn = UINT64.unpack(value)[0]
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


PG_LSN = string_codec(_pg_lsn_binary_text)

# --- floats -------------------------------------------------------------------------


def _shortest_parts(text: str) -> tuple[str, int]:
    """Significant digits and the decimal exponent of the first one, from '1.5e-05' etc."""
    mantissa, _, exponent = text.lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    exp10 = (int(exponent) if exponent else 0) + len(whole) - 1
    stripped = digits.lstrip("0")
    exp10 -= len(digits) - len(stripped)
    return stripped.rstrip("0"), exp10


def _format_float(x: float, shortest: Callable[[float], str], fixed_below: int) -> str:
    """PostgreSQL's float output with extra_float_digits > 0 (Ryu shortest round trip).

    PostgreSQL prints fixed-point notation for decimal exponents in [-4, fixed_below)
    — printf's %g thresholds, 15 for float8 and 6 for float4 — else 'd.ddde±XX'.
    """
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    sign = "-" if str(x)[0] == "-" else ""  # keeps -0, which PostgreSQL prints as '-0'
    digits, exp10 = _shortest_parts(shortest(x).lstrip("-"))
    if not digits:
        return sign + "0"
    if -4 <= exp10 < fixed_below:
        if exp10 < 0:
            body = "0." + "0" * (-exp10 - 1) + digits
        elif len(digits) <= exp10 + 1:
            body = digits + "0" * (exp10 + 1 - len(digits))
        else:
            body = digits[: exp10 + 1] + "." + digits[exp10 + 1 :]
    else:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        body = f"{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return sign + body


def _to_float4(x: float) -> float:
    return FLOAT4.unpack(FLOAT4.pack(x))[0]


def _float4_round_trips(candidate: Decimal, x: float) -> bool:
    try:
        return _to_float4(float(candidate)) == x
    except OverflowError:  # rounded up past the largest float4
        return False


def _float4_shortest(x: float) -> str:
    """The shortest decimal that reads back as the same float4, closest to it (as Ryu).

    Python only knows double-shortest (repr), so search the precision. The correctly
    rounded candidate is the closest, but at a power of two the rounding interval is
    lopsided and only its neighbour on the wide side may round-trip.
    """
    exact = Decimal(x)
    for precision in range(9):
        nearest = Decimal(f"{x:.{precision}e}")
        if _float4_round_trips(nearest, x):
            return str(nearest)
        step = Decimal(1).scaleb(nearest.adjusted() - precision)
        for candidate in sorted((nearest - step, nearest + step), key=lambda c: abs(c - exact)):
            if _float4_round_trips(candidate, x):
                return str(candidate)
    return f"{x:.8e}"


def _float4_from_text(value: str) -> float:
    # PostgreSQL prints the shortest float4 text ('1.1'); read it back as a float4
    # so that text and binary input give the identical Python float.
    return _to_float4(float(value))


def _float4_from_binary(value: bytes) -> float:
    return FLOAT4.unpack(value)[0]


def _float8_from_binary(value: bytes) -> float:
    return FLOAT8.unpack(value)[0]


def _float4_binary_text(value: bytes) -> str:
    x = FLOAT4.unpack(value)[0]
    return _format_float(x, _float4_shortest, 6)


def _float8_binary_text(value: bytes) -> str:
    x = FLOAT8.unpack(value)[0]
    return _format_float(x, repr, 15)


FLOAT4_CODEC = Codec(
    "float",
    _float4_from_text,
    _float4_from_binary,
    _float4_binary_text,
    False,
    vec.float4_text_kernel,
    vec.fixed_binary_kernel(">f4", pa.float32(), via="float64"),
)
FLOAT8_CODEC = Codec(
    "double",
    float,
    _float8_from_binary,
    _float8_binary_text,
    False,
    vec.float8_text_kernel,
    vec.fixed_binary_kernel(">f8", pa.float64()),
)

# --- numeric ------------------------------------------------------------------------

_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}
_NUMERIC_NEG = 0x4000
SPARK_MAX_PRECISION = 38


def numeric_binary_text(value: bytes) -> str:
    """numeric_send → numeric_out: base-10000 digits, printed with exactly dscale decimals."""
    ndigits, weight = INT16.unpack_from(value, 0)[0], INT16.unpack_from(value, 2)[0]
    sign, dscale = UINT16.unpack_from(value, 4)[0], INT16.unpack_from(value, 6)[0]
    special = _NUMERIC_SPECIAL.get(sign)
    if special is not None:
        return special
    if len(value) != 8 + 2 * ndigits or sign not in (0, _NUMERIC_NEG):
        raise ValueError("bad numeric binary header")
    digits = "".join(f"{d:04d}" for (d,) in UINT16.iter_unpack(value[8:]))
    point = (weight + 1) * 4  # where the decimal point falls in `digits`
    if point < 0:
        digits = "0" * -point + digits
        point = 0
    elif point > len(digits):
        digits += "0" * (point - len(digits))
    whole = digits[:point].lstrip("0") or "0"
    text = whole + "." + digits[point:][:dscale].ljust(dscale, "0") if dscale > 0 else whole
    return "-" + text if sign == _NUMERIC_NEG else text


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p,s), or None when unconstrained.

    Since PostgreSQL 15 the scale is an 11-bit two's-complement field, so it can be
    negative or larger than the precision.
    """
    if typmod < 4:
        return None
    packed = typmod - 4
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def numeric_codec(typmod: int) -> Codec:
    ps = numeric_precision_scale(typmod)
    if ps is None or not (ps[0] <= SPARK_MAX_PRECISION and 0 <= ps[1] <= ps[0]):
        # Unconstrained (or not a Spark decimal): the exact PostgreSQL text.
        return string_codec(numeric_binary_text)
    precision, scale = ps
    quantum = Decimal(1).scaleb(-scale)
    # Trapping Inexact turns "would have to round" into an error instead of a change.
    context = decimal.Context(
        prec=precision, traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow]
    )
    quantize = Decimal.quantize

    def from_text(value: str) -> object:
        number = Decimal(value)
        if not number.is_finite():  # NaN and ±Infinity fit numeric(p,s) but not decimal(p,s)
            return Fallback(value)
        return quantize(number, quantum, context=context)

    def from_binary(value: bytes) -> object:
        return from_text(numeric_binary_text(value))

    return Codec(
        f"decimal({precision},{scale})",
        from_text,
        from_binary,
        numeric_binary_text,
        vector_text=vec.decimal_text_kernel(precision, scale),
        vector_binary=vec.decimal_binary_kernel(precision, scale),
    )


# --- money --------------------------------------------------------------------------

_MONEY_QUANTUM = Decimal("0.01")
_MONEY_CONTEXT = decimal.Context(prec=19, traps=[decimal.InvalidOperation, decimal.Inexact])


def _money_from_text(value: str) -> Decimal:
    # lc_monetary=C prints '$1,234.56', '-$1,234.56'; accept parentheses too.
    negative = value[:1] in ("-", "(")
    digits = value.strip("-()$ ").replace("$", "").replace(",", "")
    number = Decimal(digits).quantize(_MONEY_QUANTUM, context=_MONEY_CONTEXT)
    if not number.is_finite() or digits[:1] in ("-", "+"):
        raise ValueError("not a money value")
    return -number if negative else number


def _money_from_binary(value: bytes) -> Decimal:
    return Decimal(INT64.unpack(value)[0]).scaleb(-2, _MONEY_CONTEXT)


def _money_binary_text(value: bytes) -> str:
    cents = INT64.unpack(value)[0]
    units, fraction = divmod(abs(cents), 100)
    return f"{'-' if cents < 0 else ''}${units:,}.{fraction:02d}"


MONEY = Codec("decimal(19,2)", _money_from_text, _money_from_binary, _money_binary_text, False)

# --- strings, bytes and fixed formats -----------------------------------------------

TEXT = string_codec()


def _char_binary_text(value: bytes) -> str:
    # charout: NUL prints as '', high-bit bytes as a backslash and three octal digits.
    if len(value) != 1:
        raise ValueError('"char" is one byte')
    byte = value[0]
    if byte == 0:
        return ""
    return chr(byte) if byte < 0x80 else f"\\{byte:03o}"


CHAR = string_codec(_char_binary_text)


def _bytea_from_text(value: str) -> bytes:
    if not value.startswith("\\x"):
        raise ValueError("bytea text must be hex format (bytea_output='hex')")
    return bytes.fromhex(value[2:])


def bytea_binary_text(value: bytes) -> str:
    return "\\x" + value.hex()


BYTEA = Codec(
    "binary", _bytea_from_text, bytes, bytea_binary_text, False, vector_binary=vec.identity
)


def _uuid_binary_text(value: bytes) -> str:
    if len(value) != 16:
        raise ValueError("uuid is 16 bytes")
    h = value.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


UUID = string_codec(_uuid_binary_text)
JSON = TEXT
XML = TEXT


def _jsonb_binary_text(value: bytes) -> str:
    if value[:1] != b"\x01":
        raise ValueError("unsupported jsonb binary version")
    return utf8(value[1:])


JSONB = string_codec(_jsonb_binary_text)


def _mac_binary_text(size: int) -> Callable[[bytes], str]:
    def binary_text(value: bytes) -> str:
        if len(value) != size:
            raise ValueError(f"mac address is {size} bytes")
        return value.hex(":")

    return binary_text


MACADDR = string_codec(_mac_binary_text(6))
MACADDR8 = string_codec(_mac_binary_text(8))

_PGSQL_AF_INET = 2
_PGSQL_AF_INET6 = 3


def _ipv6_text(address: bytes) -> str:
    """PostgreSQL's inet_net_ntop_ipv6 (BIND's algorithm), including its IPv4 tails."""
    words = [w for (w,) in UINT16.iter_unpack(address)]
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for i, word in enumerate(words):
        if word == 0:
            if cur_base == -1:
                cur_base, cur_len = i, 1
            else:
                cur_len += 1
        elif cur_base != -1:
            if best_base == -1 or cur_len > best_len:
                best_base, best_len = cur_base, cur_len
            cur_base = -1
    if cur_base != -1 and (best_base == -1 or cur_len > best_len):
        best_base, best_len = cur_base, cur_len
    if best_base != -1 and best_len < 2:
        best_base = -1
    out: list[str] = []
    for i, word in enumerate(words):
        if best_base != -1 and best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            continue
        if i != 0:
            out.append(":")
        if i == 6 and best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(".".join(str(b) for b in address[12:]))
            break
        out.append(f"{word:x}")
    if best_base != -1 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def _net_binary_text(value: bytes) -> str:
    family, bits, is_cidr, size = value[0], value[1], value[2], value[3]
    address = value[4:]
    if len(address) != size:
        raise ValueError("inet address length mismatch")
    if family == _PGSQL_AF_INET and size == 4:
        text, host_bits = ".".join(str(b) for b in address), 32
    elif family == _PGSQL_AF_INET6 and size == 16:
        text, host_bits = _ipv6_text(address), 128
    else:
        raise ValueError("unknown inet family")
    # inet omits the mask of a host address; cidr always prints it.
    return f"{text}/{bits}" if is_cidr or bits != host_bits else text


INET = string_codec(_net_binary_text)


def _bit_binary_text(value: bytes) -> str:
    nbits = INT32.unpack_from(value)[0]
    data = value[4:]
    if not 0 <= nbits <= len(data) * 8 < nbits + 8:
        raise ValueError("bit length does not match its bytes")
    if not data:
        return ""
    return bin(int.from_bytes(data, "big"))[2:].zfill(len(data) * 8)[:nbits]


BIT = string_codec(_bit_binary_text)


def hex_text(value: bytes) -> str:
    return "\\x" + value.hex()


# A builtin type with no mapping: its binary send format is opaque to us.
UNKNOWN = string_codec(hex_text)


def _user_binary_text(value: bytes) -> str:
    # Enums send their label, text-like extension types (citext) their UTF-8 text:
    # both equal the text format. Anything else (hstore, PostGIS…) is a binary
    # structure that rarely is NUL-free UTF-8; it is kept as hex, and such columns
    # should be replicated with binary=false.
    if b"\x00" not in value:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return hex_text(value)


USER = string_codec(_user_binary_text)
