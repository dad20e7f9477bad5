"""Airflow 3 DAGs that spark-submit slotlake's jobs.

* ``slotlake_sync``: one sync (jobs/sync.py) per scheduled run: a batch, and one more
  when that batch names tables for a copy (README, Snapshots). ``max_active_runs=1`` and
  no catch-up: a batch takes everything up to "now", so missed intervals need no run of
  their own (and the job's advisory lock would turn a second concurrent run away).
* ``slotlake_reprocess``: triggered by hand, with params, runs jobs/reprocess.py.

Every task spark-submits with Delta Lake on the class path (``delta_packages`` for
``--packages``, or ``delta_jars`` for ``--jars``) and Delta's SQL extension and catalog in
its ``--conf``: under spark-submit the job does not add them itself. New jobs (e.g. a
``slotlake_maintain`` DAG on its own schedule) get the same through :func:`submit_task`.

Settings come from a TOML file (``airflow_dags/slotlake.toml`` beside this file, or the
path in ``SLOTLAKE_DAGS_CONFIG``); see that file for every key.

The PostgreSQL password comes from an Airflow connection (``pg_conn_id``) and reaches
spark-submit through its environment as PGPASSWORD, with PGHOST/PGPORT/PGUSER/PGDATABASE
from the same connection. The provider's ``env_vars`` is deliberately not used: on YARN
and Kubernetes it turns each variable into a ``--conf …=value`` argument, i.e. onto the
command line. The sync job's driver talks to PostgreSQL, so it runs in client deploy
mode (where spark-submit's environment is the driver's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, BaseHook, Param

HERE = Path(__file__).resolve().parent
CONFIG_ENV = "SLOTLAKE_DAGS_CONFIG"

DEFAULTS: dict[str, Any] = {
    "schedule": "*/15 * * * *",
    "start_date": "2025-01-01",
    "job_config": "../conf/demo.toml",
    "jobs_dir": "../jobs",
    "py_files": "../dist/slotlake-0.1.0.zip",
    "spark_conn_id": "spark_default",
    "pg_conn_id": "slotlake_pg",
    "pool": "",
    "retries": 3,
    "retry_delay_seconds": 60,
    "retry_exponential_backoff": 2.0,
    "max_retry_delay_seconds": 1800,
    "execution_timeout_minutes": 60,
    "reprocess_timeout_minutes": 360,
    "maintain_schedule": "@daily",
    "maintain_timeout_minutes": 120,
    "spark_conf": {},
    # Delta Lake for spark-submit. This file must not import slotlake, so the coordinates
    # are written out: they follow the delta-spark pin and the pyspark line of
    # pyproject.toml (slotlake.spark.delta_coordinates() gives them; a test checks).
    "delta_packages": "io.delta:delta-spark_4.2_2.13:4.4.0",
    "delta_jars": [],
}
PATH_KEYS = ("job_config", "jobs_dir", "py_files")
# Delta's SQL extension and catalog: MERGE/RESTORE/time travel on path tables. Set before
# the job's session starts; [dags.spark_conf] may override them.
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def load_settings() -> dict[str, Any]:
    """The DAG settings: defaults, then the TOML file; relative paths are from the file."""
    path = Path(os.environ.get(CONFIG_ENV) or HERE / "slotlake.toml")
    settings = dict(DEFAULTS)
    if path.exists():
        loaded = tomllib.loads(path.read_text()).get("dags", {})
        unknown = set(loaded) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"{path}: unknown key(s) in [dags]: {', '.join(sorted(unknown))}")
        settings.update(loaded)
    base = path.parent
    for key in PATH_KEYS:
        settings[key] = _resolve(base, str(settings[key]))
    jars = settings["delta_jars"]
    if isinstance(jars, str):
        jars = [j for j in jars.split(",") if j.strip()]
    settings["delta_jars"] = [_resolve(base, str(j).strip()) for j in jars]
    return settings


def _resolve(base: Path, value: str) -> str:
    return value if "://" in value else str((base / value).resolve())


def delta_submit_args(s: dict[str, Any]) -> dict[str, Any]:
    """``jars``/``packages``/``conf`` of a SparkSubmitOperator that runs a slotlake job.

    ``delta_jars`` (files, no resolution at submit time) replace ``delta_packages`` (Maven
    coordinates, resolved by spark-submit's Ivy); with both empty the cluster is expected
    to ship Delta Lake itself.
    """
    return {
        "jars": ",".join(s["delta_jars"]) or None,
        "packages": None if s["delta_jars"] else (s["delta_packages"] or None),
        "conf": {**DELTA_CONF, **dict(s["spark_conf"])},
    }


@contextmanager
def pg_environment(conn_id: str) -> Iterator[None]:
    """PG* variables from the Airflow connection, for spark-submit to inherit, then removed."""
    conn = BaseHook.get_connection(conn_id)
    values = {
        "PGHOST": conn.host,
        "PGPORT": str(conn.port) if conn.port else None,
        "PGUSER": conn.login,
        "PGDATABASE": conn.schema,
        "PGPASSWORD": conn.password,
    }
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class SlotlakeSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator plus the PostgreSQL connection (in the environment) and params."""

    def __init__(
        self, *, pg_conn_id: str | None = None, args_from_params: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pg_conn_id = pg_conn_id
        self.args_from_params = args_from_params

    def execute(self, context: Any) -> None:
        if self.args_from_params:
            self.application_args = [
                *(self.application_args or []),
                *reprocess_args(context["params"]),
            ]
        if not self.pg_conn_id:
            return super().execute(context)
        with pg_environment(self.pg_conn_id):
            return super().execute(context)


def reprocess_args(params: dict[str, Any]) -> list[str]:
    args: list[str] = []
    if params.get("in_place"):
        args.append("--in-place")
    else:
        if not params.get("output"):
            raise ValueError("reprocess needs params.output (a new lake root) or in_place=true")
        args += ["--output", str(params["output"])]
    if params.get("batches"):
        args += ["--batches", str(params["batches"])]
    if params.get("from_empty"):
        args.append("--from-empty")
    return args


def _default_args(s: dict[str, Any], timeout_minutes: int) -> dict[str, Any]:
    args: dict[str, Any] = {
        "owner": "slotlake",
        "retries": int(s["retries"]),
        "retry_delay": timedelta(seconds=int(s["retry_delay_seconds"])),
        "retry_exponential_backoff": float(s["retry_exponential_backoff"]),
        "max_retry_delay": timedelta(seconds=int(s["max_retry_delay_seconds"])),
        "execution_timeout": timedelta(minutes=int(timeout_minutes)),
    }
    if s["pool"]:
        # One pool slot shared by both DAGs: sync never runs beside an in-place reprocess.
        args["pool"] = s["pool"]
    return args


def _start_date(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def submit_task(s: dict[str, Any], task_id: str, job: str, **kwargs: Any) -> SlotlakeSubmitOperator:
    """A task that spark-submits jobs/<job>.py with the slotlake zip and Delta Lake."""
    return SlotlakeSubmitOperator(
        task_id=task_id,
        application=f"{s['jobs_dir']}/{job}.py",
        application_args=["--config", s["job_config"]],
        py_files=s["py_files"],
        conn_id=s["spark_conn_id"],
        name=f"slotlake-{job}",
        **delta_submit_args(s),
        **kwargs,
    )


SETTINGS = load_settings()

with DAG(
    dag_id="slotlake_sync",
    description="one slotlake batch: slot → raw → change logs and state → commit → advance",
    schedule=SETTINGS["schedule"],
    start_date=_start_date(SETTINGS["start_date"]),
    catchup=False,
    max_active_runs=1,
    default_args=_default_args(SETTINGS, SETTINGS["execution_timeout_minutes"]),
    tags=["slotlake"],
    doc_md=__doc__,
) as sync_dag:
    submit_task(SETTINGS, "sync", "sync", pg_conn_id=SETTINGS["pg_conn_id"])

with DAG(
    dag_id="slotlake_reprocess",
    description="rebuild committed batches from raw Parquet (no PostgreSQL, slot untouched)",
    schedule=None,
    start_date=_start_date(SETTINGS["start_date"]),
    catchup=False,
    max_active_runs=1,
    default_args={
        **_default_args(SETTINGS, SETTINGS["reprocess_timeout_minutes"]),
        # A rerun of a failed reprocess resumes by itself; retrying blindly would not help.
        "retries": 0,
    },
    params={
        "output": Param("", type="string", description="new lake root (unless in_place)"),
        "in_place": Param(False, type="boolean", description="replace outputs batch by batch"),
        "batches": Param(
            "", type="string", description="FIRST..LAST (empty: every committed batch)"
        ),
        "from_empty": Param(False, type="boolean", description="start from empty tables"),
    },
    tags=["slotlake"],
    doc_md=__doc__,
) as reprocess_dag:
    # Never connects to PostgreSQL: no pg_conn_id.
    submit_task(SETTINGS, "reprocess", "reprocess", args_from_params=True)

with DAG(
    dag_id="slotlake_maintain",
    description="OPTIMIZE + VACUUM the lake's Delta tables, expire raw batches (slot lock held)",
    schedule=SETTINGS["maintain_schedule"],
    start_date=_start_date(SETTINGS["start_date"]),
    catchup=False,
    max_active_runs=1,
    default_args=_default_args(SETTINGS, SETTINGS["maintain_timeout_minutes"]),
    tags=["slotlake"],
    doc_md=__doc__,
) as maintain_dag:
    # maintain takes the slot's advisory lock: it needs the PostgreSQL connection, and a
    # sync holding the lock makes it a no-op for that run.
    submit_task(SETTINGS, "maintain", "maintain", pg_conn_id=SETTINGS["pg_conn_id"])
