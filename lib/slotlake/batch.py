"""One batch, from its raw Parquet to per-table change logs and state versions.

Used by sync (right after the pull) and by reprocessing (from retained raw alone): it
reads raw Parquet and earlier commit records, writes new directories under the lake,
and returns what a commit record needs. It never talks to PostgreSQL and never commits.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotlake.catalog import TableCatalog
from slotlake.decode import (
    META_COLUMNS,
    BatchCatalog,
    RawDataError,
    RawScan,
    collect_catalog,
    decode_table,
    raw_dml,
    scan_raw,
    spark_schema_ddl,
)
from slotlake.lake import (
    CHANGES,
    MESSAGES,
    STATE,
    TRANSACTIONS,
    CommitRecord,
    Lake,
    TableCommit,
    local_path,
)
from slotlake.state import (
    align_prior,
    empty_state,
    fill_and_merge_keyed,
    merge_multiset,
    state_schema_ddl,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RESERVED = {n for n, _ in META_COLUMNS} | {
    "_old",
    "_seq",
    "_unchanged",
    "_k",
    "_kind",
    "_gid",
    "_bucket",
}


SINGLE_FILE_ROWS = 2_000_000


class SchemaCollisionError(RuntimeError):
    pass


@dataclass
class BatchOutput:
    tables: dict[str, TableCommit]
    transactions: str | None
    messages: str | None
    transaction_count: int
    timings: dict[str, float] = field(default_factory=dict)


def _check_collisions(cat: TableCatalog) -> None:
    clash = sorted(n for n, _ in cat.columns if n in RESERVED)
    if clash:
        raise SchemaCollisionError(
            f"table {cat.name} has column(s) {', '.join(clash)} that collide with slotlake's "
            "metadata columns; rename them at the source or leave the table out of the publication"
        )


def prior_schemas(prior: CommitRecord | None) -> dict[str, list[tuple[str, str]]]:
    """State columns (name, ddl) of every table as of the previous commit."""
    if prior is None:
        return {}
    return {
        name: [(c[0], c[1]) for c in t.columns if len(c) > 2 and c[2] == "state"]
        for name, t in prior.tables.items()
    }


def _write(df: DataFrame, lake: Lake, rel: str) -> int:
    df.write.mode("errorifexists").option("compression", "zstd").parquet(lake.path(rel))
    if lake.local or lake.uri.startswith("file://"):
        return parquet_rows(str(local_path(lake.path(rel))))
    return df.sparkSession.read.parquet(lake.path(rel)).count()


def parquet_rows(directory: str) -> int:
    """Rows of the Parquet files of a directory, from their footers (no Spark job)."""
    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(p).metadata.num_rows for p in sorted(Path(directory).glob("*.parquet"))
    )


def _markers(
    spark: SparkSession, cat: TableCatalog, bcat: BatchCatalog, batch: int
) -> DataFrame | None:
    from pyspark.sql.types import StructType

    from slotlake.decode import WORK_COLUMNS

    truncs = [t for t in bcat.truncates if cat.name in t.tables]
    if not truncs:
        return None
    rows = [
        {
            "_op": "T",
            "_commit_lsn": t.commit_lsn,
            "_lsn": None,
            "_tx_ordinal": t.tx_ordinal,
            "_xid": t.xid,
            "_commit_ts": t.commit_ts,
            "_origin": bcat.origins.get(t.commit_lsn),
            "_batch": batch,
            "_old_kind": None,
            "_missing_toast": [],
            "_fallback": {},
            "_truncate_options": t.options,
            "_seq": t.seq,
            "_unchanged": [],
            "_old": None,
        }
        for t in truncs
    ]
    return spark.createDataFrame(
        rows, StructType.fromDDL(spark_schema_ddl(cat, META_COLUMNS + WORK_COLUMNS))
    )


def process_table(
    spark: SparkSession,
    lake: Lake,
    dml: DataFrame,
    cat: TableCatalog,
    bcat: BatchCatalog,
    prior: TableCommit | None,
    batch: int,
    attempt: str,
    expected_rows: int,
) -> TableCommit:
    from pyspark.sql import functions as F

    _check_collisions(cat)
    events = decode_table(dml, cat, bcat, batch)
    if prior is not None and prior.state:
        prior_df = align_prior(spark.read.parquet(lake.path(prior.state)), cat)
    else:
        prior_df = empty_state(spark, cat)
    truncs = sorted((t.commit_lsn, t.tx_ordinal) for t in bcat.truncates if cat.name in t.tables)
    if cat.is_multiset:
        changes = events.withColumn("_missing_toast", F.col("_unchanged"))
        state = merge_multiset(events, prior_df, cat, truncs)
    else:
        changes, state = fill_and_merge_keyed(events, prior_df, cat, truncs, expected_rows)
    markers = _markers(spark, cat, bcat, batch)
    if markers is not None:
        changes = changes.unionByName(markers.select(*changes.columns))
    changes = changes.drop("_seq", "_unchanged")
    # One sorted file for an ordinary batch; a range sort (a sampling pass more) for big ones.
    if expected_rows < SINGLE_FILE_ROWS:
        # repartition, not coalesce: coalesce(1) would pull the replay upstream into one task.
        changes = changes.repartition(1).sortWithinPartitions("_commit_lsn", "_tx_ordinal")
    else:
        changes = changes.orderBy("_commit_lsn", "_tx_ordinal")
    changes_rel = lake.batch_path(CHANGES, batch, attempt, cat.name)
    state_rel = lake.batch_path(STATE, batch, attempt, cat.name)
    change_rows = _write(changes, lake, changes_rel)
    state_rows = _write(
        state.select(*[f"`{c}`" for c in cat.state_columns], "_fallback", "_missing_toast"),
        lake,
        state_rel,
    )
    spark.catalog.clearCache()
    state_set = set(cat.state_columns)
    return TableCommit(
        changes=changes_rel,
        state=state_rel,
        change_rows=change_rows,
        state_rows=state_rows,
        columns=[[n, t, "state" if n in state_set else "log"] for n, t in cat.columns],
        key_columns=list(cat.key_columns),
        replica_identity=cat.replica_identity,
        renames=dict(cat.renames),
    )


def _transactions(raw: DataFrame, bcat: BatchCatalog, batch: int) -> DataFrame:
    from pyspark.sql import functions as F

    from slotlake.pgoutput import Commit, StreamCommit, decode

    origins = bcat.origins
    schema = "commit_lsn bigint, end_lsn bigint, commit_ts timestamp, xid bigint, origin string, streamed boolean, _batch bigint"

    def fn(batches):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        from slotlake.lsn import Lsn
        from slotlake.pgoutput import pg_timestamp_to_datetime

        for rb in batches:
            out: dict[str, list] = {
                k: []
                for k in (
                    "commit_lsn",
                    "end_lsn",
                    "commit_ts",
                    "xid",
                    "origin",
                    "streamed",
                    "_batch",
                )
            }
            for data, xid in zip(
                rb.column("data").to_pylist(), rb.column("xid").to_pylist(), strict=True
            ):
                msg = decode(data)
                if isinstance(msg, StreamCommit):
                    xid = msg.xid
                elif not isinstance(msg, Commit):
                    continue
                commit_lsn = Lsn(msg.commit_lsn).to_signed()
                out["commit_lsn"].append(commit_lsn)
                out["end_lsn"].append(Lsn(msg.end_lsn).to_signed())
                out["commit_ts"].append(pg_timestamp_to_datetime(msg.commit_ts))
                out["xid"].append(xid)
                out["origin"].append(origins.get(commit_lsn))
                out["streamed"].append(isinstance(msg, StreamCommit))
                out["_batch"].append(batch)
            yield pa.RecordBatch.from_pydict(
                out,
                schema=pa.schema(
                    [
                        ("commit_lsn", pa.int64()),
                        ("end_lsn", pa.int64()),
                        ("commit_ts", pa.timestamp("us", tz="UTC")),
                        ("xid", pa.int64()),
                        ("origin", pa.string()),
                        ("streamed", pa.bool_()),
                        ("_batch", pa.int64()),
                    ]
                ),
            )

    return raw.filter(F.col("msg_type").isin("C", "c")).select("data", "xid").mapInArrow(fn, schema)


def _messages(raw: DataFrame, bcat: BatchCatalog, batch: int) -> DataFrame:
    from pyspark.sql import functions as F

    from slotlake.pgoutput import decode

    streams = bcat.streams
    schema = (
        "lsn bigint, transactional boolean, prefix string, content binary, "
        "commit_lsn bigint, tx_ordinal bigint, xid bigint, _batch bigint"
    )

    def fn(batches):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        from slotlake.lsn import Lsn

        names = (
            "lsn",
            "transactional",
            "prefix",
            "content",
            "commit_lsn",
            "tx_ordinal",
            "xid",
            "_batch",
        )
        for rb in batches:
            out: dict[str, list] = {k: [] for k in names}
            for row in rb.to_pylist():
                in_stream = row["stream_xid"] is not None
                msg = decode(row["data"], in_stream=in_stream)
                commit_lsn = row["commit_lsn"]
                if in_stream and msg.transactional:
                    # Unlike DML, pgoutput stamps a streamed message with the top-level xid
                    # even inside a subtransaction, so a message emitted in a savepoint that
                    # is rolled back after it was streamed cannot be told apart and is kept
                    # (a protocol limit; PostgreSQL's own subscriber ignores messages).
                    outcome = streams.commits.get(row["stream_xid"])
                    if outcome is None or (row["stream_xid"], msg.xid) in streams.aborted_subxacts:
                        continue
                    commit_lsn = Lsn(outcome[0]).to_signed()
                out["lsn"].append(Lsn(msg.lsn).to_signed())
                out["transactional"].append(msg.transactional)
                out["prefix"].append(msg.prefix)
                out["content"].append(msg.content)
                out["commit_lsn"].append(commit_lsn if msg.transactional else None)
                out["tx_ordinal"].append(row["tx_ordinal"] if msg.transactional else None)
                out["xid"].append(row["stream_xid"] if in_stream else row["xid"])
                out["_batch"].append(batch)
            yield pa.RecordBatch.from_pydict(
                out,
                schema=pa.schema(
                    [
                        ("lsn", pa.int64()),
                        ("transactional", pa.bool_()),
                        ("prefix", pa.string()),
                        ("content", pa.binary()),
                        ("commit_lsn", pa.int64()),
                        ("tx_ordinal", pa.int64()),
                        ("xid", pa.int64()),
                        ("_batch", pa.int64()),
                    ]
                ),
            )

    return (
        raw.filter(F.col("msg_type") == "M")
        .select("data", "stream_xid", "commit_lsn", "tx_ordinal", "xid")
        .mapInArrow(fn, schema)
    )


def _scan(lake: Lake, raw_rel: str, raw_local: str | None) -> RawScan:
    """Scan the raw batch on the driver: its local copy, or a download of it."""
    if not lake.exists(raw_rel):
        raise RawDataError(f"raw directory {lake.path(raw_rel)} is missing")
    if raw_local is not None:
        return scan_raw(raw_local)
    if lake.local or lake.uri.startswith("file://"):
        return scan_raw(str(local_path(lake.path(raw_rel))))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slotlake-raw-") as tmp:
        local = str(Path(tmp) / "raw")
        lake.fs.download_dir(lake.path(raw_rel), local)
        return scan_raw(local)


# The decoder's RawDataError raised on an executor reaches the driver as Spark's exception,
# whose text is the worker's Python traceback plus the JVM stack: hundreds of lines.
_EXECUTOR_RAW_ERROR = re.compile(r"slotlake\.decode\.RawDataError: ([^\n]+)")


def _raw_errors_in_one_line(fn: Callable[..., BatchOutput]) -> Callable[..., BatchOutput]:
    """A payload that does not decode, on the driver or an executor, raises RawDataError
    with one line naming batch, table, seq, LSN, the decoder's offset and the raw directory.
    """

    @functools.wraps(fn)
    def wrapper(
        spark: SparkSession, lake: Lake, raw_rel: str, *args: Any, **kwargs: Any
    ) -> BatchOutput:
        try:
            return fn(spark, lake, raw_rel, *args, **kwargs)
        except Exception as exc:
            # A failed batch must not leave its cached raw DML behind in a long-lived
            # session: a retry reading the same path would be served the stale cache.
            with contextlib.suppress(Exception):  # never hide the batch's error behind this
                spark.catalog.clearCache()
            if isinstance(exc, RawDataError):
                raise RawDataError(f"{exc} (raw {raw_rel})") from exc
            m = _EXECUTOR_RAW_ERROR.search(str(exc))
            if m is None:
                raise
            raise RawDataError(f"{m.group(1).strip()} (raw {raw_rel})") from exc

    return wrapper


@_raw_errors_in_one_line
def process_batch(
    spark: SparkSession,
    lake: Lake,
    raw_rel: str,
    batch: int,
    attempt: str,
    prior: CommitRecord | None,
    progress: Callable[[str], None] = log.info,
    fault: Callable[[str], None] = lambda step: None,
    raw_local: str | None = None,
) -> BatchOutput:
    """Decode one raw batch and write its outputs (not yet committed)."""

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    scan = _scan(lake, raw_rel, raw_local)
    bcat = collect_catalog(scan.catalog_rows, batch, prior_schemas(prior))
    counts, types_seen = scan.dml_counts, scan.types_seen
    timings["catalog"] = time.monotonic() - t0
    raw = spark.read.parquet(lake.path(raw_rel))
    prior_tables = dict(prior.tables) if prior else {}
    tables: dict[str, TableCommit] = {}
    dml = raw_dml(raw)
    busy = [
        c
        for c in bcat.tables.values()
        if any(counts.get(o) for o in c.oids) or any(c.name in t.tables for t in bcat.truncates)
    ]
    # No cache of the raw DML rows: each table re-reads the raw Parquet (columnar, cheap),
    # where a cache held every payload in the driver JVM and ran out of heap at 5M changes.
    fault("decode")
    for cat in sorted(busy, key=lambda c: c.name):
        t1 = time.monotonic()
        expected = sum(counts.get(o, 0) for o in cat.oids)
        tables[cat.name] = process_table(
            spark, lake, dml, cat, bcat, prior_tables.get(cat.name), batch, attempt, expected
        )
        timings[f"table:{cat.name}"] = time.monotonic() - t1
        progress(
            f"batch {batch}: {cat.name}: {tables[cat.name].change_rows} changes, "
            f"{tables[cat.name].state_rows} rows in state ({timings[f'table:{cat.name}']:.1f}s)"
        )
    fault("changes_written")
    for name, t in prior_tables.items():
        if name not in tables:
            tables[name] = TableCommit(
                changes=None,
                state=t.state,
                change_rows=0,
                state_rows=t.state_rows,
                columns=t.columns,
                key_columns=t.key_columns,
                replica_identity=t.replica_identity,
            )
    t2 = time.monotonic()
    tx_rel = lake.batch_path(TRANSACTIONS, batch, attempt)
    tx_count = _write(
        _transactions(raw, bcat, batch).repartition(1).sortWithinPartitions("commit_lsn"),
        lake,
        tx_rel,
    )
    msg_rel = None
    if "M" in types_seen:
        msg_rel = lake.batch_path(MESSAGES, batch, attempt)
        _write(
            _messages(raw, bcat, batch).repartition(1).sortWithinPartitions("lsn"), lake, msg_rel
        )
    timings["transactions"] = time.monotonic() - t2
    spark.catalog.clearCache()
    return BatchOutput(tables, tx_rel, msg_rel, tx_count, timings)


__all__ = ["BatchOutput", "process_batch", "state_schema_ddl"]
