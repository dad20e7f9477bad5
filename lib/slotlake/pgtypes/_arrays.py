"""Array text syntax (array_in / array_out) and the binary array_send format."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ._codec import INT32, Codec, Fallback
from ._vector import array_binary_kernel, array_text_kernel

Nested = list  # list of str | None | Nested

_TOKEN = re.compile(
    r"""[ \t\n\r\v\f]*(?:
        (?P<open>\{) | (?P<close>\}) | (?P<comma>,)
      | "(?P<quoted>(?:[^"\\]|\\.)*)"
      | (?P<bare>(?:[^"{},\\ \t\n\r\v\f]|\\.)+(?:[ \t\n\r\v\f]+(?:[^"{},\\ \t\n\r\v\f]|\\.)+)*)
    )[ \t\n\r\v\f]*""",
    re.VERBOSE | re.DOTALL,
)
_DIMS = re.compile(r"((?:\[\s*-?\d+\s*(?::\s*-?\d+\s*)?\])+)\s*=\s*")
_DIM = re.compile(r"\[\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
# One dimension, no quoting, no escapes, no whitespace: what most PostgreSQL arrays look like.
_SIMPLE = re.compile(r"\{[^{}\"\\ \t\n\r\v\f]*\}")
# array_out quotes an element that is empty, reads as NULL, or holds any of these.
_NEEDS_QUOTES = re.compile(r'[{}",\\ \t\n\r\v\f]')


def _unescape(text: str) -> str:
    return _ESCAPE.sub(r"\1", text) if "\\" in text else text


def _parse_braces(text: str, pos: int) -> tuple[Nested, int]:
    match = _TOKEN.match(text, pos)
    if match is None or match.lastgroup != "open":
        raise ValueError("array text must start with '{'")
    stack: list[Nested] = [[]]
    pos, prev = match.end(), "open"
    while True:
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"bad array syntax at offset {pos}")
        kind, pos = match.lastgroup, match.end()
        if kind == "open":
            if prev not in ("open", "comma"):
                raise ValueError(f"unexpected '{{' at offset {match.start()}")
            inner: Nested = []
            stack[-1].append(inner)
            stack.append(inner)
        elif kind == "close":
            if prev == "comma":
                raise ValueError(f"unexpected '}}' at offset {match.start()}")
            done = stack.pop()
            if not stack:
                return done, pos
        elif kind == "comma":
            if prev not in ("element", "close"):
                raise ValueError(f"unexpected ',' at offset {match.start()}")
        else:
            if prev not in ("open", "comma"):
                raise ValueError(f"unexpected element at offset {match.start()}")
            if kind == "quoted":
                stack[-1].append(_unescape(match.group("quoted")))
            else:
                bare = match.group("bare")
                # Only an unquoted, unescaped NULL is NULL; "NULL" is the string.
                stack[-1].append(None if bare.upper() == "NULL" else _unescape(bare))
            kind = "element"
        prev = kind


def parse_array_text(text: str) -> tuple[list[tuple[int, int]] | None, Nested]:
    """PostgreSQL array text → (explicit [lower:upper] bounds or None, nested lists).

    Leaves are ``str`` (quotes and escapes removed) or ``None`` for NULL.
    """
    if _SIMPLE.fullmatch(text):
        inner = text[1:-1]
        if not inner:
            return None, []
        items: Nested = inner.split(",")
        if "" in items:
            raise ValueError("empty array element")
        return None, [None if _is_null(item) else item for item in items]
    bounds = None
    pos = 0
    dims = _DIMS.match(text)
    if dims is not None:
        bounds = [
            (int(lo), int(hi)) if hi else (1, int(lo)) for lo, hi in _DIM.findall(dims.group(1))
        ]
        pos = dims.end()
    nested, end = _parse_braces(text, pos)
    if end != len(text):
        raise ValueError(f"junk after array at offset {end}")
    return bounds, nested


def quote_element(text: str | None) -> str:
    if text is None:
        return "NULL"
    if not text or text.upper() == "NULL" or _NEEDS_QUOTES.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def render_array_text(dims: list[tuple[int, int]], elements: list[str | None]) -> str:
    """array_out: dims are (length, lower bound) pairs; elements in row-major order."""
    if not dims or not elements:
        return "{}"
    flat: Iterator[str | None] = iter(elements)

    def level(depth: int) -> str:
        length = dims[depth][0]
        if depth == len(dims) - 1:
            return "{" + ",".join(quote_element(next(flat)) for _ in range(length)) + "}"
        return "{" + ",".join(level(depth + 1) for _ in range(length)) + "}"

    body = level(0)
    if all(lower == 1 for _, lower in dims):
        return body
    return "".join(f"[{lower}:{lower + length - 1}]" for length, lower in dims) + "=" + body


def _read_binary(value: bytes) -> tuple[list[tuple[int, int]], list[bytes | None]]:
    ndim, _has_nulls = INT32.unpack_from(value, 0)[0], INT32.unpack_from(value, 4)[0]
    if not 0 <= ndim <= 6:
        raise ValueError(f"array has {ndim} dimensions")
    dims = [
        (INT32.unpack_from(value, 12 + 8 * i)[0], INT32.unpack_from(value, 16 + 8 * i)[0])
        for i in range(ndim)
    ]
    count = 1 if dims else 0
    for length, _ in dims:
        count *= length
    pos = 12 + 8 * ndim
    elements: list[bytes | None] = []
    append = elements.append
    for _ in range(count):
        length = INT32.unpack_from(value, pos)[0]
        pos += 4
        if length < 0:
            append(None)
        else:
            end = pos + length
            if end > len(value):
                raise ValueError("array element runs past the end")
            append(value[pos:end])
            pos = end
    if pos != len(value):
        raise ValueError("junk after the array elements")
    return dims, elements


def _is_null(item: str) -> bool:
    return item == "NULL" or (len(item) == 4 and item.upper() == "NULL")


def array_codec(element: Codec) -> Codec:
    """``array<element>``; anything but one dimension starting at 1 falls back to text."""
    elem_text: Callable[[str], object] = element.from_text
    elem_binary: Callable[[bytes], object] = element.from_binary
    elem_binary_text = element.binary_text
    may_fall_back = element.may_fall_back
    simple = _SIMPLE.fullmatch

    def from_text(value: str) -> object:
        if simple(value):  # the common case, without the tokenizer
            if len(value) == 2:
                return []
            items: Nested = value[1:-1].split(",")
            if "" in items:
                raise ValueError("empty array element")
            out = [None if _is_null(item) else elem_text(item) for item in items]
        else:
            bounds, items = parse_array_text(value)
            if (bounds is not None and (len(bounds) != 1 or bounds[0][0] != 1)) or any(
                type(item) is list for item in items
            ):
                return Fallback(value)
            out = [None if item is None else elem_text(item) for item in items]
        if may_fall_back and Fallback in map(type, out):
            return Fallback(value)
        return out

    def binary_text(value: bytes) -> str:
        dims, elements = _read_binary(value)
        return render_array_text(
            dims, [None if item is None else elem_binary_text(item) for item in elements]
        )

    def from_binary(value: bytes) -> object:
        dims, elements = _read_binary(value)
        if len(dims) > 1 or (dims and dims[0][1] != 1):
            return Fallback(binary_text(value))
        out = [None if item is None else elem_binary(item) for item in elements]
        if may_fall_back and Fallback in map(type, out):
            return Fallback(binary_text(value))
        return out

    return Codec(
        f"array<{element.spark_ddl}>",
        from_text,
        from_binary,
        binary_text,
        vector_text=None if element.vector_text is None else array_text_kernel(element.vector_text),
        vector_binary=(
            None if element.vector_binary is None else array_binary_kernel(element.vector_binary)
        ),
    )
