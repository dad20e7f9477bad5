#!/usr/bin/env bash
# One-shot set-up on a fresh machine: system packages (when root), then the venv.
# Idempotent: a second run only checks. Used by `make demo`, `make test` and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
[ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql-15)
# psycopg2 (pulled in by pypgoutput, the benchmark's baseline) builds against libpq.
[ -f /usr/include/postgresql/libpq-fe.h ] || need_apt+=(libpq-dev)
command -v pg_config >/dev/null 2>&1 || need_apt+=(libpq-dev)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
# `ip netns` (tests/integration/test_vanished_host.py: a client host that vanishes).
if [ "$(id -u)" -eq 0 ]; then command -v ip >/dev/null 2>&1 || need_apt+=(iproute2); fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages: ${need_apt[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "setup: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts a default cluster on install; slotlake runs its own throwaway ones.
  if command -v pg_ctlcluster >/dev/null 2>&1; then pg_ctlcluster 15 main stop 2>/dev/null || true; fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.slotlake-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing slotlake[dev] into $VENV (first run downloads pyspark, ~450 MB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  touch "$stamp"
fi

# Delta Lake's jars for the job's local SparkSessions, fetched once from Maven Central and
# kept in the venv (slotlake.spark finds them there): demo, tests and CI need no JVM
# repository at run time. Versions follow the delta-spark pin in pyproject.toml.
DELTA_VERSION=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('delta-spark'))")
SPARK_LINE=$("$VENV/bin/python" -c "import pyspark; print('.'.join(pyspark.__version__.split('.')[:2]))")
JARS="$VENV/share/slotlake/jars"
want=("io.delta:delta-spark_${SPARK_LINE}_2.13:${DELTA_VERSION}" "io.delta:delta-storage:${DELTA_VERSION}")
have=1
for coord in "${want[@]}"; do
  IFS=: read -r _g a v <<<"$coord"
  [ -s "$JARS/$a-$v.jar" ] || have=0
done
if [ "$have" -eq 0 ]; then
  echo "setup: fetching Delta Lake ${DELTA_VERSION} jars for Spark ${SPARK_LINE} into $JARS"
  command -v mvn >/dev/null 2>&1 || {
    [ "$(id -u)" -eq 0 ] || { echo "setup: mvn is missing (install maven)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends maven >/dev/null
  }
  mkdir -p "$JARS"
  for coord in "${want[@]}"; do
    mvn -q -B dependency:copy -Dartifact="$coord" -DoutputDirectory="$JARS" >/dev/null
  done
fi

# Airflow (the DAGs and their tests) lives in a venv of its own: the Spark provider depends
# on pyspark-client, which would install over the job's pyspark. Only the `airflow` extra's
# requirements go in; the DAG file does not import slotlake.
AIRFLOW_VENV=${AIRFLOW_VENV:-.venv-airflow}
if [ ! -x "$AIRFLOW_VENV/bin/python" ]; then
  echo "setup: creating $AIRFLOW_VENV"
  "$PYTHON" -m venv "$AIRFLOW_VENV"
fi
astamp="$AIRFLOW_VENV/.slotlake-installed"
if [ ! -f "$astamp" ] || [ pyproject.toml -nt "$astamp" ]; then
  echo "setup: installing the airflow extra's requirements into $AIRFLOW_VENV (~3 minutes)"
  "$VENV/bin/python" - > "$AIRFLOW_VENV/requirements.txt" <<'PY'
try:
    import tomllib
except ImportError:  # Python 3.10: tomli is a slotlake dependency there
    import tomli as tomllib
with open("pyproject.toml", "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["optional-dependencies"]["airflow"]))
PY
  "$AIRFLOW_VENV/bin/python" -m pip install -q --upgrade pip
  "$AIRFLOW_VENV/bin/python" -m pip install -q -r "$AIRFLOW_VENV/requirements.txt"
  touch "$astamp"
fi

# The package is installed editable, so its modules are compiled on import; where
# PYTHONDONTWRITEBYTECODE is set (this project's machines set it) nothing is cached and
# every process compiles them again: ~0.1 s a process start on the 2-core machine, paid
# by each CLI run, spark-submit, Spark Python worker and test subprocess. Compiled here
# (only what changed); Python still reads the cache with that variable set.
"$VENV/bin/python" -m compileall -q lib jobs >/dev/null
