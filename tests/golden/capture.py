"""Capture golden pgoutput vectors from real PostgreSQL servers.

Run ``python tests/golden/capture.py`` to regenerate ``tests/golden/pg{15,16}/*.jsonl``
and ``tests/golden/manifest.json``. The module is also imported by the live tests, which
run the same scenarios against the ``pg_dsn`` fixture and decode the output on the spot.

File format (JSON lines): the first line is the scenario header — pg version, the exact
pgoutput options, notes, and ``expected``: facts written down from the workload itself
(hand-written canonical values, or values the server computed with its own output/send
functions), never from the decoder, so a test compares the decoder against what happened.
Every further line is one row of ``pg_logical_slot_peek_binary_changes``: ``call`` (which
peek of the scenario), ``lsn`` (X/Y), ``xid``, ``in_stream`` (derived from S/E: the payload
sits between Stream Start and Stream Stop, so R/Y/I/U/D/T/M carry a leading xid) and
``hex`` (the payload).

Expected value conventions (one per TupleData column kind): a ``str`` is a text value ('t'),
``null`` is NULL ('n'), ``{"unchanged_toast": true}`` is 'u', ``{"binary": "<hex>"}`` is 'b'.
A 'K' old tuple lists every column, the non-key ones as ``null``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

GOLDEN_DIR = Path(__file__).resolve().parent
VERSIONS = (15, 16)
PUBLICATION = "gold_pub"
UNCHANGED = {"unchanged_toast": True}

log = logging.getLogger("golden.capture")

Json = dict[str, Any]


# --------------------------------------------------------------------------------------
# Running a scenario
# --------------------------------------------------------------------------------------


@dataclass
class PeekRow:
    call: int
    lsn: str
    xid: int
    in_stream: bool
    payload: bytes

    def to_json(self) -> Json:
        return {
            "call": self.call,
            "lsn": self.lsn,
            "xid": self.xid,
            "in_stream": self.in_stream,
            "hex": self.payload.hex(),
        }


@dataclass
class Capture:
    scenario: str
    pg_version: int
    server_version: str
    options: dict[str, str]
    two_phase_slot: bool
    work_mem: str | None
    notes: list[str]
    expected: Json
    rows: list[PeekRow]

    def header(self) -> Json:
        return {
            "scenario": self.scenario,
            "pg_version": self.pg_version,
            "server_version": self.server_version,
            "options": self.options,
            "two_phase_slot": self.two_phase_slot,
            "logical_decoding_work_mem": self.work_mem,
            "notes": self.notes,
            "expected": self.expected,
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as fh:
            fh.write(json.dumps(self.header(), ensure_ascii=False, sort_keys=True) + "\n")
            for row in self.rows:
                fh.write(json.dumps(row.to_json(), sort_keys=True) + "\n")


def load(path: Path) -> tuple[Json, list[PeekRow]]:
    """Read a stored scenario back: (header, rows)."""
    with path.open() as fh:
        header = json.loads(fh.readline())
        rows = [
            PeekRow(r["call"], r["lsn"], r["xid"], r["in_stream"], bytes.fromhex(r["hex"]))
            for r in map(json.loads, fh)
        ]
    return header, rows


def stored_files(version: int | None = None) -> list[Path]:
    versions = VERSIONS if version is None else (version,)
    return sorted(p for v in versions for p in (GOLDEN_DIR / f"pg{v}").glob("*.jsonl"))


class Ctx:
    """What a workload sees: SQL sessions, the slot, and peek/advance."""

    def __init__(self, dsn: str, version: int, scenario: Scenario) -> None:
        self.dsn = dsn
        self.version = version
        self.scenario = scenario
        self.options = scenario.options_for(version)
        self.conn = self._connect()
        self.dbname: str = self.conn.execute("SELECT current_database()").fetchone()[0]
        # Slot names are cluster-wide: derive them from the (per-scenario) database name.
        self.slot = f"g_{self.dbname}"[:63]
        self.rows: list[PeekRow] = []
        self.calls = 0
        self.notes: list[str] = list(scenario.notes)
        self.changes: list[Json] = []
        self.cleanups: list[str] = []

    # -- SQL --------------------------------------------------------------------------------
    def sql(self, *statements: str, conn: psycopg.Connection[Any] | None = None) -> None:
        for stmt in statements:
            (conn or self.conn).execute(stmt)  # type: ignore[arg-type]

    def one(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(query, params).fetchone()[0]  # type: ignore[index, arg-type]

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, autocommit=True)
        # The throwaway clusters run synchronous_commit=off, and a peek only decodes WAL
        # that is flushed: without this a commit can be missing from the next peek.
        conn.execute("SET synchronous_commit = on")
        return conn

    @contextmanager
    def session(self) -> Iterator[psycopg.Connection[Any]]:
        with self._connect() as conn:
            yield conn

    def send_hex(self, literal: str, type_name: str) -> str:
        """The server's own binary send() output for a literal: the 'b' value to expect."""
        send = self.one(
            "SELECT typsend::regproc::text FROM pg_type WHERE oid = %s::regtype", (type_name,)
        )
        return self.one(f"SELECT encode({send}(({literal})::{type_name}), 'hex')")  # type: ignore[no-any-return]

    # -- facts ------------------------------------------------------------------------------
    def relation(self, table: str, keys: list[str], namespace: str = "public") -> Json:
        """The relation as the catalog has it *now* (call right after DDL), keys written by hand."""
        oid, ident = self.conn.execute(
            "SELECT c.oid::int8, c.relreplident::text FROM pg_class c WHERE c.oid = %s::regclass",
            (f"{namespace}.{table}",),
        ).fetchone()  # type: ignore[misc]
        cols = self.conn.execute(
            "SELECT attname::text, atttypid::int8, atttypmod FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated = '' "
            "ORDER BY attnum",
            (oid,),
        ).fetchall()
        return {
            "oid": oid,
            "namespace": namespace,
            "name": table,
            "replica_identity": ident,
            "columns": [[n, n in keys, t, m] for n, t, m in cols],
        }

    def type_oid(self, name: str) -> int:
        return int(self.one("SELECT %s::regtype::oid::int8", (name,)))

    def expect(self, **change: Any) -> None:
        self.changes.append(change)

    # -- slot -------------------------------------------------------------------------------
    def create_slot(self) -> None:
        self.conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
            (self.slot, self.scenario.two_phase_slot),
        )

    def peek(self) -> list[PeekRow]:
        flat: list[str] = []
        for k, v in self.options.items():
            flat += [k, v]
        with self.session() as conn:
            # A peek decodes only flushed WAL, and rollbacks or non-transactional messages
            # do not flush. A synchronous commit that wrote WAL flushes everything before
            # it (a bare txid_current() writes none); a temp table's catalog rows decode
            # to nothing.
            conn.execute("CREATE TEMP TABLE gold_flush ()")
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO, MDY'")
            if self.scenario.work_mem:
                conn.execute(f"SET logical_decoding_work_mem = '{self.scenario.work_mem}'")
            raw = conn.execute(
                "SELECT lsn::text, xid::text::int8, data "
                "FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, VARIADIC %s::text[])",
                (self.slot, flat),
            ).fetchall()
        rows: list[PeekRow] = []
        in_stream = False
        for lsn, xid, data in raw:
            payload = bytes(data)
            tag = payload[:1]
            if tag == b"S":
                rows.append(PeekRow(self.calls, lsn, xid, False, payload))
                in_stream = True
            elif tag == b"E":
                in_stream = False
                rows.append(PeekRow(self.calls, lsn, xid, False, payload))
            else:
                rows.append(PeekRow(self.calls, lsn, xid, in_stream, payload))
        self.calls += 1
        self.rows += rows
        return rows

    def advance(self, lsn: str) -> None:
        """Confirm everything up to lsn, as a batch run does after its commit record."""
        self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn))

    def close(self) -> None:
        for stmt in self.cleanups:
            try:
                self.conn.execute(stmt)
            except psycopg.Error as exc:  # cleanup is best effort, the capture already happened
                log.warning("cleanup %r failed: %s", stmt, exc)
        with suppress(psycopg.Error):
            self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.conn.close()


@dataclass
class Scenario:
    name: str
    description: str
    setup: Callable[[Ctx], None]
    workload: Callable[[Ctx], Json]
    options: dict[str, str] = field(default_factory=dict)
    min_version: int = 15
    two_phase_slot: bool = False
    work_mem: str | None = None
    # Peek once more after the workload (a workload may also peek/advance itself).
    final_peek: bool = True
    # Version-specific option overrides, e.g. PG16-only pgoutput options.
    options_by_version: dict[int, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def options_for(self, version: int) -> dict[str, str]:
        opts = {"proto_version": "1", "publication_names": PUBLICATION}
        opts.update(self.options)
        opts.update(self.options_by_version.get(version, {}))
        return opts

    def supported(self, version: int) -> bool:
        return version >= self.min_version


def run_scenario(dsn: str, version: int, scenario: Scenario) -> Capture:
    """Set up, create the slot, run the workload, peek. dsn must be a fresh database."""
    ctx = Ctx(dsn, version, scenario)
    try:
        server_version = ctx.one("SHOW server_version")
        scenario.setup(ctx)
        # The publication must exist before the slot's start point.
        ctx.create_slot()
        expected = scenario.workload(ctx)
        if scenario.final_peek:
            ctx.peek()
        expected.setdefault("changes", ctx.changes)
        return Capture(
            scenario=scenario.name,
            pg_version=version,
            server_version=server_version,
            options=ctx.options,
            two_phase_slot=scenario.two_phase_slot,
            work_mem=scenario.work_mem,
            notes=ctx.notes,
            expected=expected,
            rows=ctx.rows,
        )
    finally:
        ctx.close()


# --------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------

PEOPLE_DDL = """
CREATE TABLE people (
    id int8 PRIMARY KEY,
    name text,
    score numeric(12,2),
    born date,
    active bool,
    note varchar(20),
    tags text[],
    seen timestamptz,
    ratio float8,
    payload bytea,
    doc jsonb,
    uid uuid
)
"""

# Each column: (SQL literal, the server's canonical text output with TimeZone=UTC, ISO dates).
PEOPLE_ROWS: dict[int, list[tuple[str, str | None]]] = {
    1: [
        ("1", "1"),
        ("'Ada'", "Ada"),
        ("12.5", "12.50"),
        ("'1815-12-10'", "1815-12-10"),
        ("true", "t"),
        ("'first'", "first"),
        ("'{a,b}'", "{a,b}"),
        ("'2024-01-02 03:04:05.123456+00'", "2024-01-02 03:04:05.123456+00"),
        ("0.5", "0.5"),
        ("'\\x00ff'", "\\x00ff"),
        ("'{\"k\": [1, 2]}'", '{"k": [1, 2]}'),
        ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ],
    2: [
        ("2", "2"),
        ("'Zoë 😀 \"q\", back\\slash, tab\t'", 'Zoë 😀 "q", back\\slash, tab\t'),
        ("'NaN'", "NaN"),
        ("'infinity'", "infinity"),
        ("false", "f"),
        ("NULL", None),
        ("'{\"x y\",NULL}'", '{"x y",NULL}'),
        ("'1999-12-31 23:59:59+05'", "1999-12-31 18:59:59+00"),
        ("'-Infinity'", "-Infinity"),
        ("''", "\\x"),
        ("'[]'", "[]"),
        ("NULL", None),
    ],
    3: [("3", "3")] + [("NULL", None)] * 11,
}


def _people_values(
    ctx: Ctx, rid: int, binary: bool, overrides: dict[int, tuple[str, str]] | None = None
) -> list[Any]:
    """Expected TupleData of a people row, as text or as the server's send() bytes."""
    cols = list(PEOPLE_ROWS[rid])
    for idx, lit in (overrides or {}).items():
        cols[idx] = lit
    types = [
        "int8",
        "text",
        "numeric(12,2)",
        "date",
        "bool",
        "varchar(20)",
        "text[]",
        "timestamptz",
        "float8",
        "bytea",
        "jsonb",
        "uuid",
    ]
    out: list[Any] = []
    for (lit, text), typ in zip(cols, types, strict=True):
        if text is None:
            out.append(None)
        elif binary:
            out.append({"binary": ctx.send_hex(lit, typ)})
        else:
            out.append(text)
    return out


def _people_literal(rid: int) -> str:
    return "(" + ", ".join(lit for lit, _ in PEOPLE_ROWS[rid]) + ")"


def setup_people(ctx: Ctx) -> None:
    ctx.sql(PEOPLE_DDL, f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")


def workload_people(ctx: Ctx) -> Json:
    """Insert/update/delete over many types, NULLs and Unicode; a rollback; a prepared xact."""
    binary = ctx.options.get("binary") == "true"
    rel = ctx.relation("people", keys=["id"])
    ctx.sql(f"INSERT INTO people VALUES {_people_literal(1)}")
    ctx.expect(op="I", table="people", new=_people_values(ctx, 1, binary))
    # Two rows in one transaction, one statement.
    ctx.sql(f"INSERT INTO people VALUES {_people_literal(2)}, {_people_literal(3)}")
    ctx.expect(op="I", table="people", new=_people_values(ctx, 2, binary))
    ctx.expect(op="I", table="people", new=_people_values(ctx, 3, binary))
    # A non-key update under REPLICA IDENTITY DEFAULT: no old tuple at all.
    ctx.sql("UPDATE people SET name = 'Ada L.', score = 13 WHERE id = 1")
    ctx.expect(
        op="U",
        table="people",
        old_kind=None,
        old=None,
        new=_people_values(ctx, 1, binary, {1: ("'Ada L.'", "Ada L."), 2: ("13", "13.00")}),
    )
    # The key changes: 'K' with the old key, every other column 'n'.
    ctx.sql("UPDATE people SET id = 10 WHERE id = 2")
    old_key = _people_values(ctx, 2, binary)[:1] + [None] * 11
    ctx.expect(
        op="U",
        table="people",
        old_kind="K",
        old=old_key,
        new=_people_values(ctx, 2, binary, {0: ("10", "10")}),
    )
    ctx.sql("DELETE FROM people WHERE id = 3")
    ctx.expect(op="D", table="people", old_kind="K", old=_people_values(ctx, 3, binary))
    # Rolled back: never decoded.
    ctx.sql("BEGIN", "INSERT INTO people (id) VALUES (99)", "ROLLBACK")
    # Prepared without a two-phase slot: an ordinary B…C at COMMIT PREPARED.
    ctx.sql("BEGIN", "INSERT INTO people (id, name) VALUES (4, 'prepared')")
    ctx.sql("PREPARE TRANSACTION 'gold_basic_gid'", "COMMIT PREPARED 'gold_basic_gid'")
    four: list[Any] = (
        [{"binary": ctx.send_hex("4", "int8")}, {"binary": ctx.send_hex("'prepared'", "text")}]
        if binary
        else ["4", "prepared"]
    )
    ctx.expect(op="I", table="people", new=[*four] + [None] * 10)
    return {
        "relations": [rel],
        "transactions": 6,
        "prepared_gids": [],
    }


# -- messages -----------------------------------------------------------------------------


def setup_messages(ctx: Ctx) -> None:
    ctx.sql("CREATE TABLE note (id int PRIMARY KEY, body text)")
    ctx.sql(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")


def workload_messages(ctx: Ctx) -> Json:
    rel = ctx.relation("note", keys=["id"])
    ctx.sql("BEGIN")
    ctx.sql("SELECT pg_logical_emit_message(true, 'app/tx', 'inside a transaction')")
    ctx.sql("INSERT INTO note VALUES (1, 'one')")
    ctx.sql("COMMIT")
    ctx.expect(
        op="M", transactional=True, prefix="app/tx", content_hex=b"inside a transaction".hex()
    )
    ctx.expect(op="I", table="note", new=["1", "one"])
    ctx.sql("SELECT pg_logical_emit_message(false, 'app/nontx', '\\x00ff10c3'::bytea)")
    ctx.expect(op="M", transactional=False, prefix="app/nontx", content_hex="00ff10c3")
    # A transactional message alone in its transaction.
    ctx.sql("SELECT pg_logical_emit_message(true, 'préfixe', 'é')")
    ctx.expect(op="M", transactional=True, prefix="préfixe", content_hex="é".encode().hex())
    # Rolled back: the transactional message vanishes, the non-transactional one stays.
    ctx.sql("BEGIN")
    ctx.sql("SELECT pg_logical_emit_message(true, 'app/lost', 'never seen')")
    ctx.sql("SELECT pg_logical_emit_message(false, 'app/kept', '')")
    ctx.sql("ROLLBACK")
    ctx.expect(op="M", transactional=False, prefix="app/kept", content_hex="")
    return {"relations": [rel]}


# -- streaming ------------------------------------------------------------------------------


def setup_stream(ctx: Ctx) -> None:
    ctx.sql(
        "CREATE TYPE mood AS ENUM ('sad', 'happy')",
        "CREATE TABLE big (id int4 PRIMARY KEY, v text, m mood)",
        "CREATE TABLE small (id int4 PRIMARY KEY)",
        f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
    )


def _insert_range(ctx: Ctx, lo: int, hi: int, expect: bool = True) -> None:
    ctx.sql(f"INSERT INTO big SELECT i, 'r' || i, 'happy' FROM generate_series({lo}, {hi}) i")
    if expect:
        ctx.expect(op="I*", table="big", lo=lo, hi=hi, new=["{i}", "r{i}", "happy"])


def workload_stream(ctx: Ctx) -> Json:
    """Big transactions under logical_decoding_work_mem=64kB, so they are streamed."""
    rels = [ctx.relation("big", keys=["id"]), ctx.relation("small", keys=["id"])]
    # A: streamed and committed; R, Y, M, I, U, D, T all inside the stream (with xid).
    ctx.sql("BEGIN")
    ctx.sql("SELECT pg_logical_emit_message(true, 'stream', 'in-stream')")
    ctx.expect(op="M", transactional=True, prefix="stream", content_hex=b"in-stream".hex())
    _insert_range(ctx, 1, 1000)
    ctx.sql("UPDATE big SET v = 'u' || id WHERE id <= 3")
    for i in (1, 2, 3):
        ctx.expect(op="U", table="big", old_kind=None, old=None, new=[str(i), f"u{i}", "happy"])
    ctx.sql("DELETE FROM big WHERE id IN (4, 5)")
    for i in (4, 5):
        ctx.expect(op="D", table="big", old_kind="K", old=[str(i), None, None])
    ctx.sql("INSERT INTO small VALUES (1)")
    ctx.expect(op="I", table="small", new=["1"])
    ctx.sql("TRUNCATE small")
    ctx.expect(op="T", tables=["small"], cascade=False, restart_identity=False)
    ctx.sql("COMMIT")
    # B: a streamed subtransaction rolled back to its savepoint → Stream Abort(xid, subxid).
    ctx.sql("BEGIN")
    _insert_range(ctx, 1001, 1300)
    ctx.sql("SAVEPOINT s1")
    _insert_range(ctx, 1301, 1900, expect=False)
    ctx.sql("ROLLBACK TO SAVEPOINT s1")
    _insert_range(ctx, 1901, 1910)
    ctx.sql("COMMIT")
    # C: a whole streamed transaction aborted → Stream Abort with xid == subxid.
    ctx.sql("BEGIN")
    _insert_range(ctx, 5001, 5700, expect=False)
    ctx.sql("ROLLBACK")
    # D: small, not streamed.
    ctx.sql("INSERT INTO big VALUES (6000, 'small', 'sad')")
    ctx.expect(op="I", table="big", new=["6000", "small", "sad"])
    return {
        "relations": rels,
        "types": [{"oid": ctx.type_oid("mood"), "namespace": "public", "name": "mood"}],
        "stream_aborts": {"subtransaction": 1, "toplevel": 1},
    }


# -- two-phase -----------------------------------------------------------------------------


def workload_two_phase(ctx: Ctx) -> Json:
    """PREPARE in one peek, COMMIT/ROLLBACK PREPARED in the next (slot advanced between)."""
    rels = [ctx.relation("big", keys=["id"])]
    with ctx.session() as s:
        ctx.sql("BEGIN", "INSERT INTO big VALUES (1, 'g1', 'happy')", conn=s)
        ctx.sql("PREPARE TRANSACTION 'gold_g1'", conn=s)
        ctx.sql("BEGIN", "INSERT INTO big VALUES (2, 'g2', 'sad')", conn=s)
        ctx.sql("PREPARE TRANSACTION 'gold g2 ü'", conn=s)
        # Big enough to be streamed: Stream Prepare ('p').
        ctx.sql("BEGIN", conn=s)
        s.execute("INSERT INTO big SELECT i, 'r' || i, 'happy' FROM generate_series(101, 1100) i")
        ctx.sql("PREPARE TRANSACTION 'gold_g3_stream'", conn=s)
        ctx.sql("BEGIN", conn=s)
        s.execute("INSERT INTO big SELECT i, 'r' || i, 'happy' FROM generate_series(2001, 2800) i")
        ctx.sql("PREPARE TRANSACTION 'gold_g4_stream'", conn=s)
    ctx.cleanups += [
        f"ROLLBACK PREPARED '{g}'"
        for g in ("gold_g1", "gold g2 ü", "gold_g3_stream", "gold_g4_stream")
    ]
    first = ctx.peek()
    ctx.advance(first[-1].lsn)
    ctx.sql("COMMIT PREPARED 'gold_g1'", "ROLLBACK PREPARED 'gold g2 ü'")
    ctx.sql("COMMIT PREPARED 'gold_g3_stream'", "ROLLBACK PREPARED 'gold_g4_stream'")
    ctx.cleanups.clear()
    ctx.expect(op="I", table="big", new=["1", "g1", "happy"])
    ctx.expect(op="I*", table="big", lo=101, hi=1100, new=["{i}", "r{i}", "happy"])
    return {
        "relations": rels,
        "types": [{"oid": ctx.type_oid("mood"), "namespace": "public", "name": "mood"}],
        "prepared": [
            {"gid": "gold_g1", "streamed": False, "outcome": "commit"},
            {"gid": "gold g2 ü", "streamed": False, "outcome": "rollback"},
            {"gid": "gold_g3_stream", "streamed": True, "outcome": "commit"},
            {"gid": "gold_g4_stream", "streamed": True, "outcome": "rollback"},
        ],
        "calls": 2,
    }


# -- origin ---------------------------------------------------------------------------------


def setup_origin(ctx: Ctx) -> None:
    ctx.sql("CREATE TABLE replicated (id int PRIMARY KEY, src text)")
    ctx.sql(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")


def workload_origin(ctx: Ctx) -> Json:
    rel = ctx.relation("replicated", keys=["id"])
    # Origins are cluster-wide: reuse-proof name for the live tests.
    name = "origin_a"
    n = 0
    while ctx.one("SELECT pg_replication_origin_oid(%s) IS NOT NULL", (name,)):
        n += 1
        name = f"origin_a_{n}"
    ctx.sql(f"SELECT pg_replication_origin_create('{name}')")
    ctx.cleanups.append(f"SELECT pg_replication_origin_drop('{name}')")
    with ctx.session() as s:
        ctx.sql(f"SELECT pg_replication_origin_session_setup('{name}')", conn=s)
        ctx.sql("BEGIN", conn=s)
        ctx.sql("SELECT pg_replication_origin_xact_setup('0/1234', now())", conn=s)
        ctx.sql("INSERT INTO replicated VALUES (1, 'from origin')", conn=s)
        ctx.sql("COMMIT", conn=s)
        ctx.sql("SELECT pg_replication_origin_session_reset()", conn=s)
    ctx.expect(op="I", table="replicated", new=["1", "from origin"])
    ctx.sql("INSERT INTO replicated VALUES (2, 'local')")
    ctx.expect(op="I", table="replicated", new=["2", "local"])
    return {
        "relations": [rel],
        "origins": [{"name": name, "commit_lsn": "0/1234"}],
        # The origin transaction comes first; the local one has no Origin message.
        "transactions_with_origin": [True, False],
    }


# -- truncate -------------------------------------------------------------------------------


def setup_truncate(ctx: Ctx) -> None:
    ctx.sql(
        "CREATE TABLE parent (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)",
        "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent(id))",
        "CREATE TABLE other (id serial PRIMARY KEY, v text)",
        f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
    )


def workload_truncate(ctx: Ctx) -> Json:
    rels = [ctx.relation(t, keys=["id"]) for t in ("parent", "child", "other")]

    def fill() -> None:
        ctx.sql("INSERT INTO parent (v) VALUES ('p')")
        pid = ctx.one("SELECT max(id) FROM parent")
        ctx.sql(f"INSERT INTO child VALUES ({pid}, {pid})")
        ctx.sql("INSERT INTO other (v) VALUES ('o')")
        ctx.expect(op="I", table="parent", new=[str(pid), "p"])
        ctx.expect(op="I", table="child", new=[str(pid), str(pid)])
        oid = ctx.one("SELECT max(id) FROM other")
        ctx.expect(op="I", table="other", new=[str(oid), "o"])

    fill()
    ctx.sql("TRUNCATE other")
    ctx.expect(op="T", tables=["other"], cascade=False, restart_identity=False)
    ctx.sql("TRUNCATE parent CASCADE")
    ctx.expect(op="T", tables=["child", "parent"], cascade=True, restart_identity=False)
    fill()
    ctx.sql("TRUNCATE other RESTART IDENTITY")
    ctx.expect(op="T", tables=["other"], cascade=False, restart_identity=True)
    fill()
    ctx.sql("TRUNCATE parent, other RESTART IDENTITY CASCADE")
    ctx.expect(op="T", tables=["child", "other", "parent"], cascade=True, restart_identity=True)
    return {"relations": rels}


# -- replica identity ---------------------------------------------------------------------


def setup_identity(ctx: Ctx) -> None:
    ctx.sql(
        "CREATE TABLE ri_default (id int PRIMARY KEY, v text)",
        "CREATE TABLE ri_full (a int, b text)",
        "ALTER TABLE ri_full REPLICA IDENTITY FULL",
        "CREATE TABLE ri_index (id int, code text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri_index_code ON ri_index (code)",
        "ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_code",
        "CREATE TABLE ri_multi (k1 int, k2 text, v text, PRIMARY KEY (k1, k2))",
        f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
    )


def workload_identity(ctx: Ctx) -> Json:
    rels = [
        ctx.relation("ri_default", keys=["id"]),
        ctx.relation("ri_full", keys=["a", "b"]),  # FULL: every column is flagged key
        ctx.relation("ri_index", keys=["code"]),
        ctx.relation("ri_multi", keys=["k1", "k2"]),
    ]
    e = ctx.expect
    ctx.sql("INSERT INTO ri_default VALUES (1, 'a')")
    e(op="I", table="ri_default", new=["1", "a"])
    ctx.sql("UPDATE ri_default SET v = 'b' WHERE id = 1")
    e(op="U", table="ri_default", old_kind=None, old=None, new=["1", "b"])
    ctx.sql("UPDATE ri_default SET id = 2 WHERE id = 1")
    e(op="U", table="ri_default", old_kind="K", old=["1", None], new=["2", "b"])
    ctx.sql("DELETE FROM ri_default WHERE id = 2")
    e(op="D", table="ri_default", old_kind="K", old=["2", None])

    ctx.sql("INSERT INTO ri_full VALUES (1, 'x'), (1, 'x')")
    e(op="I", table="ri_full", new=["1", "x"])
    e(op="I", table="ri_full", new=["1", "x"])
    ctx.sql("UPDATE ri_full SET b = NULL WHERE ctid = (SELECT min(ctid) FROM ri_full)")
    e(op="U", table="ri_full", old_kind="O", old=["1", "x"], new=["1", None])
    ctx.sql("DELETE FROM ri_full WHERE b IS NULL")
    e(op="D", table="ri_full", old_kind="O", old=["1", None])

    ctx.sql("INSERT INTO ri_index VALUES (1, 'c1', 'v')")
    e(op="I", table="ri_index", new=["1", "c1", "v"])
    ctx.sql("UPDATE ri_index SET v = 'w', id = 5 WHERE code = 'c1'")
    e(op="U", table="ri_index", old_kind=None, old=None, new=["5", "c1", "w"])
    ctx.sql("UPDATE ri_index SET code = 'c2' WHERE code = 'c1'")
    e(op="U", table="ri_index", old_kind="K", old=[None, "c1", None], new=["5", "c2", "w"])
    ctx.sql("DELETE FROM ri_index")
    e(op="D", table="ri_index", old_kind="K", old=[None, "c2", None])

    ctx.sql("INSERT INTO ri_multi VALUES (1, 'k', 'v')")
    e(op="I", table="ri_multi", new=["1", "k", "v"])
    ctx.sql("UPDATE ri_multi SET k2 = 'k2'")
    e(op="U", table="ri_multi", old_kind="K", old=["1", "k", None], new=["1", "k2", "v"])
    ctx.sql("DELETE FROM ri_multi")
    e(op="D", table="ri_multi", old_kind="K", old=["1", "k2", None])
    return {"relations": rels}


# -- TOAST ----------------------------------------------------------------------------------

# ~9.6 kB of hex digits from md5: incompressible enough, and STORAGE EXTERNAL never compresses.
BIG_SQL = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i)"


def _big_value(ctx: Ctx, salt: str = "") -> str:
    return str(ctx.one(f"SELECT {salt!r} || {BIG_SQL}"))


def setup_toast(ctx: Ctx) -> None:
    ctx.sql(
        "CREATE TABLE doc (id int PRIMARY KEY, n int, body text)",
        "ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL",
        "CREATE TABLE doc_full (id int, n int, body text)",
        "ALTER TABLE doc_full ALTER COLUMN body SET STORAGE EXTERNAL",
        "ALTER TABLE doc_full REPLICA IDENTITY FULL",
        f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
    )


def workload_toast(ctx: Ctx) -> Json:
    rels = [ctx.relation("doc", keys=["id"]), ctx.relation("doc_full", keys=["id", "n", "body"])]
    big, big2 = _big_value(ctx), _big_value(ctx, "x")
    e = ctx.expect
    ctx.sql(f"INSERT INTO doc VALUES (1, 0, '' || {BIG_SQL})")
    e(op="I", table="doc", new=["1", "0", big])
    # Another column changes: the out-of-line value is not sent ('u').
    ctx.sql("UPDATE doc SET n = 1 WHERE id = 1")
    e(op="U", table="doc", old_kind=None, old=None, new=["1", "1", UNCHANGED])
    ctx.sql(f"UPDATE doc SET body = 'x' || {BIG_SQL} WHERE id = 1")
    e(op="U", table="doc", old_kind=None, old=None, new=["1", "1", big2])
    ctx.sql("UPDATE doc SET n = 2, body = 'short' WHERE id = 1")
    e(op="U", table="doc", old_kind=None, old=None, new=["1", "2", "short"])
    ctx.sql("DELETE FROM doc")
    e(op="D", table="doc", old_kind="K", old=["1", None, None])
    # FULL: the old tuple is complete (never 'u'), the new one still says 'u'.
    ctx.sql(f"INSERT INTO doc_full VALUES (1, 0, '' || {BIG_SQL})")
    e(op="I", table="doc_full", new=["1", "0", big])
    ctx.sql("UPDATE doc_full SET n = 1")
    e(op="U", table="doc_full", old_kind="O", old=["1", "0", big], new=["1", "1", UNCHANGED])
    return {"relations": rels}


# -- types ----------------------------------------------------------------------------------


def setup_types(ctx: Ctx) -> None:
    ctx.sql(
        "CREATE SCHEMA app",
        "CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE DOMAIN app.posint AS int4 CHECK (VALUE > 0)",
        "CREATE DOMAIN app.email AS text",
        "CREATE TABLE app.typed (id int PRIMARY KEY, m app.mood, p app.posint, e app.email, "
        "ms app.mood[], iv interval, ip inet, nums int4[])",
        f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
    )


def workload_types(ctx: Ctx) -> Json:
    rel = ctx.relation("typed", keys=["id"], namespace="app")
    ctx.sql(
        "INSERT INTO app.typed VALUES (1, 'happy', 7, 'a@b.c', '{sad,ok}', "
        "'1 day 02:03:04', '10.0.0.1/8', '{1,NULL,3}')"
    )
    ctx.expect(
        op="I",
        table="typed",
        new=["1", "happy", "7", "a@b.c", "{sad,ok}", "1 day 02:03:04", "10.0.0.1/8", "{1,NULL,3}"],
    )
    # Type messages: enums keep their own name; domains carry their base type's name
    # (pg_catalog → empty namespace) under the domain's own OID.
    types = [
        {"oid": ctx.type_oid("app.mood"), "namespace": "app", "name": "mood"},
        {"oid": ctx.type_oid("app.posint"), "namespace": "", "name": "int4"},
        {"oid": ctx.type_oid("app.email"), "namespace": "", "name": "text"},
        {"oid": ctx.type_oid("app.mood[]"), "namespace": "app", "name": "_mood"},
    ]
    return {"relations": [rel], "types": types}


# -- ALTER TABLE mid-stream -----------------------------------------------------------------


def setup_alter(ctx: Ctx) -> None:
    ctx.sql("CREATE TABLE evolving (id int PRIMARY KEY, a text)")
    ctx.sql(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")


def workload_alter(ctx: Ctx) -> Json:
    rels = [ctx.relation("evolving", keys=["id"])]
    ctx.sql("INSERT INTO evolving VALUES (1, 'a1')")
    ctx.expect(op="I", table="evolving", new=["1", "a1"])
    ctx.sql("ALTER TABLE evolving ADD COLUMN b int DEFAULT 7")
    rels.append(ctx.relation("evolving", keys=["id"]))
    ctx.sql("INSERT INTO evolving VALUES (2, 'a2', 8)")
    ctx.expect(op="I", table="evolving", new=["2", "a2", "8"])
    ctx.sql("ALTER TABLE evolving DROP COLUMN a")
    rels.append(ctx.relation("evolving", keys=["id"]))
    ctx.sql("UPDATE evolving SET b = 9 WHERE id = 1")
    ctx.expect(op="U", table="evolving", old_kind=None, old=None, new=["1", "9"])
    ctx.sql("ALTER TABLE evolving RENAME COLUMN b TO c")
    ctx.sql("ALTER TABLE evolving ALTER COLUMN c TYPE int8")
    rels.append(ctx.relation("evolving", keys=["id"]))
    ctx.sql("INSERT INTO evolving VALUES (3, 10)")
    ctx.expect(op="I", table="evolving", new=["3", "10"])
    # Inside one transaction: the Relation message is re-sent mid-transaction.
    ctx.sql(
        "BEGIN", "INSERT INTO evolving VALUES (4, 11)", "ALTER TABLE evolving ADD COLUMN d text"
    )
    ctx.sql("INSERT INTO evolving VALUES (5, 12, 'd')", "COMMIT")
    ctx.expect(op="I", table="evolving", new=["4", "11"])
    rels.append(ctx.relation("evolving", keys=["id"]))
    ctx.expect(op="I", table="evolving", new=["5", "12", "d"])
    return {"relations": rels}


# --------------------------------------------------------------------------------------
# The scenario list
# --------------------------------------------------------------------------------------

STREAM_MEM = "64kB"

SCENARIOS: list[Scenario] = [
    *(
        Scenario(
            f"basic_p{p}",
            f"DML over many types, protocol {p}, text",
            setup_people,
            workload_people,
            {"proto_version": str(p)},
            min_version=16 if p == 4 else 15,
        )
        for p in (1, 2, 3, 4)
    ),
    Scenario(
        "binary_p1",
        "DML over many types, protocol 1, binary",
        setup_people,
        workload_people,
        {"proto_version": "1", "binary": "true"},
    ),
    Scenario(
        "binary_p4",
        "DML over many types, protocol 4, binary",
        setup_people,
        workload_people,
        {"proto_version": "4", "binary": "true"},
        min_version=16,
    ),
    Scenario(
        "messages_p1",
        "logical decoding messages, transactional or not",
        setup_messages,
        workload_messages,
        {"messages": "true"},
    ),
    Scenario(
        "stream_p2",
        "streamed transactions: commit, subxact abort, abort",
        setup_stream,
        workload_stream,
        {"proto_version": "2", "streaming": "on", "messages": "true"},
        work_mem=STREAM_MEM,
        notes=[
            "inside a stream the peek's xid column is the top-level xid; a change made in a "
            "subtransaction carries the subxid in its payload"
        ],
    ),
    Scenario(
        "stream_parallel_p4",
        "streaming=parallel: Stream Abort with abort_lsn/ts",
        setup_stream,
        workload_stream,
        {"proto_version": "4", "streaming": "parallel", "messages": "true"},
        min_version=16,
        work_mem=STREAM_MEM,
        notes=[
            "the SQL interface accepts streaming=parallel with proto_version 4; Stream Abort "
            "then carries abort_lsn and abort_ts (25 bytes instead of 9)"
        ],
    ),
    Scenario(
        "two_phase_p3",
        "two-phase slot: prepare/commit/rollback prepared, streamed",
        setup_stream,
        workload_two_phase,
        {"proto_version": "3", "two_phase": "on", "streaming": "on"},
        two_phase_slot=True,
        work_mem=STREAM_MEM,
        notes=[
            "call 0 peeks after four PREPAREs, then the slot is advanced to its last row; "
            "call 1 holds only Commit Prepared / Rollback Prepared"
        ],
    ),
    Scenario(
        "origin_p2",
        "a transaction replayed under a replication origin",
        setup_origin,
        workload_origin,
        {"proto_version": "2"},
        options_by_version={16: {"origin": "any"}},
        notes=[
            "PG15 has no 'origin' option and always sends Origin; PG16 sends it under "
            "origin=any (its default) and drops the transaction under origin=none"
        ],
    ),
    Scenario(
        "truncate_p1",
        "TRUNCATE with CASCADE and RESTART IDENTITY",
        setup_truncate,
        workload_truncate,
    ),
    Scenario(
        "identity_p1",
        "REPLICA IDENTITY DEFAULT, FULL, USING INDEX, key changes",
        setup_identity,
        workload_identity,
    ),
    Scenario("toast_p1", "unchanged TOAST values in UPDATE", setup_toast, workload_toast),
    Scenario(
        "types_p2",
        "enum, domain, array, schema-qualified: Type messages",
        setup_types,
        workload_types,
        {"proto_version": "2"},
    ),
    Scenario(
        "alter_p1", "ALTER TABLE between and inside transactions", setup_alter, workload_alter
    ),
]

BY_NAME = {s.name: s for s in SCENARIOS}


def probe_notes(cluster: Any) -> list[str]:
    """Record what the server refuses, so the corpus says why a vector is missing."""
    notes: list[str] = []
    dsn = cluster.create_database("gold_probe")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('gold_probe', 'pgoutput')")
        for opts in (
            ["proto_version", "4"],
            ["proto_version", "1", "streaming", "on"],
            ["proto_version", "2", "streaming", "parallel"],
            ["proto_version", "2", "two_phase", "on"],
            ["proto_version", "1", "origin", "none"],
        ):
            try:
                conn.execute(
                    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
                    "'gold_probe', NULL, NULL, VARIADIC %s::text[])",
                    ([*opts, "publication_names", PUBLICATION],),
                )
                notes.append(f"accepted: {' '.join(opts)}")
            except psycopg.Error as exc:
                notes.append(f"refused: {' '.join(opts)}: {str(exc).strip().splitlines()[0]}")
        conn.execute("SELECT pg_drop_replication_slot('gold_probe')")
    return notes


def capture_all(versions: tuple[int, ...], only: set[str] | None = None) -> Json:
    from slotlake.localpg import LocalPostgres, available_versions

    manifest: Json = {"versions": {}}
    have = available_versions()
    for version in versions:
        if version not in have:
            log.warning("PostgreSQL %s not installed: skipped", version)
            continue
        out_dir = GOLDEN_DIR / f"pg{version}"
        entry: Json = {"scenarios": {}, "notes": []}
        with LocalPostgres(version=version) as cluster:
            entry["notes"] = probe_notes(cluster)
            for scenario in SCENARIOS:
                if only and scenario.name not in only:
                    continue
                if not scenario.supported(version):
                    entry["scenarios"][scenario.name] = {
                        "skipped": f"needs PG{scenario.min_version}"
                    }
                    continue
                dsn = cluster.create_database(f"gold_{scenario.name}")
                cap = run_scenario(dsn, version, scenario)
                cap.write(out_dir / f"{scenario.name}.jsonl")
                counts: dict[str, int] = {}
                for row in cap.rows:
                    tag = chr(row.payload[0])
                    counts[tag] = counts.get(tag, 0) + 1
                entry["scenarios"][scenario.name] = {"rows": len(cap.rows), "types": counts}
                log.info("pg%s %s: %d rows %s", version, scenario.name, len(cap.rows), counts)
        manifest["versions"][str(version)] = entry
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, action="append", help="15 and/or 16 (default both)")
    parser.add_argument("--only", action="append", help="scenario name(s) to capture")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    versions = tuple(args.version or VERSIONS)
    manifest = capture_all(versions, set(args.only) if args.only else None)
    path = GOLDEN_DIR / "manifest.json"
    if not args.only and set(versions) == set(VERSIONS):
        path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    else:
        print(json.dumps(manifest, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
