#!/usr/bin/env python
"""Sync benchmark: slot floor, pull, whole sync and a native subscriber on one backlog.

Starts a throwaway publisher (``slotlake.localpg.LocalPostgres``) with an 8-column table
and a TOAST-heavy table, a publication and TWO ``pgoutput`` slots created back to back
(so both see the same backlog): one for slotlake, one for a native PostgreSQL
subscription on a second throwaway cluster (created disabled, ``copy_data = false``).
It then writes a backlog of about ``--changes`` row changes in transactions of
``--txn-rows`` and measures, one after another, against the same target LSN:

  (a) floor   SELECT count(*) FROM pg_logical_slot_peek_binary_changes(…) (same options)
  (b) pull    SlotSource.pull into a RawWriter (temporary directory)
  (c) sync    run_sync on a fresh lake, in a subprocess (per-run peak RSS of the Python
              driver and of the Spark driver JVM), with per-step wall times
  (d) native  ALTER SUBSCRIPTION … ENABLE, until the publisher's slot has confirmed the
              target LSN, then row counts are compared

Not a test: run it by hand.

    python bench/sync_bench.py [--version 15|16] [--changes N] [--steps a,b,c,d] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from slotlake.localpg import LocalPostgres
from slotlake.lsn import Lsn

SLOT = "slotlake_bench"
NATIVE_SLOT = "native_bench"
PUBLICATION = "bench_pub"
SUBSCRIPTION = "bench_sub"
DATABASE = "bench"
TABLES = ("mixed", "toasty")

SCHEMA = """
CREATE TABLE mixed (
    id int8 PRIMARY KEY,
    i4 int4,
    t text,
    n numeric(12,2),
    ts timestamptz,
    b bool,
    f float8,
    vc varchar(40)
);
CREATE TABLE toasty (id int8 PRIMARY KEY, n int4, body text);
ALTER TABLE toasty ALTER COLUMN body SET STORAGE EXTERNAL;
"""

# The decoder benchmark's workload statements: both benchmarks measure the same corpus.
from decode_bench import DELETE_MIXED, INSERT_MIXED, INSERT_TOASTY, UPDATE_MIXED  # noqa: E402

# Leaves body out: the new tuples carry unchanged-TOAST 'u' markers.
UPDATE_TOASTY_N = "UPDATE toasty SET n = n + 1 WHERE id BETWEEN %(lo)s AND %(hi)s"
# Rewrites body on a few rows: TOAST-sized update payloads too.
UPDATE_TOASTY_BODY = (
    "UPDATE toasty SET body = md5(body) || body WHERE id BETWEEN %(lo)s AND %(hi)s AND id %% 4 = 0"
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (any user's: /proc/<pid>/stat is public)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_children_cpu(pid: int) -> float:
    """CPU seconds of a process's exited, reaped children (cutime + cstime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def postmaster_pid(src: Any) -> int:
    """The server's postmaster (its data directory's postmaster.pid, first line)."""
    (data_dir,) = src._query("data directory", "SHOW data_directory")[0]
    return int(Path(data_dir, "postmaster.pid").read_text().split()[0])


def proc_status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """All live descendants of pid (via /proc/<pid>/task/*/children)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


# -- the backlog ----------------------------------------------------------------------------


def setup(pub: LocalPostgres, sub: LocalPostgres | None) -> str:
    """Tables, publication and the two slots on the publisher; the disabled subscription."""
    dsn = pub.create_database(DATABASE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
        # Back to back, no write in between: both slots start at the same point.
        conn.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
        if sub is not None:
            conn.execute(f"SELECT pg_create_logical_replication_slot('{NATIVE_SLOT}', 'pgoutput')")
    if sub is not None:
        sub_dsn = sub.create_database(DATABASE)
        with psycopg.connect(sub_dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute(
                f"CREATE SUBSCRIPTION {SUBSCRIPTION} CONNECTION "
                f"'host=127.0.0.1 port={pub.port} user={pub.superuser} dbname={DATABASE}' "
                f"PUBLICATION {PUBLICATION} WITH (create_slot = false, slot_name = "
                f"'{NATIVE_SLOT}', copy_data = false, enabled = false)"
            )
    return dsn


def workload(dsn: str, changes: int, txn_rows: int) -> dict[str, Any]:
    """About ``changes`` row changes; returns the target LSN and what was written."""
    toast_rows = max(4, txn_rows // 50)
    per_cycle = txn_rows * 2 + txn_rows // 2 + toast_rows * 2 + toast_rows // 4
    cycles = max(1, -(-changes // per_cycle))
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for c in range(cycles):
            lo, hi = c * txn_rows + 1, (c + 1) * txn_rows
            conn.execute(INSERT_MIXED, {"lo": lo, "hi": hi})
            conn.execute(UPDATE_MIXED, {"lo": lo, "hi": hi})
            conn.execute(DELETE_MIXED, {"lo": lo, "hi": lo + txn_rows // 2 - 1})
            tlo, thi = c * toast_rows + 1, (c + 1) * toast_rows
            with conn.transaction():
                conn.execute(INSERT_TOASTY, {"lo": tlo, "hi": thi})
            with conn.transaction():
                conn.execute(UPDATE_TOASTY_N, {"lo": tlo, "hi": thi})
                conn.execute(UPDATE_TOASTY_BODY, {"lo": tlo, "hi": thi})
            if c % 20 == 19:
                log(f"workload: {c + 1}/{cycles} cycles")
        # synchronous_commit = on in the throwaway cluster: the last commit is flushed.
        target = Lsn.parse(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])  # type: ignore[index]
        counts = {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }
        server_version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        wal = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), restart_lsn)::int8"
            " FROM pg_replication_slots WHERE slot_name = %s",
            (SLOT,),
        ).fetchone()[0]  # type: ignore[index]
    seconds = time.monotonic() - started
    log(f"workload: {cycles} cycles in {seconds:.1f}s, target {target}, {wal / 1e6:.0f} MB of WAL")
    return {
        "cycles": cycles,
        "changes_written": cycles * per_cycle,
        "seconds": round(seconds, 1),
        "target_lsn": str(target),
        "wal_bytes": int(wal),
        "row_counts": counts,
        "server_version": server_version,
    }


# -- (a) floor and (b) pull ------------------------------------------------------------------


def source(dsn: str, **kw: Any) -> Any:
    from slotlake.config import SourceConfig
    from slotlake.source import SlotSource

    # What `slotlake sync` builds by default: a pull over 64 MiB of WAL is cut in two.
    kw.setdefault("split_bytes", int(SourceConfig().split_peek_mb * 1024 * 1024))
    return SlotSource(dsn, SLOT, [PUBLICATION], **kw)


def measure_split_floor(dsn: str, target: Lsn) -> dict[str, Any]:
    """count(*) over the two halves the split pull peeks, at once: the server's own time
    for the work a split pull asks of it (the copy, its fast-forward, both decodings)."""
    with source(dsn) as src:
        info = src.slot_info()
        assert info is not None and info.confirmed_flush_lsn is not None
        mid = src.split_point(info.confirmed_flush_lsn, target)
        opts = ", ".join(f"'{o}'" for o in src.peek_options())
    if mid is None:
        return {}
    copy = f"{SLOT}_floor_copy"
    counts: dict[str, int] = {}

    def half(name: str, statements: list[str]) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                row = conn.execute(statement).fetchone()
            counts[name] = int(row[0])  # type: ignore[index]

    first = [
        f"SELECT count(*) FROM pg_logical_slot_peek_binary_changes('{SLOT}', '{mid}', NULL, {opts})"
    ]
    second = [
        f"SELECT pg_copy_logical_replication_slot('{SLOT}', '{copy}', true)::text",
        f"SELECT pg_replication_slot_advance('{copy}', '{mid}')::text",
        f"SELECT count(*) FROM pg_logical_slot_peek_binary_changes('{copy}', '{target}', NULL, {opts})",
    ]
    la = loadavg()
    t0 = time.monotonic()
    threads = [threading.Thread(target=half, args=a) for a in (("1", first), ("2", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    log(
        f"(a2) split floor: {counts['1']:,} + {counts['2']:,} rows at once in {wall:.2f}s (cut {mid})"
    )
    return {
        "rows": counts["1"] + counts["2"],
        "wall_s": round(wall, 3),
        "cut": str(mid),
        "loadavg": la,
    }


def measure_floor(dsn: str, target: Lsn) -> dict[str, Any]:
    with source(dsn) as src:
        pid = src._backend_pid()
        cpu0, la = proc_cpu(pid), loadavg()
        t0 = time.monotonic()
        rows = src.count_floor(target)
        wall = time.monotonic() - t0
        server_cpu = proc_cpu(pid) - cpu0
    log(f"(a) floor: {rows:,} rows in {wall:.2f}s (server CPU {server_cpu:.2f}s, load {la})")
    return {
        "rows": rows,
        "wall_s": round(wall, 3),
        "server_cpu_s": round(server_cpu, 3),
        "loadavg": la,
    }


def warm_up(workdir: Path) -> None:
    """Imports and first-use initialisation (pyarrow, Parquet, threads) outside the timings."""
    from slotlake.raw import RawWriter

    writer = RawWriter(workdir / "warm-up")
    writer.append([1], [1], [b"E"])
    writer.close()
    shutil.rmtree(workdir / "warm-up", ignore_errors=True)


def measure_pull(dsn: str, target: Lsn, workdir: Path, **source_kw: Any) -> dict[str, Any]:
    from slotlake.raw import RawWriter

    out = workdir / "pull"
    shutil.rmtree(out, ignore_errors=True)
    rss_before = proc_status_kb(os.getpid(), "VmRSS")
    sampler = Sampler(interval=0.1)
    sampler.phase = "pull"
    with source(dsn, **source_kw) as src:
        # The ADBC transport peeks on a connection of its own, whose backend has exited by
        # the end: its CPU is then in the postmaster's reaped-children time.
        pid, postmaster = src._backend_pid(), postmaster_pid(src)
        la = loadavg()
        cpu0, ccpu0 = proc_cpu(pid) + proc_children_cpu(postmaster), time.process_time()
        sampler.start()
        t0 = time.monotonic()
        result = src.pull(target, RawWriter(out))
        split_at = result.split_at
        wall = time.monotonic() - t0
        sampler.stop()
        client_cpu = time.process_time() - ccpu0
        time.sleep(0.2)  # the peek backend's exit reaped
        server_cpu = proc_cpu(pid) + proc_children_cpu(postmaster) - cpu0
    size = sum(f.stat().st_size for f in out.glob("*.parquet"))
    shutil.rmtree(out, ignore_errors=True)
    fig = {
        "messages": result.messages,
        "payload_bytes": result.bytes,
        "parquet_bytes": size,
        "wall_s": round(wall, 3),
        "client_cpu_s": round(client_cpu, 3),
        "server_cpu_s": round(server_cpu, 3),
        "messages_per_s": round(result.messages / wall),
        "mb_per_s": round(result.bytes / wall / 1e6, 1),
        "rss_before_mb": round(rss_before / 1024, 1),
        "peak_rss_mb": round(sampler.peak_self_by_phase.get("pull", 0) / 1024, 1),
        "loadavg": la,
        "split_at": None if split_at is None else str(split_at),
    }
    log(
        f"(b) pull{'' if split_at is None else ' in two peeks'}: {result.messages:,} messages, {result.bytes / 1e6:.0f} MB in {wall:.2f}s "
        f"(client CPU {client_cpu:.2f}s, server CPU {server_cpu:.2f}s, RSS {fig['rss_before_mb']}"
        f" → peak {fig['peak_rss_mb']} MB, load {la})"
    )
    return fig


# -- (c) the whole sync, in a subprocess -------------------------------------------------------


class Sampler:
    """Polls peak RSS and CPU of the Spark JVM and its Python workers while a sync runs."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.jvm_pid: int | None = None
        self.phase = "start"
        self.peak_self_by_phase: dict[str, int] = {}
        self.worker_hwm: dict[int, int] = {}
        self.worker_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        rss = proc_status_kb(os.getpid(), "VmRSS")
        self.peak_self_by_phase[self.phase] = max(self.peak_self_by_phase.get(self.phase, 0), rss)
        if self.jvm_pid is None:
            return
        for pid in descendants(self.jvm_pid):
            self.worker_hwm[pid] = max(self.worker_hwm.get(pid, 0), proc_status_kb(pid, "VmHWM"))
            self.worker_cpu[pid] = max(self.worker_cpu.get(pid, 0.0), proc_cpu(pid))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


def sync_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process so that ru_maxrss is this run's peak alone."""
    from slotlake.config import Config, LakeConfig, SourceConfig
    from slotlake.memory import prefer_jemalloc
    from slotlake.spark import build_session
    from slotlake.sync import run_sync

    prefer_jemalloc()  # as `slotlake sync` does

    if os.environ.get("SLOTLAKE_BENCH_DEBUG"):
        # Each table's steps with their seconds and Spark jobs (slotlake.batch's _Steps).
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("slotlake").setLevel(logging.DEBUG)
    sampler = Sampler().start()
    cfg = Config(
        source=SourceConfig(dsn=spec["dsn"], slot=SLOT, publications=[PUBLICATION]),
        lake=LakeConfig(path=spec["lake"]),
    )
    for setting in spec.get("lake_set") or []:
        key, _, value = setting.partition("=")
        setattr(cfg.lake, key, int(value) if value.lstrip("-").isdigit() else value)
    la = loadavg()
    cpu0 = time.process_time()
    t0 = time.monotonic()
    sampler.phase = "spark_start"
    spark = build_session("slotlake-sync-bench", cfg.spark)
    spark_start = time.monotonic() - t0
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    sampler.jvm_pid = jvm_pid
    jvm_cpu0 = proc_cpu(jvm_pid)

    steps: list[tuple[float, str]] = []

    def partial(signum: int, frame: object) -> None:
        # Stopped by the parent's timeout: report what was seen so far, then go.
        sampler.sample()
        print(
            json.dumps(
                {
                    "partial": True,
                    "progress": [(round(t, 1), m) for t, m in steps],
                    "driver_python_peak_rss_by_phase_mb": {
                        k: round(v / 1024, 1) for k, v in sampler.peak_self_by_phase.items()
                    },
                    "jvm_peak_rss_mb": round(proc_status_kb(jvm_pid, "VmHWM") / 1024, 1),
                    "jvm_cpu_s": round(proc_cpu(jvm_pid) - jvm_cpu0, 1),
                    "python_worker_peak_rss_mb": round(
                        max(sampler.worker_hwm.values(), default=0) / 1024, 1
                    ),
                    "python_workers_cpu_s": round(sum(sampler.worker_cpu.values()), 1),
                }
            ),
            flush=True,
        )
        os.kill(jvm_pid, signal.SIGKILL)
        os._exit(3)

    signal.signal(signal.SIGTERM, partial)

    def progress(msg: str) -> None:
        steps.append((time.monotonic() - t0, msg))
        print(msg, file=sys.stderr, flush=True)

    # The memory phases follow the pull exactly (progress messages do not mark its end).
    from slotlake.source import SlotSource

    plain_pull = SlotSource.pull

    def pull(self: SlotSource, *args: Any, **kwargs: Any) -> Any:
        sampler.phase = "pull"
        try:
            return plain_pull(self, *args, **kwargs)
        finally:
            sampler.phase = "spark"

    SlotSource.pull = pull  # type: ignore[method-assign]

    sampler.phase = "reconcile"
    result = run_sync(cfg, target_lsn=Lsn.parse(spec["target"]), spark=spark, progress=progress)
    total = time.monotonic() - t0
    sampler.stop()
    jvm_hwm = proc_status_kb(jvm_pid, "VmHWM")
    jvm_cpu = proc_cpu(jvm_pid) - jvm_cpu0
    spark.stop()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lake = Path(spec["lake"])
    return {
        "status": result.status,
        "messages": result.messages,
        "tables": {k: list(v) for k, v in result.tables.items()},
        "spark_start_s": round(spark_start, 2),
        "timings_s": {k: round(v, 2) for k, v in result.timings.items()},
        "wall_with_spark_start_s": round(total, 2),
        "driver_python_cpu_s": round(time.process_time() - cpu0, 2),
        "driver_python_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "driver_python_peak_rss_by_phase_mb": {
            k: round(v / 1024, 1) for k, v in sampler.peak_self_by_phase.items()
        },
        "jvm_peak_rss_mb": round(jvm_hwm / 1024, 1),
        "jvm_cpu_s": round(jvm_cpu, 1),
        "python_workers": len(sampler.worker_hwm),
        "python_worker_peak_rss_mb": round(max(sampler.worker_hwm.values(), default=0) / 1024, 1),
        "python_workers_cpu_s": round(sum(sampler.worker_cpu.values()), 1),
        "lake_bytes": sum(f.stat().st_size for f in lake.rglob("*") if f.is_file()),
        "loadavg_start": la,
        "loadavg_end": loadavg(),
    }


def measure_sync(
    dsn: str, target: Lsn, workdir: Path, timeout: float, lake_set: list[str] | None = None
) -> dict[str, Any]:
    lake = workdir / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    spec = {"dsn": dsn, "target": str(target), "lake": str(lake), "lake_set": lake_set}
    t0 = time.monotonic()
    fig: dict[str, Any] = {}
    with subprocess.Popen(
        [sys.executable, __file__, "--sync-child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The other steps still run: a slow sync is a figure too, with what it got to.
            proc.send_signal(signal.SIGTERM)
            stdout, _ = proc.communicate(timeout=120)
            lines = stdout.strip().splitlines()
            fig = json.loads(lines[-1]) if lines else {"partial": True}
            if fig.get("partial"):
                log(f"(c) sync: not finished after {timeout:.0f}s; stopped")
                fig.update(error=f"not finished within {timeout:.0f}s", loadavg_end=loadavg())
                return fig
            # It finished just as the time ran out: a complete result.
    wall = time.monotonic() - t0
    if proc.returncode != 0 and not fig:
        log(f"(c) sync: child failed (exit {proc.returncode})")
        return {"error": f"exit {proc.returncode}", "loadavg_end": loadavg()}
    fig = fig or json.loads(stdout.strip().splitlines()[-1])
    fig["process_wall_s"] = round(wall, 2)
    shutil.rmtree(lake, ignore_errors=True)
    log(
        f"(c) sync: {fig['timings_s'].get('total')}s run_sync + {fig['spark_start_s']}s Spark start; "
        f"Python driver peak {fig['driver_python_peak_rss_mb']} MB, JVM peak {fig['jvm_peak_rss_mb']} MB"
    )
    return fig


# -- (d) the native subscriber ---------------------------------------------------------------


def measure_native(
    pub_dsn: str, sub_dsn: str, target: Lsn, expected: dict[str, int], timeout: float
) -> dict[str, Any]:
    with (
        psycopg.connect(pub_dsn, autocommit=True) as pconn,
        psycopg.connect(sub_dsn, autocommit=True) as sconn,
    ):
        la = loadavg()
        t0 = time.monotonic()
        sconn.execute(f"ALTER SUBSCRIPTION {SUBSCRIPTION} ENABLE")
        walsender = apply_pid = None
        ws_cpu = ap_cpu = 0.0
        started_at = None
        while True:
            row = pconn.execute(
                "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (NATIVE_SLOT,),
            ).fetchone()
            assert row is not None
            if row[1] is not None:
                walsender = row[1]
                started_at = started_at or time.monotonic() - t0
                ws_cpu = proc_cpu(walsender) or ws_cpu
            if apply_pid is None:
                r = sconn.execute(
                    "SELECT pid FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT NULL",
                    (SUBSCRIPTION,),
                ).fetchone()
                apply_pid = r[0] if r else None
            if apply_pid is not None:
                ap_cpu = proc_cpu(apply_pid) or ap_cpu
            if row[0] is not None and Lsn.parse(row[0]) >= target:
                break
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"native subscriber did not catch up within {timeout}s")
            time.sleep(0.1)
        wall = time.monotonic() - t0
        counts = {
            t: int(sconn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }
        sconn.execute(f"ALTER SUBSCRIPTION {SUBSCRIPTION} DISABLE")
    log(
        f"(d) native: caught up in {wall:.2f}s (walsender CPU {ws_cpu:.2f}s, apply CPU "
        f"{ap_cpu:.2f}s, load {la}); counts {counts} vs {expected}"
    )
    return {
        "wall_s": round(wall, 3),
        "walsender_started_s": round(started_at or 0.0, 3),
        "walsender_cpu_s": round(ws_cpu, 3),
        "apply_worker_cpu_s": round(ap_cpu, 3),
        "row_counts": counts,
        "row_counts_match": counts == expected,
        "loadavg": la,
    }


# -- driver ------------------------------------------------------------------------------------


@contextmanager
def clusters(version: int, native: bool) -> Iterator[tuple[LocalPostgres, LocalPostgres | None]]:
    pub = LocalPostgres(version=version).start()
    sub = LocalPostgres(version=version).start() if native else None
    try:
        yield pub, sub
    finally:
        if sub is not None:
            sub.stop()
        pub.stop()


def print_table(res: dict[str, Any]) -> None:
    w = res["workload"]
    print(
        f"\nPostgreSQL {w['server_version']}, {res['floor']['rows'] if 'floor' in res else '?'} "
        f"peek rows from {w['changes_written']:,} row changes ({w['cycles']} cycles), "
        f"{w['wal_bytes'] / 1e6:.0f} MB of WAL, target {w['target_lsn']}"
    )
    print(f"{'step':<34} {'wall s':>9} {'CPU s':>16} {'load avg (1/5/15)':>20}")

    def row(name: str, wall: float | None, cpu: str, la: str) -> None:
        print(f"{name:<34} {'' if wall is None else f'{wall:9.2f}':>9} {cpu:>16} {la:>20}")

    floors = res.get("floors", [res["floor"]] if "floor" in res else [])
    for f in floors:
        row("(a) floor count(*)", f["wall_s"], f"srv {f['server_cpu_s']:.2f}", f["loadavg"])
    for f in res.get("split_floors", []):
        row(f"(a2) split floor, cut {f['cut']}", f["wall_s"], "", f["loadavg"])
    pulls = res.get("pulls", [])
    for i, p in enumerate(pulls + res.get("pulls_one_peek", [])):
        # Against the floor measured just before this round's pulls.
        k = i % len(pulls) if pulls else 0
        ratio = p["wall_s"] / floors[min(k, len(floors) - 1)]["wall_s"] if floors else float("nan")
        label = "two peeks" if p.get("split_at") else "one peek"
        row(
            f"(b) pull #{i + 1}, {label} ({ratio:.2f}× floor)",
            p["wall_s"],
            f"cli {p['client_cpu_s']:.2f} srv {p['server_cpu_s']:.2f}",
            p["loadavg"],
        )
        print(
            f"{'':<6}{p['messages_per_s']:,} msg/s, {p['mb_per_s']} MB/s, "
            f"Parquet {p['parquet_bytes'] / 1e6:.0f} MB, RSS {p['rss_before_mb']} → peak "
            f"{p['peak_rss_mb']} MB"
        )
    if "sync" in res and "error" in res["sync"]:
        s = res["sync"]
        row(f"(c) sync: {s['error']}", None, "", s["loadavg_end"])
        for t, msg in s.get("progress", []):
            print(f"{'':<6}at {t:8.1f}s: {msg}")
        if "jvm_peak_rss_mb" in s:
            print(
                f"{'':<6}peak RSS so far: Python driver {s['driver_python_peak_rss_by_phase_mb']}"
                f" MB, Spark JVM {s['jvm_peak_rss_mb']} MB, Python worker "
                f"{s['python_worker_peak_rss_mb']} MB"
            )
    elif "sync" in res:
        s = res["sync"]
        row("(c) Spark session start", s["spark_start_s"], "", s["loadavg_start"])
        for k, v in s["timings_s"].items():
            row(f"(c)   {k}", v, "", "")
        row(
            "(c) whole sync incl. Spark start",
            s["wall_with_spark_start_s"],
            f"py {s['driver_python_cpu_s']:.0f} jvm {s['jvm_cpu_s']:.0f}",
            s["loadavg_end"],
        )
        print(
            f"{'':<6}peak RSS: Python driver {s['driver_python_peak_rss_mb']} MB "
            f"(by phase {s['driver_python_peak_rss_by_phase_mb']}), Spark JVM "
            f"{s['jvm_peak_rss_mb']} MB, Python worker {s['python_worker_peak_rss_mb']} MB "
            f"({s['python_workers']} workers, {s['python_workers_cpu_s']} CPU s)"
        )
    if "native" in res:
        n = res["native"]
        row(
            "(d) native subscriber catch-up",
            n["wall_s"],
            f"ws {n['walsender_cpu_s']:.1f} ap {n['apply_worker_cpu_s']:.1f}",
            n["loadavg"],
        )
        print(f"{'':<6}row counts match the publisher: {n['row_counts_match']}")
    for k, v in res.get("targets", {}).items():
        print(f"target {k}: {v}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps = set(args.steps.split(","))
    res: dict[str, Any] = {
        "pg_version": args.version,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "args": {"changes": args.changes, "txn_rows": args.txn_rows, "steps": args.steps},
    }
    workdir = Path(tempfile.mkdtemp(prefix="slotlake-syncbench-"))
    os.chmod(workdir, 0o755)
    try:
        with clusters(args.version, "d" in steps) as (pub, sub):
            dsn = setup(pub, sub)
            res["workload"] = w = workload(dsn, args.changes, args.txn_rows)
            target = Lsn.parse(w["target_lsn"])
            if "a" in steps:
                res["floor"] = measure_floor(dsn, target)
            if "b" in steps:
                warm_up(workdir)
                res["pulls"], res["pulls_one_peek"], res["split_floors"] = [], [], []
                for i in range(args.pull_repeat):
                    if i and "a" in steps:
                        # Alternate with the floor, so a change in machine load shows in both.
                        res.setdefault("floors", [res["floor"]]).append(measure_floor(dsn, target))
                    if split := measure_split_floor(dsn, target):
                        res["split_floors"].append(split)
                    res["pulls"].append(measure_pull(dsn, target, workdir))
                    one = measure_pull(dsn, target, workdir, split_bytes=None)
                    res["pulls_one_peek"].append(one)
            if "c" in steps:
                res["sync"] = measure_sync(dsn, target, workdir, args.sync_timeout, args.lake_set)
            if "d" in steps and sub is not None:
                res["native"] = measure_native(
                    dsn, sub.dsn(DATABASE), target, w["row_counts"], args.native_timeout
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    targets: dict[str, Any] = {}
    if "floor" in res and res.get("pulls"):
        floor = min(f["wall_s"] for f in res.get("floors", [res["floor"]]))
        best = min(p["wall_s"] for p in res["pulls"])
        one = min(p["wall_s"] for p in res["pulls_one_peek"])
        targets["pull <= 1.5x floor (issue 9)"] = (
            f"{best / floor:.2f}x (best pull / best floor; one peek: {one / floor:.2f}x)"
        )
        if res.get("split_floors"):
            split = min(f["wall_s"] for f in res["split_floors"])
            targets["pull against the split floor"] = f"{best / split:.2f}x ({split:.2f}s)"
    if "sync" in res and "native" in res and "error" not in res["sync"]:
        s, n = res["sync"]["timings_s"]["total"], res["native"]["wall_s"]
        targets["sync <= 2x native (goal: faster)"] = f"{s:.1f}s vs {n:.1f}s ({s / n:.2f}x)"
    res["targets"] = targets
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", type=int, default=16, help="PostgreSQL major (15 or 16)")
    parser.add_argument("--changes", type=int, default=1_000_000, help="row changes (≈)")
    parser.add_argument("--txn-rows", type=int, default=10_000, help="rows per transaction")
    parser.add_argument(
        "--steps", default="a,b,c,d", help="which of a (floor), b (pull), c (sync), d (native)"
    )
    parser.add_argument(
        "--pull-repeat", type=int, default=1, help="pulls (alternating with floors)"
    )
    parser.add_argument("--sync-timeout", type=float, default=7200.0, help="seconds")
    parser.add_argument("--native-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON ('-' = stdout)")
    parser.add_argument(
        "--lake",
        dest="lake_set",
        action="append",
        metavar="KEY=VALUE",
        help="a [lake] setting for the sync, e.g. driver_write_rows=2000000 (repeatable)",
    )
    parser.add_argument("--sync-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sync_child:
        print(json.dumps(sync_child(json.loads(args.sync_child))), flush=True)
        return 0
    res = run(args)
    print_table(res)
    if args.json:
        text = json.dumps(res, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
