"""A table's schemas parsed, and what is derived from them, remembered across batches and
forks.

A table's Spark schemas are shared objects: the same DDL text gives the same object
(:func:`slotlake.ddltypes.parse_struct`), and so does the same schema string of a Delta
log (:func:`slotlake.delta._struct_from_json`); both keep what they parse here
(:func:`parsed`). What is derived
from one (its Arrow schema, its data files' physical schema) is remembered by the text
it was made from.

A batch's small tables run in forked workers (:mod:`slotlake.table_processes`), whose
memory goes with them: what they parsed and derived, the next batch's workers did again
(the derivations 7 % of their time in the spread benchmark, 100 tables; a table's two
DDL texts take ~0.4 ms each to parse, which that benchmark's tables, all of one shape,
hid). A worker hands back what it learned (:func:`learning`), named by text, and the
parent keeps it (:func:`adopt`) for the forks of the next batch.

A schema built otherwise (no text names it) is remembered by its object only, in the
process that made it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Entries a process keeps of each kind: a lake's hundreds of tables have a few each.
MAX_ENTRIES = 8192

Name = tuple[str, str]  # (where the text comes from, the text)
Learned = list[tuple[str, Name, Any]]  # (kind, name, derived value)

# id(schema) → (schema, its name): the schema is kept, so its id is not reused.
_NAMED: dict[int, tuple[Any, Name]] = {}
# kind → name → derived value
_BY_NAME: dict[str, dict[Name, Any]] = {}
# kind → id(schema) → (schema, derived value), for schemas no text names
_BY_OBJECT: dict[str, dict[int, tuple[Any, Any]]] = {}
# Schemas parsed from their text: the kind of the entries a worker hands back for them.
PARSED = "parsed"
# In a forked worker (inside learning()): what it derived, for its parent.
_LEARNED: Learned | None = None


def name(schema: Any, source: str, text: str) -> None:
    """``schema`` is the one ``text`` of ``source`` gives (every time)."""
    if len(_NAMED) >= MAX_ENTRIES:
        _NAMED.clear()
    _NAMED[id(schema)] = (schema, (source, text))


def parsed(source: str, text: str) -> Any | None:
    """The schema parsed from ``text`` of ``source`` (:func:`keep_parsed`), or None."""
    return _BY_NAME.get(PARSED, {}).get((source, text))


def keep_parsed(source: str, text: str, schema: Any) -> None:
    """``schema`` is what ``text`` of ``source`` parses to: named so, and kept (a worker
    hands it back)."""
    name(schema, source, text)
    _learn(PARSED, (source, text), schema)


def _name_of(schema: Any) -> Name | None:
    hit = _NAMED.get(id(schema))
    return hit[1] if hit is not None and hit[0] is schema else None


def get(kind: str, schema: Any) -> Any | None:
    """What was derived of ``kind`` from ``schema`` (None: nothing yet)."""
    key = _name_of(schema)
    if key is not None:
        return _BY_NAME.get(kind, {}).get(key)
    hit = _BY_OBJECT.get(kind, {}).get(id(schema))
    return hit[1] if hit is not None and hit[0] is schema else None


def put(kind: str, schema: Any, value: Any) -> None:
    """Remember ``value``, derived of ``kind`` from ``schema``."""
    key = _name_of(schema)
    if key is None:
        objects = _BY_OBJECT.setdefault(kind, {})
        if len(objects) >= MAX_ENTRIES:
            objects.clear()
        objects[id(schema)] = (schema, value)
        return
    _learn(kind, key, value)


def _learn(kind: str, key: Name, value: Any) -> None:
    """Keep ``value``, and in a worker list it for the parent."""
    _store(kind, key, value)
    if _LEARNED is not None:
        _LEARNED.append((kind, key, value))


def _store(kind: str, key: Name, value: Any) -> None:
    named = _BY_NAME.setdefault(kind, {})
    if len(named) >= MAX_ENTRIES:
        named.clear()
    named[key] = value


@contextmanager
def learning() -> Iterator[Learned]:
    """In a forked worker: collects what is derived inside the block, for the parent to
    :func:`adopt`."""
    global _LEARNED
    learned: Learned = []
    _LEARNED = learned
    try:
        yield learned
    finally:
        _LEARNED = None


def adopt(learned: Learned) -> None:
    """Keep what a worker parsed and derived (:func:`learning`)."""
    for kind, key, value in learned:
        if kind == PARSED:
            if parsed(*key) is not None:
                continue  # the parent's own (another worker's), already named
            name(value, *key)
        _store(kind, key, value)


__all__ = [
    "MAX_ENTRIES",
    "PARSED",
    "adopt",
    "get",
    "keep_parsed",
    "learning",
    "name",
    "parsed",
    "put",
]
