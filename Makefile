# The product's front door. Every target installs what it needs itself.
.DEFAULT_GOAL := help
PY := .venv/bin/python
# This kind of machine sets PYTHONDONTWRITEBYTECODE: then every test worker rewrote the asserts of
# ~200 test modules again (pytest caches them only where bytecode may be written) and every CLI,
# Airflow task and Spark worker process compiled the package again. Collecting test-fast took 6.0
# CPU-s a worker with it, 3.7 without (the __pycache__ directories are ignored by git).
unexport PYTHONDONTWRITEBYTECODE
PYTEST_ARGS ?=
SIZES ?= 10000,100000,1000000
N ?= 201
# test workers: each a pytest session with its own Airflow home, on the run's one PostgreSQL and Kafka broker
# (3: with less CPU per test the run waits 24 % of the time on 2 workers; run Z, 2026-11-28 on the Xeon:
# 32 min 48 s with 3 against 37 min 2 s with 2)
WORKERS ?= 3
# the edit-test loop's workers: more than the 2 cores, since its tests wait on the services, but not so many
# that they crowd each other out. On the Xeon (2026-11-28, 951 tests, machine otherwise idle): 8 workers
# 386-413 s in five runs (392 s at 770 busy core-s), 6 workers 352 s (666), 5 workers 326 s (598) and 391 s
# (734), 4 workers 357 s (577, and 130 core-s idle). Runs of one setting vary by up to a fifth.
FAST_WORKERS ?= 5
# and each fault-suite module runs 8 cases at once, not 4 (the soak's setting): its cases wait on the
# broker and the database (Kafka matrix, loaded machine: 55 s instead of 72, the same 49-52 CPU-s)

.PHONY: help setup demo test test-fast test-unit bench chaos

help:
	@echo "make demo       install what is needed, then run the example pipeline end to end on embedded services"
	@echo "make test       install everything needed (apt, .venv, embedded broker) and run the test suite"
	@echo "make test-fast  the edit-test loop: every test but the slow Spark and live-stack ones (-m 'not slow'), 9 randomized schedules, the fault matrix's rotated quarter, 8 fault cases at once, the load test's 20 pipelines over 8 windows"
	@echo "make test-unit  only the pure-logic unit tests"
	@echo "make bench      benchmark windows of SIZES records (default 10000,100000,1000000): bench/results.md"
	@echo "make chaos      the fault-injection suite with N randomized schedules in all, spread over the targets (N=201; EOS_CHAOS_SEED=S to pick seeds)"

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/airflow-eos demo

test: setup
	$(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: setup
	EOS_CHAOS_N=$${EOS_CHAOS_N:-9} EOS_MATRIX=$${EOS_MATRIX:-rotated} EOS_CHAOS_PARALLEL=$${EOS_CHAOS_PARALLEL:-8} EOS_LOAD_WINDOWS=$${EOS_LOAD_WINDOWS:-8} $(PY) -m pytest -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

chaos: setup
	EOS_CHAOS_N=$(N) $(PY) -m pytest tests/chaos $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run.py --sizes $(SIZES)
