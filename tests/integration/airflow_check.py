"""Runs inside the Airflow virtualenv (.venv-airflow), driven by test_airflow.py.

    python airflow_check.py dagbag DAG_FOLDER         → JSON: import errors and DAG settings
    python airflow_check.py test DAG_FOLDER DAG_ID    → JSON: dag.test() run and task states

The result is the last line of stdout; everything else there is Airflow's own output.
Airflow cannot live in the job's environment (its Spark provider pulls pyspark-client,
which installs over pyspark), hence a separate interpreter and this script.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any


def _seconds(value: Any) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


def load_bag(folder: str):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=folder)


def describe(folder: str) -> dict[str, Any]:
    bag = load_bag(folder)
    out: dict[str, Any] = {
        "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
        "dags": {},
    }
    for dag_id, dag in bag.dags.items():
        tasks = {}
        for t in dag.tasks:
            tasks[t.task_id] = {
                "operator_mro": [c.__name__ for c in type(t).__mro__],
                "retries": t.retries,
                "retry_delay": _seconds(t.retry_delay),
                "retry_exponential_backoff": t.retry_exponential_backoff,
                "max_retry_delay": _seconds(t.max_retry_delay),
                "execution_timeout": _seconds(t.execution_timeout),
                "application": t.application,
                "application_args": list(t.application_args or []),
                "py_files": t.py_files,
                "env_vars": t.env_vars,
                "conf": t.conf,
                "jars": t.jars,
                "packages": t.packages,
                "pg_conn_id": getattr(t, "pg_conn_id", None),
            }
        out["dags"][dag_id] = {
            "schedule": str(dag.schedule) if dag.schedule is not None else None,
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "params": sorted(dag.params.keys()),
            "tasks": tasks,
        }
    return out


def run_test(folder: str, dag_id: str, conf: dict[str, Any] | None) -> dict[str, Any]:
    bag = load_bag(folder)
    if bag.import_errors:
        return {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}
    dag = bag.get_dag(dag_id)
    dr = dag.test(run_conf=conf)
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.get(DagRun, dr.id) if hasattr(dr, "id") else None
        tis = run.get_task_instances(session=session) if run is not None else []
        return {
            "state": str(run.state if run is not None else dr.state),
            "tasks": {ti.task_id: str(ti.state) for ti in tis},
            "tries": {ti.task_id: ti.try_number for ti in tis},
        }


def main(argv: list[str]) -> int:
    mode, folder = argv[0], argv[1]
    if mode == "dagbag":
        result = describe(folder)
    elif mode == "test":
        conf = json.loads(argv[3]) if len(argv) > 3 else None
        result = run_test(folder, argv[2], conf)
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.stdout.flush()
    print("\n" + json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
