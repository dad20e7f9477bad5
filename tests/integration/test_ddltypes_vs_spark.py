"""slotlake.ddltypes parses every schema slotlake writes exactly as Spark's own parser."""

from __future__ import annotations

from pyspark.sql.types import StructType

from slotlake.batch import TRANSACTIONS_DDL
from slotlake.catalog import TableCatalog
from slotlake.ddl import DDL_SCHEMA
from slotlake.ddltypes import parse_struct
from slotlake.decode import META_COLUMNS, WORK_COLUMNS, spark_schema_ddl
from slotlake.pgtypes import spark_ddl_for

# (type oid, typmod) of every type family pgtypes maps, arrays included.
TYPES = [(16, -1), (17, -1), (20, -1), (21, -1), (23, -1), (25, -1), (26, -1), (114, -1),
         (700, -1), (701, -1), (790, -1), (1082, -1), (1083, -1), (1114, -1), (1184, -1),
         (1700, (12 << 16 | 2) + 4), (1700, -1), (1007, -1), (1009, -1), (1231, -1),
         (1186, -1), (2950, -1), (3802, -1)]  # fmt: skip


def test_every_schema_parses_as_spark_does(spark) -> None:  # type: ignore[no-untyped-def]
    columns = [
        (f"c{i} `q`", spark_ddl_for(oid, typmod, {})) for i, (oid, typmod) in enumerate(TYPES)
    ]
    cat = TableCatalog(name="public.t", columns=columns, state_columns=[n for n, _ in columns])
    for ddl in (
        spark_schema_ddl(cat, META_COLUMNS + WORK_COLUMNS),
        DDL_SCHEMA,
        TRANSACTIONS_DDL,
    ):
        assert parse_struct(ddl) == StructType.fromDDL(ddl), ddl
