"""Build dist/: slotlake-<version>.zip for spark-submit --py-files, and dist/jars/ for --jars.

Only lib/slotlake's sources go in the zip (no __pycache__), with fixed timestamps so the
same sources give the same zip. Third-party packages (pyarrow, pandas, psycopg, deltalake)
are not in it: the executors' Python must have them (see the README for a packed venv).

Delta Lake's jars are not on spark-submit's class path by themselves (the job adds them
only to local sessions it starts): dist/jars/ gets the ones tools/setup.sh cached in the
venv, so that

    spark-submit --py-files dist/slotlake-<version>.zip \
        --jars dist/jars/delta-spark_<spark>_2.13-<delta>.jar,dist/jars/delta-storage-<delta>.jar \
        jobs/sync.py --config …

needs no Maven resolution; ``--packages io.delta:delta-spark_<spark>_2.13:<delta>`` does
the same from Maven Central. The build prints the arguments to use.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lib" / "slotlake"


def version() -> str:
    text = (PACKAGE / "__init__.py").read_text()
    m = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    if not m:
        raise SystemExit("no __version__ in lib/slotlake/__init__.py")
    return m.group(1)


def delta_jars() -> tuple[list[Path] | None, list[str]]:
    """The cached Delta jars (None when tools/setup.sh has not fetched them) and their
    Maven coordinates, as slotlake.spark finds them for local sessions."""
    sys.path.insert(0, str(ROOT / "lib"))
    try:
        from slotlake.spark import delta_coordinates
        from slotlake.spark import delta_jars as cached
    finally:
        sys.path.pop(0)
    jars = cached()
    return ([Path(p) for p in jars] if jars else None), delta_coordinates()


def copy_jars(out_dir: Path) -> list[Path] | None:
    """Copy the cached Delta jars to ``out_dir/jars`` (replacing older ones there)."""
    jars, coords = delta_jars()
    if jars is None:
        print(
            "dist: the Delta jars are not cached (run `make setup`); spark-submit with "
            f"--packages {coords[0]} instead",
            file=sys.stderr,
        )
        return None
    folder = out_dir / "jars"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("delta-*.jar"):
        if old.name not in {j.name for j in jars}:
            old.unlink()
    out = []
    for jar in jars:
        target = folder / jar.name
        tmp = target.with_suffix(".jar.tmp")
        shutil.copyfile(jar, tmp)
        tmp.replace(target)
        out.append(target)
    return out


def build(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"slotlake-{version()}.zip"
    tmp = target.with_suffix(".zip.tmp")
    files = sorted(
        p
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    )
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in files:
            info = zipfile.ZipInfo(p.relative_to(PACKAGE.parent).as_posix(), (2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, p.read_bytes())
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "dist"), help="output directory")
    parser.add_argument(
        "--no-jars", action="store_true", help="leave the Delta jars out (the cluster has them)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    zip_path = build(out)
    print(zip_path)
    if not args.no_jars and (jars := copy_jars(out)):
        print(f"spark-submit --py-files {zip_path} --jars {','.join(str(j) for j in jars)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
