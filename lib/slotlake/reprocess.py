"""Reprocessing: rebuild committed batches from their raw Parquet alone.

No PostgreSQL connection and no slot: each batch of FIRST..LAST is decoded again by
:func:`slotlake.batch.process_batch` (the code sync runs), starting from the state the
source lake committed before FIRST, or from nothing.

Two modes:

* **into a new root** (``output``): the new lake gets commit records with the same batch
  numbers and LSNs (``kind = "reprocess"``). Raw directories and the prior state are
  hard-linked (copied across file systems) so the new root is self-contained: it can be
  read, reprocessed again, or take over from the old root. A run that failed part-way
  resumes: an output root whose last commit is FIRST-1 continues from that commit.
* **in place** (``in_place``): batch by batch, outputs are written under a new attempt id
  and the batch's commit record is swapped atomically (:meth:`Lake.replace_commit`), so a
  reader sees every batch either wholly old or wholly new. The range must end at the
  newest commit (later batches were built on the old states), and sync must not run on
  the lake meanwhile: without PostgreSQL there is no advisory lock to take (give both
  Airflow DAGs the same one-slot ``pool``). Directories that only the replaced records
  named are deleted at the end.

What must still be there: the raw directory of every batch in the range
(``lake.raw_retention_batches``) and, unless starting from nothing, the state version of
every table in force at batch FIRST-1 (``lake.state_versions`` keeps the version in force
plus K older ones per table, so a reprocess can start up to K batches back).

Every raw file is checked (footer, schema, row count against the commit record) before
anything is written; a file that fails to read or decode later is named in the error
with its batch, and the batch is not committed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slotlake.batch import process_batch
from slotlake.lake import (
    CHANGES,
    MESSAGES,
    STATE,
    TRANSACTIONS,
    CommitRecord,
    Lake,
    batch_dir_name,
    make_record,
    new_attempt,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_PART = re.compile(r"^part-(\d{5})\.parquet$")


class ReprocessError(RuntimeError):
    """Reprocessing refused or failed; the message names the batch (and file) and what to do."""


@dataclass
class ReprocessResult:
    output: str
    in_place: bool
    batches: list[int] = field(default_factory=list)
    from_batch_state: int | None = None  # the commit whose state the run started from
    tables: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)  # in place: directories replaced


def parse_range(text: str | None) -> tuple[int | None, int | None]:
    """``"3..7"``, ``"3.."``, ``"..7"`` or ``"5"`` → (first, last); None = open end."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d*)\s*(?:\.\.\s*(\d*))?\s*", text)
    if not m or (not m.group(1) and not m.group(2)):
        raise ValueError(f"--batches expects FIRST..LAST (e.g. 3..7, 3.., ..7 or 5), got {text!r}")
    first = int(m.group(1)) if m.group(1) else None
    if m.group(2) is None:
        return first, first
    last = int(m.group(2)) if m.group(2) else None
    if first is not None and last is not None and first > last:
        raise ValueError(f"--batches {text}: FIRST is after LAST")
    return first, last


# -- raw checks -----------------------------------------------------------------------------


def check_raw(lake: Lake, rec: CommitRecord) -> list[Path]:
    """The raw part files of a committed batch, after cheap checks (footers and row counts).

    Reads Parquet footers only, so a range of big batches is checked in seconds before
    the first one is written.
    """
    import pyarrow.parquet as pq

    from slotlake.raw import RAW_SCHEMA

    b = rec.batch
    if not rec.raw:
        raise ReprocessError(
            f"batch {b} ({rec.kind}) has no raw data to decode: start the range after it"
        )
    directory = lake.root / rec.raw
    if not directory.is_dir():
        raise ReprocessError(
            f"batch {b}: raw directory {directory} is missing (expired by "
            "lake.raw_retention_batches, or deleted): this batch cannot be reprocessed"
        )
    files = sorted(p for p in directory.iterdir() if _PART.match(p.name))
    for i, f in enumerate(files):
        if f.name != f"part-{i:05d}.parquet":
            missing = directory / f"part-{i:05d}.parquet"
            raise ReprocessError(f"batch {b}: raw file {missing} is missing")
    if not files:
        raise ReprocessError(
            f"batch {b}: raw file {directory / 'part-00000.parquet'} is missing "
            f"(the directory holds no part file)"
        )
    rows = 0
    expected_names = set(RAW_SCHEMA.names)
    for f in files:
        try:
            meta = pq.read_metadata(f)
            schema = pq.read_schema(f)
        except Exception as exc:
            raise ReprocessError(f"batch {b}: raw file {f} is corrupted: {exc}") from exc
        if not expected_names <= set(schema.names):
            raise ReprocessError(
                f"batch {b}: raw file {f} is not a raw batch file (columns {schema.names})"
            )
        rows += meta.num_rows
    if rows != rec.raw_messages:
        raise ReprocessError(
            f"batch {b}: raw files in {directory} hold {rows} messages but the commit record "
            f"says {rec.raw_messages}: the last raw file(s) after {files[-1].name} are missing "
            "or were replaced"
        )
    return files


def _diagnose(files: list[Path], batch: int, exc: BaseException) -> ReprocessError:
    """Turn a failure inside Spark into an error naming the raw file and the batch."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pq.read_table(f)
        except Exception as read_exc:
            return ReprocessError(f"batch {batch}: raw file {f} is corrupted: {read_exc}")
    text = str(exc)
    # A Python worker's error arrives inside Spark's message, traceback and all: the
    # "…RawDataError: batch …, seq …" line is the one that says what and where.
    raised = [
        ln.strip() for ln in text.splitlines() if re.search(r"(RawDataError|DecodeError): ", ln)
    ]
    if raised:
        detail = raised[-1]
    else:
        detail = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    m = re.search(r"\bseq (\d+)", detail)
    if m:
        seq = int(m.group(1))
        for f in files:
            seqs = pq.read_table(f, columns=["seq"]).column("seq")
            if len(seqs) and seqs[0].as_py() <= seq <= seqs[-1].as_py():
                return ReprocessError(f"batch {batch}: raw file {f}: {detail}")
    names = ", ".join(str(f) for f in files)
    return ReprocessError(f"batch {batch}: raw files {names}: {detail}")


# -- file system helpers --------------------------------------------------------------------


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link a directory's files into ``dst`` (copy where links are impossible)."""

    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, copy_function=link_or_copy)


def _attempt_dirs(lake: Lake, batch: int, attempt: str) -> list[Path]:
    name = batch_dir_name(batch, attempt)
    out = []
    for kind in (CHANGES, STATE):
        base = lake.root / kind
        if base.is_dir():
            out += [p / name for p in base.iterdir() if (p / name).exists()]
    out += [
        lake.root / k / name for k in (TRANSACTIONS, MESSAGES) if (lake.root / k / name).exists()
    ]
    return out


def _record_dirs(rec: CommitRecord) -> set[str]:
    out = {p for p in (rec.raw, rec.transactions, rec.messages) if p}
    for t in rec.tables.values():
        out |= {p for p in (t.changes, t.state) if p}
    return out


# -- the run ----------------------------------------------------------------------------------


def run_reprocess(
    source: str,
    output: str | None = None,
    first: int | None = None,
    last: int | None = None,
    in_place: bool = False,
    from_empty: bool = False,
    spark: SparkSession | None = None,
    spark_conf: dict[str, str] | None = None,
    progress: Callable[[str], None] = log.info,
) -> ReprocessResult:
    if "://" in str(source) or (output is not None and "://" in output):
        # The raw checks, hard links and cleanup below use the local file system.
        raise ReprocessError("reprocess works on local lake roots (plain paths) only for now")
    src = Lake(source)
    committed = src.commit_batches()
    if not committed:
        raise ReprocessError(f"lake {source} has no committed batch to reprocess")
    first = committed[0] if first is None else first
    last = committed[-1] if last is None else last
    missing = sorted(set(range(first, last + 1)) - set(committed))
    if missing:
        raise ReprocessError(
            f"batches {first}..{last}: batch {missing[0]} is not committed in {source} "
            f"(committed: {committed[0]}..{committed[-1]})"
        )
    if in_place == (output is not None):
        raise ReprocessError("give either an output root or in_place=True")
    if in_place:
        if last != committed[-1]:
            raise ReprocessError(
                f"in place, the range must end at the newest commit (batch {committed[-1]}): "
                f"batches after {last} were built on the states being replaced"
            )
        out = src
    else:
        assert output is not None
        out = Lake(output)
        if out.root.resolve() == src.root.resolve():
            raise ReprocessError("the output root is the source lake: use in_place instead")

    records = [src.read_commit(b) for b in range(first, last + 1)]
    # Every raw file of the range is checked before anything is written.
    raw_files = {rec.batch: check_raw(src, rec) for rec in records}

    prior: CommitRecord | None = None
    resumed = out.commit_batches() if not in_place else []
    if resumed:
        if resumed[-1] != first - 1 or from_empty:
            raise ReprocessError(
                f"output {out.uri} already holds batches {resumed[0]}..{resumed[-1]}: "
                f"use an empty root (or resume with FIRST = {resumed[-1] + 1})"
            )
        out.remove_uncommitted()
        prior = out.read_commit(first - 1)
        progress(f"resuming in {out.uri} after its batch {prior.batch}")
    elif not from_empty and first != committed[0]:
        prior = src.read_commit(first - 1)
        for name, t in prior.tables.items():
            if t.state and not (src.root / t.state).is_dir():
                raise ReprocessError(
                    f"the state of {name} in force before batch {first} ({src.root / t.state}) "
                    "has expired (lake.state_versions keeps the version in force plus that many "
                    f"older ones per table): start at an earlier batch, or pass --from-empty to "
                    "start from nothing"
                )
        if not in_place:
            if out.root.exists() and any(out.root.iterdir()):
                raise ReprocessError(f"output root {out.uri} is not empty")
            for t in prior.tables.values():
                if t.state:
                    _link_tree(src.root / t.state, out.root / t.state)
    elif not in_place and out.root.exists() and any(out.root.iterdir()):
        raise ReprocessError(f"output root {out.uri} is not empty")

    if spark is None:
        from slotlake.spark import build_session

        spark = build_session("slotlake-reprocess", spark_conf)

    result = ReprocessResult(
        output=out.uri,
        in_place=in_place,
        from_batch_state=prior.batch if prior else None,
    )
    replaced: list[CommitRecord] = []
    for rec in records:
        b = rec.batch
        t0 = time.monotonic()
        assert rec.raw is not None  # check_raw refused records without raw
        if not in_place:
            _link_tree(src.root / rec.raw, out.root / rec.raw)
        attempt = new_attempt()
        progress(f"reprocessing batch {b} ({rec.start_lsn}..{rec.end_lsn}) as attempt {attempt}")
        try:
            built = process_batch(spark, out, rec.raw, b, attempt, prior, progress=progress)
        except Exception as exc:
            for d in _attempt_dirs(out, b, attempt):
                shutil.rmtree(d, ignore_errors=True)
            if not in_place:
                shutil.rmtree(out.root / rec.raw, ignore_errors=True)
            raise _diagnose(raw_files[b], b, exc) from exc
        record = make_record(
            batch=b,
            attempt=attempt,
            slot=rec.slot,
            start_lsn=rec.start_lsn,
            end_lsn=rec.end_lsn,
            target_lsn=rec.target_lsn,
            raw=rec.raw,
            raw_messages=rec.raw_messages,
            raw_bytes=rec.raw_bytes,
            transactions=built.transactions,
            messages=built.messages,
            transaction_count=built.transaction_count,
            tables=built.tables,
            timings={"reprocess": round(time.monotonic() - t0, 3)},
            kind="reprocess",
        )
        if in_place:
            replaced.append(out.replace_commit(record))
        else:
            out.write_commit(record)
        prior = record
        result.batches.append(b)
        result.tables[b] = {
            n: (t.change_rows, t.state_rows) for n, t in built.tables.items() if t.changes
        }
        progress(f"batch {b} reprocessed and committed ({time.monotonic() - t0:.1f}s)")
    if in_place:
        # Only now: until the last swap, later old records still named these directories.
        still = out.referenced_dirs()
        for old in replaced:
            for rel in sorted(_record_dirs(old) - still):
                shutil.rmtree(out.root / rel, ignore_errors=True)
                result.removed.append(rel)
    return result


__all__ = ["ReprocessError", "ReprocessResult", "check_raw", "parse_range", "run_reprocess"]
