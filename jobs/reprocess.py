"""spark-submit entry point: rebuild committed batches from raw (same as ``slotlake reprocess``).

    spark-submit --py-files dist/slotlake-<version>.zip --jars dist/jars/<the Delta jars> \\
        jobs/reprocess.py --config conf/example.toml (--output ROOT | --in-place) \\
        [--batches FIRST..LAST] [--from-empty]

Never connects to PostgreSQL and never touches the slot. ``--packages
io.delta:delta-spark_<spark line>_2.13:<delta version>`` instead of ``--jars`` resolves
Delta Lake from Maven Central (``slotlake.spark.delta_coordinates()`` names them).
"""

from __future__ import annotations

import sys

from slotlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["reprocess", *sys.argv[1:]]))
