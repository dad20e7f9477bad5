"""The Airflow DAGs, with real Airflow 3 (in .venv-airflow, created by tools/setup.sh).

Airflow runs in its own interpreter (its Spark provider installs pyspark-client over the
job's pyspark), so these tests drive tests/integration/airflow_check.py in a subprocess
and assert on the JSON it prints.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slotlake.lake import Lake, read_state
from slotlake.spark import REQUIRED_CONF, delta_coordinates, delta_jars

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_VENV = REPO / ".venv-airflow"
CHECK = Path(__file__).with_name("airflow_check.py")
DAGS = REPO / "airflow_dags"
SPARK_HOME = Path(sysconfig.get_paths()["purelib"]) / "pyspark"
PASSWORD = "s3cret-never-on-argv"
DELTA_CONF = {
    k: REQUIRED_CONF[k] for k in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
}


@pytest.fixture(scope="module")
def airflow_python() -> Path:
    python = AIRFLOW_VENV / "bin" / "python"
    assert python.exists(), f"{python} is missing: run `make setup` (tools/setup.sh creates it)"
    return python


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PYTHON", "PYSPARK", "SPARK", "PG"))
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="false",
        AIRFLOW__CORE__UNIT_TEST_MODE="false",
    )
    env.update(extra)
    return env


def run_check(python: Path, env: dict[str, str], *args: str, timeout: int = 600) -> dict[str, Any]:
    proc = subprocess.run(
        [str(python), str(CHECK), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["AIRFLOW_HOME"],
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["_output"] = proc.stdout + proc.stderr
    return result


def test_dags_import_with_the_documented_settings(airflow_python: Path, tmp_path: Path) -> None:
    out = run_check(airflow_python, airflow_env(tmp_path), "dagbag", str(DAGS))
    assert out["import_errors"] == {}
    assert set(out["dags"]) == {"slotlake_sync", "slotlake_reprocess", "slotlake_maintain"}

    sync = out["dags"]["slotlake_sync"]
    assert sync["schedule"] == "*/15 * * * *"  # airflow_dags/slotlake.toml
    assert sync["max_active_runs"] == 1 and sync["catchup"] is False
    task = sync["tasks"]["sync"]
    assert "SparkSubmitOperator" in task["operator_mro"]
    assert task["retries"] == 3 and task["retry_exponential_backoff"] == 2.0
    assert task["retry_delay"] == 60 and task["max_retry_delay"] == 1800
    assert task["execution_timeout"] == 3600
    assert task["application"] == str(REPO / "jobs" / "sync.py")
    assert task["py_files"] == str(REPO / "dist" / "slotlake-0.1.0.zip")
    assert task["application_args"] == ["--config", str(REPO / "conf" / "demo.toml")]
    # The password never travels as an argument or through the provider's env_vars (which
    # becomes --conf arguments on YARN/Kubernetes): the operator reads the connection.
    assert task["env_vars"] is None and task["pg_conn_id"] == "slotlake_pg"
    # Delta Lake: spark-submit resolves the coordinates pinned in slotlake.toml (the DAG
    # file cannot import slotlake to ask), with Delta's SQL extension and catalog.
    assert task["packages"] == delta_coordinates()[0] and task["jars"] is None
    assert task["conf"] == DELTA_CONF

    rep = out["dags"]["slotlake_reprocess"]
    assert rep["schedule"] is None and rep["max_active_runs"] == 1 and rep["catchup"] is False
    assert rep["params"] == ["batches", "from_empty", "in_place", "output"]
    rtask = rep["tasks"]["reprocess"]
    assert rtask["application"] == str(REPO / "jobs" / "reprocess.py")
    assert (rtask["packages"], rtask["jars"], rtask["conf"]) == (task["packages"], None, DELTA_CONF)
    assert rtask["pg_conn_id"] is None  # reprocessing never connects to PostgreSQL

    mnt = out["dags"]["slotlake_maintain"]
    assert mnt["schedule"] == "@daily" and mnt["max_active_runs"] == 1
    mtask = mnt["tasks"]["maintain"]
    assert mtask["application"] == str(REPO / "jobs" / "maintain.py")
    assert mtask["execution_timeout"] == 7200 and mtask["pg_conn_id"] == "slotlake_pg"
    assert (mtask["packages"], mtask["conf"]) == (task["packages"], DELTA_CONF)

    # The schedule (and the rest) come from configuration, not from the DAG file.
    custom = tmp_path / "dags.toml"
    custom.write_text(
        '[dags]\nschedule = "@hourly"\nretries = 5\ndelta_jars = ["jars/a.jar", "/opt/b.jar"]\n'
        '[dags.spark_conf]\n"spark.sql.extensions" = "x.Other"\n"spark.ui.enabled" = "false"\n'
    )
    out = run_check(
        airflow_python,
        airflow_env(tmp_path, SLOTLAKE_DAGS_CONFIG=str(custom)),
        "dagbag",
        str(DAGS),
    )
    assert out["dags"]["slotlake_sync"]["schedule"] == "@hourly"
    task = out["dags"]["slotlake_sync"]["tasks"]["sync"]
    assert task["retries"] == 5
    # Jar files replace the coordinates (relative paths are from the settings file), and
    # [dags.spark_conf] comes after Delta's settings.
    assert task["jars"] == f"{tmp_path / 'jars' / 'a.jar'},/opt/b.jar"
    assert task["packages"] is None
    assert task["conf"] == {
        "spark.sql.extensions": "x.Other",
        "spark.sql.catalog.spark_catalog": DELTA_CONF["spark.sql.catalog.spark_catalog"],
        "spark.ui.enabled": "false",
    }
    custom.write_text('[dags]\nschedulee = "@hourly"\n')
    out = run_check(
        airflow_python,
        airflow_env(tmp_path, SLOTLAKE_DAGS_CONFIG=str(custom)),
        "dagbag",
        str(DAGS),
    )
    assert "unknown key(s) in [dags]: schedulee" in json.dumps(out["import_errors"])


def _dsn_parts(dsn: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(dsn))


@pytest.mark.one_pg_version
@pytest.mark.timeout(2400)  # airflow db migrate + two spark-submits on a shared machine
def test_sync_dag_runs_end_to_end(
    airflow_python: Path, pg_dsn: str, slot: str, tmp_path: Path
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    lake = tmp_path / "lake"
    dist = tmp_path / "dist"
    subprocess.run(
        ["make", "-s", "dist", f"DIST_DIR={dist}", f"PY={sys.executable}"], cwd=REPO, check=True
    )
    (zip_path,) = dist.glob("slotlake-*.zip")
    jars = delta_jars()
    assert jars, "the Delta jars are not cached in the venv: run `make setup`"

    # The job's configuration names no server: host, port, user, database and password
    # come from the Airflow connection, through spark-submit's environment.
    job_conf = tmp_path / "job.toml"
    job_conf.write_text(
        f'[source]\ndsn = ""\nslot = "{slot}"\npublications = ["pub"]\n[lake]\npath = "{lake}"\n'
    )
    dags_conf = tmp_path / "dags.toml"
    dags_conf.write_text(
        "[dags]\n"
        'schedule = "@hourly"\n'
        f'job_config = "{job_conf}"\n'
        f'jobs_dir = "{REPO / "jobs"}"\n'
        f'py_files = "{zip_path}"\n'
        "retries = 0\n"  # a failure must end the run, not wait for a retry
        "execution_timeout_minutes = 15\n"
        # The jars tools/setup.sh cached: no Maven resolution at submit time.
        f"delta_jars = {json.dumps(jars)}\n"
        "[dags.spark_conf]\n"
        f'"spark.pyspark.python" = "{sys.executable}"\n'
        f'"spark.pyspark.driver.python" = "{sys.executable}"\n'
        '"spark.sql.shuffle.partitions" = "4"\n'
        '"spark.ui.enabled" = "false"\n'
    )
    # spark-submit on PATH is a wrapper that records its argv and environment, then runs
    # the real one: the proof that the password is in the environment and not in argv.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "spark-submit"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {tmp_path}/argv.txt\n'
        f'printf "%s\\n" "PGPASSWORD=$PGPASSWORD" "PGHOST=$PGHOST" > {tmp_path}/env.txt\n'
        f"export SPARK_HOME={SPARK_HOME}\n"
        f'exec {Path(sys.executable).parent / "spark-submit"} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)

    pg = _dsn_parts(pg_dsn)
    env = airflow_env(
        home,
        SLOTLAKE_DAGS_CONFIG=str(dags_conf),
        PATH=f"{bindir}:{os.environ['PATH']}",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        AIRFLOW_CONN_SLOTLAKE_PG=json.dumps(
            {
                "conn_type": "postgres",
                "host": pg["host"],
                "port": int(pg["port"]),
                "login": pg["user"],
                "schema": pg["dbname"],
                "password": PASSWORD,
            }
        ),
    )
    migrate = subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
        c.execute("UPDATE t SET v = 'updated' WHERE id = 3")

    out = run_check(airflow_python, env, "test", str(DAGS), "slotlake_sync", timeout=900)
    assert out.get("state") == "success", out["_output"][-8000:]
    assert out["tasks"] == {"sync": "success"}

    assert Lake(str(lake)).commit_batches() == [1]
    rows = sorted((r["id"], r["v"]) for r in read_state(str(lake), "public.t").to_pylist())
    assert rows == [(i, "updated" if i == 3 else f"v{i}") for i in range(1, 21)]
    with psycopg.connect(pg_dsn) as c:
        row = c.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None and row[0] == Lake(str(lake)).read_commit(1).end_lsn

    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert PASSWORD not in "\n".join(argv)
    assert argv[argv.index("--master") + 1] == "local[2]"
    assert argv[argv.index("--py-files") + 1] == str(zip_path)
    assert argv[argv.index("--jars") + 1] == ",".join(jars) and "--packages" not in argv
    confs = [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"]
    assert {f"{k}={v}" for k, v in DELTA_CONF.items()} <= set(confs)
    assert argv[-3:] == [str(REPO / "jobs" / "sync.py"), "--config", str(job_conf)]
    env_seen = (tmp_path / "env.txt").read_text().splitlines()
    assert f"PGPASSWORD={PASSWORD}" in env_seen and f"PGHOST={pg['host']}" in env_seen
    assert PASSWORD not in out["_output"]  # nor in the task log

    # The reprocess DAG, triggered with params, rebuilds that batch into a new root; it is
    # given no PostgreSQL connection at all.
    rebuilt = tmp_path / "rebuilt"
    out = run_check(
        airflow_python,
        env,
        "test",
        str(DAGS),
        "slotlake_reprocess",
        json.dumps({"output": str(rebuilt), "batches": "1..1"}),
        timeout=900,
    )
    assert out.get("state") == "success", out["_output"][-8000:]
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[-7:] == [
        str(REPO / "jobs" / "reprocess.py"),
        "--config",
        str(job_conf),
        "--output",
        str(rebuilt),
        "--batches",
        "1..1",
    ]
    assert "PGPASSWORD=" in (tmp_path / "env.txt").read_text().splitlines()
    assert Lake(str(rebuilt)).read_commit(1).kind == "reprocess"
    again = sorted((r["id"], r["v"]) for r in read_state(str(rebuilt), "public.t").to_pylist())
    assert again == rows
