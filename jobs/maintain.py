"""spark-submit entry point: lake maintenance (the same code as ``slotlake maintain``).

    spark-submit --py-files dist/slotlake-<version>.zip --jars dist/jars/<the Delta jars> \\
        jobs/maintain.py --config conf/example.toml [--set key=value …]

OPTIMIZE and VACUUM every Delta table of the lake, then expire raw batches, under the
slot's advisory lock (a run that finds a sync holding it exits 0, touching nothing). The
PostgreSQL password comes from PGPASSWORD (or ~/.pgpass), never from an argument.
"""

from __future__ import annotations

import sys

from slotlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", *sys.argv[1:]]))
