# The product's front door. Every target installs what it needs itself.
.DEFAULT_GOAL := help
PY := .venv/bin/python
PYTEST_ARGS ?=
SIZES ?= 10000,100000,1000000

.PHONY: help setup demo test test-unit bench

help:
	@echo "make demo       install what is needed, then run the example pipeline end to end on embedded services"
	@echo "make test       install everything needed (apt, .venv, embedded broker) and run the test suite"
	@echo "make test-unit  only the pure-logic unit tests"
	@echo "make bench      benchmark windows of SIZES records (default 10000,100000,1000000): bench/results.md"

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/airflow-eos demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run.py --sizes $(SIZES)
