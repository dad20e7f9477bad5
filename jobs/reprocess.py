"""spark-submit entry point: rebuild committed batches from raw (same as ``slotlake reprocess``).

    spark-submit --py-files dist/slotlake-<version>.zip jobs/reprocess.py \\
        --config conf/example.toml (--output ROOT | --in-place) [--batches FIRST..LAST] [--from-empty]

Never connects to PostgreSQL and never touches the slot.
"""

from __future__ import annotations

import sys

from slotlake.cli import main

if __name__ == "__main__":
    sys.exit(main(["reprocess", *sys.argv[1:]]))
