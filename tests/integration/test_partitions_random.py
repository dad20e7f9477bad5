"""Seeded random DDL and DML on partitioned tables: after every sync the mirror equals the
source.

Two partitioned tables: ``r`` published through its root (``publish_via_partition_root``),
``l`` as its leaves. Rows move between partitions; partitions are created, detached,
dropped, attached again with the rows they gained meanwhile, or attached as a table filled
beforehand (also by the attaching transaction); one is truncated alone, or the whole
table; columns are added with fast defaults, dropped, and retyped with a rewrite; a leaf
is rewritten with its values kept (VACUUM FULL, which the DDL capture lets pass without a
copy unless the leaf was truncated alone since the last run). Rows
that leave or join a root published as itself without a change in the stream make the
lake copy it: in the same run (a partition attached, or gone since the last run read the
leaves; a leaf rewritten, named in ``snapshot.wanted`` and copied by one more batch) or
the next (a partition only the DDL capture trigger's messages showed, found gone by the
next run; or what that one more batch names in turn), which the check after that round
waits for. The oracle is the source itself (:func:`slotlake.verify.compare_table`).

A failure names the seed and round and the statements of the round;
``SLOTLAKE_RANDOM_SEED`` and ``SLOTLAKE_RANDOM_ROUNDS`` replay or widen a run by hand,
``SLOTLAKE_RANDOM_SPARK=1`` sends every batch and copy through Spark's writers.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from slotlake import ddl
from slotlake.bootstrap import run_bootstrap
from slotlake.lake import Lake
from slotlake.snapshot import partition_trees, partitions_left, published_catalog

from .sync_helpers import (
    ByHand,
    assert_mirror,
    assert_rows_recorded,
    make_config,
    off_record,
    spark_writers_by_hand,
)

ROUNDS = int(os.environ.get("SLOTLAKE_RANDOM_ROUNDS", "12"))
# Each variant's seed covers every case the test checks for (COVERED).
SEEDS = {(15, True): 35, (15, False): 1, (16, True): 35, (16, False): 1}
COVERED = {
    "move",
    "truncate root",
    "truncate leaf",
    "detach",
    "attach again",
    "attach filled",
    "attach written",
    "new partition",
    "default",
    "retype",
    "vacuum full",
}
TABLES = ("r", "l")


def _lower(partition: str) -> int:
    """A partition's lower bound, from its name (``r10``, ``rn40``, ``ls70``)."""
    return int(re.sub(r"^\D+", "", partition))


@dataclass
class Partitions:
    """Random operations on ``r`` and ``l``, drawn from one seeded generator."""

    rng: random.Random
    conn: psycopg.Connection[Any]
    # The DDL capture trigger is installed.
    trigger: bool = False
    serial: int = 1000
    done: Counter[str] = field(default_factory=Counter)
    statements: list[str] = field(default_factory=list)
    # Tables written by the current transaction outside the partitioned tables.
    fresh: set[str] = field(default_factory=set)
    # The partitions attached when the last sync read them.
    seen: set[str] = field(default_factory=set)
    # Draws for the rewrites that keep values, apart from ``rng``: a seed's other draws
    # stay what they were before these were added.
    upkeep: random.Random = field(default_factory=random.Random)
    # Without the trigger, the tables with a column dropped since the last sync: no column
    # is added to them until the next (README, "Schema changes": a column added, a row,
    # the column dropped and another added in its place reads as a rename by position).
    dropped: set[str] = field(default_factory=set)

    def synced(self) -> None:
        self.seen = {name for table in TABLES for name in self.leaves(table)}
        self.dropped = set()

    def run(self, query: str, args: tuple[Any, ...] = ()) -> None:
        self.statements.append(query if not args else f"{query} {args}")
        self.conn.execute(query, args)

    def leaves(self, table: str, attached: bool = True) -> dict[str, tuple[int, int]]:
        """name → (lower, upper) bound of ``table``'s partitions: attached ones, or the
        tables detached from it that still exist (their name tells their table)."""
        rows = self.conn.execute(
            """
            SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid),
                   c.oid IN (SELECT relid FROM pg_partition_tree(%s::regclass) WHERE isleaf)
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname ~ %s
            ORDER BY 1
            """,
            (table, f"^{table}[0-9ns]"),
        ).fetchall()
        out = {}
        for name, _, is_leaf in rows:
            if bool(is_leaf) == attached:
                lower = _lower(name)
                out[name] = (lower, lower + 10)
        return out

    def free_range(self, table: str) -> int | None:
        used = {lo for lo, _ in self.leaves(table).values()}
        used |= {lo for lo, _ in self.leaves(table, attached=False).values()}
        free = [lo for lo in range(0, 100, 10) if lo not in used]
        return self.rng.choice(free) if free else None

    def value(self) -> str | None:
        """Out of line (EXTERNAL storage, > 2 kB), small, or null."""
        if self.rng.random() < 0.3:
            return "".join(self.rng.choices("abcdef", k=2500))
        return self.rng.choice([None, "s"])

    def row(self, table: str) -> tuple[Any, ...] | None:
        keys = self.conn.execute(f"SELECT id, k FROM {table} ORDER BY id, k").fetchall()
        return self.rng.choice(keys) if keys else None

    def operation(self, table: str) -> None:
        rng, ranges = self.rng, list(self.leaves(table).values())
        if not ranges:
            return
        roll = rng.random()
        if roll < 0.35:
            lower, upper = rng.choice(ranges)
            self.serial += 1
            self.run(
                f"INSERT INTO {table} (id, k, v, big) VALUES (%s, %s, %s, %s)",
                (self.serial, rng.randint(lower, upper - 1), "i", self.value()),
            )
        elif roll < 0.5:
            if (key := self.row(table)) is not None:
                self.run(f"UPDATE {table} SET v = %s WHERE id = %s AND k = %s", ("u", *key))
        elif roll < 0.65:
            # Maybe into another partition: a delete and an insert at the source.
            lower, upper = rng.choice(ranges)
            if (key := self.row(table)) is not None:
                self.run(
                    f"UPDATE {table} SET k = %s WHERE id = %s AND k = %s",
                    (rng.randint(lower, upper - 1), *key),
                )
                self.done["move"] += 1
        elif roll < 0.75:
            if (key := self.row(table)) is not None:
                self.run(f"DELETE FROM {table} WHERE id = %s AND k = %s", key)
        elif roll < 0.78:
            self.run(f"TRUNCATE {table}")
            self.done["truncate root"] += 1
        elif roll < 0.82:
            self.run(f"TRUNCATE {rng.choice(sorted(self.leaves(table)))}")
            self.done["truncate leaf"] += 1
        elif roll < 0.86:
            if (lower := self.free_range(table)) is not None:
                self.run(
                    f"CREATE TABLE {table}n{lower} PARTITION OF {table} "
                    f"FOR VALUES FROM ({lower}) TO ({lower + 10})"
                )
                self.done["new partition"] += 1
        elif roll < 0.9:
            # Without the DDL capture trigger only a partition the last sync saw: one
            # created and detached or dropped between two runs takes the rows routed into
            # it unseen (README, "Known limits"); the trigger's messages show it.
            names = sorted(self.leaves(table))
            if not self.trigger:
                names = sorted(set(names) & self.seen)
            if len(names) > 1:
                name = rng.choice(names)
                self.run(f"ALTER TABLE {table} DETACH PARTITION {name}")
                self.done["detach"] += 1
                if name not in self.seen:
                    self.done["detach unseen"] += 1
                if rng.random() < 0.3:
                    self.run(f"DROP TABLE {name}")
        elif roll < 0.93:
            self.outside(table)
        elif roll < 0.95:
            self.attach(table)
        elif roll < 0.98:
            add = (
                f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS w{rng.randint(0, 2)} int "
                f"DEFAULT {rng.randint(0, 9)}"
            )  # drawn either way: a seed's later draws stay what they were
            if table not in self.dropped:
                self.run(add)
                self.done["default"] += 1
        elif roll < 0.99:
            self.run(f"ALTER TABLE {table} ALTER COLUMN v TYPE text USING v || 'x'")
            self.done["retype"] += 1
        else:
            self.run(f"ALTER TABLE {table} DROP COLUMN IF EXISTS w{rng.randint(0, 2)}")
            if not self.trigger:
                self.dropped.add(table)

    def outside(self, table: str) -> None:
        """Rows written into a table that is not a partition of ``table`` now: one detached
        from it, or one made to be attached later (``LIKE`` it)."""
        detached = sorted(self.leaves(table, attached=False))
        if detached and self.rng.random() < 0.7:
            name = self.rng.choice(detached)
        else:
            lower = self.free_range(table)
            if lower is None:
                return
            name = f"{table}s{lower}"
            self.run(f"CREATE TABLE {name} (LIKE {table})")
        lower = _lower(name)
        fill = sql.SQL(
            "INSERT INTO {} (id, k, v) SELECT g, {} + g % 10, 'outside' "
            "FROM generate_series({}, {}) g"
        ).format(sql.Identifier(name), lower, self.serial + 1, self.serial + 3)
        self.statements.append(fill.as_string(self.conn))
        self.conn.execute(fill)
        self.serial += 3
        self.fresh.add(name)
        if self.rng.random() < 0.25:
            self.attach(table, name)

    def attach(self, table: str, name: str | None = None) -> None:
        """A table that is not a partition now attached (``name``, else one drawn):
        detached before (``attach again``) or made for it (``attach filled``), maybe
        written by this transaction (``attach written``: its rows are older than the
        ATTACH's command)."""
        if name is None:
            names = sorted(self.leaves(table, attached=False))
            if not names:
                return
            name = self.rng.choice(names)
        lower = _lower(name)
        self.run(
            f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({lower + 10})"
        )
        self.done["attach filled" if name.startswith(f"{table}s") else "attach again"] += 1
        if name in self.fresh:
            self.done["attach written"] += 1

    def round(self) -> None:
        for _ in range(self.rng.randint(3, 12)):
            table = self.rng.choice(TABLES)
            before = Counter(self.done)
            rollback = self.rng.random() < 0.1
            self.fresh = set()
            try:
                with self.conn.transaction(force_rollback=rollback):
                    for _ in range(self.rng.randint(1, 3)):
                        self.operation(table)
            except psycopg.Error as exc:
                # A partition attached again without a column added to the table since,
                # say: the source refuses it, and the transaction rolls back whole.
                self.statements.append(f"(rolled back: {type(exc).__name__})")
                rollback = True
            if rollback:
                self.done = before
        # A leaf rewritten with its values kept (its rows' xmins too): with the DDL capture
        # in place, no copy unless the leaf was truncated alone since the last run.
        if self.upkeep.random() < 0.3:
            table = self.upkeep.choice(TABLES)
            if leaves := sorted(self.leaves(table)):
                self.run(f"VACUUM FULL {self.upkeep.choice(leaves)}")
                self.done["vacuum full"] += 1


def play(
    c: psycopg.Connection[Any], cfg: Any, seed: int, rounds: int, spark: Any = None
) -> Partitions:
    """The seeded rounds, a sync and the checks after each; ``cfg.source.capture_ddl``
    says whether the bootstrap installs the DDL capture trigger."""
    for table in TABLES:
        c.execute(
            f"CREATE TABLE {table} (id int, k int, v text, big text, PRIMARY KEY (id, k)) "
            "PARTITION BY RANGE (k)"
        )
        c.execute(f"ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL")
        for lower in (0, 10, 20):
            c.execute(
                f"CREATE TABLE {table}{lower} PARTITION OF {table} "
                f"FOR VALUES FROM ({lower}) TO ({lower + 10})"
            )
        c.execute(
            f"INSERT INTO {table} SELECT g, g % 30, 'first', NULL FROM generate_series(1, 20) g"
        )
    c.execute("CREATE PUBLICATION pub_root FOR TABLE r WITH (publish_via_partition_root = true)")
    c.execute("CREATE PUBLICATION pub_leaf FOR TABLE l")
    run_bootstrap(cfg, spark=spark)
    work = Partitions(
        random.Random(seed), c, cfg.source.capture_ddl, upkeep=random.Random(f"upkeep {seed}")
    )
    work.synced()
    hand = ByHand(seed)
    for round_no in range(1, rounds + 1):
        work.statements = []
        work.round()
        result, crashed = hand.sync(cfg, spark)
        work.synced()
        last = Lake(cfg.lake.path).last_commit()
        assert last is not None
        # The roots the next run copies: named by this run's last batch (its one more
        # batch took what the batch before named), or to be found by it (a leaf this
        # batch's DDL messages showed is gone).
        wanted = set(last.snapshot.get("wanted", {}))
        published_now = published_catalog(c, cfg.source.publications).tables
        wanted |= set(partitions_left(partition_trees(c, published_now), last))
        published = [
            r[0]
            for r in c.execute(
                "SELECT DISTINCT schemaname || '.' || tablename FROM pg_publication_tables "
                "ORDER BY 1"
            )
        ]
        where = f"seed {seed}, round {round_no}: " + "; ".join(work.statements)
        if crashed:
            where += f" (after a crash at {crashed})"
        for name in published:
            if name not in last.tables:  # a partition created since and never written
                (count,) = c.execute(f"SELECT count(*) FROM {name}").fetchone() or (0,)
                assert count == 0, f"{where}: {name} has {count} rows and is not in the lake"
        try:
            assert_mirror(
                c, cfg.lake.path, [t for t in published if t in last.tables and t not in wanted]
            )
            assert_rows_recorded(cfg.lake.path, [result.resumed, result.followed, result.batch])
            assert off_record(Lake(cfg.lake.path)) == []
        except AssertionError as exc:
            raise AssertionError(f"{where}\n{exc}") from None
        work.done.update(hand.upkeep(cfg, spark))
    return work


@pytest.mark.parametrize("trigger", [True, False], ids=["trigger", "no trigger"])
def test_random_partition_changes_mirror_equals_source(
    pg_dsn: str, slot: str, tmp_path: Path, pg_cluster: Any, spark: Any, trigger: bool
) -> None:
    seed = int(os.environ.get("SLOTLAKE_RANDOM_SEED", "0")) or SEEDS[(pg_cluster.version, trigger)]
    cfg = make_config(
        pg_dsn, str(tmp_path / "lake"), slot, ("pub_root", "pub_leaf"), capture_ddl=trigger
    )
    spark_writers_by_hand(cfg)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        work = play(c, cfg, seed, ROUNDS, spark)
        assert ddl.installed(c) == trigger
    covered = COVERED | ({"detach unseen"} if trigger else set())
    # The pinned seeds must cover every case; a seed given by hand is run for its checks.
    if "SLOTLAKE_RANDOM_SEED" not in os.environ:
        assert set(work.done) >= covered, f"seed {seed}: {dict(work.done)}"
