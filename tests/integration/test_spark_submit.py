"""spark-submit of jobs/sync.py (and reprocess.py) with only what `make dist` builds.

The jobs run under an interpreter that has pyarrow, pandas, psycopg, deltalake and pyspark
but not slotlake (checked first), from a directory holding only sync.py, the zip, the
Delta jars of dist/jars and the configuration, with PYTHONPATH unset. A committed batch
proves that the driver and the Python workers that decode payloads imported slotlake from
the zip, and that ``--jars`` alone put Delta Lake on the class path (under spark-submit
the job adds no jars itself; ``--packages io.delta:delta-spark_…`` would resolve them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import psycopg
import pytest

from slotlake.lake import Lake, read_changes, read_state

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SITE = Path(sysconfig.get_paths()["purelib"])
SPARK_HOME = SITE / "pyspark"


def build_dist(out: Path) -> tuple[Path, list[Path]]:
    """`make dist`: the zip, and the Delta jars it copies beside it."""
    from slotlake.spark import delta_jars

    proc = subprocess.run(
        ["make", "-s", "dist", f"DIST_DIR={out}", f"PY={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (zip_path,) = out.glob("slotlake-*.zip")
    jars = sorted((out / "jars").glob("*.jar"))
    cached = delta_jars()
    assert cached, "the Delta jars are not cached in the venv: run `make setup`"
    assert [j.name for j in jars] == sorted(Path(p).name for p in cached)
    assert f"--py-files {zip_path} --jars " in proc.stdout  # how to submit, printed
    return zip_path, jars


def interpreter_without_slotlake(where: Path) -> Path:
    """A venv that sees the job's dependencies but not the editable slotlake install.

    The main venv's site-packages is added by a .pth line: a directory added that way is
    on sys.path, but its own .pth files (slotlake's editable hook) are not processed.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "job_deps.pth").write_text(f"{SITE}\n")
    return python


def clean_env(python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK", "SPARK"))}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        PATH=f"{python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    return env


@pytest.mark.one_pg_version
def test_spark_submit_with_only_the_zip_commits_a_batch(
    pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    zip_path, jars = build_dist(tmp_path / "dist")
    python = interpreter_without_slotlake(tmp_path / "pyenv")
    env = clean_env(python)
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(REPO / "jobs" / "sync.py", job / "sync.py")
    shutil.copy(zip_path, job / zip_path.name)
    for jar in jars:
        shutil.copy(jar, job / jar.name)
    jars_arg = ",".join(jar.name for jar in jars)

    # The proof needs an interpreter that cannot import slotlake by itself …
    probe = subprocess.run(
        [str(python), "-c", "import slotlake"], cwd=job, env=env, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "No module named 'slotlake'" in probe.stderr, probe.stderr
    # … but has everything else the job imports.
    subprocess.run(
        [str(python), "-c", "import pyarrow, pandas, psycopg, pyspark, deltalake"],
        env=env,
        check=True,
    )

    lake = tmp_path / "lake"
    (job / "job.toml").write_text(
        f'[source]\ndsn = "{pg_dsn}"\nslot = "{slot}"\npublications = ["pub"]\n'
        f'[lake]\npath = "{lake}"\n'
        '[spark]\n"spark.sql.shuffle.partitions" = "4"\n"spark.ui.enabled" = "false"\n'
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
        c.execute("UPDATE t SET v = 'changed' WHERE id <= 5")
        c.execute("DELETE FROM t WHERE id > 40")

    proc = subprocess.run(
        [
            str(VENV_BIN / "spark-submit"),
            "--master",
            "local[2]",
            "--py-files",
            zip_path.name,
            "--jars",
            jars_arg,
            "sync.py",
            "--config",
            "job.toml",
        ],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    assert "status: committed, batch 1" in proc.stdout, proc.stdout
    assert Lake(str(lake)).commit_batches() == [1]
    state = sorted((r["id"], r["v"]) for r in read_state(str(lake), "public.t").to_pylist())
    assert state == [(i, "changed" if i <= 5 else f"v{i}") for i in range(1, 41)]
    ops = read_changes(str(lake), "public.t").column("_op").to_pylist()
    assert (ops.count("I"), ops.count("U"), ops.count("D")) == (50, 5, 10)
    with psycopg.connect(pg_dsn) as c:
        row = c.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] == Lake(str(lake)).read_commit(1).end_lsn

    # jobs/reprocess.py the same way rebuilds the batch into a new root, identically.
    shutil.copy(REPO / "jobs" / "reprocess.py", job / "reprocess.py")
    rebuilt = tmp_path / "rebuilt"
    proc = subprocess.run(
        [
            str(VENV_BIN / "spark-submit"),
            "--master",
            "local[2]",
            "--py-files",
            zip_path.name,
            "--jars",
            jars_arg,
            "reprocess.py",
            "--config",
            "job.toml",
            "--output",
            str(rebuilt),
        ],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    assert Lake(str(rebuilt)).read_commit(1).kind == "reprocess"
    assert (
        read_state(str(rebuilt), "public.t")
        .sort_by("id")
        .equals(read_state(str(lake), "public.t").sort_by("id"))
    )
    assert read_changes(str(rebuilt), "public.t").equals(read_changes(str(lake), "public.t"))
