"""The catalog's Relation shapes (read with the batch's target) are what pgoutput sends.

A table whose columns changed after its last change of a batch is brought to its shape
at the target by a Relation message built from the catalog
(:func:`slotlake.catalog.target_versions`): it must be the message pgoutput itself sends
before the table's next change, or the next batch would see a schema change that did not
happen. Checked on every kind of table the decoder meets.
"""

from __future__ import annotations

import psycopg

from slotlake.ddl import read_catalog
from slotlake.pgoutput import Relation, Type, decode

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE SCHEMA other;
CREATE TABLE pk (id int PRIMARY KEY, v text, n numeric(10,2), vc varchar(7), m mood,
                 ms mood[], d posint, g int GENERATED ALWAYS AS (id * 2) STORED);
CREATE TABLE other.composite (a int, b text, v text, PRIMARY KEY (b, a));
CREATE TABLE by_index (id int NOT NULL, code text NOT NULL, note text);
CREATE UNIQUE INDEX by_index_code ON by_index (code) INCLUDE (id);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_code;
CREATE TABLE full_t (a int, b text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE nothing_t (a int PRIMARY KEY, b text);
ALTER TABLE nothing_t REPLICA IDENTITY NOTHING;
CREATE TABLE no_key (a int, b text);
CREATE TABLE listed (a int PRIMARY KEY, secret text, shown text);
CREATE TABLE dropped (a int PRIMARY KEY, gone text, kept text);
ALTER TABLE dropped DROP COLUMN gone;
ALTER TABLE dropped ADD COLUMN later int DEFAULT 5;
CREATE PUBLICATION pub FOR TABLE pk, other.composite, by_index, full_t, nothing_t, no_key,
    listed (a, shown), dropped;
"""
DML = """
INSERT INTO pk (id, v, n, vc, m, ms, d) VALUES (1, 'x', 1.5, 'v', 'ok', '{sad}', 3);
INSERT INTO other.composite VALUES (1, 'b', 'v');
INSERT INTO by_index VALUES (1, 'c', 'n');
INSERT INTO full_t VALUES (1, 'b');
INSERT INTO nothing_t VALUES (1, 'b');
INSERT INTO no_key VALUES (1, 'b');
INSERT INTO listed VALUES (1, 's', 'v');
INSERT INTO dropped (a, kept) VALUES (1, 'k');
"""


def test_catalog_relations_equal_pgoutputs(pg_dsn: str, slot: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        catalog = read_catalog(c, ["pub"])
        c.execute(DML)
        rows = c.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', 'pub')",
            (slot,),
        ).fetchall()
    messages = [decode(bytes(r[0])) for r in rows]
    sent = {f"{m.namespace}.{m.name}": m for m in messages if isinstance(m, Relation)}
    types = {m.oid: m for m in messages if isinstance(m, Type)}
    assert len(sent) == 8
    assert set(catalog) == set(sent)
    for name, relation in sent.items():
        target = catalog[name].relation
        assert target is not None, name
        assert target.relation == relation, name
        # The Type messages pgoutput sent before it: the enum, its array, the domain (as
        # its base type's name).
        assert {t.oid: t for t in target.types} == {
            c.type_oid: types[c.type_oid] for c in relation.columns if c.type_oid in types
        }, name
    assert {t.name for t in catalog["public.pk"].relation.types} == {"mood", "_mood", "int4"}  # type: ignore[union-attr]
    # What the checks above cover: keys of each kind (an INCLUDE column is not one), a
    # column list, a generated and a dropped column left out.
    keys = {n: [c.name for c in r.columns if c.is_key] for n, r in sent.items()}
    assert keys["other.composite"] == ["a", "b"] and keys["public.by_index"] == ["code"]
    assert keys["public.full_t"] == ["a", "b"] and keys["public.nothing_t"] == []
    assert [c.name for c in sent["public.listed"].columns] == ["a", "shown"]
    assert [c.name for c in sent["public.pk"].columns][-1] == "d"
    assert [c.name for c in sent["public.dropped"].columns] == ["a", "kept", "later"]
    # Every live column is in the catalog's attnums, sent or not (generated, outside the
    # column list), and only those.
    assert catalog["public.pk"].attnums["g"] == 8
    assert set(catalog["public.listed"].attnums) == {"a", "secret", "shown"}
    assert catalog["public.dropped"].attnums == {"a": 1, "kept": 3, "later": 4}
    assert catalog["public.dropped"].missing == {"later": "5"}
    # relnatts counts the dropped column's attnum too: the next ADD gets 5.
    assert catalog["public.dropped"].natts == 4


def test_a_table_in_two_publications_is_read_once(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("CREATE PUBLICATION pub2 FOR TABLE pk, listed (a, shown), no_key")
        c.execute("CREATE PUBLICATION pub3 FOR TABLE full_t")
        one = read_catalog(c, ["pub"])
        both = read_catalog(c, ["pub", "pub2"])
        assert both == one
        assert set(read_catalog(c, ["pub2", "pub3"])) == {
            "public.pk",
            "public.listed",
            "public.no_key",
            "public.full_t",
        }
        assert read_catalog(c, ["pub2"])["public.listed"] == one["public.listed"]
