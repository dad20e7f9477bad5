"""spark-submit entry point: one sync batch (the same code as ``slotlake sync``).

    spark-submit --py-files dist/slotlake-<version>.zip --jars dist/jars/<the Delta jars> \\
        jobs/sync.py --config conf/example.toml [--set key=value …] [--target-lsn X/Y]

The master, deploy mode and resources come from spark-submit; the session is built by
slotlake.spark.build_session, which leaves them alone when it runs under spark-submit.
The PostgreSQL password comes from PGPASSWORD (or ~/.pgpass), never from an argument.
"""

from __future__ import annotations

import sys

from slotlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["sync", *sys.argv[1:]]))
