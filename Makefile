# The two commands the README starts with: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (1: one process). Two on the 2-core machine: the
# driver-path tests (Python, PostgreSQL) and the Spark-path ones (the JVM) each leave part
# of a core idle: 15.8 minutes against 20.5 in one process (2026-12-05). Three leave no
# core idle and contend: 20.2 minutes against 17.0 with two (2026-12-06).
TEST_WORKERS ?= 2

.PHONY: setup demo test test-unit lint bench-decode dist clean

setup:
	@bash tools/setup.sh

demo: setup
	$(VENV)/bin/slotlake demo

test: setup
	$(PY) -m ruff check lib jobs tests bench airflow_dags
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal) $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check lib jobs tests bench airflow_dags
	$(PY) -m ruff format --check lib jobs tests bench airflow_dags

bench-decode: setup
	$(PY) bench/decode_bench.py

# The --py-files artefact for spark-submit (README: "Running on a cluster").
DIST_DIR ?= dist
dist:
	$(PY) tools/dist.py --out $(DIST_DIR)

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
