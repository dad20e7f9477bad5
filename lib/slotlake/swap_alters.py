"""Names swapped between columns of a Delta table through Spark's ALTERs.

On a local lake the driver swaps names in one log entry that carries the batch's marker
(:func:`slotlake.delta.ensure_local`). A lake on HDFS or an object store has only Spark's
``ALTER TABLE … RENAME COLUMN``, one column per commit, and a swap needs three of them
(``a → tmp``, ``b → a``, ``tmp → b``): after a crash between them, names alone cannot
tell a rerun where it stopped, nor a swap done from one not begun.

Column mapping can: each column keeps its physical name whatever its name. So the swap
is planned as *physical name → final name*, and that plan is stored as a table property
(``slotlake.renames``, one commit, with the batch's marker) before the first rename. A
run whose table holds its batch's plan converges the names to it from wherever they are;
renaming a column to the name it already has is never asked, so a finished swap costs
nothing more. Only batches whose renames form a cycle come here.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from slotlake.delta_log import PHYSICAL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

PLAN_PROPERTY = "slotlake.renames"
TEMP_PREFIX = "__slotlake_swap_"


class SwapError(RuntimeError):
    """A plan that its table's columns cannot reach."""


def mapped_metadata(
    spark: SparkSession, path: str, version: int | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The table's schema as its log holds it (with the column mapping metadata that a
    DataFrame's schema leaves out, even read with ``versionAsOf``) and its properties, now
    or as of ``version``: from a snapshot in Spark's JVM, or, on a runtime without
    open-source Delta's classes (Databricks ships its own) or with a DeltaLog that lacks a
    method used here (another Delta release), from the log itself."""
    from py4j.protocol import Py4JError, Py4JJavaError

    from slotlake.delta import has_open_source_delta_log

    if has_open_source_delta_log(spark):
        try:
            return jvm_metadata(spark, path, version)
        except Py4JJavaError:
            raise  # Delta's own answer (no such version, say), not a missing method
        except Py4JError as exc:
            log.debug("metadata of %s read from its log: %s", path, exc)
    from slotlake import delta_log_hadoop

    schema, properties = delta_log_hadoop.metadata(spark, path, version)
    return json.loads(schema), properties


def jvm_metadata(
    spark: SparkSession, path: str, version: int | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`mapped_metadata` from a snapshot in Spark's JVM (open-source Delta's)."""
    from slotlake.delta import jvm_snapshot

    meta = jvm_snapshot(spark, path, version).metadata()
    conf = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(  # type: ignore[attr-defined]
        meta.configuration()
    )
    return json.loads(meta.schemaString()), {str(k): str(conf[k]) for k in conf}


def mapped_schema(spark: SparkSession, path: str, version: int | None = None) -> StructType:
    """The table's schema with its column mapping metadata, now or as of ``version``."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(mapped_metadata(spark, path, version)[0])


def levels(schema: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each level whose names a rename can move: ``""`` (the columns) and ``"_old"`` (a
    change log's old image) → physical name → name."""
    out: dict[str, dict[str, str]] = {"": {}}
    for field in schema["fields"]:
        out[""][field["metadata"][PHYSICAL]] = field["name"]
        kind = field["type"]
        if field["name"] == "_old" and isinstance(kind, dict) and kind.get("type") == "struct":
            out["_old"] = {f["metadata"][PHYSICAL]: f["name"] for f in kind["fields"]}
    return out


def plan(schema: dict[str, Any], renames: dict[str, str]) -> dict[str, str]:
    """Physical name → final name of each column that a cycle of ``renames`` (old → new,
    as the table's names are now) moves, level by level."""
    from slotlake.delta import cycles_of

    out: dict[str, str] = {}
    for names in levels(schema).values():
        cycles = cycles_of(renames, set(names.values()))
        out |= {p: cycles[name] for p, name in names.items() if name in cycles}
    return out


def moves(names: dict[str, str], target: dict[str, str]) -> list[tuple[str, str]]:
    """The renames (old name → new name, one ALTER each, every new name free when its turn
    comes) that take ``names`` (physical → name) to ``target`` (physical → final name) at
    one level. A cycle is broken by a temporary name."""
    now = dict(names)
    holder = {name: physical for physical, name in now.items()}
    pending = {p: new for p, new in target.items() if p in now and now[p] != new}
    out: list[tuple[str, str]] = []

    def rename(physical: str, new: str) -> None:
        old = now[physical]
        out.append((old, new))
        del holder[old]
        holder[new] = physical
        now[physical] = new

    while pending:
        free = sorted(p for p, new in pending.items() if new not in holder)
        for physical in free:
            rename(physical, pending.pop(physical))
        if free:
            continue
        # Every final name is held: by another column of the plan (a cycle), else by a
        # column the plan does not move, which no order of renames can free.
        blocked = sorted(p for p, new in pending.items() if holder[new] not in pending)
        if blocked:
            raise SwapError(
                f"column {now[blocked[0]]!r} is to be named {pending[blocked[0]]!r}, "
                "which a column outside the renames holds"
            )
        first = min(pending)
        k = 0
        while f"{TEMP_PREFIX}{k}" in holder:
            k += 1
        rename(first, f"{TEMP_PREFIX}{k}")
    return out


def swap_by_alters(
    spark: SparkSession, path: str, ref: str, renames: dict[str, str], marker: tuple[str, int]
) -> int:
    """Make the cycles of ``renames`` (old → new) of the batch ``marker`` names, or finish
    them after a crash, with one ALTER per rename; returns how many ALTERs ran (0 when the
    table already has the names)."""
    from slotlake.delta import quote, sql_string

    schema, properties = mapped_metadata(spark, path)
    stored = json.loads(properties[PLAN_PROPERTY]) if PLAN_PROPERTY in properties else None
    if stored is not None and (stored["app_id"], stored["batch"]) == tuple(marker):
        target: dict[str, str] = stored["names"]
    else:
        target = plan(schema, renames)
        if not target:
            return 0
        value = json.dumps(
            {"app_id": marker[0], "batch": marker[1], "names": target}, sort_keys=True
        )
        spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('{PLAN_PROPERTY}' = {sql_string(value)})")
    done = 0
    for level, names in levels(schema).items():
        prefix = f"{quote(level)}." if level else ""
        for old, new in moves(names, target):
            spark.sql(f"ALTER TABLE {ref} RENAME COLUMN {prefix}{quote(old)} TO {quote(new)}")
            done += 1
    return done
