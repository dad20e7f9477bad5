"""slotlake.schema_memo: what is derived from a table's shared schemas is remembered by
the text that made them, handed back by forked workers and adopted by their parent."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pyarrow as pa
import pytest

from slotlake import schema_memo
from slotlake.ddltypes import parse_struct
from slotlake.decode import arrow_schema_for
from slotlake.delta import _struct_from_json
from slotlake.delta_log import physical_schema


@pytest.fixture(autouse=True)
def _empty(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(schema_memo, "_NAMED", {})
    monkeypatch.setattr(schema_memo, "_BY_NAME", {})
    monkeypatch.setattr(schema_memo, "_BY_OBJECT", {})
    yield


def test_a_named_schemas_derivation_is_found_by_its_text() -> None:
    first, again = object(), object()
    schema_memo.name(first, "ddl", "a int")
    schema_memo.put("arrow", first, "A")
    assert schema_memo.get("arrow", first) == "A"
    assert schema_memo.get("physical", first) is None
    # Another object of the same text (a worker's, a cache cleared): the same entry.
    schema_memo.name(again, "ddl", "a int")
    assert schema_memo.get("arrow", again) == "A"
    # The same text from another source is another name.
    other = object()
    schema_memo.name(other, "delta", "a int")
    assert schema_memo.get("arrow", other) is None


def test_an_unnamed_schema_is_remembered_by_its_object_only() -> None:
    one, two = object(), object()
    schema_memo.put("arrow", one, "A")
    assert schema_memo.get("arrow", one) == "A"
    assert schema_memo.get("arrow", two) is None


def test_what_a_worker_learned_is_adopted_by_name() -> None:
    schema = object()
    schema_memo.name(schema, "ddl", "b text")
    with schema_memo.learning() as learned:
        schema_memo.put("arrow", schema, "B")
        schema_memo.put("arrow", object(), "unnamed: not handed back")
    assert learned == [("arrow", ("ddl", "b text"), "B")]
    schema_memo._BY_NAME.clear()
    assert schema_memo.get("arrow", schema) is None
    schema_memo.adopt(learned)
    assert schema_memo.get("arrow", schema) == "B"
    # Outside learning(), nothing is collected.
    schema_memo.put("arrow", schema, "B2")
    assert learned == [("arrow", ("ddl", "b text"), "B")]


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_memo, "MAX_ENTRIES", 3)
    kept = [object() for _ in range(4)]
    for i, o in enumerate(kept):
        schema_memo.name(o, "ddl", str(i))
        schema_memo.put("arrow", o, i)
    assert len(schema_memo._NAMED) <= 3
    assert len(schema_memo._BY_NAME["arrow"]) <= 3
    assert schema_memo.get("arrow", kept[-1]) == 3


def _derive_in_child(ddl: str, text: str) -> schema_memo.Learned:
    # A forked worker: the schemas are the parent's objects, the derivations new here.
    with schema_memo.learning() as learned:
        arrow_schema_for(parse_struct(ddl))
        physical_schema(_struct_from_json(text))
    return learned


def test_a_forked_workers_arrow_and_physical_schemas_reach_the_parent() -> None:
    ddl = "id bigint, `v w` string, s struct<x: int>"
    delta = parse_struct("id bigint, v string")
    text = delta.json()
    # Shared objects, created (and named) in the parent before the fork.
    logical, logged = parse_struct(ddl), _struct_from_json(text)
    schema_memo.name(logical, "ddl", ddl)  # the fixture emptied the names of cached ones
    schema_memo.name(logged, "delta", text)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        learned = pool.apply(_derive_in_child, (ddl, text))
    assert {kind for kind, _, _ in learned} == {"arrow", "physical"}
    assert schema_memo.get("arrow", logical) is None  # derived in the child only
    schema_memo.adopt(learned)
    got = schema_memo.get("arrow", logical)
    assert isinstance(got, pa.Schema) and got.names == ["id", "v w", "s"]
    assert got.field("s").type == pa.struct([pa.field("x", pa.int32())])
    assert schema_memo.get("physical", logged).names == ["id", "v"]
    # The parent's own calls now find them: no conversion of its own.
    assert arrow_schema_for(logical) is got


def _parse_in_child(ddl: str) -> schema_memo.Learned:
    with schema_memo.learning() as learned:
        arrow_schema_for(parse_struct(ddl))
    return learned


def test_a_schema_a_forked_worker_parsed_is_the_parents_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DDL text parsed first in a worker comes back parsed: the parent, and the workers
    it forks next, do not parse it again, and find what was derived from it."""
    from slotlake import ddltypes

    ddl = "k bigint, `odd name` decimal(12,2), m map<string,string>"
    with multiprocessing.get_context("fork").Pool(1) as pool:
        learned = pool.apply(_parse_in_child, (ddl,))
    assert [kind for kind, _, _ in learned] == [schema_memo.PARSED, "arrow"]
    assert schema_memo.parsed("ddl", ddl) is None
    schema_memo.adopt(learned)

    def no_parse(_: str) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(ddltypes, "_Parser", no_parse)
    schema = parse_struct(ddl)
    assert schema is learned[0][2]
    assert schema.fieldNames() == ["k", "odd name", "m"]
    assert arrow_schema_for(schema) == learned[1][2]
    # Adopted again (another worker's copy): the parent keeps the one it has.
    schema_memo.adopt(_pickled(learned))
    assert parse_struct(ddl) is schema


def _pickled(learned: schema_memo.Learned) -> schema_memo.Learned:
    import pickle

    return pickle.loads(pickle.dumps(learned))
