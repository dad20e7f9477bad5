"""The TOAST fill and each key's final row on the driver: DuckDB over Arrow tables.

:func:`fill_keyed_local` is :func:`slotlake.state.fill_keyed` (window replay) for a small
table of a batch, without any Spark job: the same records, slots, epochs, arrivals,
pointer jumping and finals as :mod:`slotlake.replay_sql` (whose docstring explains the
algorithm), written as DuckDB SQL. What differs is how values travel:

* DuckDB sees only a narrow projection of the events: positions, op, the keys' images,
  ``_unchanged``, ``_fallback``. No data value crosses into DuckDB and back, so no type
  round trip can change one (decimal scale, timestamp zone or unit, nested arrays...).
* A slot is ``struct<e, s, r, f>``: ``r`` replaces ``v`` and ``x`` of replay_sql's slot.
  A known slot's ``r`` is the *record* whose value it carries (an event's row index, or
  the event count + a prior row's index); a pending slot's ``r`` is the row index of the
  moving UPDATE it waits for (replay_sql's position ``x``).
* DuckDB returns, per event, the record each open column takes its value from, the new
  ``_fallback`` and ``_missing_toast``; per touched key, the event whose filled row is the
  key's final row (an arrival's UPDATE) and which image of it holds the key. The values
  are then gathered with Arrow ``take`` (vectorised, exact types).
* The key text (``_k``) is DuckDB's ``to_json`` of the key struct, not Spark's: only
  consistent between events and prior rows, which one helper builds both of.

The pending rounds are a loop of SQL statements over the (few) moving UPDATEs that leave
columns unchanged, as in replay_sql; without such UPDATEs there is none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slotlake.catalog import TableCatalog
from slotlake.replay_arrow import finals_without_toast, gather, no_toast_open
from slotlake.replay_sql import (
    ARRIVAL_ROLE,
    EVENT_ROLE,
    KNOWN,
    MISSING,
    PENDING,
    PRIOR_ROLE,
)

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

# One thread: DuckDB splits work by row groups of ~122k rows, so a lane table (≤ 50k
# changes) gains nothing from more, and the lane already runs tables side by side in a
# driver thread pool (measured: 1 thread as fast as 2 or faster, bench/replay_duckdb_bench.py).
DUCKDB_THREADS = 1
_EMPTY_NAMES = "[]::VARCHAR[]"
_EMPTY_MAP = "MAP{}::MAP(VARCHAR, VARCHAR)"


def _lit(text: str) -> str:
    """A DuckDB string literal (backslashes are not escapes in DuckDB)."""
    return "'" + text.replace("'", "''") + "'"


def _names(names: Sequence[str]) -> str:
    return "[" + ", ".join(_lit(n) for n in names) + "]::VARCHAR[]" if names else _EMPTY_NAMES


def _key_json(values: Sequence[str], fallback: str, keys: Sequence[str], prefix: str) -> str:
    """The key's comparable text: :func:`slotlake.state._key_struct` as JSON, with
    positional field names (events and prior rows both get it from here)."""
    parts = [f'"k{i}" := {v}' for i, v in enumerate(values)]
    parts += [f'"~{i}" := {fallback}[{_lit(prefix + k)}]' for i, k in enumerate(keys)]
    return f"to_json(struct_pack({', '.join(parts)}))"


def _map_filter(m: str, keep: str) -> str:
    """Spark's ``map_filter(coalesce(m, {}), (k, v) -> keep)``, ``keep`` over ``x.key``."""
    return (
        f"map_from_entries(list_filter(map_entries(coalesce({m}, {_EMPTY_MAP})), lambda x: {keep}))"
    )


def _is_open(c: str) -> str:
    return f"list_contains(u, {_lit(c)})"


def _slot(epoch: str, state: int | str, record: str = "NULL", text: str = "NULL") -> str:
    return (
        f"struct_pack(e := ({epoch})::INTEGER, s := ({state})::INTEGER, "
        f"r := ({record})::BIGINT, f := ({text})::VARCHAR)"
    )


def _epoch(truncations: Sequence[tuple[int, int]]) -> str:
    """How many of the batch's TRUNCATEs precede the event at (l, o)."""
    if not truncations:
        return "0"
    return " + ".join(f"(l > {lsn} OR (l = {lsn} AND o > {o}))::INTEGER" for lsn, o in truncations)


def _pending(f: str) -> str:
    return f"coalesce({f}.s = {PENDING}, false)"


def _jumped(table: str, n: int) -> str:
    """One pointer-jumping step: ``table`` with each pending fill replaced by the fill, in
    ``table``, of the UPDATE it points at."""
    picks = ", ".join(
        f"CASE WHEN {_pending(f's.f{i}')} THEN t{i}.f{i} ELSE s.f{i} END AS f{i}" for i in range(n)
    )
    joins = " ".join(
        f"LEFT JOIN {table} t{i} ON {_pending(f's.f{i}')} AND t{i}.r = s.f{i}.r" for i in range(n)
    )
    return f"SELECT s.r, {picks} FROM {table} s {joins}"


def _arange(n: int) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    return pa.array(np.arange(n, dtype=np.int64))


def fill_keyed_local(
    events: pa.Table,
    read_prior: Callable[[list[Any], bool], pa.Table],
    cat: TableCatalog,
    truncations: Sequence[tuple[int, int]],
    arrow: bool = True,
) -> tuple[pa.Table, pa.Table]:
    """(change rows with TOAST filled, final row of every key the batch touched).

    ``events``: the decoded rows of one keyed table (Arrow schema of
    ``decode.change_schema(cat)``). ``read_prior(values, want_null)`` returns prior state
    rows (the state columns in ``cat.state_columns`` order, cast to this batch's types,
    ``_fallback`` and ``_missing_toast``), at least every row whose first key column is
    in ``values`` (Python values, as Arrow's ``to_pylist`` gives them) or NULL when
    ``want_null``: false positives are dropped here by the whole key. It is called at
    most once, and only when an UPDATE left a column unchanged.

    The results are what ``fill_keyed(...)[0].toArrow()`` and ``[1].toArrow()`` give, row
    order aside: ``changes`` the events' columns (``_missing_toast`` non-nullable, as in
    Spark's schema); ``finals`` ``_k``, the state columns, ``_fallback``,
    ``_missing_toast``, ``_deleted`` and ``_key``. ``_k`` is this module's key text, not
    Spark's (both exact to the microsecond, spelled differently).

    A batch that leaves no TOAST column open goes to :mod:`slotlake.replay_arrow`
    instead (unless ``arrow`` is false): there ``_k`` is only the key's number.
    """

    if not cat.key_columns:
        raise ValueError(f"fill_keyed_local: {cat.name} has no key (a multiset table)")
    if arrow and no_toast_open(events):
        # Nothing to fill: each key's last record, in Arrow (slotlake.replay_arrow).
        done = finals_without_toast(events, cat, truncations)
        if done is not None:
            return done
    # A cursor of one in-memory database: opening a database costs ~15–30 ms, a cursor ~2;
    # its TEMP tables and registered views are its own, so threads do not meet.
    with _database().cursor() as con:
        # Not a connect() option: the (built-in) ICU extension loads with the connection.
        con.execute("SET TimeZone = 'UTC'")
        return _Replay(con, events, cat, truncations).run(read_prior)


_DB: list[duckdb.DuckDBPyConnection] = []
_DB_LOCK = threading.Lock()


def _database() -> duckdb.DuckDBPyConnection:
    with _DB_LOCK:
        if not _DB:
            import duckdb

            _DB.append(duckdb.connect(config={"threads": DUCKDB_THREADS}))
        return _DB[0]


class _Replay:
    """One call's DuckDB tables and the Arrow columns the results are gathered from."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        events: pa.Table,
        cat: TableCatalog,
        truncations: Sequence[tuple[int, int]],
    ) -> None:
        import pyarrow.compute as pc

        self.con = con
        self.events = events
        self.cat = cat
        self.keys = list(cat.key_columns)
        self.n_events = events.num_rows
        self.n_truncs = len(truncations)
        # The old image's key values (NULL where there is no old image).
        self.old_keys = [pc.struct_field(events.column("_old"), k) for k in self.keys]
        self._load_events(sorted((int(lsn), int(o)) for lsn, o in truncations))

    def run(self, read_prior: Callable[[list[Any], bool], pa.Table]) -> tuple[pa.Table, pa.Table]:
        open_names, open_moves = self.con.execute(
            # An INSERT leaves a value out after a row filter only (toast.replay).
            "SELECT list_distinct(flatten(list(u) FILTER (WHERE op IN ('U', 'I')))),"
            " count(*) FILTER (WHERE moved AND len(u) > 0) FROM ev"
        ).fetchone()  # type: ignore[misc]
        columns = self.events.column_names
        open_names = set(open_names or ())
        # Columns of the events first, in their order; names that are no column last.
        self.open_cols = [c for c in columns if c in open_names] + sorted(open_names - set(columns))
        n = len(self.open_cols)
        self.prior = self._load_prior(read_prior) if n else None
        self._window()
        if open_moves:
            self._resolve_moves()
        changes = self._changes()
        return changes, self._finals(changes)

    # -- DuckDB tables -------------------------------------------------------------------

    def _load_events(self, truncations: list[tuple[int, int]]) -> None:
        import pyarrow as pa

        ev = self.events
        narrow = pa.table(
            [
                _arange(self.n_events),
                ev.column("_op"),
                ev.column("_commit_lsn"),
                ev.column("_tx_ordinal"),
                ev.column("_old_kind"),
                ev.column("_unchanged"),
                ev.column("_fallback"),
                *[ev.column(k) for k in self.keys],
                *self.old_keys,
            ],
            names=[
                "i", "op", "l", "o", "ok", "u", "fb",
                *[f"n{i}" for i in range(len(self.keys))],
                *[f"o{i}" for i in range(len(self.keys))],
            ],
        )  # fmt: skip
        self.con.register("ev_in", narrow)
        after = _key_json([f"n{i}" for i in range(len(self.keys))], "fb", self.keys, "")
        old = _key_json([f"o{i}" for i in range(len(self.keys))], "fb", self.keys, "_old.")
        # bo: the key before the event is the old image's (with_keys' _kb), else the new one.
        self.con.execute(f"""
            CREATE TEMP TABLE ev AS
            SELECT *, coalesce(op = 'U' AND kb <> ka, false) AS moved FROM (
              SELECT i, op, l, o, coalesce(u, {_EMPTY_NAMES}) AS u, fb, bo, ka,
                     CASE WHEN bo THEN {old} WHEN op = 'U' THEN ka END AS kb,
                     {_epoch(truncations)} AS e
              FROM (SELECT *, (op = 'D' OR (op = 'U' AND ok IS NOT NULL)) AS bo,
                           CASE WHEN op IN ('I', 'U') THEN {after} END AS ka
                    FROM ev_in))
        """)

    def _key_image(self, k: int, indices: pa.Array) -> pa.Array:
        """Key column ``k`` of the image index ``i`` (new) or event count + ``i`` (old)."""
        return gather([self.events.column(self.keys[k]), self.old_keys[k]], indices)

    def _load_prior(self, read_prior: Callable[[list[Any], bool], pa.Table]) -> pa.Table:
        """The prior rows of the keys whose events have unchanged TOAST open (exactly)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = self.con.execute(f"""
            SELECT any_value(i + CASE WHEN bo THEN {self.n_events} ELSE 0 END) AS x
            FROM ev WHERE len(u) > 0 AND kb IS NOT NULL GROUP BY kb
        """).fetch_arrow_table()
        first = pc.unique(self._key_image(0, wanted.column("x").combine_chunks()))
        prior = read_prior(first.drop_null().to_pylist(), first.null_count > 0)
        types = {f.name: f.type for f in self.events.schema}
        narrow = pa.table(
            [
                _arange(prior.num_rows),
                prior.column("_fallback"),
                prior.column("_missing_toast"),
                *[prior.column(k).cast(types[k]) for k in self.keys],
            ],
            names=["j", "fb", "pm", *[f"p{i}" for i in range(len(self.keys))]],
        )
        self.con.register("pr_in", narrow)
        pk = _key_json([f"p{i}" for i in range(len(self.keys))], "fb", self.keys, "")
        # The semi-join on the whole key: read_prior may return more (prior_rows_for).
        self.con.execute(f"""
            CREATE TEMP TABLE pr AS
            SELECT * FROM (SELECT j, fb, coalesce(pm, {_EMPTY_NAMES}) AS pm, {pk} AS k FROM pr_in)
            WHERE k IN (SELECT kb FROM ev WHERE len(u) > 0)
        """)
        return prior

    def _window(self) -> None:
        """Records, the window over them and each record's fills ``f<i>`` (replay_sql)."""
        n, n_events = len(self.open_cols), self.n_events
        records = f"""
            SELECT i AS r, {EVENT_ROLE} AS role, coalesce(kb, ka) AS k, op, l, o, e, moved,
                   u, fb, NULL::VARCHAR[] AS pm FROM ev
            UNION ALL
            SELECT i, {ARRIVAL_ROLE}, ka, op, l, o, e, moved, u, fb, NULL FROM ev WHERE moved
        """
        if self.prior is not None:
            records += f"""
            UNION ALL
            SELECT {n_events} + j, {PRIOR_ROLE}, k, NULL, NULL, NULL, 0, false, NULL, fb, pm
            FROM pr
            """

        def provided(c: str) -> str:
            name, is_open = _lit(c), _is_open(c)
            known = _slot("e", KNOWN, "r", f"fb[{name}]")
            prior_state = f"CASE WHEN list_contains(pm, {name}) THEN {MISSING} ELSE {KNOWN} END"
            return f"""CASE
                WHEN role = {PRIOR_ROLE} THEN {_slot("e", prior_state, "r", f"fb[{name}]")}
                WHEN role = {ARRIVAL_ROLE} THEN
                    CASE WHEN {is_open} THEN {_slot("e", PENDING, "r")} ELSE {known} END
                WHEN op = 'I' THEN CASE WHEN {is_open} THEN {_slot("e", MISSING)} ELSE {known} END
                WHEN op = 'D' OR moved THEN {_slot("e", MISSING)}
                WHEN {is_open} THEN NULL
                ELSE {known} END"""

        def fill(i: int, c: str) -> str:
            is_open = _is_open(c)
            return f"""CASE
                WHEN role = {EVENT_ROLE} AND op = 'U' AND {is_open} THEN
                    CASE WHEN b{i} IS NULL OR b{i}.e <> e THEN {_slot("e", MISSING)} ELSE b{i} END
                WHEN role = {ARRIVAL_ROLE} AND {is_open} THEN {_slot("e", PENDING, "r")}
                WHEN role = {EVENT_ROLE} AND op = 'I' AND {is_open} THEN {_slot("e", MISSING)}
                END AS f{i}"""

        bases = "".join(
            f", last_value({provided(c)} IGNORE NULLS) OVER before AS b{i}"
            for i, c in enumerate(self.open_cols)
        )
        fills = "".join(", " + fill(i, c) for i, c in enumerate(self.open_cols))
        self.con.execute(f"""
            CREATE TEMP TABLE w AS
            SELECT * EXCLUDE ({", ".join(["pm", *[f"b{i}" for i in range(n)]])}) {fills}
            FROM (
              SELECT *{bases}, lead(true) OVER by_key IS NULL AS last
              FROM ({records})
              WINDOW by_key AS (PARTITION BY k ORDER BY role <> {PRIOR_ROLE}, l, o),
                     before AS (by_key ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
        """)

    def _resolve_moves(self) -> None:
        """Pointer jumping over the moving UPDATEs with unchanged columns, then every fill
        that waits on one takes its resolved fill (replay_sql's ``_resolve_moves``)."""
        n = len(self.open_cols)
        any_pending = " OR ".join(_pending(f"f{i}") for i in range(n))
        fills = ", ".join(f"f{i}" for i in range(n))
        self.con.execute(f"""
            CREATE TEMP TABLE mv0 AS SELECT r, {fills} FROM w
            WHERE role = {EVENT_ROLE} AND moved AND len(u) > 0
        """)
        table, previous = "mv0", None
        while True:
            (pending,) = self.con.execute(
                f"SELECT count(*) FROM {table} WHERE {any_pending}"
            ).fetchone()  # type: ignore[misc]
            if pending == 0:
                break
            if previous is not None and pending >= previous:
                raise RuntimeError(
                    f"fill_keyed_local: {pending} moving UPDATEs stay pending (a cycle?)"
                )
            previous = pending
            following = f"mv{int(table[2:]) + 1}"
            self.con.execute(f"CREATE TEMP TABLE {following} AS {_jumped(table, n)}")
            table = following
        # Few records wait: update them in place rather than rewrite the window's table.
        for i in range(n):
            self.con.execute(f"""
                UPDATE w SET f{i} = t.f{i} FROM {table} t
                WHERE {_pending(f"w.f{i}")} AND t.r = w.f{i}.r
            """)

    # -- results -------------------------------------------------------------------------

    def _changes(self) -> pa.Table:
        """The events with open columns, ``_fallback`` and ``_missing_toast`` filled."""
        import pyarrow as pa

        events = self.events
        present = [(i, c) for i, c in enumerate(self.open_cols) if c in events.column_names]
        # A known fill takes its record's value; anything else keeps the event's own.
        sources = "".join(
            f", CASE WHEN f{i}.s = {KNOWN} THEN f{i}.r ELSE r END AS g{i}" for i, _ in present
        )
        texts = ", ".join(
            f"CASE WHEN f{i}.s = {KNOWN} AND f{i}.f IS NOT NULL"
            f" THEN struct_pack(key := {_lit(c)}, value := f{i}.f) END"
            for i, c in enumerate(self.open_cols)
        )
        missing = ", ".join(
            f"CASE WHEN f{i}.s = {MISSING} THEN {_lit(c)} END" for i, c in enumerate(self.open_cols)
        )

        def compact(items: str, empty: str) -> str:
            return f"list_filter([{items}], lambda x: x IS NOT NULL)" if items else empty

        # An UPDATE keeps its own texts but a filled column's, which is the base's
        # (replay_sql's map_concat(kept, inherited), entry order included).
        self.con.execute(f"""
            CREATE TEMP TABLE filled AS
            SELECT r AS i{sources},
                   CASE WHEN op = 'U' THEN map_concat(
                       {_map_filter("fb", "NOT list_contains(inherited, x.key)")},
                       map_from_entries(texts)) ELSE fb END AS fb2,
                   CASE WHEN op IN ('U', 'I')
                        THEN list_filter(u, lambda x: list_contains(missing, x))
                        ELSE {_EMPTY_NAMES} END AS ms
            FROM (SELECT *, list_transform(texts, lambda x: x.key) AS inherited
                  FROM (SELECT *, {compact(texts, "[]::STRUCT(key VARCHAR, value VARCHAR)[]")}
                                  AS texts,
                               {compact(missing, _EMPTY_NAMES)} AS missing
                        FROM w WHERE role = {EVENT_ROLE}))
        """)
        out = self.con.execute("SELECT * FROM filled ORDER BY i").fetch_arrow_table()
        types = {f.name: f.type for f in events.schema}
        for i, c in present:
            values = [events.column(c)]
            if self.prior is not None:
                # The prior rows' values follow the events' (record r = event count + j).
                values.append(self._prior_column(c, types[c]))
            gathered = gather(values, out.column(f"g{i}").combine_chunks())
            events = events.set_column(events.schema.get_field_index(c), c, gathered)
        for name, column in (("_fallback", "fb2"), ("_missing_toast", "ms")):
            # Spark's _missing_toast of the change rows is never NULL: a non-nullable field.
            target = pa.field(name, types[name], nullable=name != "_missing_toast")
            index = events.schema.get_field_index(name)
            events = events.set_column(index, target, out.column(column).cast(types[name]))
        return events

    def _prior_column(self, name: str, type_: pa.DataType) -> pa.ChunkedArray:
        import pyarrow as pa

        assert self.prior is not None
        if name in self.prior.column_names:
            return self.prior.column(name).cast(type_)
        # A column the state does not keep (dropped during the batch): NULL in prior rows.
        return pa.chunked_array([pa.nulls(self.prior.num_rows, type_)])

    def _finals(self, changes: pa.Table) -> pa.Table:
        """One row per touched key: the filled row of its last record, or deleted."""
        import pyarrow as pa

        data = list(self.cat.state_columns)
        # The key struct of with_keys: the image the record's key came from.
        texts = "".join(
            f", CASE WHEN from_old THEN fb[{_lit('_old.' + k)}] ELSE fb[{_lit(k)}] END AS t{i}"
            for i, k in enumerate(self.keys)
        )
        rows = self.con.execute(f"""
            SELECT k, deleted, CASE WHEN NOT deleted THEN i END AS vi,
                   i + CASE WHEN from_old THEN {self.n_events} ELSE 0 END AS ki,
                   CASE WHEN NOT deleted
                        THEN {_map_filter("fb2", f"list_contains({_names(data)}, x.key)")}
                        END AS fb
                   {texts}
            FROM (SELECT w.k, w.r AS i, ev.fb, filled.fb2,
                         w.role = {EVENT_ROLE} AND ev.bo AS from_old,
                         w.e < {self.n_truncs}
                         OR (w.role = {EVENT_ROLE} AND (w.op = 'D' OR w.moved)) AS deleted
                  FROM w JOIN ev ON ev.i = w.r JOIN filled ON filled.i = w.r
                  WHERE w.last AND w.role <> {PRIOR_ROLE})
        """).fetch_arrow_table()
        types = {f.name: f.type for f in changes.schema}
        # An arrival's row is its UPDATE's filled row: every final is a filled event's.
        row = rows.column("vi").combine_chunks()
        image = rows.column("ki").combine_chunks()
        key = pa.StructArray.from_arrays(
            [self._key_image(i, image) for i in range(len(self.keys))]
            + [rows.column(f"t{i}").combine_chunks() for i in range(len(self.keys))],
            fields=[pa.field(k, types[k]) for k in self.keys]
            + [pa.field("~" + k, pa.string()) for k in self.keys],
        )
        columns = {
            "_k": rows.column("k").cast(pa.string()),
            **{c: changes.column(c).take(row) for c in data},
            "_fallback": rows.column("fb").cast(types["_fallback"]),
            "_missing_toast": changes.column("_missing_toast").take(row),
            # The raw row of the final image (fast defaults: was it decoded before an ADD?).
            "_seq": changes.column("_seq").take(row),
            "_deleted": rows.column("deleted"),
            "_key": key,
        }
        return pa.table(columns)
