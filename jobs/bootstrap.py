"""spark-submit entry point: the bootstrap (the same code as ``slotlake bootstrap``).

    spark-submit --py-files dist/slotlake-<version>.zip --jars dist/jars/<the Delta jars> \\
        jobs/bootstrap.py --config conf/example.toml [--set key=value …] [--parallel 8] \\
        [--rebootstrap] [--onto-existing-lake]

Creates the slot with an exported snapshot, copies every published table in it (one
connection per ctid range, at most --parallel at once: Spark tasks on a lake on a Hadoop
file system, threads of the driver on a local lake) and commits the lake's first batch
at the slot's consistent point; see lib/slotlake/bootstrap.py for when it refuses. The
session is built by slotlake.spark.build_session after the refusal checks, and only if a
table needs Spark, leaving spark-submit's master and resources alone. The password comes from PGPASSWORD or
~/.pgpass, never from an argument.
"""

from __future__ import annotations

import sys

from slotlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["bootstrap", *sys.argv[1:]]))
