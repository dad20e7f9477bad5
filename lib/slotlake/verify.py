"""Checking a lake's state against its source table (the demo's proof, the tests' oracle).

The source side is read as text (``col::text`` under the same session settings as the
peek) and converted with the same type mapping the sync job uses, so values compare
exactly; values kept as text (Fallback) compare by their text. Rows compare as a
multiset, which is what a table without a unique key is.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from slotlake.lake import read_state
from slotlake.pgtypes import Fallback, resolve_type
from slotlake.source import quote_ident, relation_sql

SESSION_SETTINGS = {
    "DateStyle": "ISO, YMD",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


def _norm(value: Any) -> Any:
    if isinstance(value, Fallback):
        return ("fallback", value.text)
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    return value


@dataclass
class Comparison:
    table: str
    source_rows: int
    lake_rows: int
    only_in_source: list[tuple]
    only_in_lake: list[tuple]

    @property
    def equal(self) -> bool:
        return not self.only_in_source and not self.only_in_lake

    def describe(self, limit: int = 5, width: int = 60) -> str:
        if self.equal:
            return f"{self.table}: {self.source_rows} rows, state equals source"

        def short(rows: list[tuple]) -> str:
            return "; ".join(
                "("
                + ", ".join(r if len(r := repr(v)) <= width else r[:width] + "…" for v in row)
                + ")"
                for row in rows[:limit]
            )

        return (
            f"{self.table}: source {self.source_rows} rows, lake {self.lake_rows} rows; "
            f"only in source: {short(self.only_in_source)}; only in lake: {short(self.only_in_lake)}"
        )


def _type_names(conn: Any) -> dict[int, tuple[str, str]]:
    # What pgoutput's Type messages would say: domains carry their base type's name.
    rows = conn.execute(
        """
        SELECT t.oid, CASE WHEN bn.nspname = 'pg_catalog' THEN '' ELSE bn.nspname END, b.typname
        FROM pg_type t
        JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
        JOIN pg_namespace bn ON bn.oid = b.typnamespace
        WHERE t.oid >= 10000
        """
    ).fetchall()
    return {oid: (ns, name) for oid, ns, name in rows}


def source_counter(
    conn: Any, table: str, columns: list[str] | None = None, where: str | None = None
) -> tuple[list[str], Counter]:
    """Columns and the multiset of normalised rows of ``schema.table`` at the source.

    ``columns`` and ``where`` narrow it to what a publication publishes (a column list,
    a row filter).
    """
    for key, value in SESSION_SETTINGS.items():
        conn.execute(f"SET {key} = '{value}'")
    schema, _, name = table.partition(".")
    cols = conn.execute(
        """
        SELECT a.attname, a.atttypid::int, a.atttypmod, c.relkind::text
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
          AND a.attgenerated = ''
        ORDER BY a.attnum
        """,
        (schema, name),
    ).fetchall()
    relkind = cols[0][3] if cols else None
    if columns is not None:
        cols = [c for c in cols if c[0] in columns]
    names = {oid: tn for oid, tn in _type_names(conn).items()}
    converters = [resolve_type(oid, typmod, names).from_text for _, oid, typmod, _ in cols]
    select = ", ".join(quote_ident(c[0]) for c in cols)
    counter: Counter = Counter()
    # COPY's text format runs each type's output function, exactly as pgoutput's text
    # tuples do (a cast to text would not: bool::text is 'true', the output is 't').
    buf = bytearray()
    filtered = f" WHERE {where}" if where else ""
    # The table's own rows, as pgoutput sends them and the bootstrap copies them.
    query = f"COPY (SELECT {select} FROM {relation_sql(schema, name, relkind)}{filtered}) TO STDOUT"
    with conn.cursor().copy(query) as copy:
        for chunk in copy:
            buf += chunk
    for line in buf.decode("utf-8").split("\n"):
        if not line:
            continue
        fields = [_copy_unescape(f) for f in line.split("\t")]
        counter[
            tuple(
                _norm(None if v is None else conv(v))
                for v, conv in zip(fields, converters, strict=True)
            )
        ] += 1
    return [c[0] for c in cols], counter


_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _copy_unescape(field: str) -> str | None:
    """One field of COPY text format → its text (None for the NULL marker)."""
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        ch = field[i]
        if ch != "\\" or i + 1 == len(field):
            out.append(ch)
            i += 1
            continue
        nxt = field[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            j = i + 1
            while j < min(i + 4, len(field)) and field[j] in "01234567":
                j += 1
            out.append(chr(int(field[i + 1 : j], 8)))
            i = j
        else:
            out.append(nxt)
            i += 2
    return "".join(out)


def lake_counter(root: str, table: str, columns: list[str]) -> Counter:
    state = read_state(root, table).to_pylist()
    counter: Counter = Counter()
    for row in state:
        fallback = dict(row.get("_fallback") or ())
        counter[
            tuple(
                ("fallback", fallback[c]) if c in fallback else _norm(row.get(c)) for c in columns
            )
        ] += 1
    return counter


def compare_table(
    conn: Any, root: str, table: str, columns: list[str] | None = None, where: str | None = None
) -> Comparison:
    columns, src = source_counter(conn, table, columns, where)
    lake = lake_counter(root, table, columns)
    return Comparison(
        table=table,
        source_rows=sum(src.values()),
        lake_rows=sum(lake.values()),
        only_in_source=sorted((src - lake).elements(), key=repr),
        only_in_lake=sorted((lake - src).elements(), key=repr),
    )
