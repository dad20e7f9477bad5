"""Shared pieces of the sync integration tests: an audit-trigger oracle and checks."""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import psycopg

from slotlake.batch import local_table_rows
from slotlake.config import Config, LakeConfig, SourceConfig
from slotlake.lake import Lake, read_changes, read_delta
from slotlake.source import SlotSource
from slotlake.sync import (
    FAULT_ENV,
    FAULT_FASTDEFAULT,
    FAULT_STEPS,
    InjectedFault,
    SyncResult,
    run_sync,
)
from slotlake.verify import compare_table

# Every published table gets BEFORE triggers that log (table, op, key) into an unpublished
# audit table, in execution order: an oracle of what happened that is independent of
# logical decoding. Rolled-back work rolls back its audit rows too.
AUDIT_SQL = """
CREATE TABLE audit (id bigserial PRIMARY KEY, tbl text, op text, k text);
CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    INSERT INTO audit (tbl, op, k) VALUES (TG_TABLE_NAME, 'T', NULL);
    RETURN NULL;
  END IF;
  INSERT INTO audit (tbl, op, k) VALUES (
    TG_TABLE_NAME, left(TG_OP, 1),
    CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ->> TG_ARGV[0] ELSE to_jsonb(NEW) ->> TG_ARGV[0] END);
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END $$;
"""


def audit(conn: psycopg.Connection, table: str, key: str) -> None:
    conn.execute(
        f"CREATE TRIGGER audit_row BEFORE INSERT OR UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION audit_fn('{key}')"
    )
    conn.execute(
        f"CREATE TRIGGER audit_trunc BEFORE TRUNCATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION audit_fn('{key}')"
    )


def audited_schema(conn: psycopg.Connection, schema: str, keys: dict[str, str]) -> None:
    """The audit table and trigger function, ``schema``, then the audit triggers of each
    table in ``keys`` (qualified name → key column)."""
    conn.execute(AUDIT_SQL)
    conn.execute(schema)
    for qualified, key in keys.items():
        audit(conn, qualified.split(".")[1], key)


def audited_ops(conn: psycopg.Connection, table: str) -> list[tuple[str, str | None]]:
    return [
        (op, k)
        for op, k in conn.execute("SELECT op, k FROM audit WHERE tbl = %s ORDER BY id", (table,))
    ]


def logged_ops(root: str, qualified: str, key: str) -> list[tuple[str, str | None]]:
    """(op, key as text) of the committed change log, in (commit_lsn, tx_ordinal) order."""
    out: list[tuple[str, str | None]] = []
    for row in read_changes(root, qualified).to_pylist():
        op = row["_op"]
        if op == "S":
            continue  # a snapshot's marker (the state was re-based), not a change
        if op == "T":
            out.append(("T", None))
            continue
        value: Any = (row["_old"] or {}).get(key) if op == "D" else row.get(key)
        out.append((op, None if value is None else str(value)))
    return out


def make_config(
    dsn: str, lake: str, slot: str, publications: tuple[str, ...] = ("pub",), **source: Any
) -> Config:
    return Config(
        source=SourceConfig(dsn=dsn, slot=slot, publications=list(publications), **source),
        lake=LakeConfig(path=lake),
    )


def spark_writers_by_hand(cfg: Config) -> None:
    """``SLOTLAKE_RANDOM_SPARK=1`` (a random workload run by hand): every batch and copy
    through Spark's writers, the path of a lake off the local disk, on the local lake
    that reprocessing and the checks read."""
    if os.environ.get("SLOTLAKE_RANDOM_SPARK"):
        cfg.lake.driver_write_rows = 0
        cfg.lake.bootstrap_driver_mb = 0


# Every step a sync can be made to die at (slotlake.sync.fault_point), copies' included.
CRASH_STEPS = (*FAULT_STEPS, "snapshot_copied", "snapshot_rebased", FAULT_FASTDEFAULT)


# ByHand's generators and the variables that set their rates.
_BY_HAND = {
    "crashes": "SLOTLAKE_RANDOM_FAULTS",
    "maintains": "SLOTLAKE_RANDOM_MAINTAIN",
    "reprocesses": "SLOTLAKE_RANDOM_REPROCESS",
}


@dataclass
class ByHand:
    """What a random workload run by hand adds to its rounds, each at the rate its variable
    sets (``SLOTLAKE_RANDOM_FAULTS=0.3`` …), drawn from a generator of its own, so that a
    seed's workload is the same with and without them:

    - ``SLOTLAKE_RANDOM_FAULTS``: a sync dies first at a random step, then runs again
      (:meth:`sync`); with ``SLOTLAKE_RANDOM_FAULTS_EXIT=1`` in a process of its own;
    - ``SLOTLAKE_RANDOM_MAINTAIN``: ``slotlake maintain`` after a round's checks;
    - ``SLOTLAKE_RANDOM_REPROCESS``: the newest batches rebuilt in place after them.
    """

    seed: object
    crashes: random.Random | None = None
    maintains: random.Random | None = None
    reprocesses: random.Random | None = None

    def __post_init__(self) -> None:
        for name, variable in _BY_HAND.items():
            if os.environ.get(variable):
                setattr(self, name, random.Random(f"{name} {self.seed}"))

    def _drawn(self, name: str) -> random.Random | None:
        rng = getattr(self, name)
        if rng is not None and rng.random() < float(os.environ[_BY_HAND[name]]):
            return rng
        return None

    def sync(self, cfg: Config, spark: Any = None) -> tuple[SyncResult, str | None]:
        """``run_sync``; drawn, first an attempt that dies at a random step (one the run
        does not reach lets it finish), so that this one completes what it left, from its
        plan. Returns the result and the step drawn.

        The attempt raises an InjectedFault there; with ``SLOTLAKE_RANDOM_FAULTS_EXIT=1`` it
        runs in a process of its own that ends at the step with ``os._exit``, as a SIGKILL
        would leave it: no ``finally``, no cleanup."""
        step = None
        crashes = self._drawn("crashes")
        if crashes is not None:
            step = crashes.choice(CRASH_STEPS)
            if os.environ.get("SLOTLAKE_RANDOM_FAULTS_EXIT"):
                print(f"crash at {step}: {_die_in_a_process(cfg, step)}")
            else:
                os.environ[FAULT_ENV] = step
                try:
                    run_sync(cfg, spark=spark)
                    print(f"crash at {step}: not reached")
                except InjectedFault:
                    print(f"crash at {step}: died")
                finally:
                    del os.environ[FAULT_ENV]
        return run_sync(cfg, spark=spark), step

    def upkeep(self, cfg: Config, spark: Any = None) -> list[str]:
        """After a round's checks, each drawn: ``maintain`` (OPTIMIZE, and VACUUM at no
        minimum age), so that the next batches write onto compacted files; ``reprocess``,
        the newest one to four batches rebuilt in place from their raw payloads, which the
        next batches go on from. What ran."""
        from slotlake.maintain import run_maintain
        from slotlake.reprocess import run_reprocess

        ran = []
        if self._drawn("maintains") is not None:
            mcfg = copy.deepcopy(cfg)
            mcfg.lake.vacuum_min_age_hours = 0
            result = run_maintain(mcfg, spark=spark)
            assert result.status == "done", result.status
            print(
                f"maintain: {result.files_compacted} files compacted, {result.files_deleted} deleted"
            )
            ran.append("maintain")
        reprocesses = self._drawn("reprocesses")
        if reprocesses is not None:
            lake = Lake(cfg.lake.path)
            newest = lake.commit_batches()[-reprocesses.randint(1, 4) :]
            # A bootstrap's batch has no raw payloads: reprocessing starts after it.
            start = 0
            for i, batch in enumerate(newest):
                if not lake.read_commit(batch).raw:
                    start = i + 1
            since = newest[start:]
            if since:
                run_reprocess(cfg.lake.path, in_place=True, first=since[0], spark=spark)
                print(f"reprocessed in place from batch {since[0]} to {since[-1]}")
                ran.append("reprocess")
        return ran


_SYNC_OF_A_PICKLE = (
    "import pickle, sys; from slotlake.sync import run_sync; "
    "run_sync(pickle.loads(sys.stdin.buffer.read()))"
)


def _die_in_a_process(cfg: Config, step: str) -> str:
    """A sync in a process of its own that ends at ``step`` with ``os._exit``; waits until
    its server backends are gone too (until then the rerun finds the lake's lock held).
    The operations meant for a target's reading (:func:`before_the_target`) run in the
    rerun."""
    env = {**os.environ, FAULT_ENV: f"{step}:exit"}
    done = subprocess.run(
        [sys.executable, "-c", _SYNC_OF_A_PICKLE],
        input=pickle.dumps(cfg),
        env=env,
        capture_output=True,
        timeout=900,
    )
    assert done.returncode in (0, 137), (done.returncode, done.stderr.decode()[-3000:])
    with psycopg.connect(cfg.source.dsn, autocommit=True) as c:
        deadline = time.monotonic() + 60
        while slotlake_backends(c):
            if time.monotonic() > deadline:
                raise AssertionError("the killed attempt's server backends did not go away")
            time.sleep(0.05)
    return "exited" if done.returncode == 137 else "not reached"


def slotlake_backends(c: psycopg.Connection[Any]) -> int:
    """How many server backends of slotlake's runs (its syncs, copies, bootstraps) are on
    ``c``'s database: the server notices a dead client only when it next reads its
    socket, and until then a killed run's backend still holds the lake's advisory lock
    (and, mid-peek, the slot)."""
    row = c.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'slotlake%' "
        "AND datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def slot_active(c: psycopg.Connection[Any], slot: str) -> bool:
    row = c.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return bool(row and row[0])


@contextlib.contextmanager
def streaming_from(
    dsn: str, slot: str, publication: str = "pub", application: str = "subscriber"
) -> Iterator[Any]:
    """A walsender streaming from ``slot``, as a subscriber's would (its ``pq.PGconn``):
    the slot is active when the body starts, and free again after it (the walsender's
    backend has exited, or the slot is gone)."""
    from psycopg import pq

    def until(active: bool) -> None:
        deadline = time.monotonic() + 10
        while slot_active(c, slot) != active:
            assert time.monotonic() < deadline, f"slot {slot} still {'in' * active}active"
            time.sleep(0.05)

    walsender = pq.PGconn.connect(
        f"{dsn} replication=database application_name={application}".encode()
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            assert walsender.status == pq.ConnStatus.OK
            walsender.send_query(
                f"START_REPLICATION SLOT {slot} LOGICAL 0/0"
                f" (proto_version '1', publication_names '{publication}')".encode()
            )
            until(True)
            yield walsender
        finally:
            walsender.finish()
        until(False)


def published_as_leaves(c: psycopg.Connection, slot: str) -> list[str]:
    """Table ``l`` partitioned into ``l1`` and ``l2`` (itself partitioned: ``l2a``), 12
    rows, published as its leaves (publication ``pub``), and slot ``slot``: the leaves'
    names."""
    c.execute("CREATE TABLE l (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)")
    c.execute("CREATE TABLE l1 PARTITION OF l FOR VALUES FROM (0) TO (10)")
    c.execute("CREATE TABLE l2 PARTITION OF l FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (id)")
    c.execute("CREATE TABLE l2a PARTITION OF l2 FOR VALUES FROM (0) TO (1000)")
    c.execute("CREATE PUBLICATION pub FOR TABLE l")
    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    c.execute("INSERT INTO l SELECT g, g % 20, 'v' FROM generate_series(1, 12) g")
    return ["public.l1", "public.l2a"]


def assert_mirror(conn: psycopg.Connection, root: str, tables: list[str]) -> None:
    for table in tables:
        cmp = compare_table(conn, root, table)
        assert cmp.equal, cmp.describe()


def assert_rows_recorded(root: str, batches: Iterable[int | None]) -> None:
    """Each table's counts in these batches' commit records are what its Delta tables hold
    as of the versions the record names: ``state_rows`` the state's rows (a multiset's
    stored rows: ``status`` and ``inspect`` print it, reprocessing orders the tables by
    it), ``change_rows`` the change log's rows of that batch."""
    lake = Lake(root)
    for batch in batches:
        if batch is None:
            continue
        for name, t in lake.read_commit(batch).tables.items():
            if t.gone_since is not None:
                continue
            if t.state and t.state_version is not None:
                rows = local_table_rows(lake, t.state, t.state_version)
                assert t.state_rows == rows, (
                    f"batch {batch}: {name}: state_rows {t.state_rows}, the state {rows}"
                )
            if t.changes and t.changes_version is not None:
                query = f"SELECT count(*) FROM t WHERE _batch = {batch}"
                logged = read_delta(root, t.changes, t.changes_version, query).column(0)[0]
                assert t.change_rows == logged.as_py(), (
                    f"batch {batch}: {name}: change_rows {t.change_rows}, the log {logged}"
                )


def off_record(lake: Lake) -> list[str]:
    """Delta tables on disk whose newest version is not the one the last commit record
    names (any version of a table it does not name, or when there is no record yet):
    past it after a crash (work no record accounts for yet), never after a run. A
    maintain's OPTIMIZE since (no batch wrote the table after it) changes no row and
    counts as on record."""
    from deltalake import DeltaTable

    last = lake.last_commit()
    named = last.delta_versions() if last is not None else {}
    out = []
    for log in sorted(lake.root.glob("**/_delta_log")):
        if not any(log.iterdir()):
            continue
        rel = log.parent.relative_to(lake.root).as_posix()
        version = named.get(rel)
        table = DeltaTable(str(log.parent))
        if version is None:
            out.append(rel)
        elif table.version() != version:
            since = [h for h in table.history() if h["version"] > version]
            if any(h.get("operation") != "OPTIMIZE" for h in since):
                out.append(rel)
    return out


def assert_log_matches_audit(conn: psycopg.Connection, root: str, tables: dict[str, str]) -> None:
    """tables: qualified name → key column."""
    for qualified, key in tables.items():
        expected = audited_ops(conn, qualified.split(".", 1)[1])
        got = logged_ops(root, qualified, key)
        assert got == expected, (
            f"{qualified}: change log differs from the audit trail\nlog:   {got}\naudit: {expected}"
        )


def slot_confirmed(conn: psycopg.Connection, slot: str) -> str:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    assert row is not None
    return row[0]


@contextlib.contextmanager
def before_the_target(ops: list[Callable[[], None]]) -> Iterator[None]:
    """Within it, a sync runs (and takes out of ``ops``) what ``ops`` holds when it reads
    its target, after it read its published set (a run's copies come between the two)."""
    read_target = SlotSource.flush_lsn_and_catalog

    def at_the_target(source: SlotSource) -> Any:
        while ops:
            ops.pop(0)()
        return read_target(source)

    with mock.patch.object(SlotSource, "flush_lsn_and_catalog", at_the_target):
        yield


def key_indexes_made(monkeypatch: Any) -> list[str]:
    """The paths of the key indexes made from now on (:mod:`slotlake.key_index`), listed
    as they are made."""
    from slotlake import key_index

    made: list[str] = []
    real = key_index._make

    def spy(table_path: str, add: dict[str, Any], column: str, target: str) -> Any:
        made.append(target)
        return real(table_path, add, column, target)

    monkeypatch.setattr(key_index, "_make", spy)
    return made
